"""The whole dry-run loop on 2 cores: `python -m ablate sweep=loo generator=mock train.steps=100 train.val_every=2`,
then `python -m analysis report`.

Prints the wall time of each part, and checks the report against the mock's ground truth: for every pair of
variants whose true A values differ by more than 0.03, does the report rank them in the true order?

    python bench/bench_loop.py            # one sweep (seed 0)
    python bench/bench_loop.py --seeds 5  # five sweeps with seeds 0-4: how often the order is recovered
Target (issue 2): the whole loop under 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARGIN = 0.03


def run(args: list[str], cwd: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    started = time.perf_counter()
    out = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(args)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return time.perf_counter() - started


def truths(folder: Path) -> dict[str, float]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder}/mlflow.db")
    exp = client.get_experiment_by_name("tiny")
    return {r.data.tags["ablate.variant"]: float(r.data.params["mock.truth.A"])
            for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("ablate.role") == "variant"}


def check(folder: Path, report: Path) -> tuple[int, int, list[str]]:
    true_a = truths(folder)
    rows = list(csv.DictReader((report / "fits.csv").open()))
    position = {row["variant"]: i for i, row in enumerate(rows)}  # fits.csv is in rank order
    pairs, wrong = 0, []
    for a, b in itertools.combinations(true_a, 2):
        if abs(true_a[a] - true_a[b]) <= MARGIN + 1e-9:  # "more than 0.03": 0.55 vs 0.52 is not
            continue
        pairs += 1
        better, worse = (a, b) if true_a[a] > true_a[b] else (b, a)
        if position[better] > position[worse]:
            wrong.append(f"{worse} (A={true_a[worse]:.3f}) ranked above {better} (A={true_a[better]:.3f})")
    return pairs, pairs - len(wrong), wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=1)
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}  python: {sys.version.split()[0]}")
    print(f"{'seed':>4}  {'sweep+report s':>14}  {'report alone s':>14}  {'pairs ok (dA > 0.03)':>20}")
    totals = []
    for seed in range(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            loop = run(["-m", "ablate", "sweep=loo", "generator=mock", "train.steps=100", "train.val_every=2",
                        f"seed={seed}"], folder)
            report_s = run(["-m", "analysis", "report", "--experiment", "tiny", "--out", "report"], folder)
            pairs, ok, wrong = check(folder, folder / "report")
            totals.append((loop, ok, pairs))
            print(f"{seed:>4}  {loop:>14.1f}  {report_s:>14.1f}  {ok:>12d} / {pairs:<6d}")
            for line in wrong:
                print(f"      wrong: {line}")
    loops = sorted(t[0] for t in totals)
    print(f"whole loop (sweep of 9 mock variants + report): median {loops[len(loops) // 2]:.1f} s, "
          f"max {loops[-1]:.1f} s (target < 60 s)")
    print(f"order recovered: {sum(t[1] for t in totals)} / {sum(t[2] for t in totals)} pairs")


if __name__ == "__main__":
    main()
