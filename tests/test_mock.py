"""The mock generator: a known truth per variant, realistic noise, rollouts shaped as a real generator's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from ablate.config import compose
from ablate.generators.mock import INJECTED_TOKEN, Truth, variant_truth
from ablate.registry import build


def _cfg(*overrides):
    config = compose(["generator=mock", *overrides])
    return OmegaConf.create(OmegaConf.to_container(config, resolve=True, enum_to_str=True))


def _mock(*overrides):
    cfg = _cfg(*overrides)
    return build(cfg.generator, cfg=cfg), cfg


def test_truth_is_the_base_plus_the_effects_of_the_runs_choices():
    assert variant_truth(_cfg()) == Truth(A=0.61, B=1.92, C_mid=2542.0, R0=0.30)
    assert variant_truth(_cfg("loss=dapo")) == Truth(A=0.61 - 0.06, B=1.92 - 0.24, C_mid=2542.0, R0=0.30)
    t = variant_truth(_cfg("filtering.zero_variance=false", "precision=bf16"))
    assert (t.A, t.B, t.C_mid) == pytest.approx((0.61 - 0.01 - 0.09, 1.92 - 0.20, 2542.0 * 1.10))
    t = variant_truth(_cfg("recipe=deepseek_grpo"))  # grpo, sample mean, prompt norm, bf16, truncation, 8op, none
    assert t.A == pytest.approx(0.61 - 0.08 - 0.03 - 0.005 - 0.09 - 0.04 - 0.01 - 0.015)


def test_truth_follows_the_law():
    t = Truth(A=0.61, B=2.0, C_mid=2000.0, R0=0.3)
    assert t(0.0) == 0.3
    assert t(2000.0) == pytest.approx(0.3 + 0.31 / 2)  # at C_mid, half the gain
    assert t(4000.0) == pytest.approx(0.3 + 0.31 / (1 + 0.25))  # (C_mid/C)^B = (1/2)^2


def test_validation_is_unbiased_with_the_binomial_noise_of_a_fixed_prompt_set():
    gen, cfg = _mock("generator.wobble_sd=0")
    draws = np.array([gen.validate(2542.0) for _ in range(400)])
    R = gen.run_truth(2542.0)
    n, k, kappa = cfg.generator.val_prompts, cfg.generator.val_samples, cfg.generator.prompt_spread
    # prompts' rates p_j have mean R and variance R(1-R)/(kappa+1) (a Beta); the set is fixed, so only the samples
    # are noise: var = mean_j p_j(1-p_j) / (n k) = (R(1-R) - R(1-R)/(kappa+1)) / (n k)
    sd = np.sqrt(R * (1 - R) * kappa / (kappa + 1) / (n * k))
    assert abs(draws.mean() - R) < 4 * sd / np.sqrt(len(draws))
    assert draws.std() == pytest.approx(sd, rel=0.15)


def test_runs_of_one_variant_differ_in_A_by_the_run_to_run_spread():
    cfg = _cfg()
    runs = []
    for seed in range(40):
        cfg.seed = seed
        runs.append(build(cfg.generator, cfg=cfg))
    assert {r.truth for r in runs} == {runs[0].truth}  # one variant, one truth
    spread = np.std([r.run_truth.A - r.truth.A for r in runs])
    assert spread == pytest.approx(0.006, rel=0.35)


def test_rollouts_are_shaped_like_a_generators():
    gen, cfg = _mock()
    P = cfg.batch.prompts_per_step
    ro = gen.rollouts(list(range(P)), step=20, compute=3000.0)
    N = P * cfg.batch.samples_per_prompt
    T = ro.tokens.shape[1]
    assert ro.tokens.shape == ro.mask.shape == ro.gen_logprobs.shape == ro.versions.shape == (N, T)
    assert ro.group.tolist() == [g for g in range(P) for _ in range(cfg.batch.samples_per_prompt)]
    assert torch.all(ro.gen_logprobs[ro.mask] <= 0) and torch.all(ro.gen_logprobs[~ro.mask] == 0)
    assert torch.all(ro.mask.sum(1) <= ro.lengths)
    assert T <= cfg.generation.max_think_tokens + cfg.generation.max_answer_tokens + gen.phrase_tokens
    assert torch.equal(ro.rewards, ro.correct.float()) and not torch.any(ro.correct & ro.truncated)


def test_interruption_injects_masked_tokens_and_truncation_does_not():
    gen, _ = _mock("length_control=interruption", "length_control.think_budget_min_frac=0.2",
                   "length_control.think_budget_max_frac=0.3")
    ro = gen.rollouts(list(range(8)), step=5, compute=100.0)
    injected = ro.tokens == INJECTED_TOKEN
    assert injected.any()
    assert not torch.any(ro.mask & injected)  # injected tokens never reach the loss
    per_row = injected.sum(1)
    assert set(per_row.tolist()) <= {0, gen.phrase_tokens}
    gen, _ = _mock("length_control=truncation")
    ro = gen.rollouts(list(range(8)), step=5, compute=100.0)
    assert not torch.any(ro.tokens == INJECTED_TOKEN)


@pytest.mark.parametrize("k", [1, 4, 8])
def test_versions_respect_k(k):
    pipe, _ = _mock("off_policy=pipeline_rl", f"off_policy.k={k}")
    ppo, _ = _mock("off_policy=ppo_off_policy", f"off_policy.k={k}")
    for step in (0, 3, 17):
        v = pipe.rollouts(list(range(8)), step=step, compute=10.0).versions
        r = pipe.rollouts(list(range(8)), step=step, compute=10.0)
        assert int(v.min()) >= max(step - k, 0) and int(v.max()) == step
        assert int(r.versions[r.mask].max()) <= step
        w = ppo.rollouts(list(range(8)), step=step, compute=10.0).versions
        assert torch.all(w == step - step % k)  # one batch, one version: s mod k steps stale
    ro = pipe.rollouts(list(range(8)), step=40, compute=10.0)
    changes = (ro.versions[:, 1:] != ro.versions[:, :-1]) & ro.mask[:, 1:]
    assert changes.any(), "in-flight: a sequence's versions change mid-sequence"


def test_a_step_costs_its_share_of_the_compute_scaled_by_length():
    gen, cfg = _mock("train.steps=100", "generator.gpu_hours=1000")
    ro = gen.rollouts(list(range(8)), step=1, compute=0.0)
    max_len = cfg.generation.max_think_tokens + cfg.generation.max_answer_tokens
    expected = 1000 / 100 * (float(ro.lengths.float().mean()) / max_len) / 0.5
    assert gen.clock.gpu_hours(1, ro, wall_seconds=123.0, flops=None) == pytest.approx(expected)


def test_the_same_seed_and_config_give_the_same_draws_and_variants_differ():
    a, _ = _mock()
    b, _ = _mock()
    assert [a.validate(c) for c in (0, 500, 5000)] == [b.validate(c) for c in (0, 500, 5000)]
    c, _ = _mock("seed=1")
    assert [c.validate(x) for x in (0, 500, 5000)] != [a.validate(x) for x in (0, 500, 5000)]
