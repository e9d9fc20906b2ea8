"""The tiny model's learning curve under scalerl on CPU: validation pass rate against compute, the sigmoid law fitted
to it (A, B, C_mid and R^2), and the wall time. The embedded default, one run, one core.

    python bench/bench_learning.py [--steps 600] [--seed 0] [override ...]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch
from common import run_trainer

from analysis import fit_sigmoid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = run_trainer([f"train.steps={args.steps}", f"seed={args.seed}", *args.overrides])
    print(f"{'step':>5} {'GPU-h (CPU-h)':>14} {'val pass':>9}")
    for step, compute, rate in run["val"]:
        print(f"{step:>5} {compute:>14.5f} {rate:>9.3f}")
    C = np.array([c for _, c, _ in run["val"]])
    R = np.array([r for _, _, r in run["val"]])
    fit = fit_sigmoid(C, R, r0=float(R[0]))  # fits the points with C > 0; fit.r2 is over those
    print(f"\nsigmoid fit: A={fit.A:.3f} [{fit.ci['A'][0]:.3f}, {fit.ci['A'][1]:.3f}]  B={fit.B:.2f}  "
          f"C_mid={fit.C_mid:.5f} device-h  R0={fit.R0:.3f}  R^2={fit.r2:.3f}")
    print(f"pass rate {R[0]:.3f} -> {R[-1]:.3f} (max {R.max():.3f}) in {run['wall_s']:.1f} s wall "
          f"({args.steps} steps, warm start included)")


if __name__ == "__main__":
    main()
