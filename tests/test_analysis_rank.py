"""The ranking rule: A first; A within 0.02 is a tie broken by B; failed fits last."""

from analysis import SigmoidFit
from analysis.rank import rank_fits


def fit(A, B):
    return SigmoidFit(A=A, B=B, C_mid=2500.0, R0=0.3)


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


def test_tie_groups_are_anchored_on_the_best_a_and_do_not_chain():
    # 0.630 and 0.615 tie (0.015 apart), 0.600 is 0.03 below the anchor 0.630: its own group, ranked after,
    # although it is within 0.02 of 0.615 and has the highest B.
    ranked = rank_fits([("a", fit(0.600, 3.0)), ("b", fit(0.615, 2.0)), ("c", fit(0.630, 1.0))])
    assert [r.name for r in ranked] == ["b", "c", "a"]
    assert ranked[2].tie_with == ()


def test_failed_fits_rank_last_without_a_number():
    ranked = rank_fits([("broken", SigmoidFit.failed("too few points")), ("x", fit(0.5, 1.0)), ("y", fit(0.6, 1.0))])
    assert [(r.rank, r.name) for r in ranked] == [(1, "y"), (2, "x"), (None, "broken")]
    assert ranked[-1].fit.status == "too few points"
