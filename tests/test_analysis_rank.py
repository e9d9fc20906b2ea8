"""The ranking rule (A first; overlapping A intervals: a tie, compared on B at a common A unless the data fit one
poorly; ties on B share a rank; failed fits last), the verdicts against the base recipe, and their resolution."""

import math

import numpy as np
import pytest

from analysis import SigmoidFit
from analysis.fit import prepare
from analysis.joint import CommonAFit, fit_common_A
from analysis.posterior import fit_state
from analysis.fit import sigmoid_law
from analysis.rank import (BOTH, COMMON_A, CRITICAL, MOVES_A, MOVES_B, MOVES_C, NO_CHANGE, OWN_FITS, claim,
                           law_compute, rank_fits, resolution, verdict)
from analysis.synthetic import Truth, make_curve


def fit(A, B, a_half=0.005, b_half=0.2):
    return SigmoidFit(A=A, B=B, C_mid=2500.0, R0=0.3,
                      ci={"A": (A - a_half, A + a_half), "B": (B - b_half, B + b_half), "C_mid": (2000.0, 3000.0)})


def test_overlapping_A_is_ordered_by_b():
    ranked = rank_fits([("high-A-low-B", fit(0.610, 1.5)), ("low-A-high-B", fit(0.603, 2.1))])
    assert [r.name for r in ranked] == ["low-A-high-B", "high-A-low-B"]
    assert [r.rank for r in ranked] == [1, 2]
    assert ranked[0].note == "tie on A with high-A-low-B (ranked by their own B)"  # no data: the fits' own B
    assert ranked[1].note == "tie on A with low-A-high-B (ranked by their own B)"


def test_distinct_a_is_ordered_by_a_whatever_b_even_within_002():
    # 0.01 apart, inside the paper's 0.02, but the intervals (+-0.003) do not overlap: the A values differ
    ranked = rank_fits([("low", fit(0.60, 3.0, a_half=0.003)), ("high", fit(0.61, 1.0, a_half=0.003))])
    assert [r.name for r in ranked] == ["high", "low"]
    assert all(r.note == "" for r in ranked)


def test_overlapping_intervals_on_A_are_a_tie_beyond_002():
    # 0.04 apart, but the first curve stopped early: its interval on A reaches down to the other's
    loose = fit(0.63, 1.2, a_half=0.06)
    ranked = rank_fits([("loose", loose), ("tight", fit(0.59, 2.0))])
    assert [r.name for r in ranked] == ["tight", "loose"]
    assert ranked[0].tie_with == ("loose",)


def test_tie_groups_are_anchored_on_the_best_a_and_do_not_chain():
    # c [0.620, 0.640] and b [0.605, 0.625] overlap: a tie; a [0.595, 0.605] touches b but not the anchor c: its
    # own group, ranked after, although it has the highest B.
    fits = [("a", fit(0.600, 3.0)), ("b", fit(0.615, 2.0, a_half=0.01)), ("c", fit(0.630, 1.0, a_half=0.01))]
    ranked = rank_fits(fits)
    assert [r.name for r in ranked] == ["b", "c", "a"]
    assert ranked[2].tie_with == ()


def test_ties_on_B_share_a_rank():
    ranked = rank_fits([("x", fit(0.61, 2.0)), ("y", fit(0.605, 1.9)), ("z", fit(0.60, 1.2, a_half=0.006))])
    assert [(r.rank, r.name) for r in ranked] == [(1, "x"), (1, "y"), (3, "z")]
    assert ranked[0].b_tie_with == ("y",) and "tie on B with y" in ranked[0].note
    assert ranked[2].b_tie_with == ()


def test_failed_fits_rank_last_without_a_number():
    ranked = rank_fits([("broken", SigmoidFit.failed("too few points")), ("x", fit(0.5, 1.0)), ("y", fit(0.6, 1.0))])
    assert [(r.rank, r.name) for r in ranked] == [(1, "y"), (2, "x"), (None, "broken")]
    assert ranked[-1].fit.status == "too few points"


# --- the resolution of a comparison -----------------------------------------------------------------------------


def test_resolution_by_hand():
    """Two intervals of half-width 0.005: their difference has sd sqrt(2) 0.005 / 1.6449 = 0.0042990; the z-test at
    2.3263 (two-sided 0.02) finds a change 9 times in 10 at (2.3263 + 1.2816) x 0.0042990 = 0.015510: the estimates
    0.01 apart is z = 2.3263, the two intervals just touching, as the old rule "intervals apart" had it."""
    assert CRITICAL == pytest.approx(2.32635, abs=1e-5)
    assert resolution(0.60, (0.595, 0.605), 0.61, (0.605, 0.615), top=1.0) == pytest.approx(0.015510, abs=2e-6)
    # lopsided: downwards the facing sides are 0.002 (above x) and 0.008 (below the base): sd hypot(0.002, 0.008) /
    # 1.6449 = 0.0050132, so 3.6079 x 0.0050132 = 0.018087; upwards 0.004 and 0.004: 0.012407. The larger.
    assert resolution(0.60, (0.596, 0.602), 0.61, (0.602, 0.614), top=1.0) == pytest.approx(0.018087, abs=2e-6)
    # the z-test is the level the intervals' overlap had only for equal widths: 0.0085 apart, facing sides 0.0005 and
    # 0.0075 (just apart, 0.0005 to spare), sd hypot(0.0005, 0.0075) / 1.6449 = 0.0045697, z = 1.86 < 2.33: no claim
    lopsided = claim(0.6015, (0.5900, 0.6020), 0.61, (0.6025, 0.6200), top=1.0)
    assert lopsided.z == pytest.approx(-0.0085 / 0.0045697, abs=1e-3) and not lopsided.moved
    assert claim(0.600, (0.595, 0.605), 0.6101, (0.6051, 0.6151), top=1.0).moved  # equal widths, apart: z 2.35
    # a side that reaches the parameter's open bound is not resolved: A up to 1, B up to infinity or down to 0
    assert resolution(0.60, (0.59, 1.0), 0.61, (0.605, 0.615), top=1.0) == math.inf
    assert resolution(1.9, (1.5, math.inf), 2.0, (1.8, 2.2)) == math.inf
    assert resolution(1.9, (0.0, 2.1), 2.0, (1.8, 2.2)) == math.inf


# --- verdicts from fits alone ----------------------------------------------------------------------------------


def test_a_moved_below_002_is_small_and_b_is_compared_on_own_fits():
    """Issue 13's loo-npr: A intervals [0.594, 0.605] vs [0.613, 0.621] apart, 0.0125 lower: A moved (small); no
    common-A refit is even asked for (it would turn the A drop into a B drop)."""
    base = SigmoidFit(A=0.617, B=1.90, C_mid=2542.0, R0=0.3,
                      ci={"A": (0.613, 0.621), "B": (1.7, 2.1), "C_mid": (2300.0, 2800.0)})
    npr = SigmoidFit(A=0.6045, B=1.90, C_mid=2542.0, R0=0.3,
                     ci={"A": (0.594, 0.605), "B": (1.7, 2.1), "C_mid": (2300.0, 2800.0)})

    def refit():
        raise AssertionError("a common-A refit for a pair whose A moved")

    v = verdict(npr, base, common=refit)
    assert v.label == MOVES_A and v.small and v.text == "moves A (small)"
    assert v.dA == pytest.approx(-0.0125) and v.b_basis == OWN_FITS and v.dB == 0.0
    assert "small" in v.detail and "own fits (A moved)" in v.detail
    # its resolution: A from the two A intervals; B from the own-fit B intervals, 0.2 on each side: 0.4 +
    # 1.2816 x hypot(0.2, 0.2) / 1.6449 = 0.62037
    assert v.resolution[0] == resolution(0.6045, (0.594, 0.605), 0.617, (0.613, 0.621), top=1.0)
    assert v.resolution[1] == pytest.approx(0.62037, abs=1e-4)


def test_both_moved_and_no_change_from_fits():
    base = fit(0.61, 2.0)
    assert verdict(fit(0.55, 1.2), base).label == BOTH  # A and B intervals apart
    assert verdict(fit(0.55, 1.2), base).b_basis == OWN_FITS
    same = verdict(fit(0.608, 1.9), base)
    assert same.label == NO_CHANGE and same.resolution_text.startswith("|ΔA| >= 0.016")
    assert verdict(fit(0.608, 1.5), base).label == MOVES_B  # no data for a common A: the own fits' B


def _pair(A=0.61, B=1.9, lr_A=0.1):
    """A CommonAFit stand-in for (variant, base): B at the common A given, its likelihood ratio given."""
    at_common = [fit(A, B, a_half=0.0), fit(A, 2.6, a_half=0.0)]
    return CommonAFit(A=A, ci_A=(A - 0.004, A + 0.004), fits=at_common, lr_A=lr_A)


def test_b_at_a_common_A_only_when_the_data_fit_one_well():
    """A indistinguishable (intervals overlap): B compared at a common A, unless its likelihood-ratio test has
    p < 0.5 (chi-square(1) median 0.455): then the own fits' B, which overlap here."""
    base, variant = fit(0.61, 2.0), fit(0.606, 1.95)
    good = verdict(variant, base, common=lambda: _pair(lr_A=0.40))
    assert good.label == MOVES_B and good.b_basis == COMMON_A and good.common_A == 0.61
    assert good.dB == pytest.approx(1.9 - 2.6) and good.B_label == "at common A 0.610"
    poor = verdict(variant, base, common=lambda: _pair(lr_A=0.50))
    assert poor.label == NO_CHANGE and poor.b_basis == OWN_FITS and poor.dB == pytest.approx(-0.05)
    assert "a common A fits poorly (likelihood ratio 0.50" in poor.detail


def test_common_a_rejection_threshold_is_the_chi_square_median():
    two = [fit(0.6, 2.0)] * 2
    assert not CommonAFit(A=0.6, ci_A=(0.59, 0.61), fits=two, lr_A=0.45).a_rejected
    assert CommonAFit(A=0.6, ci_A=(0.59, 0.61), fits=two, lr_A=0.46).a_rejected
    three = [fit(0.6, 2.0)] * 3  # chi-square(2) median: 2 ln 2 = 1.386
    assert not CommonAFit(A=0.6, ci_A=(0.59, 0.61), fits=three, lr_A=1.38).a_rejected
    assert CommonAFit(A=0.6, ci_A=(0.59, 0.61), fits=three, lr_A=1.39).a_rejected


# --- from data: the common-A refit ----------------------------------------------------------------------------


def _state(seed: int, **truth):
    values = dict(A=0.61, B=1.9, C_mid=2542.0, R0=0.3) | truth
    curve = make_curve(np.random.default_rng(seed), Truth(**values))
    return fit_state(prepare(curve.compute, curve.reward))


@pytest.fixture(scope="module")
def states():
    return {
        "base": _state(1),
        "same": _state(2),  # the base's truth, other noise
        "steeper": _state(1, B=2.6),  # the base's A and noise draws, a higher B: the two A agree closely
        "flatter": _state(4, B=1.4),  # the base's A, a lower B
        "lower": _state(5, A=0.55),  # a lower ceiling
        "npr": _state(6, A=0.595),  # a ceiling 0.015 lower, B the base's
    }


def _common(states, names):
    return lambda indices: fit_common_A([states[names[i]].data for i in indices], [states[names[i]] for i in indices])


def test_a_tied_pair_is_compared_on_B_at_a_common_A(states):
    names = ["base", "steeper"]
    fits = [(n, states[n].fit) for n in names]
    ranked = rank_fits(fits, common=_common(states, names))
    assert [r.name for r in ranked] == ["steeper", "base"]  # the higher B wins the tie on A
    assert [r.rank for r in ranked] == [1, 2]
    first, second = ranked
    assert first.common_A == second.common_A
    assert min(f.A for _, f in fits) - 0.005 <= first.common_A <= max(f.A for _, f in fits) + 0.005
    assert first.b_fit.A == pytest.approx(first.common_A) and first.b_fit.method == "common-A"
    assert first.B_compared > second.B_compared
    assert first.B_compared_ci[0] > second.B_compared_ci[1]  # told apart: not a tie on B
    assert "ranked by B at their common A" in first.note


def test_likelihood_ratio_of_a_common_A(states):
    """Two curves of one truth share an A easily (deviance cost below the chi-square(1) 90% point, 2.71); a
    ceiling 0.06 lower does not."""
    same = fit_common_A([states["base"].data, states["same"].data], [states["base"], states["same"]])
    lower = fit_common_A([states["base"].data, states["lower"].data], [states["base"], states["lower"]])
    assert 0.0 <= same.lr_A < 2.71
    assert lower.lr_A > 2.71 and lower.a_rejected


def test_verdicts_against_the_base(states):
    base = states["base"]

    def verdict_of(name):
        other = states[name]
        joint = lambda: fit_common_A([other.data, base.data], [other, base])  # noqa: E731
        return verdict(other.fit, base.fit, common=joint)

    assert verdict_of("lower").label == MOVES_A
    assert verdict_of("lower").dA == pytest.approx(-0.06, abs=0.015)
    flatter = verdict_of("flatter")
    assert flatter.label == MOVES_B and flatter.dB < 0 and flatter.b_basis == COMMON_A
    same = verdict_of("same")
    assert same.label == NO_CHANGE, same.detail
    # a sharp comparison: 81 points to 16k GPU-hours (0.0235; 0.019 before the noise model held slow departures)
    assert same.resolution[0] < 0.025
    # A 0.015 lower, B unchanged: A moved, and B, compared on the own fits, did not
    npr = verdict_of("npr")
    assert npr.label == MOVES_A and npr.small and npr.b_basis == OWN_FITS, npr.detail
    assert verdict(SigmoidFit.failed("flat curve"), base.fit).label == "no fit"
    assert verdict(base.fit, None).label == "no base"


def test_common_A_intervals_include_the_uncertainty_of_A(states):
    """B at a common A, with A taken as exact, is narrower than the joint interval (A shared but free)."""
    base, same = states["base"], states["same"]
    joint = fit_common_A([base.data, same.data], [base, same])
    fixed = fit_state(base.data, A_fixed=joint.A).fit
    assert joint.fits[0].B == pytest.approx(fixed.B)
    (lo, hi), (f_lo, f_hi) = joint.fits[0].ci["B"], fixed.ci["B"]
    assert lo <= f_lo + 1e-9 and hi >= f_hi - 1e-9 and (hi - lo) > (f_hi - f_lo)
    assert joint.ci_A[0] < joint.A < joint.ci_A[1]


# --- the compute to reach a common reward: "moves C_mid" ----------------------------------------------------------


def test_law_compute_by_hand_and_against_the_law():
    # A - R0 = 0.5, r - R0 = 0.4: (0.5 / 0.4 - 1)^(-1/2) = 0.25^(-1/2) = 2, so C* = 2 C_mid; the law gives back r
    assert float(law_compute(0.6, 0.7, 2.0, 100.0, 0.2)) == pytest.approx(200.0)
    assert float(sigmoid_law(200.0, 0.7, 2.0, 100.0, 0.2)) == pytest.approx(0.6)
    assert float(law_compute(0.45, 0.7, 2.0, 100.0, 0.2)) == pytest.approx(100.0)  # half the gain: C_mid
    assert float(law_compute(0.2, 0.7, 2.0, 100.0, 0.2)) == 0.0  # at R0: from the start
    assert float(law_compute(0.7, 0.7, 2.0, 100.0, 0.2)) == math.inf  # at A: never
    draws = np.array([[0.7, 2.0, 100.0, 0.2], [0.7, 1.0, 50.0, 0.2], [0.5, 2.0, 100.0, 0.2]])
    assert law_compute(0.6, *draws.T) == pytest.approx([200.0, 200.0, math.inf])  # 0.25^-1 x 50 = 200


def test_moves_c_mid_where_only_the_compute_axis_is_stretched():
    """Two runs of one law, one needing 1.4x the compute for everything (loo-batch's extra FLOPs): A and B
    indistinguishable, the compute to reach the reward both have mid-data apart; its ratio 1.4 within the interval that
    the resolution implies. The same law against itself: no change."""
    rng = np.random.default_rng(3)
    law = dict(A=0.62, B=1.9, C_mid=4000.0, R0=0.3)
    base = fit_state(prepare(*_curve(rng, Truth(**law)))).fit
    slow = fit_state(prepare(*_curve(rng, Truth(**{**law, "C_mid": 5600.0})))).fit
    v = verdict(slow, base)
    assert v.label == MOVES_C and v.moves_C and not (v.moves_A or v.moves_B)
    c = v.compute
    middle = [float(f.predict(math.sqrt(f.c_min * f.c_max))) for f in (slow, base)]  # mid-data, in log C
    assert c.R_star == pytest.approx(min(middle)) and min(middle) == middle[0]  # the slower run's: it is lower there
    assert c.moved and c.ratio == pytest.approx(1.4, rel=0.1) and c.ratio_resolution < 1.4
    assert v.text == f"moves C_mid ({c.ratio:.2f}x compute)" and f"z = {c.claim.z:+.2f} >= 2.33" in v.detail
    assert c.C[0] == pytest.approx(float(law_compute(c.R_star, slow.A, slow.B, slow.C_mid, slow.R0)))
    same = verdict(fit_state(prepare(*_curve(rng, Truth(**law)))).fit, base)
    assert same.label == NO_CHANGE and not same.compute.moved
    # without posterior draws (fits without data) there is no compute comparison
    assert verdict(fit(0.61, 2.0), fit(0.61, 2.0)).compute is None


def _curve(rng, truth):
    curve = make_curve(rng, truth, c_max=40_000.0, every=800.0)
    return curve.compute, curve.reward


def test_a_truth_that_never_reaches_R_star_needs_more_compute_whatever_the_factor():
    """analysis.truth.expected: a variant whose true A is below R* needs infinite compute: a claim of more compute
    is right, one of less is wrong; where neither truth reaches R* no direction is held against a claim."""
    from analysis.rank import Efficiency
    from analysis.truth import Truth as MockTruth, expected

    base = MockTruth(A=0.60, B=1.5, C_mid=100.0, R0=0.2)
    low = MockTruth(A=0.50, B=1.5, C_mid=100.0, R0=0.2)
    compute = Efficiency(R_star=0.55, C=(100.0, 150.0), ci=((90.0, 110.0), (140.0, 160.0)), moved=True,
                         resolution=math.log(1.3))
    want = expected(low, base, (0.2, 0.5), compute)  # dA -0.1: below the resolution
    assert want.dlnC == math.inf and want.C == "moved"
    assert want.judge(False, -0.1, False, 0.0, True, math.log(1.5)) == ""
    assert "compute 0.67x" in want.judge(False, -0.1, False, 0.0, True, math.log(1 / 1.5))
    neither = expected(low, MockTruth(A=0.52, B=1.5, C_mid=100.0, R0=0.2), (0.2, 0.5), compute)
    assert math.isnan(neither.dlnC) and neither.C == "either"
    assert neither.judge(False, 0.0, False, 0.0, True, math.log(1.5)) == ""


def test_no_verdict_on_A_before_a_curve_reaches_its_c_mid():
    """A ceiling 0.04 lower, fitted on data that stop before the curves' C_mid (A extrapolated: B and C_mid can
    trade against it) gets no claim on A, whatever its intervals say: "A not identified yet", the A resolution open;
    the same fits with the data past C_mid move A. Either way nothing else moved."""
    from analysis.rank import A_NOT_IDENTIFIED

    def ran_to(c_max: float, A: float) -> SigmoidFit:
        return SigmoidFit(A=A, B=1.9, C_mid=2500.0, R0=0.3, c_min=100.0, c_max=c_max,
                          ci={"A": (A - 0.005, A + 0.005), "B": (1.7, 2.1), "C_mid": (2000.0, 3000.0)})

    early = verdict(ran_to(2000.0, 0.57), ran_to(16000.0, 0.61))
    assert not ran_to(2000.0, 0.57).A_identified and ran_to(2500.0, 0.57).A_identified
    assert early.label == A_NOT_IDENTIFIED and not early.moves_A and not early.A_identified
    assert early.text == A_NOT_IDENTIFIED and math.isinf(early.resolution[0])
    assert early.detail.startswith("A not identified yet: the variant's data stop at 2,000 GPU-h, before its C_mid")
    assert "ΔA not resolved (A not identified yet)" in early.resolution_text
    assert verdict(ran_to(16000.0, 0.61), ran_to(2000.0, 0.57)).label == A_NOT_IDENTIFIED  # the base's too
    late = verdict(ran_to(16000.0, 0.57), ran_to(16000.0, 0.61))
    assert late.label == MOVES_A and late.A_identified and math.isfinite(late.resolution[0])
