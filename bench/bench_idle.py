"""Generator and trainer idle fractions, off_policy=pipeline_rl against ppo_off_policy, with generation running
concurrently (generator.concurrent=true: its own thread) on the embedded tiny setup.

generator idle = the share of wall time the generator had nothing it was allowed to decode (held back by the
off-policy rule, waiting for weights); trainer idle = the share the trainer waited for its batch. Also the
staleness the trainer saw, and steps per second.

    python bench/bench_idle.py [--steps 150] [--k 4]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from common import run_trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the two sides share them)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'mode':<16} {'gen idle':>9} {'trainer idle':>13} {'steps/s':>8} {'staleness mean':>15} "
          f"{'max':>4} {'val start -> end':>17}")
    for mode in ("pipeline_rl", "ppo_off_policy"):
        run = run_trainer([f"off_policy={mode}", f"off_policy.k={args.k}", "generator.concurrent=true",
                           "generator.max_waves=4", f"train.steps={args.steps}", f"train.val_every={args.steps}"])
        last = run["steps"][-2][1]  # before the final validation
        stale = [m["train/staleness_mean"] for _, m in run["steps"]]
        stale_max = max(m["train/staleness_max"] for _, m in run["steps"])
        (t0, _), (t1, _) = run["steps"][0], run["steps"][-2]
        print(f"{mode:<16} {last['perf/generator_idle_frac']:>9.2f} {last['perf/trainer_wait_frac']:>13.2f} "
              f"{(len(run['steps']) - 2) / (t1 - t0):>8.1f} {sum(stale) / len(stale):>15.2f} {stale_max:>4.0f} "
              f"{run['val'][0][2]:>8.3f} -> {run['val'][-1][2]:.3f}", flush=True)


if __name__ == "__main__":
    main()
