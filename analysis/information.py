"""What a curve's points say about the law's parameters, before or without fitting them: the Fisher information of
Eq. 1 under the noise model (white noise plus a slow wobble, analysis/noise.py), and the covariance it gives.

`covariance` is the Gaussian limit of the fit (A, log B, log C_mid, R0, with R0's own measurement); `continued`
extends a curve to its full budget at its own spacing and compute a step. The adaptive sweep takes its information
fractions from them (how much of the full budget's information a look has), the power bench its Gaussian layer, the
dry run its expected resolutions. Why: docs/fitting.md#the-adaptive-sweep.
"""

from __future__ import annotations

import math

import numpy as np

from analysis.law import C_MIN_FRACTION

PARAMETERS = ("A", "log B", "log C_mid", "R0")


def jacobian(c: np.ndarray, A: float, B: float, C_mid: float, R0: float) -> np.ndarray:
    """d R(C) / d (A, log B, log C_mid, R0) at each compute in `c` (> 0): n x 4."""
    from scipy.special import expit

    c = np.asarray(c, dtype=float)
    x = math.log(C_mid)
    s = expit(B * (np.log(c) - x))
    ds = s * (1 - s)  # d s / d (B (log c - log C_mid))
    return np.column_stack([s, (A - R0) * ds * B * (np.log(c) - x), -(A - R0) * ds * B, 1 - s])


def noise_covariance(c: np.ndarray, noise: dict) -> np.ndarray:
    """cov(e_i, e_j) for the points of one run at compute `c` under `noise` (as SigmoidFit.noise holds it):
    sd_white^2 [i == j] + sd_wobble^2 exp(-|c_i - c_j| / corr_gpu_hours) + sd_slow^2 exp(-|c_i - c_j| /
    corr_slow_gpu_hours) (analysis/noise.py's model; a part without its length is white)."""
    c = np.asarray(c, dtype=float)
    cov = np.eye(c.size) * float(noise.get("sd_white", 0.0)) ** 2
    for sd, length in (("sd_wobble", "corr_gpu_hours"), ("sd_slow", "corr_slow_gpu_hours")):
        var, ell = float(noise.get(sd, 0.0)) ** 2, float(noise.get(length, 0.0) or 0.0)
        if var > 0:
            cov = cov + var * (np.exp(-np.abs(c[:, None] - c[None, :]) / ell) if ell > 0 else np.eye(c.size))
    return cov


def information(c: np.ndarray, law: tuple[float, float, float, float], noise: dict, *,
                c_min: float | None = None, r0_points: int = 1) -> np.ndarray:
    """The Fisher information (4 x 4, in PARAMETERS' order) of one run's points at compute `c` on the law
    (A, B, C_mid, R0) under `noise` (as SigmoidFit.noise holds it: noise_covariance): the
    points at c >= c_min (default: the fit's cut, 1.5/16 of the largest c) by generalized least squares, and R0
    measured from `r0_points` points at compute 0 (as the fit takes it: its Gaussian prior)."""
    c = np.asarray(c, dtype=float)
    if c_min is None:
        c_min = C_MIN_FRACTION * float(c.max())
    used = c[(c >= c_min) & (c > 0)]
    total = sum(float(noise.get(name, 0.0)) ** 2 for name in ("sd_white", "sd_wobble", "sd_slow"))
    if total <= 0:
        raise ValueError("noise: sd_white, sd_wobble and sd_slow are all 0: the information is infinite")
    jac = jacobian(used, *law)
    cov = noise_covariance(used, noise)
    info = jac.T @ np.linalg.solve(cov, jac)
    if r0_points:
        info[3, 3] += r0_points / total
    return info


def covariance(c: np.ndarray, law: tuple[float, float, float, float], noise: dict, *, runs: int = 1,
               c_min: float | None = None, A_fixed: bool = False) -> np.ndarray:
    """The covariance of (A, log B, log C_mid, R0) from `runs` independent runs observed at `c` (the inverse of
    their information); with A_fixed, A's row and column are 0 (A held, the rest fitted)."""
    info = runs * information(c, law, noise, c_min=c_min)
    if not A_fixed:
        return _inverse(info)
    out = np.zeros((4, 4))
    out[1:, 1:] = _inverse(info[1:, 1:])
    return out


def joint_covariance(infos: list[np.ndarray]) -> np.ndarray:
    """The covariance of several curves fitted with one shared A: parameters (A, then log B, log C_mid, R0 of each
    curve in turn), from each curve's 4 x 4 information."""
    k = len(infos)
    size = 1 + 3 * k
    joint = np.zeros((size, size))
    for i, info in enumerate(infos):
        idx = [0, 1 + 3 * i, 2 + 3 * i, 3 + 3 * i]
        joint[np.ix_(idx, idx)] += info
    return _inverse(joint)


def _inverse(info: np.ndarray) -> np.ndarray:
    """The inverse of an information matrix; directions it does not inform (a curve far before its C_mid) get a
    variance of 1e12 instead of a singular solve."""
    scale = np.sqrt(np.clip(np.diag(info), 1e-300, None))
    unit = info / scale[:, None] / scale[None, :]
    w, v = np.linalg.eigh(unit)
    w = np.maximum(w, 1e-12 * max(float(w.max()), 1e-300))
    return (v / w) @ v.T / scale[:, None] / scale[None, :]


def continued(step: np.ndarray, compute: np.ndarray, steps: int) -> np.ndarray:
    """The compute of a curve's points continued to `steps`: the points it has, then one every median step gap at
    its mean compute a step so far."""
    step, compute = np.asarray(step), np.asarray(compute, dtype=float)
    moved = step > 0
    if not moved.any():
        raise ValueError("a curve with no point past step 0 has no pace to continue at")
    last = int(step[moved][-1])
    per_step = float(compute[moved][-1]) / last
    gap = int(np.median(np.diff(step))) if step.size > 1 else 1
    future = np.arange(last + max(gap, 1), steps + 1, max(gap, 1)) * per_step
    return np.concatenate([compute, future])


def ln_compute_gradient(law: tuple[float, float, float, float], r_star: float) -> np.ndarray:
    """d ln C* / d (A, log B, log C_mid, R0), C* the compute at which the law reaches r_star (R0 < r_star < A):
    ln C* = log C_mid - ln(q) / B, q = (A - R0) / (r_star - R0) - 1."""
    A, B, _, R0 = law
    q = (A - R0) / (r_star - R0) - 1.0
    return np.array([-1.0 / (B * q * (r_star - R0)), math.log(q) / B, 1.0,
                     -(A - r_star) / (B * q * (r_star - R0) ** 2)])
