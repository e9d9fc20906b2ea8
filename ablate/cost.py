"""A run's GPU-hours before it runs: its steps' generated and trained tokens at a GPU's throughput, scheduled by the
reference clock (ablate/compute.py) on the run's own layout, every GPU counted while it waits; validation's apart,
as the run logs it. What the pre-flight prints and bench/bench_cluster.py tabulates; a prediction whose inputs (the
throughputs, the lengths) are stated beside it, with the side that binds each run (generation or learning) and
what a learner twice as fast would save. The anchors and what they miss: docs/design.md#the-cost-model.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ablate.compute import ReferenceClock, StepFlops

# measured on a lent H100, 2026-11-22/23 (docs/design.md#the-cost-model): raw vLLM's tokens/s on a 0.89B random
# Llama, 512 rows x 512 new tokens (an upper bound for long rows), scaled to N parameters by FLOPs
ANCHOR_PARAMS, ANCHOR_GEN_TOKENS_PER_S = 0.89e9, 26_000.0
# a GPU kind's dense bf16 TFLOP/s, the vendor's: half the "with sparsity" figure of NVIDIA's H100 and H200 data
# sheets (SXM 1,979, NVL 1,671, H100 PCIe 1,513), the A100's 312 dense in both its forms. The one peak an MFU is
# stated against: here (run.peak_tflops unset prices PRICED_KIND's), in perf/trainer_mfu (run.peak_tflops) and in
# every bench. A peak, not what a matmul reaches: an 8192^3 one measured 798 on a lent H100 SXM
# (docs/design.md#the-cost-model)
PEAK_TFLOPS = {"H100 SXM": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H200 SXM": 989.0, "H200 NVL": 835.0,
               "A100": 312.0}
# each kind by the name torch.cuda.get_device_name reports, the first that matches ("NVIDIA H100 80GB HBM3" is an
# SXM H100, "NVIDIA H200" an SXM H200; an H100 or H200 named neither PCIe nor NVL is the SXM form); a Grace Hopper
# (GH200) or any other kind matches none: its peak is given by hand (run.peak_tflops, --peak-tflops)
KIND_NAMES = (("H100 NVL", r"\bH100 NVL\b"), ("H100 PCIe", r"\bH100 PCIE\b"), ("H100 SXM", r"\bH100\b"),
              ("H200 NVL", r"\bH200 NVL\b"), ("H200 SXM", r"\bH200\b"), ("A100", r"\bA100\b"))
PRICED_KIND = "H100 SXM"  # what the pre-flight prices where run.peak_tflops is unset (a login node has no GPU)
# this learner's 6N-MFU on a trainer GPU (launcher.train_mfu unset), an ESTIMATE of 2026-11-28 at experiment=paper_8b
# (8B, FSDP on 16 ranks, activation checkpointing) made for the learner of then, whose passes were padded to their
# longest row: issue 46's desk analysis gives 0.18-0.26 at 8B (20-22% at ~1B on bench_gpu.py's short rows); the one
# measurement, 29.8% at a Llama-3.2-1B shape with rows up to 8k and no checkpointing (gpu_first.py on a lent H200,
# 2026-11-27, docs/testing.md#gpu-minutes), was of that padded learner, and is 22% once checkpointing recomputes the
# forward (6N of 8N a token). Today's learner packs its passes (varlen attention, passes of up to 65,536 real tokens,
# no padding computed) and has not run on a GPU: the value stands until it is measured, by gpu_check.py's default
# plan (`bench_gpu.py --parts paper`: packed beside the padded plan at a paper-like step) or on the cluster's GPU
# kind (docs/design.md#the-cost-model). Before: 0.32, plain transformers' on rows of one length, uncheckpointed.
TRAIN_MFU = 0.22
# the share of a step's rows the learner trains where zero-variance filtering drops the rest
# (filtering.zero_variance; a run logs it as 1 - train/zero_variance_frac): half, an assumption until a run says
KEPT = 0.5
PAPER_GPU_HOURS = 16_000.0  # a LOO run at 8B (docs/design.md#what-the-paper-says)
MIN_SIGNAL_DELAY_S = 120  # SLURM's warning, at least (submitit's default; the requeue itself takes seconds)
REQUEUE_S = 30.0  # after the checkpoint: the requeue, the engines closed, the processes gone


@dataclass(frozen=True)
class Throughput:
    """Tokens a second on one GPU: generated on a generator GPU, trained (forward and backward) on a trainer GPU."""

    generate: float
    train: float

    @classmethod
    def of(cls, params: float, peak_tflops: float, train_mfu: float, gen_tokens_per_s: float | None = None):
        """A trainer GPU at `train_mfu` of `peak_tflops` (6N FLOPs a trained token); a generator GPU at
        `gen_tokens_per_s`, unset: the anchor scaled by 2N FLOPs a generated token."""
        if not (params > 0 and peak_tflops > 0 and 0 < train_mfu <= 1) or (gen_tokens_per_s is not None
                                                                             and not gen_tokens_per_s > 0):
            raise ValueError(f"a throughput needs parameters, launcher.peak_tflops > 0, 0 < launcher.train_mfu <= 1 "
                             f"and launcher.gen_tokens_per_s > 0 or unset; got {params:g}, {peak_tflops:g}, "
                             f"{train_mfu:g}, {gen_tokens_per_s}")
        generate = gen_tokens_per_s or ANCHOR_GEN_TOKENS_PER_S * ANCHOR_PARAMS / params
        return cls(generate=generate, train=train_mfu * peak_tflops * 1e12 / (6 * params))


@dataclass(frozen=True)
class Work:
    """One step's tokens: `rows` completions of `completion` tokens after prompts of `prompt`, `kept` of the rows
    trained (zero-variance filtering drops the rest)."""

    rows: int
    prompt: float
    completion: float
    kept: float = 1.0

    def seconds(self, speed: Throughput) -> tuple[float, float]:
        """One GPU's seconds to generate the step's rows and to train its kept rows."""
        return (self.rows * self.completion / speed.generate,
                self.rows * self.kept * (self.prompt + self.completion) / speed.train)


@dataclass(frozen=True)
class Estimate:
    gpu_hours: float  # the law's C at the last step
    step_s: float  # wall-clock seconds a step, on average
    generator_idle: float  # share of the run the generator GPUs had nothing they were allowed to decode (0: colocated)
    steps: int
    gpus: int
    val_gpu_hours: float = 0.0  # every validation, every GPU counted (compute/val_gpu_hours)
    generate_s: float = 0.0  # a step's generation on its GPUs (the generator GPUs, or the one engine), seconds
    train_s: float = 0.0  # a step's training on the trainer GPUs, seconds

    @property
    def wall_h(self) -> float:
        return self.step_s * self.steps / 3600.0

    @property
    def binds(self) -> str:
        """The side whose GPUs set the pace: the longer of a step's generation and its training."""
        return "learning" if self.train_s > self.generate_s else "generation"

    @property
    def turns(self) -> bool:
        """Whether the two sides add up (PPO-off-policy's rounds, an engine beside trainer rank 0) rather than
        overlap (PipelineRL): the run's step outlasts its longer side by more than half the shorter."""
        longer, shorter = max(self.generate_s, self.train_s), min(self.generate_s, self.train_s)
        return shorter > 0 and self.step_s > longer + shorter / 2


def simulate(off_policy, steps: int, generate_s: float, train_s: float, layout: tuple[int, int]) -> Estimate:
    """`steps` steps of the same work (`generate_s`, `train_s`: one GPU's seconds) on [generator GPUs, trainer
    GPUs] of their own, overlapping as `off_policy` allows (the reference clock at one unit of work a second)."""
    clock = ReferenceClock(1e-12, layout, off_policy)  # 1e-12 TFLOP/s: one FLOP of StepFlops is one GPU-second
    hours = sum(clock.step(s, StepFlops(generate=generate_s, train=train_s)) for s in range(1, steps + 1))
    return Estimate(gpu_hours=hours, step_s=clock.elapsed / steps, generator_idle=clock.generator_idle_frac(),
                    steps=steps, gpus=sum(layout), generate_s=generate_s / layout[0], train_s=train_s / layout[1])


def colocated(steps: int, generate_s: float, train_s: float, trainer_gpus: int) -> Estimate:
    """The engine in trainer rank 0's process: it decodes on one GPU while the other ranks wait, then every rank
    trains its share; every GPU counted for the whole step."""
    step_s = generate_s + train_s / trainer_gpus
    return Estimate(gpu_hours=trainer_gpus * steps * step_s / 3600.0, step_s=step_s, generator_idle=0.0,
                    steps=steps, gpus=trainer_gpus, generate_s=generate_s, train_s=train_s / trainer_gpus)


def gpu_kind(device_name: str) -> str | None:
    """The kind (a key of PEAK_TFLOPS) of a device by its name, torch.cuda.get_device_name's (KIND_NAMES); None for
    a name no kind matches."""
    return next((kind for kind, pattern in KIND_NAMES if re.search(pattern, device_name, re.IGNORECASE)), None)


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak (PEAK_TFLOPS) of a device's kind by its name ("NVIDIA H100 PCIe": 756); None for a kind
    the table does not hold, whose peak is asked for."""
    kind = gpu_kind(device_name)
    return None if kind is None else PEAK_TFLOPS[kind]


def throughput(cfg, params: float) -> Throughput:
    """The GPUs' speed for the run `cfg` of a `params`-parameter model: launcher.train_mfu (unset: this learner's,
    TRAIN_MFU) of run.peak_tflops (unset: PRICED_KIND's), launcher.gen_tokens_per_s (unset: the anchor)."""
    return Throughput.of(params, float(cfg.run.get("peak_tflops") or PEAK_TFLOPS[PRICED_KIND]),
                         float(cfg.launcher.get("train_mfu") or TRAIN_MFU), cfg.launcher.get("gen_tokens_per_s"))


def rows_trained(cfg) -> float:
    """The share of a step's rows the run `cfg` trains: every row without zero-variance filtering (loo-batch), KEPT
    with it."""
    return KEPT if cfg.get("filtering", {}).get("zero_variance", False) else 1.0


def estimate(cfg, params: float, completion: float, kept: float = 1.0, learner: float = 1.0) -> Estimate:
    """The run `cfg` (a composed config) of a `params`-parameter model, its completions `completion` tokens long on
    average and its prompts at their budget (generation.max_prompt_tokens), `kept` of its rows trained; its GPUs'
    speed from launcher.train_mfu, launcher.gen_tokens_per_s and run.peak_tflops (throughput), the trainer GPUs
    `learner` times as fast."""
    from ablate.registry import build

    speed = throughput(cfg, params)
    speed = Throughput(generate=speed.generate, train=speed.train * learner)
    rows = int(cfg.batch.prompts_per_step) * int(cfg.batch.samples_per_prompt)
    generate_s, train_s = Work(rows, float(cfg.generation.max_prompt_tokens), completion, kept).seconds(speed)
    steps, n, g = int(cfg.train.steps), int(cfg.run.trainer_gpus), int(cfg.run.get("generator_gpus", 0))
    run = simulate(build(cfg.off_policy), steps, generate_s, train_s, (g, n)) if g else \
        colocated(steps, generate_s, train_s, n)
    looks = steps // int(cfg.train.val_every) + 1 if int(cfg.train.val_every) > 0 else 0  # step 0's and every k-th
    val_rows = int(cfg.task.get("n_val_prompts", 0)) * int(cfg.task.get("val_samples", 0))
    val_s = val_rows * completion / speed.generate / max(g, 1)  # on every generator GPU (rank 0's when colocated)
    return Estimate(gpu_hours=run.gpu_hours, step_s=run.step_s, generator_idle=run.generator_idle,
                    val_gpu_hours=looks * val_s * run.gpus / 3600.0, steps=steps, gpus=run.gpus,
                    generate_s=run.generate_s, train_s=run.train_s)


@dataclass(frozen=True)
class Binding:
    """What sets a run's GPU-hours: `run` as estimated, the side that binds it (Estimate.binds), the same run with a
    learner twice as fast (`faster`), and the generator GPU's tokens/s at which its two sides would take a step
    alike (`even`: generation binds below it; the default rate is an upper bound)."""

    run: Estimate
    faster: Estimate
    even: float

    @property
    def saved(self) -> float:
        return self.run.gpu_hours - self.faster.gpu_hours


def completion_budget(cfg) -> int:
    """A completion's length budget: generation.max_think_tokens + generation.max_answer_tokens."""
    return int(cfg.generation.max_think_tokens) + int(cfg.generation.max_answer_tokens)


def priced(cfg, params: float, share: float = 0.5) -> Estimate:
    """The run `cfg` as a sweep prices it (the pre-flight's GPU-hours, the dry run's designs): completions of `share`
    of their length budget on average (completion_budget), its own rows trained (rows_trained)."""
    return estimate(cfg, params, share * completion_budget(cfg), rows_trained(cfg))


def binding(cfg, params: float, completion: float) -> Binding:
    """The run `cfg` at `completion` tokens a completion and its own rows trained (rows_trained), beside the same
    with a learner twice as fast."""
    kept = rows_trained(cfg)
    run = estimate(cfg, params, completion, kept)
    even = throughput(cfg, params).generate * run.generate_s / run.train_s if run.train_s else math.inf
    return Binding(run=run, faster=estimate(cfg, params, completion, kept, learner=2.0), even=even)


def warning_margin(cfg, params: float, checkpoint_bytes: float) -> dict[str, float]:
    """Seconds SLURM's warning must come before the time limit for the run `cfg` to checkpoint and requeue, part by
    part: the learner's update it may find in flight (rows at the full length budget, on run.trainer_gpus), a
    validation (completions of half the budget: an average over its rows; not interruptible), writing
    `checkpoint_bytes` a rank at launcher.checkpoint_gb_per_s, and the requeue. The wait for rollouts is not in it:
    a warning there drops the step (docs/training.md#time-limits)."""
    speed = throughput(cfg, params)
    budget = float(cfg.generation.max_think_tokens) + float(cfg.generation.max_answer_tokens)
    rows = int(cfg.batch.prompts_per_step) * int(cfg.batch.samples_per_prompt)
    _, train_s = Work(rows, float(cfg.generation.max_prompt_tokens), budget).seconds(speed)
    val_rows = int(cfg.task.get("n_val_prompts", 0)) * int(cfg.task.get("val_samples", 0))
    validates = int(cfg.train.val_every) > 0
    return {"learner step": train_s / int(cfg.run.trainer_gpus),
            "validation": val_rows * budget / 2 / speed.generate / max(int(cfg.run.get("generator_gpus", 0)), 1)
            if validates else 0.0,
            "checkpoint": checkpoint_bytes / (float(cfg.launcher.checkpoint_gb_per_s) * 1e9),
            "requeue": REQUEUE_S}


def signal_delay(margin: dict[str, float]) -> int:
    """launcher.signal_delay_s for a run whose warning needs `margin` (warning_margin's): 1.5 times it, whole
    minutes, MIN_SIGNAL_DELAY_S at least."""
    return max(MIN_SIGNAL_DELAY_S, 60 * math.ceil(1.5 * sum(margin.values()) / 60))
