"""One command for whoever has a GPU for a few minutes: the GPU tests and benchmarks that fit the devices it sees, in
at most --budget seconds (default 330: a lease's 15 minutes hold it, the machine's start and one rerun), then one
table (step, devices, result, seconds, what it said last). Its first step (bench/gpu_first.py, 3 minutes) checks
what only a GPU can; `--all` adds the longer benches and vLLM's steps.

    python bench/gpu_check.py              # on a GPU machine (vLLM's steps need the vllm extra)
    python bench/gpu_check.py --plan       # what it would run here, and nothing else
    python bench/gpu_check.py --logs $OUT/steps   # on a lent machine: each step's output comes back

Without a GPU it prints its plan and exits 0, so that CI runs it and it cannot rot (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Step:
    name: str
    gpus: int  # the fewest GPUs it needs
    budget_s: int  # its time limit
    command: tuple[str, ...]
    needs: str = ""  # a module it cannot run without: skipped where it is missing
    threads: int = 0  # torch's CPU threads a process (OMP_NUM_THREADS), where several share the machine's cores
    env: tuple[tuple[str, str], ...] = ()  # more environment for its process
    more: bool = False  # not in the default plan: for a longer lease (--all)


PYTEST = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=")
# A lease is 15 minutes of device time, its machine's start (1-2 min) included, one rerun kept in hand: the default
# plan's budgets add up to CORE_S, in order of what only a GPU can show (docs/testing.md#gpu-minutes)
CORE_S = 330
STEPS = (
    # a GQA model's attention kernels at 8k and 16k tokens, the head's gradient against fp64 on tensor cores, the fp32
    # head against fp32_exact, FSDP2 on one NCCL rank, the learner beside plain transformers (bench/gpu_first.py)
    Step("what only a GPU shows: kernels, head, FSDP2, learner", 1, 170, (sys.executable, "bench/gpu_first.py")),
    # the files holding tests marked gpu (tests/test_gpu_check.py keeps this list whole): collecting all of tests/
    # would need every test extra there (trl, datasets), which a lent machine lacks
    Step("CUDA tests (devices, mixed precision)", 1, 65, PYTEST + ("-m", "gpu and not vllm", "tests/test_device.py")),
    # the CPU suite's files whose models follow model.device=auto onto the GPU where there is one; -v names each
    # test as it ends, so that a step stopped at its limit still says which failed. 8 workers of 2 threads on a
    # 16-core machine (82 passed in 55 s on an H200, 2026-11-27)
    Step("CPU tests that follow model.device=auto onto CUDA", 1, 95,
         PYTEST + ("-v", "-rfE", "-n", "8", "--timeout", "90", "-m", "not slow and not vllm and not slurm",
                   "tests/test_device.py", "tests/test_mixed_precision.py", "tests/test_precision.py",
                   "tests/test_trainer.py", "tests/test_engine.py"), needs="xdist", threads=2),
    # the tests run eager unless ABLATE_VLLM_GRAPHS=1: here each engine captures its CUDA graphs
    Step("vLLM in-process on CUDA (graphs on), its rules and loads", 1, 180,
         PYTEST + ("-m", "vllm", "tests/test_vllm.py", "-k",
                   "not processes_of_their_own and not straight and not warned_direct"), needs="vllm",
         env=(("ABLATE_VLLM_GRAPHS", "1"),), more=True),
    Step("learner MFU, peak memory vs the memory model; hf vs vLLM tokens/s; weight sync", 1, 150,
         (sys.executable, "bench/bench_gpu.py", "--parts", "learner,generators", "--learner-steps", "2",
          "--forms", "3"), more=True),  # 8 rows, a token budget, and rows of up to 8k tokens
    Step("whole run (paper_8b, 1B): s/step, idle and wait; bf16 log-prob gap", 1, 240,
         (sys.executable, "bench/bench_gpu.py", "--parts", "run", "--run-steps", "3", "--every-row"), more=True),
    Step("vLLM tokens/s with CUDA graphs off", 1, 60,
         (sys.executable, "bench/bench_gpu.py", "--parts", "generators", "--eager"), needs="vllm", more=True),
    Step("FSDP over NCCL + vLLM engine processes, staged, direct, tensor parallel", 3, 300,
         PYTEST + ("-m", "vllm", "tests/test_vllm.py", "-k",
                   "processes_of_their_own or straight or warned_direct"), needs="vllm", more=True),
)


def plan(gpus: int, everything: bool = False) -> list[Step]:
    """The steps that fit `gpus` devices, in order: the default plan's, or (`everything`) every step's."""
    return [step for step in STEPS if step.gpus <= gpus and (everything or not step.more)]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:100] if lines else ""


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def run(steps: list[Step], budget_s: float, logs: Path | None = None) -> list[tuple[Step, str, float, str]]:
    """Each step in a process of its own, within its own limit and what is left of `budget_s`; with `logs`, each
    step's whole output goes to a file there (step-1.log, ...), the table keeping only its last line."""
    results, deadline = [], time.monotonic() + budget_s
    for number, step in enumerate(steps, 1):
        left = deadline - time.monotonic()
        if left < 10:
            results.append((step, "skipped: out of time", 0.0, ""))
            continue
        if step.needs and importlib.util.find_spec(step.needs) is None:
            results.append((step, f"skipped: no {step.needs}", 0.0, ""))
            print(f"{step.name}: skipped (no {step.needs})", file=sys.stderr, flush=True)
            continue
        began = time.monotonic()
        try:
            env = {**os.environ, **dict(step.env), **({"OMP_NUM_THREADS": str(step.threads)} if step.threads else {})}
            out = subprocess.run(step.command, cwd=ROOT, capture_output=True, text=True, env=env,
                                 timeout=min(step.budget_s, left))
            result, said, text = ("passed" if out.returncode == 0 else f"failed ({out.returncode})"), \
                _last_line(out.stdout + out.stderr), out.stdout + out.stderr
        except subprocess.TimeoutExpired as stopped:
            result, said, text = "timed out", "", _text(stopped.stdout) + _text(stopped.stderr)
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
            (logs / f"step-{number}.log").write_text(f"$ {' '.join(step.command)}\n{text}")
        results.append((step, result, time.monotonic() - began, said))
        print(f"{step.name}: {result}", file=sys.stderr, flush=True)
    return results


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", action="store_true", help="print what would run here, run nothing")
    parser.add_argument("--all", action="store_true", help="every step that fits the devices, not only the default "
                        "plan's (for a lease longer than one check and its rerun)")
    parser.add_argument("--budget", type=float, default=CORE_S, help="seconds for all the steps together")
    parser.add_argument("--logs", type=Path, help="a folder for each step's whole output")
    args = parser.parse_args()
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    steps = plan(gpus, args.all)
    print(f"{gpus} GPU(s) here: {len(steps)} of {len(STEPS)} steps fit"
          + ("" if gpus else " (none without a GPU: this is the plan for 1 and for 3+ GPUs)"))
    if args.plan or not gpus:
        rows = [["step", "GPUs", "plan", "limit s", "command"]]
        rows += [[s.name, f">= {s.gpus}", "--all" if s.more else "default", str(s.budget_s),
                  " ".join(s.command[1:] if s.command[0] == sys.executable else s.command)] for s in STEPS]
        print(table(rows))
        core, more = sum(s.budget_s for s in plan(1)), sum(s.budget_s for s in STEPS if s.more)
        print(f"default plan (1 GPU): {core} s of its {CORE_S} s budget; --all adds {more} s (vLLM's steps where "
              f"vLLM is installed, the 3-GPU step on 3+ GPUs)")
        return 0
    rows = [["step", "GPUs", "result", "s", "said last"]]
    rows += [[s.name, str(s.gpus), result, f"{seconds:.0f}", said]
             for s, result, seconds, said in run(steps, args.budget, args.logs)]
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
