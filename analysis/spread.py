"""Verdicts about recipes, not runs: the spread between runs of one recipe, and the comparison with it added.

A run-level verdict asks whether these runs differ; two runs of one recipe differ too (another seed, another data
order), by a between-run sd of A (and of B) that one curve's intervals do not hold. `Spread` is that sd: from the
replicate seeds a sweep has (the method of moments, pooled over every variant with several), combined with a stated
prior (the paper's three runs of one recipe) weighted by its degrees of freedom. `recipe_verdict` redoes a
run-level comparison with it: each seed of a variant fitted alone and the seeds combined with the spread as a
random effect (not pooled as one curve). Why, and the prior's reading of the paper: docs/fitting.md#recipes-not-runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from analysis.information import ln_compute_gradient
from analysis.law import CI_LEVEL, SigmoidFit
from analysis.rank import (A_NOT_IDENTIFIED, A_TIE, ALPHA, BOTH, CATEGORIES, CRITICAL, MOVES_A, MOVES_B, MOVES_C,
                           NO_CHANGE, NO_VERDICT, OWN_FITS, Claim, Verdict, _halves, _z)

# The paper's three runs of ScaleRL gave A "within +-0.015". Read as their largest deviation from their mean: three
# draws of a normal have it at 0.977 sd on average, so sd ~ 0.015; three runs are 2 degrees of freedom. The paper
# gives no spread of B, and no public RL runs the project collected hold replicate seeds of one recipe
# (analysis/data/real_curves/README.md): B's spread is unknown until replicate seeds (or a stated prior, sweep.run_sd_B)
# measure it, and until then the recipes' B is not compared (docs/fitting.md#recipes-not-runs).
PRIOR_SD_A = 0.015
PRIOR_SD_B = 0.0  # none stated
PRIOR_DOF = 2.0
RECIPES, RUNS = "recipes", "runs"
B_UNKNOWN = ("no claim about the recipes' B: no spread of B between runs is known (replicate seeds measure it: "
             "two runs of a variant, e.g. sweep.base_seeds=2)")
B_UNKNOWN_SHORT = "no spread of B between runs is known"


@dataclass(frozen=True)
class Spread:
    """The between-run sd of A and of B used at the recipe level, and what it rests on."""

    sd_A: float = PRIOR_SD_A
    sd_B: float = PRIOR_SD_B
    prior_dof: float = PRIOR_DOF  # the weight of the stated prior, in degrees of freedom
    dof: int = 0  # the replicates' degrees of freedom (sum over variants of seeds - 1)
    seeds_sd_A: float | None = None  # the replicates' own estimate (None without replicates)
    seeds_sd_B: float | None = None
    dof_B: int = 0  # the replicates' degrees of freedom for B (seeds with a bounded B interval)
    prior_sd_B: float | None = None  # the prior's sd of B (None: sd_B is the prior itself); 0: none stated

    @property
    def b_dof(self) -> float:
        """The degrees of freedom behind the spread of B: the prior's where it states one, and the replicates'.
        0: the spread of B is unknown, and the recipes' B is not compared."""
        stated = self.sd_B if self.prior_sd_B is None else self.prior_sd_B
        return (self.prior_dof if stated > 0 else 0.0) + self.dof_B

    @property
    def source(self) -> str:
        """ "a prior (the paper's three runs, 2 dof)", "replicate seeds (3 dof) and the prior (2 dof)"."""
        prior = f"the prior ({self.prior_dof:g} dof)" if self.prior_dof else ""
        b = f"of B {self.sd_B:.2f}" if self.b_dof else "of B unknown"
        if not self.dof:
            return (f"a prior, sd of A {self.sd_A:.3f} and {b} between runs, {self.prior_dof:g} dof; "
                    "replicate seeds measure it: two runs of a variant (a sweep's sweep.base_seeds=2)")
        seeds = (f"replicate seeds ({self.dof} dof: sd of A {self.seeds_sd_A:.3f}"
                 + (f", of B {self.seeds_sd_B:.2f}" if self.dof_B else "") + ")")
        return f"{seeds}{' and ' + prior if prior else ''}: sd of A {self.sd_A:.3f}, {b}"


def seed_sd(fit: SigmoidFit, name: str, top: float) -> tuple[float, float]:
    """(below, above): a seed's fit's 90% half-widths of `name` as standard errors; inf where a side is open."""
    z_ci = _z(0.5 + CI_LEVEL / 2)
    below, above = _halves(getattr(fit, name), fit.ci[name], top, 0.0)
    return below / z_ci, above / z_ci


def estimate(groups: Sequence[Sequence[SigmoidFit]], prior: Spread = Spread()) -> Spread:
    """The spread from the replicate seeds of `groups` (each the seeds' own fits of one variant) and the prior.

    For a variant of n seeds with estimates x_i of standard errors s_i, Q = sum (x_i - mean)^2 has expectation
    (n - 1) tau^2 + (n - 1) / n sum s_i^2, so each variant gives (n - 1) tau^2 to its degrees of freedom; pooled, and
    combined with the prior as tau^2 = (dof_prior tau_prior^2 + dof tau_seeds^2) / (dof_prior + dof), at least 0."""
    sums = {"A": [0.0, 0], "B": [0.0, 0]}
    for group in groups:
        for name, top in (("A", 1.0), ("B", math.inf)):
            usable = [(getattr(f, name), seed_sd(f, name, top)) for f in group if f.ok]
            usable = [(x, (lo + hi) / 2) for x, (lo, hi) in usable if math.isfinite(lo) and math.isfinite(hi)]
            n = len(usable)
            if n < 2:
                continue
            mean = sum(x for x, _ in usable) / n
            q = sum((x - mean) ** 2 for x, _ in usable)
            sums[name][0] += q - (n - 1) / n * sum(s * s for _, s in usable)
            sums[name][1] += n - 1
    dof = sums["A"][1]
    stated_B = prior.sd_B if prior.prior_sd_B is None else prior.prior_sd_B
    if not dof:
        return replace(prior, dof=0, seeds_sd_A=None, seeds_sd_B=None, dof_B=0, prior_sd_B=stated_B)

    def pooled(name: str, tau_prior: float, weight: float) -> tuple[float, float]:
        moment, k = sums[name]
        seeds = max(moment / k, 0.0) if k else 0.0
        tau2 = (weight * tau_prior**2 + k * seeds) / (weight + k) if weight + k else 0.0
        return math.sqrt(max(tau2, 0.0)), math.sqrt(seeds)

    (sd_A, seeds_A) = pooled("A", prior.sd_A, prior.prior_dof)
    (sd_B, seeds_B) = pooled("B", stated_B, prior.prior_dof if stated_B > 0 else 0.0)  # no prior of B: seeds alone
    return Spread(sd_A=sd_A, sd_B=sd_B, prior_dof=prior.prior_dof, dof=dof, seeds_sd_A=seeds_A, seeds_sd_B=seeds_B,
                  dof_B=sums["B"][1], prior_sd_B=stated_B)


def _combined(fits: Sequence[SigmoidFit], name: str, top: float, tau: float) -> tuple[float, float, float, int]:
    """(estimate, sd below, sd above, seeds used): the seeds' estimates of `name` combined with a between-run sd tau
    (inverse-variance weights 1 / (s_i^2 + tau^2), per side for the sds); nan and inf without a usable seed."""
    used = [(getattr(f, name), seed_sd(f, name, top)) for f in fits if f.ok]
    used = [(x, lo, hi) for x, (lo, hi) in used if math.isfinite(lo) and math.isfinite(hi)]
    if not used:
        return math.nan, math.inf, math.inf, 0
    weights = [1 / (((lo + hi) / 2) ** 2 + tau**2) for _, lo, hi in used]
    value = sum(w * x for w, (x, _, _) in zip(weights, used)) / sum(weights)
    below = 1 / math.sqrt(sum(1 / (lo * lo + tau * tau) for _, lo, _ in used))
    above = 1 / math.sqrt(sum(1 / (hi * hi + tau * tau) for _, _, hi in used))
    return value, below, above, len(used)


def recipe_claim(variant: Sequence[SigmoidFit], base: Sequence[SigmoidFit], name: str, tau: float,
                 c: float = CRITICAL) -> Claim | None:
    """The recipes' change of A or B (own fits): each side's seeds combined with the spread; None without a usable
    seed on either side."""
    top = 1.0 if name == "A" else math.inf
    x, below, above, n = _combined(variant, name, top, tau)
    x_base, below_base, above_base, n_base = _combined(base, name, top, tau)
    if not (n and n_base):
        return None
    return Claim(d=x - x_base, sd_down=math.hypot(above, below_base), sd_up=math.hypot(below, above_base), c=c)


def recipe_verdict(run: Verdict, fit: SigmoidFit, base_fit: SigmoidFit, variant: Sequence[SigmoidFit],
                   base: Sequence[SigmoidFit], spread: Spread, *,
                   bound: Callable[[str, float], float] | None = None) -> Verdict:
    """The recipe-level verdict beside a run-level one: A and B from each side's seeds (own fits) combined with the
    spread; the compute to reach R* as the run level compares it, its sd widened by the spread of A and B carried
    through ln C* (fit, base_fit: the pooled fits). bound(claim, extra variance) is the critical value a claim is
    held to (CRITICAL at one look; an adaptive sweep's boundary for the recipe level's information fractions where
    it stopped: analysis.adaptive.Rule.recipe_bound). A verdict with no comparison (no fit, no base, not testable,
    incomplete) is the run level's, relabelled."""
    if run.label not in (*CATEGORIES, A_NOT_IDENTIFIED):
        return replace(run, level=RECIPES)
    bound = bound or (lambda name, extra: CRITICAL)
    per_side = 1 / max(len(variant), 1) + 1 / max(len(base), 1)
    a = recipe_claim(variant, base, "A", spread.sd_A)
    b = recipe_claim(variant, base, "B", spread.sd_B)
    if a is not None and b is not None:
        a = replace(a, c=bound("A", spread.sd_A**2 * per_side))
        extra_B = spread.sd_B**2 * per_side
        b = replace(b, c=bound("B", extra_B) * t_factor(b.sd**2, extra_B, spread.b_dof))
    if a is None or b is None:  # the run level's claims are not the recipes': none is made
        return Verdict(NO_VERDICT, level=RECIPES, A_identified=run.A_identified,
                       detail="the recipes: no seed with a bounded interval to compare")
    if not spread.b_dof:
        b = replace(b, sd_down=math.inf, sd_up=math.inf)  # no claim, and no resolution, on B
    if not run.A_identified:
        a = replace(a, sd_down=math.inf, sd_up=math.inf)
    compute = run.compute
    if compute is not None and compute.claim is not None:
        extra = 0.0
        for f, n in ((fit, len(variant)), (base_fit, len(base))):
            g = ln_compute_gradient((f.A, f.B, f.C_mid, f.R0), compute.R_star)
            extra += ((g[0] * spread.sd_A) ** 2 + (g[1] / f.B * spread.sd_B) ** 2) / max(n, 1)
        ln, widen = compute.claim, math.sqrt(extra) if spread.b_dof else math.inf  # C* moves with B's spread too
        ln = replace(ln, sd_down=math.hypot(ln.sd_down, widen), sd_up=math.hypot(ln.sd_up, widen),
                     c=bound("compute", extra))
        compute = replace(compute, claim=ln, moved=ln.moved, resolution=ln.resolution)
    a_moved = run.A_identified and a.moved
    b_moved = b.moved
    c_moved = not a_moved and not b_moved and compute is not None and compute.moved
    label = (BOTH if a_moved and b_moved else MOVES_A if a_moved else MOVES_B if b_moved else MOVES_C if c_moved
             else NO_CHANGE if run.A_identified else A_NOT_IDENTIFIED)
    claims = {"A": a, "B": b} | ({"compute": compute.claim} if compute is not None and compute.claim else {})
    b_said = f"ΔB {b.d:+.2f} own fits, z = {b.z:+.2f}" if spread.b_dof else f"ΔB {b.d:+.2f} own fits: {B_UNKNOWN}"
    detail = (f"the recipes (the spread between runs added, {spread.source}): ΔA {a.d:+.3f}, z = {a.z:+.2f}; "
              f"{b_said}"
              + (f"; compute {compute.ratio:.2f}x, z = {compute.claim.z:+.2f}" if compute is not None else ""))
    return Verdict(label, dA=a.d, dB=b.d, b_basis=OWN_FITS, B=None, small=a_moved and abs(a.d) < A_TIE,
                   resolution=(a.resolution, b.resolution), compute=compute, detail=detail,
                   A_identified=run.A_identified, claims=claims, level=RECIPES,
                   b_open="" if spread.b_dof else B_UNKNOWN_SHORT)


def t_factor(var: float, extra: float, dof: float, alpha: float = ALPHA) -> float:
    """How much a claim's critical value widens when `extra` of its variance `var` (the spread between runs) is an
    estimate on `dof` degrees of freedom and the rest known: Student's t at the Satterthwaite degrees of freedom,
    (var^2 / (extra^2 / dof)), over the normal quantile; 1 where nothing is estimated (or dof is 0: no claim)."""
    from scipy.special import ndtri, stdtrit

    if not (dof > 0 and extra > 0 and math.isfinite(var)) or math.isinf(dof):
        return 1.0
    dof_eff = var**2 / (extra**2 / dof)
    return float(stdtrit(dof_eff, 1 - alpha / 2) / ndtri(1 - alpha / 2))


def resolution_A(sd_A_run: float, spread_sd: float, seeds: int = 1, base_seeds: int = 1,
                 c: float = CRITICAL) -> float:
    """The recipe-level resolution on A of a comparison whose runs each have an sd of A `sd_A_run`: (c + z_0.9)
    sqrt((s^2 + tau^2) / seeds + (s^2 + tau^2) / base_seeds)."""
    var = sd_A_run**2 + spread_sd**2
    return (c + _z(0.9)) * math.sqrt(var / seeds + var / base_seeds)


MARGIN_A = A_TIE  # the paper's: A values within 0.02 are equal; the margin a verdict is settled at, unless stated
MAX_MORE = 256  # the most seeds a side `to_close` adds


@dataclass(frozen=True)
class ToClose:
    """What would settle an open recipe-level verdict at the margin: `variant` more seeds of the variant and `base`
    more of the base recipe, `gpu_hours` in all (each a seed of its side's mean compute), after which the
    comparison's resolution on A is `resolution` (<= the margin: a move of the margin is found 9 times in 10)."""

    variant: int
    base: int
    gpu_hours: float
    resolution: float
    margin: float

    def text(self, name: str, base_name: str) -> str:
        """ "to settle it at |dA| 0.02: 11 more seeds of loo-dapo and 30 of scalerl (952,000 GPU-h)" """
        sides = ((self.variant, name), (self.base, base_name))
        parts = [f"{k} more seed{'s' * (k != 1)} of {n}" for k, n in sides if k]
        return (f"to settle it at |ΔA| {self.margin:g}: {' and '.join(parts)} ({self.gpu_hours:,.0f} GPU-h; resolution "
                f"{self.resolution:.3f} then)")


def _side(fits: Sequence[SigmoidFit], tau: float) -> tuple[float, float] | None:
    """(precision of the side's combined A, the sd of one more seed's A): its seeds' sds (mean of the two facing
    halves) with tau added; None without a seed of bounded A."""
    sds = [sum(seed_sd(f, "A", 1.0)) / 2 for f in fits if f.ok]
    sds = [s for s in sds if math.isfinite(s)]
    if not sds:
        return None
    return sum(1 / (s * s + tau * tau) for s in sds), sum(sds) / len(sds)


def to_close(verdict: Verdict, variant: Sequence[SigmoidFit], base: Sequence[SigmoidFit], spread: Spread,
             hours: tuple[float, float], margin: float = MARGIN_A, c: float = CRITICAL) -> ToClose | None:
    """The cheapest number of more seeds of the variant and of the base (`hours`: a seed's GPU-hours on each side)
    that brings an open recipe-level verdict's resolution on A to `margin`: (c + z_0.9) sqrt(1 / P_v + 1 / P_b) <=
    margin, each side's precision P = sum 1 / (s_i^2 + tau^2) over its seeds, a new seed at the side's mean s. None
    where the verdict is settled (A moved, or its resolution already within the margin) or seeds cannot settle it
    (no seed of bounded A; A not identified: that takes compute, not seeds)."""
    if verdict.label not in (NO_CHANGE, MOVES_B, MOVES_C) or not verdict.resolution:
        return None
    if verdict.resolution[0] <= margin:
        return None
    sides = _side(variant, spread.sd_A), _side(base, spread.sd_A)
    if None in sides:
        return None
    (p_v, s_v), (p_b, s_b) = sides
    w_v, w_b = 1 / (s_v**2 + spread.sd_A**2), 1 / (s_b**2 + spread.sd_A**2)
    room = (margin / (c + _z(0.9))) ** 2  # the variance of the change the margin allows
    best = None
    for k in range(MAX_MORE + 1):
        left = room - 1 / (p_v + k * w_v)
        if left <= 0:
            continue
        kb = max(0, math.ceil((1 / left - p_b) / w_b - 1e-12))
        if kb > MAX_MORE:
            continue
        cost = k * hours[0] + kb * hours[1]
        if best is None or cost < best[0]:
            res = (c + _z(0.9)) * math.sqrt(1 / (p_v + k * w_v) + 1 / (p_b + kb * w_b))
            best = (cost, k, kb, res)
    if best is None:
        return None
    cost, k, kb, res = best
    return ToClose(variant=k, base=kb, gpu_hours=cost, resolution=res, margin=margin)
