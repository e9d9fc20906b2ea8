"""The adaptive sweep's rule: at a look, a variant is fitted beside the base recipe on the same compute, and either
stops (its verdict settled) or goes on.

Each claim of the verdict (A on the own fits; B and the compute as the report compares them) is a group-sequential
z-test in information time: z from the two fits' intervals, the information fraction t = sd_full^2 / sd_now^2 from
the law's Fisher information over the budget left (analysis/information.py), held to a Lan-DeMets boundary that
spends the one-look false-claim rate (analysis/sequential.py) over the looks. A claim is settled when it crosses its
boundary (it stays made), when the full budget would make it with a predictive probability below `futility` (a
non-binding futility stop), or, with a declared margin on A, when its change is within the margin. A variant stops
when every claim is settled; never while either A is not identified (analysis/law.py). The label it stops on is the
label the report prints (analysis/report.py recomputes it from `Decision.bounds` and `.locked`). `Decision` is what
the job logs (as JSON, the tag `ablate.rung.<k>`). Why: docs/fitting.md#the-adaptive-sweep.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from typing import Sequence

import numpy as np

from analysis import information
from analysis.extrapolate import predicted_end
from analysis.fit import FitError, SigmoidFit, fmt_compute
from analysis.joint import fit_common_A
from analysis.law import C_MIN_FRACTION, prepare
from analysis.posterior import fit_state
from analysis.rank import A_NOT_IDENTIFIED, ALPHA, CLAIMS, COMMON_A, CRITICAL, verdict
from analysis.runs import SETTLED_TAG
from analysis.sequential import boundaries, predictive_claim

RUNGS = tuple(k / 8 for k in range(1, 9))  # fractions of a variant's compute (its train.steps) it is looked at
FUTILITY = 0.10  # a claim the full budget would make with less than this predictive probability is settled unmade
RUNG_TAG = "ablate.rung.{k}"  # one per rung looked at: the Decision as JSON, written once
STOP, GO = "stop", "go on"
MOVED, FUTILE, WITHIN, OPEN, NOT_LOOKED = "moved", "no claim", "within the margin", "open", "not looked at"
LAST_T = 1.0 - 1e-6  # an interim look's information fraction stays below the full budget's


@dataclass(frozen=True)
class Curve:
    """What a run has logged: validation points (step, compute in GPU-hours, pass rate), step 0 first."""

    step: np.ndarray
    compute: np.ndarray
    reward: np.ndarray

    def upto(self, compute: float) -> Curve:
        keep = self.compute <= compute * (1 + 1e-9)
        return Curve(self.step[keep], self.compute[keep], self.reward[keep])

    def upto_step(self, step: int) -> Curve:
        keep = self.step <= step
        return Curve(self.step[keep], self.compute[keep], self.reward[keep])

    @property
    def c_max(self) -> float:
        return float(self.compute.max(initial=0.0))


@dataclass(frozen=True)
class Look:
    """One claim at one look: its z, its information fraction t, the boundary c it was held to, the predictive
    probability that the full budget makes it, and what it is now (MOVED, FUTILE, WITHIN, OPEN, NOT_LOOKED)."""

    z: float
    t: float
    c: float
    predictive: float
    status: str
    sd: float = math.nan  # the standard error of the change its z divides by (the recipe level adds to it)

    def text(self, name: str) -> str:
        """ "A moved (z = -4.10 >= 3.21 at t = 0.52)", "B no claim (0.03 of a claim at the full budget)"."""
        if self.status == NOT_LOOKED:
            return f"{name} {NOT_LOOKED}"
        at = f"z = {self.z:+.2f} {'>=' if self.status == MOVED else '<'} {_num(self.c)} at t = {self.t:.2f}"
        if self.status in (MOVED, WITHIN):
            return f"{name} {self.status} ({at})"
        return f"{name} {self.status} ({at}; {self.predictive:.2f} chance of a claim at the full budget)"


@dataclass(frozen=True)
class Decision:
    rung: int  # 1-based
    step: int  # the variant's step at the rung
    steps: int  # its train.steps (the full budget)
    compute: float  # the compute both curves were fitted up to (GPU-hours)
    decision: str  # STOP or GO
    verdict: str  # the verdict now (analysis.rank's label): the one the report prints for a run stopped here
    reason: str
    band: list[list[float]] = field(default_factory=list)  # [compute, low, high]: the variant's 90% band to its budget
    looks: dict[str, dict] = field(default_factory=dict)  # claim -> Look's fields
    bounds: dict[str, float] = field(default_factory=dict)  # claim -> the critical value it was held to here
    locked: list[str] = field(default_factory=list)  # claims made at this look or before (they stay made)
    alpha: float = ALPHA  # the false-claim rate each claim's boundaries spend over the looks

    @property
    def stop(self) -> bool:
        return self.decision == STOP

    def look(self, claim: str) -> Look | None:
        found = self.looks.get(claim)
        return Look(**found) if found else None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Decision:
        """A Decision from its tag; keys it does not know (an older rule's) are left out."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in known})

    def summary(self) -> str:
        """ "settled at rung 4 (step 25 of 50, 8,000 GPU-h): moves A; A moved (z = ...), B no claim (...)" """
        where = f"rung {self.rung} (step {self.step} of {self.steps}, {fmt_compute(self.compute)} GPU-h)"
        return f"{'settled' if self.stop else 'went on'} at {where}: {self.reason}"


def rung_steps(steps: int, rungs: Sequence[float] = RUNGS) -> list[int]:
    """The steps at which a run of `steps` steps is looked at: each fraction's, rounded, the last one `steps`."""
    if not rungs or any(not 0 < f <= 1 for f in rungs) or list(rungs) != sorted(set(rungs)) or rungs[-1] != 1:
        raise ValueError(f"sweep.rungs must rise from above 0 to 1, e.g. [0.25, 0.5, 1.0], not {list(rungs)}")
    return sorted({max(1, min(steps, round(f * steps))) for f in rungs})


def check_rule(alpha: float, futility: float, margin_A: float | None) -> None:
    """The rule's settings (sweep.alpha, sweep.futility, sweep.margin_A): one ValueError naming the key."""
    if not 0 < alpha < 0.5:
        raise ValueError(f"sweep.alpha={alpha}: a claim's false-claim rate over all looks, in (0, 0.5)")
    if not 0 <= futility < 0.5:
        raise ValueError(f"sweep.futility={futility}: the predictive probability of a claim below which it is "
                         "settled unmade, in [0, 0.5) (0: no futility stops)")
    if margin_A is not None and not 0 < margin_A < 1:
        raise ValueError(f"sweep.margin_A={margin_A}: the smallest move of A that matters, in (0, 1), or null")


def decide(variant: Curve, base: Curve, *, rung: int, step: int, steps: int, history: Sequence[Decision] = (),
           alpha: float = ALPHA, futility: float = FUTILITY, margin_A: float | None = None) -> Decision:
    """The decision for `variant` at its rung (`step` of `steps`), beside `base`, which must have reached the
    variant's compute at that step: both are fitted up to it (the same compute: a base further on is cut there).
    `history`: this run's decisions at its earlier rungs (their information fractions and the claims they made)."""
    variant = variant.upto_step(step)
    c_rung = variant.c_max
    base = base.upto(c_rung)
    args = dict(rung=rung, step=step, steps=steps, compute=c_rung)
    try:
        mine = fit_state(prepare(variant.compute, variant.reward))
        theirs = fit_state(prepare(base.compute, base.reward))
    except FitError as err:
        return Decision(decision=GO, verdict="no fit", reason=f"no fit yet ({err.reason})", **args)
    fit, base_fit = mine.fit, theirs.fit
    common = lru_cache(maxsize=1)(lambda: fit_common_A([mine.data, theirs.data], [mine, theirs]))
    band = _band(fit, c_rung, c_rung * steps / step)
    last = step >= steps
    info = _fractions(variant, base, fit, base_fit, steps) if not last else {}
    past = [d for d in history if d.rung < rung and d.looks]
    locked = sorted({name for d in past for name in d.locked})

    def bound(name: str, t: float) -> tuple[float, float]:
        """(the boundary at this look, its information fraction): the look's t, at most the budget's fraction (the
        compute claim's reward R* moves with the data, so its looks are less related than its Fisher fraction, near 1
        from the first, would have them: spent by the budget's fraction instead), after the claim's earlier ones (an
        estimate that fell back is the last one's: no new information, that look's boundary again)."""
        before = sorted({d.looks[name]["t"] for d in past if name in d.looks and 0 < d.looks[name]["t"] < 1})
        t = min(t, step / steps)
        t = 1.0 if last else max(min(max(t, 1e-6), LAST_T), before[-1] if before else 0.0)
        times = before + ([t] if not before or t > before[-1] else [])
        return boundaries(times, alpha)[-1], t

    c_A, t_A = bound("A", info.get("A", 1.0))
    first = verdict(fit, base_fit, common=common, bounds={"A": c_A}, locked=locked)
    b_key = "B common" if first.b_basis == COMMON_A else "B own"
    c_B, t_B = bound("B", info.get(b_key, 1.0))
    c_C, t_C = bound("compute", _compute_fraction(first, fit, base_fit, info) if not last else 1.0)
    bounds = {"A": c_A, "B": c_B, "compute": c_C}
    v = verdict(fit, base_fit, common=common, bounds=bounds, locked=locked)
    looks = _looks(v, {"A": t_A, "B": t_B, "compute": t_C}, futility, margin_A, last)
    made = sorted(set(locked) | {name for name, look in looks.items() if look.status == MOVED})
    said = "; ".join(look.text(name) for name, look in looks.items())
    common_args = dict(verdict=v.label, band=band, looks={k: asdict(x) for k, x in looks.items()}, bounds=bounds,
                       locked=made, alpha=alpha, **args)
    if last:
        return Decision(decision=STOP, reason=f"{v.text}, at its full budget; {said}", **common_args)
    if not v.A_identified:
        return Decision(decision=GO, reason=f"{A_NOT_IDENTIFIED}: a curve has not reached its fitted C_mid; {said}",
                        **common_args)
    if any(look.status == OPEN for look in looks.values()):
        return Decision(decision=GO, reason=f"open: {said}", **common_args)
    return Decision(decision=STOP, reason=f"{v.text}; {said}", **common_args)


@dataclass(frozen=True)
class Rule:
    """What the report holds a run of an adaptive sweep to: the boundaries of its last look, the claims made by
    then, the compute the base is cut at (the run's, where it stopped or at its budget), and the looks it took
    (`recipe_bound` turns them into the recipe level's boundary)."""

    bounds: dict[str, float]
    locked: tuple[str, ...]
    compute: float
    looks: tuple[Decision, ...] = ()  # the looks up to the last (the stopping one, or the interim ones)
    final: bool = False  # the last look is the full budget's (t = 1), after `looks`

    def recipe_bound(self, name: str, extra: float) -> float:
        """The boundary of a claim at the recipe level, whose variance adds `extra` (the spread between runs, which
        more compute does not shrink) at every look: its information fractions are (extra + t sd^2) / (extra +
        sd^2), the same spending (docs/fitting.md#recipes-not-runs)."""
        times = []
        for d in self.looks:
            found = d.look(name)
            if found is not None and 0 < found.t < 1 and math.isfinite(found.sd) and found.sd > 0:
                times.append((extra + found.t * found.sd**2) / (extra + found.sd**2))
        times = sorted(set(min(t, LAST_T) for t in times))
        if self.final or not times:
            times.append(1.0)
        alpha = self.looks[-1].alpha if self.looks else ALPHA
        return boundaries(times, alpha)[-1]


def report_rule(decisions: Sequence[Decision], c_max: float) -> Rule | None:
    """The rule's test for a run with these decisions: where one stopped it, that look's; else (it ran its budget,
    or was extended since) the final look's, each claim's boundary after the information fractions of its interim
    looks, and the claims they made. None for a run no adaptive sweep looked at."""
    looked = [d for d in decisions if d.looks]
    if not looked:
        return None
    stop = next((d for d in looked if d.stop and d.step < d.steps), None)
    if stop is not None and stop.compute >= c_max * (1 - 1e-9):
        return Rule(bounds=dict(stop.bounds), locked=tuple(stop.locked), compute=stop.compute,
                    looks=tuple(d for d in looked if d.rung <= stop.rung))
    interim = tuple(d for d in looked if d.step < d.steps)
    alpha = looked[-1].alpha
    bounds = {}
    for name in CLAIMS:
        times = sorted({d.looks[name]["t"] for d in interim if name in d.looks and 0 < d.looks[name]["t"] < 1})
        bounds[name] = boundaries(times + [1.0], alpha)[-1]
    return Rule(bounds=bounds, locked=tuple(sorted({n for d in looked for n in d.locked})), compute=c_max,
                looks=interim, final=True)


def _looks(v: Verdict, t: dict[str, float], futility: float, margin_A: float | None, last: bool) -> dict[str, Look]:
    """Each claim's status at this look, in CLAIMS' order."""
    out = {}
    for name in CLAIMS:
        claim = v.claims.get(name)
        if claim is None or (name == "compute" and (v.moves_A or v.moves_B)):
            out[name] = Look(z=0.0, t=t[name], c=math.inf, predictive=0.0, status=NOT_LOOKED,
                             sd=claim.sd if claim is not None else math.nan)
            continue
        made = name in v.moved
        p = 1.0 if made else predictive_claim(claim.z, t[name], CRITICAL) if t[name] < 1 else 0.0
        if made:
            status = MOVED
        elif name == "A" and not v.A_identified:
            status, p = OPEN, 1.0
        elif last:
            status = FUTILE
        elif name == "A" and margin_A is not None and math.isfinite(claim.sd) \
                and abs(claim.d) + CRITICAL * max(claim.sd_down, claim.sd_up) <= margin_A:
            status = WITHIN  # the change's one-look interval at the claims' level inside +-margin_A
        elif p < futility:
            status = FUTILE
        else:
            status = OPEN
        out[name] = Look(z=claim.z, t=t[name], c=claim.c, predictive=p, status=status, sd=claim.sd)
    return out


def _fractions(variant: Curve, base: Curve, fit: SigmoidFit, base_fit: SigmoidFit, steps: int) -> dict[str, float]:
    """The information fraction of each claim now: the Fisher variance of the change at the full budget over the
    same now, both curves continued to `steps` at their own pace, on their fitted laws and noise; now's counts only
    the points the full budget's fit will keep (above its c_min), so that it is a share of the final fit's
    information. "A", "B own", "B common" (a shared A), and the two curves' covariances for the compute's ("cov")."""
    law = (fit.A, fit.B, fit.C_mid, fit.R0)
    base_law = (base_fit.A, base_fit.B, base_fit.C_mid, base_fit.R0)
    ahead = [information.continued(variant.step, variant.compute, steps),
             information.continued(base.step, base.compute, steps)]
    cut = [C_MIN_FRACTION * float(c.max()) for c in ahead]
    now = [(variant.compute, law, fit.noise, cut[0]), (base.compute, base_law, base_fit.noise, cut[1])]
    full = [(ahead[0], law, fit.noise, cut[0]), (ahead[1], base_law, base_fit.noise, cut[1])]
    out: dict = {}
    for name, points in (("now", now), ("full", full)):
        covs = [information.covariance(c, lw, _noise(nz), c_min=m) for c, lw, nz, m in points]
        infos = [information.information(c, lw, _noise(nz), c_min=m) for c, lw, nz, m in points]
        joint = information.joint_covariance(infos)
        out[name] = dict(A=covs[0][0, 0] + covs[1][0, 0],
                         own=(fit.B**2 * covs[0][1, 1] + base_fit.B**2 * covs[1][1, 1]),
                         common=_b_difference(joint, fit.B, base_fit.B), covs=covs)
    fractions = {"A": out["full"]["A"] / out["now"]["A"], "B own": out["full"]["own"] / out["now"]["own"],
                 "B common": out["full"]["common"] / out["now"]["common"], "cov": (out["now"]["covs"],
                                                                                  out["full"]["covs"])}
    return {k: (min(max(float(v), 1e-6), 1.0) if not isinstance(v, tuple) else v) for k, v in fractions.items()}


def _b_difference(joint: np.ndarray, B: float, B_base: float) -> float:
    """var(B - B_base) of two curves fitted with one shared A (joint: A, then log B, log C_mid, R0 of each)."""
    g = np.zeros(joint.shape[0])
    g[1], g[4] = B, -B_base
    return float(g @ joint @ g)


def _compute_fraction(v: Verdict, fit: SigmoidFit, base_fit: SigmoidFit, info: dict) -> float:
    """The information fraction of the compute claim: var(ln C* - ln C*_base) at the verdict's R*, full over now."""
    if v.compute is None or "cov" not in info:
        return 1.0
    r = v.compute.R_star
    grads = [information.ln_compute_gradient((f.A, f.B, f.C_mid, f.R0), r) for f in (fit, base_fit)]
    now, full = info["cov"]
    var = [sum(float(g @ cov @ g) for g, cov in zip(grads, covs)) for covs in (now, full)]
    return min(max(var[1] / var[0], 1e-6), 1.0) if var[0] > 0 else 1.0


def _noise(noise: dict) -> dict:
    """A fit's noise, with a floor (a noiseless fit would have infinite information)."""
    white = max(float(noise.get("sd_white", 0.0)), 1e-4)
    return {**noise, "sd_white": white}


def _band(fit: SigmoidFit, c_rung: float, c_full: float, points: int = 12) -> list[list[float]]:
    """[compute, low, high]: the 90% prediction of what the run will show from the rung to the full budget (a point's
    value: the law's uncertainty, its noise and the drift beyond the data, analysis/extrapolate.py)."""
    c = np.geomspace(c_rung, c_full, points) if c_full > c_rung > 0 else np.array([c_full])
    out = []
    for x in c:
        _, (lo, hi) = predicted_end(fit, np.array([x]))
        out.append([float(x), float(lo), float(hi)])
    return out


def _num(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.2f}"


def decisions_of(tags: dict) -> list[Decision]:
    """The decisions a run's tags hold, by rung."""
    found = []
    for key, value in tags.items():
        if key.startswith("ablate.rung."):
            try:
                found.append(Decision.from_json(value))
            except (TypeError, ValueError):
                continue
    return sorted(found, key=lambda d: d.rung)


def stopped_at(tags: dict) -> Decision | None:
    """The decision that stopped a run where it is (None: no adaptive sweep stopped it, or it was extended since)."""
    if SETTLED_TAG not in tags:
        return None
    return next((d for d in decisions_of(tags) if d.stop and d.step < d.steps), None)


def gpu_hours_saved(decision: Decision) -> float:
    """What stopping at this rung saved, at the compute a step it ran at: (steps - step) x compute / step."""
    if not decision.stop or decision.step >= decision.steps or decision.step <= 0:
        return 0.0
    return (decision.steps - decision.step) * decision.compute / decision.step
