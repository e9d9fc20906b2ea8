"""A real run killed mid-way resumes from its checkpoint into the same MLflow run: no step lost, none twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from ablate import tracking
from conftest import run_cli

# a small validation set (a quarter of the run's time otherwise): these tests look at the steps, not the pass rate
QUICK = ["task.n_val_prompts=16", "task.val_samples=2", "batch.prompts_per_step=8"]
STEPS = 40
# tracking.flush_every=1: each step is in the store as it ends, so the test sees the run pass its first checkpoint at
# once and kills it with most of its steps still to come (buffered, they showed only at the next checkpoint's flush)
RUN = ["-m", "ablate", f"train.steps={STEPS}", "train.checkpoint_every=10", "train.val_every=5",
       "tracking.flush_every=1", *QUICK]


def _variant_runs(folder):
    client = tracking.client(f"sqlite:///{folder}/mlflow.db")
    exp = client.get_experiment_by_name("tiny")
    return client, ([] if exp is None else client.search_runs([exp.experiment_id]))


def _last_step(client, run_id) -> int:
    history = client.get_metric_history(run_id, "compute/gpu_hours")
    return max((m.step for m in history), default=-1)


LAYOUTS = {"one_process": ["run=one_process"],
           "fsdp+engine": ["run=fsdp", "run.generator_gpus=1", "model.device=cpu"]}  # gloo ranks, GPU or not


# fsdp+engine takes 85 s (three processes started twice): -m slow; its sharded checkpoint's resume is pinned in the
# default suite by test_parallel's two_ranks (a step resumed from DCP shards equals the straight step)
@pytest.mark.e2e
@pytest.mark.parametrize("layout", ["one_process", pytest.param("fsdp+engine", marks=pytest.mark.slow)])
def test_a_killed_run_resumes_with_no_lost_or_duplicated_steps(layout, tmp_path, mlflow_uri):
    """fsdp+engine: 2 trainer processes and the generator's engine in a third, under torch's launcher, the whole
    process group killed; the learner's state comes back from its DCP shards (learner-<step>), the rest (the
    engine's random state too) from rank 0's payload."""
    # mlflow_uri: ./mlflow.db made beforehand, so polling it never races the run's own schema migration
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    run = [*RUN, *LAYOUTS[layout]]
    proc = subprocess.Popen([sys.executable, *run], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        run_id = None
        while time.monotonic() < deadline:
            time.sleep(1.0)
            if not (tmp_path / "mlflow.db").exists():
                continue
            client, runs = _variant_runs(tmp_path)
            if runs and _last_step(client, runs[0].info.run_id) >= 12:  # past its step-10 checkpoint
                run_id = runs[0].info.run_id
                break
        assert run_id is not None, "the run did not get far enough"
        os.killpg(proc.pid, signal.SIGKILL)  # no chance to clean up: as a node failure or an OOM kill
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    client, _ = _variant_runs(tmp_path)
    assert client.get_run(run_id).info.status == "RUNNING"  # left as the kill found it
    killed_at = _last_step(client, run_id)
    folder = tmp_path / "outputs" / "tiny" / "runs" / run_id
    assert (folder / "checkpoint.pt").exists()
    assert bool(list(folder.glob("learner-*"))) == (layout != "one_process")  # the shards beside the payload

    out = run_cli(*run, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"resuming MLflow run {run_id}" in out.stdout
    assert f"run {run_id} resumes from its step-" in out.stderr

    client, runs = _variant_runs(tmp_path)
    assert [r.info.run_id for r in runs] == [run_id]  # the same run, no second one
    assert client.get_run(run_id).info.status == "FINISHED"
    for key in client.get_run(run_id).data.metrics:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), f"{key}: a step logged twice"
    compute = sorted(client.get_metric_history(run_id, "compute/gpu_hours"), key=lambda m: m.step)
    assert [m.step for m in compute] == list(range(0, STEPS + 1)), "a step is missing"
    values = [m.value for m in compute]
    assert all(b >= a for a, b in zip(values, values[1:])), "compute went backwards across the restart"
    val_steps = sorted(m.step for m in client.get_metric_history(run_id, "val/pass_rate"))
    assert val_steps == list(range(0, STEPS + 1, 5))
    assert killed_at < STEPS
    assert not (folder / "checkpoint.pt").exists() and not list(folder.glob("learner-*"))
    assert client.get_run(run_id).data.params["trainer.ranks"] == str(1 + (layout != "one_process"))


@pytest.mark.e2e
def test_a_non_finite_loss_marks_the_run_diverged_and_stops_it_cleanly(tmp_path):
    out = run_cli("-m", "ablate", "train.steps=20", "optim.lr=1e30", "optim.warmup_steps=0", cwd=tmp_path)
    assert out.returncode == 1
    assert "diverged" in out.stdout
    client, runs = _variant_runs(tmp_path)
    (run,) = runs
    assert run.info.status == "FAILED" and run.data.tags["ablate.diverged"] == "true"
    step = int(run.data.tags["ablate.diverged_step"])
    assert 1 < step <= 20
    history = client.get_metric_history(run.info.run_id, "compute/gpu_hours")
    assert sorted(m.step for m in history) == list(range(0, step))  # every step before the divergence is kept
    assert "Traceback" not in out.stderr


@pytest.mark.e2e
def test_a_preemption_notice_checkpoints_at_the_end_of_the_step_and_the_run_resumes_there(tmp_path, mlflow_uri):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    # tracking.flush_every=1: the store shows step 10 as it ends, with 30 steps still to come (buffered, it showed
    # only at a flush, which may be the run's last: the notice then came after the run had FINISHED)
    command = ["-m", "ablate", f"train.steps={STEPS}", "train.checkpoint_every=1000",  # no periodic checkpoint
               "train.val_every=5", "tracking.flush_every=1", *QUICK]
    proc = subprocess.Popen([sys.executable, *command], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline, run_id = time.monotonic() + 180, None
        while time.monotonic() < deadline and run_id is None:
            time.sleep(1.0)
            if (tmp_path / "mlflow.db").exists():
                client, runs = _variant_runs(tmp_path)
                if runs and _last_step(client, runs[0].info.run_id) >= 10:
                    run_id = runs[0].info.run_id
        assert run_id is not None
        proc.send_signal(signal.SIGUSR2)  # SLURM's warning before a time limit or a preemption
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    client, _ = _variant_runs(tmp_path)
    run = client.get_run(run_id)
    assert run.info.status == "KILLED"  # no scheduler to requeue it here
    saved_at = int(run.data.tags["ablate.requeued_at"])
    assert saved_at == _last_step(client, run_id)  # the checkpoint is of the last step logged: nothing to redo

    out = run_cli(*command, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and int(run.data.tags["ablate.resumed_from"]) == saved_at
    compute = sorted(m.step for m in client.get_metric_history(run_id, "compute/gpu_hours"))
    assert compute == list(range(0, STEPS + 1))


def test_a_job_started_again_for_a_finished_run_does_nothing(tmp_path, mlflow_uri):
    # e.g. a job requeued just as its run finished: running it again must not log the run a second time
    from ablate.config import compose
    from ablate.job import run_variant
    from ablate.run import job_config

    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "tiny"), "scalerl", {})
    config = job_config(compose(["train.steps=4", f"paths.runs={tmp_path}/runs"]))
    assert run_variant(config, run_id, mlflow_uri)["step"] == 4
    logged = len(client.get_metric_history(run_id, "compute/gpu_hours"))
    assert logged == 5 and client.get_run(run_id).info.status == "FINISHED"
    run_variant(config, run_id, mlflow_uri)
    assert len(client.get_metric_history(run_id, "compute/gpu_hours")) == logged


def test_a_warning_while_the_finished_run_is_closed_neither_requeues_nor_kills_the_job(tmp_path, mlflow_uri,
                                                                                      monkeypatch):
    # SLURM sends USR2 up to a minute early, whatever the job is doing: here, while the run is being closed, and
    # again once the job's callable has returned (where Python, shutting down, would have died of it)
    from ablate import trainer
    from ablate.config import compose
    from ablate.job import run_variant
    from ablate.run import job_config
    from launch.submit import Requeueable

    requeued = []
    close = trainer.RunLogger.close

    def close_with_a_warning(self, status):
        signal.raise_signal(signal.SIGUSR2)
        close(self, status)

    monkeypatch.setattr(trainer.RunLogger, "close", close_with_a_warning)
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "tiny"), "scalerl", {})
    config = job_config(compose(["train.steps=3", f"paths.runs={tmp_path}/runs"]))
    before = signal.signal(signal.SIGUSR2, lambda signum, frame: requeued.append(signum))  # as submitit's
    try:
        assert Requeueable(run_variant)(config, run_id, mlflow_uri)["step"] == 3
        signal.raise_signal(signal.SIGUSR2)  # after the callable returned: ignored
        assert requeued == [] and signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR2, before)
    assert client.get_run(run_id).info.status == "FINISHED"


def test_a_warning_while_a_step_waits_on_its_rollouts_drops_it_and_resumes_from_the_step_before(tmp_path, mlflow_uri,
                                                                                                monkeypatch):
    # A paper-scale step (minutes, mostly the wait for rollouts) outlasts SLURM's warning: finishing it before the
    # checkpoint ran past the time limit. Warned as step 2's 30-s wait begins (the mock's generator.step_seconds),
    # the run saves step 1 and is handed to the requeue within a few seconds, not after the 30 s the step had left;
    # run again, it resumes at step 1 and logs every step once
    from ablate.config import compose
    from ablate.generators.mock import MockGenerator
    from ablate.job import run_variant
    from ablate.run import job_config

    batch, warned, handed = MockGenerator.batch, [], []

    def warned_in_step_2(self, step, compute, stop=None):
        if step == 2 and not warned:
            self.step_seconds = 30.0
            warned.append(time.monotonic())
            signal.raise_signal(signal.SIGUSR2)
        return batch(self, step, compute, stop)

    def requeue(signum, frame):  # submitit's: requeue the job, then exit
        handed.append(time.monotonic())
        raise SystemExit(0)

    monkeypatch.setattr(MockGenerator, "batch", warned_in_step_2)
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "tiny"), "scalerl", {})
    config = job_config(compose(["generator=mock", "train.steps=3", "train.val_every=1", "train.checkpoint_every=1000",
                                 f"paths.runs={tmp_path}/runs"]))
    before = signal.signal(signal.SIGUSR2, requeue)
    try:
        with pytest.raises(SystemExit):
            run_variant(config, run_id, mlflow_uri)
        assert handed[0] - warned[0] < 10.0  # the step's 30 s were not waited out
        run = client.get_run(run_id)
        assert run.info.status == "RUNNING" and run.data.tags["ablate.requeued_at"] == "1"
        assert _last_step(client, run_id) == 1
        assert run_variant(config, run_id, mlflow_uri)["step"] == 3  # the next job
    finally:
        signal.signal(signal.SIGUSR2, before)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ablate.resumed_from"] == "1"
    for key in ("compute/gpu_hours", "val/pass_rate"):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == [0, 1, 2, 3], key


def test_a_run_stopped_twice_at_the_same_step_fails_instead_of_requeueing_for_ever(tmp_path, mlflow_uri, monkeypatch):
    # SLURM's warning at or past the time limit (launcher.signal_delay_s, refused before submit; tests/test_config.py)
    # comes as each job starts: the run dropped its step, checkpointed and requeued, and submitit, counting it as a
    # preemption, requeued it for ever with no step trained. Here every job is warned in step 2's wait: the first
    # requeues at step 1 (steps trained since the start); the second, resumed there, is stopped at step 1 again with
    # nothing trained between, and fails in one clear error, not handed to the requeue; the run FAILED, saying why.
    # Its checkpoint is kept: once the warning is fixed, the same run goes on from step 1.
    from ablate.config import compose
    from ablate.generators.mock import MockGenerator
    from ablate.job import run_variant
    from ablate.run import job_config

    batch, warned, handed = MockGenerator.batch, [], []

    def warned_in_step_2(self, step, compute, stop=None):
        if step == 2 and warned is not None:
            self.step_seconds = 30.0  # a wait the warning cuts short
            warned.append(step)
            signal.raise_signal(signal.SIGUSR2)
        return batch(self, step, compute, stop)

    def requeue(signum, frame):  # submitit's: requeue the job, then exit
        handed.append(signum)
        raise SystemExit(0)

    monkeypatch.setattr(MockGenerator, "batch", warned_in_step_2)
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "tiny"), "scalerl", {})
    config = job_config(compose(["generator=mock", "train.steps=3", "train.val_every=1", "train.checkpoint_every=1000",
                                 "launcher.timeout_min=10",
                                 "launcher.signal_delay_s=1200", f"paths.runs={tmp_path}/runs"]))
    before = signal.signal(signal.SIGUSR2, requeue)
    try:
        with pytest.raises(SystemExit):  # the first job: requeued at step 1
            run_variant(config, run_id, mlflow_uri)
        assert handed == [signal.SIGUSR2] and client.get_run(run_id).data.tags["ablate.requeued_at"] == "1"
        with pytest.raises(RuntimeError) as stopped:  # the second: stopped at step 1 again, nothing trained
            run_variant(config, run_id, mlflow_uri)
        assert handed == [signal.SIGUSR2] and len(warned) == 2  # not handed to the requeue a second time
        assert str(stopped.value).startswith("stopped for a requeue at step 1 twice with no step trained between: "
                                             "SLURM's warning comes before a step can end (launcher.signal_delay_s="
                                             "1200 s of the job's launcher.timeout_min=10, 600 s)"), str(stopped.value)
        run = client.get_run(run_id)
        assert run.info.status == "FAILED" and run.data.tags["ablate.requeue_loop"] == str(stopped.value)
        assert _last_step(client, run_id) == 1
        warned = None  # fixed: the same run goes on from its step-1 checkpoint
        assert run_variant(config, run_id, mlflow_uri)["step"] == 3
    finally:
        signal.signal(signal.SIGUSR2, before)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ablate.resumed_from"] == "1"
    assert sorted(m.step for m in client.get_metric_history(run_id, "compute/gpu_hours")) == [0, 1, 2, 3]


def test_the_wait_a_warning_cuts_short_is_in_compute_after_the_resume(tmp_path, mlflow_uri, monkeypatch):
    # The seconds rank 0 waited on a step's rollouts before SLURM's warning dropped the step held every device of
    # the job; compute/gpu_hours (the law's C) left them out. Warned a second into step 2's 4-s wait (the mock's
    # generator.step_seconds), the run now counts that second's share of a step (the simulated clock: a step's
    # device-hours H x 1 s / 4 s) in the state it checkpoints, and the resumed run's every step carries it: its
    # compute is a run's that was never warned (the same rows: the same config, seed and draws) plus the wait.
    from ablate.config import compose
    from ablate.generators.mock import MockGenerator
    from ablate.job import run_variant
    from ablate.run import job_config

    batch, validate, validated, warned, handed = MockGenerator.batch, MockGenerator.validate, [], [], []

    def validated_at(self, compute, **kwargs):
        rate = validate(self, compute, **kwargs)
        validated.append(time.monotonic())  # the step's device time starts after it
        return rate

    def warned_a_second_into_step_2(self, step, compute, stop=None):
        if step != 2 or warned:
            return batch(self, step, compute, stop)
        self.step_seconds, began = 4.0, time.monotonic()

        def stop_after_a_second() -> bool:
            if not warned and time.monotonic() - began >= 1.0:
                warned.append(time.monotonic())
                signal.raise_signal(signal.SIGUSR2)
            return stop()

        return batch(self, step, compute, stop_after_a_second)

    def requeue(signum, frame):  # submitit's: requeue the job, then exit
        handed.append(time.monotonic())
        raise SystemExit(0)

    client = tracking.client(mlflow_uri)
    runs = {name: tracking.create_variant_run(client, tracking.experiment_id(client, "tiny"), name, {})
            for name in ("warned", "straight")}
    config = job_config(compose(["generator=mock", "train.steps=3", "train.val_every=1", "train.checkpoint_every=1000",
                                 f"paths.runs={tmp_path}/runs"]))
    hours_per_step = config["generator"]["gpu_hours"] / config["train"]["steps"]
    assert run_variant(config, runs["straight"], mlflow_uri)["step"] == 3
    monkeypatch.setattr(MockGenerator, "batch", warned_a_second_into_step_2)
    monkeypatch.setattr(MockGenerator, "validate", validated_at)
    before = signal.signal(signal.SIGUSR2, requeue)
    try:
        with pytest.raises(SystemExit):
            run_variant(config, runs["warned"], mlflow_uri)
        saved = torch.load(tmp_path / "runs" / runs["warned"] / "checkpoint.pt", weights_only=False)["state"]
        assert saved["step"] == 1
        assert run_variant(config, runs["warned"], mlflow_uri)["step"] == 3  # the next job
    finally:
        signal.signal(signal.SIGUSR2, before)
    compute = {name: {m.step: m.value for m in client.get_metric_history(run_id, "compute/gpu_hours")}
               for name, run_id in runs.items()}
    assert sorted(compute["warned"]) == sorted(compute["straight"]) == [0, 1, 2, 3]
    assert compute["warned"][1] == compute["straight"][1]  # logged before the warning
    wait = saved["gpu_hours"] - compute["warned"][1]  # what the checkpoint holds beyond the last step logged
    longest = handed[0] - validated[1]  # step 1's validation ended before the wait began; the save came after it
    assert hours_per_step * 1.0 / 4.0 <= wait <= hours_per_step * longest / 4.0, (wait, hours_per_step, longest)
    for step in (2, 3):  # carried by every step after the resume
        assert compute["warned"][step] - compute["straight"][step] == pytest.approx(wait, rel=1e-9), step
