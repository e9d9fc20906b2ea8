"""Extrapolation checks: fit on the early part of a run, predict its end; a power law beside the sigmoid.

`extrapolation_check` fits the sigmoid (and a power law, R(C) = A - D / C^B, `fit_power_law`) on compute <=
fraction x the run's final compute, with the same c_min as a fit of the whole run, and compares the predictions
over the end with what was observed there. Its interval (`predicted_end`) is a prediction of what will be observed:
the law's uncertainty centred on the printed estimate plus the noise of a mean over the end's points. Why:
docs/fitting.md#the-extrapolation-check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from analysis.fit import fit_sigmoid
from analysis.information import noise_covariance
from analysis.law import C_MIN_FRACTION, CI_LEVEL, FitError, SigmoidFit

END_FRACTION = 0.05  # "the end": the points in the last 5% of the run's compute (at least the last point)
# Real runs drift off their law late in training more than their first half shows: per doubling of compute beyond
# the fitted data, a prediction is off by this much more (an sd, in pass rate). Measured on the project's public
# runs, the hold-out apart (analysis/data/real_curves/; docs/fitting.md#the-extrapolation-check).
DRIFT = 0.015


@dataclass(frozen=True)
class PowerLawFit:
    """R(C) = A - D / C^B, fitted by least squares with A <= 1 (the ceiling a pass rate can have)."""

    A: float
    D: float
    B: float
    status: str = "ok"
    n_points: int = 0
    c_min: float = math.nan
    c_max: float = math.nan

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def predict(self, compute) -> np.ndarray:
        c = np.asarray(compute, dtype=float)
        if not self.ok:
            return np.full(c.shape, math.nan)
        with np.errstate(divide="ignore", over="ignore"):
            return self.A - self.D * np.power(c, -self.B)


def fit_power_law(compute, reward, *, c_min: float | None = None) -> PowerLawFit:
    """Least squares of R = A - D C^-B over B (a log grid, then a bounded scalar search), A and D in closed form
    for each B (A held at 1 when the free fit would pass it). Points at compute 0 and below c_min are left out."""
    from scipy.optimize import minimize_scalar

    c = np.asarray(compute, dtype=float).ravel()
    r = np.asarray(reward, dtype=float).ravel()
    if c_min is None:
        c_min = C_MIN_FRACTION * float(c.max()) if c.size else 0.0
    keep = (c >= c_min) & (c > 0) & np.isfinite(c) & np.isfinite(r)
    c, r = c[keep], r[keep]
    if c.size < 4:
        return PowerLawFit(math.nan, math.nan, math.nan, status=f"too few points: {c.size}", n_points=int(c.size))
    scale = float(c.max())
    x_log = np.log(c / scale)

    def solve(log_b: float) -> tuple[float, float, float]:
        x = np.exp(-math.exp(log_b) * x_log)  # (C / scale)^-B, so D is in units of scale^B
        design = np.column_stack([np.ones_like(x), -x])
        (A, D), *_ = np.linalg.lstsq(design, r, rcond=None)
        if A > 1.0:
            A = 1.0
            D = float(x @ (1.0 - r)) / float(x @ x)
        D = max(D, 0.0)
        return float(((A - D * x - r) ** 2).sum()), float(A), float(D)

    grid = np.linspace(math.log(1e-3), math.log(5.0), 60)
    sse = [solve(g)[0] for g in grid]
    k = int(np.argmin(sse))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    best = minimize_scalar(lambda g: solve(g)[0], bounds=(lo, hi), method="bounded",
                           options={"xatol": 1e-6}) if hi > lo else None
    log_b = float(best.x) if best is not None and best.fun <= sse[k] else float(grid[k])
    _, A, D = solve(log_b)
    B = math.exp(log_b)
    return PowerLawFit(A=A, D=D * scale**B, B=B, n_points=int(c.size), c_min=float(c_min), c_max=scale)


@dataclass(frozen=True)
class Extrapolation:
    """Fit on compute <= c_fit, predict the mean pass rate over the end (compute >= c_end_from)."""

    fraction: float
    c_fit: float  # the last compute fitted
    c_end: float  # the run's final compute
    observed: float  # mean observed pass rate over the end
    status: str = "ok"
    sigmoid: SigmoidFit | None = None
    predicted: float = math.nan  # the sigmoid's prediction over the end
    predicted_ci: tuple[float, float] = (math.nan, math.nan)
    power: PowerLawFit | None = None
    power_predicted: float = math.nan
    end_compute: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def covered(self) -> bool:
        """The observed end lies inside the prediction's interval."""
        return self.predicted_ci[0] <= self.observed <= self.predicted_ci[1]

    @property
    def error(self) -> float:
        """Predicted minus observed, for the sigmoid."""
        return self.predicted - self.observed

    @property
    def power_error(self) -> float:
        return self.power_predicted - self.observed


def extrapolation_check(
    compute, reward, *, fraction: float = 0.5, r0: float | None = None, c_min: float | None = None, runs=None
) -> Extrapolation:
    """Fit the sigmoid (and a power law) on compute <= fraction * final compute, predict the end of the run.

    c_min defaults to that of a fit of the whole run (1.5/16 of the final compute), as in the paper's check
    (fit 1.5k-8k GPU-hours, predict 16k). Never raises on bad data: the status says why there is no check."""
    c = np.asarray(compute, dtype=float).ravel()
    r = np.asarray(reward, dtype=float).ravel()
    labels = None if runs is None else np.asarray(runs).ravel()
    finite = np.isfinite(c) & np.isfinite(r)
    if not finite.any() or c.size != r.size:
        return Extrapolation(fraction, math.nan, math.nan, math.nan, status="no finite points")
    c_end = float(c[finite].max())
    c_fit = fraction * c_end
    if c_min is None:
        c_min = C_MIN_FRACTION * c_end
    end = finite & (c >= (1 - END_FRACTION) * c_end)
    if not end.any() or c_fit <= c_min:
        return Extrapolation(fraction, c_fit, c_end, math.nan, status="nothing to extrapolate to")
    observed = float(r[end].mean())
    early = c <= c_fit
    try:
        fit = fit_sigmoid(c[early], r[early], r0=r0, c_min=c_min, runs=None if labels is None else labels[early])
    except FitError as err:
        return Extrapolation(fraction, c_fit, c_end, observed, status=f"early fit failed: {err.reason}")
    end_c = c[end]
    predicted, (lo, hi) = predicted_end(fit, end_c, None if labels is None else labels[end])
    power = fit_power_law(c[early], r[early], c_min=c_min)
    return Extrapolation(
        fraction=fraction,
        c_fit=c_fit,
        c_end=c_end,
        observed=observed,
        sigmoid=fit,
        predicted=predicted,
        predicted_ci=(lo, hi),
        power=power,
        power_predicted=float(power.predict(end_c).mean()) if power.ok else math.nan,
        end_compute=end_c,
    )


def predicted_end(fit: SigmoidFit, compute: np.ndarray, runs=None, level: float = CI_LEVEL, *,
                  drift: float = DRIFT) -> tuple[float, tuple[float, float]]:
    """The fit's prediction of the mean pass rate that will be observed at `compute` (one run's points, or several
    runs' labelled by `runs`) and its `level` interval: the predictive distribution of that mean, the law's posterior
    draws of it, each with the noise of a mean over those points under the fit's noise model (white noise, the
    wobble and the slow departures; a run's points correlated, runs independent) and the drift beyond the fitted
    data (`drift` per doubling of compute past the fit's last point) -- a mixture of normals. The
    prediction is its median, the interval its quantiles (NaN without draws): the median, not the law at the point
    estimate, whose Firth correction pulls a loosely pinned A down and the prediction with it
    (docs/fitting.md#the-extrapolation-check)."""
    from scipy.optimize import brentq
    from scipy.special import ndtr

    compute = np.asarray(compute, dtype=float)
    draws = fit.predict_draws(compute).mean(axis=1)
    if not draws.size:
        return math.nan, (math.nan, math.nan)
    labels = np.zeros(compute.size, dtype=int) if runs is None else np.asarray(runs)
    total = sum(float(noise_covariance(compute[labels == k], fit.noise).sum()) for k in np.unique(labels))
    beyond = np.log2(np.maximum(compute, fit.c_max) / fit.c_max) if math.isfinite(fit.c_max) else 0.0
    sd = math.hypot(math.sqrt(max(total, 0.0)) / compute.size, drift * float(np.mean(beyond)))
    levels = ((1 - level) / 2, 0.5, (1 + level) / 2)
    if sd <= 0:
        lo, mid, hi = (float(x) for x in np.quantile(draws, levels))
        return mid, (lo, hi)

    def below(x: float, p: float) -> float:
        return float(ndtr((x - draws) / sd).mean()) - p

    low, high = float(draws.min()) - 10 * sd, float(draws.max()) + 10 * sd
    lo, mid, hi = (brentq(below, low, high, args=(p,), xtol=1e-7) for p in levels)
    return mid, (lo, hi)
