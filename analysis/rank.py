"""Rank variants and give each a verdict against the base recipe, with the resolution it had.

- `rank_fits`: fits whose A intervals overlap are tied on A, grouped from the highest A down; a group is ranked by
  B at a common A (the joint refit, passed in as `common`), or by its own B when the data reject one; failed fits
  rank last.
- `verdict`: moves A, moves B, moves A and B, moves C_mid (the compute to reach a reward both reach: `efficiency`),
  or no detectable change; each claim a z-test (`Claim`: the change over the sd of the two intervals' facing sides)
  against a critical value, `CRITICAL` at one look (two-sided ALPHA), an adaptive sweep's boundary at its looks;
  `resolution`: the smallest change the comparison detects 9 times in 10.
The rules, and where they depart from the paper: docs/fitting.md#ranking, docs/fitting.md#the-verdicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Collection, Sequence

import numpy as np

from analysis.law import CI_LEVEL, FitError, SigmoidFit, fmt_compute

BASELINE = "scalerl"  # the base recipe the verdicts compare with (the ablate.variant tag of its runs)
A_TIE = 0.02  # the paper's margin: a move of A below it is labelled small
DETECT = 0.9  # the resolution is the change detected with this probability
# A claim's two-sided false-claim rate at one look: that of "the two 90% intervals apart" when they are equally wide
# (1.645 sqrt(2) = 2.326 standard errors of the difference), held whatever their widths (docs/fitting.md#the-verdicts)
ALPHA = 0.02

# common(indices) -> the fits of those inputs refitted with one shared A (analysis.joint.CommonAFit);
# raises FitError when it cannot be made
Common = Callable[[list[int]], "CommonAFit"]  # noqa: F821


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def tied_on_A(f: SigmoidFit, g: SigmoidFit) -> bool:
    """Their A intervals overlap: the data cannot tell the ceilings apart."""
    return overlap(f.ci["A"], g.ci["A"])


@dataclass(frozen=True)
class Ranked:
    rank: int | None  # 1 = best; members tied on B share a rank; None for a failed fit
    name: str
    fit: SigmoidFit
    index: int  # position in the input
    tie_with: tuple[str, ...] = ()  # the other members of its tie group on A
    common_A: float | None = None  # the A its group was refitted with (None: own B compared)
    b_fit: SigmoidFit | None = None  # the refit with A = common_A
    b_tie_with: tuple[str, ...] = ()  # members it is also tied with on B (same rank)
    refit_error: str = ""  # why the group's own B were compared instead (refit failed, or a common A rejected)
    common_ci: tuple[float, float] | None = None

    @property
    def B_compared(self) -> float:
        """The B it was ranked by: at the common A when its group was refitted with one, else its own."""
        return self.b_fit.B if self.b_fit is not None else self.fit.B

    @property
    def B_compared_ci(self) -> tuple[float, float]:
        return self.b_fit.ci["B"] if self.b_fit is not None else self.fit.ci["B"]

    @property
    def tie_rule(self) -> str:
        """How its tie on A was ranked: " (ranked by B at their common A = ...)" or " (ranked by their own B...)"."""
        if self.common_A is not None:
            return f" (ranked by B at their common A = {self.common_A:.3f}: {self.B_compared:.2f})"
        return f" (ranked by their own B{': ' + self.refit_error if self.refit_error else ''})"

    @property
    def note(self) -> str:
        parts = []
        if self.tie_with:
            parts.append(f"tie on A with {', '.join(self.tie_with)}{self.tie_rule}")
        if self.b_tie_with:
            parts.append(f"tie on B with {', '.join(self.b_tie_with)}")
        return "; ".join(parts)


def rank_fits(fits: Sequence[tuple[str, SigmoidFit]], *, common: Common | None = None) -> list[Ranked]:
    """Rank (name, fit) pairs; returns them best first, failed fits last in input order.

    common(indices): those fits redone with one shared A, for comparing B at a common A. Without it the fitted B
    values and their intervals are compared (fits without the data behind them)."""
    ok = [(i, name, fit) for i, (name, fit) in enumerate(fits) if fit.ok]
    failed = [(i, name, fit) for i, (name, fit) in enumerate(fits) if not fit.ok]

    remaining = sorted(ok, key=lambda item: (-item[2].A, item[0]))
    ranked: list[Ranked] = []
    while remaining:
        anchor = remaining[0]
        group = [anchor] + [item for item in remaining[1:] if tied_on_A(anchor[2], item[2])]
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
    """Members tied on A: refit with a common A (unless the data reject one), order by B, ties on B share a rank."""
    joint, error = None, ""
    if common is not None:
        try:
            joint = common([i for i, _, _ in group])
        except FitError as err:
            error = f"common-A refit failed ({err.reason})"
        else:
            if joint.a_rejected:
                error = f"a common A fits poorly (likelihood ratio {joint.lr_A:.2f})"
                joint = None
    members = [dict(i=i, name=name, fit=fit, b_fit=joint.fits[k] if joint else None)
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
                refit_error=error,
            ))
    return out


# --- the resolution of a comparison ------------------------------------------------------------------------------


def _halves(x: float, ci: tuple[float, float], top: float, bottom: float = 0.0) -> tuple[float, float]:
    """(x - low, high - x) of an interval; a side that reaches the parameter's open bound (`bottom` below: 0 for A
    and B, -inf for a log; `top` above: 1 for A, inf for B) is infinite: the data do not bound it."""
    lo, hi = ci
    below = x - lo if lo > bottom and math.isfinite(lo) else math.inf
    above = hi - x if hi < top and math.isfinite(hi) else math.inf
    return below, above


def critical(alpha: float = ALPHA) -> float:
    """The two-sided critical value of a z-test at level `alpha`: 2.326 at ALPHA."""
    from scipy.special import ndtri

    return float(ndtri(1 - alpha / 2))


CRITICAL = critical()


def _z(level: float) -> float:
    from scipy.special import ndtri

    return float(ndtri(level))


def _facing_sd(x: float, ci: tuple[float, float], x_base: float, ci_base: tuple[float, float], top: float,
               bottom: float) -> tuple[float, float]:
    """(sd of x - x_base for a change downwards, the same upwards): the facing half-widths as standard errors (a
    90% half-width is z_90 = 1.645 of them), in quadrature; inf where a facing side is open."""
    z_ci = _z(0.5 + CI_LEVEL / 2)
    below, above = _halves(x, ci, top, bottom)
    below_base, above_base = _halves(x_base, ci_base, top, bottom)
    return math.hypot(above, below_base) / z_ci, math.hypot(below, above_base) / z_ci


@dataclass(frozen=True)
class Claim:
    """One claim of a comparison: the change `d` (variant minus base; compute: the log of the ratio), the sd of d for
    a change downwards and upwards (`sd_down`, `sd_up`; inf where an interval's facing side is open), and the
    critical value `c` it is held to. It is made when |z| >= c, z = d / the sd on d's side."""

    d: float
    sd_down: float
    sd_up: float
    c: float = CRITICAL

    @property
    def sd(self) -> float:
        return self.sd_down if self.d < 0 else self.sd_up

    @property
    def z(self) -> float:
        return self.d / self.sd if math.isfinite(self.sd) and self.sd > 0 else 0.0

    @property
    def moved(self) -> bool:
        return math.isfinite(self.sd) and abs(self.z) >= self.c

    @property
    def resolution(self) -> float:
        """The smallest |d| detected with probability DETECT, in either direction (the worse): (c + z_DETECT) sd."""
        worst = max(self.sd_down, self.sd_up)
        return (self.c + _z(DETECT)) * worst if math.isfinite(worst) else math.inf

    def held_to(self, c: float) -> "Claim":
        return replace(self, c=c)


def claim(x: float, ci: tuple[float, float], x_base: float, ci_base: tuple[float, float], *, c: float = CRITICAL,
          top: float = math.inf, bottom: float = 0.0) -> Claim:
    """The claim x - x_base from two estimates and their 90% intervals (`_halves` for the open sides)."""
    down, up = _facing_sd(x, ci, x_base, ci_base, top, bottom)
    return Claim(d=x - x_base, sd_down=down, sd_up=up, c=c)


def resolution(x: float, ci: tuple[float, float], x_base: float, ci_base: tuple[float, float],
               top: float = math.inf, bottom: float = 0.0, c: float = CRITICAL) -> float:
    """The smallest |x - x_base| that the z-test at critical value `c` detects with probability DETECT, in either
    direction (the larger of the two); inf where a facing side of an interval is open.

    A change d downwards is detected when d / s >= c, s the sd of the difference: the facing half-widths (above x,
    below x_base) as standard errors, s = sqrt(above^2 + below_base^2) / z_90 (a 90% half-width is z_90 = 1.645
    of them). P(detect) = Phi(d / s - c) = DETECT at d = (c + z_DETECT) s; likewise upwards with the other two
    sides."""
    return claim(x, ci, x_base, ci_base, c=c, top=top, bottom=bottom).resolution


# --- the compute to reach a reward both runs reach ---------------------------------------------------------------

def law_compute(r: float, A, B, C_mid, R0):
    """Eq. 1 solved for C: the compute at which the law reaches reward r, C_mid ((A - R0) / (r - R0) - 1)^(-1/B);
    0 where r <= R0 (reached from the start), inf where r >= A (never). Works on arrays of draws."""
    A, B, C_mid, R0 = (np.asarray(x, dtype=float) for x in (A, B, C_mid, R0))
    inside = (r > R0) & (r < A)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        c = C_mid * ((A - R0) / (r - R0) - 1.0) ** (-1.0 / B)
    return np.where(inside, c, np.where(r <= R0, 0.0, math.inf))


def compute_to_reach(fit: SigmoidFit, r: float) -> tuple[float, tuple[float, float]]:
    """(C*, its 90% interval): the compute at which the fitted law reaches reward r, and the quantiles of the same
    over the posterior draws (for a law increasing in C, where the pointwise band of R(C) crosses r)."""
    point = float(law_compute(r, fit.A, fit.B, fit.C_mid, fit.R0))
    c = law_compute(r, *fit.draws.T)
    tail = (1 - CI_LEVEL) / 2
    return point, (float(np.quantile(c, tail)), float(np.quantile(c, 1 - tail)))


@dataclass(frozen=True)
class Efficiency:
    """The compute each run needs to reach R_star (variant, base), with 90% intervals; `moved` when the claim on
    ln(C* / C*_base) is made (its z-test); `resolution`: the smallest |ln(C* / C*_base)| it detects 9 times in 10."""

    R_star: float
    C: tuple[float, float]
    ci: tuple[tuple[float, float], tuple[float, float]]
    moved: bool
    resolution: float
    claim: Claim | None = None  # ln(C* / C*_base), the claim the two were compared by
    unit: str = "GPU-h"  # what compute counts, as the detail says it

    @property
    def ratio(self) -> float:
        """C* / C*_base: above 1, the variant needs more compute to reach R_star."""
        return self.C[0] / self.C[1] if self.C[1] > 0 else math.nan

    @property
    def ratio_resolution(self) -> float:
        """The resolution as a factor on compute (exp of the log's)."""
        return math.exp(self.resolution) if math.isfinite(self.resolution) else math.inf

    @property
    def detail(self) -> str:
        (lo, hi), (b_lo, b_hi) = self.ci
        spans = (f"{fmt_compute(self.C[0])} [{fmt_compute(lo)}, {fmt_compute(hi)}] vs {fmt_compute(self.C[1])} "
                 f"[{fmt_compute(b_lo)}, {fmt_compute(b_hi)}] {self.unit}")
        z = f"z = {self.claim.z:+.2f}{' >= ' if self.moved else ' < '}{self.claim.c:.2f}" if self.claim else ""
        return f"compute to reach R = {self.R_star:.3f}: {self.ratio:.2f}x ({spans}, {z or 'no claim'})"


def middle_reward(fit: SigmoidFit) -> float:
    """The fitted law at the middle of the compute it was fitted on, in log C: sqrt(c_min x c_max), where its
    interval is narrowest (the data on both sides pin it)."""
    return float(fit.predict(math.sqrt(fit.c_min * fit.c_max)))


def efficiency(fit: SigmoidFit, base: SigmoidFit, c: float = CRITICAL) -> Efficiency | None:
    """The two runs' compute to reach R*, the smaller of the two fits' rewards at the middle of their fitted compute
    (log scale), so that both C* are measured inside the curves (docs/fitting.md#the-compute-to-reach-a-reward).
    None without posterior draws, a fitted window, or a gain (a curve that never rose)."""
    if fit.draws is None or base.draws is None or not len(fit.draws) or not len(base.draws):
        return None
    if not all(0 < f.c_min < f.c_max < math.inf for f in (fit, base)):
        return None
    r_star = min(middle_reward(fit), middle_reward(base))
    if not r_star > max(fit.R0, base.R0):
        return None
    (c_run, ci), (c_base, ci_base) = compute_to_reach(fit, r_star), compute_to_reach(base, r_star)
    if not (0 < c_run < math.inf and 0 < c_base < math.inf):
        return None
    with np.errstate(divide="ignore"):
        logs = [tuple(float(x) for x in np.log(ci)), tuple(float(x) for x in np.log(ci_base))]
    ln = claim(math.log(c_run), logs[0], math.log(c_base), logs[1], c=c, bottom=-math.inf)
    return Efficiency(R_star=r_star, C=(c_run, c_base), ci=(ci, ci_base), moved=ln.moved, resolution=ln.resolution,
                      claim=ln)


# --- verdicts against the base recipe --------------------------------------------------------------------------

MOVES_A, MOVES_B, BOTH, NO_CHANGE = "moves A", "moves B", "moves A and B", "no detectable change"
MOVES_C = "moves C_mid"  # neither A nor B moved, the compute to reach a common reward did
CATEGORIES = (MOVES_A, MOVES_B, BOTH, MOVES_C, NO_CHANGE)
NO_VERDICT = "no verdict"  # nothing to compare: a run incomplete, or (the recipes) no seed with a bounded interval
NOT_TESTABLE = "not testable at this scale"  # the sweep says the axis cannot show its effect here: no verdict
# a run's data stop before its fitted C_mid and nothing else moved: no verdict on A, so none at all yet
A_NOT_IDENTIFIED = "A not identified yet"
# the run departs from the law beyond its own noise (analysis/misfit.py): no ceiling is read from it
MISFIT = "the law does not describe it"
OWN_FITS, COMMON_A = "own fits", "common A"


CLAIMS = ("A", "B", "compute")  # what a verdict claims, in the order they are decided


@dataclass(frozen=True)
class Verdict:
    label: str  # a CATEGORIES entry, or: base | no fit | no base | no verdict (a failed or truncated run) |
    #             not testable at this scale | the law does not describe it
    dA: float | None = None  # A - A_base, own fits
    dB: float | None = None  # B - B_base, as compared (b_basis)
    b_basis: str = ""  # OWN_FITS or COMMON_A: which B were compared
    common_A: float | None = None  # the A both were refitted with (b_basis COMMON_A)
    B: tuple[float, float] | None = None  # (variant, base) B as compared
    small: bool = False  # A moved by less than the paper's 0.02
    resolution: tuple[float, float] | None = None  # the smallest |dA|, |dB| this comparison detects 9 times in 10
    compute: Efficiency | None = None  # the compute to reach a reward both reach (None: no draws to tell it)
    detail: str = ""
    A_identified: bool = True  # both runs' data reach their fitted C_mid; else no claim on A (resolution open)
    claims: dict[str, Claim] = field(default_factory=dict, compare=False)  # A, B (as compared), compute: z-tests
    level: str = "runs"  # what it is about: "runs" (these runs) or "recipes" (the spread between runs added)
    b_open: str = ""  # why B's claim cannot be made at all, where not an open interval (the recipes: no spread known)

    @property
    def moves_A(self) -> bool:
        return self.label in (MOVES_A, BOTH)

    @property
    def moves_B(self) -> bool:
        return self.label in (MOVES_B, BOTH)

    @property
    def moves_C(self) -> bool:
        return self.label == MOVES_C

    @property
    def moved(self) -> tuple[str, ...]:
        """The claims made, of CLAIMS."""
        return tuple(name for name, made in zip(CLAIMS, (self.moves_A, self.moves_B, self.moves_C)) if made)

    @property
    def text(self) -> str:
        """The label as a table shows it: "moves A (small)" for a move below the paper's 0.02, "moves C_mid (1.38x
        compute)"."""
        tail = "" if self.A_identified or self.label == A_NOT_IDENTIFIED else f"; {A_NOT_IDENTIFIED}"
        if self.moves_C:
            return f"{self.label} ({self.compute.ratio:.2f}x compute){tail}"
        return (f"{self.label} (small)" if self.small else self.label) + tail

    @property
    def resolution_text(self) -> str:
        """ "|ΔA| >= 0.012, |ΔB| >= 0.31" (a side the data do not bound: "not resolved")."""
        if self.resolution is None:
            return ""
        dA, dB = self.resolution
        a = f"|ΔA| >= {dA:.3f}" if math.isfinite(dA) else "ΔA not resolved (an A interval is open)" \
            if self.A_identified else f"ΔA not resolved ({A_NOT_IDENTIFIED})"
        b = f"|ΔB| >= {dB:.2f}" if math.isfinite(dB) else f"ΔB not resolved ({self.b_open or 'a B interval is open'})"
        if self.compute is None:
            return f"{a}, {b}"
        factor = self.compute.ratio_resolution
        c = f"compute x{factor:.2f} or /{factor:.2f}" if math.isfinite(factor) else "compute not resolved"
        return f"{a}, {b}, {c}"

    @property
    def B_label(self) -> str:
        """What dB is: "at common A 0.605" or "own fits"."""
        if self.b_basis == COMMON_A and self.common_A is not None:
            return f"at common A {self.common_A:.3f}"
        return self.b_basis


def verdict(fit: SigmoidFit, base: SigmoidFit | None, *,
            common: Callable[[], "CommonAFit"] | None = None,  # noqa: F821
            bounds: dict[str, float] | None = None, locked: Collection[str] = (), base_name: str = BASELINE,
            unit: str = "GPU-h") -> Verdict:
    """The variant's verdict against the base recipe's fit; common() refits (variant, base) with a shared A. The
    details name the base `base_name` and compute in `unit`.

    Each claim (A, B, compute) is a z-test held to its critical value in `bounds` (CRITICAL for a claim not there:
    one look); a claim in `locked` was made at an earlier look of an adaptive sweep and stays made."""
    if not fit.ok:
        return Verdict("no fit", detail=fit.status)
    if base is None or not base.ok:
        return Verdict("no base", detail=f"no fitted base recipe ({base_name}) to compare with")
    bound = {name: CRITICAL for name in CLAIMS} | dict(bounds or {})
    dA = fit.A - base.A
    identified = fit.A_identified and base.A_identified  # no claim on A before both curves show their ceiling
    a_claim = claim(fit.A, fit.ci["A"], base.A, base.ci["A"], c=bound["A"], top=1.0)
    if not identified:
        a_claim = replace(a_claim, sd_down=math.inf, sd_up=math.inf)
    a_moved = identified and (a_claim.moved or "A" in locked)
    mine, theirs, why, joint = fit, base, "A moved", None
    if not a_moved:
        mine, theirs, why, joint = _b_at_common_A(fit, base, common)
    basis = COMMON_A if joint is not None else OWN_FITS
    dB = mine.B - theirs.B
    b_claim = claim(mine.B, mine.ci["B"], theirs.B, theirs.ci["B"], c=bound["B"])
    b_moved = b_claim.moved or "B" in locked
    compute = efficiency(fit, base, c=bound["compute"])
    compute = replace(compute, unit=unit) if compute is not None else None
    c_moved = not a_moved and not b_moved and compute is not None and (compute.moved or "compute" in locked)
    label = (BOTH if a_moved and b_moved else MOVES_A if a_moved else MOVES_B if b_moved else MOVES_C if c_moved
             else NO_CHANGE if identified else A_NOT_IDENTIFIED)
    small = a_moved and abs(dA) < A_TIE
    claims = {"A": a_claim, "B": b_claim} | ({"compute": compute.claim} if compute is not None else {})
    v = Verdict(label, dA=dA, dB=dB, b_basis=basis, common_A=joint.A if joint is not None else None,
                B=(mine.B, theirs.B), small=small, resolution=(a_claim.resolution, b_claim.resolution),
                compute=compute, A_identified=identified, claims=claims)
    a_detail = _a_detail(fit, base, a_claim, a_moved, small) if identified else _unidentified(fit, base, unit)
    detail = f"{a_detail}; {_b_detail(mine, theirs, b_claim, b_moved, v, why)}"
    return replace(v, detail=detail + (f"; {compute.detail}" if compute is not None else ""))


def _b_at_common_A(fit: SigmoidFit, base: SigmoidFit, common):
    """(variant B fit, base B fit, why own fits, joint or None): the pair refitted with a common A when it can be
    made and the data do not reject it, else their own fits and the reason."""
    if common is None:
        return fit, base, "no data for a common-A refit", None
    try:
        joint = common()
    except FitError as err:
        return fit, base, f"common-A refit failed: {err.reason}", None
    if joint.a_rejected:
        return fit, base, f"a common A fits poorly (likelihood ratio {joint.lr_A:.2f} > 0.45)", None
    return joint.fits[0], joint.fits[1], "", joint


def _z_text(c: Claim, made: bool) -> str:
    """ "z = -3.10 >= 2.33" (a claim), "z = -1.20 < 2.33" (none)."""
    return f"z = {c.z:+.2f} {'>=' if made else '<'} {c.c:.2f}"


def _a_detail(fit: SigmoidFit, base: SigmoidFit, a: Claim, moved: bool, small: bool) -> str:
    (lo, hi), (b_lo, b_hi) = fit.ci["A"], base.ci["A"]
    spans = f"{fit.A:.3f} [{lo:.3f}, {hi:.3f}] vs {base.A:.3f} [{b_lo:.3f}, {b_hi:.3f}]"
    if not moved:
        return f"A indistinguishable ({fit.A - base.A:+.3f}: {spans}, {_z_text(a, False)})"
    side = "higher" if fit.A > base.A else "lower"
    tail = f", small: within the paper's {A_TIE} margin between runs (a seed would tell)" if small else ""
    return f"A {side} by {abs(fit.A - base.A):.3f} ({spans}, {_z_text(a, True)}){tail}"


def _unidentified(fit: SigmoidFit, base: SigmoidFit, unit: str = "GPU-h") -> str:
    short = [f"{name}'s data stop at {fmt_compute(f.c_max)} {unit}, before its C_mid {fmt_compute(f.C_mid)}"
             for name, f in (("the variant", fit), ("the base", base)) if not f.A_identified]
    return f"{A_NOT_IDENTIFIED}: {' and '.join(short)} (A {fit.A:.3f} vs {base.A:.3f}, extrapolated: no claim on A)"


def _b_detail(mine: SigmoidFit, theirs: SigmoidFit, b: Claim, moved: bool, v: Verdict, why: str) -> str:
    (lo, hi), (b_lo, b_hi) = mine.ci["B"], theirs.ci["B"]
    spans = f"{mine.B:.2f} [{lo:.2f}, {_num(hi)}] vs {theirs.B:.2f} [{b_lo:.2f}, {_num(b_hi)}]"
    basis = v.B_label + (f" ({why})" if why and v.b_basis == OWN_FITS else "")
    if moved:
        side = "higher" if mine.B > theirs.B else "lower"
        return f"B {side}: {spans}, {_z_text(b, True)}, {basis}"
    return f"B indistinguishable: {spans}, {_z_text(b, False)}, {basis}"


def _num(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.2f}"
