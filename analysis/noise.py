"""The noise of a validation curve, and what it does to the fitted parameters (`estimate`).

Within one run (runs are independent): cov(e_i, e_j) = s_w^2 [i == j] + s_a^2 exp(-|C_i - C_j| / ell), white
noise plus a slow wobble. Estimated from the residuals of a least-squares fit by REML on a grid of
(ell, rho = s_a^2 / (s_w^2 + s_a^2)), every setting's likelihood by one vectorized Kalman filter; each parameter's
interval variance is the mixture of its sandwich variances over the settings, weighted by their likelihood, with
Student-t tails. Why: docs/fitting.md#the-noise-model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

RHOS = np.array([0.0, 0.15, 0.3, 0.45, 0.6, 0.75, 0.87, 0.95])
N_ELL = 8
MIN_SD = 1e-6  # below this the points are noiseless for all purposes (and the arithmetic would not resolve it)


@dataclass(frozen=True)
class Noise:
    """The most likely setting of the noise model, for reporting."""

    sd_white: float
    sd_wobble: float
    corr: float  # correlation length of the wobble, in compute units (GPU-hours); 0 without a wobble
    n_eff: float  # effective number of independent points under this setting

    @property
    def var(self) -> float:
        return self.sd_white**2 + self.sd_wobble**2


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


def estimate(c: np.ndarray, runs: np.ndarray, resid: np.ndarray, jac: np.ndarray, level: float) -> ParameterNoise:
    """The noise model from the residuals of a least-squares fit, and the parameters' `level` interval variances."""
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
    ells = spacing * np.geomspace(0.5, max(span / spacing / 3, 1.0), N_ELL)
    ell_grid, rho_grid = (x.ravel() for x in np.meshgrid(ells, RHOS, indexing="ij"))

    log_lik, sigma2 = _reml(c, blocks, resid, jac, ell_grid, rho_grid)
    weight = np.exp(log_lik - log_lik.max())
    weight /= weight.sum()
    keep = weight > 1e-6 * weight.max()

    # sandwich variance of every kept setting: J^T Sigma J = s^2 ((1 - rho) J^T J + rho J^T R_ell J)
    kept_ells = np.unique(ell_grid[keep])
    jrj = np.zeros((kept_ells.size, p, p))
    for b in blocks:
        dist = np.abs(c[b, None] - c[None, b])
        rb = np.exp(-dist[None] / kept_ells[:, None, None])  # (ells, m, m)
        jrj += np.einsum("ia,eij,jb->eab", jac[b], rb, jac[b], optimize=True)
    # diag(naive M naive) for M = J^T J and each J^T R_ell J, then mixed per setting
    diag_white = np.einsum("ij,jk,ki->i", naive, jtj, naive)
    diag_wobble = np.einsum("ij,ejk,ki->ei", naive, jrj, naive)
    which = np.searchsorted(kept_ells, ell_grid[keep])
    rho_k, s2_k = rho_grid[keep][:, None], sigma2[keep][:, None]
    variances = s2_k * ((1 - rho_k) * diag_white[None] + rho_k * diag_wobble[which])
    variance = _mixture_variance(variances, weight[keep] / weight[keep].sum(), dof, level)

    best = int(np.argmax(log_lik))
    s2, rho, ell = float(sigma2[best]), float(rho_grid[best]), float(ell_grid[best])
    sw2, sa2 = (1 - rho) * s2, rho * s2
    noise = Noise(sd_white=math.sqrt(sw2), sd_wobble=math.sqrt(sa2), corr=ell if sa2 > 0 else 0.0,
                  n_eff=_n_eff(c, blocks, sw2, sa2, ell))
    floor = MIN_SD**2 * np.diag(naive)
    return ParameterNoise(noise=noise, variance=np.maximum(variance, floor), naive=naive)


def _reml(c, blocks, resid, jac, ell, rho) -> tuple[np.ndarray, np.ndarray]:
    """REML log-likelihood (up to a constant) and scale of each (ell, rho) setting, by one vectorized Kalman filter.

    Unit-scale model: wobble variance rho, white variance 1 - rho. Filtering the residuals and the Jacobian's
    columns with each setting's gains gives Sigma^-1 inner products and log det Sigma; then the restricted
    likelihood of the residuals after the (linearized) fit is closed form, with the scale profiled out."""
    n, p = jac.shape
    y = np.column_stack([resid, jac])
    k = y.shape[1]
    settings = ell.size
    innov_all = np.empty((n, settings, k))  # innovations; divided by their sd they are Sigma^-1/2 y
    total_all = np.empty((n, settings))
    white_var = 1 - rho
    for b in blocks:
        gaps = np.diff(c[b])
        phi = np.exp(-gaps[:, None] / ell[None, :])  # (steps - 1, settings)
        phi2 = phi * phi
        fresh = rho[None, :] * (1 - phi2)
        state = np.zeros((settings, k))
        var = rho.copy()
        for step, t in enumerate(range(b.start, b.stop)):
            if step:
                state *= phi[step - 1][:, None]
                var = phi2[step - 1] * var + fresh[step - 1]
            total = var + white_var
            innov = y[t] - state
            gain = var / total
            state += gain[:, None] * innov
            var = var - gain * var
            innov_all[t] = innov
            total_all[t] = total
    log_det = np.log(total_all).sum(axis=0)
    white = innov_all / np.sqrt(total_all)[:, :, None]
    gram = np.einsum("tsk,tsl->skl", white, white, optimize=True)
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


def _n_eff(c: np.ndarray, blocks: list[slice], sw2: float, sa2: float, ell: float) -> float:
    """Effective independent points: the sum over runs of m^2 var / (1^T Sigma 1)."""
    var = sw2 + sa2
    if var <= 0:
        return float(c.size)
    total = 0.0
    for b in blocks:
        m = b.stop - b.start
        ones = m * sw2
        if sa2 > 0 and ell > 0:
            ones += sa2 * float(np.exp(-np.abs(c[b, None] - c[None, b]) / ell).sum())
        else:
            ones += m * sa2
        total += m * m * var / ones
    return total
