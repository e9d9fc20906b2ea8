"""The SLURM path on a real cluster (tests/slurm_cluster.py): job arrays, GPU requests, status, requeue and cancel
with resume, idempotent re-sweeps, jobs of two nodes. Skipped, with the reason, where the cluster cannot start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ablate import tracking
from conftest import one_axis_config, run_cli
from test_sweeps import PAPER_LOO

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]  # a real cluster: CI's e2e lane

# The mock generator on a 1-layer model: these tests are about the cluster, not the model. The test cluster lets 8
# jobs share a core (OverSubscribe=FORCE:8), so an array of 9 runs at once on 2 cores; array_parallelism keeps as
# many running at a time as there are cores, as a real cluster would run them. Their times: docs/testing.md#slurm.
SLURM = ["generator=mock", "model.num_layers=1", "model.hidden_size=32", "launcher=slurm",
         "launcher.cpus_per_task=1", "launcher.gpus_per_node=1", "launcher.mem_gb=1", "launcher.timeout_min=10",
         f"launcher.array_parallelism={os.cpu_count() or 1}"]


def _ablate(cwd, *overrides, env, config_dir=None):
    where = ["--config-dir", str(config_dir)] if config_dir else []  # Hydra takes its flags before the overrides
    return run_cli("-m", "ablate", *where, *SLURM, *overrides, cwd=cwd, env=env)


def _status(cwd, *args):
    return run_cli("-m", "launch", "status", *args, cwd=cwd)


def _queued(cwd) -> bool:
    """Whether SLURM still holds a job of the sweep (squeue: a cheap poll; `launch status` costs ~5 CPU-seconds of
    imports, which polled every few seconds took a core from the jobs)."""
    arrays = sorted({row["job_id"].split("_")[0] for row in _manifest(cwd)["jobs"]})
    out = subprocess.run(["squeue", "-h", "-j", ",".join(arrays)], capture_output=True, text=True)
    return out.returncode == 0 and bool(out.stdout.strip())


def _wait_until_done(cwd, timeout=300) -> subprocess.CompletedProcess:
    deadline = time.monotonic() + timeout
    out = None
    while time.monotonic() < deadline:
        time.sleep(2)
        if _queued(cwd):
            continue
        out = _status(cwd)
        if out.returncode == 2 or not any(s in out.stdout for s in (" pending ", " running ", " requeued ", " unknown ")):
            return out
    raise AssertionError(f"the sweep did not end in {timeout} s:\n{out.stdout if out else _status(cwd).stdout}")


def _client(cwd, experiment="tiny-mock"):
    client = tracking.client(f"sqlite:///{cwd}/mlflow.db")
    return client, client.get_experiment_by_name(experiment).experiment_id


def _manifest(cwd) -> dict:
    (path,) = (cwd / "outputs" / "tiny" / "jobs").glob("*/manifest.json")
    return json.loads(path.read_text())


FSDP_SWEEP = pytest.param(["run=fsdp", "launcher.gpus_per_node=2"], marks=pytest.mark.slow)  # 2 ranks x 9 jobs


@pytest.mark.slow  # the default suite submits an adaptive sweep as one array (the last test of this file)
@pytest.mark.parametrize("layout", [[], FSDP_SWEEP], ids=["one_process", "fsdp"])
def test_a_loo_sweep_is_one_job_array_that_completes_into_mlflow(layout, slurm, tmp_path):
    """fsdp (-m slow; the 2-rank runs themselves are in the default suite, tests/test_parallel.py and test_resume.py):
    each variant's job starts 2 trainer ranks (torch's elastic launcher inside the job's one task, gloo)."""
    started = time.monotonic()
    out = _ablate(tmp_path, "sweep=loo", "train.steps=10", "train.val_every=5", *layout, env=slurm.env)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 60  # returns at once, with the job ids
    manifest = _manifest(tmp_path)
    array = {row["job_id"].split("_")[0] for row in manifest["jobs"]}
    assert len(array) == 1, "one job array"
    assert all(f"{row['variant']}: job {row['job_id']}" in out.stdout for row in manifest["jobs"])

    status = _wait_until_done(tmp_path)
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.count(" completed ") == 9
    states = slurm.run("sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", array.pop()).stdout.split()
    assert len(states) == 9 and all(line.endswith("|COMPLETED") for line in states)
    client, exp = _client(tmp_path)
    runs = [r for r in client.search_runs([exp]) if r.data.tags["ablate.role"] == "variant"]
    assert sorted(r.data.tags["ablate.variant"] for r in runs) == sorted(["scalerl", *PAPER_LOO])
    assert all(r.info.status == "FINISHED" for r in runs)
    assert {r.data.params["trainer.ranks"] for r in runs} == {"2" if layout else "1"}

    again = _ablate(tmp_path, "sweep=loo", "train.steps=10", "train.val_every=5", *layout, env=slurm.env)
    assert "0 to run, 9 already FINISHED" in again.stdout  # a re-sweep submits nothing
    jobs = slurm.run("sacct", "-n", "-X", "-P", "-o", "JobID").stdout.split()
    assert len([j for j in jobs if j.split("_")[0] == manifest["jobs"][0]["job_id"].split("_")[0]]) == 9


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _mlflow_server(folder, port: int) -> subprocess.Popen:
    """`mlflow server` as docs/cluster.md has cluster users run it (less the auth app), on a sqlite store in
    `folder`; returns once it answers /health."""
    import sys
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                             f"sqlite:///{folder}/server.db", "--artifacts-destination", str(folder / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=open(folder / "server.log", "a"),
                            start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"mlflow server did not start:\n{(folder / 'server.log').read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    import signal

    os.killpg(proc.pid, signal.SIGTERM)  # the server and its workers
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def test_an_adaptive_sweep_decides_in_its_jobs_through_a_server_restart(slurm, tmp_path):
    """The submitter returns at once; the jobs decide at their rungs by reading each other's runs from a real
    `mlflow server`, which is restarted while they run: every decision is taken once, every point logged once."""
    from analysis.adaptive import decisions_of
    from analysis.runs import SETTLED_TAG
    from test_adaptive import ADAPTIVE

    (tmp_path / "conf" / "axes").mkdir(parents=True)
    (tmp_path / "conf" / "axes" / "one.yaml").write_text(
        "# @package _global_\naxes:\n  - {path: precision, base: bf16, variant: loo-fp32}\n")
    port = _free_port()
    server = _mlflow_server(tmp_path, port)
    uri = f"http://127.0.0.1:{port}"
    command = ["-m", "ablate", "--config-dir", str(tmp_path / "conf"), *ADAPTIVE[2:], *SLURM,
               f"tracking.uri={uri}", "tracking.flush_every=20"]
    try:
        started = time.monotonic()
        out = run_cli(*command, cwd=tmp_path, env=slurm.env)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert time.monotonic() - started < 60 and "2 to run" in out.stdout  # submitted, and gone
        client = tracking.client(uri)
        exp = client.get_experiment_by_name("tiny-mock").experiment_id
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # both jobs are logging: restart the server under them
            runs = [r for r in client.search_runs([exp]) if r.data.tags.get("ablate.role") == "variant"]
            if len(runs) == 2 and all(r.data.metrics.get("compute/gpu_hours", 0) > 0 for r in runs):
                break
            time.sleep(1)
        base_run = next(r for r in runs if r.data.tags["ablate.variant"] == "scalerl")
        assert base_run.info.status == "RUNNING"  # the restart is mid-sweep: the base has steps to go
        _stop(server)
        time.sleep(3)
        server = _mlflow_server(tmp_path, port)
        status = _wait_until_done(tmp_path)
        assert status.returncode == 0, status.stdout + status.stderr
        (array,) = {row["job_id"].split("_")[0] for row in _manifest(tmp_path)["jobs"]}  # one job array
        states = slurm.run("sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", array).stdout.split()
        assert len(states) == 2 and all(line.endswith("|COMPLETED") for line in states)  # a stop is a success

        runs = {r.data.tags["ablate.variant"]: r for r in client.search_runs([exp])
                if r.data.tags.get("ablate.role") == "variant"}
        variant, base = runs["loo-fp32"], runs["scalerl"]
        assert variant.info.status == base.info.status == "FINISHED"
        settled, rungs = int(variant.data.tags[SETTLED_TAG]), list(range(5, 40, 5))  # looks every eighth of 40
        assert settled in rungs
        assert [d.step for d in decisions_of(variant.data.tags)] == rungs[:rungs.index(settled) + 1]
        looked = decisions_of(base.data.tags)  # the base goes on until it finds its variant settled, then stops
        assert all(d.decision == "go on" for d in looked[:-1]) and looked[-1].step <= 35
        base_last = looked[-1].step if looked[-1].stop else 40
        # every decision taken once: each job printed each of its rungs' decisions once
        logs = "".join(p.read_text() for p in (tmp_path / "outputs").rglob("*_log.err"))
        for d in decisions_of(variant.data.tags):
            assert logs.count(f"loo-fp32 {d.summary()}") == 1
        for name, last in (("loo-fp32", settled), ("scalerl", base_last)):
            steps = [m.step for m in client.get_metric_history(runs[name].info.run_id, "compute/gpu_hours")]
            assert sorted(steps) == list(range(last + 1))  # every point there, once

        again = run_cli(*command, cwd=tmp_path, env=slurm.env)
        assert again.returncode == 0 and "0 to run, 2 already FINISHED" in again.stdout
    finally:
        _stop(server)


@pytest.mark.slow
def test_a_job_of_trainer_ranks_and_an_engine_process_finishes(slurm, tmp_path):
    """run=fsdp run.generator_gpus=1 on SLURM (generator=hf: the mock has no engine): the job's one task starts 2
    trainer ranks and the generator's engine process (gloo), and the run finishes with the engine's figures."""
    args = [a for a in SLURM if a != "generator=mock"]
    out = run_cli("-m", "ablate", *args, "sweep=recipes", "sweep.recipes=[scalerl]", "run=fsdp",
                  "run.generator_gpus=1", "launcher.gpus_per_node=3", "train.steps=10", "train.val_every=5",
                  "task.n_val_prompts=16", cwd=tmp_path, env=slurm.env)
    assert out.returncode == 0, out.stderr
    status = _wait_until_done(tmp_path, timeout=600)
    assert status.stdout.count(" completed ") == 1, status.stdout + status.stderr
    client = tracking.client(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("tiny").experiment_id  # not the mock's tiny-mock
    (run,) = [r for r in client.search_runs([exp]) if r.data.tags["ablate.role"] == "variant"]
    assert run.info.status == "FINISHED"
    assert run.data.params["trainer.ranks"] == "2" and run.data.params["run.generator_gpus"] == "1"
    assert run.data.metrics["perf/engine_load_s"] > 0 and run.data.metrics["perf/generator_tokens_per_s_per_gpu"] > 0


def _histories(cwd, *keys, experiment="tiny-mock") -> dict[str, list[tuple[int, float]]]:
    """The finished variant run's metric histories, (step, value to 6 decimals) in step order."""
    client, exp = _client(cwd, experiment)
    (run,) = [r for r in client.search_runs([exp]) if r.data.tags["ablate.role"] == "variant"]
    assert run.info.status == "FINISHED"
    return {key: sorted((m.step, round(m.value, 6)) for m in client.get_metric_history(run.info.run_id, key))
            for key in keys}


@pytest.mark.slow  # the default suite runs a 2-node job with SLURM's variables set by hand (tests/test_parallel.py),
# which takes a fraction of this one's time
def test_a_job_of_two_nodes_trains_as_a_job_of_one_and_resumes_when_requeued(slurm, tmp_path):
    """run=fsdp as one SLURM job over two nodes (partition `two`), a trainer rank on each: one task a node, node 0
    hosting the ranks' rendezvous (static, ranks by SLURM_NODEID), the gloo group between the nodes, the checkpoint's
    shards written by both. Requeued mid-run (both nodes' tasks killed), it resumes from its checkpoint with no step
    lost or logged twice, and its curve is the one of the same 2 ranks in one node's job, never stopped (exactly: the
    mock's rollouts do not depend on the weights, so nothing regenerated after the restart can differ)."""
    if len(slurm.nodes) < 2:
        pytest.skip(f"this machine is named {slurm.node}: the test cluster's second node needs that name")
    import slurm_cluster

    steps = 60  # enough that the two-node job is still mid-run when it is requeued (from step 15 on)
    common = ["sweep=recipes", "sweep.recipes=[scalerl]", "run=fsdp", f"train.steps={steps}", "train.val_every=5",
              "train.checkpoint_every=10"]
    one, two = tmp_path / "one_node", tmp_path / "two_nodes"
    layouts = {one: ["launcher.gpus_per_node=2"],
               two: ["launcher.nodes=2", "launcher.gpus_per_node=1", f"launcher.partition={slurm_cluster.TWO_NODES}"]}
    for folder, layout in layouts.items():
        folder.mkdir()
        out = _ablate(folder, *common, *layout, env=slurm.env)
        assert out.returncode == 0, out.stderr
    run_id = _wait_for_step(two, 15)
    job = _manifest(two)["jobs"][0]["job_id"]
    slurm.run("scontrol", "requeue", job)
    for folder in layouts:
        status = _wait_until_done(folder, timeout=400)
        assert status.stdout.count(" completed ") == 1, status.stdout + status.stderr
    nodes = slurm.run("sacct", "-n", "-X", "-P", "-o", "NNodes,NodeList", "-j", job).stdout.split()
    assert nodes[-1] == f"2|{','.join(sorted(slurm.nodes))}"  # the last of its jobs (a requeued job keeps its id)
    logs = sorted(p.name for p in (two / "outputs" / "tiny" / "jobs").glob(f"*/{job}_*_log.out"))
    assert logs == [f"{job}_0_log.out", f"{job}_1_log.out"]  # a task on each node
    client, _ = _client(two)
    _assert_complete(client, run_id, steps)
    assert int(client.get_run(run_id).data.tags["ablate.resumed_from"]) >= 10  # the second start used a checkpoint
    keys = ("loss/policy", "train/reward_mean", "val/pass_rate")
    alone, spread = _histories(one, *keys), _histories(two, *keys)
    assert [step for step, _ in spread["loss/policy"]] == list(range(1, steps + 1))
    assert spread == alone


@pytest.mark.slow  # 2 x 4 processes with the hf engine on 2 cores
def test_a_job_of_two_nodes_with_the_engines_on_the_second_trains_as_a_job_of_one(slurm, tmp_path):
    """The paper's arrangement in small: trainer nodes and generator nodes. run=fsdp + run.generator_gpus=2 over two
    nodes puts the 2 trainer ranks on node 0 and the 2 engine processes on node 1 (local ranks 0 and 1 there), the
    weights group spanning the nodes; the curve is the one-node job's."""
    if len(slurm.nodes) < 2:
        pytest.skip(f"this machine is named {slurm.node}: the test cluster's second node needs that name")
    import slurm_cluster

    args = [a for a in SLURM if a != "generator=mock"]
    common = ["sweep=recipes", "sweep.recipes=[scalerl]", "run=fsdp", "run.generator_gpus=2", "train.steps=6",
              "train.val_every=3", "task.n_val_prompts=16"]
    one, two = tmp_path / "one_node", tmp_path / "two_nodes"
    layouts = {one: ["launcher.gpus_per_node=4"],
               two: ["launcher.nodes=2", "launcher.gpus_per_node=2", f"launcher.partition={slurm_cluster.TWO_NODES}"]}
    for folder, layout in layouts.items():
        folder.mkdir()
        out = run_cli("-m", "ablate", *args, *common, *layout, cwd=folder, env=slurm.env)
        assert out.returncode == 0, out.stderr
    for folder in layouts:
        status = _wait_until_done(folder, timeout=600)
        assert status.stdout.count(" completed ") == 1, status.stdout + status.stderr
    keys = ("loss/policy", "train/reward_mean", "val/pass_rate", "perf/engine_load_s")
    alone, spread = (_histories(folder, *keys, experiment="tiny") for folder in layouts)  # not the mock's tiny-mock
    assert spread.pop("perf/engine_load_s") and alone.pop("perf/engine_load_s")  # the engines loaded the weights
    assert [step for step, _ in spread["loss/policy"]] == list(range(1, 7))
    assert spread == alone


def test_a_gpu_request_reaches_the_job(slurm, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES\n")
    out = slurm.run("sbatch", "--wait", "--gres=gpu:2", "-o", str(tmp_path / "out.txt"), str(script))
    assert out.returncode == 0
    assert (tmp_path / "out.txt").read_text().strip() == "CUDA_VISIBLE_DEVICES=0,1"


def test_a_request_no_node_can_hold_fails_before_submit_naming_it(slurm, tmp_path):
    """SLURM accepts a job no node of its partition can hold and leaves it pending for ever: refused here before
    anything is created, naming the resource (the test cluster's nodes have 8 GPUs; partition `two` has 2 nodes)."""
    out = _ablate(tmp_path, "sweep=recipes", "sweep.recipes=[scalerl]", "launcher.gpus_per_node=16", env=slurm.env)
    assert out.returncode == 2
    assert "error: launcher.gpus_per_node=16: no node of the default partition has that many GPUs (the most: 8)" \
        in out.stderr
    out = _ablate(tmp_path, "sweep=recipes", "sweep.recipes=[scalerl]", "run=fsdp", "run.trainer_gpus=3",
                  "launcher.nodes=3", "launcher.partition=two", env=slurm.env)
    assert out.returncode == 2
    assert "error: launcher.nodes=3: partition two has 2 node(s) that hold 1 CPUs, 1 GB and 1 GPUs each" in out.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "outputs" / "tiny" / "jobs").exists()


def test_a_pending_job_shows_why_in_status(slurm, tmp_path):
    out = _ablate(tmp_path, "sweep=recipes", "sweep.recipes=[scalerl]", "+launcher.additional.begin=now+1hour",
                  env=slurm.env)
    assert out.returncode == 0, out.stderr
    try:
        assert " pending (BeginTime) " in _status(tmp_path).stdout
    finally:
        assert run_cli("-m", "launch", "cancel", cwd=tmp_path).returncode == 0


def test_a_failed_job_shows_its_traceback_in_status(slurm, tmp_path):
    # the mock's simulated crash: the job raises at step 2
    out = _ablate(tmp_path, "sweep=recipes", "sweep.recipes=[scalerl]", "train.steps=20",
                  "generator.crash_at_step=2", env=slurm.env)
    assert out.returncode == 0, out.stderr
    status = _wait_until_done(tmp_path)
    assert status.returncode == 1
    assert " failed " in status.stdout
    assert "simulated job crashes at step 2" in status.stdout  # the end of the job's traceback


def _last_step(client, run_id) -> int:
    return max((m.step for m in client.get_metric_history(run_id, "compute/gpu_hours")), default=-1)


def _wait_for_step(tmp_path, step, timeout=240) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(2)
        if (tmp_path / "mlflow.db").exists():
            client, exp = _client(tmp_path)
            runs = [r for r in client.search_runs([exp]) if r.data.tags["ablate.role"] == "variant"]
            if runs and _last_step(client, runs[0].info.run_id) >= step:
                return runs[0].info.run_id
    raise AssertionError(f"the run did not reach step {step}:\n{_status(tmp_path).stdout}")


def _assert_contiguous(client, run_id) -> int:
    """Every step from 0 to the last one logged is there once: none lost, none logged twice. Returns the last."""
    for key in client.get_run(run_id).data.metrics:
        logged = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(logged) == len(set(logged)), f"{key}: a step logged twice"
    compute = sorted(m.step for m in client.get_metric_history(run_id, "compute/gpu_hours"))
    assert compute == list(range(0, compute[-1] + 1)), "a step is missing"
    return compute[-1]


def _assert_complete(client, run_id, steps):
    assert client.get_run(run_id).info.status == "FINISHED"
    assert _assert_contiguous(client, run_id) == steps


# Too many steps to finish within the test: an interruption can never come after the run's end, however fast the
# machine. Each test waits for the run's own state (a step logged, a restart tagged), never for a time.
RESUMABLE = ["sweep=recipes", "sweep.recipes=[scalerl]", "train.steps=100000", "train.checkpoint_every=20",
             "train.val_every=5"]


def _wait_for_resume(tmp_path, run_id, steps_after=10, timeout=240) -> int:
    """The step the run resumed from, once it has logged `steps_after` steps past it."""
    deadline = time.monotonic() + timeout
    client, _ = _client(tmp_path)
    while time.monotonic() < deadline:
        time.sleep(2)
        resumed = client.get_run(run_id).data.tags.get("ablate.resumed_from")
        if resumed is not None and _last_step(client, run_id) >= int(resumed) + steps_after:
            return int(resumed)
    raise AssertionError(f"run {run_id} did not resume and go on:\n{_status(tmp_path).stdout}")


@pytest.mark.slow  # the default suite requeues a warned job here, and resumes a killed run in test_resume.py
def test_a_requeued_job_resumes_its_run_with_no_lost_or_duplicated_steps(slurm, tmp_path):
    out = _ablate(tmp_path, *RESUMABLE, env=slurm.env)
    assert out.returncode == 0, out.stderr
    run_id = _wait_for_step(tmp_path, 45)
    job = _manifest(tmp_path)["jobs"][0]["job_id"]
    slurm.run("scontrol", "requeue", job)  # as a preemption: the job is killed and queued again
    resumed = _wait_for_resume(tmp_path, run_id)
    assert resumed >= 20  # the second start used a checkpoint
    assert run_cli("-m", "launch", "cancel", cwd=tmp_path).returncode == 0
    _wait_until_done(tmp_path)
    client, exp = _client(tmp_path)
    assert len([r for r in client.search_runs([exp]) if r.data.tags["ablate.role"] == "variant"]) == 1
    _assert_contiguous(client, run_id)


@pytest.mark.slow  # test_resume.py resumes a killed run the same way
def test_a_cancelled_sweep_resumes_when_run_again(slurm, tmp_path):
    out = _ablate(tmp_path, *RESUMABLE, env=slurm.env)
    assert out.returncode == 0, out.stderr
    run_id = _wait_for_step(tmp_path, 45)
    running = _ablate(tmp_path, *RESUMABLE, env=slurm.env)
    assert "0 to run, 0 already FINISHED (skipped), 1 still running (left alone)" in running.stdout
    cancel = run_cli("-m", "launch", "cancel", cwd=tmp_path)
    assert cancel.returncode == 0 and "cancelled 1 job" in cancel.stdout
    _wait_until_done(tmp_path)
    client, _ = _client(tmp_path)
    assert client.get_run(run_id).info.status != "FINISHED"

    again = _ablate(tmp_path, *RESUMABLE, env=slurm.env)
    assert "1 to run, 0 already FINISHED" in again.stdout  # the cancelled one, into the same run
    assert _wait_for_resume(tmp_path, run_id) >= 20
    assert run_cli("-m", "launch", "cancel", cwd=tmp_path).returncode == 0
    _wait_until_done(tmp_path)
    _assert_contiguous(client, run_id)


FSDP_JOB = pytest.param(["run=fsdp", "launcher.gpus_per_node=2"], marks=pytest.mark.slow)  # 2 ranks: minutes


@pytest.mark.slow  # the default suite: the warning's checkpoint without SLURM (test_resume.py, test_parallel.py)
@pytest.mark.parametrize("layout", [[], FSDP_JOB], ids=["one_process", "fsdp"])
def test_a_warned_job_checkpoints_at_the_warning_requeues_itself_and_finishes(layout, slurm, tmp_path):
    # The warning SLURM sends before a time limit or a preemption (USR2, `--signal=USR2@<signal_delay_s>` in the
    # job's script), sent here by hand at a known step: the run checkpoints at the end of that step (no periodic
    # checkpoint to fall back on), submitit requeues the job, and the next job resumes exactly there. fsdp (-m slow;
    # its warning path without SLURM is in the default suite, tests/test_parallel.py): the job's process notes the
    # warning and passes it to rank 0, which checkpoints (both ranks write their shards) and stops; then the job's
    # process requeues
    out = _ablate(tmp_path, "sweep=recipes", "sweep.recipes=[scalerl]", "train.steps=400",
                  "train.checkpoint_every=100000", "train.val_every=5", "launcher.signal_delay_s=90", *layout,
                  env=slurm.env)
    assert out.returncode == 0, out.stderr
    job = _manifest(tmp_path)["jobs"][0]["job_id"]
    script = (tmp_path / "outputs" / "tiny" / "jobs").glob(f"*/{job}_submission.sh")
    assert "#SBATCH --signal=USR2@90\n" in next(script).read_text()
    run_id = _wait_for_step(tmp_path, 45)
    slurm.run("scancel", "--signal=USR2", job)
    status = _wait_until_done(tmp_path, timeout=400)
    assert status.returncode == 0, status.stdout
    client, _ = _client(tmp_path)
    _assert_complete(client, run_id, 400)
    tags = client.get_run(run_id).data.tags
    assert int(tags["ablate.resumed_from"]) == int(tags["ablate.requeued_at"]) >= 45  # saved at the warning
    assert client.get_run(run_id).data.params["trainer.ranks"] == ("2" if layout else "1")


@pytest.mark.slow
def test_a_job_at_its_time_limit_checkpoints_requeues_and_finishes(slurm, tmp_path):
    # SLURM's own timer (minutes, so `-m slow`): a 1-minute limit with the warning 45 s before it. slurmctld checks
    # its timers every 30 s, so the warning comes 15-45 s into each job, and whatever the job is doing: 1,500 mock
    # steps outlast the first job for sure and take several jobs in all; one of them may be warned after its last
    # step, which must not fail it
    out = _ablate(tmp_path, "sweep=recipes", "sweep.recipes=[scalerl]", "train.steps=1500",
                  "train.checkpoint_every=100000", "train.val_every=30", "launcher.timeout_min=1",
                  "launcher.signal_delay_s=45", env=slurm.env)
    assert out.returncode == 0, out.stderr
    status = _wait_until_done(tmp_path, timeout=500)
    assert status.returncode == 0, status.stdout
    client, exp = _client(tmp_path)
    (run,) = [r for r in client.search_runs([exp]) if r.data.tags["ablate.role"] == "variant"]
    _assert_complete(client, run.info.run_id, 1500)
    tags = client.get_run(run.info.run_id).data.tags
    assert int(tags["ablate.resumed_from"]) == int(tags["ablate.requeued_at"]) > 0  # saved at the signal


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_job_warned_in_a_step_longer_than_the_warning_requeues_from_the_step_before(slurm, tmp_path):
    # A paper-scale step is minutes, longer than SLURM's warning: a job that finished the step in flight before
    # checkpointing ran past its time limit and ended TIMEOUT, never requeued. Here 165-s steps (the mock's batch
    # waits them, as decoding would), a 5-minute limit and the warning 30 s before it, which SLURM sends up to 60 s
    # early: 210-270 s into the job, always in its second step (it began at 170-195 s, after 5-30 s of start-up),
    # which would end at 335 s or later, past the kill at 305 s (KillWait=5). Rank 0 drops the step it waits on,
    # checkpoints the step before and requeues; the next job does the last step and finishes. 2 jobs, ~8 minutes
    out = _ablate(tmp_path, "sweep=none", "train.steps=2", "train.val_every=1", "train.checkpoint_every=100000",
                  "generator.step_seconds=165", "launcher.timeout_min=5", "launcher.signal_delay_s=30",
                  env=slurm.env)
    assert out.returncode == 0, out.stderr
    status = _wait_until_done(tmp_path, timeout=900)
    assert status.returncode == 0 and status.stdout.count(" completed ") == 1, status.stdout
    client, exp = _client(tmp_path)
    (run,) = [r for r in client.search_runs([exp]) if r.data.tags["ablate.role"] == "variant"]
    _assert_complete(client, run.info.run_id, 2)
    tags = client.get_run(run.info.run_id).data.tags
    assert tags["ablate.requeued_at"] == tags["ablate.resumed_from"] == "1"  # the step before the one dropped


def test_one_run_is_one_job_and_the_command_returns_at_once(slurm, tmp_path):
    """sweep=none with launcher=slurm: before, the run trained in the foreground, on the login node."""
    out = _ablate(tmp_path, "sweep=none", "train.steps=10", "train.val_every=5", env=slurm.env)
    assert out.returncode == 0, out.stderr
    assert "sweep none-" in out.stdout and ": 1 variant" in out.stdout and "1 to run" in out.stdout
    (job,) = _manifest(tmp_path)["jobs"]
    assert job["job_id"]
    # launcher.signal_delay_s unset, and no GPU to size it by: the least, 120 s (docs/training.md#time-limits)
    script = (tmp_path / "outputs" / "tiny" / "jobs").glob(f"*/{job['job_id']}_submission.sh")
    assert "#SBATCH --signal=USR2@120\n" in next(script).read_text()
    status = _wait_until_done(tmp_path)
    assert status.stdout.count(" completed ") == 1, status.stdout + status.stderr
    client, exp = _client(tmp_path)
    (run,) = [r for r in client.search_runs([exp]) if r.data.tags["ablate.role"] == "variant"]
    assert run.info.status == "FINISHED" and run.data.tags["ablate.variant"] == "scalerl"


def test_a_job_runs_through_the_launchers_python_and_srun_args(slurm, tmp_path):
    """launcher.python and launcher.srun_args, as a container needs them (`apptainer exec ... python`; pyxis's
    srun options): here a wrapper that notes it ran, and an srun option that sets a variable the wrapper sees."""
    wrapper = tmp_path / "in-container"
    wrapper.write_text(f"#!/bin/sh\necho \"wrapped $ABLATE_SRUN_SAW $GLOO_SOCKET_IFNAME $NCCL_SOCKET_IFNAME\" >> "
                       f"{tmp_path / 'marker'}\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    out = _ablate(tmp_path, "sweep=none", "train.steps=4", "train.val_every=2", f"launcher.python={wrapper}",
                  "launcher.srun_args=[\"--export=ALL,ABLATE_SRUN_SAW=yes\"]", "launcher.network_interface=lo",
                  env=slurm.env)
    assert out.returncode == 0, out.stderr
    assert _wait_until_done(tmp_path).stdout.count(" completed ") == 1
    # launcher.network_interface reaches both planes' libraries in the job
    assert (tmp_path / "marker").read_text().splitlines()[0] == "wrapped yes lo lo"
    client, exp = _client(tmp_path)
    (run,) = [r for r in client.search_runs([exp]) if r.data.tags["ablate.role"] == "variant"]
    assert run.info.status == "FINISHED"


def _tasks_and_runs(slurm, cwd) -> tuple[list[str], list]:
    """Every array task of every submission of the sweep (sacct, by the jobs' name ablate-<sweep>: COMPLETED each)
    and the sweep's variant runs (FINISHED each)."""
    client, exp = _client(cwd)
    runs = [r for r in client.search_runs([exp]) if r.data.tags.get("ablate.role") == "variant"]
    assert runs and all(r.info.status == "FINISHED" for r in runs)
    (sid,) = {r.data.tags["ablate.sweep"] for r in runs}
    rows = slurm.run("sacct", "-n", "-X", "-P", "-S", "2000-01-01", "-o", "JobID,State,WorkDir",
                     f"--name=ablate-{sid}").stdout.splitlines()  # of this test's folder: a sweep id is its variants'
    states = [row.rsplit("|", 1)[0] for row in rows if row.rsplit("|", 1)[1] == str(cwd)]
    assert states and all(line.endswith("|COMPLETED") for line in states), states
    return states, runs


def test_an_adaptive_sweep_with_seeds_goes_on_look_by_look_submitting_only_the_seeds_it_adds(slurm, tmp_path):
    """The adaptive sweep with seeds on SLURM: each command submits its look's seeds and returns; the same command
    once they are in takes the look and submits only the seeds it adds, as new array tasks of the same sweep, until
    the last look; then it runs nothing. Every seed signs apart and runs once (one array task a run)."""
    from ablate import seeding

    # sweep.futility=0: the first look stops no verdict as futile (on this 1-layer model it would: z ~ 0 at 0.03),
    # so it adds seeds, whatever the seeds' draw
    conf = one_axis_config(tmp_path)
    command = ["sweep=loo", "axes=one", "sweep.margin_A=0.03", "sweep.adaptive=true", "sweep.seeds=2",
               "sweep.base_seeds=2", "sweep.looks=2", "sweep.futility=0"]
    first = _ablate(tmp_path, *command, env=slurm.env, config_dir=conf)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "plans scalerl 3, loo-plan 3 seeds" in first.stdout and "6 to run, 0 already FINISHED" in first.stdout
    assert "run the same command when these jobs have finished" in first.stdout
    assert _wait_until_done(tmp_path).returncode == 0

    second = _ablate(tmp_path, *command, env=slurm.env, config_dir=conf)  # look 1: open, seeds added
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "before look 2 of 2" in second.stdout and "6 already FINISHED" in second.stdout, second.stdout
    client, exp = _client(tmp_path)
    (parent,) = tracking.find_runs(client, exp, role="sweep")
    planned = seeding.planned_counts(client.get_run(parent.info.run_id).data.tags)
    added = sum(planned.values()) - 6
    assert added > 0 and f"{added} to run, 6 already FINISHED" in second.stdout
    assert _wait_until_done(tmp_path).returncode == 0

    third = _ablate(tmp_path, *command, env=slurm.env, config_dir=conf)  # look 2, the last: settled, its report made
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    total = sum(planned.values())
    assert "look 2 of 2" in third.stdout and "the adaptive sweep with seeds is done" in third.stdout
    assert f"0 to run, {total} already FINISHED" in third.stdout
    looks = json.loads(client.get_run(parent.info.run_id).data.tags[seeding.LOOKS_TAG])
    assert [entry["look"] for entry in looks] == [1, 2] and looks[1]["seeds"] == planned

    states, runs = _tasks_and_runs(slurm, tmp_path)
    assert len(states) == len(runs) == total  # one array task a seed: none ran twice
    assert len({r.data.tags["ablate.signature"] for r in runs}) == total  # each seed signs apart
    assert {name: sum(r.data.tags["ablate.variant"] == name for r in runs) for name in planned} == planned
    assert len({state.split("_")[0] for state in states}) == 2  # an array a look

    again = _ablate(tmp_path, *command, env=slurm.env, config_dir=conf)
    assert again.returncode == 0 and f"0 to run, {total} already FINISHED" in again.stdout
    assert "look 3" not in again.stdout and len(_tasks_and_runs(slurm, tmp_path)[0]) == total


def test_extend_on_slurm_adds_exactly_the_seeds_the_sweeps_report_asks_for(slurm, tmp_path):
    """A SLURM sweep has no report until its jobs are in: sweep.extend=true then says so and adds nothing; the same
    command once they are in makes the report, and sweep.extend=true submits exactly the seeds it asks for, into the
    same sweep; again, nothing."""
    import csv

    conf, command = one_axis_config(tmp_path), ["sweep=loo", "axes=one", "sweep.margin_A=0.07"]
    first = _ablate(tmp_path, *command, env=slurm.env, config_dir=conf)
    assert first.returncode == 0 and "2 to run, 0 already FINISHED" in first.stdout, first.stderr[-3000:]
    early = _ablate(tmp_path, *command, "sweep.extend=true", env=slurm.env, config_dir=conf)  # jobs not in: no report
    assert early.returncode == 0 and "has no report yet" in early.stdout, early.stdout[-3000:]
    assert _wait_until_done(tmp_path).returncode == 0

    reported = _ablate(tmp_path, *command, env=slurm.env, config_dir=conf)  # every job in: the report extend reads
    assert reported.returncode == 0 and "0 to run, 2 already FINISHED" in reported.stdout
    (report,) = (tmp_path / "outputs" / "tiny" / "reports").glob("*/variants.csv")
    assert f"report: {report.parent.resolve() / 'report.html'}" in reported.stdout
    row = next(r for r in csv.DictReader(report.open()) if r["variant"] == "loo-plan")
    want = {"loo-plan": 1 + int(row["more_seeds_variant"] or 0), "scalerl": 1 + int(row["more_seeds_base"] or 0)}
    added = sum(want.values()) - 2
    assert added > 0, row  # open at 0.07 with one seed a side

    more = _ablate(tmp_path, *command, "sweep.extend=true", env=slurm.env, config_dir=conf)
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    assert f"{added} to run, 2 already FINISHED" in more.stdout
    assert _wait_until_done(tmp_path).returncode == 0
    states, runs = _tasks_and_runs(slurm, tmp_path)
    assert len(states) == len(runs) == sum(want.values())  # one array task a seed: none ran twice
    assert {name: sum(r.data.tags["ablate.variant"] == name for r in runs) for name in want} == want
    assert {r.data.tags["ablate.sweep"] for r in runs} == {report.parent.name}  # the same sweep

    again = _ablate(tmp_path, *command, "sweep.extend=true", env=slurm.env, config_dir=conf)
    assert again.returncode == 0 and f"0 to run, {len(runs)} already FINISHED" in again.stdout
