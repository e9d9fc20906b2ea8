"""A run's GPU-hours before it runs: its steps' generated and trained tokens at a GPU's throughput, scheduled by the
reference clock (ablate/compute.py) on the run's own layout, every GPU counted while it waits; validation's apart,
as the run logs it. What the pre-flight prints and bench/bench_cluster.py tabulates; a prediction whose inputs (the
throughputs, the lengths) are stated beside it. The anchors and what they miss: docs/design.md#the-cost-model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ablate.compute import ReferenceClock, StepFlops

# measured on a lent H100, 2026-11-22/23 (docs/design.md#the-cost-model): raw vLLM's tokens/s on a 0.89B random
# Llama, 512 rows x 512 new tokens (an upper bound for long rows), scaled to N parameters by FLOPs
ANCHOR_PARAMS, ANCHOR_GEN_TOKENS_PER_S = 0.89e9, 26_000.0
# a GPU kind's dense bf16 TFLOP/s, the data sheets' (an H200 has the H100's tensor cores): the one peak an MFU is
# stated against, here (run.peak_tflops when 0, launcher.train_mfu) and in every bench. A peak, not what a matmul
# reaches: an 8192^3 one measured 798 on a lent H100 (docs/design.md#the-cost-model)
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0}
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

    @property
    def wall_h(self) -> float:
        return self.step_s * self.steps / 3600.0


def simulate(off_policy, steps: int, generate_s: float, train_s: float, layout: tuple[int, int]) -> Estimate:
    """`steps` steps of the same work (`generate_s`, `train_s`: one GPU's seconds) on [generator GPUs, trainer
    GPUs] of their own, overlapping as `off_policy` allows (the reference clock at one unit of work a second)."""
    clock = ReferenceClock(1e-12, layout, off_policy)  # 1e-12 TFLOP/s: one FLOP of StepFlops is one GPU-second
    hours = sum(clock.step(s, StepFlops(generate=generate_s, train=train_s)) for s in range(1, steps + 1))
    return Estimate(gpu_hours=hours, step_s=clock.elapsed / steps, generator_idle=clock.generator_idle_frac(),
                    steps=steps, gpus=sum(layout))


def colocated(steps: int, generate_s: float, train_s: float, trainer_gpus: int) -> Estimate:
    """The engine in trainer rank 0's process: it decodes on one GPU while the other ranks wait, then every rank
    trains its share; every GPU counted for the whole step."""
    step_s = generate_s + train_s / trainer_gpus
    return Estimate(gpu_hours=trainer_gpus * steps * step_s / 3600.0, step_s=step_s, generator_idle=0.0,
                    steps=steps, gpus=trainer_gpus)


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak (PEAK_TFLOPS) of the GPU kind a device's name holds (torch.cuda.get_device_name's: "NVIDIA
    H100 80GB HBM3" is an H100); None for a kind the table does not hold."""
    return next((peak for kind, peak in PEAK_TFLOPS.items() if kind in device_name.upper()), None)


def throughput(cfg, params: float) -> Throughput:
    """The GPUs' speed for the run `cfg` of a `params`-parameter model: launcher.train_mfu of run.peak_tflops (an
    H100's when 0), launcher.gen_tokens_per_s (unset: the anchor)."""
    return Throughput.of(params, float(cfg.run.get("peak_tflops") or PEAK_TFLOPS["H100"]),
                         float(cfg.launcher.train_mfu), cfg.launcher.get("gen_tokens_per_s"))


def estimate(cfg, params: float, completion: float, kept: float = 1.0) -> Estimate:
    """The run `cfg` (a composed config) of a `params`-parameter model, its completions `completion` tokens long on
    average and its prompts at their budget (generation.max_prompt_tokens), `kept` of its rows trained; its GPUs'
    speed from launcher.train_mfu, launcher.gen_tokens_per_s and run.peak_tflops (an H100's when 0)."""
    from ablate.registry import build

    speed = throughput(cfg, params)
    rows = int(cfg.batch.prompts_per_step) * int(cfg.batch.samples_per_prompt)
    generate_s, train_s = Work(rows, float(cfg.generation.max_prompt_tokens), completion, kept).seconds(speed)
    steps, n, g = int(cfg.train.steps), int(cfg.run.trainer_gpus), int(cfg.run.get("generator_gpus", 0))
    run = simulate(build(cfg.off_policy), steps, generate_s, train_s, (g, n)) if g else \
        colocated(steps, generate_s, train_s, n)
    looks = steps // int(cfg.train.val_every) + 1 if int(cfg.train.val_every) > 0 else 0  # step 0's and every k-th
    val_rows = int(cfg.task.get("n_val_prompts", 0)) * int(cfg.task.get("val_samples", 0))
    val_s = val_rows * completion / speed.generate / max(g, 1)  # on every generator GPU (rank 0's when colocated)
    return Estimate(gpu_hours=run.gpu_hours, step_s=run.step_s, generator_idle=run.generator_idle,
                    val_gpu_hours=looks * val_s * run.gpus / 3600.0, steps=steps, gpus=run.gpus)


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
