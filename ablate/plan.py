"""The learner's plan for one step: which trained rows each trainer rank runs in which forward/backward pass.

Two forms of a pass. `padded`: the rows side by side, each padded to the pass's longest (ablate/policy.py's per-row
`Scorer`); a pass costs rows x longest decoder tokens and rows x longest^2 attention. `packed`: the rows flattened into
one sequence, attention kept within each row (varlen, `PackedScorer`); a pass costs the sum of its rows' lengths, and
of their squares.
Both deal the rows to ranks and bin them into passes by tokens so that every rank runs the same number of passes
(FSDP's collectives pair up pass by pass), none a dummy where there are rows enough, with the work spread evenly.
A plan is a function of every row's length alone, so every rank computes the same one and no collective is needed.
Why and the figures: docs/training.md#the-learners-plan.

Their budgets (the trainer's `step_plan`): a padded pass holds at most train.micro_batch_size rows and
train.micro_batch_tokens tokens counted padded (0: no token cap); a packed pass has no row cap and holds at most
`budget` real tokens, train.micro_batch_tokens where set, else micro_batch_size x the step's longest row (as many as
the padded form's largest pass, so that one memory estimate bounds both forms). A row longer than its budget goes
alone in either form.

The learner's plan before these (a round-robin deal, padded micro-batches) lives in bench/retired_plan.py, for the
benches that compare with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Attention's work per squared token, in decoder tokens: a causal row of L tokens costs about 6 x hidden x layers x
# L^2 FLOPs of attention (forward and backward) against 6N x L of the decoder's matmuls, so hidden x layers / N per
# L^2; an 8B Llama (hidden 4,096, 32 layers, 8.0e9 parameters): 1 / 61,000. The trainer passes its model's own.
ATTENTION_8B = 4096 * 32 / 8.0e9


@dataclass(frozen=True)
class Plan:
    """Rows by rank and pass: `passes[rank][i]` is the row indices rank `rank` runs in its pass i (an empty list: a
    dummy pass, which runs row `filler` alone with weight 0 so that the rank joins the collectives). Every rank has
    the same number of passes.

    Work (`imbalance`, `lockstep`): a pass's computed decoder tokens plus `attention` x its computed attention (the
    sum of squared row lengths attended over, padding included), in decoder tokens of the same cost."""

    form: str  # "padded" | "packed": how a pass's cost is counted
    passes: list[list[list[int]]]
    lengths: list[int]  # of every row of the batch (prompt + completion tokens)
    filler: int
    attention: float
    notes: tuple[str, ...] = ()  # what the plan could not do: rows over the budget, dummy passes it could not avoid

    def rows(self, rank: int) -> list[int]:
        """Every row rank `rank` trains, in pass order."""
        return [row for batch in self.passes[rank] for row in batch]

    def cost(self, batch: list[int]) -> tuple[int, int]:
        """(decoder tokens, attention) a pass of `batch` computes; a dummy pass computes the filler row."""
        lens = [self.lengths[row] for row in batch] or [self.lengths[self.filler]]
        if self.form == "padded":
            return len(lens) * max(lens), len(lens) * max(lens) ** 2
        return sum(lens), sum(n * n for n in lens)

    def work(self, batch: list[int]) -> float:
        tokens, attention = self.cost(batch)
        return tokens + self.attention * attention

    @property
    def passes_per_rank(self) -> int:
        return max((len(p) for p in self.passes), default=0)

    @property
    def dummies(self) -> int:
        return sum(not batch for p in self.passes for batch in p)

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths[row] for p in self.passes for batch in p for row in batch)

    @property
    def real_attention(self) -> int:
        return sum(self.lengths[row] ** 2 for p in self.passes for batch in p for row in batch)

    @property
    def computed_tokens(self) -> int:
        return sum(self.cost(batch)[0] for p in self.passes for batch in p)

    @property
    def computed_attention(self) -> int:
        return sum(self.cost(batch)[1] for p in self.passes for batch in p)

    @property
    def token_efficiency(self) -> float:
        """Real decoder tokens over the tokens computed (padding and dummy passes computed too)."""
        return self.real_tokens / self.computed_tokens if self.computed_tokens else 1.0

    @property
    def attention_efficiency(self) -> float:
        return self.real_attention / self.computed_attention if self.computed_attention else 1.0

    @property
    def imbalance(self) -> float:
        """The busiest rank's work over the mean rank's, minus 1."""
        totals = [sum(self.work(batch) for batch in p) for p in self.passes]
        mean = sum(totals) / len(totals) if totals else 0.0
        return max(totals) / mean - 1.0 if mean else 0.0

    @property
    def paced(self) -> float:
        """The step's work at the pace of its slowest rank, pass by pass (FSDP's collectives pair up pass by pass):
        the sum over passes of the slowest rank's work; what the step's time goes with."""
        return sum(max(self.work(p[i]) for p in self.passes) for i in range(self.passes_per_rank))

    @property
    def lockstep(self) -> float:
        """As `imbalance`, with each pass waiting for its slowest rank: `paced` over the mean rank's work, minus 1.
        At least `imbalance`."""
        totals = [sum(self.work(batch) for batch in p) for p in self.passes]
        mean = sum(totals) / len(totals) if totals else 0.0
        return self.paced / mean - 1.0 if mean else 0.0

    def summary(self) -> dict[str, float]:
        return {"token_efficiency": self.token_efficiency, "attention_efficiency": self.attention_efficiency,
                "passes_per_rank": self.passes_per_rank, "dummies": self.dummies, "imbalance": self.imbalance,
                "lockstep": self.lockstep, "paced": self.paced}


def padded(lengths: torch.Tensor, trained: torch.Tensor, world: int, budget: int, max_rows: int,
           attention: float = ATTENTION_8B) -> Plan:
    """The balanced plan of padded passes: the trained rows sorted longest first and cut into runs of neighbours (so
    a pass pads little), each at most `max_rows` rows (0: no cap) and `budget` tokens padded (0: no cap; a row longer
    than that goes alone). As few runs as those caps allow, rounded up to a multiple of `world`, cut so that the
    heaviest is as light as it can be (`balanced`); then dealt to the ranks (`_to_ranks`). The row cap leaves short
    rows' runs lighter than long rows' whatever the cut, so a pass's runs differ across ranks more than packed bins
    do (`lockstep`)."""
    lens, order = _trained(lengths, trained, world, budget, max_rows)
    fits = lambda start, end: end - start == 1 or ((not max_rows or end - start <= max_rows)  # noqa: E731
                                                    and (not budget or (end - start) * lens[order[start]] <= budget))
    run_work = lambda start, end: (end - start) * lens[order[start]] * (1 + attention * lens[order[start]])  # noqa

    def cut(first: int, last: int, limit: float) -> list[tuple[int, int]]:
        """Runs of order[first:last], each as long as the caps and `limit` on its work allow."""
        runs, start = [], first
        for end in range(first + 1, last + 1):
            if end - start > 1 and not (fits(start, end) and run_work(start, end) <= limit):
                runs.append((start, end - 1))
                start = end - 1
        return runs + [(start, last)] if last > first else runs

    def balanced(first: int, last: int, count: int) -> list[tuple[int, int]]:
        """order[first:last] in `count` runs (fewer where it has fewer rows) whose heaviest is as light as it can be:
        bisection on the limit of a run's work, between the heaviest row alone and the heaviest run of the fewest
        runs (which needs no more than `count`); then the heaviest runs halved while there are fewer than `count`."""
        low = max((run_work(i, i + 1) for i in range(first, last)), default=0.0)
        high = max((run_work(*r) for r in cut(first, last, math.inf)), default=0.0)
        for _ in range(60):
            middle = (low + high) / 2
            low, high = (low, middle) if len(cut(first, last, middle)) <= count else (middle, high)
        runs = cut(first, last, high)
        while len(runs) < count and any(end - start > 1 for start, end in runs):
            start, end = max((r for r in runs if r[1] - r[0] > 1), key=lambda r: run_work(*r))
            middle = min(range(start + 1, end), key=lambda m: max(run_work(start, m), run_work(m, end)))
            at = runs.index((start, end))
            runs[at:at + 1] = [(start, middle), (middle, end)]
        return runs

    count = _rounded(len(cut(0, len(order), math.inf)), world)
    return _to_ranks("padded", [order[s:e] for s, e in balanced(0, len(order), count)], count, world, attention,
                     lens, order, budget)


def packed(lengths: torch.Tensor, trained: torch.Tensor, world: int, budget: int,
           attention: float = ATTENTION_8B) -> Plan:
    """The balanced plan of packed passes: a pass holds rows of at most `budget` real tokens in all (0: no cap; a row
    longer than that goes alone). The fewest passes a rank that the budget allows, ceil(tokens / (world x budget))
    and up, each tried by worst-fit decreasing into world x passes bins (the longest row first, into the bin of least
    work it fits in: each bin gets one of the longest rows before any gets two, and the bins end near equal); then
    dealt to the ranks (`_to_ranks`)."""
    lens, order = _trained(lengths, trained, world, budget, None)
    over = sum(lens[row] > budget for row in order) if budget else 0
    total = sum(lens[row] for row in order)
    per_rank = max(math.ceil(total / (world * budget)) if budget else 1, math.ceil(over / world), 1 if order else 0)
    while True:
        bins = _worst_fit(order, lens, world * per_rank, budget, attention)
        if bins is not None:
            return _to_ranks("packed", bins, world * per_rank, world, attention, lens, order, budget)
        per_rank += 1  # terminates: with a bin a row, every row fits


def _trained(lengths: torch.Tensor, trained: torch.Tensor, world: int, budget: int, max_rows: int | None
             ) -> tuple[list[int], list[int]]:
    """Every row's length, and the trained rows longest first (ties: the lower index first); checks the inputs."""
    if lengths.dim() != 1 or trained.shape != lengths.shape or trained.dtype != torch.bool:
        raise ValueError(f"a plan takes lengths [N] and a bool trained [N]; got lengths {tuple(lengths.shape)} and "
                         f"trained {tuple(trained.shape)} of {trained.dtype}")
    if world < 1 or budget < 0 or (max_rows or 0) < 0:
        raise ValueError(f"a plan needs world >= 1, budget >= 0 (and max_rows >= 0); got world={world}, "
                         f"budget={budget}" + (f", max_rows={max_rows}" if max_rows is not None else ""))
    lens, keep = [int(n) for n in lengths.tolist()], trained.tolist()
    order = [row for row in sorted(range(len(lens)), key=lambda r: -lens[r]) if keep[row]]
    if order and lens[order[-1]] < 1:
        raise ValueError(f"trained row {order[-1]} has length {lens[order[-1]]}: a trained row has a token or more")
    return lens, order


def _rounded(count: int, world: int) -> int:
    return -(-count // world) * world


def _worst_fit(order: list[int], lens: list[int], count: int, budget: int, attention: float
               ) -> list[list[int]] | None:
    """`order`'s rows (longest first) in `count` bins of at most `budget` tokens each (a row longer goes alone, into
    an empty bin), each row into the bin of least work it fits in; None where a row fits in none."""
    bins: list[list[int]] = [[] for _ in range(count)]
    tokens, work = [0] * count, [0.0] * count
    for row in order:
        n = lens[row]
        fits = [b for b in range(count) if not bins[b] or not budget or tokens[b] + n <= budget]
        if not fits:
            return None
        b = min(fits, key=lambda b: (work[b], b))
        bins[b].append(row)
        tokens[b] += n
        work[b] += n + attention * n * n
    return bins


def _to_ranks(form: str, bins: list[list[int]], count: int, world: int, attention: float, lens: list[int],
              order: list[int], budget: int) -> Plan:
    """`bins` (with empty ones, dummy passes, up to `count`, a multiple of `world`) dealt to the ranks pass by pass:
    the bins by work, heaviest first, `world` at a time (a round: one pass of every rank), each time the heaviest to
    the rank with the least work so far, so that a round's bins are near alike (FSDP's ranks wait for each other pass
    by pass) and the ranks' totals end near equal. Dummy passes run the shortest trained row."""
    filler = order[-1] if order else 0
    probe = Plan(form, [], lens, filler, attention)
    bins = sorted(bins + [[]] * (count - len(bins)), key=lambda b: -probe.work(b) if b else 0.0)  # empty ones last
    passes: list[list[list[int]]] = [[] for _ in range(world)]
    totals = [0.0] * world
    for start in range(0, count, world):
        for batch, rank in zip(bins[start:start + world], sorted(range(world), key=lambda r: (totals[r], r))):
            passes[rank].append(batch)
            totals[rank] += probe.work(batch)
    notes, dummies = [], sum(not b for b in bins)
    if budget and order and lens[order[0]] > budget:
        alone = [row for row in order if lens[row] > budget]
        notes.append(f"{len(alone)} row(s) longer than the budget of {budget} tokens, each alone in a pass "
                     f"(the longest, row {alone[0]}: {lens[alone[0]]} tokens)")
    if dummies:
        notes.append(f"{dummies} dummy pass(es): {len(order)} trained rows cannot fill {world} ranks x "
                     f"{count // world} passes")
    return Plan(form, passes, lens, filler, attention, tuple(notes))
