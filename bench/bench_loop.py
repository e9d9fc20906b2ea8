"""The whole mock-run loop on 2 cores: `python -m ablate sweep=loo generator=mock` (the mock brings its own schedule;
--steps / --val-every override it), which ends with its report, then `python -m analysis report` again on its own.

Prints the wall time of each part, and checks the report against the mock's ground truth (analysis/truth.py): how
many verdicts agree with the truth at their own resolution, the median resolution, and whether every pair of
variants whose true A values differ by more than 0.03 is ranked in the true order. Figures measured with it:
docs/testing.md#benches.

    python bench/bench_loop.py                            # one sweep (seed 0), the mock's own schedule
    python bench/bench_loop.py --seeds 3                  # seeds 0-2: one report each, then the three pooled
    python bench/bench_loop.py --steps 100 --val-every 2  # another schedule
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARGIN = 0.03


def run(args: list[str], cwd: Path) -> tuple[float, str]:
    """(wall seconds, stdout) of `python ARGS` in cwd; exits with the output's end if it fails."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    started = time.perf_counter()
    out = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(args)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return time.perf_counter() - started, out.stdout


def experiment_of(stdout: str) -> str:
    """The MLflow experiment the sweep logged to, from its "parent run ... in experiment 'NAME'" line."""
    found = re.search(r"in experiment '([^']+)'", stdout)
    if not found:
        sys.exit("could not find the sweep's experiment in its output")
    return found.group(1)


def check(report: Path) -> dict:
    """From variants.csv: verdicts judged against the truth, the median resolution, and the true-A order of pairs."""
    rows = list(csv.DictReader((report / "variants.csv").open()))  # in rank order
    judged = [row for row in rows if row["truth_says"]]
    wrong = [f"{row['label']}: {row['truth_disagrees']}" for row in judged if row["truth_disagrees"]]
    res = [(float(row["resolution_dA"]), float(row["resolution_dB"])) for row in judged]
    true_a = {row["label"]: float(row["true_A"]) for row in rows if row["true_A"]}
    position = {row["label"]: i for i, row in enumerate(rows)}
    pairs, misordered = 0, []
    for a, b in itertools.combinations(true_a, 2):
        if abs(true_a[a] - true_a[b]) <= MARGIN + 1e-9:  # "more than 0.03": 0.55 vs 0.52 is not
            continue
        pairs += 1
        better, worse = (a, b) if true_a[a] > true_a[b] else (b, a)
        if position[better] > position[worse]:
            misordered.append(f"{worse} (A={true_a[worse]:.3f}) ranked above {better} (A={true_a[better]:.3f})")
    return {"verdicts": len(judged), "wrong": wrong, "pairs": pairs, "misordered": misordered,
            "res_A": statistics.median(r[0] for r in res) if res else float("nan"),
            "res_B": statistics.median(r[1] for r in res) if res else float("nan")}


def show(label: str, loop: float | None, report_s: float, c: dict) -> None:
    loop_text = f"{loop:>14.1f}" if loop is not None else f"{'':>14}"
    print(f"{label:>6}  {loop_text}  {report_s:>14.1f}  {c['verdicts'] - len(c['wrong']):>8d} / {c['verdicts']:<4d}"
          f"  |dA| >= {c['res_A']:.3f}, |dB| >= {c['res_B']:.2f}  {c['pairs'] - len(c['misordered']):>6d} / "
          f"{c['pairs']:<4d}")
    for line in c["wrong"] + c["misordered"]:
        print(f"        wrong: {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="train.steps (default: the mock's own schedule)")
    parser.add_argument("--val-every", type=int, default=None, help="train.val_every (default: the mock's own)")
    args = parser.parse_args()
    schedule = ([f"train.steps={args.steps}"] if args.steps else []) + (
        [f"train.val_every={args.val_every}"] if args.val_every else [])
    command = ["-m", "ablate", "sweep=loo", "generator=mock", *schedule]
    print(f"cores: {os.cpu_count()}  python: {sys.version.split()[0]}  command: python {' '.join(command)} seed=N")
    print(f"{'seed':>6}  {'sweep+report s':>14}  {'report alone s':>14}  {'verdicts right':>15}  "
          f"{'median resolution':<29}  {'pairs ordered (dA > 0.03)'}")
    loops, totals = [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for seed in range(args.seeds):
            loop, stdout = run([*command, f"seed={seed}"], folder)
            experiment = experiment_of(stdout)
            report_s, _ = run(["-m", "analysis", "report", "--experiment", experiment, "--out", f"report-{seed}"],
                              folder)
            c = check(folder / f"report-{seed}")
            loops.append(loop)
            totals.append(c)
            show(str(seed), loop, report_s, c)
        if args.seeds > 1:
            report_s, _ = run(["-m", "analysis", "report", "--experiment", experiment, "--sweep", "all", "--out",
                               "report-pooled"], folder)
            show("pooled", None, report_s, check(folder / "report-pooled"))
    loops.sort()
    print(f"whole loop (sweep of 9 mock variants + its report): median {loops[len(loops) // 2]:.1f} s, "
          f"max {loops[-1]:.1f} s (target < 60 s)")
    right = sum(c["verdicts"] - len(c["wrong"]) for c in totals)
    print(f"verdicts right on the truth: {right} / {sum(c['verdicts'] for c in totals)}; order recovered: "
          f"{sum(c['pairs'] - len(c['misordered']) for c in totals)} / {sum(c['pairs'] for c in totals)} pairs")


if __name__ == "__main__":
    main()
