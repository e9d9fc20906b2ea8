"""ablate/seeding.py: the adaptive sweep with seeds' looks on a real MLflow database, by hand (the report's rows
stubbed with the z each look is to see; tests/test_adaptive_seeds.py runs the whole sweep on the mock)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from ablate import seeding, tracking
from analysis.seeded import SEEDED_LOOK_TAG


def _rows(z: dict):
    return [SimpleNamespace(variant=name, recipe=SimpleNamespace(claims={"A": SimpleNamespace(z=v)}))
            for name, v in z.items()]


def test_the_looks_decide_at_their_boundaries_and_add_the_seeds_the_next_needs_by_hand(mlflow_uri: str, capsys):
    """A seed's variance 1 and I_max 2, two looks: 2 seeds of the base and of each variant give information 1 on each
    change, t = 0.5, the first look's share: no seed before it. Look 1 (boundary 3.4604 at t 0.5): loo-a's z -3.6
    claims A down, loo-b's 1.0 stays open. Its next seeds (information 2 for loo-b alone: a tie 0.2/0.2 to the
    variant, then the base's 0.3, a tie 0.214/0.214 to the variant, the base's 0.286): loo-b 4, the base 4. Look 2,
    the last (t 1, boundary 2.3298): loo-b's z 2.5 claims A up. A third call takes no look and makes no report."""
    client = tracking.client(mlflow_uri)
    exp = tracking.experiment_id(client, "seeded")
    parent = tracking.sweep_parent(client, exp, "loo-x", {})
    runs = {name: [tracking.create_variant_run(client, exp, f"{name} {k}", {"ablate.variant": name}, parent)
                   for k in range(4)] for name in ("scalerl", "loo-a", "loo-b")}
    design = seeding.Design(i_max=2.0, var=1.0, hours=(1.0, 1.0), looks=2, alpha=0.02, futility=0.10)
    held = {name: ids[:2] for name, ids in runs.items()}
    plan = seeding.take_look(client, parent, held, "scalerl", design, lambda: _rows({"loo-a": -3.6, "loo-b": 1.0}))
    assert plan == {"scalerl": 4, "loo-a": 2, "loo-b": 4}
    assert seeding.planned_counts(client.get_run(parent).data.tags) == plan
    a = json.loads(client.get_run(runs["loo-a"][1]).data.tags[SEEDED_LOOK_TAG])
    assert (a["claim"], a["settled"], a["times"]) == (-1, True, [0.5]) and a["boundary"] == pytest.approx(3.4604)
    b = json.loads(client.get_run(runs["loo-b"][0]).data.tags[SEEDED_LOOK_TAG])
    assert (b["claim"], b["settled"]) == (0, False)
    printed = capsys.readouterr().out
    assert "look 1 of 2" in printed and "loo-a: z -3.60 against 3.46 (2 seeds): claims A down" in printed
    assert "before look 2 of 2, loo-b +2, scalerl +2 seeds" in printed

    held = {"scalerl": runs["scalerl"], "loo-a": runs["loo-a"][:2], "loo-b": runs["loo-b"]}
    assert seeding.take_look(client, parent, held, "scalerl", design, lambda: _rows({"loo-b": 2.5})) is None
    b = json.loads(client.get_run(runs["loo-b"][3]).data.tags[SEEDED_LOOK_TAG])
    assert (b["claim"], b["settled"], b["times"]) == (1, True, [0.5, 1.0]) and b["boundary"] == pytest.approx(2.3298)
    looks = json.loads(client.get_run(parent).data.tags[seeding.LOOKS_TAG])
    assert [entry["look"] for entry in looks] == [1, 2] and looks[1]["seeds"] == {"scalerl": 4, "loo-a": 2, "loo-b": 4}

    # a variant the report cannot compare (no row, or no claim of A): no verdict, settled, no seed more for it
    parent2 = tracking.sweep_parent(client, exp, "loo-y", {})
    lone = {name: [tracking.create_variant_run(client, exp, name, {"ablate.variant": name}, parent2)
                   for _ in range(2)] for name in ("scalerl", "loo-c")}
    assert seeding.take_look(client, parent2, lone, "scalerl", design, lambda: []) is None
    c = json.loads(client.get_run(lone["loo-c"][0]).data.tags[SEEDED_LOOK_TAG])
    assert (c["claim"], c["settled"], c["z"]) == (0, True, None)
    assert "loo-c (2 seeds): no verdict, its recipe not compared" in capsys.readouterr().out

    def no_report():
        raise AssertionError("no look is left: no report")

    assert seeding.take_look(client, parent, held, "scalerl", design, no_report) is None


def test_the_first_plan_brings_every_variant_to_the_first_looks_share_within_the_budget():
    """I_max 2, four looks: the first look's share is 0.5 and 1 seed each gives 0.5: nothing added. At I_max 4 the
    share is 1: 2 seeds each (1 of the base and 1 of each variant, each gaining 1/(1/2+1) - 0.5 = 0.167 against the
    base's 2 x 0.167: the base first, then each variant). A budget below that keeps the start."""
    counts = {"scalerl": 1, "loo-a": 1, "loo-b": 1}
    two = seeding.Design(i_max=2.0, var=1.0, hours=(1.0, 1.0), looks=4, alpha=0.02, futility=0.10)
    assert seeding.first_plan(counts, "scalerl", two) == counts
    four = seeding.Design(i_max=4.0, var=1.0, hours=(1.0, 1.0), looks=4, alpha=0.02, futility=0.10)
    assert seeding.first_plan(counts, "scalerl", four) == {"scalerl": 2, "loo-a": 2, "loo-b": 2}
    tight = seeding.Design(i_max=4.0, var=1.0, hours=(1.0, 1.0), looks=4, alpha=0.02, futility=0.10, budget=5.0)
    assert seeding.first_plan(counts, "scalerl", tight) == counts


def test_with_several_seeds_no_run_looks_at_its_rungs():
    """The adaptive sweep with seeds looks at whole seeds: its jobs' in-run rungs are off; one seed each, on (the
    adaptive sweep of docs/design.md#the-adaptive-sweep)."""
    from omegaconf import OmegaConf

    from ablate.config import compose
    from ablate.rungs import Rungs

    def active(*overrides: str) -> bool:
        cfg = OmegaConf.to_container(compose(["generator=mock", "sweep=loo", "sweep.adaptive=true", *overrides]),
                                     resolve=True)
        cfg["sweep"]["runs"] = {"scalerl": "r0", "loo-plan": "r1"}  # as a job's config holds them
        return Rungs(OmegaConf.create(cfg), "r1", tracker=None).active

    assert active() and not active("sweep.seeds=2") and not active("sweep.base_seeds=3")
