"""Each loss against values derived by hand, its gradient, and its robustness."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.rl import aggregation, losses

LOSSES = [losses.cispo, losses.dapo, losses.gspo, losses.grpo]


def _leaf(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float64).clone().requires_grad_(True)


def test_cispo_golden_values():
    # rho = pi/pi_old: 0.5/0.25 = 2, 0.2/0.4 = 0.5, 0.5/0.05 = 10 (capped at eps_max = 4); adv = 1.5
    logp = _leaf([[math.log(0.5), math.log(0.2), math.log(0.5)]])
    old = torch.tensor([[math.log(0.25), math.log(0.4), math.log(0.05)]], dtype=torch.float64)
    loss = losses.cispo(logp, old, torch.tensor([1.5], dtype=torch.float64), torch.ones(1, 3, dtype=torch.bool))
    # -min(rho, 4) * adv * log pi: -2*1.5*ln 0.5 = 3 ln 2; -0.5*1.5*ln 0.2 = 0.75 ln 5; -4*1.5*ln 0.5 = 6 ln 2
    expected = [3 * math.log(2), 0.75 * math.log(5), 6 * math.log(2)]
    assert loss[0].tolist() == pytest.approx(expected, rel=1e-12)


def test_cispo_gradient_is_the_capped_ratio_times_adv_over_the_denominator():
    torch.manual_seed(0)
    logp = _leaf(torch.log(torch.rand(3, 4, dtype=torch.float64)))
    old = logp.detach() + torch.tensor([[0.5], [-2.0], [0.1]], dtype=torch.float64)  # rho = e^-0.5, e^2 (> 4), e^-0.1
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    aggregation.token_mean(losses.cispo(logp, old, adv, mask, eps_max=4.0), mask, None).backward()
    rho = torch.exp(logp.detach() - old)
    expected = -torch.clamp(rho, max=4.0) * adv[:, None] / mask.sum() * mask  # 9 tokens in the denominator
    assert torch.allclose(logp.grad, expected, rtol=1e-12, atol=0)
    # none through the cap: had sg() been left out, sample 0 (rho < 4) would get an extra -rho*adv*logp/9
    assert not torch.allclose(logp.grad[0, :3], (expected - rho * adv[:, None] * logp.detach() / 9)[0, :3])


@pytest.mark.parametrize("rho,adv,loss,grad", [
    # DAPO, eps 0.2 / 0.28: -min(rho*adv, clip(rho, 0.8, 1.28)*adv)
    (1.5, 1.0, -1.28, 0.0),  # clipped above: min(1.5, 1.28) -> constant, no gradient
    (0.5, 1.0, -0.5, -0.5),  # min(0.5, 0.8) = 0.5 -> d/dlogp = -rho*adv
    (0.5, -1.0, 0.8, 0.0),  # min(-0.5, -0.8) = -0.8: clipped below, no gradient
    (1.5, -1.0, 1.5, 1.5),  # min(-1.5, -1.28) = -1.5: unclipped, gradient -rho*adv = 1.5
    (5.0, -1.0, 5.0, 5.0),  # no dual clip: a dual clip at 3 would cap this at 3 with no gradient
])
def test_dapo_golden_values_and_the_clip_kills_the_gradient(rho, adv, loss, grad):
    logp = _leaf([[math.log(rho)]])
    out = losses.dapo(logp, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([adv], dtype=torch.float64),
                      torch.ones(1, 1, dtype=torch.bool))
    out.sum().backward()
    assert out.item() == pytest.approx(loss, rel=1e-12)
    assert logp.grad.item() == pytest.approx(grad, rel=1e-12, abs=0)


def test_grpo_is_the_symmetric_clip():
    # eps 0.2: rho 1.25, adv 2 -> -min(2.5, 1.2*2) = -2.4, clipped (no gradient); rho 0.9 -> -1.8, gradient -rho*adv
    logp = _leaf([[math.log(1.25), math.log(0.9)]])
    out = losses.grpo(logp, torch.zeros(1, 2, dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64),
                      torch.ones(1, 2, dtype=torch.bool), eps=0.2)
    out.sum().backward()
    assert out[0].tolist() == pytest.approx([-2.4, -1.8], rel=1e-12)
    assert logp.grad[0].tolist() == pytest.approx([0.0, -1.8], rel=1e-12, abs=0)


def test_gspo_golden_values():
    # sample 0: log-ratios 0.002, 0.004 -> log s = 0.003, s = e^0.003 inside [0.997, 1.005]: -2 e^0.003 per token
    # sample 1: log-ratios 0.01, 0.02 -> s = e^0.015 > 1.005 and adv > 0: clipped, -1.005 * 2
    logp = _leaf([[0.002, 0.004], [0.01, 0.02]])
    out = losses.gspo(logp, torch.zeros(2, 2, dtype=torch.float64), torch.tensor([2.0, 2.0], dtype=torch.float64),
                      torch.ones(2, 2, dtype=torch.bool))
    assert out[0].tolist() == pytest.approx([-2 * math.exp(0.003)] * 2, rel=1e-12)
    assert out[1].tolist() == pytest.approx([-2.01] * 2, rel=1e-12)


def _gspo_per_sequence(logp, old, adv, mask, low=3e-3, high=5e-3):
    """GSPO as its paper writes it (TRL's (B, 1) form): one ratio and one loss per sequence, mean over sequences."""
    log_s = ((logp - old) * mask).sum(1) / mask.sum(1)
    s = torch.exp(log_s)
    per_sequence = -torch.minimum(s * adv, s.clamp(1 - low, 1 + high) * adv)
    return per_sequence.mean()


def test_gspo_per_token_form_equals_the_per_sequence_form_in_value_and_gradient():
    torch.manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    old = torch.log(torch.rand(3, 5, dtype=torch.float64))
    logp = _leaf(old + 0.004 * torch.randn(3, 5, dtype=torch.float64))  # some inside the clip range, some not
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    per_token = aggregation.sample_mean(losses.gspo(logp, old, adv, mask), mask, None)
    per_token.backward()
    grad_token = logp.grad.clone()
    logp.grad = None
    per_sequence = _gspo_per_sequence(logp, old, adv, mask)
    per_sequence.backward()
    assert per_token.item() == pytest.approx(per_sequence.item(), rel=1e-12)
    assert torch.allclose(grad_token, logp.grad * mask, rtol=1e-10, atol=1e-15)
    assert grad_token.abs().sum() > 0


@pytest.mark.parametrize("loss_fn", LOSSES, ids=lambda f: f.__name__)
def test_extreme_ratios_empty_masks_and_masked_tokens_give_finite_values_and_zero_gradient(loss_fn):
    N, T = 4, 6
    mask = torch.ones(N, T, dtype=torch.bool)
    mask[0, 4:] = False  # padding
    mask[1, 2:4] = False  # injected tokens in the middle of a completion
    mask[2] = False  # a fully masked sample (e.g. dropped by zero-variance filtering)
    values = torch.zeros(N, T, dtype=torch.float32)
    values[3, :3], values[3, 3:] = 50.0, -50.0  # log-ratios of +-50
    values[0, 4:] = float("nan")  # whatever the masked positions hold must not matter
    values[1, 2:4] = float("inf")
    values[2] = -float("inf")
    logp = values.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, 2.0, -3.0])
    old = torch.zeros(N, T)
    for agg in (aggregation.token_mean, aggregation.sample_mean, aggregation.prompt_mean):
        logp.grad = None
        out = loss_fn(logp, old, adv, mask)
        assert torch.isfinite(out).all()
        assert (out[~mask] == 0).all()
        total = agg(out, mask, torch.tensor([0, 0, 1, 1]))
        total.backward()
        assert torch.isfinite(total) and torch.isfinite(logp.grad).all()
        assert (logp.grad[~mask] == 0).all()  # masked and injected tokens: exactly zero gradient
    empty = torch.zeros(N, T, dtype=torch.bool)
    for agg in (aggregation.token_mean, aggregation.sample_mean, aggregation.prompt_mean):
        logp.grad = None
        total = agg(loss_fn(logp, old, adv, empty), empty, torch.tensor([0, 0, 1, 1]))
        total.backward()
        assert total.item() == 0.0 and (logp.grad == 0).all()
