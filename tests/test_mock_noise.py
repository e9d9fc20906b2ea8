"""One mock noise: generator=mock (ablate/generators/mock.py) and analysis/synthetic.py's mock_curve (the power bench's
runs) draw one run from one seed, with one wobble, one step-cost law and one set of settings."""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np
import pytest
from omegaconf import OmegaConf

from ablate import tracking
from ablate.config import compose
from ablate.generators.mock import mock_noise, run_seed, variant_truth
from ablate.registry import build
from ablate.schema import MockGenerator as MockSchema
from ablate.trainer import train
from analysis.synthetic import (MockNoise, MockStreams, WobblePoint, mock_compute, mock_curve, mock_validations,
                                run_truth, wobble, wobble_next)

# a short mock run: 12 steps of 4 prompts x 8 completions (32 rows, MockNoise's), validated at every step
RUN = ["generator=mock", "train.steps=12", "train.val_every=1", "batch.prompts_per_step=4",
       "batch.samples_per_prompt=8", "model.num_layers=1", "model.hidden_size=32"]
# the mock's settings, MockNoise's name: generator=mock's (steps, val_every, rows, max_length: the run's)
SETTINGS = {"val_prompts": "val_prompts", "val_samples": "val_samples", "spread": "prompt_spread",
            "wobble_sd": "wobble_sd", "wobble_gpu_hours": "wobble_gpu_hours", "run_sd_A": "run_sd_A",
            "reference_length_frac": "reference_length_frac", "budget": "gpu_hours"}


def _cfg(*overrides):
    return OmegaConf.create(OmegaConf.to_container(compose([*RUN, *overrides]), resolve=True, enum_to_str=True))


def _trained(cfg, tmp_path, mlflow_uri) -> tuple[np.ndarray, np.ndarray, float]:
    """The real trainer on `cfg`: (compute/gpu_hours, val/pass_rate at every step from 0, the run's mock.run.A)."""
    cfg = OmegaConf.merge(cfg, {"paths": {"outputs": str(tmp_path)}})
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "mock-noise"), "scalerl", {})
    train(cfg, run_id, mlflow_uri)

    def history(key):
        return np.array([m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)])

    run_A = float(client.get_run(run_id).data.params["mock.run.A"])
    return history("compute/gpu_hours"), history("val/pass_rate"), run_A


def test_the_mock_generator_and_mock_curve_draw_the_same_run_from_one_seed(tmp_path, mlflow_uri):
    """Without a length control's thinking budget (length_control=truncation: only the generation limit cuts) the
    maths is the same end to end, so the run the trainer logs with generator=mock and mock_curve given the run's
    streams (MockStreams.of its seed) and settings (mock_noise) are equal to the last bit: the run's A, the compute
    of every step (the lengths drawn, the step-cost law, summed), every validation (the law, the wobble, mean@k)."""
    cfg = _cfg("length_control=truncation")
    compute, reward, run_A = _trained(cfg, tmp_path, mlflow_uri)
    curve = mock_curve(MockStreams.of(run_seed(cfg)), variant_truth(cfg), mock_noise(cfg))
    assert curve.step.tolist() == list(range(13)) and len(reward) == 13
    assert curve.truth.A == run_A
    assert curve.compute.tolist() == compute.tolist()
    assert curve.reward.tolist() == reward.tolist()
    assert 14_000 < compute[-1] < 18_000  # the budget, 16k GPU-hours at the reference length, give or take the draws


def _driven(gen, steps: int, prompts: int) -> tuple[np.ndarray, np.ndarray]:
    """The mock generator driven as the trainer drives it, without a learner: validate at compute 0, then each step's
    rollouts, the clock's GPU-hours for them, a validation at the new compute. (compute, pass rates) from step 0."""
    compute, rewards = [0.0], [gen.validate(0.0)]
    for step in range(1, steps + 1):
        rollouts = gen.rollouts(list(range(prompts)), step - 1, compute[-1])
        compute.append(compute[-1] + gen.clock.gpu_hours(step, rollouts, wall_seconds=0.0))
        rewards.append(gen.validate(compute[-1]))
    return np.array(compute), np.array(rewards)


def test_with_the_default_length_control_the_wobble_and_validations_are_the_same_and_compute_is_close():
    """ScaleRL's interruption cuts a completion's thinking at a drawn budget and injects its phrase, which mock_curve
    does not model: the mock's compute is its own. At the mock's own compute points the law, the wobble and mean@k
    are still one path (exact). At the paper's generation limits (12,288 thinking + 2,048 answer tokens, budgets
    10,240-12,288) the two clocks, from the same lengths, agree within 1% at every step: at most ~8% of completions
    (those longer than their budget / 0.85) are cut, by under 2,000 of their ~13k tokens (measured: within 0.7% on
    seeds 0-3). On the laptop's limits (12 + 8 tokens) the phrase's 15 tokens alone add ~25%: not compared there."""
    cfg = _cfg("generation.max_think_tokens=12288", "generation.max_answer_tokens=2048")
    assert cfg.length_control.name == "interruption"
    gen = build(cfg.generator, cfg=cfg)
    compute, reward = _driven(gen, steps=12, prompts=4)
    noise, streams = mock_noise(cfg), MockStreams.of(run_seed(cfg))
    run = run_truth(streams.run, variant_truth(cfg), noise.run_sd_A)
    assert run == gen.run_truth
    assert mock_validations(streams, run, compute, noise).tolist() == reward.tolist()
    synthetic = mock_compute(streams.lengths, noise, noise.steps)
    ratio = compute[1:] / synthetic[1:]
    assert np.all(np.abs(ratio - 1) < 0.01), ratio
    assert np.any(ratio != 1)  # the thinking budget did cut some completions: the comparison is not the exact one


def test_the_mocks_first_validation_after_compute_0_has_the_wobbles_full_variance():
    """The wobble is stationary from its first point on (analysis/synthetic.py's wobble_next): the mock's first
    wobble is wobble_sd x the first normal of its wobble stream, at any compute (the mock's own AR(1) started at 0
    and gave sd x sqrt(1 - exp(-2 C / length)): 0.3 sd at C = 50 of 1,000). Then each step on by hand."""
    cfg = _cfg()
    gen = build(cfg.generator, cfg=cfg)
    z = MockStreams.of(run_seed(cfg)).wobble.standard_normal(3)
    assert gen._advance_wobble(0.0) == 0.0  # compute 0: the pre-RL point, no wobble and no draw
    assert gen._advance_wobble(50.0) == 0.004 * z[0]
    rho = math.exp(-(250.0 - 50.0) / 1000.0)
    assert gen._advance_wobble(250.0) == pytest.approx(rho * 0.004 * z[0] + math.sqrt(1 - rho**2) * 0.004 * z[1],
                                                       rel=1e-12)
    state = gen.state_dict()
    after = gen._advance_wobble(900.0)
    gen.load_state_dict(state)  # the wobble and every stream come back with a checkpoint
    assert gen._advance_wobble(900.0) == after


def test_the_wobble_is_a_stationary_ar1_by_hand_and_point_by_point_is_the_whole_curves():
    """wobble_next by hand (first point sd z0, then rho v + sqrt(1 - rho^2) sd z); wobble over an array is the same
    points in order, no draw at compute 0; and over many streams its sd is `sd` at the first point and at the last,
    with the correlation exp(-gap / length) between two points (4,000 draws: sd within 5%, correlation within 0.05)."""
    rng, z = np.random.default_rng(5), np.random.default_rng(5).standard_normal(2)
    first = wobble_next(rng, WobblePoint(), 40.0, 0.01, 500.0)
    assert first == WobblePoint(0.01 * z[0], 40.0)
    rho = math.exp(-60.0 / 500.0)
    assert wobble_next(rng, first, 100.0, 0.01, 500.0).value == pytest.approx(
        rho * 0.01 * z[0] + math.sqrt(1 - rho**2) * 0.01 * z[1], rel=1e-12)
    points = np.array([0.0, 40.0, 100.0])
    assert wobble(np.random.default_rng(5), points, 0.01, 500.0).tolist() == [0.0, first.value, pytest.approx(
        rho * 0.01 * z[0] + math.sqrt(1 - rho**2) * 0.01 * z[1], rel=1e-12)]
    draws = np.array([wobble(np.random.default_rng([s, 1]), np.array([0.0, 50.0, 550.0]), 0.004, 1000.0)
                      for s in range(4000)])
    assert draws[:, 0].tolist() == [0.0] * 4000
    assert draws[:, 1].std() == pytest.approx(0.004, rel=0.05)
    assert draws[:, 2].std() == pytest.approx(0.004, rel=0.05)
    assert np.corrcoef(draws[:, 1], draws[:, 2])[0, 1] == pytest.approx(math.exp(-0.5), abs=0.05)


def test_the_mocks_settings_are_one_set():
    """MockNoise's defaults (the power bench's and the tests' mock runs) are generator=mock's: the config a run
    composes (conf/generator/mock.yaml) and the schema's defaults (ablate/schema.py), read name for name by
    mock_noise, which reads each setting a run overrides. A setting changed in one place and not the others fails."""
    composed = mock_noise(_cfg())
    schema = OmegaConf.create(OmegaConf.to_container(compose(RUN), resolve=True, enum_to_str=True))
    schema.generator = OmegaConf.merge(OmegaConf.structured(MockSchema), {"name": "mock", "_target_": "x"})
    defaults = MockNoise()
    assert {f.name for f in fields(MockNoise)} == {*SETTINGS, "steps", "val_every", "rows", "max_length"}
    for name in SETTINGS:
        assert getattr(composed, name) == getattr(defaults, name), name
        assert getattr(mock_noise(schema), name) == getattr(defaults, name), name
    overridden = mock_noise(_cfg(*(f"generator.{key}={2 * getattr(defaults, name)}" for name, key in SETTINGS.items())))
    assert {name: getattr(overridden, name) for name in SETTINGS} == {n: 2 * getattr(defaults, n) for n in SETTINGS}
    # the run's part: its schedule, its batch, its generation limit
    assert (composed.steps, composed.val_every, composed.rows) == (12, 1, 32)
    cfg = _cfg()
    assert composed.max_length == cfg.generation.max_think_tokens + cfg.generation.max_answer_tokens == 20
