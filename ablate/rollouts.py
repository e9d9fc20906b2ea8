"""The data a generator hands the trainer for one optimizer step."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch


@dataclass
class Rollouts:
    """N completions (G per prompt) padded to T tokens. Shapes in comments."""

    prompt_ids: torch.Tensor  # [N] int64: the task's id of each completion's prompt
    group: torch.Tensor  # [N] int64: 0..P-1, the prompt's position in this batch (completions of a prompt share it)
    prompt_tokens: torch.Tensor  # [N, Tp] int64: each completion's prompt, left-padded
    prompt_mask: torch.Tensor  # [N, Tp] bool: the real prompt tokens
    tokens: torch.Tensor  # [N, T] int64: completion token ids (padding: 0)
    mask: torch.Tensor  # [N, T] bool: tokens the loss sees (sampled by the policy; not padding, not injected)
    gen_logprobs: torch.Tensor  # [N, T] float32: log-prob of each token under the generator's policy
    versions: torch.Tensor  # [N, T] int64: the policy version that produced each token
    lengths: torch.Tensor  # [N] int64: completion length in tokens, injected tokens included
    rewards: torch.Tensor  # [N] float32: the task's reward (the trainer adds the length control's shaping)
    correct: torch.Tensor  # [N] bool: the answer checked correct (pass rates, No-Positive-Resampling)
    truncated: torch.Tensor  # [N] bool: hit a length limit without an answer

    @property
    def n(self) -> int:
        return int(self.tokens.shape[0])

    def to(self, device: torch.device) -> Rollouts:
        return Rollouts(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def rows_only(self, rows: torch.Tensor) -> Rollouts:
        """The batch as a trainer rank that trains `rows` (indices) needs it: every row's [N] fields, prompt mask and
        loss mask (the batch-wide advantages, weights and shares read them), and the tokens, prompts, log-probs and
        versions of `rows` alone (ROW_FIELDS: ~94% of a step's bytes at the paper's lengths). `expanded` undoes it."""
        return replace(self, **{name: getattr(self, name)[rows] for name in ROW_FIELDS})

    def expanded(self, rows: torch.Tensor) -> Rollouts:
        """A batch from `rows_only(rows)` at its whole size again: ROW_FIELDS at `rows`, zeros at the other rows."""
        n = int(self.mask.shape[0])
        whole = {}
        for name in ROW_FIELDS:
            part = getattr(self, name)
            whole[name] = part.new_zeros((n, *part.shape[1:]))
            whole[name][rows] = part
        return replace(self, **whole)


ROW_FIELDS = ("prompt_tokens", "tokens", "gen_logprobs", "versions")  # [N, ...] and only read at a rank's own rows
