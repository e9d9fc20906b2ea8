"""Rank variants by their fitted ceiling A and, where A values are equal within the noise, by the efficiency B.

Source: the paper treats A values within 0.02 as equal (three independent runs gave A within +-0.015) and then
compares B. "Within 0.02" is not transitive (0.60 ~ 0.615 ~ 0.63), so the rule is made explicit here:
- take the highest A not yet ranked as an anchor; its tie group is every unranked fit with A >= anchor - 0.02;
- rank the group by B (higher first, then A, then input order); repeat with the rest.
Each group spans at most 0.02 in A; two fits within 0.02 of each other that fall in different groups keep the
order of A. Members of a group of two or more are reported as "tie on A". Failed fits rank last, unnumbered.
The paper also refits tied runs with a common A before comparing B; this first version compares the fitted B.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from analysis.fit import SigmoidFit

A_TIE = 0.02


@dataclass(frozen=True)
class Ranked:
    rank: int | None  # 1 = best; None for a failed fit
    name: str
    fit: SigmoidFit
    index: int  # position in the input
    tie_with: tuple[str, ...] = ()  # the other members of its tie group on A

    @property
    def note(self) -> str:
        return f"tie on A with {', '.join(self.tie_with)}" if self.tie_with else ""


def rank_fits(fits: Sequence[tuple[str, SigmoidFit]], *, a_tie: float = A_TIE) -> list[Ranked]:
    """Rank (name, fit) pairs; returns them best first, failed fits last in input order."""
    ok = [(i, name, fit) for i, (name, fit) in enumerate(fits) if fit.ok]
    failed = [(i, name, fit) for i, (name, fit) in enumerate(fits) if not fit.ok]

    remaining = sorted(ok, key=lambda item: (-item[2].A, item[0]))
    ranked: list[Ranked] = []
    while remaining:
        anchor = remaining[0][2].A
        group = [item for item in remaining if item[2].A >= anchor - a_tie]
        remaining = [item for item in remaining if item[2].A < anchor - a_tie]
        group.sort(key=lambda item: (-item[2].B, -item[2].A, item[0]))
        for i, name, fit in group:
            others = tuple(other for j, other, _ in group if j != i)
            ranked.append(Ranked(rank=len(ranked) + 1, name=name, fit=fit, index=i, tie_with=others))
    ranked.extend(Ranked(rank=None, name=name, fit=fit, index=i) for i, name, fit in failed)
    return ranked
