"""Loss aggregation: `aggregate(per_token, mask, group) -> scalar`, per_token [N, T], mask [N, T], group [N].

Each option is a weighted sum of the per-token losses whose weights depend only on the mask and the groups:
    token_mean   sum_{i,t} l m / sum_{i,t} m
    sample_mean  mean_i ( sum_t l m / sum_t m )
    prompt_mean  mean_g ( sum_{i in g} sum_t l m / sum_{i in g} sum_t m )
Samples or prompts with no unmasked token (e.g. dropped by zero-variance filtering) are left out of the means;
a batch with no unmasked token gives 0. Being linear in per_token, an aggregation is fully described by its
weights: `token_weights` recovers them, so micro-batches with gradient accumulation reproduce the whole batch's
gradient exactly (the trainer uses this).

The trap (docs/peers.md): prompt_mean equals sample_mean only when all samples of a prompt have the same
length. One prompt, two samples of lengths 1 and 3 with per-token losses a and b: sample_mean (a + b) / 2,
prompt_mean (a + 3b) / 4.

Against TRL 1.16 (tests/test_peers.py, docs/peers.md): token_mean is its dapo/bnpo/cispo and sample_mean its grpo,
to rounding, with two differences in what they divide by (a fully masked row; PPO-off-policy-k). TRL has no
prompt_mean.
"""

from __future__ import annotations

from typing import Callable

import torch


def _masked(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, per_token, torch.zeros_like(per_token))


def token_mean(per_token, mask, group) -> torch.Tensor:
    """Token-level average (DAPO; TRL dapo/cispo, verl token-mean): one denominator for the whole batch.

    Peers: with k optimizer steps per generation (PPO-off-policy-k; TRL's steps_per_generation = k) TRL divides a
    step's token sum by the tokens of all k steps' completions / k, ours by the step's own: ours = TRL's x
    N_generation / (k N_step). Equal at k = 1 (and with TRL's num_iterations, which reuses one batch).
    """
    return _masked(per_token, mask).sum() / mask.sum().clamp(min=1)


def sample_mean(per_token, mask, group) -> torch.Tensor:
    """Sample-level average (GRPO; TRL grpo, verl seq-mean-token-mean): token mean per sample, mean over samples.

    Peers: a fully masked sample (zero-variance filtered here; TRL's mask_truncated_completions) is left out of the
    mean; TRL's grpo counts it: ours = TRL's x B / (B - 1) with one such row in B.
    """
    tokens = mask.sum(dim=1)
    per_sample = _masked(per_token, mask).sum(dim=1) / tokens.clamp(min=1)
    present = tokens > 0
    return (per_sample * present).sum() / present.sum().clamp(min=1)


def prompt_mean(per_token, mask, group) -> torch.Tensor:
    """Prompt-level average (ScaleRL): all tokens of all samples of a prompt share one denominator; mean over
    prompts. Source: arXiv 2510.13786, "loss aggregation".

    Peers: TRL and verl have none (trl#5375 took TRL's grpo for it); it equals sample_mean (TRL's grpo) only when
    all samples of a prompt have the same length: token weights 1 / (P L_prompt) against TRL's 1 / (B T_sample).
    """
    n_groups = int(group.max()) + 1 if group.numel() else 0
    sums = torch.zeros(n_groups, dtype=per_token.dtype, device=per_token.device)
    sums = sums.index_add(0, group, _masked(per_token, mask).sum(dim=1))
    counts = torch.zeros(n_groups, dtype=per_token.dtype, device=per_token.device)
    counts = counts.index_add(0, group, mask.sum(dim=1).to(per_token.dtype))
    present = counts > 0
    return (sums / counts.clamp(min=1) * present).sum() / present.sum().clamp(min=1)


def token_weights(aggregate: Callable, mask: torch.Tensor, group: torch.Tensor,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W [N, T] with aggregate(l, mask, group) == (l * W).sum() for every l: the gradient of the (linear) aggregation.

    Computed once on the whole batch, W lets each micro-batch contribute (l_mb * W_mb).sum(), whose gradients add
    up to the whole batch's.
    """
    probe = torch.zeros(mask.shape, dtype=dtype, device=mask.device, requires_grad=True)
    (weights,) = torch.autograd.grad(aggregate(probe, mask, group), probe, allow_unused=True)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device) if weights is None else weights


# What each aggregation declares about itself (ablate.rl.checks reads it; tests/test_peers.py checks it against the
# weights): length_weighted = a sample's per-token losses weigh in proportion to its tokens (a sequence-level loss
# is then not averaged per sequence).
token_mean.length_weighted = prompt_mean.length_weighted = True
sample_mean.length_weighted = False
