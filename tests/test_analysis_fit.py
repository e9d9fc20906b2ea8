"""The sigmoid law (ScaleRL Eq. 1) and its fitter: recovery, intervals, predict, degenerate input."""

import math

import numpy as np
import pytest

from analysis import FitError, SigmoidFit, fit_sigmoid
from analysis.fit import sigmoid_law

# ScaleRL's own fit (paper Table 1), R0 made up; compute 0..16,000 GPU-hours every 200 as in the LOO runs.
TRUTH = dict(A=0.61, B=1.9, C_mid=2542.0, R0=0.3)
COMPUTE = np.arange(0.0, 16001.0, 200.0)
N_SAMPLES = 16_000  # validation answers per point: 1,000 prompts x 16


def noisy_curve(seed: int, compute=COMPUTE) -> np.ndarray:
    """Binomial noise of N_SAMPLES answers per point, the step-0 point (R0) included."""
    rng = np.random.default_rng(seed)
    return rng.binomial(N_SAMPLES, sigmoid_law(compute, **TRUTH)) / N_SAMPLES


def test_recovers_noiseless_parameters():
    fit = fit_sigmoid(COMPUTE, sigmoid_law(COMPUTE, **TRUTH))
    assert fit.ok
    for name in ("A", "B", "C_mid"):
        assert getattr(fit, name) == pytest.approx(TRUTH[name], rel=1e-3)
    assert fit.R0 == 0.3  # taken from the point at C = 0, not fitted
    # default c_min = 1.5/16 * 16000 = 1500: the points 1600, 1800, ..., 16000 are fitted
    assert fit.c_min == pytest.approx(1500.0)
    assert fit.n_points == 73
    assert fit.r2 == pytest.approx(1.0, abs=1e-9)


def test_recovers_noisy_parameters_inside_their_intervals():
    fit = fit_sigmoid(COMPUTE, noisy_curve(seed=0))
    assert fit.A == pytest.approx(TRUTH["A"], abs=0.01)
    assert fit.B == pytest.approx(TRUTH["B"], rel=0.15)
    assert fit.C_mid == pytest.approx(TRUTH["C_mid"], rel=0.1)
    for name in ("A", "B", "C_mid"):
        lo, hi = fit.ci[name]
        assert lo < getattr(fit, name) < hi
        assert lo <= TRUTH[name] <= hi, name
    assert fit.ci["A"][1] - fit.ci["A"][0] < 0.02  # informative, not just wide


def test_interval_coverage_is_near_nominal():
    """Over 100 noisy replicas, each 90% interval holds the truth 80-97% of the time (binomial sd ~3%).
    A 1-sigma interval (68%) or an interval blown up by a wrong covariance (~100%) fails this."""
    hits = {name: 0 for name in ("A", "B", "C_mid")}
    n = 100
    for seed in range(n):
        fit = fit_sigmoid(COMPUTE, noisy_curve(seed))
        for name in hits:
            lo, hi = fit.ci[name]
            hits[name] += lo <= TRUTH[name] <= hi
    for name, k in hits.items():
        assert 0.80 <= k / n <= 0.97, (name, k)


def test_interval_of_A_widens_when_the_curve_stops_before_its_midpoint():
    reward = noisy_curve(seed=0)
    early = COMPUTE <= 0.6 * TRUTH["C_mid"]
    full = fit_sigmoid(COMPUTE, reward)
    short = fit_sigmoid(COMPUTE[early], reward[early])
    width_full = full.ci["A"][1] - full.ci["A"][0]
    width_short = short.ci["A"][1] - short.ci["A"][0]
    assert width_short > 10 * width_full


def test_unidentified_ceiling_gets_open_bounds_not_a_confident_interval():
    """A straight line never saturates: A runs to its bound 1, and its interval must reach 1."""
    rng = np.random.default_rng(1)
    reward = 0.3 + 0.2 * COMPUTE / COMPUTE.max() + rng.normal(0, 0.004, COMPUTE.size)
    reward[0] = 0.3
    fit = fit_sigmoid(COMPUTE, reward)
    assert fit.ok
    assert fit.ci["A"][1] == 1.0
    assert fit.ci["A"][0] < 0.7
    assert "A on its upper bound" in fit.notes


def test_predict_reproduces_the_law_at_hand_computed_points():
    fit = SigmoidFit(A=0.61, B=2.0, C_mid=2000.0, R0=0.3)
    # C = 0: (C_mid / C)^B is infinite, R = R0 = 0.3
    # C = C_mid: (1)^B = 1, R = R0 + (A - R0) / 2 = 0.3 + 0.31 / 2 = 0.455
    # C = 2 C_mid: (1/2)^2 = 0.25, R = 0.3 + 0.31 / 1.25 = 0.548
    # C = C_mid / 2: 2^2 = 4, R = 0.3 + 0.31 / 5 = 0.362
    # C = 1e12: (2e-9)^2 ~ 0, R = A = 0.61
    got = fit.predict([0.0, 2000.0, 4000.0, 1000.0, 1e12])
    np.testing.assert_allclose(got, [0.3, 0.455, 0.548, 0.362, 0.61], rtol=1e-12, atol=1e-12)


def test_r0_from_argument_and_missing_r0_is_an_error():
    reward = sigmoid_law(COMPUTE, **TRUTH)
    no_zero = COMPUTE > 0
    with pytest.raises(FitError, match="R0"):
        fit_sigmoid(COMPUTE[no_zero], reward[no_zero])
    fit = fit_sigmoid(COMPUTE[no_zero], reward[no_zero], r0=0.3)
    assert fit.R0 == 0.3 and fit.A == pytest.approx(0.61, rel=1e-3)


def test_c_min_leaves_out_early_points():
    reward = sigmoid_law(COMPUTE, **TRUTH)
    fit = fit_sigmoid(COMPUTE, reward, c_min=8000.0)
    assert fit.n_points == 41  # 8000, 8200, ..., 16000
    assert fit.c_min == 8000.0


@pytest.mark.parametrize(
    "compute, reward, reason",
    [
        ([0.0, 4000.0, 8000.0, 16000.0], [0.3, 0.5, 0.58, 0.6], "too few points"),  # 3 points >= c_min
        ([0.0, 200.0], [0.3, 0.31], "too few points"),
        (COMPUTE, np.where(COMPUTE == 4000, np.nan, sigmoid_law(COMPUTE, **TRUTH)), "non-finite"),
        (np.where(COMPUTE == 4000, np.inf, COMPUTE), sigmoid_law(COMPUTE, **TRUTH), "non-finite"),
        (COMPUTE, np.full(COMPUTE.size, 0.3), "flat"),
        (COMPUTE, 0.5 - 0.2 * COMPUTE / COMPUTE.max(), "falling"),
        (COMPUTE, np.where(COMPUTE > 0, 0.25, 0.3), "no gain"),
    ],
    ids=["three-points", "two-points", "nan", "inf", "flat", "falling", "below-R0"],
)
def test_degenerate_input_raises_fit_error_with_a_reason(compute, reward, reason):
    with pytest.raises(FitError) as info:
        fit_sigmoid(compute, reward)
    assert reason in info.value.reason
    assert isinstance(info.value, ValueError)


def test_failed_fit_record_predicts_nan():
    fit = SigmoidFit.failed("flat curve")
    assert not fit.ok and fit.status == "flat curve"
    assert math.isnan(fit.A) and np.isnan(fit.predict([1.0, 2.0])).all()
