"""Advantage normalization: `normalize(rewards, group, eps=1e-6) -> adv [N]`, rewards [N], group [N] prompt ids.

Every option starts from adv_i = r_i - mean_{g(i)}(r) (the group baseline) and differs in the division:
    batch   / (std of all the batch's advantages + eps)     ScaleRL
    prompt  / (std of the prompt's rewards + eps)           GRPO
    none    no division                                     Dr. GRPO
Standard deviations are unbiased (as TRL and verl compute them); a single sample has none, so a group of one
gets adv 0 whatever the option. The trainer normalizes over the samples the loss sees (after zero-variance
filtering), so the batch std is that of the kept samples.

Against TRL 1.16 (tests/test_peers.py, docs/peers.md): TRL adds eps 1e-4 (fixed) where ours is normalization.eps =
1e-6 (verl: 1e-6); `none` is TRL's scale_rewards="none", `prompt` its "group" (but for eps), and `batch` is not its
"batch", which divides by the std of the raw rewards.
"""

from __future__ import annotations

import torch


def _group_stats(rewards: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample: its group's mean reward, its group's unbiased std (0 for a group of one), its group's size."""
    n_groups = int(group.max()) + 1 if group.numel() else 0
    r = rewards.to(torch.float64)
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=rewards.device)
    count = zeros.index_add(0, group, torch.ones_like(r))
    mean = zeros.index_add(0, group, r) / count.clamp(min=1)
    sq = zeros.index_add(0, group, (r - mean[group]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return mean[group], std[group], count[group]


def none(rewards: torch.Tensor, group: torch.Tensor, eps: float = 1e-6, **_) -> torch.Tensor:
    """adv = r - mean_group(r) (Dr. GRPO, Liu et al. 2025: no std division). Peers: TRL scale_rewards="none",
    equal."""
    mean, _, _ = _group_stats(rewards, group)
    return (rewards.to(torch.float64) - mean).to(torch.float32)


def prompt(rewards: torch.Tensor, group: torch.Tensor, eps: float = 1e-6, **_) -> torch.Tensor:
    """adv = (r - mean_group(r)) / (std_group(r) + eps) (GRPO; the base algorithm of the LOO).

    Peers: TRL scale_rewards="group" with eps 1e-4: ours = TRL's x (std + 1e-4) / (std + 1e-6), 1 + 1.98e-4 at a
    group std of 0.5 (normalization.eps=1e-4 gives TRL's). verl: eps 1e-6 as ours, but a group of one gets std 1
    there (adv = r), 0 here.
    """
    mean, std, _ = _group_stats(rewards, group)
    return ((rewards.to(torch.float64) - mean) / (std + eps)).to(torch.float32)


def batch(rewards: torch.Tensor, group: torch.Tensor, eps: float = 1e-6, **_) -> torch.Tensor:
    """adv = (r - mean_group(r)) / (std over the batch of those differences + eps) (ScaleRL, arXiv 2510.13786).

    Peers: not TRL's scale_rewards="batch", which divides the same differences by the std of the raw rewards over
    the batch: ours = TRL's x sqrt(1 + between-prompt / within-prompt sum of squares) >= 1 (up to the eps), x1.26
    (5-95%: 1.19-1.35) at 48 x 16 with uniform pass rates, x1.18 on the prompts zero-variance filtering keeps. With
    PPO-off-policy-k TRL's std also spans all k steps' completions; ours is each step's own batch.
    """
    centered = none(rewards, group).to(torch.float64)
    if centered.numel() < 2:
        return torch.zeros_like(rewards, dtype=torch.float32)
    return (centered / (centered.std() + eps)).to(torch.float32)
