"""The whole loop on the local launcher, as a user runs it: a real sweep, a real sqlite database, a report."""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from ablate import tracking
from conftest import run_cli, run_main
from test_sweeps import PAPER_LOO

SHORT = ["train.steps=20", "train.val_every=2", "model.num_layers=1", "model.hidden_size=32",
         "batch.prompts_per_step=8"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """`python -m ablate sweep=loo generator=mock launcher=local`, short, in a fresh folder."""
    folder = tmp_path_factory.mktemp("sweep")
    out = run_cli("-m", "ablate", "sweep=loo", "generator=mock", "launcher=local", *SHORT, cwd=folder)
    assert out.returncode == 0, out.stdout + out.stderr
    return folder, out


@pytest.mark.e2e  # the whole loop end to end: CI's e2e lane (docs/testing.md#markers)
def test_the_sweep_runs_every_variant_into_one_parent(swept):
    folder, _ = swept
    client = tracking.client(f"sqlite:///{folder}/mlflow.db")  # the default database: ./mlflow.db
    exp = client.get_experiment_by_name("tiny-mock")
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
        assert [m.step for m in history] == list(range(0, 21, 2))
        compute = client.get_metric_history(run.info.run_id, "compute/gpu_hours")
        assert [m.step for m in compute] == list(range(0, 21)) and compute[-1].value > compute[10].value > 0
        for key in ("train/reward_mean", "train/truncation_rate", "train/zero_variance_frac", "train/npr_dropped",
                    "train/staleness_min", "train/staleness_mean", "train/staleness_max", "compute/flops",
                    "perf/tokens_per_s", "perf/learner_s", "perf/weight_sync_s"):
            assert key in run.data.metrics, key
        assert run.data.params["loss.name"] == ("dapo" if tags["ablate.variant"] == "loo-dapo" else "cispo")


@pytest.mark.e2e  # the whole loop end to end: CI's e2e lane (docs/testing.md#markers)
def test_the_sweep_ends_with_a_report(swept):
    folder, out = swept
    reports = list((folder / "outputs" / "tiny" / "reports").glob("loo-*"))
    assert len(reports) == 1
    rows = list(csv.DictReader((reports[0] / "fits.csv").open()))
    assert sorted(r["variant"] for r in rows) == sorted(["scalerl", *PAPER_LOO])
    assert (reports[0] / "report.html").stat().st_size > 10_000
    assert "| # | variant |" in out.stdout and "report.html" in out.stdout
    # where the time went, phase by phase, after the report (two local jobs: the machine's two cores)
    last = out.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"time: [\d.]+ s: [\d.]+ s composing and signing 9 variants, [\d.]+ s the pre-flight checks, "
                        r"[\d.]+ s MLflow \(its database, the sweep's runs\), [\d.]+ s submitting 9 \(local\), "
                        rf"[\d.]+ s the runs \({min(9, os.cpu_count())} local jobs? side by side\), [\d.]+ s the report",
                        last), last


@pytest.mark.e2e  # the whole loop end to end: CI's e2e lane (docs/testing.md#markers)
def test_the_manifest_names_every_job(swept):
    folder, _ = swept
    (manifest,) = (folder / "outputs" / "tiny" / "jobs").glob("loo-*/manifest.json")
    jobs = json.loads(manifest.read_text())["jobs"]
    assert len(jobs) == 9 and all(j["job_id"] and j["run_id"] and j["signature"] for j in jobs)


@pytest.mark.e2e  # the whole loop end to end: CI's e2e lane (docs/testing.md#markers)
def test_running_the_same_sweep_again_submits_nothing(swept):
    folder, _ = swept
    out = run_cli("-m", "ablate", "sweep=loo", "generator=mock", "launcher=local", *SHORT, cwd=folder)
    assert out.returncode == 0, out.stderr
    assert "0 to run, 9 already FINISHED" in out.stdout
    client = tracking.client(f"sqlite:///{folder}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("tiny-mock").experiment_id])
    assert len(runs) == 10  # still one parent and nine children


@pytest.mark.slow  # what a re-sweep does with each run: test_sweeps.py; re-sweeps that submit nothing: here and
def test_a_changed_override_runs_only_what_is_new(swept):  # test_adaptive.py
    folder, _ = swept
    out = run_cli("-m", "ablate", "sweep=loo", "generator=mock", "launcher=local", "sweep.report=false", *SHORT,
                  "loss.eps_max=5",
                  cwd=folder)
    assert out.returncode == 0, out.stderr
    # CISPO's eps_max changes every variant but loo-dapo (the DAPO loss has no eps_max): 8 new runs, 1 reused
    assert "8 to run, 1 already FINISHED" in out.stdout


@pytest.mark.e2e  # the whole loop end to end: CI's e2e lane (docs/testing.md#markers)
def test_failing_variants_are_reported_and_lose_nothing(tmp_path):
    # A simulated crash at step 2 in every variant with NPR on (loo-npr, NPR off, runs to the end)
    out = run_cli("-m", "ablate", "sweep=loo", "generator=mock", "launcher=local", "train.steps=20",
                  "train.val_every=1", "generator.crash_at_step=2",
                  "generator.crash_when='filtering.no_positive_resampling=true'", cwd=tmp_path)
    assert out.returncode == 1
    assert "the simulated job crashes at step 2" in out.stderr  # the end of the failed job's traceback
    client = tracking.client(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("tiny-mock").experiment_id])
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


# -m slow. The two ways it can leave a run RUNNING are tested in the default suite: submitit's controller, Ctrl-C'd
# too, SIGKILLing its worker (test_a_local_workers_controller_ignores_ctrl_c_...), and a second SIGINT cutting a run's
# close short (test_trainer's second Ctrl-C)
@pytest.mark.slow
def test_ctrl_c_on_a_sweep_says_one_line_keeps_what_ran_and_leaves_no_empty_run(tmp_path):
    """SIGINT to the sweep's whole process group (what Ctrl-C in a terminal sends) once two variants are training:
    one line, no traceback; the runs that trained are KILLED with their metrics; the runs that never started are
    deleted, not left empty."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.Popen([sys.executable, "-m", "ablate", "sweep=loo", "generator=mock", "launcher=local",
                             "train.steps=100000", "train.val_every=5", "launcher.max_parallel_local=2",
                             "model.num_layers=1", "model.hidden_size=32"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    client, deadline = None, time.monotonic() + 240
    while time.monotonic() < deadline:
        time.sleep(1)
        if client is None and list((tmp_path / "outputs").glob("tiny/jobs/loo-*/manifest.json")):
            client = tracking.client(f"sqlite:///{tmp_path}/mlflow.db")  # submitted: the database is made
        experiment = client.get_experiment_by_name("tiny-mock") if client else None
        runs = client.search_runs([experiment.experiment_id]) if experiment else []
        if sum(r.info.status == "RUNNING" and "val/pass_rate" in r.data.metrics for r in runs) == 2:
            break
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=120)
    finally:  # whatever happened, no job of 100,000 steps outlives the test (it would starve the suite)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 130 and "Traceback" not in err + out, err
    assert err.strip().splitlines()[-1] == ("interrupted: 2 running jobs cancelled; what they logged is kept in "
                                            "MLflow, and the same command runs what did not finish")
    runs = client.search_runs([client.get_experiment_by_name("tiny-mock").experiment_id])
    variants = [r for r in runs if r.data.tags.get("ablate.role") == "variant"]
    assert sorted(r.info.status for r in variants) == ["KILLED", "KILLED"]  # the 7 that never started: deleted
    assert all(r.data.metrics["val/pass_rate"] > 0 for r in variants)
    (parent,) = [r for r in runs if r.data.tags.get("ablate.role") == "sweep"]
    assert parent.info.status == "KILLED"


def _wait_for_ctrl_c(marker: str) -> None:
    """A local worker's item: say it started, then wait for Ctrl-C and say so."""
    import time
    from pathlib import Path

    Path(marker).write_text("started")
    try:
        time.sleep(120)
    except KeyboardInterrupt:
        Path(marker).write_text("interrupted")
        raise


def test_a_local_workers_controller_ignores_ctrl_c_and_the_worker_takes_it(tmp_path):
    """Ctrl-C in a terminal reaches every process of a local sweep, submitit's job controllers too: one that took it
    passed SIGINT to its worker and SIGKILLed it a second later, and a run still closing stayed RUNNING. Controllers
    now ignore it: the worker gets it from the terminal, or from the sweep's cancel, and ends in its own time."""
    import os
    import signal
    import sys
    import time

    import cloudpickle

    from launch.submit import JobSpec, submit

    marker = tmp_path / "marker"
    launcher = {"cluster": "local", "timeout_min": 5, "nodes": 1, "gpus_per_node": 0, "cpus_per_task": 1,
                "max_parallel_local": 1}
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the worker cannot import the tests
    try:
        submission = submit(_wait_for_ctrl_c, [JobSpec("item", "signature", (str(marker),))], launcher,
                            tmp_path / "jobs", job_name="ctrl-c")
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    (job,) = submission.jobs()
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text() == "started") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.read_text() == "started"
    os.kill(job._process.pid, signal.SIGINT)  # the terminal's Ctrl-C, as the controller gets it
    time.sleep(2.0)
    assert not job.done() and marker.read_text() == "started"  # it neither ended nor passed it on
    submission.cancel()  # the sweep's own: SIGINT to the worker
    deadline = time.monotonic() + 30
    while not job.done() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job.done() and marker.read_text() == "interrupted"


def test_sinfo_lines_give_each_nodes_cpus_memory_and_gpus():
    """`sinfo -N -o %N|%P|%c|%m|%G` as SLURM writes it: gres with or without a type and a socket list, several
    gres, none; a `+` on a count of nodes that differ; the default partition's `*`."""
    from launch.submit import _node

    assert _node("gpu01|gpu*|64|512000|gpu:h100:8(S:0-1)") == {"default": True, "cpus": 64, "mem_mb": 512000,
                                                                 "gpus": 8}
    assert _node("n1|cpu|32+|128000|(null)") == {"default": False, "cpus": 32, "mem_mb": 128000, "gpus": 0}
    assert _node("n2|mix|16|64000|gpu:2,shard:8")["gpus"] == 2


def _note_gpus(path: str) -> None:
    """A local worker's item: write down the GPUs its process sees."""
    Path(path).write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "all"))


def test_local_jobs_on_a_machine_of_several_gpus_each_see_their_own(tmp_path):
    """A machine of 5 GPUs (their ids as its CUDA_VISIBLE_DEVICES lists them), jobs of 2 GPUs each: two workers at
    once (a third would have none), each seeing 2 GPUs no other sees; the jobs of a worker, in turn, its own two.
    (Before, submitit's local executor gave every job the first launcher.gpus_per_node GPUs: all on the same ones.)"""
    import cloudpickle

    from launch.submit import JobSpec, submit

    launcher = {"cluster": "local", "timeout_min": 5, "nodes": 1, "gpus_per_node": 0, "cpus_per_task": 1,
                "max_parallel_local": 4}
    specs = [JobSpec(f"item{i}", f"s{i}", (str(tmp_path / f"seen{i}"),)) for i in range(4)]
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the worker cannot import the tests
    try:
        submission = submit(_note_gpus, specs, launcher, tmp_path / "jobs", job_name="gpus",
                            gpus=["7", "6", "5", "4", "3"], gpus_per_job=2)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert len(submission.jobs()) == 2
    deadline = time.monotonic() + 120
    while not submission.finished() and time.monotonic() < deadline:
        time.sleep(0.2)
    seen = [(tmp_path / f"seen{i}").read_text() for i in range(4)]
    assert seen == ["7,6", "5,4", "7,6", "5,4"]  # items dealt round robin to the two workers


def test_a_local_sweep_whose_layout_takes_more_gpus_than_the_machine_has_fails_before_any_run(tmp_path):
    """The local jobs' GPUs come from what the layout takes (trainer ranks + engine processes, on a GPU model); one
    that this machine cannot hold is refused, naming both numbers, before a run is created."""
    from ablate.config import compose
    from ablate.preflight import local_gpus

    cfg = compose(["run=fsdp", "run.generator_gpus=1", "model.device=cuda", "generator=hf"])
    os.environ["CUDA_VISIBLE_DEVICES"], previous = "0,1", os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        assert local_gpus(cfg) == (["0", "1"], 3)
        assert local_gpus(compose(["model.device=cpu"])) == ([], 0)
    finally:
        if previous is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES")
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = previous
    out = run_main("-m", "ablate", "sweep=recipes", "sweep.recipes=[scalerl]", "launcher=local", "run=fsdp",
                   "run.generator_gpus=1", "model.device=cuda", cwd=tmp_path, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert out.returncode == 2
    assert "error: each variant's layout takes 3 GPU(s) (run.trainer_gpus + run.generator_gpus) and this machine " \
           "has 2" in out.stderr
    assert not (tmp_path / "mlflow.db").exists()
