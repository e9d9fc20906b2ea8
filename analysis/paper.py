"""The paper's own fitting procedure (`fit_paper`), reproduced to be compared with `fit_sigmoid` on the same curves.

A grid over A in {0.450, 0.455, ..., 0.800} and 100 linearly spaced C_mid in [100, 40000]; for each pair, B from
scipy's curve_fit with its default start (p0 = 1, no bounds); the pair with the lowest squared error wins. Points
below c_min are left out and R0 is taken as `fit_sigmoid` takes it, so both methods see the same data. No
intervals: the paper reports none. See docs/fitting.md#the-papers-own-fit.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from analysis.law import FitError, SigmoidFit, prepare

A_GRID = np.round(np.arange(0.450, 0.800 + 1e-9, 0.005), 3)
C_MID_GRID = np.linspace(100.0, 40_000.0, 100)


def _law(R0: float, A: float, C_mid: float):
    def law(C, B):
        return R0 + (A - R0) / (1 + (C_mid / C) ** B)

    return law


def fit_paper(compute, reward, *, r0: float | None = None, c_min: float | None = None) -> SigmoidFit:
    """The paper's grid fit of Eq. 1 (7,100 curve_fit calls); raises FitError as fit_sigmoid does."""
    from scipy.optimize import curve_fit

    data = prepare(compute, reward, r0=r0, c_min=c_min)
    c, r, R0 = data.c, data.r, data.R0
    best = (math.inf, math.nan, math.nan, math.nan)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for A in A_GRID:
            for C_mid in C_MID_GRID:
                law = _law(R0, float(A), float(C_mid))  # B is curve_fit's only parameter
                try:
                    (B,), _ = curve_fit(law, c, r)
                except (RuntimeError, ValueError, FloatingPointError):
                    continue
                sse = float(((law(c, B) - r) ** 2).sum())
                if math.isfinite(sse) and sse < best[0]:
                    best = (sse, float(A), float(B), float(C_mid))
    sse, A, B, C_mid = best
    if not math.isfinite(sse):
        raise FitError("the paper's grid found no (A, C_mid) pair where curve_fit converged")
    ss_tot = float(((r - r.mean()) ** 2).sum())
    notes = ["the paper's procedure: no intervals"]
    if A in (A_GRID[0], A_GRID[-1]):
        notes.append(f"A on the edge of the paper's grid ({A:.3f})")
    if C_mid in (C_MID_GRID[0], C_MID_GRID[-1]):
        notes.append(f"C_mid on the edge of the paper's grid ({C_mid:.0f})")
    return SigmoidFit(
        A=A,
        B=B,
        C_mid=C_mid,
        R0=R0,
        n_points=int(r.size),
        r2=1.0 - sse / ss_tot if ss_tot > 0 else math.nan,
        c_min=data.c_min,
        c_max=float(c.max()),
        notes=tuple(notes),
        method="paper",
        n_runs=data.n_runs,
    )
