"""The point estimate of Eq. 1 in (A, log B, log C_mid), by one small solver (damped Gauss-Newton, backtracking,
held in the search box):
- `least_squares`: ordinary least squares, the paper's criterion; the intervals (analysis/posterior.py) are built
  around it, and its residuals give the noise model (analysis/noise.py);
- `refine`: the reported estimate: generalized least squares under the most likely noise setting, with Firth's bias
  reduction, and R0 (when measured) a parameter with a Gaussian prior. Why: docs/fitting.md#the-point-estimate.
The wobble's correlation matrix has a tridiagonal inverse, so Sigma^-1 is applied in O(n) by a banded solve
(`Precision`).
"""

from __future__ import annotations

import math

import numpy as np

from analysis.noise import Noise

MAX_STEPS = 100
TOLERANCE = 1e-5  # stop when a step moves no parameter by more than this (A, log B, log C_mid, R0 units)
FD_STEP = 1e-5  # finite-difference step for the gradient of log det I


def least_squares(log_c: np.ndarray, r: np.ndarray, R0: float, x0: np.ndarray, lower: np.ndarray,
                  upper: np.ndarray, A_fixed: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ordinary least squares for (A, log B, log C_mid), or (log B, log C_mid) with A fixed, from x0 within
    [lower, upper]. Returns (x, jacobian, residuals)."""
    law = Law(log_c, r, R0, A_fixed)
    x = solve(law, x0, lower, upper)
    e, jac = law.residuals(x[None])
    return x, jac[0], e[0]


def refine(c: np.ndarray, log_c: np.ndarray, r: np.ndarray, runs: np.ndarray, R0: float, noise: Noise,
           x0: np.ndarray, lower: np.ndarray, upper: np.ndarray, A_fixed: float | None,
           r0_sd: float = 0.0) -> np.ndarray:
    """The GLS + Firth estimate, started from the least-squares solution x0, held within [lower, upper].
    r0_sd > 0: R0 is a measurement with that error: it is estimated too, and returned appended to x."""
    law = Law(log_c, r, R0, A_fixed, precision=Precision(c, runs, noise), r0_sd=r0_sd, firth=True)
    if r0_sd > 0:
        x0, lower, upper = np.append(x0, R0), np.append(lower, 0.0), np.append(upper, 1.0)
    return solve(law, x0, lower, upper)


def solve(law: "Law", x0: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Minimize law.objective: Gauss-Newton steps (the Hessian J^T P J, a trace of damping), each shortened by
    halving until the objective falls, every trial projected into the box."""
    x = np.clip(np.asarray(x0, dtype=float), lower, upper)
    value = float(law.objective(x[None])[0])
    if not math.isfinite(value):
        return x
    for _ in range(MAX_STEPS):
        hess, grad = law.linearize(x, lower, upper)
        try:
            step = -np.linalg.solve(hess + 1e-9 * np.trace(hess) * np.eye(len(x)), grad)
        except np.linalg.LinAlgError:
            break
        trial, new = _backtrack(law, x, step, value, lower, upper)
        if trial is None:
            break
        moved = float(np.max(np.abs(trial - x)))
        x, value = trial, new
        if moved < TOLERANCE:
            break
    return x


def _backtrack(law: "Law", x, step, value, lower, upper):
    """The full step if it lowers the objective, else the first of its halvings that does (evaluated at once);
    (None, value) when none does."""
    for trials in (np.clip(x + step, lower, upper)[None],
                   np.clip(x + step * 0.5 ** np.arange(1, 20)[:, None], lower, upper)):
        values = law.objective(trials)
        better = np.flatnonzero(np.isfinite(values) & (values <= value))
        if better.size:
            return trials[better[0]], float(values[better[0]])
    return None, value


class Precision:
    """v -> Sigma^-1 v for the noise model at its most likely setting: Sigma = s_w^2 I + s_a^2 K within a run
    (K_ij = exp(-|C_i - C_j| / corr)), 0 across runs (points sorted by run, then compute).

    An Ornstein-Uhlenbeck process sampled at C_1 < ... < C_m is Markov: with rho_i = exp(-(C_i+1 - C_i) / corr),
    K^-1 is tridiagonal, diagonal 1/(1 - rho_1^2), 1/(1 - rho_i-1^2) + rho_i^2/(1 - rho_i^2), ..., 1/(1 - rho_m-1^2)
    and off-diagonal -rho_i/(1 - rho_i^2). Then Sigma^-1 v = T^-1 (K^-1 v), T = s_w^2 K^-1 + s_a^2 I, tridiagonal and
    positive definite: one banded Cholesky factor, O(n) per vector. Without a wobble, Sigma^-1 = I / s^2."""

    def __init__(self, c: np.ndarray, runs: np.ndarray, noise: Noise):
        from scipy.linalg import cholesky_banded

        white2, wobble2, ell = noise.sd_white**2, noise.sd_wobble**2, noise.corr
        self.n = c.size
        self.scale = 1.0 / max(white2 + wobble2, 1e-300)
        self.factor = None
        gaps = np.diff(c)
        same_run = np.diff(runs) == 0
        if wobble2 <= 0 or ell <= 0 or white2 <= 0 or np.any(gaps[same_run] <= 0):
            return  # white noise (or a degenerate setting): a scale
        rho = np.where(same_run, np.exp(-np.where(same_run, gaps, 0.0) / ell), 0.0)  # 0 across runs
        tail = rho * rho / (1.0 - rho * rho)
        self.diag = np.ones(c.size)
        self.diag[:-1] += tail
        self.diag[1:] += tail
        self.off = -rho / (1.0 - rho * rho)  # K^-1[i, i+1]
        banded = np.zeros((2, c.size))  # upper form: row 0 the superdiagonal (shifted), row 1 the diagonal
        banded[0, 1:] = white2 * self.off
        banded[1] = white2 * self.diag + wobble2
        self.factor = cholesky_banded(banded)

    def apply(self, v: np.ndarray) -> np.ndarray:
        """Sigma^-1 v for v of shape (n,) or (n, m)."""
        if self.factor is None:
            return v * self.scale
        from scipy.linalg import cho_solve_banded

        d = self.diag if v.ndim == 1 else self.diag[:, None]
        off = self.off if v.ndim == 1 else self.off[:, None]
        kv = d * v
        kv[:-1] += off * v[1:]
        kv[1:] += off * v[:-1]
        return cho_solve_banded((self.factor, False), kv)


class Law:
    """Eq. 1 as a (generalized) least-squares problem in (A, log B, log C_mid): A left out when held fixed, R0
    appended when it is a measurement (r0_sd > 0). Works on a batch of parameter vectors X (k, p) at once.

    precision: Sigma^-1 (a Precision; None: ordinary least squares). A measured R0 adds its prior,
    ((R0 - R0_measured) / r0_sd)^2, to the sum of squares and 1 / r0_sd^2 to the information. firth: the objective
    subtracts 1/2 log det of the information J^T Sigma^-1 J (prior included). shapes (n, k): departures from the law
    added to it with a coefficient each, after log C_mid (before R0): analysis/misfit.py's test."""

    def __init__(self, log_c, r, R0, A_fixed, *, precision: Precision | None = None, r0_sd=0.0, firth=False,
                 shapes: np.ndarray | None = None):
        self.log_c, self.r, self.R0, self.A_fixed = log_c, r, R0, A_fixed
        self.P, self.r0_sd, self.firth = precision, r0_sd, firth
        self.free_r0 = r0_sd > 0
        self.i_b = 0 if A_fixed is not None else 1  # index of log B; log C_mid follows
        self.shapes = np.zeros((len(r), 0)) if shapes is None else np.asarray(shapes, dtype=float)

    def _A(self, X: np.ndarray) -> np.ndarray:
        return X[:, 0] if self.A_fixed is None else np.full(len(X), float(self.A_fixed))

    def residuals(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(k, n) residuals (model - data) and (k, n, p) Jacobians of the data part."""
        from scipy.special import expit

        A = self._A(X)
        B, log_cmid = np.exp(X[:, self.i_b]), X[:, self.i_b + 1]
        R0 = X[:, -1] if self.free_r0 else np.full(len(X), self.R0)
        dx = self.log_c[None, :] - log_cmid[:, None]
        s = expit(B[:, None] * dx)
        gain = (A - R0)[:, None]
        ds = gain * s * (1.0 - s)
        k = self.shapes.shape[1]
        cols = ([s] if self.A_fixed is None else []) + [ds * B[:, None] * dx, -ds * B[:, None]]
        cols += [np.broadcast_to(self.shapes[:, j], s.shape) for j in range(k)]
        cols += [1.0 - s] if self.free_r0 else []
        model = R0[:, None] + gain * s + X[:, self.i_b + 2:self.i_b + 2 + k] @ self.shapes.T
        return model - self.r[None, :], np.stack(cols, axis=-1)

    def _weighted(self, e: np.ndarray, jac: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sigma^-1 applied to each row's residuals and Jacobian columns, all in one banded solve."""
        if self.P is None:
            return e, jac
        k, n, p = jac.shape
        both = np.concatenate([e[:, :, None], jac], axis=2).transpose(1, 0, 2).reshape(n, k * (p + 1))
        both = self.P.apply(both).reshape(n, k, p + 1).transpose(1, 0, 2)
        return both[:, :, 0], both[:, :, 1:]

    def _information(self, jac: np.ndarray, pjac: np.ndarray) -> np.ndarray:
        info = np.matmul(jac.transpose(0, 2, 1), pjac)
        if self.free_r0:
            info[:, -1, -1] += 1.0 / self.r0_sd**2
        return info

    def linearize(self, x: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The Gauss-Newton Hessian J^T P J and the gradient of the objective at x (priors in; with firth, the
        gradient of -1/2 log det by forward differences): x and its p shifted copies in one batch."""
        p = len(x)
        shifted = x[None] + FD_STEP * np.eye(p)
        shifted = np.where(shifted <= upper, shifted, x[None] - FD_STEP * np.eye(p))  # backwards at an upper bound
        rows = np.vstack([x[None], np.maximum(shifted, lower)]) if self.firth else x[None]
        e, jac = self.residuals(rows)
        pe, pjac = self._weighted(e, jac)
        info = self._information(jac, pjac)
        grad = jac[0].T @ pe[0]
        if self.free_r0:
            grad[-1] += (x[-1] - self.R0) / self.r0_sd**2
        if self.firth:
            sign, log_det = np.linalg.slogdet(info)
            width = np.diag(rows[1:] - x[None])
            ok = (sign[1:] > 0) & (sign[0] > 0) & (width != 0)
            grad = grad - 0.5 * np.where(ok, (log_det[1:] - log_det[0]) / np.where(ok, width, 1.0), 0.0)
        return info[0], grad

    def objective(self, X: np.ndarray) -> np.ndarray:
        """1/2 e^T P e (+ R0's prior), minus 1/2 log det(J^T P J) with firth: minus the (penalized)
        log-likelihood, up to a constant. With R0 free, A must stay above it (a gain, not a loss)."""
        e, jac = self.residuals(X)
        pe, pjac = self._weighted(e, jac)
        value = 0.5 * (e * pe).sum(axis=1)
        if self.free_r0:
            value = value + 0.5 * ((X[:, -1] - self.R0) / self.r0_sd) ** 2
            value = np.where(self._A(X) > X[:, -1], value, np.inf)
        if self.firth:
            sign, log_det = np.linalg.slogdet(self._information(jac, pjac))
            value = value - 0.5 * np.where(sign > 0, log_det, -np.inf)
        return value
