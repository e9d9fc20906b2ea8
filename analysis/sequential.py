"""Group-sequential testing in information time: a two-sided z-test looked at, at information fractions t_1 < ... < t_K.

Under H0, Z(t) = W(t) / sqrt(t) with W a standard Brownian motion (t = 1: the full budget); under a drift theta,
W(t) has mean theta t. The boundaries spend alpha by the O'Brien-Fleming-type function of Lan & DeMets (1983,
Biometrika 70:659), alpha/2 on each side; the crossing probabilities come from the recursive numerical integration
of Armitage, McPherson & Rowe (1969) on the grid of Jennison & Turnbull (2000, "Group Sequential Methods", ch. 19).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy.optimize import brentq
from scipy.special import ndtr, ndtri

GRID_R = 24  # Jennison & Turnbull's r: 6r - 1 grid points per look before trimming (r = 16 is good to ~1e-6)
# a look that spends less has no boundary (math.inf); OBF spends ~1e-18 by t = 0.09, and a z of 17 there is a claim
MIN_SPEND = 1e-300
_SQRT_2PI = math.sqrt(2 * math.pi)


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0 or not math.isfinite(alpha):
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")


def _check_times(times: Sequence[float]) -> np.ndarray:
    t = np.asarray(times, dtype=float)
    if t.ndim != 1 or t.size == 0:
        raise ValueError(f"times must be a non-empty sequence of information fractions, got {times!r}")
    if not np.all(np.isfinite(t)) or t[0] <= 0.0 or t[-1] > 1.0:
        raise ValueError(f"times must lie in (0, 1], got {list(map(float, t))}")
    if np.any(np.diff(t) <= 0.0):
        raise ValueError(f"times must be strictly increasing, got {list(map(float, t))}")
    return t


def spent(t: float, alpha: float) -> float:
    """Two-sided alpha spent by information fraction `t`: Lan & DeMets' (1983) O'Brien-Fleming-type function
    2 - 2 Phi(z_{1-a/2} / sqrt(t)) spending a = alpha/2 on each side, so 4 - 4 Phi(z_{1-alpha/4} / sqrt(t)) in all
    for 0 < t < 1; 0 for t <= 0, alpha for t >= 1.

    Symmetric two-sided control (half of alpha per boundary) is the convention of R's ldbounds and gsDesign and of
    the published Lan-DeMets boundaries (alpha = 0.05, K = 5 equal looks: 4.877, 3.357, 2.680, 2.290, 2.031). The
    function 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)) with the whole two-sided alpha spends more early (first look of two:
    2.772, not 2.963)."""
    _check_alpha(alpha)
    if t <= 0.0:
        return 0.0
    if t >= 1.0:
        return float(alpha)
    z = -float(ndtri(alpha / 4))  # z_{1-alpha/4}
    return float(4.0 * ndtr(-z / math.sqrt(t)))  # 2 (2 - 2 Phi(x)) = 4 Phi(-x), without the cancellation


def _grid(mu: float, c: float) -> tuple[np.ndarray, np.ndarray]:
    """Points and Simpson weights for integrating over z in (-c, c) a density centred near `mu`.

    Jennison & Turnbull's 6r - 1 points (dense within mu +- 3, log-spaced tails out to mu +- (3 + 4 log r)),
    trimmed to the continuation region with its ends added, then every interval halved for Simpson's rule."""
    r = GRID_R
    i = np.arange(1, 6 * r)
    x = np.where(i < r, -3 - 4 * np.log(r / np.minimum(i, r)),
                 np.where(i <= 5 * r, -3 + 3 * (i - r) / (2 * r), 3 + 4 * np.log(r / np.maximum(6 * r - i, 1))))
    x = mu + x
    pts = x[(x > -c) & (x < c)]
    if -c > x[0]:
        pts = np.concatenate([[-c], pts])
    if c < x[-1]:
        pts = np.concatenate([pts, [c]])
    if pts.size < 2:  # a continuation region far in the tail of the density: its mass is nil
        pts = np.array([-c, c]) if math.isfinite(c) else x[[0, -1]]
    z = np.empty(2 * pts.size - 1)
    z[0::2] = pts
    z[1::2] = (pts[:-1] + pts[1:]) / 2
    d = np.diff(pts)
    w = np.zeros_like(z)
    w[1::2] = 4 * d / 6
    w[0:-1:2] += d / 6
    w[2::2] += d / 6
    return z, w


class _Recursion:
    """The sub-density of Z_k on the continuation region, carried look by look (Jennison & Turnbull, 19.2)."""

    def __init__(self, t: np.ndarray, drift: float):
        self.t, self.drift = t, drift
        self.k = 0  # looks passed
        self.z = self.mass = None  # grid on Z_k and the sub-density there times the Simpson weights

    def exit(self, c: float) -> float:
        """P(no crossing before the next look, and |Z| >= c there)."""
        if not math.isfinite(c):
            return 0.0
        t1, theta = self.t[self.k], self.drift
        mu1 = theta * math.sqrt(t1)
        if self.k == 0:
            return float(ndtr(mu1 - c) + ndtr(-mu1 - c))
        t0 = self.t[self.k - 1]
        dt = t1 - t0
        shift = (self.z * math.sqrt(t0) + theta * dt) / math.sqrt(dt)  # mean of the increment's z, per grid point
        scale = math.sqrt(t1 / dt)
        return float(self.mass @ (ndtr(shift - c * scale) + ndtr(-shift - c * scale)))

    def advance(self, c: float) -> None:
        """Move to the next look, whose continuation region is |Z| < c."""
        t1, theta = self.t[self.k], self.drift
        mu1 = theta * math.sqrt(t1)
        z1, w1 = _grid(mu1, c)
        if self.k == 0:
            dens = np.exp(-0.5 * (z1 - mu1) ** 2) / _SQRT_2PI
        else:
            t0 = self.t[self.k - 1]
            dt = t1 - t0
            # density of Z_1 = z1 given Z_0 = z: sqrt(t1 / dt) phi((z1 sqrt(t1) - z sqrt(t0) - theta dt) / sqrt(dt))
            u = (z1[:, None] * math.sqrt(t1) - self.z[None, :] * math.sqrt(t0) - theta * dt) / math.sqrt(dt)
            dens = np.exp(-0.5 * u * u) @ self.mass * (math.sqrt(t1 / dt) / _SQRT_2PI)
        self.z, self.mass = z1, dens * w1
        self.k += 1


def boundaries(times: Sequence[float], alpha: float) -> list[float]:
    """Critical values c_1..c_K for |Z_k| at the information fractions `times` (strictly increasing, in (0, 1]).

    Under H0 the probability of crossing first at look k is spent(t_k) - spent(t_{k-1}); each c_k is the root
    (brentq) of that exit probability, computed by the recursive integration. A look whose increment is below
    MIN_SPEND gets math.inf (it can never cross). A last look before t = 1 spends spent(t_K), not alpha."""
    _check_alpha(alpha)
    t = _check_times(times)
    rec = _Recursion(t, 0.0)
    bounds: list[float] = []
    before = 0.0
    for k in range(t.size):
        now = spent(float(t[k]), alpha)
        inc = now - before
        before = now
        if inc < MIN_SPEND:
            c = math.inf
        elif k == 0:
            c = -float(ndtri(inc / 2))  # P(|Z_1| >= c) = 2 Phi(-c)
        else:
            lo, hi = 0.0, 4.0
            while rec.exit(hi) > inc:
                lo, hi = hi, 2 * hi
            c = brentq(lambda x: rec.exit(x) - inc, lo, hi, xtol=1e-10, rtol=1e-12)
        bounds.append(float(c))
        if k + 1 < t.size:
            rec.advance(c)
    return bounds


def crossing_probability(times: Sequence[float], bounds: Sequence[float], drift: float = 0.0) -> float:
    """P(|Z_k| >= c_k at some look k) when W(t) has mean `drift` * t; `bounds` may hold math.inf (no crossing).

    By the same recursion as `boundaries`: with drift 0 and their bounds it gives spent(t_K, alpha)."""
    t = _check_times(times)
    c = [float(b) for b in bounds]
    if len(c) != t.size:
        raise ValueError(f"bounds must have one value per look: {len(c)} bounds for {t.size} times")
    if any(not b > 0.0 for b in c):
        raise ValueError(f"bounds must be positive (math.inf for no crossing), got {c}")
    if not math.isfinite(drift):
        raise ValueError(f"drift must be finite, got {drift!r}")
    rec = _Recursion(t, float(drift))
    total = 0.0
    for k, b in enumerate(c):
        total += rec.exit(b)
        if k + 1 < t.size:
            rec.advance(b)
    return min(total, 1.0)


def predictive_claim(z: float, t: float, c: float) -> float:
    """Predictive probability, under a flat prior on the drift, that the final look has |Z(1)| >= c given Z(t) = z.

    W(t) = z sqrt(t); under a flat prior the drift's posterior is N(W/t, 1/t); W(1) = W(t) + an increment of
    mean drift (1 - t) and variance 1 - t, so W(1) | W(t) ~ N(W/t, (1 - t) + (1 - t)^2 / t) = N(W/t, (1 - t)/t).
    With s = sqrt((1 - t)/t) and Z(1) = W(1): Phi((W/t - c) / s) + Phi((-W/t - c) / s).
    t >= 1: the indicator |z| >= c; t <= 0 raises ValueError."""
    if not math.isfinite(t) or t <= 0.0:
        raise ValueError(f"information fraction t must be in (0, 1], got {t!r}")
    if t >= 1.0:
        return 1.0 if abs(z) >= c else 0.0
    m = z * math.sqrt(t) / t
    s = math.sqrt((1.0 - t) / t)
    return float(ndtr((m - c) / s) + ndtr((-m - c) / s))
