"""The noise of a validation curve, and what it does to the fitted parameters (`estimate`).

Within one run (runs are independent):

    cov(e_i, e_j) = s_w^2 [i == j] + s_a^2 exp(-|C_i - C_j| / ell) + s_s^2 exp(-|C_i - C_j| / ell_s)

white noise, a wobble shared by nearby points, and slow departures from the law over a good part of the run (a run
that pulls ahead for a while, or drifts off at its end). Estimated from the residuals of a least-squares fit by
REML on a grid of settings (ell, the wobble's share rho, ell_s and the slow share q, the scale in closed form), every
setting's likelihood by one vectorized Kalman filter; each parameter's interval variance is the mixture of its
sandwich variances over the settings, weighted by their likelihood, with Student-t tails. Why:
docs/fitting.md#the-noise-model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

RHOS = np.array([0.0, 0.15, 0.3, 0.45, 0.6, 0.75, 0.87, 0.95])  # the wobble's share of the fast variance
N_ELL = 8
SLOW_SHARES = np.array([0.1, 0.25, 0.5])  # the slow departures' share of the variance (besides none)
SLOW_SPANS = np.array([0.25, 1.0, 4.0])  # their correlation length, in spans of the run
SLOW_PRIOR = 0.5  # the prior mass of the settings with slow departures (spread evenly over them)
MIN_SD = 1e-6  # below this the points are noiseless for all purposes (and the arithmetic would not resolve it)


@dataclass(frozen=True)
class Noise:
    """The noise model as a fit reports it: white noise and the wobble at their most likely setting, the slow
    departures as the settings' likelihood-weighted mean."""

    sd_white: float
    sd_wobble: float
    corr: float  # correlation length of the wobble, in compute units (GPU-hours); 0 without a wobble
    n_eff: float  # effective number of independent points under this setting
    sd_slow: float = 0.0  # the slow departures from the law
    corr_slow: float = 0.0  # their correlation length (compute units); 0 without them

    @property
    def var(self) -> float:
        return self.sd_white**2 + self.sd_wobble**2 + self.sd_slow**2

    @property
    def fast(self) -> Noise:
        """White noise and the wobble only (the point estimate's weights: the slow part is not down-weighted)."""
        return Noise(self.sd_white, self.sd_wobble, self.corr, self.n_eff)

    def as_dict(self) -> dict[str, float]:
        """As SigmoidFit.noise holds it (analysis/information.py reads the same keys)."""
        return {"sd_white": self.sd_white, "sd_wobble": self.sd_wobble, "corr_gpu_hours": self.corr,
                "sd_slow": self.sd_slow, "corr_slow_gpu_hours": self.corr_slow, "n_eff": self.n_eff}


@dataclass(frozen=True)
class ParameterNoise:
    """What the noise does to the least-squares parameters (in the order of the Jacobian's columns)."""

    noise: Noise
    variance: np.ndarray  # per parameter: the normal variance whose interval matches the mixture's
    naive: np.ndarray  # (J^T J)^+: the parameters' covariance per unit of white noise


def _blocks(runs: np.ndarray) -> list[slice]:
    """Points are sorted by (run, compute): one contiguous slice per run."""
    edges = np.flatnonzero(np.diff(runs)) + 1
    bounds = [0, *edges.tolist(), runs.size]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


@dataclass(frozen=True)
class Settings:
    """The grid of noise settings, unit scale: white (1 - q)(1 - rho), wobble (1 - q) rho over ell, slow q over
    ell_s (q = 0: none)."""

    ell: np.ndarray
    rho: np.ndarray
    ell_s: np.ndarray
    q: np.ndarray

    @classmethod
    def grid(cls, spacing: float, span: float, slow: bool = True, longest: float = 1 / 3) -> Settings:
        """The settings for points `spacing` apart over `span` (compute units), the wobble's correlation length up
        to `longest` of the span; without the slow departures when `slow` is off."""
        ells = spacing * np.geomspace(0.5, max(span * longest / spacing, 1.0), N_ELL)
        ell, rho = (x.ravel() for x in np.meshgrid(ells, RHOS, indexing="ij"))
        parts = [(ell, rho, np.ones(ell.size), np.zeros(ell.size))]
        if slow:  # beside slow departures, every other wobble setting (the mixture over them is what matters)
            ell_c, rho_c = (x.ravel() for x in np.meshgrid(ells[::2], RHOS[::2], indexing="ij"))
            for s, q in ((s, q) for s in SLOW_SPANS for q in SLOW_SHARES):
                parts.append((ell_c, rho_c, np.full(ell_c.size, span * s), np.full(ell_c.size, q)))
        return cls(*(np.concatenate([part[i] for part in parts]) for i in range(4)))

    @property
    def log_prior(self) -> np.ndarray:
        """SLOW_PRIOR of the prior mass on the settings with slow departures, the rest on those without, each share
        spread evenly over its settings."""
        slow = self.q > 0
        if not slow.any():
            return np.zeros(self.q.size)
        return np.where(slow, math.log(SLOW_PRIOR / slow.sum()), math.log((1 - SLOW_PRIOR) / (~slow).sum()))

    @property
    def white(self) -> np.ndarray:
        return (1 - self.q) * (1 - self.rho)

    @property
    def wobble(self) -> np.ndarray:
        return (1 - self.q) * self.rho


def estimate(c: np.ndarray, runs: np.ndarray, resid: np.ndarray, jac: np.ndarray, level: float, *,
             slow: bool = True, longest: float = 1 / 3) -> ParameterNoise:
    """The noise model from the residuals of a least-squares fit, and the parameters' `level` interval variances;
    `slow` off: white noise and a wobble over at most `longest` of the run (what a test of departures from the law
    holds them to)."""
    n, p = jac.shape
    blocks = _blocks(runs)
    jtj = jac.T @ jac
    naive = np.linalg.pinv(jtj)
    gaps = [np.diff(c[b]) for b in blocks if b.stop - b.start > 1]
    ss = float(resid @ resid)
    dof = n - p
    if dof < 1 or not gaps or ss / n < MIN_SD**2:
        s2 = max(ss / max(dof, 1), MIN_SD**2)
        noise = Noise(sd_white=math.sqrt(s2), sd_wobble=0.0, corr=0.0, n_eff=float(n))
        return ParameterNoise(noise=noise, variance=s2 * np.diag(naive), naive=naive)

    spacing = float(np.median(np.concatenate(gaps)))
    span = float(max(c[b].max() - c[b].min() for b in blocks))
    grid = Settings.grid(spacing, span, slow, longest)

    log_lik, sigma2 = _reml(c, blocks, resid, jac, grid)
    log_lik = log_lik + grid.log_prior
    weight = np.exp(log_lik - log_lik.max())
    weight /= weight.sum()
    keep = weight > 1e-6 * weight.max()

    # sandwich variance of every kept setting: J^T Sigma J = s^2 (white J^T J + wobble J^T R_ell J + q J^T R_ell_s J)
    lengths = np.unique(np.concatenate([grid.ell[keep], grid.ell_s[keep & (grid.q > 0)]]))
    jrj = np.zeros((lengths.size, p, p))
    for b in blocks:
        dist = np.abs(c[b, None] - c[None, b])
        for i, ell in enumerate(lengths):
            jrj[i] += jac[b].T @ np.exp(-dist / ell) @ jac[b]
    # diag(naive M naive) for M = J^T J and each J^T R_ell J, then mixed per setting
    diag_white = np.einsum("ij,jk,ki->i", naive, jtj, naive)
    diag_corr = np.einsum("ij,ejk,ki->ei", naive, jrj, naive)
    fast = diag_corr[np.searchsorted(lengths, grid.ell[keep])]
    slow = np.where((grid.q[keep] > 0)[:, None],
                    diag_corr[np.minimum(np.searchsorted(lengths, grid.ell_s[keep]), lengths.size - 1)], 0.0)
    s2_k = sigma2[keep][:, None]
    variances = s2_k * (grid.white[keep][:, None] * diag_white[None] + grid.wobble[keep][:, None] * fast
                        + grid.q[keep][:, None] * slow)
    variance = _mixture_variance(variances, weight[keep] / weight[keep].sum(), dof, level)

    # white noise and the wobble at the most likely setting; the slow departures as the settings' mean (their
    # share is what one curve pins down least: the mean keeps what the likely settings hold of them)
    best = int(np.argmax(log_lik))
    s2 = float(sigma2[best])
    sw2, sa2 = s2 * grid.white[best], s2 * grid.wobble[best]
    ell = float(grid.ell[best])
    slow_var = weight * sigma2 * grid.q
    ss2 = float(slow_var.sum())
    ell_s = float((slow_var * grid.ell_s).sum() / ss2) if ss2 > 0 else 0.0
    noise = Noise(sd_white=math.sqrt(sw2), sd_wobble=math.sqrt(sa2), corr=ell if sa2 > 0 else 0.0,
                  n_eff=_n_eff(c, blocks, ((sw2, 0.0), (sa2, ell), (ss2, ell_s))),
                  sd_slow=math.sqrt(ss2), corr_slow=ell_s if ss2 > 0 else 0.0)
    floor = MIN_SD**2 * np.diag(naive)
    return ParameterNoise(noise=noise, variance=np.maximum(variance, floor), naive=naive)


def _reml(c, blocks, resid, jac, grid: Settings) -> tuple[np.ndarray, np.ndarray]:
    """REML log-likelihood (up to a constant) and scale of each setting, by one vectorized Kalman filter.

    Unit-scale model: the wobble and the slow departures are two Ornstein-Uhlenbeck states, white noise on top.
    Filtering the residuals and the Jacobian's columns with each setting's gains gives Sigma^-1 inner products and
    log det Sigma; then the restricted likelihood of the residuals after the (linearized) fit is closed form, with
    the scale profiled out."""
    n, p = jac.shape
    y = np.column_stack([resid, jac])
    k = y.shape[1]
    settings = grid.ell.size
    innov_all = np.empty((n, settings, k))  # innovations; divided by their sd they are Sigma^-1/2 y
    total_all = np.empty((n, settings))
    white, wob, slow = grid.white, grid.wobble, grid.q  # the white variance and the two states' (unit scale)
    for b in blocks:
        gaps = np.diff(c[b])
        f1, f2 = np.exp(-gaps[:, None] / grid.ell[None]), np.exp(-gaps[:, None] / grid.ell_s[None])
        fresh1, fresh2, f12 = wob[None] * (1 - f1 * f1), slow[None] * (1 - f2 * f2), f1 * f2
        a1, a2 = np.zeros((settings, k)), np.zeros((settings, k))  # the states' means, per column of y
        p11, p12, p22 = wob.copy(), np.zeros(settings), slow.copy()  # their covariance
        for step, t in enumerate(range(b.start, b.stop)):
            if step:
                g1, g2 = f1[step - 1], f2[step - 1]
                a1 *= g1[:, None]
                a2 *= g2[:, None]
                p11 = g1 * g1 * p11 + fresh1[step - 1]
                p12 = f12[step - 1] * p12
                p22 = g2 * g2 * p22 + fresh2[step - 1]
            h1, h2 = p11 + p12, p12 + p22  # P h, h = (1, 1)
            total = h1 + h2 + white
            innov = y[t] - a1 - a2
            k1, k2 = h1 / total, h2 / total
            a1 += k1[:, None] * innov
            a2 += k2[:, None] * innov
            p11, p12, p22 = p11 - k1 * h1, p12 - k1 * h2, p22 - k2 * h2
            innov_all[t] = innov
            total_all[t] = total
    log_det = np.log(total_all).sum(axis=0)
    whitened = innov_all / np.sqrt(total_all)[:, :, None]
    gram = np.einsum("tsk,tsl->skl", whitened, whitened, optimize=True)
    ee, je, jj = gram[:, 0, 0], gram[:, 1:, 0], gram[:, 1:, 1:]
    ridge = 1e-12 * np.trace(jj, axis1=1, axis2=2)[:, None, None] * np.eye(p)[None]
    jj = jj + ridge
    sol = np.linalg.solve(jj, je[:, :, None])[:, :, 0]
    rss = np.maximum(ee - (je * sol).sum(1), 1e-300)
    sigma2 = rss / (n - p)
    _, log_det_jj = np.linalg.slogdet(jj)
    log_lik = -0.5 * ((n - p) * np.log(sigma2) + log_det + log_det_jj)
    return log_lik, sigma2


def _mixture_variance(variances: np.ndarray, weight: np.ndarray, dof: int, level: float) -> np.ndarray:
    """Per parameter: the h solving sum_k w_k P(|Z| sqrt(V_k') <= h) = level, returned as (h / z_level)^2, where
    V_k' is V_k widened by (t_dof / z)^2 at the level (Student-t tails for the estimated scale, matched at the
    quantile). The mixture's coverage is evaluated on a log grid of h and inverted by interpolation."""
    from scipy.special import ndtr, ndtri, stdtrit

    z = float(ndtri(0.5 + level / 2))
    widen = float(stdtrit(dof, 0.5 + level / 2)) / z
    sd = widen * np.sqrt(np.maximum(variances, 1e-300))  # settings x parameters
    out = np.empty(sd.shape[1])
    for i in range(sd.shape[1]):
        h = z * np.geomspace(sd[:, i].min() * 0.9, sd[:, i].max() * 1.1, 120)
        covered = (2 * ndtr(h[:, None] / sd[None, :, i]) - 1) @ weight
        out[i] = (float(np.exp(np.interp(level, covered, np.log(h)))) / z) ** 2
    return out


def _n_eff(c: np.ndarray, blocks: list[slice], parts) -> float:
    """Effective independent points: the sum over runs of m^2 var / (1^T Sigma 1); parts: (variance, length) of
    each component (length 0: white)."""
    var = sum(v for v, _ in parts)
    if var <= 0:
        return float(c.size)
    total = 0.0
    for b in blocks:
        m = b.stop - b.start
        ones = 0.0
        for v, ell in parts:
            if v <= 0:
                continue
            ones += v * (float(np.exp(-np.abs(c[b, None] - c[None, b]) / ell).sum()) if ell > 0 else m)
        total += m * m * var / ones
    return total
