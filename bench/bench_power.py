"""Power and false claims of the sweep's designs, at fixed effects on the mock's law and noise: how often each design
claims a move that is there, and one that is not, and what it spends.

Pairs of runs (a variant beside the base recipe) are drawn as generator=mock draws them (analysis/synthetic.py's
mock_curve: its validation, wobble and clock; the base law is conf/generator/mock.yaml's truth) at fixed effects
that do not depend on any verdict, and every design is applied to the same pairs:

    full      the report's verdict on both runs at their full budget
    adaptive  the adaptive sweep's rule at its rungs (analysis/adaptive.py's decide, the call a job makes)
    cut 1/2   every run stopped at half its budget, cut 1/4 at a quarter (for scale)
    2 x 1/2   two seeds of each, at half the budget each (the same GPU-hours as one full run), pooled

Effects: dA = 0 (null pairs: a claim of A is false), -0.02, -0.03, -0.05 (B and C_mid held); a B-only move (dB -0.5,
C_mid x 1.3, dA 0: loo-8op's shape: a claim of A is false); dB -0.25. At the run level both runs have the law's A
exactly (the question: do these runs differ?); at the recipe level each run's A is drawn around its recipe's with
the mock's run_sd_A, and claims are judged against the recipes (the question the user asks). GPU-hours: the share of
the full sweep's that each design spends on the mock's LOO mix (its eight effects, one base run).

    python bench/bench_power.py                       # every design, the default pair counts (~25 min, 2 cores)
    python bench/bench_power.py --null 500 --pairs 200 --designs full,adaptive --jobs 2
    python bench/bench_power.py --json out.json       # the figures, for docs

Prints one table per level; figures and the command that made them: docs/fitting.md#power-and-false-claims.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.synthetic import MockNoise, Truth  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MOCK = yaml.safe_load((REPO / "conf" / "generator" / "mock.yaml").read_text())
BASE = Truth(**MOCK["truth"])
NOISE = MockNoise(run_sd_A=MOCK["run_sd_A"], wobble_sd=MOCK["wobble_sd"], wobble_gpu_hours=MOCK["wobble_gpu_hours"],
                  spread=MOCK["prompt_spread"], val_prompts=MOCK["val_prompts"], val_samples=MOCK["val_samples"],
                  budget=MOCK["gpu_hours"])


@dataclass(frozen=True)
class Effect:
    name: str
    dA: float = 0.0
    dB: float = 0.0
    C_mid: float = 1.0  # a factor

    def truth(self, base: Truth = BASE) -> Truth:
        return Truth(A=base.A + self.dA, B=base.B + self.dB, C_mid=base.C_mid * self.C_mid, R0=base.R0)


EFFECTS = (Effect("dA 0 (null)"), Effect("dA -0.02", dA=-0.02), Effect("dA -0.03", dA=-0.03),
           Effect("dA -0.05", dA=-0.05), Effect("B only (8op)", dB=-0.5, C_mid=1.3), Effect("dB -0.25", dB=-0.25))
DESIGNS = ("full", "adaptive", "cut 1/2", "cut 1/4", "2 x 1/2")


def loo_mix() -> list[Effect]:
    """The mock's LOO variants (conf/axes/paper.yaml's reverts, mock.yaml's effects), as effects on the base law."""
    axes = yaml.safe_load((REPO / "conf" / "axes" / "paper.yaml").read_text())
    rows = axes if isinstance(axes, list) else next(v for v in axes.values() if isinstance(v, list))
    out = []
    for axis in rows:
        base = axis["base"]
        base = str(base).lower() if isinstance(base, bool) else base
        e = MOCK["effects"].get(f"{axis['path']}={base}", {})
        out.append(Effect(axis["variant"], dA=e.get("A", 0.0), dB=e.get("B", 0.0), C_mid=e.get("C_mid", 1.0)))
    return out


# --- one pair through the real fitter ---------------------------------------------------------------------------


def _cut(curve, steps: int):
    from analysis.adaptive import Curve

    keep = curve.step <= steps
    return Curve(curve.step[keep], curve.compute[keep], curve.reward[keep])


def compare(variant: list, base: list):
    """The report's verdict of a variant's runs (pooled) beside the base's: analysis.rank.verdict with the common-A
    refit, as analysis/report.py makes it."""
    from analysis.joint import fit_common_A
    from analysis.law import FitError, SigmoidFit, prepare
    from analysis.posterior import fit_state
    from analysis.rank import verdict

    def state(curves):
        c = np.concatenate([x.compute for x in curves])
        r = np.concatenate([x.reward for x in curves])
        runs = np.concatenate([np.full(x.compute.size, k) for k, x in enumerate(curves)])
        try:
            return fit_state(prepare(c, r, runs=runs))
        except FitError as err:
            return SigmoidFit.failed(err.reason)

    sv, sb = state(variant), state(base)
    fits = [s if isinstance(s, SigmoidFit) else s.fit for s in (sv, sb)]

    def common():
        if isinstance(sv, SigmoidFit) or isinstance(sb, SigmoidFit):
            raise FitError("no fit")
        return fit_common_A([sv.data, sb.data], [sv, sb])

    return verdict(fits[0], fits[1], common=common)


def claims(v) -> tuple[int, int, int]:
    """(A, B, compute) claimed: the sign of the claimed change, 0 where none."""
    def sign(x):
        return 0 if not x else (1 if x > 0 else -1)

    c = math.log(v.compute.ratio) if v.compute is not None and v.moves_C else 0.0
    return (sign(v.dA) if v.moves_A else 0, sign(v.dB) if v.moves_B else 0, sign(c))


def _label_claims(label: str, v) -> tuple[int, int, int]:
    """Claims of a label the rule decided (its dA, dB and compute from the verdict at the look it stopped)."""
    from dataclasses import replace

    return claims(replace(v, label=label))


def adaptive(variant, base, steps: int, rungs=(0.25, 0.5, 1.0), seed: int = 0) -> tuple[tuple[int, int, int], float]:
    """The adaptive rule on one pair: (claims where it stopped, the variant's share of its budget spent)."""
    from analysis.adaptive import decide, rung_steps

    for k, step in enumerate(rung_steps(steps, list(rungs)), 1):
        d = decide(variant, base, rung=k, step=step, steps=steps, seed=seed * 100 + k)
        if d.stop:
            v = compare([_cut(variant, step)], [base.upto(float(variant.compute[variant.step <= step].max()))])
            return _label_claims(d.verdict, v), step / steps
    raise AssertionError("the last rung always stops")


def run_pair(args) -> dict:
    """Every design on one pair (seeded): claims per design, and the adaptive rule's share of the budget."""
    from analysis.adaptive import Curve
    from analysis.synthetic import mock_curve

    effect, seed, level, designs = args
    rng = np.random.default_rng([seed, 7])
    truth_v, truth_b = effect.truth(), BASE
    fixed = level == "run"

    def run(truth, steps=NOISE.steps):
        c = mock_curve(rng, truth, NOISE, steps=steps, run_A=truth.A if fixed else None)
        return Curve(c.step, c.compute, c.reward), c.truth

    (v, v_truth), (b, b_truth) = run(truth_v), run(truth_b)
    out = {"run_dA": v_truth.A - b_truth.A}
    steps = NOISE.steps
    for design in designs:
        if design == "full":
            out[design] = claims(compare([v], [b]))
        elif design == "adaptive":
            out[design], out["adaptive_spent"] = adaptive(v, b, steps, seed=seed)
        elif design.startswith("cut"):
            f = 0.5 if design == "cut 1/2" else 0.25
            out[design] = claims(compare([_cut(v, round(f * steps))], [_cut(b, round(f * steps))]))
        elif design == "2 x 1/2":
            half = steps // 2
            vs = [v.upto_step(half), run(truth_v, half)[0]]
            bs = [b.upto_step(half), run(truth_b, half)[0]]
            out[design] = claims(compare(vs, bs))
    return out


def run_sweep(args) -> dict:
    """The adaptive designs on one LOO sweep of the mock's mix (run A drawn as the mock draws it): the GPU-hours each
    spends over the full sweep's (the base goes on to the last rung any variant needed)."""
    from analysis.adaptive import Curve
    from analysis.synthetic import mock_curve

    seed, designs = args
    rng = np.random.default_rng([seed, 11])

    def run(truth):
        c = mock_curve(rng, truth, NOISE)
        return Curve(c.step, c.compute, c.reward)

    base = run(BASE)
    variants = [run(e.truth()) for e in loo_mix()]
    full = base.c_max + sum(v.c_max for v in variants)
    out = {}
    for design in designs:
        if design != "adaptive":
            continue
        stops = [adaptive(v, base, NOISE.steps, seed=seed)[1] for v in variants]
        last = max(stops)
        spent = base.upto_step(round(last * NOISE.steps)).c_max + sum(
            v.upto_step(round(f * NOISE.steps)).c_max for v, f in zip(variants, stops))
        out[design] = spent / full
    return out


# --- aggregation and the tables ---------------------------------------------------------------------------------


def rates(results: list[dict], design: str, effect: Effect) -> dict:
    """Claim rates of one design on one effect's pairs: A claimed down / up, B claimed, compute claimed."""
    got = [r[design] for r in results if design in r]
    n = len(got)
    a_down = sum(c[0] < 0 for c in got) / n
    a_any = sum(c[0] != 0 for c in got) / n
    b_any = sum(c[1] != 0 for c in got) / n
    b_right = sum(c[1] == (1 if effect.dB > 0 else -1) for c in got) / n
    c_any = sum(c[2] != 0 for c in got) / n
    return {"n": n, "A": a_any, "A down": a_down, "B": b_any, "B right": b_right, "compute": c_any,
            "any": sum(any(c) for c in got) / n}


def headline(effect: Effect, r: dict) -> str:
    """The figure an effect is there for: power on a true move, the false-claim rate where there is none."""
    if effect.dA < 0:
        return f"power {r['A down']:.3f}"
    if effect.dA == 0 and effect.dB == 0:
        return f"false A {r['A']:.3f} (any claim {r['any']:.3f})"
    return f"B {r['B right']:.3f}, false A {r['A']:.3f}"


def se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1e-12) / max(n, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--null", type=int, default=500, help="null pairs per level (>= 500 tells 0.02 from 0.05)")
    parser.add_argument("--pairs", type=int, default=200, help="pairs per non-null effect")
    parser.add_argument("--designs", default=",".join(DESIGNS))
    parser.add_argument("--levels", default="run,recipe")
    parser.add_argument("--sweeps", type=int, default=40, help="LOO sweeps of the mock's mix, for the GPU-hours")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    designs = tuple(d.strip() for d in args.designs.split(","))
    started = time.perf_counter()
    figures: dict = {"designs": designs, "command": "python bench/bench_power.py " + " ".join(sys.argv[1:])}
    with ProcessPoolExecutor(args.jobs) as pool:
        for level in args.levels.split(","):
            effects = EFFECTS if level == "run" else EFFECTS[:1]
            print(f"\n{level} level: {'both runs on the law (do these runs differ?)' if level == 'run' else 'run A drawn around the recipe with run_sd_A ' + str(NOISE.run_sd_A) + ' (do the recipes differ?)'}", flush=True)
            print("| effect | " + " | ".join(designs) + " |")
            print("|---|" + "---|" * len(designs))
            for effect in effects:
                n = args.null if effect.dA == 0 and effect.dB == 0 else args.pairs
                todo = [(effect, seed, level, designs) for seed in range(n)]
                results = list(pool.map(run_pair, todo, chunksize=4))
                row = {d: rates(results, d, effect) for d in designs}
                if "adaptive" in designs:
                    row["adaptive_spent"] = float(np.mean([r["adaptive_spent"] for r in results]))
                figures.setdefault(level, {})[effect.name] = row
                cells = [f"{headline(effect, row[d])} ±{se(row[d]['A'] if effect.dA >= 0 else row[d]['A down'], n):.3f}"
                         for d in designs]
                print(f"| {effect.name} ({n}) | " + " | ".join(cells) + " |", flush=True)
        adaptive_designs = [d for d in designs if d == "adaptive"]
        if adaptive_designs and args.sweeps:
            spent = list(pool.map(run_sweep, [(seed, designs) for seed in range(args.sweeps)]))
            fixed = {"full": 1.0, "cut 1/2": 0.5, "cut 1/4": 0.25, "2 x 1/2": 1.0}
            hours = {d: fixed[d] if d in fixed else float(np.mean([s[d] for s in spent])) for d in designs}
            figures["gpu_hours"] = hours
            print(f"\nGPU-hours on the mock's LOO mix ({args.sweeps} sweeps), share of the full sweep's:")
            print("| " + " | ".join(designs) + " |\n|" + "---|" * len(designs))
            print("| " + " | ".join(f"{hours[d]:.0%}" for d in designs) + " |")
    figures["seconds"] = time.perf_counter() - started
    print(f"\n{figures['seconds']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
