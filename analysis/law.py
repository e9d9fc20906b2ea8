"""The sigmoid compute law (ScaleRL, arXiv 2510.13786, Eq. 1) and what every fitter shares.

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

R: validation pass rate; C: training compute in GPU-hours; A: the ceiling; B > 0: the steepness; C_mid: the compute
at half of the gain A - R0. This module owns the law (`sigmoid_law`), the fit record (`SigmoidFit`, `FitError`), the
constants of the method (interval level, c_min, the search box) and the checked input (`prepare` -> `Prepared`).
It imports no other module of analysis/. The method and its departures from the paper: docs/fitting.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

CI_LEVEL = 0.90
MIN_POINTS = 5  # three parameters and a noise estimate
C_MIN_FRACTION = 1.5 / 16  # the paper excludes its first 1.5k of 16k GPU-hours
# Search box, also the support of the flat priors. A fit ending on a bound, or an interval reaching one, is open
# (docs/fitting.md#the-intervals).
B_BOUNDS = (0.1, 20.0)
C_MID_SPAN = 1e3  # C_mid within [max C / 1e3, max C * 1e3]
FALLING_T = -3.0  # a linear trend of R in log C with t below this is a falling curve
DIVERGED_DROP = 0.05  # a fall of this much below the curve's peak, held to the end, is a divergence
PARAMS = ("A", "B", "C_mid")


class FitError(ValueError):
    """The data cannot be fitted; `reason` is a short human-readable sentence (recorded as the fit status)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def fmt_compute(x: float) -> str:
    """Compute (GPU-hours) for people: thousands separated from 100 up ("2,542"), three significant digits below
    ("0.00512", "12.3"), so that a tiny run's compute does not print as 0."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def sigmoid_law(compute, A: float, B: float, C_mid: float, R0: float) -> np.ndarray:
    """Eq. 1, written as R0 + (A - R0) * expit(B * (log C - log C_mid)) so that C = 0 gives R0 without warnings."""
    from scipy.special import expit

    c = np.asarray(compute, dtype=float)
    with np.errstate(divide="ignore"):
        log_c = np.log(c)
    return R0 + (A - R0) * expit(B * (log_c - math.log(C_mid)))


def _nan_ci() -> dict[str, tuple[float, float]]:
    return {name: (math.nan, math.nan) for name in PARAMS}


@dataclass(frozen=True)
class SigmoidFit:
    """A fit of Eq. 1. `ci` maps "A", "B", "C_mid" to 90% intervals (low, high); a side the data do not bound is
    open: 0 or inf for B and C_mid, 1 for A (its upper limit). `status` is "ok" or the reason the fit failed;
    `notes` are warnings on an ok fit. `draws` (posterior samples of A, B, C_mid, R0) give `predict_interval`."""

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
    method: str = "fast"  # fast | paper | fixed-A
    n_runs: int = 1  # runs (seeds) pooled into this fit
    noise: dict[str, float] = field(default_factory=dict)  # sd_white, sd_wobble, corr_gpu_hours, dof
    draws: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def A_identified(self) -> bool:
        """The data reach the fitted C_mid, where the curve has made half its gain: before it, the ceiling A is an
        extrapolation that B and C_mid can trade against (docs/fitting.md#when-a-is-identified). A fit without a
        fitted range (a synthetic one) counts as identified."""
        return not (math.isfinite(self.c_max) and math.isfinite(self.C_mid)) or self.c_max >= self.C_mid

    def predict(self, compute) -> np.ndarray:
        """R(C) by Eq. 1 with the fitted parameters (NaN for a failed fit)."""
        if not self.ok:
            return np.full(np.shape(compute), math.nan)
        return sigmoid_law(compute, self.A, self.B, self.C_mid, self.R0)

    def predict_draws(self, compute) -> np.ndarray:
        """R(C) for each posterior draw: shape (draws, points); empty when the fit has no draws."""
        c = np.atleast_1d(np.asarray(compute, dtype=float))
        if not self.ok or self.draws is None or not len(self.draws):
            return np.zeros((0, c.size))
        from scipy.special import expit

        A, B, C_mid, R0 = self.draws.T
        with np.errstate(divide="ignore"):
            log_c = np.log(c)[None, :]
        return R0[:, None] + (A - R0)[:, None] * expit(B[:, None] * (log_c - np.log(C_mid)[:, None]))

    def predict_interval(self, compute, level: float = CI_LEVEL) -> tuple[np.ndarray, np.ndarray]:
        """A `level` interval for the law's value R(C) (not for a new noisy point), from the posterior draws."""
        values = self.predict_draws(compute)
        if not len(values):
            nan = np.full(values.shape[1], math.nan)
            return nan, nan.copy()
        tail = (1 - level) / 2
        return np.quantile(values, tail, axis=0), np.quantile(values, 1 - tail, axis=0)

    def to_dict(self) -> dict:
        """JSON-ready: parameters, intervals, status, notes (inf and NaN as strings "inf" / null)."""

        def num(x):
            if x is None or (isinstance(x, float) and math.isnan(x)):
                return None
            if isinstance(x, float) and math.isinf(x):
                return "inf" if x > 0 else "-inf"
            return x

        return {
            "status": self.status,
            "method": self.method,
            **{name: num(float(getattr(self, name))) for name in (*PARAMS, "R0")},
            "ci_level": CI_LEVEL,
            "ci": {name: [num(float(lo)), num(float(hi))] for name, (lo, hi) in self.ci.items()},
            "n_points": self.n_points,
            "n_runs": self.n_runs,
            "r2": num(float(self.r2)),
            "c_min": num(float(self.c_min)),
            "c_max": num(float(self.c_max)),
            "noise": {k: num(float(v)) for k, v in self.noise.items()},
            "notes": list(self.notes),
        }

    @classmethod
    def failed(cls, reason: str, *, R0: float = math.nan, n_points: int = 0, n_runs: int = 1,
               method: str = "fast") -> "SigmoidFit":
        """The record of a fit that could not be made: NaN parameters, the reason as status."""
        return cls(A=math.nan, B=math.nan, C_mid=math.nan, R0=R0, n_points=n_points, status=reason, n_runs=n_runs,
                   method=method)


# --- input preparation and checks ------------------------------------------------------------------------------


@dataclass
class Prepared:
    """The points to fit (compute >= c_min, > 0), sorted by (run, compute), and what R0 rests on."""

    c: np.ndarray
    r: np.ndarray
    runs: np.ndarray  # run label per point (0.. n_runs-1)
    R0: float
    n_r0: int  # pre-RL points R0 was measured from (0 when given)
    c_min: float
    n_runs: int

    @property
    def log_c(self) -> np.ndarray:
        return np.log(self.c)


def prepare(compute, reward, *, r0=None, c_min=None, runs=None) -> Prepared:
    """Check the points, take R0, apply c_min; raise FitError with the reason the data cannot be fitted."""
    c, r = _as_points(compute, reward)
    labels = np.zeros(c.size, dtype=int) if runs is None else np.unique(np.asarray(runs).ravel(),
                                                                        return_inverse=True)[1].ravel()
    if labels.size != c.size:
        raise FitError(f"runs labels and points differ in length ({labels.size} vs {c.size})")
    n_runs = int(labels.max()) + 1 if labels.size else 1
    R0 = _pick_r0(c, r, r0)
    if c_min is None:
        c_min = C_MIN_FRACTION * float(c.max())
    keep = (c >= c_min) & (c > 0)
    order = np.lexsort((c[keep], labels[keep]))
    c_fit, r_fit, lab = c[keep][order], r[keep][order], labels[keep][order]
    _check_fittable(c_fit, r_fit, lab, R0, c_min)
    n_r0 = int((c == 0).sum()) if r0 is None else 0
    return Prepared(c=c_fit, r=r_fit, runs=lab, R0=R0, n_r0=n_r0, c_min=float(c_min), n_runs=n_runs)


def _as_points(compute, reward) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(compute, dtype=float).ravel()
    r = np.asarray(reward, dtype=float).ravel()
    if c.shape != r.shape:
        raise FitError(f"compute and reward differ in length ({c.size} vs {r.size})")
    if c.size == 0:
        raise FitError("too few points: no data")
    bad = ~(np.isfinite(c) & np.isfinite(r))
    if bad.any():
        where = ""
        if np.isfinite(c).all():
            order = np.argsort(c, kind="stable")
            first = int(np.argmax(bad[order]))
            if bad[order][first:].all():
                where = f" from {fmt_compute(c[order][first])} GPU-hours on (diverged?)"
        raise FitError(f"non-finite values: {int(bad.sum())} of {c.size} points have NaN or inf{where}")
    if (c < 0).any():
        raise FitError("negative compute values")
    if ((r < 0) | (r > 1)).any():
        raise FitError("pass rates outside [0, 1]")
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


def _check_fittable(c: np.ndarray, r: np.ndarray, runs: np.ndarray, R0: float, c_min: float) -> None:
    """Reject what Eq. 1 cannot describe: too few points, a flat, falling or diverged curve, no gain."""
    if c.size < MIN_POINTS:
        raise FitError(f"too few points: {c.size} at compute >= c_min={fmt_compute(c_min)} (need {MIN_POINTS}); "
                       f"c_min defaults to {C_MIN_FRACTION:.4g} (1.5/16) of the largest compute, the paper's cut: "
                       "set c_min lower (c_min=0 keeps every point after compute 0)")
    if np.ptp(np.append(r, R0)) < 1e-9:
        raise FitError(f"flat curve: pass rate constant at {R0:.4g}, nothing to fit")
    for run in np.unique(runs):
        diverged = _divergence(c[runs == run], r[runs == run], R0)
        if diverged:
            raise FitError(diverged)
    t = _log_trend_t(c, r)
    if t < FALLING_T:
        raise FitError(f"falling curve: pass rate decreases with compute (trend in log C, t = {t:.3g})")
    if r.mean() <= R0:
        raise FitError(f"no gain: mean pass rate {r.mean():.4g} over the fitted points is not above R0 = {R0:.4g}")


def _divergence(c: np.ndarray, r: np.ndarray, R0: float) -> str | None:
    """A collapse the law cannot describe: the curve rose, then its last points (two or more) all lie far below
    its peak. The peak is taken on a 3-point running median (one noisy point is no peak); "far" is DIVERGED_DROP
    or ten times the point-to-point noise, whichever is larger; "rose": the peak is that far above R0 too."""
    if c.size < 6:
        return None
    padded = np.concatenate([r[:1], r, r[-1:]])
    smooth = np.median(np.lib.stride_tricks.sliding_window_view(padded, 3), axis=1)
    noise = 1.4826 * float(np.median(np.abs(np.diff(r) - np.median(np.diff(r))))) / math.sqrt(2)
    drop = max(DIVERGED_DROP, 10 * noise)
    peak = int(np.argmax(smooth))
    if smooth[peak] < R0 + drop:
        return None
    below = r < smooth[peak] - drop
    tail = 0
    for flag in below[::-1]:
        if not flag:
            break
        tail += 1
    if tail < 2 or r.size - tail <= peak:
        return None
    start = r.size - tail
    return (f"diverged: pass rate fell from {smooth[peak]:.3f} (at {fmt_compute(c[peak])} GPU-hours) to "
            f"{r[-1]:.3f}, below the peak by more than {drop:.3f} from {fmt_compute(c[start])} GPU-hours to the end")


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
