"""Filtering: zero-variance prompts out of the loss; No-Positive-Resampling (NPR) prompts out of later epochs."""

from __future__ import annotations

from typing import Iterable

import torch


def zero_variance(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Keep mask [N]: False for every completion of a prompt whose completions all got the same reward.

    ScaleRL (and PipelineRL, prime-rl) drop such prompts from the loss without resampling (verl resamples).
    """
    n_groups = int(group.max()) + 1 if group.numel() else 0
    lo = torch.full((n_groups,), float("inf"), dtype=rewards.dtype, device=rewards.device)
    hi = torch.full((n_groups,), float("-inf"), dtype=rewards.dtype, device=rewards.device)
    lo, hi = lo.scatter_reduce(0, group, rewards, "amin"), hi.scatter_reduce(0, group, rewards, "amax")
    return (hi > lo)[group]


class PromptFilter:
    """The filtering axis: zero-variance filtering and No-Positive-Resampling, each switchable.

    NPR (ScaleRL): a prompt whose pass rate reached `npr_threshold` (0.9) is not sampled in later epochs. The paper
    does not say which pass rate; `last` uses the prompt's most recent epoch (TRL's experimental ScaleRL trainer),
    `cumulative` its mean over all epochs so far (the prime-rl fork). Its state goes into checkpoints.
    """

    def __init__(self, zero_variance: bool = True, no_positive_resampling: bool = True, npr_threshold: float = 0.9,
                 npr_mode: str = "last", **_: object):
        if npr_mode not in ("last", "cumulative"):
            raise ValueError(f"filtering.npr_mode must be 'last' or 'cumulative', got '{npr_mode}'")
        self.zero_variance, self.npr = zero_variance, no_positive_resampling
        self.threshold, self.mode = npr_threshold, npr_mode
        self.passed: dict[int, float] = {}  # prompt id -> summed pass rate of its epochs (cumulative) or the last
        self.epochs: dict[int, int] = {}  # prompt id -> epochs seen

    def keep(self, rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """Keep mask [N] for the loss."""
        if not self.zero_variance:
            return torch.ones_like(group, dtype=torch.bool)
        return zero_variance(rewards, group)

    def observe(self, prompt_ids: torch.Tensor, correct: torch.Tensor) -> None:
        """Record one epoch's pass rate of each prompt in the batch (correct: [N] bool or 0/1)."""
        for pid in prompt_ids.unique().tolist():
            rate = float(correct[prompt_ids == pid].float().mean())
            if self.mode == "last":
                self.passed[pid], self.epochs[pid] = rate, 1
            else:
                self.passed[pid] = self.passed.get(pid, 0.0) + rate
                self.epochs[pid] = self.epochs.get(pid, 0) + 1

    def retired(self) -> set[int]:
        """Prompts NPR keeps out of later epochs."""
        if not self.npr:
            return set()
        return {pid for pid, total in self.passed.items() if total / self.epochs[pid] >= self.threshold}

    def sampleable(self, prompt_ids: Iterable[int]) -> list[int]:
        gone = self.retired()
        return [p for p in prompt_ids if p not in gone]

    def state_dict(self) -> dict:
        return {"passed": dict(self.passed), "epochs": dict(self.epochs)}

    def load_state_dict(self, state: dict) -> None:
        self.passed = {int(k): float(v) for k, v in state["passed"].items()}
        self.epochs = {int(k): int(v) for k, v in state["epochs"].items()}
