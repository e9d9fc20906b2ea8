"""The pre-flight: every check made before a run is created or a job submitted, once, in one order, for one run
(`python -m ablate`) and for a sweep (`python -m ablate sweep=loo`) alike. `check_before_submit` runs the checks and
returns what they found (`Found`: the lines to print, the memory estimate, SLURM's warning as sized, this machine's
GPUs, the refusal); `print_found` prints it. What differs between the two commands is an argument: the variants
planned (one, or many), the cluster the jobs go to, and whether it is a dry run.

    what the jobs import -> each model -> what each run is made of (stop tokens, model, data, first prompt)
    -> each variant's layout (reference clock, trainer layout, adaptive rungs, memory per GPU)
    -> the cost (on GPUs) -> SLURM's warning (on SLURM) -> what a submit takes (a SLURM partition, this machine's GPUs)

The checks themselves are ablate/checks.py's, each failing in one line (a ValueError); here they are put in order.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from ablate import checks, cost, memory
from ablate.rungs import check_settings
from launch.submit import check_request


@dataclass
class Found:
    """What the pre-flight found, in the order it found it. `lines`: what it prints, a line each (those starting
    `WARNING: ` are warnings, for stderr); `estimate`: each variant's layout by the memory model (variant label ->
    memory.Process list; [] on CPUs); `gpu_gb`: the GPU memory it checked against (None: on CPUs, nothing checked);
    `signal_delay_s`: SLURM's warning before the time limit, as sized or set (the launcher's as set off SLURM);
    `gpus`, `per_job`: this machine's GPUs and how many a local job takes (local submits only); `refused`: the one
    line of the first check that refused (the checks after it did not run), None when all passed."""

    lines: list[str] = field(default_factory=list)
    estimate: dict[str, list] = field(default_factory=dict)
    gpu_gb: Optional[float] = None
    signal_delay_s: Optional[int] = None
    gpus: list[str] = field(default_factory=list)
    per_job: int = 0
    refused: Optional[str] = None

    @property
    def warnings(self) -> list[str]:
        return [line for line in self.lines if line.startswith("WARNING: ")]

    def raise_refusal(self) -> None:
        """The refusal, raised as the ValueError its check raised (the command says it in one line); none: nothing."""
        if self.refused is not None:
            raise ValueError(self.refused)


def check_before_submit(planned: Sequence, cfg: DictConfig, *, cluster: str, dry_run: bool) -> Found:
    """Every check before a run is created or a job submitted, once each, in one order, for `planned` (run.Planned:
    each with its .variant.label and composed .cfg; one for a single run, the variants of a sweep); `cfg` the
    command's own config (its launcher, its sweep settings); `cluster` where the jobs run (local, slurm, debug);
    `dry_run`: what the jobs import but is missing here is warned, not refused, and what only a submit needs (the
    SLURM partition, this machine's GPUs) is not checked. Returns what was found; a refusal ends the checks, and
    is returned, with the lines found before it, not raised (the caller prints them, then
    `Found.raise_refusal`)."""
    launcher = OmegaConf.to_container(cfg.launcher, resolve=True, enum_to_str=True)
    found = Found(signal_delay_s=launcher.get("signal_delay_s"))
    try:
        found.lines += import_warnings(planned, dry_run)
        tokenizers = load_models(planned)
        found.lines += made_of(planned, tokenizers)
        found.gpu_gb = checks.gpu_memory_gb(planned[0].cfg, cluster)
        check_layouts(found, planned, cfg.sweep, tokenizers)
        if found.gpu_gb:  # on GPUs: what the runs would cost there
            found.lines += cost_lines(planned)
        if cluster == "slurm":
            found.signal_delay_s = size_warning(found, planned, launcher)
        if not dry_run:
            check_submit(found, planned, launcher, cluster)
    except ValueError as why:  # the checks' one line
        found.refused = str(why)
    return found


def print_found(found: Found) -> None:
    """The pre-flight's lines, in the order found: what was found on stdout, a warning (`WARNING: ...`) on stderr."""
    for line in found.lines:
        print(line, file=sys.stderr if line.startswith("WARNING: ") else sys.stdout)


def import_warnings(planned: Sequence, dry_run: bool) -> list[str]:
    """What each variant's jobs import, here (checks.check_imports): refused, or in a dry run warned, once a line."""
    return list(dict.fromkeys(line for p in planned for line in checks.check_imports(p.cfg, dry_run)))


def model_key(cfg: DictConfig) -> str:
    """A variant's model, as a key: the variants of one model share its checks and its tokenizer."""
    return json.dumps(OmegaConf.to_container(cfg.model), sort_keys=True)


def load_models(planned: Sequence) -> dict[str, object]:
    """Each of the variants' models checked once (checks.check_model), and its tokenizer, loaded once for the checks
    after (the pre-flight's lines, the memory model's phrase tokens): model key -> tokenizer."""
    models = {model_key(p.cfg): p.cfg.model for p in planned}
    for model in models.values():
        checks.check_model(model)
    return {key: checks.tokenizer_of(model) for key, model in models.items()}


def made_of(planned: Sequence, tokenizers: dict[str, object]) -> list[str]:
    """What the runs are made of (checks.preflight: stop tokens, model, data, first prompt, their warnings), once
    for each distinct model, generation and task, each line once."""
    distinct = {json.dumps(OmegaConf.to_container(OmegaConf.masked_copy(p.cfg, ["model", "generation", "task"])),
                           sort_keys=True): p for p in planned}
    return list(dict.fromkeys(line for p in distinct.values()
                              for line in checks.preflight(p.cfg, tokenizers[model_key(p.cfg)])))


def check_layouts(found: Found, planned: Sequence, sweep: DictConfig, tokenizers: dict[str, object]) -> None:
    """Each variant's layout: its reference clock, its trainer layout, an adaptive sweep's rungs against its steps,
    its processes' memory on a GPU of found.gpu_gb (kept in found.estimate, its lines in found.lines as each is
    checked: `memory_lines`)."""
    start = len(found.lines)
    described: dict[str, list[str]] = {}
    for p in planned:
        checks.check_compute(p.cfg.train)
        checks.check_run(p.cfg)
        if sweep.adaptive:
            check_settings(sweep, int(p.cfg.train.steps))
        estimate = checks.check_memory(p.cfg, found.gpu_gb, tokenizers[model_key(p.cfg)])
        found.estimate[p.variant.label] = estimate
        described[p.variant.label] = [process.describe(found.gpu_gb) for process in estimate]
        found.lines[start:] = memory_lines(described)


MEMORY_TITLE = "memory per GPU (ablate/memory.py's estimate at the longest rows):"


def memory_lines(described: dict[str, list[str]]) -> list[str]:
    """The memory estimate's lines, from each variant's processes described (variant label -> lines, in the order
    checked): the first variant's in full under a title, then, of each other, the lines that differ from those
    (loo-8op's validation), named by its label. None on CPUs (no process described)."""
    shown: Optional[list[str]] = None
    lines = []
    for label, said in described.items():
        if said and shown is None:
            lines += [MEMORY_TITLE, *(f"  {line}" for line in said)]
            shown = said
        elif said:
            lines += [f"  {label}: {line}" for line in said if line not in shown]
    return lines


def cost_lines(planned: Sequence) -> list[str]:
    """Each run's GPU-hours by the cost model (ablate/cost.py), at completions of half their budget and of all of
    it, its own rows trained (cost.priced); variants of the same cost on one line, the sweep's total (more
    than one run), and the paper's for scale. Then, at half the budget, the side that binds each (generation or
    learning), what a learner twice as fast would save, and the generator tokens/s below which generation would
    bind."""
    first = planned[0].cfg
    params = checks.model_shape(first.model).params
    budget = cost.completion_budget(first)
    speed = cost.throughput(first, params)
    peak = float(first.run.get("peak_tflops") or cost.PEAK_TFLOPS[cost.PRICED_KIND])
    out = [f"GPU-hours (ablate/cost.py's estimate: {speed.generate:,.0f} tokens/s a generator GPU"
           f"{'' if first.launcher.get('gen_tokens_per_s') else ' (an upper bound: launcher.gen_tokens_per_s)'}, "
           f"{speed.train:,.0f} a trainer GPU at {speed.train * 6 * params / 1e12 / peak:.0%} MFU"
           f"{'' if first.launcher.get('train_mfu') else ' (an estimate: launcher.train_mfu)'} of {peak:,.0f} TFLOP/s"
           f"{'' if first.run.get('peak_tflops') else f' (an {cost.PRICED_KIND}: run.peak_tflops)'}; prompts at "
           f"their budget, {int(first.generation.max_prompt_tokens):,} tokens; completions of {budget // 2:,} on "
           f"average, or {budget:,}; every row trained without zero-variance filtering, {cost.KEPT:.0%} with it):"]
    lines: dict[str, list[str]] = {}
    binds: dict[str, list[str]] = {}
    total = [0.0, 0.0, 0.0]
    for p in planned:
        kept = cost.rows_trained(p.cfg)
        half, full = (cost.priced(p.cfg, params, share) for share in (0.5, 1.0))
        total = [total[0] + half.gpu_hours, total[1] + full.gpu_hours, total[2] + half.val_gpu_hours]
        line = (f"{half.gpu_hours:,.0f} GPU-hours ({full.gpu_hours:,.0f}), {half.step_s:,.0f} s a step, "
                f"{half.wall_h:,.1f} h on {half.gpus} GPU{'s' if half.gpus > 1 else ''}"
                + (f", generators idle {half.generator_idle:.0%}" if half.generator_idle >= 0.005 else "")
                + (f"; validation +{half.val_gpu_hours:,.0f} (not in C)" if half.val_gpu_hours else ""))
        lines.setdefault(line, []).append(p.variant.label)
        b = cost.binding(p.cfg, params, cost.completion_budget(p.cfg) / 2)
        said = (f"{b.run.binds}{' (the two in turns)' if b.run.turns else ''}: {b.run.generate_s:,.0f} s "
                f"generating, {b.run.train_s:,.0f} s learning a step ({kept:.0%} of rows trained); a 2x learner saves "
                f"{b.saved:,.0f} GPU-h ({b.saved / b.run.gpu_hours:.0%}); generation binds below {b.even:,.0f} "
                f"tokens/s a generator GPU")
        binds.setdefault(said, []).append(p.variant.label)
    out += [f"  {', '.join(labels)}: {line}" for line, labels in lines.items()]
    if len(planned) > 1:
        out.append(f"  the sweep: {total[0]:,.0f} GPU-hours ({total[1]:,.0f}), validation +{total[2]:,.0f}")
    out.append(f"  for scale: the paper's LOO runs of an 8B model took ~{cost.PAPER_GPU_HOURS:,.0f} GPU-hours each "
               f"(docs/design.md#the-cost-model says why an estimate may fall short of it)")
    out.append("the side that binds, at half the budget (generation: the generator GPUs' tokens/s; learning: the "
               "trainer GPUs' MFU):")
    out += [f"  {', '.join(labels)}: {said}" for said, labels in binds.items()]
    return out


def size_warning(found: Found, planned: Sequence, launcher: dict) -> int:
    """launcher.signal_delay_s for the sweep's SLURM jobs: as set, or unset sized from the cost and memory models
    (the variant that needs the most; cost.MIN_SIGNAL_DELAY_S where there is no estimate, on CPUs); its line, with
    what it must hold, and a warning when a value set is shorter, in found.lines. Refused at or above the job's time
    limit, where the jobs would requeue themselves for ever, and above SLURM's most (checks.check_signal_delay)."""
    chosen, gpu_gb = launcher.get("signal_delay_s"), found.gpu_gb
    timeout_min = int(launcher["timeout_min"])
    if not gpu_gb:
        delay = int(chosen or cost.MIN_SIGNAL_DELAY_S)
        checks.check_signal_delay(delay, timeout_min, sized=chosen is None)
        return delay
    shape = checks.model_shape(planned[0].cfg.model)
    margins = [cost.warning_margin(p.cfg, shape.params,
                                   memory.checkpoint_bytes(shape, ranks=int(p.cfg.run.trainer_gpus))) for p in planned]
    margin = max(margins, key=lambda m: sum(m.values()))
    needed = sum(margin.values())
    parts = ", ".join(f"{what} {seconds:,.0f} s" for what, seconds in margin.items())
    delay = int(chosen) if chosen is not None else cost.signal_delay(margin)
    found.lines.append(
        f"SLURM's warning {delay:,} s before the time limit (launcher.signal_delay_s"
        f"{'' if chosen is not None else ', sized'}): checkpointing and requeuing take ~{needed:,.0f} s ({parts}; "
        f"ablate/cost.py, the checkpoint at launcher.checkpoint_gb_per_s={float(launcher['checkpoint_gb_per_s']):g})")
    checks.check_signal_delay(delay, timeout_min, sized=chosen is None)
    if delay < needed:
        found.lines.append(
            f"WARNING: launcher.signal_delay_s={delay} is shorter than that: at the time limit SLURM may kill a job "
            f"before its checkpoint is written, losing its steps since the last one. Unset it (sized: "
            f"{cost.signal_delay(margin)}), or set that much")
    if delay >= 60 * timeout_min / 2:
        found.lines.append(f"WARNING: the warning takes {delay / 60:,.0f} of the job's {timeout_min:,} minutes "
                           "(launcher.timeout_min): a longer time limit wastes less of each job")
    return delay


def check_submit(found: Found, planned: Sequence, launcher: dict, cluster: str) -> None:
    """What only a submit needs: on SLURM, a node of the partition that holds the request (launch.submit's
    check_request); here, GPUs enough for one job's layout (`local_gpus`, kept in found.gpus and found.per_job)."""
    if cluster == "slurm":
        check_request(launcher)
    if cluster != "local":
        return
    found.gpus, found.per_job = local_gpus(planned[0].cfg)
    if found.per_job > len(found.gpus):
        raise ValueError(f"each variant's layout takes {found.per_job} GPU(s) (run.trainer_gpus + run.generator_gpus) "
                         f"and this machine has {len(found.gpus)}")


def local_gpus(cfg: DictConfig) -> tuple[list[str], int]:
    """This machine's GPUs (their ids, as CUDA_VISIBLE_DEVICES lists them) and how many of them one local job takes:
    its layout's trainer ranks and engine processes when the model is on a GPU, none on the CPU."""
    import torch

    from ablate.policy import device_of

    if device_of(cfg.model).type != "cuda":
        return [], 0
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = [g for g in listed.split(",") if g] if listed else [str(i) for i in range(torch.cuda.device_count())]
    return gpus, int(cfg.run.trainer_gpus) + int(cfg.run.get("generator_gpus", 0))
