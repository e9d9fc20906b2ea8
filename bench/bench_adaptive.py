"""The adaptive LOO sweep against the full one, on the mock's known truth: verdicts right and GPU-hours spent.

Runs the full mock sweep (`python -m ablate sweep=loo generator=mock`) for seeds 0..N-1, two at a time, into one
store, then replays the adaptive sweep on each: every variant is looked at at its rungs beside the base recipe cut at
the same compute (analysis/adaptive.py's `decide`, the very call a job makes), stops at the first rung that settles
it, and the base goes on to the last rung any variant needed. A run's points up to a step do not depend on what
comes after it, so the replay is the adaptive sweep of the same seed. Both sweeps are then reported
(analysis.report.variant_rows) and judged by analysis/truth.py's yardstick. Prints one table; figures measured with
it: docs/fitting.md#the-adaptive-sweep.

    python bench/bench_adaptive.py --seeds 20               # the calibration table (~10 min on 2 cores)
    python bench/bench_adaptive.py --seeds 20 --folder DIR  # keep the sweeps in DIR; a second call reuses them
    python bench/bench_adaptive.py --futility 0.2           # another rule setting, on the same sweeps
    python bench/bench_adaptive.py --margin-A 0.03          # with a declared margin on A
    python bench/bench_adaptive.py --settle-json bench/adaptive_settle.json  # where each variant settled, for
                                                            # bench_cluster.py's prediction at paper scale
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.adaptive import FUTILITY  # noqa: E402

EXPERIMENT = "adaptive-bench"
FIXED_CUTS = (0.25, 0.5)


def run_sweeps(folder: Path, seeds: range, jobs: int, extra: list[str]) -> None:
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{folder}/mlflow.db").search_experiments()  # migrated before they start
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"OMP_NUM_THREADS": "1"}
    todo = list(seeds)
    running: list[tuple[int, subprocess.Popen]] = []
    while todo or running:
        while todo and len(running) < jobs:
            seed = todo.pop(0)
            cmd = [sys.executable, "-m", "ablate", "sweep=loo", "generator=mock", "launcher=debug",
                   "sweep.report=false", f"tracking.experiment={EXPERIMENT}", f"seed={seed}", *extra]
            running.append((seed, subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE,
                                                   stderr=subprocess.STDOUT, text=True)))
        time.sleep(0.5)
        for seed, proc in list(running):
            if proc.poll() is not None:
                out = proc.stdout.read()
                if proc.returncode:
                    sys.exit(f"the sweep of seed {seed} failed:\n{out[-3000:]}")
                print(f"  seed {seed}: swept", flush=True)
                running.remove((seed, proc))


def replay(curves: list, futility: float, margin_A: float | None, fractions: list[float]) -> dict:
    """One sweep's curves (analysis.runs.RunCurve), full and adaptive: verdicts, judgements, GPU-hours, rungs."""
    import numpy as np

    from analysis.adaptive import RUNG_TAG, Curve, decide, rung_steps
    from analysis.report import variant_rows
    from analysis.runs import SETTLED_TAG

    def as_curve(c) -> Curve:
        return Curve(c.step, c.compute, c.pass_rate)

    (base,) = [c for c in curves if c.variant == "scalerl"]
    steps = base.planned_steps
    rungs = rung_steps(steps, fractions)
    stops, looked = {}, {}
    for c in curves:
        if c is base:
            continue
        history = []
        for k, step in enumerate(rungs, 1):
            d = decide(as_curve(c), as_curve(base), rung=k, step=step, steps=steps, history=history,
                       futility=futility, margin_A=margin_A)
            history.append(d)
            if d.stop:
                stops[c.variant] = (k, step)
                break
        looked[c.variant] = history
    base_end = max(step for _, step in stops.values())

    def cut(c, step: int):
        """The run as the adaptive sweep leaves it: its points to where it stopped, its decisions as tags (the
        report holds it to the rule's own test)."""
        tags = {**c.tags, **{RUNG_TAG.format(k=d.rung): d.to_json() for d in looked.get(c.variant, [])
                             if d.step < steps}}
        if step >= steps:
            return replace(c, tags=tags)
        keep = c.step <= step
        return replace(c, step=c.step[keep], compute=c.compute[keep], pass_rate=c.pass_rate[keep], last_step=step,
                       tags={**tags, SETTLED_TAG: str(step)})

    adaptive = [cut(c, base_end if c is base else stops[c.variant][1]) for c in curves]

    def judged(cs) -> dict:
        rows = variant_rows(cs, Path(tempfile.gettempdir()))
        rows = [r for r in rows if r.expected is not None]
        return {r.variant: (r.verdict.label, not r.truth_disagrees, r.verdict.resolution) for r in rows}

    def hours(cs) -> float:
        return float(sum(c.compute.max(initial=0.0) for c in cs))

    full_v, adaptive_v = judged(curves), judged(adaptive)
    # for scale: every run cut at a fixed share of its budget, looked at once (what the yardstick alone cannot tell
    # from the rule: verdicts at their own, coarser resolution)
    cuts = {f: [cut(c, round(f * steps)) for c in curves] for f in FIXED_CUTS}
    fixed = {f: (judged(cs), hours(cs)) for f, cs in cuts.items()}
    return {"full": full_v, "adaptive": adaptive_v, "hours": (hours(curves), hours(adaptive)), "fixed": fixed,
            "rungs": {v: k for v, (k, _) in stops.items()}, "base_rung": rungs.index(base_end) + 1,
            "median_res_A": tuple(float(np.median([r[2][0] for r in v.values()])) for v in (full_v, adaptive_v))}


def _replay_sweep(args) -> tuple[str, dict]:
    uri, sweep, futility, margin_A, fractions = args
    from analysis.runs import load_runs

    return sweep, replay(load_runs(EXPERIMENT, uri, sweep=sweep), futility, margin_A, fractions)


def binomial_ci(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95% interval for k of n."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2, help="sweeps (and replays) side by side")
    parser.add_argument("--folder", type=Path, help="where the sweeps' store is kept (default: a temporary one)")
    parser.add_argument("--futility", type=float, default=FUTILITY, help="sweep.futility")
    parser.add_argument("--margin-A", type=float, default=None, help="sweep.margin_A")
    parser.add_argument("--rungs", default=",".join(f"{k / 8:g}" for k in range(1, 9)),
                        help="fractions of the budget, comma-separated")
    parser.add_argument("--settle-json", type=Path, help="write, per variant, how many sweeps it settled at each rung")
    parser.add_argument("extra", nargs="*", help="overrides for every sweep, e.g. train.steps=100")
    args = parser.parse_args()
    from analysis.runs import load_runs

    folder = args.folder or Path(tempfile.mkdtemp(prefix="bench-adaptive-"))
    folder.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{folder.resolve()}/mlflow.db"
    started = time.perf_counter()
    print(f"full mock sweeps, seeds 0-{args.seeds - 1}, into {uri}", flush=True)
    run_sweeps(folder, range(args.seeds), args.jobs, args.extra)
    swept = time.perf_counter() - started
    wanted = {f"seed={s}" for s in range(args.seeds)}
    sweeps = sorted({c.sweep for c in load_runs(EXPERIMENT, uri) if f"seed={c.params.get('seed')}" in wanted})
    with ProcessPoolExecutor(args.jobs) as pool:
        fractions = [float(f) for f in args.rungs.split(",")]
        results = dict(pool.map(_replay_sweep, [(uri, s, args.futility, args.margin_A, fractions) for s in sweeps]))
    replayed = time.perf_counter() - started - swept

    n = right_full = right_adaptive = agree = 0
    hours_full = hours_adaptive = 0.0
    rung_counts: dict[int, int] = {}
    res_full, res_adaptive = [], []
    for r in results.values():
        for variant, (label, right, _) in r["full"].items():
            a_label, a_right, _ = r["adaptive"][variant]
            n += 1
            right_full += right
            right_adaptive += a_right
            agree += label == a_label
        hours_full += r["hours"][0]
        hours_adaptive += r["hours"][1]
        for k in r["rungs"].values():
            rung_counts[k] = rung_counts.get(k, 0) + 1
        res_full.append(r["median_res_A"][0])
        res_adaptive.append(r["median_res_A"][1])  # inf where a sweep's median verdict leaves A open

    def share(k: int) -> str:
        lo, hi = binomial_ci(k, n)
        return f"{k} of {n} ({k / n:.0%}; 95% CI {lo:.0%}-{hi:.0%})"

    import statistics

    import numpy as np

    print(f"\n{len(results)} mock sweeps (seeds 0-{args.seeds - 1}); rule: each claim a group-sequential test "
          f"(Lan-DeMets O'Brien-Fleming spending of 0.02), settled unmade below a predictive {args.futility}"
          + (f", A within +-{args.margin_A}" if args.margin_A else "") + f"; never before A is identified; rungs "
          f"{args.rungs}")
    print("| sweep | verdicts right (truth's yardstick) | median resolution ΔA | GPU-hours (all runs) |")
    print("|---|---|---|---|")
    print(f"| full | {share(right_full)} | {statistics.median(res_full):.3f} | {hours_full:,.0f} |")
    print(f"| adaptive | {share(right_adaptive)} | {statistics.median(res_adaptive):.3f} | {hours_adaptive:,.0f} "
          f"({hours_adaptive / hours_full:.0%} of full) |")
    for f in FIXED_CUTS:
        right = sum(right for r in results.values() for _, right, _ in r["fixed"][f][0].values())
        res = statistics.median(float(np.median([v[2][0] for v in r["fixed"][f][0].values()]))
                                for r in results.values())
        spent = sum(r["fixed"][f][1] for r in results.values())
        print(f"| every run cut at {f:.0%} | {share(right)} | {res:.3f} | {spent:,.0f} "
              f"({spent / hours_full:.0%} of full) |")
    print(f"\nadaptive verdict = full verdict: {agree} of {n}")
    print("variants settled at rung: " + ", ".join(f"{k}: {v}" for k, v in sorted(rung_counts.items())))
    print(f"wall time: {swept:.0f} s sweeping, {replayed:.0f} s replaying")
    if args.settle_json:
        write_settled(args.settle_json, results, fractions, args)


def write_settled(path: Path, results: dict, fractions: list[float], args) -> None:
    """{"rungs": [...], "sweeps": n, "variants": {name: [sweeps that stopped it at each rung]}} (the last rung: ran
    its budget); the base recipe under its own name, at the rung it ran to."""
    import json

    counts: dict[str, list[int]] = {}
    for r in results.values():
        for variant in r["full"]:
            k = r["rungs"].get(variant, len(fractions))
            counts.setdefault(variant, [0] * len(fractions))[k - 1] += 1
        counts.setdefault("scalerl", [0] * len(fractions))[r["base_rung"] - 1] += 1
    path.write_text(json.dumps({"rungs": fractions, "sweeps": len(results), "futility": args.futility,
                                "margin_A": args.margin_A,
                                "command": "python bench/bench_adaptive.py " + " ".join(sys.argv[1:]),
                                "variants": counts}, indent=1) + "\n")
    print(f"where each variant settled: {path}")


if __name__ == "__main__":
    main()
