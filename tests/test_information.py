"""The law's Fisher information (analysis/information.py) against two other forms of the same thing: finite
differences of the law for its derivatives, and the spread of the real fitter's estimates for its covariance."""

import math

import numpy as np
import pytest

from analysis.fit import fit_sigmoid
from analysis.information import continued, covariance, jacobian, ln_compute_gradient, noise_covariance
from analysis.law import sigmoid_law
from analysis.rank import law_compute
from analysis.synthetic import MockNoise, Truth, mock_curve

LAW = (0.61, 1.92, 2542.0, 0.30)


def test_the_jacobian_is_the_laws_derivative():
    c = np.array([300.0, 2542.0, 9000.0])
    jac = jacobian(c, *LAW)
    A, B, C_mid, R0 = LAW
    h = 1e-6
    for k, shifted in enumerate([(A + h, B, C_mid, R0), (A, B * math.exp(h), C_mid, R0),
                                 (A, B, C_mid * math.exp(h), R0), (A, B, C_mid, R0 + h)]):
        assert jac[:, k] == pytest.approx((sigmoid_law(c, *shifted) - sigmoid_law(c, *LAW)) / h, rel=1e-4, abs=1e-8)
    # at C_mid the law is half-way: d/dA = 1/2, and log B does not move it
    assert jac[1, 0] == pytest.approx(0.5) and jac[1, 1] == pytest.approx(0.0, abs=1e-12)


def test_the_gradient_of_the_compute_to_reach_a_reward():
    r, h = 0.5, 1e-6
    A, B, C_mid, R0 = LAW
    base = math.log(float(law_compute(r, *LAW)))
    shifts = [(A + h, B, C_mid, R0), (A, B * math.exp(h), C_mid, R0), (A, B, C_mid * math.exp(h), R0),
              (A, B, C_mid, R0 + h)]
    numeric = [(math.log(float(law_compute(r, *s))) - base) / h for s in shifts]
    assert ln_compute_gradient(LAW, r) == pytest.approx(numeric, rel=1e-4)


def test_the_white_wobble_and_slow_noise_covariance_by_hand():
    noise = {"sd_white": 0.003, "sd_wobble": 0.004, "corr_gpu_hours": 1000.0}
    cov = noise_covariance(np.array([0.0, 1000.0]), noise)
    assert cov == pytest.approx(np.array([[9e-6 + 16e-6, 16e-6 * math.exp(-1)], [16e-6 * math.exp(-1), 25e-6]]))
    # slow departures of sd 0.002 over 4,000 GPU-h: 4e-6 more on the diagonal, 4e-6 exp(-1/4) off it
    slow = noise_covariance(np.array([0.0, 1000.0]), noise | {"sd_slow": 0.002, "corr_slow_gpu_hours": 4000.0})
    assert slow - cov == pytest.approx(np.array([[4e-6, 4e-6 * math.exp(-0.25)], [4e-6 * math.exp(-0.25), 4e-6]]))


def test_a_curve_continued_at_its_own_pace():
    """Points at steps 0, 2, 4 (4 and 9 GPU-h): 2.25 GPU-h a step, a point every 2 steps to step 10."""
    assert continued(np.array([0, 2, 4]), np.array([0.0, 4.0, 9.0]), 10) == pytest.approx(
        [0.0, 4.0, 9.0, 13.5, 18.0, 22.5])


def test_the_gaussian_limit_is_the_real_fitters_spread_of_A():
    """sd of A on the mock's curves (50 steps of 320 GPU-h, 1,000 x 16 answers, its wobble): the Fisher covariance
    (0.0040) against the spread of the fitter's A over 40 runs of one law (their A fixed: the fitter's own noise;
    0.0045 on 150 runs); within a quarter (the fitter's GLS and its Firth correction are not the Gaussian limit's
    least squares). At half the budget the information on A is a sixth (docs/fitting.md#the-adaptive-sweep)."""
    noise = {"sd_white": 0.0034, "sd_wobble": 0.004, "corr_gpu_hours": 1000.0}
    c = np.arange(51) * 320.0
    fisher = math.sqrt(covariance(c, LAW, noise)[0, 0])
    fitted = [fit_sigmoid(*_curve(seed, Truth(*LAW), 50)).A for seed in range(40)]
    assert np.std(fitted) == pytest.approx(fisher, rel=0.25)
    assert 5 < covariance(c[:26], LAW, noise)[0, 0] / covariance(c, LAW, noise)[0, 0] < 8


def _curve(seed: int, truth: Truth, steps: int):
    run = mock_curve(np.random.default_rng([seed, 3]), truth, MockNoise(), steps=steps, run_A=truth.A)
    return run.compute, run.reward
