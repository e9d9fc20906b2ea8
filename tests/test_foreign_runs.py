"""The fixtures of tests/foreign_runs.py: TRL's real GRPOTrainer runs in MLflow, and runs with verl's names.

These check what the analysis tests rely on: the runs, their names, params and statuses as each trainer leaves them,
an eval reward that rises, and verl's metric names after its sanitization. The analysis of them is tested elsewhere.
"""

from __future__ import annotations

import csv
import os
import time

import numpy as np
import pytest

from conftest import run_cli
from foreign_runs import VerlVariant, _mlflow_env, make_trl_experiment, make_verl_experiment, verl_metric_key


def _runs(uri: str, experiment: str) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, {run.info.run_name: run for run in client.search_runs([exp.experiment_id])}


@pytest.mark.e2e
def test_trl_grpo_runs_land_in_mlflow_with_a_rising_eval_reward(mlflow_uri, tmp_path):
    import mlflow
    import torch

    def mlflow_env() -> dict:
        return {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")}

    env, threads = mlflow_env(), torch.get_num_threads()
    started = time.perf_counter()
    made = make_trl_experiment(mlflow_uri, "trl-grpo", tmp_path)
    print(f"make_trl_experiment: {time.perf_counter() - started:.1f} s for {len(made)} runs "
          f"({', '.join(f'{r.seconds:.1f}' for r in made)} s each)")
    assert mlflow_env() == env and torch.get_num_threads() == threads  # the caller's, as they were
    assert mlflow.active_run() is None

    client, runs = _runs(mlflow_uri, "trl-grpo")
    names = {"lr-1e-2-seed1", "lr-1e-2-seed2", "lr-2e-2-seed1", "lr-2e-2-seed2"}
    assert set(runs) == names == {r.name for r in made}
    for name, run in runs.items():
        assert run.info.status == "FINISHED", name
        assert run.data.tags["mlflow.runName"] == name == run.data.params["run_name"]
        assert run.data.params["seed"] == name[-1]
        assert run.data.params["learning_rate"] == {"lr-1e-2": "0.01", "lr-2e-2": "0.02"}[name[:7]]
        eval_reward = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval_reward"))
        assert [s for s, _ in eval_reward] == list(range(0, 31)), name  # eval_on_start, then every step
        values = np.array([v for _, v in eval_reward])
        # a random model writes a digit in ~5% of its tokens (10 of 186 ids); both learning rates pass 0.64 (0.8 of
        # the ceiling) by step 30 (measured: 0.78-0.8), most of the rise in the second half of the run
        assert values[0] < 0.12 and values[-1] > 0.64 and values[-3:].mean() > values[:3].mean() + 0.48, (name, values)
        reward = [m.step for m in client.get_metric_history(run.info.run_id, "reward")]
        assert sorted(reward) == list(range(1, 31)), name  # the train reward: every optimizer step

    # docs/bring-your-own-runs.md's command for these runs, as a user runs it: only --base is said, the rest inferred
    done = run_cli("-m", "analysis", "report", "--experiment", "trl-grpo", "--base", "lr-1e-2", cwd=tmp_path,
                   env={"MLFLOW_TRACKING_URI": mlflow_uri})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith(f"Read MLflow experiment trl-grpo at {mlflow_uri}:\n"
                          "  reward: eval_reward (TRL's eval reward, logged by every run; --reward NAME says otherwise)\n"
                          "  compute: the step (no compute metric logged;"), out
    assert ("  variants: the run names without a seed suffix (lr-1e-2 (2 runs), lr-2e-2 (2 runs); --variant "
            "name:REGEX says otherwise)") in out
    assert "warning" not in out  # the two variants' steps cost the same (only learning_rate differs)
    assert "2 variants from 4 runs (2 seeds per variant), 2 fitted." in " ".join(out.split()), out
    assert "| lr-2e-2 |" in out and (tmp_path / "reports" / "trl-grpo" / "report.html").exists()
    with open(tmp_path / "reports" / "trl-grpo" / "variants.csv") as f:
        C_mid = {row["variant"]: float(row["C_mid"]) for row in csv.DictReader(f)}
    assert C_mid["lr-2e-2"] < C_mid["lr-1e-2"]  # twice the learning rate climbs sooner (measured: 0.59x the steps)
    report_runs = [r for r in client.search_runs([client.get_experiment_by_name("trl-grpo").experiment_id])
                   if r.data.tags.get("analysis.role") == "report"]
    assert len(report_runs) == 1 and report_runs[0].data.params["mapping.base"] == "lr-1e-2"


def test_the_trl_runs_go_to_the_given_store_even_where_this_process_set_another(mlflow_uri, tmp_path):
    # MLflowCallback sets MLFLOW_TRACKING_URI only where mlflow.is_tracking_uri_set() is false: a URI set earlier in
    # this process (mlflow.set_tracking_uri, as a test may) would win over the variable the runs are meant for
    import mlflow
    import torch

    other = f"sqlite:///{tmp_path}/other.db"
    mlflow.set_tracking_uri(other)
    try:
        threads = torch.get_num_threads()
        with _mlflow_env(mlflow_uri, "trl-grpo"):
            assert mlflow.get_tracking_uri() == mlflow_uri == os.environ["MLFLOW_TRACKING_URI"]
            assert os.environ["MLFLOW_EXPERIMENT_NAME"] == "trl-grpo" and torch.get_num_threads() == 1
        assert mlflow.get_tracking_uri() == other and torch.get_num_threads() == threads
        assert "MLFLOW_EXPERIMENT_NAME" not in os.environ
        with mlflow.start_run(experiment_id=mlflow.create_experiment("busy")):  # the callback would log into it
            with pytest.raises(RuntimeError, match="an MLflow run is active in this process"):
                with _mlflow_env(mlflow_uri, "trl-grpo"):
                    pass
    finally:
        mlflow.set_tracking_uri(None)


def test_verl_runs_carry_verls_names_and_follow_their_law(mlflow_uri):
    from analysis.synthetic import Truth

    slow, fast = Truth(A=0.7, B=2.0, C_mid=6.0, R0=0.3), Truth(A=0.8, B=2.0, C_mid=4.0, R0=0.3)
    made = make_verl_experiment(mlflow_uri, "verl_examples", steps=60, test_freq=5,
                                variants={"base": slow, "lr-2e-6": VerlVariant(
                                    law=fast, config={"actor_rollout_ref/actor/optim/lr": 2e-6})})
    client, runs = _runs(mlflow_uri, "verl_examples")
    assert set(runs) == {"base-seed1", "base-seed2", "lr-2e-6-seed1", "lr-2e-6-seed2"} == {r.name for r in made}
    reward = "val-core/openai/gsm8k/reward/mean_at_4"
    run = runs["base-seed1"]
    assert set(run.data.metrics) >= {reward, "val-core/openai/gsm8k/reward/best_at_4/mean",
                                      "val-aux/openai/gsm8k/reward/std_at_4", "training/global_step",
                                      "timing_s/step", "perf/time_per_step", "critic/score/mean"}
    assert not any("@" in name or "//" in name for name in run.data.metrics)
    assert run.data.params["trainer/experiment_name"] == "base-seed1"
    assert run.data.params["actor_rollout_ref/actor/optim/lr"] == "1e-06"
    assert runs["lr-2e-6-seed2"].data.params["actor_rollout_ref/actor/optim/lr"] == "2e-06"
    assert {r.info.status for r in runs.values()} == {"FINISHED"}

    for name, law in (("base", slow), ("lr-2e-6", fast)):
        for seed in (1, 2):
            history = sorted(client.get_metric_history(runs[f"{name}-seed{seed}"].info.run_id, reward),
                             key=lambda m: m.step)
            steps = np.array([m.step for m in history])
            assert steps.tolist() == list(range(0, 61, 5))
            # C = 8 GPUs x step x 90 s / 3600 = 0.2 GPU-hours a step, also what the timestamps say
            compute = 8 * steps * 90.0 / 3600
            clock = np.array([m.timestamp for m in history], dtype=float)
            np.testing.assert_allclose(8 * (clock - clock[0]) / 1000 / 3600, compute)
            # binomial noise over 1319 x 4 answers plus the wobble (sd 0.004): each point within 4 of its own sd
            # (<= 0.032; here at most 2.3); and no bias that the verdict tests on these runs could take for a move
            # of the ceiling A (they allow 0.03): the mean of all points, and of the last 5 (near A), within 0.012 of
            # the law's (2.5 sd: the points share the wobble, ~0.005 sd for 5 points; here at most 0.0098)
            truth = law(compute)
            off = np.array([m.value for m in history]) - truth
            assert (np.abs(off) <= 4 * np.sqrt(truth * (1 - truth) / (1319 * 4) + 0.004**2)).all(), off
            assert abs(off.mean()) <= 0.012 and abs(off[-5:].mean()) <= 0.012, off
    step_time = client.get_metric_history(run.info.run_id, "timing_s/step")
    assert sorted(m.step for m in step_time) == list(range(1, 61)) and {m.value for m in step_time} == {90.0}


def test_verl_metric_keys_are_sanitized_as_verl_does():
    # verl/utils/tracking.py, _MlflowLoggingAdapter.sanitize_key (volcengine/verl@b178a3cd56f5)
    assert verl_metric_key("val-core/openai/gsm8k/reward/mean@4") == "val-core/openai/gsm8k/reward/mean_at_4"
    assert verl_metric_key("val-aux/x/reward/best@2/mean") == "val-aux/x/reward/best_at_2/mean"
    assert verl_metric_key("a//b///c") == "a/b/c"
    assert verl_metric_key("timing_s/step (s)+x") == "timing_s/step _s__x"
    assert verl_metric_key("perf/max_memory_allocated_gb") == "perf/max_memory_allocated_gb"
