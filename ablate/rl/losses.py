"""Policy losses, per token: `loss(logp, old_logp, adv, mask, **hparams) -> Tensor[N, T]`, zero where mask is False.

    logp      [N, T]  log pi_train(y_t), requires grad
    old_logp  [N, T]  log pi_old(y_t): the generator's log-probs (the behaviour policy), no grad
    adv       [N]     one advantage per sample, broadcast over its tokens
    mask      [N, T]  True for tokens the loss sees

rho = pi_train / pi_old = exp(logp - old_logp). Masked positions are neutralised before any exp, so padding,
injected tokens or fully masked samples can hold any value (even inf or NaN) without reaching the loss or the
gradient. Aggregation over tokens is a separate axis (ablate.rl.aggregation).

Against TRL 1.16 (tests/test_peers.py runs its GRPOTrainer on the same inputs; docs/peers.md): every loss x
aggregation pair TRL has equals ours in value and gradient. TRL's loss_type names the aggregation, its epsilon /
epsilon_high the clip: dapo/bnpo = token_mean, grpo = sample_mean; cispo is token-level only; GSPO is
importance_sampling_level="sequence". TRL has no prompt_mean.
"""

from __future__ import annotations

import math

import torch


def _log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, logp - old_logp.detach(), torch.zeros_like(logp))


def _clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """-min(ratio * adv, clip(ratio, 1 - low, 1 + high) * adv): PPO's pessimistic bound, no dual clip."""
    adv = adv[:, None]
    return -torch.minimum(ratio * adv, ratio.clamp(1.0 - low, 1.0 + high) * adv)


def cispo(logp, old_logp, adv, mask, *, eps_max: float = 4.0, **_) -> torch.Tensor:
    """CISPO (MiniMax-M1; ScaleRL's loss): -sg(min(rho, eps_max)) * adv * logp.

    Absolute cap on rho, no lower clip; the gradient flows through logp only, so d loss / d logp = -min(rho, eps_max)
    * adv. Written as exp(min(log rho, log eps_max)) so a huge log-ratio cannot overflow. Source: ScaleRL
    (arXiv 2510.13786), Eq. for CISPO; TRL's cispo uses the same absolute cap (epsilon_high). verl's "cispo" clips
    rho relatively on both sides: a different loss.
    Peers: TRL loss_type="cispo", epsilon_high=eps_max is ours with aggregation=token_mean (equal); TRL has no
    cispo under sample_mean or prompt_mean.
    """
    capped = torch.exp(_log_ratio(logp, old_logp, mask).clamp(max=math.log(eps_max))).detach()
    loss = -capped * adv[:, None] * logp
    return torch.where(mask, loss, torch.zeros_like(loss))


def dapo(logp, old_logp, adv, mask, *, eps_low: float = 0.2, eps_high: float = 0.28, **_) -> torch.Tensor:
    """DAPO clip-higher (Yu et al. 2025): -min(rho * adv, clip(rho, 1 - eps_low, 1 + eps_high) * adv).

    No dual clip for negative advantages (verl adds one, clip_ratio_c = 3, by default; TRL does not; we follow TRL
    and the DAPO paper). Where the clip is active the gradient is zero.
    Peers: TRL epsilon=eps_low, epsilon_high=eps_high with loss_type="dapo" (or "bnpo") is ours with
    aggregation=token_mean, loss_type="grpo" ours with sample_mean (both equal); verl differs by its dual clip.
    """
    ratio = torch.exp(_log_ratio(logp, old_logp, mask))
    loss = _clipped_surrogate(ratio, adv, eps_low, eps_high)
    return torch.where(mask, loss, torch.zeros_like(loss))


def grpo(logp, old_logp, adv, mask, *, eps: float = 0.2, **_) -> torch.Tensor:
    """GRPO's policy term (DeepSeekMath; Shao et al. 2024) without the KL term: PPO clip with a symmetric eps.

    Peers: TRL loss_type="grpo", epsilon=eps, beta=0 is ours with aggregation=sample_mean ("dapo" with token_mean).
    """
    return dapo(logp, old_logp, adv, mask, eps_low=eps, eps_high=eps)


def gspo(logp, old_logp, adv, mask, *, eps_low: float = 3e-3, eps_high: float = 5e-3, **_) -> torch.Tensor:
    """GSPO (Zheng et al. 2025): one importance ratio per sequence, s_i = exp(mean_t (logp - old_logp)), clipped.

    Written per token as verl does: log s_it = logp_t - sg(logp_t) + sg(log s_i), so every token carries the value
    of its sequence's loss and d s_it / d logp_t = s_i; averaged over a sample's tokens this is the per-sequence
    loss -min(s_i adv, clip(s_i) adv) with its gradient (tests/test_losses.py checks both forms agree). Clip ranges
    are ScaleRL's (3e-3 / 5e-3); the GSPO paper's 1e-4 did poorly there.
    Peers: TRL importance_sampling_level="sequence" with loss_type="grpo" is ours with aggregation=sample_mean,
    with "dapo" ours with token_mean (both equal). Only sample_mean makes it GSPO's per-sequence objective: under
    prompt_mean (ScaleRL's) or token_mean a sequence weighs by its length, and ablate.rl.checks warns (as TRL does).
    """
    log_ratio = _log_ratio(logp, old_logp, mask)
    tokens = mask.sum(dim=1).clamp(min=1)
    log_s = (log_ratio.sum(dim=1) / tokens).detach()  # [N]
    log_s_token = logp - logp.detach() + log_s[:, None]
    ratio = torch.exp(torch.where(mask, log_s_token, torch.zeros_like(log_s_token)))
    loss = _clipped_surrogate(ratio, adv, eps_low, eps_high)
    return torch.where(mask, loss, torch.zeros_like(loss))


# What each loss declares about itself (ablate.rl.checks reads it; tests/test_peers.py checks it against the values):
# sequence_level = one per-token loss value for all the tokens of a sequence.
cispo.sequence_level = dapo.sequence_level = grpo.sequence_level = False
gspo.sequence_level = True
