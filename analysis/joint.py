"""Several curves refitted jointly with one shared A, to compare their B (the paper's common-A refit, with the
uncertainty of the common A in every B interval).

`fit_common_A` makes the common A the minimum of the sum of the curves' fixed-A profile deviances (from each
curve's posterior grid, analysis/posterior.py), refits each curve with A fixed there, and gives each B and C_mid its
likelihood-ratio interval in the joint model. `lr_A` is the likelihood-ratio statistic of a common A;
`a_rejected`: the data do not sit well with one (p < COMMON_A_P). Why: docs/fitting.md#the-joint-refit-with-a-shared-a.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from analysis.law import FitError, Prepared, SigmoidFit
from analysis.posterior import FitState, chi2_cut, deviance_interval, fit_state

A_POINTS = 241
COMMON_A_P = 0.5  # a common A is used when its likelihood-ratio test has p >= this


@dataclass(frozen=True)
class CommonAFit:
    A: float  # the common A (joint least squares)
    ci_A: tuple[float, float]
    fits: list[SigmoidFit]  # per curve, in input order: the refit with A fixed at the common A; ci["B"] and
    #                         ci["C_mid"] are the joint intervals (the common A's uncertainty included)
    lr_A: float = 0.0  # deviance increase from sharing A: the likelihood-ratio statistic of a common A

    @property
    def a_rejected(self) -> bool:
        """The likelihood-ratio test of one common A has p < COMMON_A_P (chi-square with n - 1 degrees of freedom)."""
        from scipy.special import chdtri

        return self.lr_A > float(chdtri(max(len(self.fits) - 1, 1), COMMON_A_P))


def fit_common_A(datasets: Sequence[Prepared], states: Sequence[FitState] | None = None) -> CommonAFit:
    """Fit the curves jointly with one shared A; raises FitError when a curve cannot be fitted."""
    if states is None:
        states = [fit_state(d) for d in datasets]
    fits = [st.fit for st in states]
    lo = max(max(d.R0 for d in datasets) + 1e-6, min(f.ci["A"][0] for f in fits))
    hi = min(1.0, max(f.ci["A"][1] for f in fits))
    if not lo < hi:
        raise FitError("no common A: every A would sit below some run's R0")
    a_grid = np.linspace(lo, hi, A_POINTS)

    # a first common A from each curve's own grid, then grids that also cover each curve's fit at that A
    a_hat = a_grid[int(np.argmin(sum(_profile(st.cells, a_grid, st.sigma2["A"]) for st in states)))]
    fixed = [fit_state(d, A_fixed=float(a_hat)) for d in datasets]
    cells = [_covering(st.cells, fx.cells) for st, fx in zip(states, fixed)]

    prof_a = [_profile(c, a_grid, st.sigma2["A"]) for c, st in zip(cells, states)]
    total = sum(prof_a)
    lr_A = max(float(total.min() - sum(p.min() for p in prof_a)), 0.0)
    k = int(np.argmin(total))
    a_best = float(_parabola_min(a_grid, total, k))
    dev = total - total.min()
    inside = np.flatnonzero(dev <= chi2_cut())
    ci_A = (float(a_grid[inside[0]]), float(a_grid[inside[-1]]))
    if a_best != a_hat:
        fixed = [fit_state(d, A_fixed=a_best) for d in datasets]

    out = []
    for i, (st, fx, c) in enumerate(zip(states, fixed, cells)):
        others = sum(p for j, p in enumerate(prof_a) if j != i) if len(prof_a) > 1 else np.zeros_like(a_grid)
        ci = dict(fx.fit.ci)
        for name, axis in (("B", 0), ("C_mid", 1)):
            lo_x, hi_x = _joint_interval(c, a_grid, st.sigma2[name], others, axis)
            ci[name] = (math.exp(lo_x), math.exp(hi_x))
        notes = tuple(n for n in fx.fit.notes if not n.startswith("A fixed"))
        notes += (f"A shared with {len(datasets) - 1} other run(s) at {a_best:.4g} "
                  f"[{ci_A[0]:.4g}, {ci_A[1]:.4g}]",)
        out.append(replace(fx.fit, ci=ci, notes=notes, method="common-A"))
    return CommonAFit(A=a_best, ci_A=ci_A, fits=out, lr_A=lr_A)


def _parabola_min(x: np.ndarray, y: np.ndarray, k: int) -> float:
    if 0 < k < len(x) - 1:
        y0, y1, y2 = y[k - 1], y[k], y[k + 1]
        denom = y0 - 2 * y1 + y2
        if denom > 0:
            return float(x[k] + 0.5 * (y0 - y2) / denom * (x[1] - x[0]))
    return float(x[k])


def _covering(free_cells, fixed_cells):
    """A grid (A free) over the hull of the free fit's box and the fixed-A fit's box."""
    lo = np.minimum([free_cells.edges_u[0], free_cells.edges_v[0]], [fixed_cells.edges_u[0], fixed_cells.edges_v[0]])
    hi = np.maximum([free_cells.edges_u[-1], free_cells.edges_v[-1]],
                    [fixed_cells.edges_u[-1], fixed_cells.edges_v[-1]])
    return free_cells.g.cells(lo, hi)


def _quad_at(cells, a_grid: np.ndarray, sigma2: float) -> np.ndarray:
    """Deviance (-2 log profile likelihood) per (A, cell): the cell's best plus ((A - R0hat - mean) / sd)^2."""
    _, quad, _, mean, sd, _ = cells.solve(sigma2)
    gain = a_grid - cells.g.R0
    sd = np.maximum(sd, 1e-300)
    return quad[None] + ((gain[:, None, None] - mean[None]) / sd[None]) ** 2


def _profile(cells, a_grid: np.ndarray, sigma2: float) -> np.ndarray:
    return _quad_at(cells, a_grid, sigma2).min(axis=(1, 2))


def _joint_interval(cells, a_grid, sigma2, others: np.ndarray, axis: int) -> tuple[float, float]:
    """Likelihood-ratio interval on log B (axis 0) or log C_mid (axis 1) of one curve in the joint model."""
    q = _quad_at(cells, a_grid, sigma2)  # (A, u, v)
    prof = q.min(axis=2 - axis) + others[:, None]  # (A, u) or (A, v)
    return deviance_interval(cells, prof.min(axis=0), axis)
