"""The project's public RL runs (analysis/data/real_curves/) through the analysis: what their noise is, beside the
generated sets'; how often the half-run extrapolation check predicts their end; the drift it allows for, measured
here; and which runs the misfit test says the law does not describe.

Per source (the hold-out last, never used to choose anything):
- the residuals of each run about its own fitted law (analysis/real_noise.py's `measure`): sd, autocorrelation at
  lags 1, 2 and 5 points, excess kurtosis, the share beyond 3 robust sd, the slow part (a running mean over a
  fifteenth of the run) and the fast part; the generated sets' residuals beside them;
- the extrapolation check (fit on the first half, predict the mean over the last 5%): the share of observed ends
  inside their 90% prediction, the printed prediction inside its own interval, the error;
- the drift (analysis/extrapolate.py's DRIFT): the d at which the median of error^2 / (sd^2 + d^2), sd the
  prediction's without drift, is the normal's 0.455, pooled over the calibration runs and with each source left out;
- the misfit test's flags (analysis/misfit.py), with the departure each flagged run shows.

    python bench/bench_real.py                 # everything (about 3 minutes on 2 cores)
    python bench/bench_real.py --no-synthetic  # the real runs only

The figures and what they decided: docs/fitting.md#real-noise.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.extrapolate import DRIFT, extrapolation_check, predicted_end  # noqa: E402
from analysis.fit import FitError, fit_sigmoid  # noqa: E402
from analysis.misfit import misfit  # noqa: E402
from analysis.real_noise import donor, measure, real_runs  # noqa: E402
from analysis.synthetic import MockNoise, Truth, benchmark_curves, drifting_curves, heldout_like_curves, mock_curve  # noqa: E402

FIGURES = ("points", "sd", "lag1", "lag2", "lag5", "kurtosis", "beyond_3sd", "sd_slow", "sd_fast", "fast_lag1")
NORMAL_MEDIAN = 0.4549364  # the median of a chi-square(1): of z^2 for a normal z


def family(source: str) -> str:
    """A source's family: the two CS336 files are one (one student's runs, two code versions)."""
    return "cs336" if source.startswith("cs336") else source


def noise_table(runs, synthetic: bool) -> None:
    print("\nresiduals about each run's own fitted law: medians over a source's runs")
    print(f"{'source':<34}{'runs':>5} " + " ".join(f"{k[:9]:>9}" for k in FIGURES))
    by = defaultdict(list)
    for run in runs:
        d = donor(run)
        if d is not None:
            by[("hold-out: " if run.holdout else "") + run.source].append(measure(d.residual))

    def row(name, ms):
        print(f"{name[:34]:<34}{len(ms):>5} " + " ".join(f"{np.median([m[k] for m in ms]):>9.4f}" for k in FIGURES))

    for name, ms in by.items():
        row(name, ms)
    if not synthetic:
        return
    rng = np.random.default_rng(1)
    sets = {"generated: held-out-like": heldout_like_curves(100, seed=5),
            "generated: benchmark": benchmark_curves(100, seed=5),
            "generated: drifting": drifting_curves(100, seed=5),
            "generated: mock runs": [mock_curve(rng, Truth(0.61, 1.92, 2542.0, 0.3), MockNoise()) for _ in range(100)]}
    for name, curves in sets.items():
        ms = []
        for c in curves:
            f = fit_sigmoid(c.compute, c.reward)
            keep = c.compute >= f.c_min
            ms.append(measure(c.reward[keep] - f.predict(c.compute[keep])))
        row(name, ms)


def checks(runs) -> list[tuple]:
    """(run, check, the prediction's sd without drift) for every run the half-run check could be made on."""
    out = []
    for run in runs:
        ex = extrapolation_check(run.step, run.reward, fraction=0.5)
        if not ex.ok:
            continue
        _, (lo, hi) = predicted_end(ex.sigmoid, ex.end_compute, drift=0.0)
        out.append((run, ex, (hi - lo) / (2 * 1.6448536)))
    return out


def extrapolation_table(done) -> None:
    print(f"\nthe half-run extrapolation check (drift {DRIFT} a doubling): the observed end inside its 90% prediction")
    print(f"{'source':<34}{'runs':>5}{'covered':>10}{'point inside':>14}{'|error| median':>16}")
    groups = defaultdict(list)
    for run, ex, _ in done:
        groups[("hold-out: " if run.holdout else "") + run.source].append(ex)
    groups["all calibration runs"] = [ex for run, ex, _ in done if not run.holdout]
    groups["all hold-out runs"] = [ex for run, ex, _ in done if run.holdout]
    for name, exs in groups.items():
        inside = sum(ex.predicted_ci[0] < ex.predicted < ex.predicted_ci[1] for ex in exs)
        covered = sum(ex.covered for ex in exs)
        print(f"{name[:34]:<34}{len(exs):>5}{covered:>6}/{len(exs):<3}{inside:>10}/{len(exs):<3}"
              f"{np.median([abs(ex.error) for ex in exs]):>16.4f}")


def drift_of(rows) -> float:
    """The d at which median(e^2 / (sd^2 + d^2)) is the normal's (0 where it already is below)."""
    from scipy.optimize import brentq

    e = np.array([ex.observed - ex.predicted for _, ex, _ in rows])
    sd = np.array([s for _, _, s in rows])

    def excess(d: float) -> float:
        return float(np.median(e**2 / (sd**2 + d**2))) - NORMAL_MEDIAN

    return brentq(excess, 0.0, 1.0) if excess(0.0) > 0 else 0.0


def drift_table(done) -> None:
    calibration = [x for x in done if not x[0].holdout]
    holdout = [x for x in done if x[0].holdout]

    def cover(rows, d):
        return np.mean([abs(ex.observed - ex.predicted) <= 1.6448536 * math.hypot(sd, d) for _, ex, sd in rows])

    d = drift_of(calibration)
    print(f"\nthe drift a doubling past the data, measured on the calibration runs: {d:.4f} (DRIFT {DRIFT}); "
          f"coverage at it: calibration {cover(calibration, d):.3f}, hold-out {cover(holdout, d):.3f}")
    for left in sorted({family(x[0].source) for x in calibration}):
        rest = [x for x in calibration if family(x[0].source) != left]
        mine = [x for x in calibration if family(x[0].source) == left]
        d = drift_of(rest)
        print(f"  left out {left:<28} ({len(mine):>3} runs): d {d:.4f}; its coverage {cover(mine, d):.3f}, "
              f"the hold-out's {cover(holdout, d):.3f}")


def misfit_table(runs) -> None:
    print("\nthe misfit test: runs the law does not describe (|z| >= 3.5 and a departure of 0.02 or more)")
    counts = defaultdict(lambda: [0, 0])
    for run in runs:
        try:
            fit = fit_sigmoid(run.step, run.reward)
        except FitError as err:
            print(f"  {run.source}/{run.name}: no fit ({err.reason.split(':')[0]})")
            continue
        m = misfit(run.step, run.reward, fit)
        key = "hold-out" if run.holdout else "calibration"
        counts[key][0] += 1
        if m is not None and m.flagged:
            counts[key][1] += 1
            print(f"  {run.source}/{run.name}: {m.text('steps')}")
    print("  flagged: " + "; ".join(f"{k} {v[1]} of {v[0]}" for k, v in counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-synthetic", action="store_true", help="leave out the generated sets' residuals")
    args = parser.parse_args()
    started = time.perf_counter()
    runs = real_runs() + real_runs(holdout=True)
    print(f"cores: {os.cpu_count()}; {len(runs)} public runs ({sum(r.holdout for r in runs)} of the hold-out) from "
          f"{len({r.source for r in runs})} files")
    noise_table(runs, not args.no_synthetic)
    done = checks(runs)
    extrapolation_table(done)
    drift_table(done)
    misfit_table(runs)
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
