"""Rank variants as the paper does, with the rule made explicit, and give each a verdict against the base recipe.

The paper treats A values within 0.02 as equal (three independent runs gave A within +-0.015), refits such runs
with a common A and compares B. Here:
- Tie on A: two fits whose A values are within 0.02, or whose 90% intervals on A overlap (the data cannot tell
  their ceilings apart). "Within" is not transitive, so groups are anchored: the highest A not yet ranked is the
  anchor, its group is every unranked fit tied with it; repeat with the rest.
- In a group of two or more, the members are refitted with a common A (a joint fit in which A is one shared
  parameter, analysis/joint.py: their B intervals then include the uncertainty of that A) and ranked by their B
  at it, highest first. Members whose B intervals overlap the best remaining one's are tied on B: they share a rank.
  Without the data (fits alone) the fitted B and their intervals are compared.
- Failed fits rank last, unnumbered.

Verdict of a variant against the base recipe (the scalerl run): "moves A" when A differs by more than 0.02 and the
two A intervals do not overlap; otherwise "moves B" when, the two refitted with a common A, the B intervals do not
overlap; otherwise "no detectable change".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from analysis.fit import FitError, SigmoidFit

A_TIE = 0.02

# common(indices) -> the fits of those inputs refitted with one shared A (analysis.joint.CommonAFit);
# raises FitError when it cannot be made
Common = Callable[[list[int]], "CommonAFit"]  # noqa: F821


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def tied_on_A(f: SigmoidFit, g: SigmoidFit, a_tie: float = A_TIE) -> bool:
    """Within the paper's 0.02, or the intervals overlap."""
    return abs(f.A - g.A) <= a_tie + 1e-12 or overlap(f.ci["A"], g.ci["A"])


@dataclass(frozen=True)
class Ranked:
    rank: int | None  # 1 = best; members tied on B share a rank; None for a failed fit
    name: str
    fit: SigmoidFit
    index: int  # position in the input
    tie_with: tuple[str, ...] = ()  # the other members of its tie group on A
    common_A: float | None = None  # the A its group was refitted with
    b_fit: SigmoidFit | None = None  # the refit with A = common_A
    b_tie_with: tuple[str, ...] = ()  # members it is also tied with on B (same rank)
    refit_error: str = ""
    common_ci: tuple[float, float] | None = None

    @property
    def B_compared(self) -> float:
        """The B it was ranked by: at the common A when it was in a tie group, else its own."""
        return self.b_fit.B if self.b_fit is not None else self.fit.B

    @property
    def B_compared_ci(self) -> tuple[float, float]:
        return self.b_fit.ci["B"] if self.b_fit is not None else self.fit.ci["B"]

    @property
    def note(self) -> str:
        parts = []
        if self.tie_with:
            at = f" (compared on B at common A = {self.common_A:.3f})" if self.common_A is not None else ""
            parts.append(f"tie on A with {', '.join(self.tie_with)}{at}")
        if self.b_tie_with:
            parts.append(f"tie on B with {', '.join(self.b_tie_with)}")
        if self.refit_error:
            parts.append(f"common-A refit failed ({self.refit_error}): its own B was used")
        return "; ".join(parts)


def rank_fits(
    fits: Sequence[tuple[str, SigmoidFit]], *, common: Common | None = None, a_tie: float = A_TIE
) -> list[Ranked]:
    """Rank (name, fit) pairs; returns them best first, failed fits last in input order.

    common(indices): those fits redone with one shared A, for comparing B at a common A. Without it the fitted B
    values and their intervals are compared (fits without the data behind them)."""
    ok = [(i, name, fit) for i, (name, fit) in enumerate(fits) if fit.ok]
    failed = [(i, name, fit) for i, (name, fit) in enumerate(fits) if not fit.ok]

    remaining = sorted(ok, key=lambda item: (-item[2].A, item[0]))
    ranked: list[Ranked] = []
    while remaining:
        anchor = remaining[0]
        group = [anchor] + [item for item in remaining[1:] if tied_on_A(anchor[2], item[2], a_tie)]
        chosen = {item[0] for item in group}
        remaining = [item for item in remaining if item[0] not in chosen]
        if len(group) == 1:
            i, name, fit = anchor
            ranked.append(Ranked(rank=len(ranked) + 1, name=name, fit=fit, index=i))
            continue
        ranked.extend(_rank_group(group, common, start=len(ranked) + 1))
    ranked.extend(Ranked(rank=None, name=name, fit=fit, index=i) for i, name, fit in failed)
    return ranked


def _rank_group(group, common: Common | None, start: int) -> list[Ranked]:
    """Members tied on A: refit with a common A, order by B, ties on B share a rank."""
    joint, error = None, ""
    if common is not None:
        try:
            joint = common([i for i, _, _ in group])
        except FitError as err:
            error = err.reason
    members = [dict(i=i, name=name, fit=fit, b_fit=joint.fits[k] if joint else None, error=error)
               for k, (i, name, fit) in enumerate(group)]

    def b_of(m):
        return m["b_fit"] if m["b_fit"] is not None else m["fit"]

    members.sort(key=lambda m: (-b_of(m).B, -m["fit"].A, m["i"]))
    names = [m["name"] for m in members]
    out: list[Ranked] = []
    todo = members
    while todo:
        top = todo[0]
        tied = [m for m in todo if m is top or overlap(b_of(m).ci["B"], b_of(top).ci["B"])]
        todo = [m for m in todo if all(m is not t for t in tied)]
        rank = start + len(out)
        for m in tied:
            out.append(Ranked(
                rank=rank,
                name=m["name"],
                fit=m["fit"],
                index=m["i"],
                tie_with=tuple(n for n in names if n != m["name"]),
                common_A=joint.A if joint else None,
                common_ci=joint.ci_A if joint else None,
                b_fit=m["b_fit"],
                b_tie_with=tuple(t["name"] for t in tied if t is not m),
                refit_error=m["error"],
            ))
    return out


# --- verdicts against the base recipe --------------------------------------------------------------------------

MOVES_A, MOVES_B, NO_CHANGE = "moves A", "moves B", "no detectable change"


@dataclass(frozen=True)
class Verdict:
    label: str  # moves A | moves B | no detectable change | base | no fit | no base
    dA: float | None = None  # A - A_base
    dB: float | None = None  # B - B_base, at their common A when compared on B (else as fitted)
    common_A: float | None = None
    B: tuple[float, float] | None = None  # (variant, base) B at the common A
    detail: str = ""


def verdict(
    fit: SigmoidFit,
    base: SigmoidFit | None,
    *,
    common: Callable[[], "CommonAFit"] | None = None,  # noqa: F821
    a_tie: float = A_TIE,
) -> Verdict:
    """The variant's verdict against the base recipe's fit; common() refits (variant, base) with a shared A."""
    if not fit.ok:
        return Verdict("no fit", detail=fit.status)
    if base is None or not base.ok:
        return Verdict("no base", detail="no fitted base recipe (scalerl) to compare with")
    dA = fit.A - base.A
    if abs(dA) > a_tie and not overlap(fit.ci["A"], base.ci["A"]):
        side = "higher" if dA > 0 else "lower"
        return Verdict(MOVES_A, dA=dA, dB=fit.B - base.B,
                       detail=f"A {side} by {abs(dA):.3f} ({fit.A:.3f} vs {base.A:.3f}), beyond {a_tie} and the "
                              f"intervals")
    mine, theirs, a_common, note = fit, base, None, ""
    if common is not None:
        try:
            joint = common()
            mine, theirs, a_common = joint.fits[0], joint.fits[1], joint.A
        except FitError as err:
            note = f" (common-A refit failed: {err.reason}; fitted B compared)"
    dB = mine.B - theirs.B
    at = f"at common A = {a_common:.3f}" if a_common is not None else "as fitted"
    (lo, hi), (base_lo, base_hi) = mine.ci["B"], theirs.ci["B"]
    spans = f"[{lo:.2f}, {hi:.2f}] vs [{base_lo:.2f}, {base_hi:.2f}]"
    if not overlap(mine.ci["B"], theirs.ci["B"]):
        side = "higher" if dB > 0 else "lower"
        return Verdict(MOVES_B, dA=dA, dB=dB, common_A=a_common, B=(mine.B, theirs.B),
                       detail=f"A tied ({dA:+.3f}); B {side}: {mine.B:.2f} vs {theirs.B:.2f} {at}, {spans}{note}")
    return Verdict(NO_CHANGE, dA=dA, dB=dB, common_A=a_common, B=(mine.B, theirs.B),
                   detail=f"A tied ({dA:+.3f}); B {mine.B:.2f} vs {theirs.B:.2f} {at}, intervals overlap "
                          f"{spans}{note}")
