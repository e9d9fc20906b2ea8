"""The entry points of the fit: `fit_sigmoid` (one curve, or the pooled seeds of one variant) and `fit_runs`.

They check the points (analysis/law.py), then hand them to the fast fitter with its intervals
(analysis/posterior.py) or to the paper's own grid procedure (analysis/paper.py). The law's types and constants
are re-exported here, so `from analysis.fit import SigmoidFit, FitError, prepare, ...` keeps working. The method,
and where it departs from the paper: docs/fitting.md.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from analysis.law import (B_BOUNDS, C_MID_SPAN, C_MIN_FRACTION, CI_LEVEL, DIVERGED_DROP, FALLING_T, MIN_POINTS,
                          PARAMS, FitError, Prepared, SigmoidFit, fmt_compute, prepare, sigmoid_law)
from analysis.paper import fit_paper
from analysis.posterior import fit_prepared

__all__ = [
    "B_BOUNDS", "C_MID_SPAN", "C_MIN_FRACTION", "CI_LEVEL", "DIVERGED_DROP", "FALLING_T", "MIN_POINTS", "PARAMS",
    "FitError", "Prepared", "SigmoidFit", "fit_paper", "fit_prepared", "fit_runs", "fit_sigmoid", "fmt_compute",
    "prepare", "sigmoid_law",
]


def fit_sigmoid(
    compute,
    reward,
    *,
    r0: float | None = None,
    c_min: float | None = None,
    method: str = "fast",
    runs=None,
    A: float | None = None,
) -> SigmoidFit:
    """Fit Eq. 1 to (compute, reward) points; raise FitError(reason) when the data cannot be fitted.

    r0: the pre-RL pass rate; when None, the mean reward of the points at compute == 0 (an error if there are none).
    c_min: points with compute < c_min are left out; when None, (1.5/16) * max(compute) as in the paper.
    method: "fast" (this package's fitter, with intervals) or "paper" (the paper's grid; no intervals).
    runs: optional labels, one per point, naming the run (seed) each point comes from: the points of several runs
      of one variant are fitted together, and the noise is modelled run by run.
    A: fix the ceiling (the paper's common-A refit for comparing B); only B and C_mid are fitted.
    """
    if method == "paper":
        if runs is not None or A is not None:
            raise ValueError("method='paper' fits one run with A free: runs= and A= are for method='fast'")
        return fit_paper(compute, reward, r0=r0, c_min=c_min)
    if method != "fast":
        raise ValueError(f"method must be 'fast' or 'paper', not {method!r}")
    data = prepare(compute, reward, r0=r0, c_min=c_min, runs=runs)
    return fit_prepared(data, A_fixed=A)


def fit_runs(curves: Sequence[tuple], *, r0: float | None = None, c_min: float | None = None,
             A: float | None = None) -> SigmoidFit:
    """Fit the runs (seeds) of one variant together: `curves` is a sequence of (compute, reward) pairs."""
    if not curves:
        raise FitError("too few points: no runs")
    compute = np.concatenate([np.asarray(c, dtype=float).ravel() for c, _ in curves])
    reward = np.concatenate([np.asarray(r, dtype=float).ravel() for _, r in curves])
    runs = np.concatenate([np.full(np.size(c), i) for i, (c, _) in enumerate(curves)])
    return fit_sigmoid(compute, reward, r0=r0, c_min=c_min, runs=runs, A=A)
