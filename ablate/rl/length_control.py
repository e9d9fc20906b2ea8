"""Length control: the generator-side budget (interruption) and the reward-side penalty (length penalty).

Generators call `think_budget` once per rollout: None means no interruption; an int means that after that many
thinking tokens the generator injects `phrase` (tokens masked out of the loss) and allows max_answer_tokens more.
The trainer adds `reward_shaping(lengths)` to the rewards. Every option reports the truncation rate through the
rollouts' `truncated` flags.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch


class Truncation:
    """Plain truncation at the generation limits (no budget, no penalty)."""

    phrase: Optional[str] = None

    def __init__(self, **_: object):
        pass

    def think_budget(self, rng: np.random.Generator, max_think_tokens: int) -> Optional[int]:
        return None

    def reward_shaping(self, lengths: torch.Tensor, l_max: int) -> torch.Tensor:
        return torch.zeros(lengths.shape, dtype=torch.float32, device=lengths.device)


class Interruption(Truncation):
    """ScaleRL's forced interruption: a thinking budget drawn per rollout, uniform in
    [think_budget_min_frac, think_budget_max_frac] x max_think_tokens (paper: 10k-12k of 12,288), then `phrase`.
    """

    def __init__(self, think_budget_min_frac: float, think_budget_max_frac: float, phrase: str, **_: object):
        if not 0 < think_budget_min_frac <= think_budget_max_frac <= 1:
            raise ValueError("length_control: need 0 < think_budget_min_frac <= think_budget_max_frac <= 1, got "
                             f"{think_budget_min_frac}, {think_budget_max_frac}")
        self.lo, self.hi, self.phrase = think_budget_min_frac, think_budget_max_frac, phrase

    def think_budget(self, rng: np.random.Generator, max_think_tokens: int) -> Optional[int]:
        lo, hi = int(round(self.lo * max_think_tokens)), int(round(self.hi * max_think_tokens))
        return int(rng.integers(max(lo, 1), max(hi, 1) + 1))


class LengthPenalty(Truncation):
    """The DAPO overlong penalty (Yu et al. 2025), over the whole completion of at most L_max tokens:
    0 for |y| <= L_max - L_cache; ((L_max - L_cache) - |y|) / L_cache above; -1 beyond L_max.
    L_cache = l_cache_frac x L_max (paper: 2k of 14k).
    """

    def __init__(self, l_cache_frac: float, **_: object):
        if not 0 < l_cache_frac < 1:
            raise ValueError(f"length_control.l_cache_frac must be in (0, 1), got {l_cache_frac}")
        self.l_cache_frac = l_cache_frac

    def reward_shaping(self, lengths: torch.Tensor, l_max: int) -> torch.Tensor:
        l_cache = self.l_cache_frac * l_max
        y = lengths.to(torch.float32)
        ramp = ((l_max - l_cache) - y) / l_cache
        return torch.where(y <= l_max - l_cache, torch.zeros_like(y), torch.where(y <= l_max, ramp, -torch.ones_like(y)))
