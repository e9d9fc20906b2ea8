"""The ranking rule (A first; A within 0.02 or overlapping intervals: a tie, compared on B at a common A; ties on B
share a rank; failed fits last) and the verdicts against the base recipe."""

import numpy as np
import pytest

from analysis import SigmoidFit
from analysis.fit import prepare
from analysis.joint import fit_common_A
from analysis.posterior import fit_state
from analysis.rank import MOVES_A, MOVES_B, NO_CHANGE, rank_fits, verdict
from analysis.synthetic import Truth, make_curve


def fit(A, B, a_half=0.005, b_half=0.2):
    return SigmoidFit(A=A, B=B, C_mid=2500.0, R0=0.3,
                      ci={"A": (A - a_half, A + a_half), "B": (B - b_half, B + b_half), "C_mid": (2000.0, 3000.0)})


def test_a_within_tie_is_ordered_by_b():
    ranked = rank_fits([("high-A-low-B", fit(0.610, 1.5)), ("low-A-high-B", fit(0.595, 2.1))])
    assert [r.name for r in ranked] == ["low-A-high-B", "high-A-low-B"]
    assert [r.rank for r in ranked] == [1, 2]
    assert ranked[0].note == "tie on A with high-A-low-B"
    assert ranked[1].note == "tie on A with low-A-high-B"


def test_distinct_a_is_ordered_by_a_whatever_b():
    ranked = rank_fits([("low", fit(0.55, 3.0)), ("high", fit(0.61, 1.0))])
    assert [r.name for r in ranked] == ["high", "low"]
    assert all(r.note == "" for r in ranked)


def test_overlapping_intervals_on_A_are_a_tie_beyond_002():
    # 0.04 apart, but the first curve stopped early: its interval on A reaches down to the other's
    loose = fit(0.63, 1.2, a_half=0.06)
    ranked = rank_fits([("loose", loose), ("tight", fit(0.59, 2.0))])
    assert [r.name for r in ranked] == ["tight", "loose"]
    assert ranked[0].tie_with == ("loose",)


def test_tie_groups_are_anchored_on_the_best_a_and_do_not_chain():
    # 0.630 and 0.615 tie (0.015 apart), 0.600 is 0.03 below the anchor 0.630: its own group, ranked after,
    # although it is within 0.02 of 0.615 and has the highest B.
    ranked = rank_fits([("a", fit(0.600, 3.0)), ("b", fit(0.615, 2.0)), ("c", fit(0.630, 1.0))])
    assert [r.name for r in ranked] == ["b", "c", "a"]
    assert ranked[2].tie_with == ()


def test_ties_on_B_share_a_rank():
    ranked = rank_fits([("x", fit(0.61, 2.0)), ("y", fit(0.605, 1.9)), ("z", fit(0.60, 1.2))])
    assert [(r.rank, r.name) for r in ranked] == [(1, "x"), (1, "y"), (3, "z")]
    assert ranked[0].b_tie_with == ("y",) and "tie on B with y" in ranked[0].note
    assert ranked[2].b_tie_with == ()


def test_failed_fits_rank_last_without_a_number():
    ranked = rank_fits([("broken", SigmoidFit.failed("too few points")), ("x", fit(0.5, 1.0)), ("y", fit(0.6, 1.0))])
    assert [(r.rank, r.name) for r in ranked] == [(1, "y"), (2, "x"), (None, "broken")]
    assert ranked[-1].fit.status == "too few points"


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
        "steeper": _state(3, A=0.60, B=2.6),  # within 0.02 of the base on A, a higher B
        "flatter": _state(4, B=1.4),  # the base's A, a lower B
        "lower": _state(5, A=0.55),  # a lower ceiling
    }


def _common(states, names):
    return lambda indices: fit_common_A([states[names[i]].data for i in indices], [states[names[i]] for i in indices])


def test_a_within_002_pair_is_compared_on_B_at_a_common_A(states):
    names = ["base", "steeper"]
    fits = [(n, states[n].fit) for n in names]
    assert abs(fits[0][1].A - fits[1][1].A) <= 0.02 + 0.01  # tied on A (within 0.02 or overlapping)
    ranked = rank_fits(fits, common=_common(states, names))
    assert [r.name for r in ranked] == ["steeper", "base"]  # the higher B wins the tie on A
    assert [r.rank for r in ranked] == [1, 2]
    first, second = ranked
    assert first.common_A == second.common_A
    assert min(f.A for _, f in fits) - 0.005 <= first.common_A <= max(f.A for _, f in fits) + 0.005
    assert first.b_fit.A == pytest.approx(first.common_A) and first.b_fit.method == "common-A"
    assert first.B_compared > second.B_compared
    assert first.B_compared_ci[0] > second.B_compared_ci[1]  # told apart: not a tie on B
    assert "compared on B at common A" in first.note


def test_verdicts_against_the_base(states):
    base = states["base"]

    def verdict_of(name):
        other = states[name]
        joint = lambda: fit_common_A([other.data, base.data], [other, base])  # noqa: E731
        return verdict(other.fit, base.fit, common=joint)

    assert verdict_of("lower").label == MOVES_A
    assert verdict_of("lower").dA == pytest.approx(-0.06, abs=0.015)
    flatter = verdict_of("flatter")
    assert flatter.label == MOVES_B and flatter.dB < 0 and flatter.common_A is not None
    same = verdict_of("same")
    assert same.label == NO_CHANGE, same.detail
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
