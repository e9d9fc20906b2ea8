"""The learner's plan before ablate/plan.py's balanced ones, kept for the benches and tests that compare with it
(bench/bench_learner_plan.py, bench/bench_gpu.py's `today` forms, tests/test_plan.py): the trained rows dealt round
robin by length (`deal`), each rank's cut into padded micro-batches (`micro_batches`), every
rank running as many passes as the busiest, the others' extra ones dummy passes on row 0. The learner no longer runs
it; it is an `ablate.plan.Plan`, so its statistics read as the live plans' do."""

from __future__ import annotations

import torch

from ablate.plan import ATTENTION_8B, Plan


def round_robin(lengths: torch.Tensor, trained: torch.Tensor, world: int, budget: int, max_rows: int,
                attention: float = ATTENTION_8B) -> Plan:
    """The retired plan of a step (module docstring): passes of at most `max_rows` rows and, when `budget` > 0, about
    `budget` tokens once padded to their longest row."""
    lens = [int(n) for n in lengths.tolist()]
    passes = [[b.tolist() for b in micro_batches(lengths, deal(lengths, trained, rank, world), max_rows, budget)]
              for rank in range(world)]
    most = max((len(p) for p in passes), default=0)
    return Plan("padded", [p + [[]] * (most - len(p)) for p in passes], lens, 0, attention)


def deal(lengths: torch.Tensor, trained: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """The trained rows dealt to `rank` of `world` (a mask [N]): by length, longest first, round robin, so that every
    rank gets rows of every length and about the same number of tokens (the retired plan's deal)."""
    order = torch.argsort(lengths, descending=True, stable=True)
    order = order[trained[order]]
    mine = torch.zeros_like(trained)
    mine[order[rank::world]] = True
    return mine


def micro_batches(lengths: torch.Tensor, trained: torch.Tensor, max_rows: int, max_tokens: int = 0
                  ) -> list[torch.Tensor]:
    """The retired plan's cut: the rows to train [N] in micro-batches of similar lengths, longest
    first, each at most `max_rows` rows and (when max_tokens > 0) at most about `max_tokens` tokens once padded to its
    longest row (a row longer than that goes alone). lengths [N]: tokens of each row (prompt + completion); trained
    [N]: rows with a token in the loss (the others are skipped). Returns index tensors on the rows' device."""
    order = torch.argsort(lengths, descending=True, stable=True)
    order = order[trained[order]]
    batches, start = [], 0
    for i, size in enumerate(lengths[order].tolist()):
        if i == start:
            width = size  # the longest row of the micro-batch: its padded width
        elif i - start == max_rows or (max_tokens > 0 and (i + 1 - start) * width > max_tokens):
            batches.append(order[start:i])
            start, width = i, size
    if start < len(order):
        batches.append(order[start:])
    return batches
