"""The fast fit of Eq. 1 and its 90% intervals (`fit_prepared`, `fit_state`).

Least squares started from a coarse grid, with dips pulled in (`_pull_in_outliers`); each parameter's noise
variance from the noise model (analysis/noise.py); likelihood-ratio intervals and posterior draws on a grid of
(log B, log C_mid) on which A and R0 are exact Gaussian algebra (`Grid`, `Cells`); then the reported point estimate
(analysis/point.py). `FitState` keeps the grid for the joint refit (analysis/joint.py). The method and why:
docs/fitting.md#the-intervals, docs/fitting.md#the-noise-model, docs/fitting.md#dips.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from analysis import noise as noise_model
from analysis import point
from analysis.law import B_BOUNDS, C_MID_SPAN, CI_LEVEL, FitError, Prepared, SigmoidFit, sigmoid_law

GRID = 41  # cells per axis of the posterior grid
N_DRAWS = 1000
OUTLIER_SD = 3.0  # points further off the curve than this many robust sd are pulled in (_pull_in_outliers)
OUTLIER_FLOOR = 1e-3  # the smallest robust sd: below it a curve is as good as noiseless
OUTLIER_MIN_POINTS = 8  # fewer points give no robust scale worth the name
OUTLIER_ROUNDS = 4
SIGNIFICANT = 8.0  # cells within this many log-units of the best carry mass worth resolving (the LR cut is 1.35)


def fit_prepared(data: Prepared, *, A_fixed: float | None = None, rng_seed: int = 0) -> SigmoidFit:
    """The fit and its intervals for prepared points (analysis.law.prepare); A_fixed: refit with A held there."""
    return fit_state(data, A_fixed=A_fixed, rng_seed=rng_seed).fit


@dataclass
class FitState:
    """A fit with what it was made of: the posterior grid and each parameter's noise variance (for joint fits)."""

    fit: SigmoidFit
    cells: "Cells"
    sigma2: dict[str, float]
    data: Prepared | None = None


def fit_state(data: Prepared, *, A_fixed: float | None = None, rng_seed: int = 0, _start=None) -> FitState:
    log_c, R0 = data.log_c, data.R0
    if A_fixed is not None and not R0 < A_fixed <= 1.0:
        raise FitError(f"fixed A = {A_fixed} must lie in (R0 = {R0:.4g}, 1]")
    box = _prior_box(data.c)
    # the points the fit sees from here on (dips pulled in), and their least-squares fit
    r, pulled, (x, jac, resid) = _pull_in_outliers(log_c, data.r, R0, box, A_fixed, _start)
    free = ("A", "B", "C_mid") if A_fixed is None else ("B", "C_mid")
    effect = noise_model.estimate(data.c, data.runs, resid, jac, CI_LEVEL)
    noise = effect.noise
    # each parameter's likelihood is tempered to the noise scale that gives it its interval variance
    fallback = noise.var * r.size / max(noise.n_eff, 1.0)
    sigma2 = {}
    # pulled-in points carry no information beyond their bound: the variance of a Huber estimate, E[psi^2] / E[psi']^2,
    # is the winsorized residuals' (what the noise model saw) over the squared share of points left as they were
    inflate = (r.size / (r.size - pulled)) ** 2
    for i, name in enumerate(free):
        naive = effect.naive[i, i]
        ratio = effect.variance[i] / naive if naive > 0 and math.isfinite(naive) else fallback
        sigma2[name] = max(float(ratio) * inflate, noise_model.MIN_SD**2)
    tau2 = noise.fast.var / data.n_r0 if data.n_r0 else 0.0  # a pre-RL point has no departure from the law

    widest = max(sigma2.values())
    # the box starts at the least-squares fit, +-7 sd of the widest likelihood's normal approximation: usually one
    # grid evaluation
    sd = np.sqrt(np.clip(np.diag(effect.naive)[-2:] * widest, 0.0, None))
    cells = Grid(log_c, r, R0, tau2, A_fixed, box).explore(float(x[-2]), float(x[-1]), sd[0], sd[1], widest)
    if _start is None:
        # a safety net: the grid sees the whole plausible region; if it holds a clearly better fit than the
        # optimizer's (a local minimum), start again from there
        better = cells.best_start(float(resid @ resid))
        if better is not None:
            return fit_state(data, A_fixed=A_fixed, rng_seed=rng_seed, _start=better)
    lo_b, hi_b = cells.profile_interval(sigma2["B"], axis=0)
    lo_c, hi_c = cells.profile_interval(sigma2["C_mid"], axis=1)
    ci = {
        "A": cells.profile_a(sigma2["A"]) if A_fixed is None else (float(A_fixed), float(A_fixed)),
        "B": (math.exp(lo_b), math.exp(hi_b)),
        "C_mid": (math.exp(lo_c), math.exp(hi_c)),
    }
    draws = cells.draws(widest, N_DRAWS, np.random.default_rng(rng_seed))

    # the point estimate: GLS under the noise model, with Firth's bias reduction (analysis/point.py)
    lower, upper = _bounds(R0, box, A_fixed)
    best = point.refine(data.c, log_c, r, data.runs, R0, noise, x, lower, upper, A_fixed, r0_sd=math.sqrt(tau2))
    if tau2 > 0:
        R0, best = float(best[-1]), best[:-1]
    A_hat = float(best[0]) if A_fixed is None else float(A_fixed)
    u_hat, v_hat = float(best[-2]), float(best[-1])
    B, C_mid = math.exp(u_hat), math.exp(v_hat)
    resid = sigmoid_law(data.c, A_hat, B, C_mid, R0) - data.r
    ss_res = float(resid @ resid)
    ss_tot = float(((data.r - data.r.mean()) ** 2).sum())
    at_bound = _at_bound(A_hat, u_hat, v_hat, R0, box, A_fixed)
    fit = SigmoidFit(
        A=A_hat,
        B=B,
        C_mid=C_mid,
        R0=R0,
        ci=ci,
        n_points=int(r.size),
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan,
        status="ok",
        c_min=data.c_min,
        c_max=float(data.c.max()),
        notes=_notes(at_bound, ci, C_mid, float(data.c.max()), A_fixed, pulled),
        method="fast" if A_fixed is None else "fixed-A",
        n_runs=data.n_runs,
        noise=noise.as_dict(),
        draws=draws,
    )
    return FitState(fit=fit, cells=cells, sigma2=sigma2, data=data)


def _bounds(R0: float, box, A_fixed) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of the least-squares parameters: (A, log B, log C_mid) with A in [R0, 1], or (log B, log C_mid)."""
    lower, upper = box
    if A_fixed is None:
        return np.array([R0, lower[0], lower[1]]), np.array([1.0, upper[0], upper[1]])
    return lower.copy(), upper.copy()


def _prior_box(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of (log B, log C_mid): the search box and the support of the flat priors."""
    log_cmax = math.log(float(c.max()))
    span = math.log(C_MID_SPAN)
    return (np.array([math.log(B_BOUNDS[0]), log_cmax - span]), np.array([math.log(B_BOUNDS[1]), log_cmax + span]))


# --- least squares ---------------------------------------------------------------------------------------------


def _shape_matrix(u: np.ndarray, v: np.ndarray, log_c: np.ndarray) -> np.ndarray:
    """s[i, j, k] = expit(B_i (log c_k - log C_mid_j)) for B_i = exp(u_i), as 1 / (1 + exp(B_i (v_j - log c_k)))."""
    z = np.exp(u)[:, None, None] * (v[None, :, None] - log_c[None, None, :])
    np.clip(z, -700.0, 700.0, out=z)
    np.exp(z, out=z)
    z += 1.0
    np.reciprocal(z, out=z)
    return z


def _least_squares(log_c, r, R0, box, A_fixed, start=None):
    """Least squares for (A, log B, log C_mid), or (log B, log C_mid) with A fixed, started from the best cell of a
    coarse grid on which A is solved in closed form (or from `start`). Returns (x, jacobian, residuals)."""
    lower, upper = box
    u = np.linspace(math.log(0.3), math.log(8.0), 12)
    v = np.linspace(max(log_c.min() - math.log(10), lower[1]), min(log_c.max() + math.log(30), upper[1]), 30)
    s = _shape_matrix(u, v, log_c)
    y = r - R0
    sy, ss = s @ y, (s * s).sum(-1)
    if A_fixed is None:
        gain = np.clip(sy / np.where(ss > 0, ss, 1.0), 1e-6, 1.0 - R0 - 1e-6)
    else:
        gain = np.full(sy.shape, A_fixed - R0)
    sse = float(y @ y) - 2 * gain * sy + gain * gain * ss
    i, j = np.unravel_index(int(np.argmin(sse)), sse.shape)

    x0 = np.array([R0 + gain[i, j], u[i], v[j]]) if A_fixed is None else np.array([u[i], v[j]])
    lo, hi = _bounds(R0, box, A_fixed)
    if start is not None:
        x0 = np.asarray(start if A_fixed is None else start[1:], dtype=float)
    x, jac, resid = point.least_squares(log_c, r, R0, x0, lo, hi, A_fixed)
    if not np.isfinite(x).all():
        raise FitError("the least-squares optimizer did not converge")
    return x, jac, resid


def _pull_in_outliers(log_c, r, R0, box, A_fixed, start) -> tuple[np.ndarray, int, tuple]:
    """Huber's pseudo-observations: a point further than OUTLIER_SD robust sd from the least-squares curve is moved
    to that distance from it, and the fit is made again, until the pulled points settle (at most OUTLIER_ROUNDS).
    The robust sd is the residuals' median absolute deviation x 1.4826, floored at OUTLIER_FLOOR. Why:
    docs/fitting.md#dips. Returns the points to fit, how many were pulled in, and their least-squares fit."""
    fit = _least_squares(log_c, r, R0, box, A_fixed, start=start)
    if r.size < OUTLIER_MIN_POINTS:
        return r, 0, fit
    pulled_r, pulled = r, 0
    for _ in range(OUTLIER_ROUNDS):
        curve = pulled_r + fit[2]  # residuals are model - data
        e = r - curve
        sd = max(1.4826 * float(np.median(np.abs(e - np.median(e)))), OUTLIER_FLOOR)
        bound = OUTLIER_SD * sd
        far = np.abs(e) > bound
        new_r = np.where(far, curve + np.clip(e, -bound, bound), r)
        if int(far.sum()) == pulled and np.allclose(new_r, pulled_r, rtol=0, atol=1e-3 * sd):
            break
        pulled_r, pulled = new_r, int(far.sum())
        fit = _least_squares(log_c, pulled_r, R0, box, A_fixed, start=start)
    return pulled_r, pulled, fit


def _at_bound(A, u, v, R0, box, A_fixed) -> dict[str, int]:
    """Per parameter: -1 on its lower bound, +1 on its upper bound, 0 inside."""
    lower, upper = box
    out = {}
    for name, x, lo, hi in (("A", A, R0, 1.0), ("B", u, lower[0], upper[0]), ("C_mid", v, lower[1], upper[1])):
        if name == "A" and A_fixed is not None:
            continue
        tol = 1e-6 * (hi - lo)
        out[name] = -1 if x - lo <= tol else (1 if hi - x <= tol else 0)
    return out


def _notes(at_bound: dict, ci: dict, C_mid: float, c_max: float, A_fixed, pulled: int = 0) -> tuple[str, ...]:
    notes = []
    if pulled:
        notes.append(f"{pulled} point{'s' if pulled > 1 else ''} more than {OUTLIER_SD:g} robust sd off the curve "
                     f"(a dip or a spike) pulled in to {OUTLIER_SD:g} sd")
    if A_fixed is not None:
        notes.append(f"A fixed at {A_fixed:.4g}")
    for name, side in at_bound.items():
        if side:
            notes.append(f"{name} on its {'upper' if side > 0 else 'lower'} bound")
    if A_fixed is None and ci["A"][1] >= 1.0:
        notes.append("A not bounded by the data (interval open up to 1)")
    for name in ("B", "C_mid"):
        lo, hi = ci[name]
        if not (lo > 0 and math.isfinite(hi)):
            notes.append(f"{name} not pinned down by the data (open interval)")
    if c_max < C_mid:
        notes.append("data stop before C_mid: A is extrapolated")
    return tuple(notes)


# --- the posterior grid ----------------------------------------------------------------------------------------


class Grid:
    """Evaluates the (log B, log C_mid) posterior with A and R0 integrated out, on boxes chosen by `explore`."""

    def __init__(self, log_c, r, R0, tau2, A_fixed, box):
        self.log_c, self.R0, self.tau2, self.A_fixed, self.box = log_c, R0, tau2, A_fixed, box
        self.y = r - R0  # centred on the measured R0: model y = d (1 - s) + g s, d = R0 - R0hat, g = A - R0hat
        self.n, self.sum_y, self.sum_yy = float(r.size), float(self.y.sum()), float(self.y @ self.y)

    def _sums(self, u, v):
        s = _shape_matrix(u, v, self.log_c)
        return s.sum(-1), (s * s).sum(-1), s @ self.y

    def explore(self, u0, v0, sd_u, sd_v, sigma2) -> "Cells":
        """Centre a box on the fit (7 sd each way, within the priors' support); grow a side while posterior mass
        reaches it, then shrink to the mass for resolution."""
        lower, upper = self.box
        half = np.array([sd_u, sd_v]) * 7.0
        half = np.where(np.isfinite(half) & (half > 0), half, upper - lower)
        half = np.maximum(half, np.array([0.02, 0.02]))
        lo = np.maximum(np.array([u0, v0]) - half, lower)
        hi = np.minimum(np.array([u0, v0]) + half, upper)
        cells = self.cells(lo, hi)
        for _ in range(6):
            mask = cells.logw(sigma2) > cells.logw(sigma2).max() - SIGNIFICANT
            grow = False
            for axis in (0, 1):
                hit = mask.any(axis=1 - axis)
                width = hi[axis] - lo[axis]
                if hit[0] and lo[axis] > lower[axis]:
                    lo[axis], grow = max(lo[axis] - width, lower[axis]), True
                if hit[-1] and hi[axis] < upper[axis]:
                    hi[axis], grow = min(hi[axis] + width, upper[axis]), True
            if not grow:
                break
            cells = self.cells(lo, hi)
        # zoom: the significant region, one cell of margin, when it covers less than a third of an axis
        mask = cells.logw(sigma2) > cells.logw(sigma2).max() - SIGNIFICANT
        new_lo, new_hi = lo.copy(), hi.copy()
        for axis, centres in ((0, cells.u), (1, cells.v)):
            hit = np.flatnonzero(mask.any(axis=1 - axis))
            step = centres[1] - centres[0]
            if (hit[-1] - hit[0] + 1) < GRID / 3:
                new_lo[axis] = max(centres[hit[0]] - 1.5 * step, lo[axis])
                new_hi[axis] = min(centres[hit[-1]] + 1.5 * step, hi[axis])
        if (new_lo != lo).any() or (new_hi != hi).any():
            cells = self.cells(new_lo, new_hi)
        return cells

    def cells(self, lo, hi) -> "Cells":
        edges_u = np.linspace(lo[0], hi[0], GRID + 1)
        edges_v = np.linspace(lo[1], hi[1], GRID + 1)
        u, v = (edges_u[:-1] + edges_u[1:]) / 2, (edges_v[:-1] + edges_v[1:]) / 2
        return Cells(self, u, v, edges_u, edges_v, *self._sums(u, v))


class Cells:
    """One grid: per cell (log B, log C_mid), the sums of the linear problem in (R0, A), solved per noise scale."""

    def __init__(self, grid: Grid, u, v, edges_u, edges_v, s1, s2, sy):
        self.g, self.u, self.v, self.edges_u, self.edges_v = grid, u, v, edges_u, edges_v
        # sums of the design X = [1 - s, s] against itself and against y
        self.a11 = grid.n - 2 * s1 + s2
        self.a12 = s1 - s2
        self.a22 = s2
        self.b1 = grid.sum_y - sy
        self.b2 = sy
        self._cache: dict[float, tuple] = {}

    def solve(self, sigma2: float):
        """Per cell, for noise variance sigma2: quad (-2 log profile likelihood, A and R0 at their best, A not
        held in its bounds), logw (log marginal likelihood, A and R0 integrated over their support), the mean and
        sd of the gain g = A - R0hat, and (var d, cov(d, g), var g, mean d) for draws, d = R0 - R0hat."""
        if sigma2 in self._cache:
            return self._cache[sigma2]
        g, s2 = self.g, sigma2
        zeros = np.zeros_like(self.a22)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if g.A_fixed is None and g.tau2 > 0:
                p11, p12, p22 = self.a11 / s2 + 1 / g.tau2, self.a12 / s2, self.a22 / s2
                det = p11 * p22 - p12 * p12
                q1, q2 = self.b1 / s2, self.b2 / s2
                m1, m2 = (p22 * q1 - p12 * q2) / det, (p11 * q2 - p12 * q1) / det
                quad = g.sum_yy / s2 - (q1 * m1 + q2 * m2)
                log_det = np.log(det)
                mean, sd = m2, np.sqrt(p11 / det)
                cov = (p22 / det, -p12 / det, p11 / det, m1)
            elif g.A_fixed is None:
                prec, q = self.a22 / s2, self.b2 / s2
                mean, sd = q / prec, np.sqrt(1 / prec)
                quad = g.sum_yy / s2 - q * q / prec
                log_det = np.log(prec)
                cov = (zeros, zeros, 1 / prec, zeros)
            else:
                gain = g.A_fixed - g.R0
                resid_ss = g.sum_yy - 2 * gain * self.b2 + gain * gain * self.a22  # sum (y - gain s)^2
                if g.tau2 > 0:
                    prec = self.a11 / s2 + 1 / g.tau2
                    q = (self.b1 - gain * self.a12) / s2
                    quad = resid_ss / s2 - q * q / prec
                    log_det = np.log(prec)
                    cov = (1 / prec, zeros, zeros, q / prec)
                else:
                    quad, log_det = resid_ss / s2, zeros
                    cov = (zeros,) * 4
                mean, sd = np.full(quad.shape, gain), zeros
            logw = -0.5 * quad - 0.5 * log_det
            if g.A_fixed is None:
                from scipy.special import ndtr

                top = 1.0 - g.R0
                mass = ndtr((top - mean) / sd) - ndtr(-mean / sd)
                logw = logw + np.log(np.clip(mass, 1e-300, None))
                # the best A within [R0, 1]: the profile's own value there
                clipped = np.clip(mean, 0.0, top)
                bounded = quad + ((clipped - mean) / sd) ** 2
            else:
                bounded = quad
        logw = np.where(np.isfinite(logw), logw, -np.inf)
        quad = np.where(np.isfinite(quad), quad, np.inf)
        bounded = np.where(np.isfinite(bounded), bounded, np.inf)
        out = (logw, quad, bounded, mean, sd, cov)
        self._cache[sigma2] = out
        return out

    def logw(self, sigma2: float) -> np.ndarray:
        return self.solve(sigma2)[0]

    def best_start(self, sse: float) -> np.ndarray | None:
        """(A, log B, log C_mid) of the cell with the least squared error (R0 held at its measured value), when
        that error beats `sse` by more than a trace; else None."""
        g = self.g
        if g.A_fixed is None:
            gain = np.clip(self.b2 / np.maximum(self.a22, 1e-300), 0.0, 1.0 - g.R0)
        else:
            gain = np.full(self.a22.shape, g.A_fixed - g.R0)
        cell_sse = g.sum_yy - 2 * gain * self.b2 + gain * gain * self.a22
        k = np.unravel_index(int(np.argmin(cell_sse)), cell_sse.shape)
        if cell_sse[k] >= sse * (1 - 1e-3) - 1e-15:
            return None
        return np.array([g.R0 + float(gain[k]), self.u[k[0]], self.v[k[1]]])

    def profile_interval(self, sigma2: float, axis: int) -> tuple[float, float]:
        """Likelihood-ratio interval on log B (axis 0) or log C_mid (axis 1): where the profile deviance (the
        other parameters at their best) stays within the chi-square(1) quantile; an end that reaches the priors'
        bound is open (-inf / inf)."""
        bounded = self.solve(sigma2)[2]
        return deviance_interval(self, bounded.min(axis=1 - axis), axis)

    def profile_a(self, sigma2: float) -> tuple[float, float]:
        """Likelihood-ratio interval on A. Within a cell the deviance is quad + ((A - mean) / sd)^2, so the set
        where the profile stays under the cut is a union of intervals, one per cell: its hull is returned, held
        to [R0, 1]; reaching 1 means the data do not bound A from above."""
        _, quad, bounded, mean, sd, _ = self.solve(sigma2)
        room = chi2_cut() - (quad - bounded.min())
        keep = room >= 0
        reach = sd[keep] * np.sqrt(room[keep])
        top = 1.0 - self.g.R0
        lo = max(float((mean[keep] - reach).min()), 0.0)
        hi = min(float((mean[keep] + reach).max()), top)
        return float(self.g.R0 + lo), (1.0 if hi >= top else float(self.g.R0 + hi))

    def draws(self, sigma2: float, n: int, rng: np.random.Generator) -> np.ndarray:
        """Posterior samples of (A, B, C_mid, R0): a cell by weight, a uniform point in it, then (R0, A) from
        their conditional normal, A clipped to [R0, 1]."""
        logw, _, _, mean, _, cov = self.solve(sigma2)
        w = np.exp(logw - logw.max()).ravel()
        idx = rng.choice(w.size, size=n, p=w / w.sum())
        i, j = np.unravel_index(idx, logw.shape)
        du, dv = self.edges_u[1] - self.edges_u[0], self.edges_v[1] - self.edges_v[0]
        u = self.u[i] + (rng.random(n) - 0.5) * du
        v = self.v[j] + (rng.random(n) - 0.5) * dv
        var_d, cov_dg, var_g, mean_d = (np.broadcast_to(x, logw.shape)[i, j] for x in cov)
        z1, z2 = rng.standard_normal(n), rng.standard_normal(n)
        l11 = np.sqrt(np.clip(var_d, 0, None))
        l21 = np.where(l11 > 0, cov_dg / np.where(l11 > 0, l11, 1.0), 0.0)
        l22 = np.sqrt(np.clip(var_g - l21 * l21, 0, None))
        R0 = self.g.R0 + mean_d + l11 * z1
        A = np.clip(self.g.R0 + mean[i, j] + l21 * z1 + l22 * z2, R0, 1.0)
        return np.column_stack([A, np.exp(u), np.exp(v), R0])


@functools.lru_cache(maxsize=None)
def chi2_cut() -> float:
    """The chi-square(1) quantile at the interval's level: the likelihood-ratio cut on the deviance."""
    from scipy.special import chdtri

    return float(chdtri(1, 1 - CI_LEVEL))


def deviance_interval(cells, profile: np.ndarray, axis: int) -> tuple[float, float]:
    """The interval on log B (axis 0) or log C_mid (axis 1) where a profile deviance over the grid's cells stays
    within the chi-square(1) quantile, interpolated between cell centres; an end that reaches the priors' bound is
    open (-inf / inf)."""
    dev = profile - profile.min()
    cut = chi2_cut()
    centres = cells.u if axis == 0 else cells.v
    edges = cells.edges_u if axis == 0 else cells.edges_v
    lower, upper = cells.g.box
    inside = np.flatnonzero(dev <= cut)
    i0, i1 = int(inside[0]), int(inside[-1])
    if i0 == 0:
        lo = -math.inf if edges[0] <= lower[axis] + 1e-9 else float(edges[0])
    else:
        lo = float(np.interp(cut, [dev[i0], dev[i0 - 1]], [centres[i0], centres[i0 - 1]]))
    if i1 == len(centres) - 1:
        hi = math.inf if edges[-1] >= upper[axis] - 1e-9 else float(edges[-1])
    else:
        hi = float(np.interp(cut, [dev[i1], dev[i1 + 1]], [centres[i1], centres[i1 + 1]]))
    return lo, hi
