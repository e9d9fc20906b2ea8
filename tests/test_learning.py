"""The embedded default learns for real: under scalerl the tiny model's validation pass rate rises on the synthetic
task, and the deterministic schedule gives the same validation curve twice."""

from __future__ import annotations

import pytest

from ablate import tracking
from ablate.config import compose
from ablate.trainer import train

pytestmark = pytest.mark.e2e  # the whole loop end to end: CI's e2e lane (docs/testing.md#markers)


def _val_curve(cfg, uri):
    client = tracking.client(uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "learn"), "scalerl", {})
    train(cfg, run_id, uri)
    return [m.value for m in sorted(client.get_metric_history(run_id, "val/pass_rate"), key=lambda m: m.step)]


def test_the_pass_rate_rises_under_scalerl_in_a_short_run(tmp_path, mlflow_uri):
    cfg = compose(["train.steps=100", "train.val_every=50", "task.n_val_prompts=128", f"paths.outputs={tmp_path}"])
    start, middle, end = _val_curve(cfg, mlflow_uri)
    # measured (seed 0, 24 prompts a step, 128 validation prompts x 4 samples): 0.23, 0.55 at step 50, 0.66 at 100
    assert 0.05 <= start <= 0.35, "the warm start should leave room to learn"
    assert end > start + 0.1


def test_the_same_seed_and_config_reproduce_the_validation_curve(tmp_path, mlflow_uri):
    cfg = compose(["train.steps=12", "train.val_every=4", "task.n_val_prompts=32", f"paths.outputs={tmp_path}"])
    first, second = _val_curve(cfg, mlflow_uri), _val_curve(cfg, mlflow_uri)
    assert first == second and len(first) == 4
    other = _val_curve(compose(["train.steps=12", "train.val_every=4", "task.n_val_prompts=32", "seed=1",
                                f"paths.outputs={tmp_path}"]), mlflow_uri)
    assert other != first
