"""The sigmoid fitter against the paper's procedure, on curves with a known truth.

Prints, for fit_sigmoid on every curve and the paper's procedure on the first --paper-curves: the median and
95th-percentile absolute errors of A, B and C_mid, failures, time per curve, the coverage of the 90% intervals; the
extrapolation check (fit on compute <= 8k, predict the end; a power law for contrast): how often the 90% interval
of the predicted end holds the observed end, and the law's; curves cut before their midpoint.

Two layers. `--layer generated` (the default): the curves analysis/synthetic.py draws, `--set heldout | benchmark | drifting`.
`--layer real`: the real-noise layer (analysis/real_noise.py): held-out-like laws carrying the residuals of the
project's public RL runs about their own fitted laws, block-resampled (`--donors calibration`, the default: every
source but the hold-out; `holdout`: the hold-out's runs; or file stems, comma-separated). The sets, their
calibration and the targets: docs/testing.md#the-fitter-benchmark; real noise: docs/fitting.md#real-noise.

    python bench/bench_fit.py                              # 600 held-out-like curves, the paper's procedure on 120
    python bench/bench_fit.py --set benchmark --curves 200 --paper-curves 60
    python bench/bench_fit.py --layer real --paper-curves 0                 # real noise, the calibration sources
    python bench/bench_fit.py --layer real --donors cs336,cs336_round1      # one source's noise
    python bench/bench_fit.py --dips 2 [--outlier-sd inf]   # 2 dips a curve, with [without] the pulling-in
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis import real_noise  # noqa: E402
from analysis.extrapolate import extrapolation_check  # noqa: E402
from analysis.fit import FitError, fit_sigmoid  # noqa: E402
from analysis.misfit import misfit  # noqa: E402
from analysis.paper import fit_paper  # noqa: E402
from analysis.synthetic import benchmark_curves, drifting_curves, heldout_like_curves  # noqa: E402

PARAMS = ("A", "B", "C_mid")


def run_method(fit, curves):
    """(fits or None per curve, seconds per curve)."""
    out, seconds = [], []
    for curve in curves:
        start = time.perf_counter()
        try:
            f = fit(curve.compute, curve.reward)
            f = f if f.ok and all(math.isfinite(getattr(f, p)) for p in PARAMS) else None
        except FitError:
            f = None
        seconds.append(time.perf_counter() - start)
        out.append(f)
    return out, np.array(seconds)


def errors(fits, curves, name):
    return np.array([abs(getattr(f, name) - getattr(c.truth, name)) for f, c in zip(fits, curves) if f is not None])


def coverage(fits, curves, name):
    hits = [f.ci[name][0] <= getattr(c.truth, name) <= f.ci[name][1] for f, c in zip(fits, curves) if f is not None]
    return float(np.mean(hits)), len(hits)


def fmt_err(e: np.ndarray, name: str) -> str:
    if name == "C_mid":
        return f"{np.median(e):>7.0f} {np.percentile(e, 95):>7.0f}"
    digits = 4 if name == "A" else 3
    return f"{np.median(e):>7.{digits}f} {np.percentile(e, 95):>7.{digits}f}"


def add_dips(curves, count: int, rng: np.random.Generator) -> None:
    """Drop `count` points of each curve, after the paper's c_min (1.5/16 of its compute), by 0.03-0.10 each."""
    for curve in curves:
        late = np.flatnonzero(curve.compute >= curve.compute.max() * 1.5 / 16)
        where = rng.choice(late, size=min(count, late.size), replace=False)
        curve.reward[where] = np.clip(curve.reward[where] - rng.uniform(0.03, 0.10, where.size), 0.0, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layer", choices=("generated", "real"), default="generated",
                        help="generated: analysis/synthetic.py's curves (--set); real: the real-noise layer, known laws "
                             "with the residuals of public RL runs (--donors)")
    parser.add_argument("--set", choices=("heldout", "benchmark", "drifting"), default="heldout",
                        help="the generated layer's set: heldout, as hard as issue 13's held-out set (default); "
                             "benchmark: issue 4's; drifting: heldout with the slow departures real runs show")
    parser.add_argument("--donors", default="calibration", help=real_noise.DONORS_HELP)
    parser.add_argument("--block", type=float, default=None,
                        help="the real layer's block, a share of a run (default analysis.real_noise.BLOCK; 1: whole)")
    parser.add_argument("--curves", type=int, default=600, help="synthetic curves for fit_sigmoid (default 600)")
    parser.add_argument("--paper-curves", type=int, default=120,
                        help="of those, how many the paper's procedure fits too (default 120; ~2-3 s each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dips", type=int, default=0,
                        help="per curve, this many points after the paper's c_min dropped by 0.03-0.10 (RL curves' "
                             "dips a run recovers from; the embedded study's are ~0.1)")
    parser.add_argument("--outlier-sd", type=float, default=None,
                        help="the fitter's OUTLIER_SD (analysis/posterior.py); inf turns the pulling-in of dips off")
    args = parser.parse_args()
    if args.outlier_sd is not None:
        from analysis import posterior

        posterior.OUTLIER_SD = args.outlier_sd
    m = min(args.paper_curves, args.curves)
    if args.layer == "real":
        holdout, sources = real_noise.parse_donors(args.donors)
        curves = real_noise.layer_curves(args.curves, seed=args.seed, holdout=holdout, sources=sources,
                                         block=real_noise.BLOCK if args.block is None else args.block)
        described = f"the real-noise layer (donors: {args.donors}, {len(real_noise.donors(holdout=holdout, sources=sources))} runs)"
    else:
        make = {"heldout": heldout_like_curves, "benchmark": benchmark_curves, "drifting": drifting_curves}[args.set]
        curves = make(args.curves, seed=args.seed)
        described = f"the {args.set} set"
    if args.dips:
        add_dips(curves, args.dips, np.random.default_rng([args.seed, 17]))
    print(f"cores: {os.cpu_count()}  python: {sys.version.split()[0]}  BLAS threads: "
          f"{os.environ['OPENBLAS_NUM_THREADS']}  curves: {args.curves} of {described} (seed {args.seed}), "
          f"the paper's procedure on the first {m}" + (f"; {args.dips} dips a curve" if args.dips else "")
          + (f"; OUTLIER_SD {args.outlier_sd:g}" if args.outlier_sd is not None else ""))

    run_method(fit_sigmoid, curves[:1])  # warm up: the first call imports scipy's optimizers
    fast, fast_s = run_method(fit_sigmoid, curves)
    paper, paper_s = run_method(fit_paper, curves[:m])

    print("\nabsolute errors against the truth (median, 95th percentile); time per curve (mean)")
    print(f"{'method':<24}{'curves':>7}{'fail':>5}   {'A med':>7} {'A p95':>7}   {'B med':>7} {'B p95':>7}"
          f"   {'C_mid med':>9} {'p95':>7}   {'ms/curve':>9}")
    rows = [("fit_sigmoid", fast, fast_s, curves)]
    if m:
        rows += [(f"fit_sigmoid (first {m})", fast[:m], fast_s[:m], curves[:m]),
                 (f"paper (first {m})", paper, paper_s, curves[:m])]
    for name, fits, secs, cs in rows:
        fails = sum(f is None for f in fits)
        errs = [fmt_err(errors(fits, cs, p), p) for p in PARAMS]
        print(f"{name:<24}{len(cs):>7}{fails:>5}   {errs[0]}   {errs[1]}   {errs[2]:>17}   {1e3 * secs.mean():>9.1f}")
    speedup = paper_s.mean() / fast_s.mean() if m else math.nan
    if m:
        print(f"speedup: {speedup:,.0f}x (paper {paper_s.mean():.2f} s/curve on {m} curves, fit_sigmoid "
              f"{1e3 * fast_s.mean():.1f} ms/curve mean, {1e3 * np.median(fast_s):.1f} ms median, "
              f"{1e3 * fast_s.max():.1f} ms max, intervals included)")

    print(f"\ncoverage of fit_sigmoid's 90% intervals ({args.curves} curves; binomial sd "
          f"{100 * math.sqrt(0.09 / max(args.curves, 1)):.1f} points)")
    cov = {}
    for p in PARAMS:
        cov[p], n = coverage(fast, curves, p)
        below = np.mean([getattr(c.truth, p) < f.ci[p][0] for f, c in zip(fast, curves) if f is not None])
        print(f"  {p:<6} {100 * cov[p]:5.1f}%   (truth below the interval {100 * below:4.1f}%, "
              f"above {100 * (1 - cov[p] - below):4.1f}%)")

    # extrapolation: fit on the first half of the compute, predict the end
    ex = [extrapolation_check(c.compute, c.reward, fraction=0.5) for c in curves]
    ok = [(e, c) for e, c in zip(ex, curves) if e.ok]
    err_obs = np.array([abs(e.error) for e, _ in ok])
    err_true = np.array([abs(e.predicted - float(c.truth(e.end_compute).mean())) for e, c in ok])
    inside = np.mean([e.predicted_ci[0] <= float(c.truth(e.end_compute).mean()) <= e.predicted_ci[1] for e, c in ok])
    observed = np.mean([e.predicted_ci[0] <= e.observed <= e.predicted_ci[1] for e, _ in ok])
    own = np.mean([e.predicted_ci[0] <= e.predicted <= e.predicted_ci[1] for e, _ in ok])
    pw = [(e, c) for e, c in ok if e.power is not None and e.power.ok]
    pw_obs = np.array([abs(e.power_error) for e, _ in pw])
    pw_A = np.array([e.power.A for e, _ in pw])
    sig_A = np.array([abs(e.sigmoid.A - c.truth.A) for e, c in ok])
    print(f"\nextrapolation: fit on compute <= 8,000 GPU-hours, predict the end of the run (mean over its last 5%); "
          f"{len(ok)} of {len(curves)} checks made")
    print(f"  sigmoid    |pred - observed| median {np.median(err_obs):.4f}  p95 {np.percentile(err_obs, 95):.4f};  "
          f"|pred - truth| median {np.median(err_true):.4f}  p95 {np.percentile(err_true, 95):.4f};  "
          f"|A(half) - A| median {np.median(sig_A):.4f}")
    print(f"  the 90% interval of the predicted end holds the observed end in {100 * observed:.1f}%, the law's end in "
          f"{100 * inside:.1f}%, the printed prediction in {100 * own:.1f}%")
    print(f"  power law  |pred - observed| median {np.median(pw_obs):.4f}  p95 {np.percentile(pw_obs, 95):.4f};  "
          f"its A: median {np.median(pw_A):.3f}, at 1.0 for {100 * np.mean(pw_A >= 0.999):.0f}% "
          f"(truth: A median {np.median([c.truth.A for c in curves]):.3f})")

    # the misfit test on the same curves: on the generated layer they follow their law (a flag is false)
    flagged = [found.flagged for f, c in zip(fast, curves) if f is not None
               and (found := misfit(c.compute, c.reward, f)) is not None]
    if flagged:
        print(f"\nthe misfit test (analysis/misfit.py): flagged on {100 * np.mean(flagged):.1f}% of {len(flagged)} "
              "curves" + (" (each follows its law: a false flag)" if args.layer == "generated" else
                          " (each carries a real run's departures from its own law)"))

    # curves cut before their midpoint: the interval on A must say that A is loose
    cut_cov, widths_cut, widths_full, open_top = [], [], [], 0
    for f_full, c in zip(fast, curves[:100]):
        keep = c.compute <= 0.8 * c.truth.C_mid
        try:
            f = fit_sigmoid(c.compute[keep], c.reward[keep], c_min=1500.0)
        except FitError:
            continue
        cut_cov.append(f.ci["A"][0] <= c.truth.A <= f.ci["A"][1])
        widths_cut.append(f.ci["A"][1] - f.ci["A"][0])
        open_top += f.ci["A"][1] >= 1.0
        if f_full is not None:
            widths_full.append(f_full.ci["A"][1] - f_full.ci["A"][0])
    print(f"\ncurves cut at 0.8 C_mid (before the midpoint), fitted from 1,500 GPU-hours: {len(cut_cov)} fits")
    print(f"  A interval: coverage {100 * np.mean(cut_cov):.0f}%, median width {np.median(widths_cut):.3f} "
          f"(whole curves: {np.median(widths_full):.3f}), open up to 1 in {100 * open_top / max(len(cut_cov), 1):.0f}%")

    all_a = errors(fast, curves, "A")
    checks = [
        (f"A error p95 <= 0.035 on all {args.curves} curves: {np.percentile(all_a, 95):.4f}",
         np.percentile(all_a, 95) <= 0.035),
        ("coverage in 85-95%: " + ", ".join(f"{p} {100 * cov[p]:.1f}%" for p in PARAMS),
         all(0.85 <= cov[p] <= 0.95 for p in PARAMS)),
        (f"the predicted end's interval holds the observed end >= 85%: {100 * observed:.1f}%", observed >= 0.85),
        (f"no failure: {sum(f is None for f in fast)} of {args.curves}", all(f is not None for f in fast)),
    ]
    if m:
        fast_a, paper_a = errors(fast[:m], curves[:m], "A"), errors(paper, curves[:m], "A")
        checks[1:1] = [
            (f"A error p95 <= paper's on the same {m} curves: {np.percentile(fast_a, 95):.4f} vs "
             f"{np.percentile(paper_a, 95):.4f}", np.percentile(fast_a, 95) <= np.percentile(paper_a, 95)),
            (f"A error median <= paper's: {np.median(fast_a):.4f} vs {np.median(paper_a):.4f}",
             np.median(fast_a) <= np.median(paper_a)),
            (f"speedup >= 100x: {speedup:,.0f}x", speedup >= 100)]
    print("\ntargets")
    for text, passed in checks:
        print(f"  {'PASS' if passed else 'FAIL'}  {text}")


if __name__ == "__main__":
    main()
