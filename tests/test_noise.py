"""The noise model (analysis/noise.py): the Kalman filter's restricted likelihood against the dense algebra, slow
departures found where a curve has them and not where it has none, and what they do to the intervals."""

import math

import numpy as np
import pytest

from analysis import fit_sigmoid
from analysis.noise import Settings, _reml, estimate
from analysis.synthetic import Truth, wobble

TRUTH = Truth(A=0.61, B=1.9, C_mid=2542.0, R0=0.3)


def _dense_reml(c, runs, resid, jac, white, wobble_, ell, q, ell_s):
    """-1/2 ((n - p) log s^2 + log det S + log det J^T S^-1 J), S the unit-scale covariance (block diagonal by run),
    s^2 = r^T (S^-1 - S^-1 J (J^T S^-1 J)^-1 J^T S^-1) r / (n - p): the restricted likelihood with the scale profiled."""
    n, p = jac.shape
    d = np.abs(c[:, None] - c[None, :])
    same = runs[:, None] == runs[None, :]
    S = white * np.eye(n) + np.where(same, wobble_ * np.exp(-d / ell) + q * np.exp(-d / ell_s), 0.0)
    Si = np.linalg.inv(S)
    jsj = jac.T @ Si @ jac
    proj = Si - Si @ jac @ np.linalg.solve(jsj, jac.T @ Si)
    s2 = float(resid @ proj @ resid) / (n - p)
    return -0.5 * ((n - p) * math.log(s2) + np.linalg.slogdet(S)[1] + np.linalg.slogdet(jsj)[1]), s2


def test_the_kalman_likelihood_is_the_dense_one_for_every_kind_of_setting():
    """Two runs of uneven spacing, three fitted columns: white only, white and wobble, all three parts, and slow
    departures alone with white noise: the filter's log-likelihood and scale equal the dense algebra's."""
    rng = np.random.default_rng(3)
    c = np.concatenate([np.sort(rng.uniform(0, 100, 15)), np.sort(rng.uniform(0, 80, 11))])
    runs = np.repeat([0, 1], [15, 11])
    jac = np.column_stack([np.ones(26), np.log1p(c), np.sqrt(c)])
    resid = rng.standard_normal(26)
    blocks = [slice(0, 15), slice(15, 26)]
    settings = [(1.0, 0.0, 5.0, 0.0, 1.0), (0.4, 0.6, 12.0, 0.0, 1.0), (0.3, 0.45, 6.0, 0.25, 90.0),
                (0.8, 0.0, 5.0, 0.2, 40.0)]
    grid = Settings(ell=np.array([s[2] for s in settings]), rho=np.zeros(4), ell_s=np.array([s[4] for s in settings]),
                    q=np.array([s[3] for s in settings]))
    # the grid's white/wobble split is (1 - q)(1 - rho), (1 - q) rho: set rho so that they are the settings'
    rho = np.array([s[1] / (1 - s[3]) for s in settings])
    grid = Settings(ell=grid.ell, rho=rho, ell_s=grid.ell_s, q=grid.q)
    assert grid.white == pytest.approx([s[0] for s in settings])
    log_lik, sigma2 = _reml(c, blocks, resid, jac, grid)
    for k, s in enumerate(settings):
        want, want_s2 = _dense_reml(c, runs, resid, jac, *s)
        assert log_lik[k] == pytest.approx(want, abs=1e-8) and sigma2[k] == pytest.approx(want_s2, rel=1e-10)


def _curve(seed: int, slow_sd: float):
    """The law on 300 points to 16k GPU-hours, white noise of sd 0.004 and slow departures of `slow_sd` correlated
    over 8,000 GPU-hours (half the run)."""
    rng = np.random.default_rng(seed)
    c = np.linspace(0, 16_000, 301)
    r = TRUTH(c) + 0.004 * rng.standard_normal(c.size) + wobble(rng, c, slow_sd, 8_000.0)
    return c, r


def test_slow_departures_are_found_where_they_are_and_widen_the_interval_of_A():
    """Slow departures of sd 0.01 over half the run (the law absorbs much of them) on each of 4 runs, against the
    same white noise without them: the fit reports a larger slow part every time, and A's interval is over 1.5 times
    as wide (measured: 1.8 to 6.2 times; slow parts 0.0019-0.0031 against 0.0011-0.0016)."""
    for seed in range(4):
        slow, plain = fit_sigmoid(*_curve(seed, 0.01)), fit_sigmoid(*_curve(seed, 0.0))
        assert slow.noise["sd_slow"] > plain.noise["sd_slow"], seed
        width = lambda f: f.ci["A"][1] - f.ci["A"][0]  # noqa: E731
        assert width(slow) > 1.5 * width(plain), seed


def test_without_slow_departures_the_model_is_the_white_and_wobble_one():
    """slow=False leaves the slow settings out: the grid is the (ell, rho) one alone, and the noise reports none."""
    c, r = _curve(0, 0.01)
    fit = fit_sigmoid(c, r)
    keep = c >= fit.c_min
    e = r[keep] - fit.predict(c[keep])
    jac = np.column_stack([np.ones(keep.sum()), np.log(c[keep])])
    full = estimate(c[keep], np.zeros(keep.sum(), int), e, jac, 0.9)
    fast = estimate(c[keep], np.zeros(keep.sum(), int), e, jac, 0.9, slow=False)
    assert fast.noise.sd_slow == 0.0 and full.noise.sd_slow > 0.0
    # 8 x 8 wobble settings alone; beside each of the 9 slow ones, every other wobble setting (4 x 4)
    assert Settings.grid(10.0, 1000.0, slow=False).q.size == 64 and Settings.grid(10.0, 1000.0).q.size == 64 + 9 * 16
