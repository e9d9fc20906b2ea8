"""Verdicts about recipes (analysis/spread.py): the spread between runs of one recipe from replicate seeds and a
stated prior, each side's seeds combined with it, and the test redone: numbers derived by hand, and two forms of the
same resolution against each other."""

import math

import pytest

from analysis.law import SigmoidFit
from analysis.rank import MOVES_A, NO_CHANGE, verdict
from analysis.spread import PRIOR_SD_A, Spread, estimate, recipe_claim, recipe_verdict, resolution_A

Z90 = 1.6448536  # a 90% half-width in standard errors


def fit(A: float, sd_A: float = 0.002, B: float = 2.0, sd_B: float = 0.2) -> SigmoidFit:
    """A fit whose A and B intervals are sd_A and sd_B standard errors wide on each side."""
    return SigmoidFit(A=A, B=B, C_mid=2500.0, R0=0.3, ci={"A": (A - Z90 * sd_A, A + Z90 * sd_A),
                                                          "B": (B - Z90 * sd_B, B + Z90 * sd_B),
                                                          "C_mid": (2000.0, 3000.0)})


def test_the_spread_from_replicate_seeds_and_the_prior_by_hand():
    """Seeds A 0.60, 0.62 (one variant) and 0.55, 0.55, 0.58 (another), each with a standard error of 0.002:
    Q = 2e-4 and 6e-4, less (n - 1)/n sum s^2 = 4e-6 and 8e-6, over 1 + 2 degrees of freedom: tau^2 = 7.88e-4 / 3
    = 2.6267e-4 (sd 0.016207); with the prior's 0.015 at 2 dof: (2 x 2.25e-4 + 7.88e-4) / 5 = 2.476e-4, sd 0.015735.
    Equal B everywhere: their moment is negative, the seeds say 0, and the prior of B is 0."""
    groups = [[fit(0.60), fit(0.62)], [fit(0.55), fit(0.55), fit(0.58)], [fit(0.61)]]
    spread = estimate(groups, Spread())
    assert spread.dof == 3 and spread.prior_dof == PRIOR_DOF_DEFAULT
    assert spread.seeds_sd_A == pytest.approx(math.sqrt(7.88e-4 / 3), rel=1e-4)
    assert spread.sd_A == pytest.approx(math.sqrt(2.476e-4), rel=1e-4)
    assert spread.seeds_sd_B == 0.0 and spread.sd_B == 0.0
    assert "replicate seeds (3 dof" in spread.source and "the prior (2 dof)" in spread.source
    # no replicates: the prior alone, and said so; a prior of weight 0: the seeds alone
    alone = estimate([[fit(0.60)], [fit(0.61)]], Spread())
    assert alone.sd_A == PRIOR_SD_A and alone.dof == 0 and "a prior" in alone.source
    assert estimate(groups, Spread(prior_dof=0.0)).sd_A == pytest.approx(math.sqrt(7.88e-4 / 3), rel=1e-4)


PRIOR_DOF_DEFAULT = Spread().prior_dof


def test_each_sides_seeds_combined_with_the_spread_by_hand():
    """One seed each, A 0.60 and 0.61, standard errors 0.002, a spread of 0.015: each side's variance is
    4e-6 + 2.25e-4 = 2.29e-4, the change's sd sqrt(2 x 2.29e-4) = 0.0214009, z = -0.01 / 0.0214009 = -0.4673.
    Two seeds of the base (0.60, 0.62): their mean 0.61 at half the variance, sd sqrt(2.29e-4 + 1.145e-4)."""
    one = recipe_claim([fit(0.60)], [fit(0.61)], "A", 0.015)
    assert one.d == pytest.approx(-0.01) and one.sd == pytest.approx(0.0214009, rel=1e-5)
    assert one.z == pytest.approx(-0.4673, abs=1e-3) and not one.moved
    two = recipe_claim([fit(0.60)], [fit(0.60), fit(0.62)], "A", 0.015)
    assert two.d == pytest.approx(-0.01) and two.sd == pytest.approx(math.sqrt(2.29e-4 + 1.145e-4), rel=1e-5)
    # the spread is a random effect: at 0 a precise seed outweighs a loose one; large, the seeds count alike
    precise = [fit(0.60, sd_A=0.001), fit(0.62, sd_A=0.01)]
    assert recipe_claim(precise, [fit(0.5)], "A", 0.0).d + 0.5 == pytest.approx(0.60 + 0.02 / 101, abs=1e-6)
    assert recipe_claim(precise, [fit(0.5)], "A", 1.0).d + 0.5 == pytest.approx(0.61, abs=1e-4)
    # lopsided intervals, no spread: the variant's A 0.60 with standard errors 0.001 below and 0.004 above, the
    # base's 0.61 with 0.003 below and 0.002 above. A fall of the variant's A (d < 0) is judged on the variant's
    # side above and the base's below: sd sqrt(0.004^2 + 0.003^2) = 0.005; a rise on the other two, sqrt(0.001^2 +
    # 0.002^2) = 0.002236
    lop = SigmoidFit(A=0.60, B=2.0, C_mid=2500.0, R0=0.3, ci={"A": (0.60 - Z90 * 0.001, 0.60 + Z90 * 0.004),
                                                              "B": (1.8, 2.2), "C_mid": (2000.0, 3000.0)})
    base = SigmoidFit(A=0.61, B=2.0, C_mid=2500.0, R0=0.3, ci={"A": (0.61 - Z90 * 0.003, 0.61 + Z90 * 0.002),
                                                               "B": (1.8, 2.2), "C_mid": (2000.0, 3000.0)})
    fall = recipe_claim([lop], [base], "A", 0.0)
    assert fall.d == pytest.approx(-0.01) and fall.sd_down == pytest.approx(0.005, rel=1e-5)
    assert fall.sd == fall.sd_down and fall.sd_up == pytest.approx(math.sqrt(5e-6), rel=1e-5)


def test_a_move_between_these_runs_is_no_move_between_the_recipes_at_the_papers_spread():
    """The runs differ (z = -0.01 / sqrt(8e-6) = -3.54: moves A); at the paper's spread between runs of one recipe
    the recipes do not, and the recipe-level resolution is (2.3263 + 1.2816) x 0.0214009 = 0.077213, the same as
    analysis.spread.resolution_A's closed form; with no spread the recipe level is the run level."""
    variant, base = fit(0.60), fit(0.61)
    run = verdict(variant, base)
    assert run.label == MOVES_A and run.claims["A"].z == pytest.approx(-0.01 / math.sqrt(8e-6), rel=1e-4)
    recipes = recipe_verdict(run, variant, base, [variant], [base], Spread())
    assert recipes.label == NO_CHANGE and recipes.level == "recipes" and run.level == "runs"
    assert recipes.resolution[0] == pytest.approx(0.077213, abs=2e-6)
    assert recipes.resolution[0] == pytest.approx(resolution_A(0.002, 0.015), rel=1e-9)
    assert "the recipes (the spread between runs added" in recipes.detail
    none = recipe_verdict(run, variant, base, [variant], [base], Spread(sd_A=0.0))
    assert none.label == MOVES_A and none.resolution[0] == pytest.approx(run.resolution[0], rel=1e-9)


def test_a_verdict_with_nothing_to_compare_stays_as_it_is():
    no_base = verdict(fit(0.6), None)
    assert recipe_verdict(no_base, fit(0.6), fit(0.6), [fit(0.6)], [], Spread()).label == "no base"


def test_the_recipes_b_is_not_compared_until_a_spread_of_b_is_known():
    """No replicate and no stated prior of B: the recipes' B claim is open (no claim, no resolution), said so, and the
    compute's too (C* moves with B); A is compared as before. Two seeds of the base measure B's spread (B 2.0 and 2.4,
    standard errors 0.2: Q = 0.08 less 1/2 x 0.08 = 0.04 on 1 dof, sd 0.2): B is compared, its critical value widened
    by Student's t at the Satterthwaite degrees of freedom."""
    v, b = fit(0.60, B=1.2), fit(0.61, B=2.0)
    run = verdict(v, b)
    unknown = recipe_verdict(run, v, b, [v], [b], Spread())
    assert Spread().b_dof == 0 and not unknown.moves_B and math.isinf(unknown.resolution[1])
    assert "no spread of B between runs is known" in unknown.detail and "of B unknown" in Spread().source
    seeds = estimate([[b, fit(0.61, B=2.4)]], Spread())
    assert seeds.dof_B == 1 and seeds.b_dof == 1 and seeds.sd_B == pytest.approx(0.2, rel=1e-6)
    known = recipe_verdict(run, v, b, [v], [b, fit(0.61, B=2.4)], seeds)
    claim = known.claims["B"]
    assert math.isfinite(claim.resolution) and claim.c > 2.326
    # the factor: Student's t at dof_eff = var^2 / (extra^2 / dof) over the normal quantile, at 0.99 (ALPHA 0.02)
    from scipy.special import ndtri, stdtrit

    from analysis.spread import t_factor
    assert t_factor(0.05, 0.03, 1.0) == pytest.approx(stdtrit(0.05**2 / 0.03**2, 0.99) / ndtri(0.99))
    assert t_factor(0.05, 0.0, 1.0) == 1.0 and t_factor(0.05, 0.03, math.inf) == 1.0
    # a stated prior of B counts as known, with its degrees of freedom
    assert Spread(sd_B=0.1).b_dof == Spread().prior_dof


def test_a_seed_with_an_open_interval_makes_no_claim_about_the_recipes():
    """The variant's A interval reaches 1 (open above: no bounded seed to combine), its B 1.2 against the base's
    2.0 (standard errors 0.2 each: z = -0.8 / 0.2828 = -2.83, beyond 2.326): the runs' verdict moves B. The recipes'
    cannot be compared and claim nothing; before, they took the runs' label and so its claim."""
    v = SigmoidFit(A=0.6, B=1.2, C_mid=2500.0, R0=0.3, ci={"A": (0.6 - Z90 * 0.002, 1.0),
                                                         "B": (1.2 - Z90 * 0.2, 1.2 + Z90 * 0.2),
                                                         "C_mid": (2000.0, 3000.0)})
    b = fit(0.61, B=2.0)
    run = verdict(v, b)
    assert run.moves_B and run.claims["B"].z == pytest.approx(-0.8 / math.sqrt(0.08), rel=1e-6)
    seeds = estimate([[b, fit(0.61, B=2.4)]], Spread())  # B's spread measured: B could be claimed
    recipes = recipe_verdict(run, v, b, [v], [b, fit(0.61, B=2.4)], seeds)
    assert recipes.label == "no verdict" and recipes.level == "recipes" and not recipes.moved
    assert "no seed with a bounded interval" in recipes.detail
