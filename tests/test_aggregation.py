"""Aggregation and advantage normalization against values derived by hand; micro-batch invariance."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.rl import advantages, aggregation, losses

AGGREGATIONS = [aggregation.prompt_mean, aggregation.sample_mean, aggregation.token_mean]


def _golden_batch(a: float, b: float, c: float):
    # prompt 0: sample of length 1 (loss a) and sample of length 3 (loss b); prompt 1: one sample of length 2 (loss c)
    per_token = torch.tensor([[a, 9.0, 9.0], [b, b, b], [c, c, 9.0]])  # 9.0: masked garbage
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    return per_token, mask, torch.tensor([0, 0, 1])


def test_prompt_mean_is_not_sample_mean_when_lengths_differ():
    per_token, mask, group = _golden_batch(1.0, 2.0, 4.0)
    one_prompt = (per_token[:2], mask[:2], group[:2])
    assert aggregation.sample_mean(*one_prompt).item() == pytest.approx((1 + 2) / 2)  # (a + b) / 2
    assert aggregation.prompt_mean(*one_prompt).item() == pytest.approx((1 + 3 * 2) / 4)  # (a + 3b) / 4
    # with the second prompt: token mean (a + 3b + 2c) / 6; prompt mean ((a + 3b)/4 + c) / 2; sample mean (a+b+c)/3
    assert aggregation.token_mean(per_token, mask, group).item() == pytest.approx((1 + 6 + 8) / 6)
    assert aggregation.prompt_mean(per_token, mask, group).item() == pytest.approx((7 / 4 + 4) / 2)
    assert aggregation.sample_mean(per_token, mask, group).item() == pytest.approx(7 / 3)


def test_samples_and_prompts_without_tokens_leave_the_means():
    per_token, mask, group = _golden_batch(1.0, 2.0, 4.0)
    mask[2] = False  # prompt 1 filtered out entirely
    assert aggregation.prompt_mean(per_token, mask, group).item() == pytest.approx(7 / 4)
    assert aggregation.sample_mean(per_token, mask, group).item() == pytest.approx(3 / 2)
    assert aggregation.token_mean(per_token, mask, group).item() == pytest.approx(7 / 4)


@pytest.mark.parametrize("aggregate", AGGREGATIONS, ids=lambda f: f.__name__)
def test_token_weights_reproduce_the_aggregation(aggregate):
    torch.manual_seed(0)
    per_token = torch.randn(6, 5)
    mask = torch.rand(6, 5) > 0.3
    group = torch.tensor([0, 0, 1, 1, 1, 2])
    weights = aggregation.token_weights(aggregate, mask, group)
    assert (per_token * weights).sum().item() == pytest.approx(aggregate(per_token, mask, group).item(), rel=1e-5)
    assert (weights[~mask] == 0).all()


@pytest.mark.parametrize("aggregate", AGGREGATIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("loss_fn", [losses.cispo, losses.dapo, losses.gspo], ids=lambda f: f.__name__)
def test_micro_batches_with_gradient_accumulation_give_the_whole_batch_gradient(aggregate, loss_fn):
    torch.manual_seed(3)
    N, T = 8, 7
    lengths = torch.tensor([1, 7, 3, 5, 2, 6, 4, 7])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    group = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    old = torch.log(torch.rand(N, T, dtype=torch.float64))
    logp = (old + 0.3 * torch.randn(N, T, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(N, dtype=torch.float64)

    aggregate(loss_fn(logp, old, adv, mask), mask, group).backward()
    whole = logp.grad.clone()

    logp.grad = None
    weights = aggregation.token_weights(aggregate, mask, group, dtype=torch.float64)
    for rows in (slice(0, 3), slice(3, 4), slice(4, 8)):  # uneven micro-batches that split prompts
        (loss_fn(logp[rows], old[rows], adv[rows], mask[rows]) * weights[rows]).sum().backward()
    assert torch.allclose(logp.grad, whole, rtol=1e-10, atol=1e-14)

    # contrast: averaging each micro-batch's own aggregate is not the same gradient
    logp.grad = None
    for rows in (slice(0, 3), slice(3, 4), slice(4, 8)):
        (aggregate(loss_fn(logp[rows], old[rows], adv[rows], mask[rows]), mask[rows], group[rows]) / 3).backward()
    assert not torch.allclose(logp.grad, whole, rtol=1e-3)


def test_advantages_golden_values():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    # group 0: mean 0.25, r - mean = [.75, -.25, -.25, -.25], unbiased std sqrt((.5625 + 3 * .0625) / 3) = 0.5
    # group 1: mean 0.75, r - mean = [.25, .25, -.75, .25], std 0.5
    centered = [0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25]
    assert advantages.none(rewards, group).tolist() == pytest.approx(centered)
    assert advantages.prompt(rewards, group).tolist() == pytest.approx([c / 0.5 for c in centered], rel=1e-5)
    # batch: std of the 8 centered values, unbiased: sum of squares 2 * .5625 + 6 * .0625 = 1.5 -> sqrt(1.5 / 7)
    batch_std = math.sqrt(1.5 / 7)
    assert advantages.batch(rewards, group).tolist() == pytest.approx([c / batch_std for c in centered], rel=1e-5)


def test_zero_variance_groups_and_singletons_get_zero_advantage_without_nan():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0])
    group = torch.tensor([0, 0, 0, 1, 2])  # an all-pass group, and two singletons
    for normalize in (advantages.none, advantages.prompt, advantages.batch):
        adv = normalize(rewards, group)
        assert torch.isfinite(adv).all() and (adv == 0).all(), normalize.__name__
    assert advantages.batch(torch.tensor([1.0]), torch.tensor([0])).tolist() == [0.0]
