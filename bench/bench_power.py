"""Power and false claims of the sweep's designs, at fixed effects on the mock's law and noise: how often each design
claims a move that is there, and one that is not, and what it spends.

Pairs of runs (a variant beside the base recipe) are drawn as generator=mock draws them (analysis/synthetic.py's
mock_curve: its validation, wobble and clock; the base law is conf/generator/mock.yaml's truth) at fixed effects
that do not depend on any verdict, and every design is applied to the same pairs:

    full              the report's verdict on both runs at their full budget
    adaptive          the adaptive sweep's rule at its looks, every 1/8 of the budget (analysis/adaptive.py's
                      decide, the call a job makes); "margin 0.03", "margin 0.05": with sweep.margin_A declared
    cut 1/2, cut 1/4  every run stopped at half (a quarter) of its budget, for scale
    2 x 1/2           two seeds of each at half the budget each (the same GPU-hours as one full run); any "k x f"
                      (k seeds of each, f of 1, 1/2, 1/4 of the budget each: "4 x 1", "8 x 1/2") likewise
    2 base            one seed of the variant, two of the base (recipe level: the spread measured)

Effects: dA = 0 (null pairs: a claim of A is false), -0.02, -0.03, -0.05 (B and C_mid held); a B-only move (dB -0.5,
C_mid x 1.3, dA 0: loo-8op's shape: a claim of A is false); dB -0.25 and dB -0.5 (C_mid held). Both levels, every
effect: power and false claims at the run level and at the recipe level. At the run level both runs have the law's A
(do these runs differ?); at the recipe level each run's A is drawn around its recipe's with the mock's run_sd_A
(0.006) (and its B with --spread-B on the real layer), and claims are judged against the recipes (do the recipes
differ?), read three ways: the run-level verdict taken as a claim about the recipes (what the report said before),
the recipe-level verdict with the default prior of the spread (0.015 for A, the paper's three runs; B's unknown),
and with the spread the runs really have (as replicates would measure it). GPU-hours: each design's share of the
full sweep's on the mock's LOO mix (its eight effects, one base run).

Three layers. `--layer gauss` (seconds): the Gaussian limit, each claim's estimate a Brownian motion in its Fisher
information (analysis/information.py; A and B independent, B at a common A), the same boundaries; it screens designs
and settings. `--layer fits` (the default, ~1 h on 2 cores): synthetic pairs through the real fitter and the real
rule. `--layer real`: the fits layer's pairs with real noise: the mock's laws and clock, each run carrying the
residuals of a different public RL run about its own fitted law, block-resampled onto the run
(analysis/real_noise.py; `--donors calibration`, the default, or `holdout`, or file stems); at the recipe level
each run's B is drawn around its recipe's too (`--spread-B`, 0.1: no public replicates measure it). On the mock's
clock a long donor's residuals are taken at 50 of its points; `--points donor` keeps each donor's own points (the
hold-out's 168-833 validations, their correlation at their own spacing), for the full design and 2 base.

    python bench/bench_power.py --layer gauss                        # the screen: every design, 20,000 pairs
    python bench/bench_power.py                                      # the real fitter and rule (the table in docs)
    python bench/bench_power.py --layer real --designs full,adaptive # the same on real noise
    python bench/bench_power.py --layer real --donors holdout --points donor --designs full  # at the runs' points
    python bench/bench_power.py --null 500 --pairs 200 --designs full,adaptive --levels run --jobs 2
    python bench/bench_power.py --futility 0.05 --layer gauss        # another rule setting

Prints one table per level and the GPU-hours; figures and the command: docs/fitting.md#power-and-false-claims.
Today's rule before this one (20 forecasts at rungs 1/4, 1/2) was measured by this bench at commit 1b9668b.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis import real_noise  # noqa: E402
from analysis.synthetic import MockNoise, Truth  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MOCK = yaml.safe_load((REPO / "conf" / "generator" / "mock.yaml").read_text())
BASE = Truth(**MOCK["truth"])
NOISE = MockNoise()  # generator=mock's noise and clock (ablate/schema.py's defaults are these)
LOOKS = tuple(k / 8 for k in range(1, 9))


@dataclass(frozen=True)
class Effect:
    name: str
    dA: float = 0.0
    dB: float = 0.0
    C_mid: float = 1.0  # a factor

    def truth(self, base: Truth = BASE) -> Truth:
        return Truth(A=base.A + self.dA, B=base.B + self.dB, C_mid=base.C_mid * self.C_mid, R0=base.R0)

    @property
    def null(self) -> bool:
        return self.dA == 0 and self.dB == 0 and self.C_mid == 1


EFFECTS = (Effect("dA 0 (null)"), Effect("dA -0.02", dA=-0.02), Effect("dA -0.03", dA=-0.03),
           Effect("dA -0.05", dA=-0.05), Effect("B only (8op)", dB=-0.5, C_mid=1.3), Effect("dB -0.25", dB=-0.25),
           Effect("dB -0.5", dB=-0.5))
RUN_DESIGNS = ("full", "adaptive", "margin 0.03", "margin 0.05", "cut 1/2", "cut 1/4", "2 x 1/2", "2 base")
RECIPE_DESIGNS = RUN_DESIGNS  # every design at both levels
FRACTIONS = {"1": 1.0, "1/2": 0.5, "1/4": 0.25}
MARGINS = {"adaptive": None, "margin 0.03": 0.03, "margin 0.05": 0.05}
SHARE = {"full": 1.0, "cut 1/2": 0.5, "cut 1/4": 0.25, "2 base": 10 / 9}  # the LOO mix: 8 + base


def seeds_design(design: str) -> tuple[int, float] | None:
    """ "4 x 1/2" -> (4, 0.5): k seeds of the variant and of the base, each f of the budget; None for another."""
    found = re.fullmatch(r"(\d+) x (1|1/2|1/4)", design)
    return (int(found.group(1)), FRACTIONS[found.group(2)]) if found else None


def share(design: str) -> float:
    """A fixed design's GPU-hours on the mock's LOO mix (8 variants, one base), over the one-seed full sweep's."""
    k = seeds_design(design)
    return k[0] * k[1] if k else SHARE.get(design, math.nan)


def loo_mix() -> list[Effect]:
    """The mock's LOO variants (conf/axes/paper.yaml's reverts, mock.yaml's effects), as effects on the base law."""
    axes = yaml.safe_load((REPO / "conf" / "axes" / "paper.yaml").read_text())["axes"]
    out = []
    for axis in axes:
        base = axis["base"]
        base = str(base).lower() if isinstance(base, bool) else base
        e = MOCK["effects"].get(f"{axis['path']}={base}", {})
        out.append(Effect(axis["variant"], dA=e.get("A", 0.0), dB=e.get("B", 0.0), C_mid=e.get("C_mid", 1.0)))
    return out


def _sign(x: float) -> int:
    return 0 if not x else (1 if x > 0 else -1)


def claims(v) -> tuple[int, int, int]:
    """(A, B, compute) claimed by a verdict: the sign of the claimed change, 0 where none."""
    c = math.log(v.compute.ratio) if v.compute is not None and v.moves_C else 0.0
    return (_sign(v.dA) if v.moves_A else 0, _sign(v.dB) if v.moves_B else 0, _sign(c))


# --- the fits layer: one pair through the real fitter and rule ---------------------------------------------------


def _state(curves):
    from analysis.law import FitError, SigmoidFit, prepare
    from analysis.posterior import fit_state

    c = np.concatenate([x.compute for x in curves])
    r = np.concatenate([x.reward for x in curves])
    runs = np.concatenate([np.full(x.compute.size, k) for k, x in enumerate(curves)])
    try:
        return fit_state(prepare(c, r, runs=runs))
    except FitError as err:
        return SigmoidFit.failed(err.reason)


def compare(variant: list, base: list, *, rule=None, spreads=()) -> tuple:
    """The report's verdicts of a variant's runs beside the base's, as analysis/report.py makes them: the runs'
    (pooled seeds, the common-A refit) and, for each prior in `spreads`, the recipes' (each seed alone)."""
    from analysis.joint import fit_common_A
    from analysis.law import FitError, SigmoidFit
    from analysis.rank import verdict
    from analysis.spread import estimate, recipe_verdict

    sv, sb = _state(variant), _state(base)
    fit, base_fit = (s if isinstance(s, SigmoidFit) else s.fit for s in (sv, sb))

    def common():
        if isinstance(sv, SigmoidFit) or isinstance(sb, SigmoidFit):
            raise FitError("no fit")
        return fit_common_A([sv.data, sb.data], [sv, sb])

    v = verdict(fit, base_fit, common=common, bounds=rule.bounds if rule else None, locked=rule.locked if rule else ())
    if not spreads or not v.resolution:
        return v, []
    seeds = [[fit] if len(variant) == 1 else [_fit([c]) for c in variant],
             [base_fit] if len(base) == 1 else [_fit([c]) for c in base]]
    recipes = [recipe_verdict(v, fit, base_fit, seeds[0], seeds[1], estimate(seeds, prior),
                              bound=rule.recipe_bound if rule else None) for prior in spreads]
    return v, recipes


def _fit(curves):
    from analysis.law import SigmoidFit

    s = _state(curves)
    return s if isinstance(s, SigmoidFit) else s.fit


def adaptive(variant, base, steps: int, margin_A: float | None, futility: float):
    """The rule on one pair: (its decisions to the stop, the share of the budget spent)."""
    from analysis.adaptive import decide, rung_steps

    history = []
    for k, step in enumerate(rung_steps(steps, list(LOOKS)), 1):
        d = decide(variant, base, rung=k, step=step, steps=steps, history=history, margin_A=margin_A,
                   futility=futility)
        history.append(d)
        if d.stop:
            return history, step / steps
    return history, 1.0  # no fit even at the full budget (a real run's noise can make a curve unfittable): it ran


def _recipe_claims(recipes) -> list[tuple[int, int, int]]:
    return [claims(r) for r in recipes]


def run_pair(args) -> dict:
    """Every design on one pair (seeded): claims per design (recipe level: the run verdict's, then the recipe
    verdict's under each spread prior), and each adaptive design's share of the budget."""
    from analysis.adaptive import Curve
    from analysis.spread import Spread
    from analysis.synthetic import mock_curve

    effect, seed, level, designs, futility, noise = args
    rng = np.random.default_rng([seed, 7])
    truth_v, truth_b = effect.truth(), BASE
    fixed = level == "run"
    # the runs' own spread, as replicates would measure it: the mock's runs share their recipe's B, a spread of B
    # known to be nil (a stated 0 reads as none stated, analysis/spread.py)
    spread_B = noise.spread_B if noise.real else 1e-9
    spreads = () if fixed else (Spread(), Spread(sd_A=NOISE.run_sd_A, sd_B=spread_B, prior_dof=1e9))

    def run(truth, steps=NOISE.steps):
        return noise.run(rng, truth, steps, fixed)

    v, b = run(truth_v), run(truth_b)
    steps = NOISE.steps
    out = {}

    def record(design, verdict_and_recipes):
        run_v, recipes = verdict_and_recipes  # no recipe verdict where the runs' has none (no fit): no claim
        out[design] = [claims(run_v), *(_recipe_claims(recipes) or [(0, 0, 0)] * len(spreads))]

    for design in designs:
        if design == "full":
            record(design, compare([v], [b], spreads=spreads))
        elif design in MARGINS:
            from analysis.adaptive import report_rule

            history, share = adaptive(v, b, steps, MARGINS[design], futility)
            d = history[-1]
            vv, bb = v.upto_step(d.step), b.upto(d.compute)
            # as the report holds it: a stop's look; the full budget's final boundary after the interim looks
            rule = report_rule(history if d.step < steps else history[:-1], vv.c_max)
            record(design, compare([vv], [bb], rule=rule, spreads=spreads))
            out[design + " spent"] = share
        elif design.startswith("cut"):
            f = 0.5 if design == "cut 1/2" else 0.25
            record(design, compare([v.upto_step(round(f * steps))], [b.upto_step(round(f * steps))],
                                   spreads=spreads))
        elif seeds_design(design):
            k, f = seeds_design(design)
            cut = round(f * steps)
            record(design, compare([v.upto_step(cut)] + [run(truth_v, cut) for _ in range(k - 1)],
                                   [b.upto_step(cut)] + [run(truth_b, cut) for _ in range(k - 1)], spreads=spreads))
        elif design == "2 base":
            record(design, compare([v], [b, run(truth_b)], spreads=spreads))
    return out


@dataclass(frozen=True)
class Noise:
    """Where a pair's runs get their noise: the mock's (the fits layer) or real runs' (`real`: the donors of
    analysis/real_noise.py, `holdout` or `sources`); at the recipe level a real run's B is drawn around its recipe's
    with sd `spread_B`."""

    real: bool = False
    holdout: bool = False
    sources: tuple[str, ...] | None = None
    spread_B: float = 0.1
    own_points: bool = False  # at the donor's own points (its length and spacing), not on the mock's clock

    def run(self, rng, truth: Truth, steps: int, fixed: bool):
        """One run of `truth` to `steps`: the mock's clock and run-to-run A (not at the run level, `fixed`); its
        validation the mock's, or the law plus a real run's residuals."""
        from analysis.adaptive import Curve
        from analysis.synthetic import mock_curve

        if not self.real:
            c = mock_curve(rng, truth, NOISE, steps=steps, run_A=truth.A if fixed else None)
            return Curve(c.step, c.compute, c.reward)
        pool = real_noise.donors(holdout=self.holdout, sources=self.sources)
        if not fixed:
            truth = replace(truth, B=max(truth.B + self.spread_B * rng.standard_normal(), 0.1))
        if self.own_points:  # the run's A drawn as the mock draws it; the donor's points end at the budget
            if not fixed:
                truth = replace(truth, A=truth.A + NOISE.run_sd_A * rng.standard_normal())
            real = real_noise.real_curve(rng, truth, pool[int(rng.integers(len(pool)))], c_max=NOISE.budget)
            return Curve(np.arange(real.compute.size), real.compute, real.reward)
        c = mock_curve(rng, truth, NOISE, steps=steps, run_A=truth.A if fixed else None)
        real = real_noise.real_curve(rng, c.truth, pool[int(rng.integers(len(pool)))], compute=c.compute)
        return Curve(c.step, c.compute, real.reward)


def run_sweep(args) -> dict:
    """The adaptive designs on one LOO sweep of the mock's mix (run A drawn as the mock draws it): the share of the
    full sweep's GPU-hours each spends (the base goes on to the last look any variant needed)."""
    from analysis.adaptive import Curve
    from analysis.synthetic import mock_curve

    seed, designs, futility, noise = args
    rng = np.random.default_rng([seed, 11])

    def run(truth):
        return noise.run(rng, truth, NOISE.steps, False)

    base = run(BASE)
    variants = [run(e.truth()) for e in loo_mix()]
    full = base.c_max + sum(v.c_max for v in variants)
    out = {}
    for design in designs:
        if design not in MARGINS:
            continue
        stops = [adaptive(v, base, NOISE.steps, MARGINS[design], futility)[1] for v in variants]
        spent = base.upto_step(round(max(stops) * NOISE.steps)).c_max + sum(
            v.upto_step(round(f * NOISE.steps)).c_max for v, f in zip(variants, stops))
        out[design] = spent / full
    return out


# --- the Gaussian layer ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Path_:
    """A claim's information along the looks (1 / the variance of the change at each look's data)."""

    info: np.ndarray  # one per look, increasing
    identified: np.ndarray  # bool per look (A only: the law's C_mid is reached by both runs)


def _paths(truth_v: Truth, truth_b: Truth, fractions, seeds: int = 1, base_seeds: int = 1) -> dict[str, Path_]:
    """Per claim (A, B at a common A), the Fisher information of the change at each fraction of the budget."""
    from analysis.information import _inverse, information, joint_covariance

    from analysis.law import C_MIN_FRACTION

    noise = {"sd_white": 0.0034, "sd_wobble": NOISE.wobble_sd, "corr_gpu_hours": NOISE.wobble_gpu_hours}
    per_step = NOISE.budget / NOISE.steps
    c_min = C_MIN_FRACTION * fractions[-1] * NOISE.budget  # the last look's cut: each look's points nest in the next
    varA, varB, ident = [], [], []
    for f in fractions:
        c = np.arange(0, round(f * NOISE.steps) + 1) * per_step
        infos = [information(c, (t.A, t.B, t.C_mid, t.R0), noise, c_min=c_min) * n
                 for t, n in ((truth_v, seeds), (truth_b, base_seeds))]
        covs = [_inverse(i) for i in infos]
        varA.append(covs[0][0, 0] + covs[1][0, 0])
        joint = joint_covariance(infos)
        g = np.zeros(joint.shape[0])
        g[1], g[4] = truth_v.B, -truth_b.B
        varB.append(float(g @ joint @ g))
        ident.append(c.max() >= max(truth_v.C_mid, truth_b.C_mid))
    # information never falls as points are added (an estimate's wobble aside): strictly increasing for the looks
    infoA, infoB = (np.maximum.accumulate(np.maximum(1 / np.nan_to_num(np.array(v), nan=1e12, posinf=1e12), 1e-9))
                    * (1 + 1e-6 * np.arange(len(v))) for v in (varA, varB))
    return {"A": Path_(infoA, np.array(ident)), "B": Path_(infoB, np.ones(len(fractions), bool))}


def gauss_claims(effect: Effect, design: str, n: int, rng, *, futility: float, tau_true: float = 0.0,
                 tau_used: float | None = None, futility_B: float | None = None) -> dict:
    """Claims of one design on `n` pairs of one effect in the Gaussian limit: A and B (B at a common A, as the
    report compares it where A did not move), each its own Brownian motion in its information. The runs' A are off
    their recipes' by `tau_true` (recipe level); `tau_used`: None, the run-level verdict; a number, the recipe-level
    verdict with that spread, at the look the (run-level) rule stopped, against that look's boundary."""
    from analysis.rank import CRITICAL
    from analysis.sequential import boundaries, predictive_claim

    seeds, base_seeds, fractions = 1, 1, LOOKS
    if seeds_design(design):
        seeds, f = seeds_design(design)
        base_seeds, fractions = seeds, (f,)
    elif design == "2 base":
        base_seeds, fractions = 2, (1.0,)
    elif design.startswith("cut"):
        fractions = (0.5,) if design == "cut 1/2" else (0.25,)
    elif design == "full":
        fractions = (1.0,)
    paths = _paths(effect.truth(), BASE, fractions, seeds, base_seeds)
    theta = {"A": effect.dA, "B": effect.dB}
    spread = {"A": math.sqrt(tau_true**2 / seeds + tau_true**2 / base_seeds), "B": 0.0}
    extra = {"A": (tau_used or 0.0) ** 2 * (1 / seeds + 1 / base_seeds), "B": 0.0}
    sequential, margin, K = design in MARGINS, MARGINS.get(design), len(fractions)
    rows = np.arange(n)
    path = {}
    for name in ("A", "B"):
        info = paths[name].info
        dev = rng.standard_normal(n) * spread[name]
        w = np.cumsum(rng.standard_normal((n, K)) * np.sqrt(np.diff(np.concatenate([[0.0], info])))[None], axis=1)
        d = (w + (theta[name] + dev)[:, None] * info[None]) / info[None]
        path[name] = dict(d=d, z=d * np.sqrt(info)[None], sd_used=np.sqrt(1 / info + extra[name]),
                          t=info / info[-1], ident=paths[name].identified)
    if not sequential:
        out = {}
        for name, p in path.items():
            z = p["d"][:, -1] / p["sd_used"][-1]
            made = (np.abs(z) >= CRITICAL) & p["ident"][-1]
            out[name] = np.where(made, np.sign(z), 0).astype(int)
        out["spent"] = np.full(n, fractions[-1])
        return out
    ends, bounds = {}, {}
    for name, p in path.items():
        c = np.array(boundaries(list(np.minimum(p["t"][:-1], 1 - 1e-6)) + [1.0], 0.02))
        crossed = (np.abs(p["z"]) >= c[None]) & p["ident"][None]
        k_cross = np.where(crossed.any(axis=1), crossed.argmax(axis=1), K)
        settle = np.full(n, K - 1)
        for k in range(K - 1):  # futility (and the margin on A): the first look the claim is settled unmade
            pp = np.array([predictive_claim(float(x), float(p["t"][k]), CRITICAL) for x in p["z"][:, k]])
            done = (pp < (futility if name == "A" or futility_B is None else futility_B)) & p["ident"][k]
            if name == "A" and margin is not None:
                sd = 1 / np.sqrt(paths["A"].info[k])
                done |= p["ident"][k] & (np.abs(p["d"][:, k]) + CRITICAL * sd <= margin)
            settle = np.where((settle == K - 1) & done & (k < k_cross), k, settle)
        ends[name], bounds[name] = (k_cross, np.minimum(settle, k_cross)), c
    stop = np.maximum(ends["A"][1], ends["B"][1])  # a pair stops when both claims are settled
    out = {"spent": np.array(fractions)[stop]}
    for name, p in path.items():
        if tau_used is None:  # the rule's own label: a claim crossed at or before the stop
            k = np.minimum(ends[name][0], K - 1)
            made = ends[name][0] <= stop
            out[name] = np.where(made, np.sign(p["z"][rows, k]), 0).astype(int)
        else:  # the recipe level's own information fractions: the spread's variance does not shrink with compute
            t_rec = (p["sd_used"][-1] ** 2) / (p["sd_used"] ** 2)
            c_rec = np.array(boundaries(list(np.minimum(np.maximum.accumulate(t_rec[:-1]) + 1e-9 * np.arange(K - 1),
                                                         1 - 1e-6)) + [1.0], 0.02))
            z = p["d"][rows, stop] / p["sd_used"][stop]
            made = (np.abs(z) >= c_rec[stop]) & p["ident"][stop]
            out[name] = np.where(made, np.sign(z), 0).astype(int)
    return out


def gauss(args) -> dict:
    rng = np.random.default_rng(0)
    figures = {}
    for level in args.levels:
        rows = {}
        for effect in (EFFECTS if level == "run" else EFFECTS[:1]):
            n = args.gauss_pairs
            for design in args.designs:
                reads = [(0.0, None)] if level == "run" else [(NOISE.run_sd_A, None), (NOISE.run_sd_A, 0.015),
                                                              (NOISE.run_sd_A, NOISE.run_sd_A)]
                got = [gauss_claims(effect, design, n, rng, futility=args.futility, tau_true=tt,
                                    tau_used=tu) for tt, tu in reads]
                rows.setdefault(effect.name, {})[design] = [_rates_of(g) for g in got]
        figures[level] = rows
    mix = {}
    for design in args.designs:
        if design in MARGINS:
            spent = []
            for e in loo_mix():
                spent.append(gauss_claims(e, design, 4000, rng, futility=args.futility)["spent"])
            spent = np.array(spent)  # variants x pairs: the base runs to the last variant's stop
            mix[design] = float((spent.sum(axis=0) + spent.max(axis=0)).mean() / (len(spent) + 1))
        elif not math.isnan(share(design)):
            mix[design] = share(design)
    figures["gpu_hours"] = mix
    if "recipe" in args.levels:
        figures["null sweeps"] = null_sweeps(args.gauss_pairs, rng)
    return figures


def null_sweeps(n: int, rng, *, sd_run: float = 0.0045, tau_true: float = NOISE.run_sd_A,
                variants: int = 8) -> dict:
    """LOO sweeps with no effect at all, at the recipe level: one base run is every variant's comparator, so its own
    deviation (and its fit's error) moves every verdict of the sweep at once. Per reading of the verdicts: false A
    claims per verdict, and the share of sweeps with two or more. sd_run: one run's standard error of A at the full
    budget (the real fitter's on the mock: 0.0045)."""
    from analysis.rank import CRITICAL

    base = rng.standard_normal(n) * math.hypot(tau_true, sd_run)
    runs = rng.standard_normal((n, variants)) * math.hypot(tau_true, sd_run)
    d = runs - base[:, None]
    out = {}
    for name, extra in (("runs' verdict", 0.0), ("recipes', prior 0.015", 0.015), ("recipes', sd 0.006", tau_true)):
        claims = np.abs(d) / math.sqrt(2 * sd_run**2 + 2 * extra**2) >= CRITICAL
        out[name] = {"per verdict": float(claims.mean()), "sweeps with 2+": float((claims.sum(axis=1) >= 2).mean())}
    return out


def _rates_of(g: dict) -> dict:
    a, b = g["A"], g["B"]
    return {"A": float((a != 0).mean()), "A down": float((a < 0).mean()), "B": float((b != 0).mean()),
            "B down": float((b < 0).mean()), "any": float(((a != 0) | (b != 0)).mean()), "n": len(a),
            "spent": float(np.mean(g["spent"]))}


# --- aggregation and the tables ---------------------------------------------------------------------------------


def rates(results: list[dict], design: str, which: int = 0) -> dict:
    """Claim rates of one design over pairs: A claimed (down), B claimed (down), compute claimed, any claim;
    `which`: 0 the run-level verdict, 1.. the recipe-level verdict under each spread prior."""
    got = [r[design][which] for r in results if design in r]
    n = len(got)
    out = {"n": n, "A": sum(c[0] != 0 for c in got) / n, "A down": sum(c[0] < 0 for c in got) / n,
           "B": sum(c[1] != 0 for c in got) / n, "B down": sum(c[1] < 0 for c in got) / n,
           "compute": sum(c[2] != 0 for c in got) / n, "any": sum(any(c) for c in got) / n}
    spent = [r[design + " spent"] for r in results if design + " spent" in r]
    out["spent"] = float(np.mean(spent)) if spent else share(design)
    return out


def cell(effect: Effect, r: dict) -> str:
    """The figure an effect is there for: power on a true move, the false-claim rate where there is none."""
    n = r["n"]
    if effect.dA < 0:
        return f"{r['A down']:.3f} ±{se(r['A down'], n):.3f}"
    if effect.null:
        return f"{r['A']:.3f} ±{se(r['A'], n):.3f}, B {r['B']:.3f} (any {r['any']:.3f})"
    return f"B {r['B down']:.3f}, A {r['A']:.3f} ±{se(r['A'], n):.3f}"


def se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1e-12) / max(n, 1))


READINGS = ("the runs' verdict", "the recipes' verdict, prior", "the recipes' verdict, the runs' spread")
POWER_COLUMNS = (("dA 0 (null)", "false A", "A"), ("dA 0 (null)", "false B", "B"), ("dA -0.02", "dA -0.02", "A down"),
                 ("dA -0.03", "dA -0.03", "A down"), ("dA -0.05", "dA -0.05", "A down"),
                 ("dB -0.25", "dB -0.25", "B down"), ("dB -0.5", "dB -0.5", "B down"),
                 ("B only (8op)", "false A at B only", "A"))


def power_table(rows: dict, designs: tuple[str, ...], which: int, title: str) -> None:
    """One row a design: false claims at no effect, power at each move (the claim in its direction), and the false
    A claim at the B-only move; `which`: the reading (0 the runs' verdict, 1.. the recipes' under each spread)."""
    cols = [c for c in POWER_COLUMNS if c[0] in rows]
    print(f"\n{title}: false claims at no effect, power (the move claimed in its direction), pairs per column")
    print("| design | " + " | ".join(c[1] for c in cols) + " | pairs |\n|---|" + "---|" * (len(cols) + 1))
    for d in designs:
        got = [rows[c[0]][d][which] for c in cols if d in rows[c[0]]]
        if len(got) != len(cols):
            continue
        n = "/".join(dict.fromkeys(str(g["n"]) for g in got))
        print(f"| {d} | " + " | ".join(f"{g[c[2]]:.3f}" for g, c in zip(got, cols)) + f" | {n} |")


def print_tables(figures: dict, designs: tuple[str, ...]) -> None:
    if "run" in figures:
        power_table(figures["run"], designs, 0, "run level (both runs on the law: do these runs differ?)")
        ds = list(designs)
        print("\nrun level (both runs on the law: do these runs differ?); power: A claimed down at dA < 0; false: A "
              "claimed at no change of A; B rows: B claimed down, A claimed (false)")
        print("| effect | " + " | ".join(ds) + " |\n|---|" + "---|" * len(ds))
        for name, row in figures["run"].items():
            effect = next(e for e in EFFECTS if e.name == name)
            print(f"| {name} | " + " | ".join(cell(effect, row[d][0]) for d in ds if d in row) + " |")
        print("| spent (null pairs) | " + " | ".join(f"{figures['run'][EFFECTS[0].name][d][0]['spent']:.0%}"
                                                     for d in ds if d in figures["run"][EFFECTS[0].name]) + " |")
    if "recipe" in figures:
        print("\nrecipe level (run A drawn around one recipe with sd 0.006, and B with --spread-B on the real layer): "
              "do the recipes differ? Each design read three ways: the run-level verdict taken as a claim about the "
              "recipes; the recipe-level verdict with the prior of the spread (A 0.015, B unknown: no B claim); the "
              "recipe-level verdict with the runs' own spread (as replicates would measure it)")
        for which, reading in enumerate(READINGS):
            power_table(figures["recipe"], designs, which, f"recipe level, {reading}")
    if "null sweeps" in figures:
        print("\nLOO sweeps with no effect (8 variants, one base run; runs spread by 0.006): false A claims")
        print("| reading | per verdict | sweeps with 2 or more |\n|---|---|---|")
        for name, r in figures["null sweeps"].items():
            print(f"| {name} | {r['per verdict']:.3f} | {r['sweeps with 2+']:.3f} |")
    if "gpu_hours" in figures:
        hours = figures["gpu_hours"]
        print("\nGPU-hours on the mock's LOO mix, share of the full sweep's:")
        print("| " + " | ".join(hours) + " |\n|" + "---|" * len(hours))
        print("| " + " | ".join(f"{h:.0%}" for h in hours.values()) + " |")


def fits(args) -> dict:
    figures: dict = {}
    holdout, sources = real_noise.parse_donors(args.donors)
    noise = Noise(real=args.layer == "real", holdout=holdout, sources=sources, spread_B=args.spread_B,
                  own_points=args.points == "donor")
    with ProcessPoolExecutor(args.jobs) as pool:
        for level in args.levels:
            designs = args.designs
            for effect in EFFECTS:
                n = args.null if effect.null else args.pairs
                todo = [(effect, seed, level, designs, args.futility, noise) for seed in range(n)]
                results = list(pool.map(run_pair, todo, chunksize=4))
                reads = 1 if level == "run" else 3
                figures.setdefault(level, {})[effect.name] = {d: [rates(results, d, k) for k in range(reads)]
                                                              for d in designs}
                print(f"  {level} {effect.name}: {n} pairs", flush=True)
        adaptive_designs = [d for d in args.designs if d in MARGINS]
        hours = {d: share(d) for d in args.designs if not math.isnan(share(d))}
        if adaptive_designs and args.sweeps:
            spent = list(pool.map(run_sweep, [(seed, tuple(adaptive_designs), args.futility, noise)
                                              for seed in range(args.sweeps)]))
            hours |= {d: float(np.mean([s[d] for s in spent])) for d in adaptive_designs}
        figures["gpu_hours"] = hours
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layer", choices=("fits", "gauss", "real"), default="fits",
                        help="gauss: the Gaussian limit (seconds); fits: the mock's noise through the real fitter and "
                             "rule; real: the same with real runs' noise (analysis/real_noise.py)")
    parser.add_argument("--donors", default="calibration", help=real_noise.DONORS_HELP)
    parser.add_argument("--spread-B", type=float, default=0.1,
                        help="the real layer's sd of B between runs of one recipe (recipe level)")
    parser.add_argument("--points", choices=("mock", "donor"), default="mock",
                        help="the real layer's points: the mock's clock (its 50 validations), or each donor's own "
                             "(its length and spacing; the full design and 2 base only)")
    parser.add_argument("--null", type=int, default=500, help="null pairs per level (>= 500 tells 0.02 from 0.05)")
    parser.add_argument("--pairs", type=int, default=200, help="pairs per non-null effect")
    parser.add_argument("--gauss-pairs", type=int, default=20000, help="pairs per effect in the Gaussian layer")
    parser.add_argument("--sweeps", type=int, default=40, help="LOO sweeps of the mock's mix, for the GPU-hours")
    parser.add_argument("--designs", default=",".join(dict.fromkeys(RUN_DESIGNS + RECIPE_DESIGNS)))
    parser.add_argument("--levels", default="run,recipe")
    parser.add_argument("--futility", type=float, default=None, help="the rule's futility threshold (sweep.futility)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    from analysis.adaptive import FUTILITY

    args.designs = tuple(d.strip() for d in args.designs.split(","))
    unknown = [d for d in args.designs if d not in RUN_DESIGNS and not seeds_design(d)]
    if unknown:
        parser.error(f"--designs: unknown {unknown}; known: {', '.join(RUN_DESIGNS)}, or 'k x f' (f 1, 1/2, 1/4)")
    args.levels = tuple(args.levels.split(","))
    args.futility = FUTILITY if args.futility is None else args.futility
    if args.points == "donor" and (args.layer != "real" or set(args.designs) - {"full", "2 base"}):
        parser.error("--points donor: the real layer's full and 2 base designs only (the others cut runs on the "
                     "mock's clock)")
    started = time.perf_counter()
    figures = gauss(args) if args.layer == "gauss" else fits(args)
    figures |= {"layer": args.layer, "futility": args.futility,
                "command": "python bench/bench_power.py " + " ".join(sys.argv[1:]),
                "seconds": time.perf_counter() - started}
    print_tables(figures, args.designs)
    print(f"\n{args.layer} layer, futility {args.futility}; {figures['seconds']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
