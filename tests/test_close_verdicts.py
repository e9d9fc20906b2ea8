"""What would settle an open verdict about the recipes (analysis/spread.py's to_close): the fewest more seeds of the
variant and of the base, by GPU-hours, that bring its resolution on A to the margin; numbers derived by hand.
docs/fitting.md#what-would-settle-a-verdict."""

import pytest

from test_spread import fit


def test_the_seeds_that_settle_an_open_verdict_at_the_margin_by_hand():
    """Each seed's A has an sd of 0.009 and runs of one recipe spread by 0.012: a seed's variance with the spread is
    0.000225. One seed a side: resolution (2.3263 + 1.2816) sqrt(2 x 0.000225) = 0.07654, open at a margin of 0.02.
    Settled when 1/n_v + 1/n_b <= (0.02 / 3.6079)^2 / 0.000225 = 0.13657: with seeds costing alike, 30 seeds in all
    is the fewest (13 + 17: 0.13575; 14 + 15 and 13 + 16 fall short), the first of them by seeds of the variant
    13 a variant, 17 of the base, so 12 and 16 more, 28 seeds' GPU-hours; then the resolution is
    3.6079 sqrt(0.000225 x 0.13575) = 0.01994."""
    from analysis.rank import verdict
    from analysis.spread import Spread, recipe_verdict, to_close

    variant, base = fit(0.60, sd_A=0.009), fit(0.60, sd_A=0.009)
    spread = Spread(sd_A=0.012)
    recipes = recipe_verdict(verdict(variant, base), variant, base, [variant], [base], spread)
    assert recipes.label == "no detectable change" and recipes.resolution[0] == pytest.approx(0.07654, abs=2e-5)
    more = to_close(recipes, [variant], [base], spread, (1.0, 1.0), margin=0.02)
    assert (more.variant, more.base, more.gpu_hours) == (12, 16, 28.0)
    assert more.resolution == pytest.approx(0.01994, abs=2e-5) and more.resolution <= 0.02
    assert more.text("loo-dapo", "scalerl").startswith(
        "to settle it at |ΔA| 0.02: 12 more seeds of loo-dapo and 16 more seeds of scalerl (28 GPU-h")
    # a base seed at half a variant seed's GPU-hours: the base takes more of them, and the total is the cheapest
    cheap_base = to_close(recipes, [variant], [base], spread, (2.0, 1.0), margin=0.02)
    assert cheap_base.gpu_hours <= 2 * 12 + 16 and cheap_base.base > 16
    # negative controls: a verdict settled at the margin already, and one that claims A, need nothing more
    assert to_close(recipes, [variant], [base], spread, (1.0, 1.0), margin=0.08) is None
    moved = recipe_verdict(verdict(fit(0.50), fit(0.60)), fit(0.50), fit(0.60), [fit(0.50)], [fit(0.60)], spread)
    assert moved.label == "moves A" and to_close(moved, [fit(0.50)], [fit(0.60)], spread, (1.0, 1.0)) is None
