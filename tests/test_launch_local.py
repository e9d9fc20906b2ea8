"""The whole loop on the local launcher, as a user runs it: a real sweep, a real sqlite database, a report."""

from __future__ import annotations

import csv
import json

import pytest

from ablate import tracking
from conftest import run_cli
from test_sweeps import PAPER_LOO

SHORT = ["train.steps=60", "train.val_every=5", "model.num_layers=1", "model.hidden_size=32"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """`python -m ablate sweep=loo generator=mock launcher=local`, short, in a fresh folder."""
    folder = tmp_path_factory.mktemp("sweep")
    out = run_cli("-m", "ablate", "sweep=loo", "generator=mock", "launcher=local", *SHORT, cwd=folder)
    assert out.returncode == 0, out.stdout + out.stderr
    return folder, out


def test_the_sweep_runs_every_variant_into_one_parent(swept):
    folder, _ = swept
    client = tracking.client(f"sqlite:///{folder}/mlflow.db")  # the default database: ./mlflow.db
    exp = client.get_experiment_by_name("tiny")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("ablate.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("ablate.role") == "variant"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    sweep = parents[0].data.tags["ablate.sweep"]
    assert sweep.startswith("loo-")
    assert sorted(r.data.tags["ablate.variant"] for r in children) == sorted(["scalerl", *PAPER_LOO])
    for run in children:
        tags = run.data.tags
        assert run.info.status == "FINISHED"
        assert tags["mlflow.parentRunId"] == parents[0].info.run_id and tags["ablate.sweep"] == sweep
        assert len(tags["ablate.signature"]) == 12
        if tags["ablate.variant"] != "scalerl":
            assert f"{tags['ablate.axis']}={tags['ablate.choice']}" == PAPER_LOO[tags["ablate.variant"]]
        history = client.get_metric_history(run.info.run_id, "val/pass_rate")
        assert [m.step for m in history] == list(range(0, 61, 5))
        compute = client.get_metric_history(run.info.run_id, "compute/gpu_hours")
        assert [m.step for m in compute] == list(range(0, 61)) and compute[-1].value > compute[30].value > 0
        for key in ("train/reward_mean", "train/truncation_rate", "train/zero_variance_frac", "train/npr_dropped",
                    "train/staleness_min", "train/staleness_mean", "train/staleness_max", "compute/flops",
                    "perf/tokens_per_s"):
            assert key in run.data.metrics, key
        assert run.data.params["loss.name"] == ("dapo" if tags["ablate.variant"] == "loo-dapo" else "cispo")


def test_the_sweep_ends_with_a_report(swept):
    folder, out = swept
    reports = list((folder / "outputs" / "tiny" / "reports").glob("loo-*"))
    assert len(reports) == 1
    rows = list(csv.DictReader((reports[0] / "fits.csv").open()))
    assert sorted(r["variant"] for r in rows) == sorted(["scalerl", *PAPER_LOO])
    assert (reports[0] / "report.html").stat().st_size > 10_000
    assert "| rank | variant |" in out.stdout and "report.html" in out.stdout


def test_the_manifest_names_every_job(swept):
    folder, _ = swept
    (manifest,) = (folder / "outputs" / "tiny" / "jobs").glob("loo-*/manifest.json")
    jobs = json.loads(manifest.read_text())["jobs"]
    assert len(jobs) == 9 and all(j["job_id"] and j["run_id"] and j["signature"] for j in jobs)


def test_running_the_same_sweep_again_submits_nothing(swept):
    folder, _ = swept
    out = run_cli("-m", "ablate", "sweep=loo", "generator=mock", "launcher=local", *SHORT, cwd=folder)
    assert out.returncode == 0, out.stderr
    assert "0 to run, 9 already FINISHED" in out.stdout
    client = tracking.client(f"sqlite:///{folder}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert len(runs) == 10  # still one parent and nine children


def test_a_changed_override_runs_only_what_is_new(swept):
    folder, _ = swept
    out = run_cli("-m", "ablate", "sweep=loo", "generator=mock", "launcher=local", "sweep.report=false", *SHORT,
                  "loss.eps_max=5",
                  cwd=folder)
    assert out.returncode == 0, out.stderr
    # CISPO's eps_max changes every variant but loo-dapo (the DAPO loss has no eps_max): 8 new runs, 1 reused
    assert "8 to run, 1 already FINISHED" in out.stdout


def test_failing_variants_are_reported_and_lose_nothing(tmp_path):
    # NPR with threshold 0 retires every prompt after its first epoch: every variant with NPR on fails at step 2
    # (loo-npr, NPR off, runs to the end)
    out = run_cli("-m", "ablate", "sweep=loo", "generator=mock", "launcher=local", "train.steps=20",
                  "train.val_every=1",
                  "filtering.npr_threshold=0.0", "task.n_train_prompts=8", cwd=tmp_path)
    assert out.returncode == 1
    assert "retired every training prompt" in out.stderr  # the end of the failed job's traceback
    client = tracking.client(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    by_variant = {r.data.tags["ablate.variant"]: r for r in runs if r.data.tags["ablate.role"] == "variant"}
    parent = next(r for r in runs if r.data.tags["ablate.role"] == "sweep")
    assert parent.info.status == "FAILED"
    assert by_variant["loo-npr"].info.status == "FINISHED"
    for name, run in by_variant.items():
        if name == "loo-npr":
            continue
        assert run.info.status == "FAILED", name
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val/pass_rate")]
        assert steps == [0, 1], name  # what was measured before the failure is in MLflow
    rows = (next((tmp_path / "outputs" / "tiny" / "reports").glob("loo-*")) / "fits.csv").read_text()
    assert rows.count("\n") == 10  # header + 9 runs: the report is made all the same
