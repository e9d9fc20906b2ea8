"""analysis/seeded.py, the adaptive sweep with seeds: where its next seeds go and what a look decides, by hand."""

from __future__ import annotations

import pytest

from analysis.seeded import information, look, seeds_to_add, z_of


def test_the_next_seeds_go_where_they_buy_the_most_information_per_gpu_hour_by_hand():
    """Two variants and the base at precision 2 each (information 1 on each change), a seed adding 1, the target
    1.5. Step 1: a variant's seed gains 1/(1/3 + 1/2) - 1 = 0.2, the base's 0.2 for each variant short, 0.4: the base
    (P_b 3, information 1.2 each). Step 2: a variant's gains 1.5 - 1.2 = 0.3, the base's 2 x (4/3 - 1.2) = 0.267:
    variant 0 (1.5). Step 3: variant 1, 0.3 against the base's 0.133. One seed each and one of the base."""
    more, base = seeds_to_add([2, 2], 2, [1, 1], 1, [True, True], 1.5)
    assert (more.tolist(), base) == ([1, 1], 1)
    # one variant settled: step 1 a tie, 0.2 each, goes to the variant (3, information 1.2); then the base's 0.3
    # beats the variant's 4/3 - 1.2 = 0.133 (had the base taken the tie, the variant's 0.3 next: the same seeds)
    more, base = seeds_to_add([2, 2], 2, [1, 1], 1, [True, False], 1.5)
    assert (more.tolist(), base) == ([1, 0], 1)
    # a base seed at 10 GPU-hours: the variants take turns (3/3 then 4/4 then 5/5, 0.2 to 0.071 a seed against the
    # base's 0.04 to 0.089 per GPU-hour), until at 5 each the base's 2 x (1.875 - 1.4286) / 10 = 0.089 wins
    more, base = seeds_to_add([2, 2], 2, [1, 1], 1, [True, True], 1.5, hours=(1.0, 10.0))
    assert (more.tolist(), base) == ([3, 3], 1)
    assert information(3.0, 3.0) == pytest.approx(1.5)
    assert z_of(-0.02, 1e4, 1e4) == pytest.approx(-1.414214, abs=1e-6)  # sd sqrt(2e-4)
    assert seeds_to_add([2, 2], 2, [1, 1], 1, [True, True], 1.0)[1] == 0  # at the target: nothing


def test_a_look_holds_z_to_the_obrien_fleming_boundary_and_settles_the_futile_by_hand():
    """At t = 0.5 the O'Brien-Fleming-type boundary spending 0.02 is 3.4604 (analysis/sequential.py), at t = 1 after
    it 2.3298. z = -3.5 at 0.5: a claim (down); z = 1.0: open (a claim at t = 1 predicted 0.181 >= 0.10); z = 0.2:
    futile (0.025). The last look: 2.33 claims, 2.32 does not and is settled unmade. A look at no new information
    adds no fraction; without spending, every look is held to 2.326 (the negative control)."""
    down = look(-3.5, 0.5, (), last=False, alpha=0.02, futility=0.10)
    assert (down.claim, down.settled, down.times) == (-1, True, (0.5,))
    assert down.boundary == pytest.approx(3.4604, abs=1e-4)
    open_ = look(1.0, 0.5, (), last=False, alpha=0.02, futility=0.10)
    assert (open_.claim, open_.settled) == (0, False)
    assert look(0.2, 0.5, (), last=False, alpha=0.02, futility=0.10).settled
    up = look(2.33, 1.2, (0.5,), last=True, alpha=0.02, futility=0.10)
    assert (up.claim, up.times) == (1, (0.5, 1.0)) and up.boundary == pytest.approx(2.3298, abs=1e-4)
    unmade = look(2.32, 1.0, (0.5,), last=True, alpha=0.02, futility=0.10)
    assert (unmade.claim, unmade.settled) == (0, True)
    assert look(1.0, 0.5, (0.5,), last=False, alpha=0.02, futility=0.10).times == (0.5,)
    naive = look(2.4, 0.5, (), last=False, alpha=0.02, futility=0.10, spend=False)
    assert naive.claim == 1 and naive.boundary == pytest.approx(2.3263, abs=1e-4)


def _runs(name: str, A: float, seeds: int, tags: dict) -> list:
    """`seeds` runs of a variant whose recipe's A is `A`, as the mock logs them (analysis/synthetic.py), each its own
    signature, carrying `tags`."""
    import numpy as np

    from analysis.runs import RunCurve
    from analysis.synthetic import MockNoise, Truth, mock_curve

    out = []
    for k in range(seeds):
        c = mock_curve(np.random.default_rng([7, k, int(A * 1000)]), Truth(A=A, B=1.9, C_mid=2500.0, R0=0.3),
                       MockNoise(), run_A=A)
        out.append(RunCurve(run_id=f"{name}-{k}", run_name=name, variant=name, axis="", choice="",
                            signature=f"{name}-{k}", status="FINISHED", sweep="loo-x", parent_run_id=None,
                            step=c.step, compute=c.compute, pass_rate=c.reward, last_step=int(c.step[-1]),
                            tags=dict(tags)))
    return out


def test_the_report_holds_a_seeded_variants_claims_to_its_last_looks_boundary():
    """A variant whose runs carry an adaptive sweep with seeds' look at fractions (0.5,): the report's recipe-level
    claims of it are held to that look's boundary, 3.4604; a variant no such look saw, to the one-look 2.3263 (the
    negative control), as is every claim when the tag is gone (seeded_bound None)."""
    import json

    from analysis.rank import CRITICAL
    from analysis.report import variant_rows
    from analysis.seeded import SEEDED_LOOK_TAG, seeded_bound

    looked = {SEEDED_LOOK_TAG: json.dumps({"times": [0.5], "alpha": 0.02})}
    curves = _runs("scalerl", 0.61, 2, {}) + _runs("loo-a", 0.58, 2, looked) + _runs("loo-b", 0.58, 2, {})
    rows = {r.variant: r for r in variant_rows(curves)}
    assert rows["loo-a"].recipe.claims["A"].c == pytest.approx(3.4604, abs=1e-4)
    assert rows["loo-b"].recipe.claims["A"].c == pytest.approx(CRITICAL)
    assert seeded_bound([{}, {}]) is None and seeded_bound([{}, looked])("B", 0.0) == pytest.approx(3.4604, abs=1e-4)
