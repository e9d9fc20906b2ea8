"""Seeds where verdicts are open: an adaptive sweep with seeds against the cheapest fixed design that reaches the same
power about the recipes, in the Gaussian limit (each seed's A its recipe's plus the spread between runs plus its
fit's error; no curves fitted), over many LOO sweeps: GPU-hours and false claims.

The rule (group-sequential at the recipe level): every variant and the base start with `--start` seeds; at look k
of K every open variant is brought to k/K of the information the fixed design has on its change (1 / sd(dA)^2,
sd^2 = (s^2 + tau^2)(1/n + 1/b)), seeds added one at a time where the next buys the most information per GPU-hour
(a seed of the base serves every open variant); its z = dA / sd is held to the Lan-DeMets O'Brien-Fleming boundary
(analysis/sequential.py) at its information fraction, spending the fixed design's 0.02; a claim not made is settled
unmade when the full information would make it with a predictive probability below `--futility` (non-binding).
The maximum information is the fixed design's times `--inflate` (a sequential design needs a little more for the
same power). Seeds are full-length runs, each a unit of GPU-hours (the mock's: 16,000).

    python bench/bench_seeds.py --sweeps 2000           # null sweeps and sweeps at the margin, both designs
    python bench/bench_seeds.py --layer fits --pool 300  # each seed's fit error one of 300 mock runs' (the fitter)

`--layer fits`: a seed's error is not normal but drawn from the errors of the real fitter (analysis/posterior.py's
fit, as the report fits a seed) on `--pool` mock runs of the base law (analysis/synthetic.py's mock_curve, its
validation, wobble and clock), A_hat - A; the rule and the fixed design take its sd as the seed's. `--layer real`:
the same runs with real RL noise instead of the mock's, each carrying a public run's residuals about its own fitted
law (analysis/real_noise.py, the donors in turn; `--holdout` the hold-out's).

    python bench/bench_seeds.py --layer real --pool 300   # the fitter's errors on real noise
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.design import Question, cheapest, run_sds  # noqa: E402
from analysis.rank import CRITICAL  # noqa: E402
from analysis.seeded import information, look, seeds_to_add  # noqa: E402

VARIANTS = 8


def fixed_design(margin: float, tau: float, points: int = 50) -> tuple[int, int, float]:
    """(seeds a variant, seeds of the base, one run's sd of A): the cheapest full-length fixed design with 80% power
    at the margin about the recipes (analysis/design.py), variants and the base costing alike."""
    q = Question(margin_A=margin, spread_A=tau)
    best = cheapest(q, points=points, hours=(float(VARIANTS), 1.0), lengths=(1.0,))[0]
    return best.design.seeds, best.design.base_seeds, run_sds(1.0, points=points)[0]


def fit_errors(pool: int, *, real: bool = False, holdout: bool = False) -> np.ndarray:
    """A_hat - A of the real fitter on `pool` mock runs of the base law (conf/generator/mock.yaml's truth): with the
    mock's noise, or (`real`) each on the mock's clock with a public RL run's residuals about its own law
    (analysis/real_noise.py's donors in turn: the calibration set's, or the hold-out's)."""
    import yaml

    from analysis import real_noise
    from analysis.law import FitError, prepare
    from analysis.posterior import fit_state
    from analysis.synthetic import MockNoise, Truth, mock_curve

    truth = Truth(**yaml.safe_load((Path(__file__).resolve().parents[1] / "conf" / "generator" / "mock.yaml")
                                   .read_text())["truth"])
    rng = np.random.default_rng([pool, 3])
    donors = real_noise.donors(holdout=holdout) if real else ()
    out = []
    for k in range(pool):
        c = mock_curve(rng, truth, MockNoise(), run_A=truth.A)
        reward = real_noise.real_curve(rng, truth, donors[k % len(donors)], compute=c.compute).reward if real \
            else c.reward
        try:
            out.append(fit_state(prepare(c.compute, reward)).fit.A - truth.A)
        except FitError:
            continue
    return np.array(out)


def one_sweep(rng, effects: np.ndarray, *, s: float, tau: float, n_fixed: int, b_fixed: int, looks: int,
              start: int, futility: float, inflate: float, errors: np.ndarray | None = None,
              spend: bool = True) -> dict:
    """Both designs on one sweep whose variants' recipes move A by `effects` (one a variant): claims (sign, 0 none)
    and GPU-hours (seeds) of each. The adaptive design's seeds are the first seeds of the fixed one's draw, and
    more past them, so both see the same runs. `spend` False: every look held to the one-look 2.326 (looks that
    spend no error: the negative control)."""
    most = 8 * max(n_fixed, b_fixed) * 4
    sd_seed = math.sqrt(s * s + tau * tau)
    if errors is None:
        base_runs = rng.standard_normal(most) * sd_seed
        runs = effects[:, None] + rng.standard_normal((effects.size, most)) * sd_seed
    else:  # the recipe's A, the run's draw around it (tau), the fitter's own error on a mock run
        base_runs = rng.standard_normal(most) * tau + rng.choice(errors, most)
        runs = effects[:, None] + rng.standard_normal((effects.size, most)) * tau + rng.choice(errors, (effects.size,
                                                                                                       most))
    var = sd_seed**2

    def z(v: int, n: int, b: int) -> float:
        return (runs[v, :n].mean() - base_runs[:b].mean()) / math.sqrt(var * (1 / n + 1 / b))

    fixed = np.array([np.sign(z(v, n_fixed, b_fixed)) if abs(z(v, n_fixed, b_fixed)) >= CRITICAL else 0
                      for v in range(effects.size)])
    i_max = inflate / (var * (1 / n_fixed + 1 / b_fixed))
    n = np.full(effects.size, start)
    b = start
    open_ = np.ones(effects.size, bool)
    claims = np.zeros(effects.size, int)
    times: list[tuple[float, ...]] = [() for _ in effects]
    for k in range(1, looks + 1):
        more, more_base = seeds_to_add(n / var, b / var, np.full(effects.size, 1 / var), 1 / var, open_,
                                       i_max * k / looks)
        n, b = n + more, b + more_base
        for v in np.flatnonzero(open_):
            seen = look(z(v, n[v], b), information(n[v] / var, b / var) / i_max, times[v], last=k == looks,
                        alpha=0.02, futility=futility, spend=spend)
            times[v] = seen.times
            claims[v], open_[v] = seen.claim, not seen.settled
        if not open_.any():
            break
    return {"fixed": fixed, "adaptive": claims, "fixed hours": n_fixed * effects.size + b_fixed,
            "adaptive hours": int(n.sum() + b)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweeps", type=int, default=2000, help="sweeps of each kind (null, at the margin)")
    parser.add_argument("--margin", type=float, default=0.02)
    parser.add_argument("--tau", type=float, default=0.015, help="the spread between runs (true and stated)")
    parser.add_argument("--looks", type=int, default=4)
    parser.add_argument("--start", type=int, default=2, help="seeds of each variant and the base at the first look")
    parser.add_argument("--futility", type=float, default=0.10)
    parser.add_argument("--inflate", type=float, default=1.0, help="the maximum information over the fixed design's")
    parser.add_argument("--layer", choices=("gauss", "fits", "real"), default="gauss")
    parser.add_argument("--pool", type=int, default=300, help="mock runs fitted for --layer fits or real")
    parser.add_argument("--holdout", action="store_true", help="--layer real: the hold-out donors' noise")
    args = parser.parse_args()
    started = time.perf_counter()
    errors = None
    if args.layer != "gauss":
        errors = fit_errors(args.pool, real=args.layer == "real", holdout=args.holdout)
        errors = errors - np.median(errors)  # the fitter's bias cancels between variant and base: its spread kept
        s_fit = float(np.std(errors))
        noise = " with real runs' residuals" + (" (hold-out)" if args.holdout else "") if args.layer == "real" else ""
        print(f"the fitter on {errors.size} mock runs{noise}: sd of A_hat - A {s_fit:.4f}")
    n_fixed, b_fixed, s = fixed_design(args.margin, args.tau)
    if errors is not None:
        s = s_fit
        from analysis.design import Design, answer

        q = Question(margin_A=args.margin, spread_A=args.tau)
        n_fixed, b_fixed = min(((n, b) for n in range(1, 64) for b in range(1, 128)
                                if answer(Design("", n, b), q, sds=(s, 0.0), hours=(8.0, 1.0)).reaches()),
                               key=lambda nb: VARIANTS * nb[0] + nb[1])
    print(f"{args.layer} layer; fixed design: {n_fixed} seeds a variant, {b_fixed} of the base, full length (one "
          f"run's sd of A {s:.4f}, spread {args.tau}); {args.looks} looks, {args.start} seeds each to start, futility {args.futility}, "
          f"maximum information x{args.inflate}")
    rng = np.random.default_rng(0)
    kw = dict(s=s, tau=args.tau, n_fixed=n_fixed, b_fixed=b_fixed, looks=args.looks, start=args.start,
              futility=args.futility, inflate=args.inflate, errors=errors)
    print("| sweeps (8 variants each) | design | false A a verdict | power at the margin | sweeps with a false claim "
          "| GPU-hours (seeds) | share of the fixed |\n|---|---|---|---|---|---|---|")
    for name, effect in (("no effect", 0.0), (f"every variant dA -{args.margin}", -args.margin)):
        got = [one_sweep(rng, np.full(VARIANTS, effect), **kw) for _ in range(args.sweeps)]
        for design in ("fixed", "adaptive"):
            claims = np.array([g[design] for g in got])
            hours = np.mean([g[f"{design} hours"] for g in got])
            share = hours / np.mean([g["fixed hours"] for g in got])
            false = (claims != 0).mean() if effect == 0 else (claims > 0).mean()
            power = (claims < 0).mean() if effect else math.nan
            fw = ((claims != 0).sum(axis=1) > 0).mean() if effect == 0 else math.nan
            print(f"| {args.sweeps} {name} | {design} | {false:.4f} | {power:.3f} | {fw:.3f} | {hours:.1f} | "
                  f"{share:.0%} |")
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
