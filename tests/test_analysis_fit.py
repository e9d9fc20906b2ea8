"""The sigmoid law (ScaleRL Eq. 1) and its fitter: recovery, intervals, seeds, degenerate input, the paper's
procedure, extrapolation and the power law, and `python -m analysis fit --json`."""

import json
import math

import numpy as np
import pytest

from analysis import FitError, SigmoidFit, fit_runs, fit_sigmoid
from analysis.__main__ import main as cli
from analysis.extrapolate import extrapolation_check, fit_power_law
from analysis.fit import sigmoid_law
from analysis.synthetic import Truth, benchmark_curves, make_curve

# ScaleRL's own fit (paper Table 1), R0 made up; compute 0..16,000 GPU-hours every 200 as in the LOO runs.
TRUTH = dict(A=0.61, B=1.9, C_mid=2542.0, R0=0.3)
COMPUTE = np.arange(0.0, 16001.0, 200.0)
N_SAMPLES = 16_000  # validation answers per point: 1,000 prompts x 16


def noisy_curve(seed: int, compute=COMPUTE, wobble_sd: float = 0.0) -> np.ndarray:
    """Binomial noise of N_SAMPLES answers per point (the step-0 point, R0, included), optionally the mock's
    slow wobble (sd `wobble_sd`, correlated over 1,000 GPU-hours)."""
    curve = make_curve(np.random.default_rng(seed), Truth(**TRUTH), c_max=float(compute.max()),
                       every=float(compute[1] - compute[0]), wobble_sd=wobble_sd)
    return curve.reward


def test_recovers_noiseless_parameters():
    fit = fit_sigmoid(COMPUTE, sigmoid_law(COMPUTE, **TRUTH))
    assert fit.ok and fit.method == "fast"
    for name in ("A", "B", "C_mid"):
        assert getattr(fit, name) == pytest.approx(TRUTH[name], rel=1e-3)
        lo, hi = fit.ci[name]
        assert lo <= TRUTH[name] <= hi and hi - lo < 1e-3 * TRUTH[name]  # noiseless: a (near) point
    assert fit.R0 == pytest.approx(0.3, abs=1e-9)  # measured at C = 0; the fit moves it within its error: nil
    # default c_min = 1.5/16 * 16000 = 1500: the points 1600, 1800, ..., 16000 are fitted
    assert fit.c_min == pytest.approx(1500.0)
    assert fit.n_points == 73
    assert fit.r2 == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("wobble_sd", [0.0, 0.004])
def test_recovers_noisy_parameters_inside_their_intervals(wobble_sd):
    fit = fit_sigmoid(COMPUTE, noisy_curve(seed=0, wobble_sd=wobble_sd))
    assert fit.A == pytest.approx(TRUTH["A"], abs=0.01)
    assert fit.B == pytest.approx(TRUTH["B"], rel=0.15)
    assert fit.C_mid == pytest.approx(TRUTH["C_mid"], rel=0.1)
    for name in ("A", "B", "C_mid"):
        lo, hi = fit.ci[name]
        assert lo < getattr(fit, name) < hi
        assert lo <= TRUTH[name] <= hi, name
    assert fit.ci["A"][1] - fit.ci["A"][0] < 0.03  # informative, not just wide
    assert fit.noise["sd_white"] > 0


def test_interval_coverage_on_the_benchmark_noise():
    """100 curves of the benchmark (random truths, binomial noise plus the slow wobble): each 90% interval holds
    the truth 80-97% of the time (binomial sd 3 points). Intervals that ignore the wobble's correlation cover
    ~65% here; a 1-sigma interval ~68%."""
    curves = benchmark_curves(100, seed=123)
    hits = {name: 0 for name in ("A", "B", "C_mid")}
    for curve in curves:
        fit = fit_sigmoid(curve.compute, curve.reward)
        for name in hits:
            lo, hi = fit.ci[name]
            hits[name] += lo <= getattr(curve.truth, name) <= hi
    for name, k in hits.items():
        assert 0.80 <= k / len(curves) <= 0.97, (name, k)


def test_interval_of_A_widens_when_the_curve_stops_before_its_midpoint():
    reward = noisy_curve(seed=0, wobble_sd=0.004)
    early = COMPUTE <= 0.8 * TRUTH["C_mid"]
    full = fit_sigmoid(COMPUTE, reward)
    short = fit_sigmoid(COMPUTE[early], reward[early], c_min=1000.0)
    width_full = full.ci["A"][1] - full.ci["A"][0]
    width_short = short.ci["A"][1] - short.ci["A"][0]
    assert width_short > 10 * width_full
    assert short.ci["A"][0] <= TRUTH["A"] <= short.ci["A"][1]
    assert "data stop before C_mid: A is extrapolated" in short.notes or short.ci["A"][1] == 1.0


def test_unidentified_ceiling_gets_an_open_bound_not_a_confident_interval():
    """A straight line never saturates: nothing bounds A from above, so its interval must reach 1."""
    rng = np.random.default_rng(1)
    reward = 0.3 + 0.2 * COMPUTE / COMPUTE.max() + rng.normal(0, 0.004, COMPUTE.size)
    reward[0] = 0.3
    fit = fit_sigmoid(COMPUTE, reward)
    assert fit.ok
    assert fit.ci["A"][1] == 1.0
    assert "A not bounded by the data (interval open up to 1)" in fit.notes


def test_a_dip_is_pulled_in_to_three_robust_sd_and_nothing_else_moves():
    """By hand: residuals cycling +0.01, -0.01, 0 have median 0 and median absolute deviation 0.01, so the robust sd is
    1.4826 x 0.01; a point 0.2 below the curve is moved to 3 x 0.014826 = 0.0445 below it; every other point stays."""
    from analysis.posterior import _prior_box, _pull_in_outliers

    c = COMPUTE[COMPUTE >= 1500]
    truth = sigmoid_law(c, **TRUTH)
    r = truth + np.resize([0.01, -0.01, 0.0], c.size)
    r[41] -= 0.2  # a point whose residual was 0 (41 % 3 == 2)
    pulled, n, _ = _pull_in_outliers(np.log(c), r, TRUTH["R0"], _prior_box(c), None, None)
    assert n == 1
    np.testing.assert_array_equal(np.delete(pulled, 41), np.delete(r, 41))
    assert pulled[41] - truth[41] == pytest.approx(-3 * 1.4826 * 0.01, abs=2e-3)
    # a clean curve (binomial noise) and a noiseless one: nothing pulled, the points as they were
    for clean in (noisy_curve(0)[COMPUTE >= 1500], truth):
        same, n, _ = _pull_in_outliers(np.log(c), clean, TRUTH["R0"], _prior_box(c), None, None)
        assert n == 0 and same is clean


def test_a_dip_moves_neither_A_nor_its_interval(monkeypatch):
    """One point 0.08 below a curve whose noise is 0.004 (20 sd): pulled in, the fit is the clean curve's to 0.002 in
    A with an interval as narrow; left as it is (OUTLIER_SD = inf, least squares and a Gaussian noise model), it
    doubles the A interval and the noise estimate."""
    from analysis import posterior

    r = noisy_curve(0)
    dipped = r.copy()
    dipped[60] -= 0.08
    clean, fit = fit_sigmoid(COMPUTE, r), fit_sigmoid(COMPUTE, dipped)
    width = lambda f: f.ci["A"][1] - f.ci["A"][0]  # noqa: E731
    assert fit.A == pytest.approx(clean.A, abs=0.002) and width(fit) < 1.15 * width(clean)
    assert any("1 point more than 3 robust sd off the curve" in note for note in fit.notes)
    assert not any("pulled in" in note for note in clean.notes)
    monkeypatch.setattr(posterior, "OUTLIER_SD", math.inf)
    plain = fit_sigmoid(COMPUTE, dipped)
    assert width(plain) > 1.8 * width(clean) and plain.noise["sd_white"] > 1.8 * clean.noise["sd_white"]


def test_predict_reproduces_the_law_at_hand_computed_points():
    fit = SigmoidFit(A=0.61, B=2.0, C_mid=2000.0, R0=0.3)
    # C = 0: (C_mid / C)^B is infinite, R = R0 = 0.3
    # C = C_mid: (1)^B = 1, R = R0 + (A - R0) / 2 = 0.3 + 0.31 / 2 = 0.455
    # C = 2 C_mid: (1/2)^2 = 0.25, R = 0.3 + 0.31 / 1.25 = 0.548
    # C = C_mid / 2: 2^2 = 4, R = 0.3 + 0.31 / 5 = 0.362
    # C = 1e12: (2e-9)^2 ~ 0, R = A = 0.61
    got = fit.predict([0.0, 2000.0, 4000.0, 1000.0, 1e12])
    np.testing.assert_allclose(got, [0.3, 0.455, 0.548, 0.362, 0.61], rtol=1e-12, atol=1e-12)


def test_predict_interval_brackets_the_law():
    fit = fit_sigmoid(COMPUTE, noisy_curve(seed=3, wobble_sd=0.004))
    grid = np.array([2000.0, 8000.0, 16000.0, 32000.0])
    lo, hi = fit.predict_interval(grid)
    truth = sigmoid_law(grid, **TRUTH)
    assert (lo < fit.predict(grid)).all() and (fit.predict(grid) < hi).all()
    assert (lo <= truth).all() and (truth <= hi).all()
    assert (hi - lo)[-1] > (hi - lo)[1]  # wider where it extrapolates


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


def test_seeds_of_one_variant_are_fitted_together():
    seeds = [(COMPUTE, noisy_curve(seed, wobble_sd=0.004)) for seed in (10, 11, 12)]
    pooled = fit_runs(seeds)
    single = fit_sigmoid(*seeds[0])
    assert pooled.n_runs == 3 and pooled.n_points == 3 * 73
    # R0 is measured by the mean of the step-0 points (binomial sd 0.0036 each, 0.0021 for three): the fit moves it
    # within that error
    assert pooled.R0 == pytest.approx(np.mean([r[0] for _, r in seeds]), abs=3 * 0.0036 / math.sqrt(3))
    width_pooled, width_single = (f.ci["A"][1] - f.ci["A"][0] for f in (pooled, single))
    assert width_pooled < width_single
    assert pooled.ci["A"][0] <= TRUTH["A"] <= pooled.ci["A"][1]
    # the same through fit_sigmoid with run labels, in any order of the points
    c = np.concatenate([s[0] for s in seeds])
    r = np.concatenate([s[1] for s in seeds])
    labels = np.repeat(["a", "b", "c"], COMPUTE.size)
    order = np.random.default_rng(0).permutation(c.size)
    again = fit_sigmoid(c[order], r[order], runs=labels[order])
    assert again.A == pytest.approx(pooled.A, abs=1e-9) and again.ci == pooled.ci


def test_fixed_A_refit():
    reward = noisy_curve(seed=4, wobble_sd=0.004)
    fit = fit_sigmoid(COMPUTE, reward, A=0.6)
    assert fit.A == 0.6 and fit.ci["A"] == (0.6, 0.6) and fit.method == "fixed-A"
    assert fit.B > 0 and fit.ci["B"][0] < fit.B < fit.ci["B"][1]
    with pytest.raises(FitError, match="fixed A"):
        fit_sigmoid(COMPUTE, reward, A=0.2)  # below R0


def diverged() -> np.ndarray:
    reward = sigmoid_law(COMPUTE, **TRUTH)
    return np.where(COMPUTE >= 12000, 0.12, reward)  # collapses at 12k GPU-hours


@pytest.mark.parametrize(
    "compute, reward, reason",
    [
        ([0.0, 4000.0, 8000.0, 16000.0], [0.3, 0.5, 0.58, 0.6], "too few points"),  # 3 points >= c_min
        ([0.0, 200.0], [0.3, 0.31], "too few points"),
        (COMPUTE, np.where(COMPUTE == 4000, np.nan, sigmoid_law(COMPUTE, **TRUTH)), "non-finite"),
        (np.where(COMPUTE == 4000, np.inf, COMPUTE), sigmoid_law(COMPUTE, **TRUTH), "non-finite"),
        (COMPUTE, np.where(COMPUTE >= 9000, np.nan, sigmoid_law(COMPUTE, **TRUTH)), "from 9,000 GPU-hours on"),
        (COMPUTE, np.full(COMPUTE.size, 0.3), "flat"),
        (COMPUTE, 0.5 - 0.2 * COMPUTE / COMPUTE.max(), "falling"),
        (COMPUTE, np.where(COMPUTE > 0, 0.25, 0.3), "no gain"),
        (COMPUTE, diverged(), "diverged"),
        (COMPUTE, np.where(COMPUTE == 4000, 1.5, sigmoid_law(COMPUTE, **TRUTH)), "outside [0, 1]"),
        ([], [], "too few points"),
    ],
    ids=["three-points", "two-points", "nan", "inf", "nan-tail", "flat", "falling", "below-R0", "diverged",
         "above-1", "empty"],
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
    assert np.isnan(fit.predict_interval([1.0])[0]).all()


def test_the_papers_procedure_as_a_method():
    """Grid over A (step 0.005) and C_mid (100 values in [100, 40000]), B by curve_fit: on a noiseless curve it
    lands on the grid points nearest the truth; it reports no intervals."""
    reward = sigmoid_law(COMPUTE, **TRUTH)
    fit = fit_sigmoid(COMPUTE, reward, method="paper")
    assert fit.method == "paper" and fit.ok
    assert fit.A == pytest.approx(0.61, abs=0.0025)
    assert abs(fit.C_mid - TRUTH["C_mid"]) <= (40000 - 100) / 99 / 2 + 1e-6
    assert fit.B == pytest.approx(TRUTH["B"], rel=0.1)
    assert all(math.isnan(lo) and math.isnan(hi) for lo, hi in fit.ci.values())
    with pytest.raises(ValueError, match="method"):
        fit_sigmoid(COMPUTE, reward, method="magic")


def test_extrapolation_from_half_the_compute():
    reward = noisy_curve(seed=5, wobble_sd=0.004)
    check = extrapolation_check(COMPUTE, reward)  # fit on C <= 8000 (from 1500), predict the last 5%
    assert check.ok and check.c_fit == 8000.0 and check.c_end == 16000.0
    assert check.sigmoid.c_max == 8000.0 and check.sigmoid.c_min == pytest.approx(1500.0)
    truth_end = float(sigmoid_law(check.end_compute, **TRUTH).mean())
    assert check.predicted == pytest.approx(truth_end, abs=0.02)
    assert check.predicted_ci[0] <= truth_end <= check.predicted_ci[1]
    assert check.predicted_ci[0] < check.predicted < check.predicted_ci[1] and check.covered
    assert abs(check.error) < 0.03
    # the power law beside it: fitted to the same points, a ceiling above the sigmoid's
    assert check.power.ok and check.power.A > check.sigmoid.A


def test_the_predicted_end_by_hand():
    """A fit whose every posterior draw is the law itself (no uncertainty of the law): the prediction of the mean of
    4 end points 1,000 GPU-h apart is the law's mean there, and its 90% interval +-1.645 sd with sd^2 the noise of
    that mean plus the drift: white 0.004 (sd^2 / 4 = 4e-6), a wobble of 0.003 over 1,000 GPU-h (9e-6 x the mean of
    exp(-|i - j|): (4 + 6e^-1 + 4e^-2 + 2e^-3) / 16) and the drift of DRIFT a doubling, here log2(16,000 / 8,000) = 1
    at the last point, log2 of 13/8 to 16/8 averaged over the four)."""
    import math

    from analysis.extrapolate import DRIFT, predicted_end

    law = dict(A=0.61, B=1.9, C_mid=2542.0, R0=0.3)
    draws = np.tile([law["A"], law["B"], law["C_mid"], law["R0"]], (200, 1))
    fit = SigmoidFit(**law, c_max=8000.0, noise={"sd_white": 0.004, "sd_wobble": 0.003, "corr_gpu_hours": 1000.0},
                     draws=draws)
    end = np.array([13000.0, 14000.0, 15000.0, 16000.0])
    mid, (lo, hi) = predicted_end(fit, end)
    assert mid == pytest.approx(float(sigmoid_law(end, **law).mean()), abs=1e-9)
    wobble = 9e-6 * (4 + 6 * math.exp(-1) + 4 * math.exp(-2) + 2 * math.exp(-3)) / 16
    drift = DRIFT * float(np.mean(np.log2(end / 8000.0)))
    sd = math.sqrt(16e-6 / 4 + wobble + drift**2)
    assert (lo, hi) == pytest.approx((mid - 1.6448536 * sd, mid + 1.6448536 * sd), abs=1e-6)
    # no drift inside the data: points at or before the fit's last compute carry only the noise
    _, (lo_in, hi_in) = predicted_end(fit, np.array([5000.0, 6000.0, 7000.0, 8000.0]))
    assert (hi_in - lo_in) / 2 / 1.6448536 == pytest.approx(math.sqrt(16e-6 / 4 + wobble), rel=1e-5)


def test_the_prediction_is_the_median_of_what_the_draws_predict_not_the_law_at_the_estimate():
    """A fit at A 0.60 whose posterior draws sit at A 0.62 (half) and 0.64 (half), a noiseless end point inside the
    data (no drift): the prediction is the draws' median, halfway between their two values, and the interval runs
    from one to the other; the law at the estimate (0.60) would lie outside it."""
    from analysis.extrapolate import predicted_end

    law = dict(B=1.9, C_mid=2542.0, R0=0.3)
    draws = np.array([[A, law["B"], law["C_mid"], law["R0"]] for A in [0.62] * 100 + [0.64] * 100])
    fit = SigmoidFit(A=0.60, **law, c_max=16000.0, noise={"sd_white": 0.0}, draws=draws)
    end = np.array([16000.0])
    at = {A: float(sigmoid_law(end, A=A, **law)[0]) for A in (0.60, 0.62, 0.64)}
    mid, (lo, hi) = predicted_end(fit, end)
    assert mid == pytest.approx((at[0.62] + at[0.64]) / 2) and (lo, hi) == pytest.approx((at[0.62], at[0.64]))
    assert not lo <= at[0.60] <= hi


def test_power_law_recovers_a_power_law():
    c = np.arange(1000.0, 50001.0, 500.0)
    r = 0.9 - 3.0 * c**-0.5
    fit = fit_power_law(c, r, c_min=0.0)
    assert fit.ok
    assert fit.A == pytest.approx(0.9, abs=1e-4) and fit.B == pytest.approx(0.5, rel=1e-3)
    np.testing.assert_allclose(fit.predict(c), r, atol=1e-6)


def test_extrapolation_of_a_degenerate_run_reports_why():
    check = extrapolation_check([0.0, 1000.0, 2000.0], [0.3, 0.31, 0.32])
    assert not check.ok and "early fit failed" in check.status


def test_cli_fit_json(tmp_path, capsys):
    reward = noisy_curve(seed=6, wobble_sd=0.004)
    path = tmp_path / "curve.json"
    path.write_text(json.dumps({"compute": COMPUTE.tolist(), "reward": reward.tolist()}))
    assert cli(["fit", "--json", str(path), "--extrapolate", "0.5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "ok" and out["A"] == pytest.approx(0.61, abs=0.01)
    assert out["ci_level"] == 0.9 and out["ci"]["A"][0] < out["A"] < out["ci"]["A"][1]
    assert out["extrapolation"]["status"] == "ok" and out["extrapolation"]["power_law"]["A"] > 0

    path.write_text(json.dumps({"compute": [0, 1000, 2000], "reward": [0.3, 0.31, 0.32], "r0": 0.3}))
    assert cli(["fit", "--json", str(path)]) == 1  # could not be fitted: the JSON says why
    out = json.loads(capsys.readouterr().out)
    assert out["status"].startswith("too few points") and out["A"] is None

    path.write_text("{not json")
    assert cli(["fit", "--json", str(path)]) == 2
    assert "error:" in capsys.readouterr().err


def test_cli_fit_of_a_clean_8_point_curve_says_what_c_min_does(tmp_path, capsys):
    """Points doubling in compute: the default c_min (1.5/16 of 6,400 = 600) leaves 4 (800-6,400), one short. The
    rejection says why and what to do; --help says what c_min is; "c_min": 0 fits all 7 points after C = 0."""
    compute = [0.0, 100.0, 200.0, 400.0, 800.0, 1600.0, 3200.0, 6400.0]
    reward = sigmoid_law(np.array(compute), 0.61, 1.9, 1200.0, 0.3).tolist()
    path = tmp_path / "curve.json"
    path.write_text(json.dumps({"compute": compute, "reward": reward}))
    assert cli(["fit", "--json", str(path)]) == 1
    status = json.loads(capsys.readouterr().out)["status"]
    assert status.startswith("too few points: 4 at compute >= c_min=600 (need 5); c_min defaults to 0.09375 (1.5/16)")
    assert "c_min=0 keeps every point" in status

    path.write_text(json.dumps({"compute": compute, "reward": reward, "c_min": 0}))
    assert cli(["fit", "--json", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_points"] == 7 and out["A"] == pytest.approx(0.61, abs=1e-3) and out["c_min"] == 0

    with pytest.raises(SystemExit):
        cli(["fit", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert '"c_min" (default 1.5/16 of the largest compute; 0 keeps every point)' in help_text
