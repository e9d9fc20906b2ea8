"""The adaptive sweep with seeds end to end on the mock (local jobs, a real MLflow database): seeds added where the
verdict about the recipes is open, at looks that spend sweep.alpha, as new seeds of the same sweep; the report held
to the last look's boundary; a re-sweep takes no look and runs nothing. docs/fitting.md#an-adaptive-sweep-with-seeds."""

from __future__ import annotations

import csv
import json

import pytest

from ablate import seeding, tracking
from analysis.seeded import SEEDED_LOOK_TAG, boundary


@pytest.mark.e2e
def test_an_adaptive_sweep_with_seeds_adds_seeds_where_its_verdict_is_open_and_stops_at_its_last_look(tmp_path):
    """One axis (loo-plan, whose mock effect on A is -0.01) at sweep.margin_A=0.03, two looks, 2 seeds each to
    start: the first look needs 3 of each (planned before anything runs), finds loo-plan open, and adds the seeds the
    fixed design's information needs (the second look); the last look settles it, each look's boundary the
    O'Brien-Fleming one at its fractions; no run looked at a rung. Run again: no look, nothing run."""
    from conftest import one_axis_config, run_cli

    conf = one_axis_config(tmp_path)
    command = ["-m", "ablate", "--config-dir", str(conf), "sweep=loo", "generator=mock", "axes=one",
               "launcher=local", "sweep.margin_A=0.03", "sweep.adaptive=true", "sweep.seeds=2", "sweep.base_seeds=2",
               "sweep.looks=2"]
    first = run_cli(*command, cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "the adaptive sweep with seeds plans scalerl 3, loo-plan 3 seeds" in first.stdout
    client = tracking.client(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("tiny-mock").experiment_id
    (parent,) = tracking.find_runs(client, exp, role="sweep")
    looks = json.loads(parent.data.tags[seeding.LOOKS_TAG])
    assert [entry["look"] for entry in looks] == [1, 2]
    assert looks[0]["seeds"] == {"scalerl": 3, "loo-plan": 3} and not looks[0]["decided"]["loo-plan"]["settled"]
    assert looks[1]["decided"]["loo-plan"]["settled"]
    held = looks[1]["seeds"]
    assert held["loo-plan"] > 3 and held["scalerl"] > 3  # seeds added where the verdict was open
    runs = [r for r in tracking.find_runs(client, exp, role="variant")]
    assert {name: sum(r.data.tags["ablate.variant"] == name for r in runs) for name in held} == held
    assert all(r.info.status == "FINISHED" for r in runs)
    assert not any(k.startswith("ablate.rung.") for r in runs for k in r.data.tags)  # whole seeds, no rungs
    said = json.loads(next(r for r in runs if r.data.tags["ablate.variant"] == "loo-plan").data.tags[SEEDED_LOOK_TAG])
    assert said["look"] == 2 and said["times"][-1] == 1.0
    assert said["boundary"] == pytest.approx(boundary(said["times"], 0.02), abs=1e-4) and said["boundary"] > 2.3263
    assert "look 2 of 2" in first.stdout and "the adaptive sweep with seeds is done" in first.stdout
    (report,) = (tmp_path / "outputs" / "tiny" / "reports").glob("*/variants.csv")
    assert {r["variant"]: int(r["n_seeds"]) for r in csv.DictReader(report.open())} == held

    again = run_cli(*command, cwd=tmp_path, timeout=300)
    total = sum(held.values())
    assert again.returncode == 0 and f"0 to run, {total} already FINISHED" in again.stdout, again.stdout[-2000:]
    assert "look 3" not in again.stdout
    (parent,) = tracking.find_runs(client, exp, role="sweep")
    assert len(json.loads(parent.data.tags[seeding.LOOKS_TAG])) == 2
