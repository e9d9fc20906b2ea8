"""One command for whoever has a GPU for a few minutes: the GPU checks and benchmarks that fit the devices it sees, as
numbered steps, each in a process of its own within its time limit, then one table (step, devices, result, seconds,
what it said last). The default plan runs the new code first (the packed learner's varlen kernel, a paper-like step
packed against the old plan, FSDP and compiled, a compiled packed step), then what only a GPU shows of the rest; its
limits add up to at most one device call (CALL_S), so that a lease holds it, its machine's start and a rerun of its
longest step. `--all` cuts every step that fits the devices into device calls of at most CALL_S each and prints
each call's command; `--steps` runs the steps named (docs/testing.md#gpu-minutes).

    python bench/gpu_check.py                        # the default plan, on a GPU machine
    python bench/gpu_check.py --plan                 # every step, its limit and plan, the totals, --all's calls
    python bench/gpu_check.py --all                  # the device calls that run every step that fits here
    python bench/gpu_check.py --steps 6,7 --logs $OUT/steps   # those steps; each step's output comes back

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
    more: bool = False  # not in the default plan: for --all's further calls, or --steps


PYTHON = sys.executable
PYTEST = (PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=")
# A lease is 15 minutes of device time, its machine's start (1-2 min) included; one device call stops at 600 s, of
# which CALL_S for the steps (the rest: the process's start, the logs' way back). The default plan is one call, and
# its start, itself and a rerun of its longest step (the machine still warm) fit the lease (tests/test_gpu_check.py)
LEASE_S, START_S, CALL_S = 15 * 60, 120, 540
STEPS = (
    # --- the default plan, the new code first (the limits: the last H200's figures scaled, docs/testing.md)
    Step("varlen on this torch: grouped K/V, repeated, SDPA by row; the learner's packed attention", 1, 45,
         (PYTHON, "bench/gpu_first.py", "--parts", "varlen")),
    Step("paper-like step: packed, today's per row, FSDP packed, FSDP packed and compiled", 1, 210,
         (PYTHON, "bench/bench_gpu.py", "--parts", "paper",
          "--paper-forms", "packed,today,packed-fsdp,packed-fsdp-compiled", "--paper-steps", "1")),
    Step("a compiled packed step: compile s, steady s, graph breaks, recompiles, loss vs eager", 1, 90,
         (PYTHON, "bench/gpu_first.py", "--parts", "compiled")),
    # a GQA model's kernels at 8k and 16k tokens and its peak against the memory model, the head's gradient against
    # fp64 on tensor cores, the fp32 head against fp32_exact, FSDP2 on one NCCL rank, the learner (packed, padded)
    # beside plain transformers on the same rows, the CUDA context
    Step("kernels at 8k/16k, head, FSDP2, the learner beside plain transformers", 1, 130,
         (PYTHON, "bench/gpu_first.py", "--parts", "attention,head-gradient,head-speed,fsdp,learner,context")),
    # the files holding tests marked gpu (tests/test_gpu_check.py keeps this list whole): collecting all of tests/
    # would need every test extra there (trl, datasets), which a lent machine lacks
    Step("CUDA tests (devices, mixed precision)", 1, 60, PYTEST + ("-m", "gpu and not vllm", "tests/test_device.py")),
    # --- --all's further calls
    # the CPU suite's files whose models follow model.device=auto onto the GPU where there is one; -v names each
    # test as it ends, so that a step stopped at its limit still says which failed. 8 workers of 2 threads on a
    # 16-core machine (82 passed in 55 s on an H200, 2026-11-27)
    Step("CPU tests that follow model.device=auto onto CUDA", 1, 95,
         PYTEST + ("-v", "-rfE", "-n", "8", "--timeout", "90", "-m", "not slow and not vllm and not slurm",
                   "tests/test_device.py", "tests/test_mixed_precision.py", "tests/test_precision.py",
                   "tests/test_trainer.py", "tests/test_engine.py"), needs="xdist", threads=2, more=True),
    Step("learner MFU by plan, peak memory vs the memory model; hf vs vLLM tokens/s; weight sync", 1, 150,
         (PYTHON, "bench/bench_gpu.py", "--parts", "learner,generators", "--learner-steps", "2", "--forms", "3"),
         more=True),
    Step("whole run (paper_8b, 1B): s/step, idle and wait; bf16 log-prob gap", 1, 240,
         (PYTHON, "bench/bench_gpu.py", "--parts", "run", "--run-steps", "3", "--every-row"), more=True),
    # vLLM's steps, where vllm is installed (a cluster node with the vllm extra; a lent machine has none): the tests
    # run eager unless ABLATE_VLLM_GRAPHS=1, here each engine captures its CUDA graphs
    Step("vLLM in-process on CUDA (graphs on), its rules and loads", 1, 180,
         PYTEST + ("-m", "vllm", "tests/test_vllm.py", "-k",
                   "not processes_of_their_own and not straight and not warned_direct"), needs="vllm",
         env=(("ABLATE_VLLM_GRAPHS", "1"),), more=True),
    Step("vLLM tokens/s with CUDA graphs off", 1, 60,
         (PYTHON, "bench/bench_gpu.py", "--parts", "generators", "--eager"), needs="vllm", more=True),
    Step("FSDP over NCCL + vLLM engine processes, staged, direct, tensor parallel", 3, 300,
         PYTEST + ("-m", "vllm", "tests/test_vllm.py", "-k",
                   "processes_of_their_own or straight or warned_direct"), needs="vllm", more=True),
)


def plan(gpus: int, everything: bool = False) -> list[Step]:
    """The steps that fit `gpus` devices, in order: the default plan's, or (`everything`) every step's."""
    return [step for step in STEPS if step.gpus <= gpus and (everything or not step.more)]


def number(step: Step) -> int:
    """A step's number: its place in STEPS, from 1 (what --steps names)."""
    return STEPS.index(step) + 1


def chosen(spec: str) -> list[Step]:
    """--steps: numbers and ranges ("1,3-5"), in STEPS's order."""
    numbers = set()
    for part in spec.split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise SystemExit(f"--steps {spec}: numbers and ranges of them (1,3-5)")
        numbers |= set(range(int(first), int(last or first) + 1))
    wrong = sorted(n for n in numbers if not 1 <= n <= len(STEPS))
    if wrong:
        raise SystemExit(f"--steps {spec}: no step {', '.join(map(str, wrong))} (1 to {len(STEPS)})")
    return [STEPS[n - 1] for n in sorted(numbers)]


def calls(steps: list[Step], limit: int = CALL_S) -> list[list[Step]]:
    """`steps` cut into device calls, in order, each call's limits adding up to at most `limit`: a step joins the
    call before it while the sum stays within `limit`, else starts the next one."""
    cut: list[list[Step]] = []
    for step in steps:
        if cut and sum(s.budget_s for s in cut[-1]) + step.budget_s <= limit:
            cut[-1].append(step)
        else:
            cut.append([step])
    return cut


def call_lines(steps: list[Step]) -> list[str]:
    """Each device call of `steps` (`calls`): its limits' sum, the modules its steps need, its command."""
    lines = []
    for i, call in enumerate(calls(steps), 1):
        needs = ""
        for module in dict.fromkeys(s.needs for s in call if s.needs):
            named = [str(number(s)) for s in call if s.needs == module]
            needs += f"; step {named[0]} needs {module}" if len(named) == 1 else \
                f"; steps {', '.join(named)} need {module}"
        lines.append(f"  call {i} ({sum(s.budget_s for s in call)} s{needs}): python bench/gpu_check.py --steps "
                     f"{','.join(str(number(s)) for s in call)}")
    return lines


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:100] if lines else ""


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def run(steps: list[Step], budget_s: float, logs: Path | None = None) -> list[tuple[Step, str, float, str]]:
    """Each step in a process of its own, within its own limit and what is left of `budget_s`; with `logs`, each
    step's whole output goes to a file there (step-N.log, N its number), the table keeping only its last line."""
    results, deadline = [], time.monotonic() + budget_s
    for step in steps:
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
            name = f"step-{number(step)}.log" if step in STEPS else f"step-{len(results) + 1}.log"
            (logs / name).write_text(f"$ {' '.join(step.command)}\n{text}")
        results.append((step, result, time.monotonic() - began, said))
        print(f"{step.name}: {result}", file=sys.stderr, flush=True)
    return results


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _gpus(count: int) -> str:
    return f"{count} GPU{'' if count == 1 else 's'}"


def print_plan() -> None:
    """Every step (its number, GPUs, plan, limit, command), the default plan's total, and --all's calls."""
    rows = [["#", "step", "GPUs", "plan", "limit s", "command"]]
    rows += [[str(number(s)), s.name, f">= {s.gpus}", "--all" if s.more else "default", str(s.budget_s),
              " ".join(s.command[1:] if s.command[0] == PYTHON else s.command)
              + (f" (needs {s.needs})" if s.needs else "")] for s in STEPS]
    print(table(rows))
    core = sum(s.budget_s for s in plan(1))
    print(f"default plan (1 GPU): {core} s (one call: at most {CALL_S}); with the machine's start ({START_S} s) and a "
          f"rerun of its longest step ({max(s.budget_s for s in plan(1))} s), "
          f"{START_S + core + max(s.budget_s for s in plan(1))} s of the lease's {LEASE_S}")
    for gpus, said in ((1, "1 GPU"), (3, "3+ GPUs")):
        steps = plan(gpus, everything=True)
        print(f"--all on {said}: {sum(s.budget_s for s in steps)} s in "
              f"{len(calls(steps))} calls of at most {CALL_S} s")
        print("\n".join(call_lines(steps)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", action="store_true", help="print every step, its limit and the totals; run nothing")
    parser.add_argument("--all", action="store_true", help=f"print the device calls (of at most {CALL_S} s each) "
                        "that run every step that fits the devices here, each call's command; run nothing")
    parser.add_argument("--steps", help="run these steps (numbers, ranges: 1,3-5; --plan numbers them) instead of "
                        "the default plan's")
    parser.add_argument("--budget", type=float, help="seconds for all the steps together (default: their limits "
                        "added up)")
    parser.add_argument("--logs", type=Path, help="a folder for each step's whole output")
    args = parser.parse_args()
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    steps = chosen(args.steps) if args.steps else [s for s in STEPS if not s.more]
    fits = [s for s in steps if s.gpus <= gpus]
    which = "chosen" if args.steps else "of the default plan"
    print(f"{gpus} GPU(s) here: {len(fits)} of the {len(steps)} steps {which} fit"
          + ("" if gpus else " (none without a GPU: the plan for 1 and for 3+ GPUs)"))
    if args.plan or not gpus:
        print_plan()
        return 0
    if args.all:
        here = [s for s in plan(gpus, everything=True) if not s.needs or importlib.util.find_spec(s.needs)]
        missing = [f"{number(s)} (no {s.needs})" for s in plan(gpus, everything=True) if s not in here]
        print(f"--all on {_gpus(gpus)}: {len(calls(here))} calls of at most {CALL_S} s"
              + (f"; left out, their module missing here: steps {', '.join(missing)}" if missing else ""))
        print("\n".join(call_lines(here)))
        return 0
    total = sum(s.budget_s for s in fits)
    if total > CALL_S:
        print(f"these steps' limits add up to {total} s: more than one device call's {CALL_S} (--all cuts them)",
              file=sys.stderr)
    rows = [["#", "step", "GPUs", "result", "s", "said last"]]
    rows += [[str(number(s)), s.name, str(s.gpus), result, f"{seconds:.0f}", said]
             for s, result, seconds, said in run(fits, args.budget or total, args.logs)]
    rows += [[str(number(s)), s.name, str(s.gpus), f"skipped: needs {s.gpus} GPUs", "0", ""] for s in steps
             if s not in fits]
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
