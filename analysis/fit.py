"""The sigmoid compute law of ScaleRL and a first fitter for it.

Source: "The Art of Scaling Reinforcement Learning Compute for LLMs" (arXiv 2510.13786), Eq. 1:

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

R is the validation pass rate, C the training compute in GPU-hours, A the asymptotic pass rate (the ceiling),
B > 0 the compute efficiency (steepness), C_mid the compute at which half of the gain A - R0 is reached.

How this fitter departs from the paper (shared/notes/scalerl-facts.md):
- R0 is not fitted (the paper does not say how it sets R0): it is the pre-RL pass rate, the point at C == 0.
- The paper grids A (step 0.005) and C_mid (100 values) and fits B with curve_fit for each pair. Here A, log B and
  log C_mid are fitted together by bounded least squares (scipy.optimize.least_squares), started from the best
  few points of a coarse grid over (B, C_mid) in which A is solved in closed form (the law is linear in A).
- The paper reports no intervals. Here 90% intervals come from the Jacobian covariance scaled by the residual
  variance, with Student-t quantiles; B and C_mid are fitted, and their intervals built, in log space. This is a
  first version: a later fitter may add the paper's grid procedure and bootstrap intervals behind the same
  `fit_sigmoid` signature (new keyword arguments, same `SigmoidFit`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

CI_LEVEL = 0.90
MIN_POINTS = 4
C_MIN_FRACTION = 1.5 / 16  # the paper excludes its first 1.5k of 16k GPU-hours
# Search box for the non-identified cases; a fit that ends on one of these bounds gets an open interval.
B_BOUNDS = (1e-2, 1e2)
C_MID_SPAN = 1e4  # C_mid within [max C / 1e4, max C * 1e4]
FALLING_T = -3.0  # a linear trend of R in log C with t below this is a falling curve


class FitError(ValueError):
    """The data cannot be fitted; `reason` is a short human-readable sentence (recorded as the fit status)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def sigmoid_law(compute, A: float, B: float, C_mid: float, R0: float) -> np.ndarray:
    """Eq. 1, written as R0 + (A - R0) * expit(B * (log C - log C_mid)) so that C = 0 gives R0 without warnings."""
    from scipy.special import expit

    c = np.asarray(compute, dtype=float)
    with np.errstate(divide="ignore"):
        log_c = np.log(c)
    return R0 + (A - R0) * expit(B * (log_c - math.log(C_mid)))


def _nan_ci() -> dict[str, tuple[float, float]]:
    return {name: (math.nan, math.nan) for name in ("A", "B", "C_mid")}


@dataclass(frozen=True)
class SigmoidFit:
    """A fit of Eq. 1. `ci` maps "A", "B", "C_mid" to 90% intervals (low, high); an unidentified side is
    infinite (B, C_mid) or clipped to [R0, 1] (A). `status` is "ok" or the reason the fit failed; `notes` are
    warnings on an ok fit (a parameter on its bound, data that stop before C_mid)."""

    A: float
    B: float
    C_mid: float
    R0: float
    ci: dict[str, tuple[float, float]] = field(default_factory=_nan_ci)
    n_points: int = 0
    r2: float = math.nan
    status: str = "ok"
    c_min: float = math.nan  # points with C < c_min were left out of the fit
    c_max: float = math.nan  # the largest compute fitted
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def predict(self, compute) -> np.ndarray:
        """R(C) by Eq. 1 with the fitted parameters (NaN for a failed fit)."""
        if not self.ok:
            return np.full(np.shape(compute), math.nan)
        return sigmoid_law(compute, self.A, self.B, self.C_mid, self.R0)

    @classmethod
    def failed(cls, reason: str, *, R0: float = math.nan, n_points: int = 0) -> "SigmoidFit":
        """The record of a fit that could not be made: NaN parameters, the reason as status."""
        return cls(A=math.nan, B=math.nan, C_mid=math.nan, R0=R0, n_points=n_points, status=reason)


def fit_sigmoid(compute, reward, *, r0: float | None = None, c_min: float | None = None) -> SigmoidFit:
    """Fit Eq. 1 to (compute, reward) points; raise FitError(reason) when the data cannot be fitted.

    r0: the pre-RL pass rate; when None, the mean reward of the points at compute == 0 (an error if there are none).
    c_min: points with compute < c_min are left out; when None, (1.5/16) * max(compute) as in the paper.
    Points at compute == 0 are never fitted (they define R0). A is bounded to [R0, 1], B and C_mid to a wide box.
    """
    c, r = _as_points(compute, reward)
    R0 = _pick_r0(c, r, r0)
    if c_min is None:
        c_min = C_MIN_FRACTION * float(c.max())
    keep = (c >= c_min) & (c > 0)
    c_fit, r_fit = c[keep], r[keep]
    _check_fittable(c_fit, r_fit, R0, c_min)

    log_c = np.log(c_fit)
    bounds = _bounds(R0, c_fit)
    best = None
    for x0 in _starting_points(log_c, r_fit, R0, bounds):
        result = _refine(x0, log_c, r_fit, R0, bounds)
        if result.status > 0 and (best is None or result.cost < best.cost):
            best = result
    if best is None:
        raise FitError("the least-squares optimizer did not converge from any starting point")

    A, log_b, log_cmid = (float(v) for v in best.x)
    residuals = best.fun
    ss_res = float(residuals @ residuals)
    ss_tot = float(((r_fit - r_fit.mean()) ** 2).sum())
    at_bound = _at_bound(best.x, bounds)
    # R0 measured at C = 0 is as noisy as any other point: its variance, s^2 / n0, widens the intervals too.
    n_r0 = int((c == 0).sum()) if r0 is None else 0
    dres_dr0 = 1.0 - _shape(log_c, log_b, log_cmid)
    ci = _jacobian_intervals(best.x, best.jac, ss_res, len(r_fit), R0, at_bound, dres_dr0, n_r0)
    return SigmoidFit(
        A=A,
        B=math.exp(log_b),
        C_mid=math.exp(log_cmid),
        R0=R0,
        ci=ci,
        n_points=int(len(r_fit)),
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan,
        status="ok",
        c_min=float(c_min),
        c_max=float(c_fit.max()),
        notes=_notes(at_bound, ci, math.exp(log_cmid), float(c_fit.max())),
    )


# --- input checks ---------------------------------------------------------------------------------------------


def _as_points(compute, reward) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(compute, dtype=float).ravel()
    r = np.asarray(reward, dtype=float).ravel()
    if c.shape != r.shape:
        raise FitError(f"compute and reward differ in length ({c.size} vs {r.size})")
    if c.size == 0:
        raise FitError("too few points: no data")
    bad = ~(np.isfinite(c) & np.isfinite(r))
    if bad.any():
        raise FitError(f"non-finite values: {int(bad.sum())} of {c.size} points have NaN or inf")
    if (c < 0).any():
        raise FitError("negative compute values")
    return c, r


def _pick_r0(c: np.ndarray, r: np.ndarray, r0: float | None) -> float:
    if r0 is None:
        at_zero = r[c == 0]
        if at_zero.size == 0:
            raise FitError("no point at compute 0 to take R0 from (log the pre-RL validation or pass r0=)")
        r0 = float(at_zero.mean())
    if not math.isfinite(r0) or not 0.0 <= r0 < 1.0:
        raise FitError(f"R0 = {r0} is outside [0, 1): no room for a gain")
    return float(r0)


def _check_fittable(c: np.ndarray, r: np.ndarray, R0: float, c_min: float) -> None:
    """Reject what Eq. 1 cannot describe: too few points, a flat curve, a curve with no gain or a falling one."""
    if c.size < MIN_POINTS:
        raise FitError(f"too few points: {c.size} at compute >= c_min={c_min:.4g} (need {MIN_POINTS})")
    if np.ptp(np.append(r, R0)) < 1e-9:
        raise FitError(f"flat curve: pass rate constant at {R0:.4g}, nothing to fit")
    t = _log_trend_t(c, r)
    if t < FALLING_T:
        raise FitError(f"falling curve: pass rate decreases with compute (trend in log C, t = {t:.3g})")
    if r.mean() <= R0:
        raise FitError(f"no gain: mean pass rate {r.mean():.4g} over the fitted points is not above R0 = {R0:.4g}")


def _log_trend_t(c: np.ndarray, r: np.ndarray) -> float:
    """t statistic of the slope of r against log c (ordinary least squares)."""
    x = np.log(c) - np.log(c).mean()
    sxx = float(x @ x)
    if sxx == 0:
        return 0.0
    slope = float(x @ (r - r.mean())) / sxx
    resid = r - r.mean() - slope * x
    se = math.sqrt(float(resid @ resid) / max(c.size - 2, 1) / sxx)
    if se == 0:
        return math.copysign(math.inf, slope) if slope else 0.0
    return slope / se


# --- the fit itself: parameters x = (A, log B, log C_mid) -------------------------------------------------------


def _bounds(R0: float, c_fit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    log_cmax = math.log(float(c_fit.max()))
    span = math.log(C_MID_SPAN)
    lower = np.array([R0, math.log(B_BOUNDS[0]), log_cmax - span])
    upper = np.array([1.0, math.log(B_BOUNDS[1]), log_cmax + span])
    return lower, upper


def _shape(log_c: np.ndarray, log_b: float, log_cmid: float) -> np.ndarray:
    from scipy.special import expit

    return expit(math.exp(log_b) * (log_c - log_cmid))


def _starting_points(log_c, r, R0, bounds, keep: int = 3) -> list[np.ndarray]:
    """The best `keep` points of a grid over (log B, log C_mid), with A solved in closed form for each."""
    lower, upper = bounds
    eps = 1e-6 * (upper[0] - lower[0])
    candidates = []
    for log_b in np.linspace(math.log(0.3), math.log(8.0), 10):
        for log_cmid in np.linspace(log_c.min() - math.log(10), log_c.max() + math.log(10), 24):
            s = _shape(log_c, log_b, log_cmid)
            if float(s @ s) == 0.0:
                continue
            gain = float(s @ (r - R0)) / float(s @ s)
            A = float(np.clip(R0 + gain, lower[0] + eps, upper[0] - eps))
            sse = float(((R0 + (A - R0) * s - r) ** 2).sum())
            candidates.append((sse, np.array([A, log_b, log_cmid])))
    candidates.sort(key=lambda pair: pair[0])
    return [x for _, x in candidates[:keep]]


def _refine(x0, log_c, r, R0, bounds):
    from scipy.optimize import least_squares

    def residuals(x):
        return R0 + (x[0] - R0) * _shape(log_c, x[1], x[2]) - r

    def jacobian(x):
        A, log_b, log_cmid = x
        s = _shape(log_c, log_b, log_cmid)
        ds = (A - R0) * s * (1.0 - s)  # d/dz of (A - R0) * expit(z), z = B (log C - log C_mid)
        B = math.exp(log_b)
        return np.column_stack([s, ds * B * (log_c - log_cmid), -ds * B])

    return least_squares(
        residuals, x0, jac=jacobian, bounds=bounds, method="trf", ftol=1e-12, xtol=1e-12, gtol=1e-12, max_nfev=2000
    )


# --- intervals -------------------------------------------------------------------------------------------------


def _at_bound(x: np.ndarray, bounds) -> np.ndarray:
    """Per parameter: -1 on its lower bound, +1 on its upper bound, 0 inside."""
    lower, upper = bounds
    tol = 1e-6 * (upper - lower)
    return np.where(x - lower <= tol, -1, np.where(upper - x <= tol, 1, 0))


def _jacobian_intervals(x, jac, ss_res, n, R0, at_bound, dres_dr0, n_r0) -> dict[str, tuple[float, float]]:
    """90% intervals x_i +- t * se_i with cov = s^2 (J^T J)^-1, s^2 = SS_res / (n - 3).

    When R0 was measured (n_r0 points at C = 0), its error is propagated to first order: the parameters move by
    g = -(J^T J)^-1 J^T dres/dR0 per unit of R0, and s^2 / n_r0 * g g^T is added to cov.
    A parameter along a (near-)null direction of J gets an unbounded interval, as does the side of a parameter that
    sits on its bound (the data do not confine it there). log B and log C_mid intervals are exponentiated."""
    from scipy.stats import t as student_t

    dof = n - len(x)
    half = np.full(len(x), math.inf)
    if dof > 0:
        _, sing, vt = np.linalg.svd(np.asarray(jac, dtype=float), full_matrices=False)
        null = sing <= sing.max() * 1e-8 if sing.max() > 0 else np.ones_like(sing, dtype=bool)
        inv_sq = np.where(null, 0.0, 1.0 / np.where(null, 1.0, sing) ** 2)
        jtj_inv = (vt.T * inv_sq) @ vt  # pseudo-inverse of J^T J
        s2 = ss_res / dof
        cov = jtj_inv * s2
        if n_r0:
            g = -jtj_inv @ (np.asarray(jac, dtype=float).T @ dres_dr0)
            cov = cov + np.outer(g, g) * (s2 / n_r0)
        unidentified = (np.abs(vt[null]) > 1e-3).any(axis=0)
        se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        half = np.where(unidentified, math.inf, student_t.ppf(0.5 + CI_LEVEL / 2, dof) * se)

    low, high = x - half, x + half
    low = np.where(at_bound < 0, -math.inf, low)
    high = np.where(at_bound > 0, math.inf, high)
    A_lo, A_hi = (float(np.clip(v, R0, 1.0)) for v in (low[0], high[0]))
    with np.errstate(over="ignore"):
        return {
            "A": (A_lo, A_hi),
            "B": (float(np.exp(low[1])), float(np.exp(high[1]))),
            "C_mid": (float(np.exp(low[2])), float(np.exp(high[2]))),
        }


def _notes(at_bound: np.ndarray, ci: dict, C_mid: float, c_max: float) -> tuple[str, ...]:
    """Warnings on an ok fit: parameters on their bounds or without a finite interval, extrapolated A."""
    notes = []
    for name, side in zip(("A", "B", "C_mid"), at_bound):
        if side:
            notes.append(f"{name} on its {'upper' if side > 0 else 'lower'} bound")
    for name in ("B", "C_mid"):
        if not all(0 < v < math.inf for v in ci[name]):
            notes.append(f"{name} not pinned down by the data (open interval)")
    if c_max < C_mid:
        notes.append("data stop before C_mid: A is extrapolated")
    return tuple(notes)
