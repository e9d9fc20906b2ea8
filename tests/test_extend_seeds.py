"""sweep.extend=true adds the seeds the last report says would settle its open recipe-level verdicts, as new seeds of
the same sweep (named seed+k, signed so that nothing runs twice), and a re-sweep submits only what is missing.
docs/fitting.md#what-would-settle-a-verdict."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from ablate import tracking
from ablate.config import compose

COLUMNS = ["variant", "n_seeds", "more_seeds_variant", "more_seeds_base", "more_seeds_gpu_hours"]


def _csv(path: Path, rows: list[list]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    return path


def test_the_seeds_a_report_asks_for_are_planned_as_new_seeds_of_the_same_sweep(tmp_path: Path):
    """A report of two seeds of the base and one of each variant: loo-dapo open (3 more of it, 2 of the base),
    loo-savg open (1 more of it, 5 of the base), loo-plan settled. The base's seeds serve every variant: 2 + max(2, 5)
    = 7; loo-dapo 1 + 3 = 4, loo-savg 2, the others keep the seeds they have. Planned: the new ones at seed+1.. and
    the sweep's id is the one-seed sweep's (its seeds at the command line's seed), so they go on in the same sweep."""
    from ablate.run import plan, seeds_to_settle, sweep_id

    report = _csv(tmp_path / "variants.csv", [["scalerl", 2, "", "", ""], ["loo-dapo", 1, 3, 2, "5000"],
                                              ["loo-savg", 1, 1, 5, "6000"], ["loo-plan", 1, "", "", ""]])
    counts = seeds_to_settle(report)
    assert counts == {"scalerl": 7, "loo-dapo": 4, "loo-savg": 2, "loo-plan": 1}
    assert seeds_to_settle(tmp_path / "none.csv") == {}
    cfg = compose(["sweep=loo"])
    one = plan(cfg, ["sweep=loo"])
    more = plan(cfg, ["sweep=loo"], counts)
    labels = [p.variant.label for p in more]
    assert [x for x in labels if x.startswith("scalerl")] == ["scalerl"] + [f"scalerl seed+{k}" for k in range(1, 7)]
    assert [x for x in labels if x.startswith("loo-dapo")] == ["loo-dapo", "loo-dapo seed+1", "loo-dapo seed+2",
                                                              "loo-dapo seed+3"]
    assert labels.count("loo-lp") == 1 and len(labels) == 9 + 6 + 3 + 1
    assert len({p.signature for p in more}) == len(more)  # each seed signed apart: none is another's run
    assert {p.signature for p in one} <= {p.signature for p in more}  # the runs it has are the same runs
    assert sweep_id(cfg, more) == sweep_id(cfg, one)


def test_a_re_sweep_without_extend_keeps_the_seeds_the_sweep_holds(mlflow_uri: str, capsys):
    """A sweep extended before (3 seeds of loo-dapo in MLflow, one of them a forced re-run: the same signature; 2 of
    the base) and planned again at one seed a variant: the plan keeps every seed held, at the same signatures, and
    says so; a variant held at the seeds asked and runs of another sweep change nothing. Before, the re-sweep
    planned (and reported) one seed of each."""
    from ablate.run import keep_seeds_held, plan, seeds_held

    cfg = compose(["sweep=loo"])
    every = {p.variant.label: p for p in plan(cfg, ["sweep=loo"], {"loo-dapo": 3, "scalerl": 2, "loo-savg": 3})}
    more = {label: p for label, p in every.items() if label not in ("loo-savg seed+1", "loo-savg seed+2")}
    client = tracking.client(mlflow_uri)
    exp = tracking.experiment_id(client, "seeds")
    for label, sweep in [("loo-dapo", "loo-1"), ("loo-dapo seed+1", "loo-1"), ("loo-dapo seed+2", "loo-1"),
                         ("loo-dapo seed+2", "loo-1"), ("scalerl", "loo-1"), ("scalerl seed+1", "loo-1"),
                         ("loo-savg", "loo-1"), ("loo-savg seed+1", "loo-2"), ("loo-savg seed+2", "loo-2")]:
        p = every[label]
        tracking.create_variant_run(client, exp, label, {"ablate.sweep": sweep, "ablate.variant": p.variant.name,
                                                         "ablate.signature": p.signature})
    held = seeds_held(client, exp, "loo-1")
    assert held == {"loo-dapo": 3, "scalerl": 2, "loo-savg": 1}
    one = plan(cfg, ["sweep=loo"])
    kept = keep_seeds_held(cfg, ["sweep=loo"], one, held)
    assert [p.variant.label for p in kept] == list(more)
    assert [p.signature for p in kept] == [p.signature for p in more.values()]
    assert "kept, scalerl 2, loo-dapo 3" in capsys.readouterr().out
    assert keep_seeds_held(cfg, ["sweep=loo"], one, {"loo-savg": 1, "loo-gone": 4}) is one


@pytest.mark.e2e
def test_extend_runs_exactly_the_seeds_the_report_asks_for_and_a_re_sweep_runs_nothing(tmp_path: Path):
    """A mock sweep of one axis (loo-plan, whose mock effect is small) at sweep.margin_A=0.07: its report's open
    recipe-level verdict asks for more seeds; sweep.extend=true runs exactly those in the same sweep, and again runs
    nothing (every seed FINISHED with its signature), as does a plain re-sweep, whose report keeps every seed."""
    from conftest import one_axis_config, run_cli

    conf = one_axis_config(tmp_path)
    command = ["-m", "ablate", "--config-dir", str(conf), "sweep=loo", "generator=mock", "axes=one",
               "launcher=local", "sweep.margin_A=0.07"]
    first = run_cli(*command, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    (report,) = (tmp_path / "outputs" / "tiny" / "reports").glob("*/variants.csv")
    row = next(r for r in csv.DictReader(report.open()) if r["variant"] == "loo-plan")
    assert row["more_seeds_variant"] or row["more_seeds_base"], row  # open at 0.07 with one seed a side
    want = {"loo-plan": 1 + int(row["more_seeds_variant"] or 0), "scalerl": 1 + int(row["more_seeds_base"] or 0)}
    added = sum(want.values()) - 2

    more = run_cli(*command, "sweep.extend=true", cwd=tmp_path)
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    assert f"{added} to run, 2 already FINISHED" in more.stdout and report.parent.name in more.stdout
    client = tracking.client(f"sqlite:///{tmp_path}/mlflow.db")
    runs = [r for r in client.search_runs([client.get_experiment_by_name("tiny-mock").experiment_id])
            if r.data.tags.get("ablate.role") == "variant"]
    seen = {name: sum(r.data.tags["ablate.variant"] == name for r in runs) for name in want}
    assert seen == want and all(r.info.status == "FINISHED" for r in runs)
    assert {r.data.tags["ablate.sweep"] for r in runs} == {report.parent.name}  # the same sweep

    again = run_cli(*command, "sweep.extend=true", cwd=tmp_path)
    assert again.returncode == 0 and f"0 to run, {len(runs)} already FINISHED" in again.stdout, again.stdout[-2000:]

    plain = run_cli(*command, cwd=tmp_path)  # without extend: the seeds held stay in the sweep and its report
    assert plain.returncode == 0 and f"0 to run, {len(runs)} already FINISHED" in plain.stdout, plain.stdout[-2000:]
    reported = {r["variant"]: int(r["n_seeds"]) for r in csv.DictReader(report.open())}
    assert reported == want, reported
