"""Group-sequential boundaries in information time (analysis/sequential.py): published Lan-DeMets values, exact
spending by the recursion, Monte Carlo Brownian paths, and the predictive probability of a claim at the end."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.sequential import boundaries, crossing_probability, predictive_claim, spent

EQUAL5 = [0.2, 0.4, 0.6, 0.8, 1.0]
UNEQUAL = [0.1, 0.35, 0.5, 0.8, 1.0]
PATHS = 200_000


def _phi(x: float) -> float:
    """Standard normal cdf, independent of scipy."""
    return 0.5 * math.erfc(-x / math.sqrt(2))


def _paths(rng: np.random.Generator, times, drift: float) -> np.ndarray:
    """Z(t_k) of PATHS Brownian paths with mean drift * t, one row per path."""
    t = np.asarray(times)
    dt = np.diff(t, prepend=0.0)
    w = np.cumsum(drift * dt + np.sqrt(dt) * rng.standard_normal((PATHS, t.size)), axis=1)
    return w / np.sqrt(t)


def _first_crossing(z: np.ndarray, bounds) -> np.ndarray:
    """Look (0-based) at which each path first has |Z_k| >= c_k; len(bounds) where it never does."""
    crossed = np.abs(z) >= np.asarray(bounds)[None, :]
    return np.where(crossed.any(axis=1), crossed.argmax(axis=1), len(bounds))


def test_one_look_is_the_fixed_sample_test():
    assert boundaries([1.0], 0.05) == pytest.approx([1.959964], abs=1e-6)
    assert boundaries([1.0], 0.01) == pytest.approx([2.575829], abs=1e-6)


def test_published_lan_demets_obrien_fleming_boundaries():
    # two-sided alpha = 0.05, equally spaced looks (ldbounds / gsDesign sfLDOF with alpha/2 a side)
    assert boundaries([0.5, 1.0], 0.05) == pytest.approx([2.963, 1.969], abs=1e-3)
    assert boundaries(EQUAL5, 0.05) == pytest.approx([4.877, 3.357, 2.680, 2.290, 2.031], abs=1e-3)


def test_spending_function_ends_and_shape():
    assert spent(0.0, 0.05) == 0.0 and spent(-1.0, 0.05) == 0.0
    assert spent(1.0, 0.05) == 0.05 and spent(2.0, 0.05) == 0.05
    # 4 - 4 Phi(z_{0.9875} / sqrt(0.5)), z_{0.9875} = 2.241403
    assert spent(0.5, 0.05) == pytest.approx(4 * _phi(-2.241403 / math.sqrt(0.5)), rel=1e-5)
    ts = np.linspace(0.01, 1.0, 50)
    values = [spent(float(t), 0.05) for t in ts]
    assert np.all(np.diff(values) > 0)
    assert spent(0.999999, 0.05) == pytest.approx(0.05, abs=1e-6)


@pytest.mark.parametrize("times", [EQUAL5, UNEQUAL, [0.5, 1.0], list(np.arange(1, 17) / 16)])
@pytest.mark.parametrize("alpha", [0.05, 0.01, 0.2])
def test_crossing_probability_under_h0_is_the_alpha_spent(times, alpha):
    bounds = boundaries(times, alpha)
    assert crossing_probability(times, bounds, 0.0) == pytest.approx(alpha, abs=1e-5)
    # and look by look: the probability of crossing by look k is spent(t_k)
    for k in range(1, len(times) + 1):
        assert crossing_probability(times[:k], bounds[:k]) == pytest.approx(spent(times[k - 1], alpha), abs=1e-6)


def test_a_last_look_before_full_information_spends_what_is_spent_by_then():
    times = [0.25, 0.5, 0.75]
    bounds = boundaries(times, 0.05)
    assert crossing_probability(times, bounds) == pytest.approx(spent(0.75, 0.05), abs=1e-6)
    assert spent(0.75, 0.05) < 0.05
    assert bounds == pytest.approx(boundaries([0.25, 0.5, 0.75, 1.0], 0.05)[:3], abs=1e-9)  # later looks change nothing


def test_a_look_that_spends_nothing_has_no_boundary():
    bounds = boundaries([1e-4, 0.5, 1.0], 0.05)
    assert bounds[0] == math.inf
    assert bounds[1:] == pytest.approx(boundaries([0.5, 1.0], 0.05), abs=1e-6)  # no crossing: nothing changes
    assert crossing_probability([1e-4, 0.5, 1.0], bounds) == pytest.approx(0.05, abs=1e-6)
    assert crossing_probability([0.5, 1.0], [math.inf, math.inf], drift=5.0) == 0.0


def test_crossing_probability_of_one_look_is_closed_form():
    c, drift = 1.959964, 2.5
    expected = _phi(drift - c) + _phi(-drift - c)
    assert crossing_probability([1.0], [c], drift) == pytest.approx(expected, abs=1e-9)
    # at t = 0.49 the mean of Z is drift * 0.7
    assert crossing_probability([0.49], [c], drift) == pytest.approx(_phi(0.7 * drift - c) + _phi(-0.7 * drift - c))


@pytest.mark.parametrize("times", [EQUAL5, UNEQUAL])
def test_monte_carlo_h0_crossings_match_the_spending(times):
    alpha = 0.05
    bounds = boundaries(times, alpha)
    first = _first_crossing(_paths(np.random.default_rng(11), times, 0.0), bounds)
    rate = np.mean(first < len(times))
    assert abs(rate - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / PATHS)
    # look by look, the share that first crosses at look k is the increment of spending
    before = 0.0
    for k, t in enumerate(times):
        inc = spent(t, alpha) - before
        before += inc
        assert abs(np.mean(first == k) - inc) < 4 * math.sqrt(inc * (1 - inc) / PATHS) + 1e-5


@pytest.mark.parametrize("drift", [1.5, 3.0])
@pytest.mark.parametrize("times", [EQUAL5, UNEQUAL])
def test_monte_carlo_power_under_a_drift(times, drift):
    bounds = boundaries(times, 0.05)
    power = crossing_probability(times, bounds, drift)
    z = _paths(np.random.default_rng(int(drift * 10)), times, drift)
    simulated = np.mean(_first_crossing(z, bounds) < len(times))
    assert abs(power - simulated) < 4 * math.sqrt(power * (1 - power) / PATHS)
    assert crossing_probability(times, bounds, -drift) == pytest.approx(power, abs=1e-9)  # two-sided: symmetric
    assert power > 0.05


def test_predictive_claim_by_hand():
    # z = 0 at t = 0.5: W(1) ~ N(0, 1), so 2 Phi(-c)
    assert predictive_claim(0.0, 0.5, 2.326) == pytest.approx(2 * _phi(-2.326), abs=1e-9)
    assert predictive_claim(0.0, 0.5, 2.326) == pytest.approx(0.0200, abs=1e-4)
    # z = 2 at t = 0.25: W = 1, W/t = 4, s = sqrt(3)
    s = math.sqrt(3)
    assert predictive_claim(2.0, 0.25, 1.96) == pytest.approx(_phi((4 - 1.96) / s) + _phi((-4 - 1.96) / s))
    assert predictive_claim(-2.0, 0.25, 1.96) == predictive_claim(2.0, 0.25, 1.96)


@pytest.mark.parametrize(("z", "t", "c"), [(1.2, 0.3, 1.96), (2.5, 0.6, 2.2), (-0.4, 0.5, 1.0)])
def test_predictive_claim_monte_carlo_from_the_posterior(z, t, c):
    rng = np.random.default_rng(5)
    w = z * math.sqrt(t)
    theta = w / t + rng.standard_normal(PATHS) / math.sqrt(t)
    w1 = w + theta * (1 - t) + math.sqrt(1 - t) * rng.standard_normal(PATHS)
    p = predictive_claim(z, t, c)
    assert abs(np.mean(np.abs(w1) >= c) - p) < 4 * math.sqrt(p * (1 - p) / PATHS)


def test_predictive_claim_monte_carlo_by_conditioning_under_a_wide_flat_prior():
    """Independent of the posterior formula: drifts from a wide uniform prior, paths kept where W(t) is near w."""
    z, t, c = 1.5, 0.4, 1.96
    rng = np.random.default_rng(9)
    n = 4_000_000
    w = z * math.sqrt(t)
    theta = w / t + rng.uniform(-12, 12, n) / math.sqrt(t)  # +-12 posterior sds: flat where the likelihood lives
    wt = theta * t + math.sqrt(t) * rng.standard_normal(n)
    keep = np.abs(wt - w) < 0.01
    w1 = wt[keep] + theta[keep] * (1 - t) + math.sqrt(1 - t) * rng.standard_normal(keep.sum())
    p = predictive_claim(z, t, c)
    assert keep.sum() > 2000
    assert abs(np.mean(np.abs(w1) >= c) - p) < 4 * math.sqrt(p * (1 - p) / keep.sum())


def test_predictive_claim_limits():
    assert predictive_claim(2.0, 1.0, 1.96) == 1.0
    assert predictive_claim(1.9, 1.0, 1.96) == 0.0
    assert predictive_claim(-1.96, 1.5, 1.96) == 1.0
    assert predictive_claim(2.1, 1 - 1e-9, 1.96) == pytest.approx(1.0, abs=1e-6)
    assert predictive_claim(1.8, 1 - 1e-9, 1.96) == pytest.approx(0.0, abs=1e-6)
    # at the boundary itself it is a coin toss at the end
    assert predictive_claim(1.96, 1 - 1e-9, 1.96) == pytest.approx(0.5, abs=1e-3)
    for bad in (0.0, -0.5, math.nan):
        with pytest.raises(ValueError, match="information fraction"):
            predictive_claim(1.0, bad, 1.96)


@pytest.mark.parametrize(("times", "match"), [
    ([0.5, 0.3, 1.0], "strictly increasing"),
    ([0.5, 0.5, 1.0], "strictly increasing"),
    ([0.0, 0.5, 1.0], r"in \(0, 1\]"),
    ([-0.2, 1.0], r"in \(0, 1\]"),
    ([0.5, 1.2], r"in \(0, 1\]"),
    ([0.5, math.nan], r"in \(0, 1\]"),
    ([], "non-empty"),
])
def test_bad_times_are_refused(times, match):
    with pytest.raises(ValueError, match=match):
        boundaries(times, 0.05)
    with pytest.raises(ValueError, match=match):
        crossing_probability(times, [2.0] * len(times))


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.05, 1.5, math.nan])
def test_bad_alpha_is_refused(alpha):
    with pytest.raises(ValueError, match="alpha"):
        boundaries([0.5, 1.0], alpha)
    with pytest.raises(ValueError, match="alpha"):
        spent(0.5, alpha)


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="one value per look"):
        crossing_probability([0.5, 1.0], [2.0])
    with pytest.raises(ValueError, match="positive"):
        crossing_probability([0.5, 1.0], [-1.0, 2.0])
    with pytest.raises(ValueError, match="drift"):
        crossing_probability([0.5, 1.0], [3.0, 2.0], math.inf)
