"""python -m analysis report --experiment NAME [--tracking-uri URI] [--out DIR] [--sweep ID] [--c-min C] [MAPPING]
python -m analysis report --csv FILE | --tensorboard DIR | --hf-state PATH... | --verl-log FILE... [--out DIR]
                          [--c-min C] [--label short|full|REGEX] [MAPPING]
python -m analysis fit --json FILE [--method fast|paper] [--extrapolate FRACTION]

report: fit, rank and report the variants of one study (markdown, HTML, fits.csv, PNG plots). Runs `ablate` logged
are read by their tags: the sweep is the experiment's latest unless --sweep names one (--sweep all: every sweep);
runs launched alone (`python -m ablate`, tagged sweep none) are taken only where there is no sweep, and the sweeps
not reported are named; the files are attached to the sweep's parent run. Runs of different models, tasks or
generators are refused, naming the difference; runs that failed or stopped short of their configured steps are
named and get no verdict; a run with no fit says why (too few points: --c-min, the compute below which points are
left out, keeps more).
Another trainer's runs (TRL, verl, any MLflow experiment; curves in a file: CSV, Parquet, JSON Lines, in long
form, wide, or as W&B's chart export; TensorBoard event files; HF/TRL checkpoints' trainer_state.json; verl's console
or file logs) are read by a mapping, MAPPING: --reward METRIC (a name or a pattern), --compute
(step, step*GPU_HOURS_PER_STEP, wall*GPUS, a metric's name, cumsum:METRIC*X), --variant (tag:NAME, param:NAME,
name:REGEX), --base VARIANT, --r0 REWARD, or --mapping FILE.yaml with those keys. What is left unsaid is inferred
where the runs make it unambiguous and printed, else refused naming the flag. --label says how variants are shown
(short: the part of each name that differs, the default; full; a pattern). The files are attached to a new run of
the experiment (tagged analysis.role=report); the runs read are left as they were. docs/bring-your-own-runs.md.
fit: fit one curve. FILE (or - for stdin) holds {"compute": [...], "reward": [...]} and optionally "r0" (the
pre-RL pass rate; default: the reward at compute 0), "c_min" (points below it are left out; default 1.5/16 of
the largest compute, the paper's cut of its first 1.5k of 16k GPU-hours; 0 keeps every point after compute 0;
at least 5 points must remain), "runs" (one label per point, for several seeds); the fit with its 90% intervals
is printed as JSON.

Exit codes: 0 ok; 1 the curve could not be fitted (fit: the JSON says why); 2 bad input (unknown experiment, no
runs, tracking store unreachable, unreadable file, a mapping that does not fit the runs), one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help="fit, rank and report the variant runs of an MLflow experiment")
    source = report.add_mutually_exclusive_group(required=True)
    source.add_argument("--experiment", help="MLflow experiment name (one study; any trainer's runs)")
    source.add_argument("--csv", "--file", dest="file", metavar="FILE",
                        help="a file of curves: .csv, .parquet or .jsonl, in long form (run, variant, step or "
                             "compute, reward), W&B's chart export (Step, '<run> - <metric>') or a wide table (step, "
                             "then a column a run)")
    source.add_argument("--tensorboard", metavar="DIR",
                        help="TensorBoard event files, one run a subfolder (HF Trainer's and TRL's runs/, verl's "
                             "tensorboard backend); needs the tensorboard package")
    source.add_argument("--hf-state", nargs="+", metavar="PATH",
                        help="HF Trainer / TRL checkpoints' trainer_state.json: the files, checkpoint folders, or "
                             "folders of runs (the newest checkpoint of each)")
    source.add_argument("--verl-log", nargs="+", metavar="FILE",
                        help="verl's console logger's output (step:N - key:value - ..., a Ray driver log too) or its "
                             "file logger's JSON Lines, one run a file")
    report.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    report.add_argument("--out", default=None, help="output directory (default: reports/<experiment>)")
    report.add_argument("--sweep", default=None,
                        help="the sweep id to report (tag ablate.sweep; default: the experiment's latest sweep); "
                             "'all': every sweep, pooled")
    report.add_argument("--c-min", type=float, default=None, metavar="GPU_HOURS",
                        help="leave out the points below this compute in every fit (default: 1.5/16 of each run's "
                             "largest, the paper's cut; 0 keeps every point after compute 0)")
    mapping = report.add_argument_group("mapping another trainer's runs (each inferred where unambiguous, and printed)")
    mapping.add_argument("--reward", metavar="METRIC",
                         help="the validation reward: a metric's name or a pattern (eval_reward, "
                              "'val-core/*/reward/*')")
    mapping.add_argument("--compute", metavar="HOW",
                         help="step (the step count), step*X (X GPU-hours a step), wall*G (wall-clock hours since the "
                              "run started x G GPUs), METRIC (a cumulative metric, counted from each run's first "
                              "point), METRIC*X, or cumsum:METRIC*X (the running sum of a per-step metric: "
                              "cumsum:timing_s/step*0.00222 is 8 GPUs' hours)")
    mapping.add_argument("--variant", metavar="HOW",
                         help="which runs are which variant: tag:NAME, param:NAME or name:REGEX (its first group); "
                              "runs of one variant are its seeds (default: run names without a seed suffix)")
    mapping.add_argument("--base", metavar="VARIANT", help="the variant every verdict compares with")
    mapping.add_argument("--r0", type=float, metavar="REWARD",
                         help="the reward before training (the law's R0), for runs with no point at step 0 (compute 0)")
    report.add_argument("--label", metavar="HOW", default=None,
                        help="how the report shows each variant: short (the part of its name that differs from the "
                             "others; the default), full, or a regular expression (its first group)")
    mapping.add_argument("--mapping", metavar="FILE", help="a YAML file with keys reward, compute, variant, base, r0 "
                                                           "(flags win over it)")
    fit = commands.add_parser("fit", help="fit one curve given as JSON; print the fit with its intervals")
    fit.add_argument("--json", required=True, dest="path",
                     help='file with {"compute": [...], "reward": [...]}, optional "r0", "c_min" (default 1.5/16 of '
                          'the largest compute; 0 keeps every point), "runs"; - for stdin')
    fit.add_argument("--method", choices=("fast", "paper"), default="fast",
                     help="fast: this package's fitter, with intervals (default); paper: the paper's grid")
    fit.add_argument("--extrapolate", type=float, default=None, metavar="FRACTION",
                     help="also fit on compute <= FRACTION x the final compute and predict the end")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "fit":
        return _fit(args)
    from analysis.runs import AnalysisError

    if args.c_min is not None and not args.c_min >= 0:
        print(f"error: --c-min is the compute (GPU-hours) below which points are left out: it must be >= 0, got "
              f"{args.c_min}", file=sys.stderr)
        return 2
    try:
        report = _report(args)
    except AnalysisError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if report.mapping:
        print(f"Read {report.source}:")
        print("\n".join(f"  {line}" for line in report.mapping), end="\n\n")
    print(report.table_md)
    print()
    tables = (report.markdown, report.csv, report.variants_csv)
    figures = len([path for path in report.paths if path != report.html and path not in tables])
    print(f"wrote {report.html} (for a browser), and beside it {', '.join(path.name for path in tables)} and "
          f"{figures} figures")
    if report.artifact_run_id:
        print(f"attached to MLflow run {report.artifact_run_id} under report/")
    if report.artifact_error:
        print(f"warning: {report.artifact_error}", file=sys.stderr)
    return 0


MAPPING_FLAGS = ("reward", "compute", "variant", "base", "r0")


def _report(args):
    """The report the arguments ask for: ablate's sweep, or another trainer's runs read by a mapping (a file of
    curves; an experiment with no run of ablate's, or any experiment where a mapping flag is given)."""
    from analysis.mapping import Mapping, MappingError
    from analysis.report import make_report, report_other_runs
    from analysis.runs import resolve_tracking_uri, sweeps_of

    said = Mapping(**{key: getattr(args, key) for key in MAPPING_FLAGS})
    if args.mapping:
        said = said.over(Mapping.from_file(args.mapping))
    mapped = args.mapping is not None or any(getattr(args, key) is not None for key in MAPPING_FLAGS)
    read = _file_source(args)
    if read is not None:
        runs, title, source, from_file = read
        if args.sweep is not None:
            raise MappingError("--sweep picks among ablate's sweeps in an MLflow experiment; files have none")
        return report_other_runs(runs, said, title=title, source=source, out_dir=args.out, c_min=args.c_min,
                                 from_file=from_file, label=args.label)
    uri = resolve_tracking_uri(args.tracking_uri)
    if sweeps_of(args.experiment, uri):
        if mapped or args.label is not None:
            raise MappingError(f"experiment {args.experiment} holds runs ablate logged, read by their tags (--sweep "
                               "picks a sweep); --reward, --compute, --variant, --base, --r0, --label and --mapping "
                               "are for another trainer's runs")
        return make_report(args.experiment, tracking_uri=uri, out_dir=args.out, sweep=args.sweep, c_min=args.c_min)
    if args.sweep is not None:
        raise MappingError("--sweep picks among ablate's sweeps; with a mapping (or runs ablate did not log), "
                           "--variant selects the runs")
    from analysis.sources import mlflow_runs

    return report_other_runs(mlflow_runs(args.experiment, uri), said, title=args.experiment,
                             source=f"MLflow experiment {args.experiment} at {uri}", out_dir=args.out,
                             c_min=args.c_min, attach=(uri, args.experiment), label=args.label)


def _file_source(args):
    """(runs, title, source, from_file) of the files the arguments name, None for an MLflow experiment. `from_file`:
    a column `reward` is the reward (a table's; in TRL's logs `reward` is the training reward)."""
    if args.file is not None:
        from analysis.tables import read_table

        return read_table(args.file), Path(args.file).stem, f"curves of {args.file}", True
    if args.tensorboard is not None:
        from analysis.tensorboard_runs import read_tensorboard

        where = Path(args.tensorboard)
        return read_tensorboard(where), where.resolve().name, f"TensorBoard event files under {where}", False
    if args.hf_state is not None:
        from analysis.trainer_state import read_trainer_states

        return (read_trainer_states(args.hf_state), _title(args.hf_state),
                f"trainer_state.json of {', '.join(args.hf_state)}", False)
    if args.verl_log is not None:
        from analysis.verl_logs import read_verl_logs

        return read_verl_logs(args.verl_log), _title(args.verl_log), f"verl logs {', '.join(args.verl_log)}", False
    return None


def _title(paths: list[str]) -> str:
    """A report's title for files: the one's stem, or the folder that holds them all."""
    if len(paths) == 1:
        return Path(paths[0]).resolve().stem
    import os

    return Path(os.path.commonpath([str(Path(p).resolve()) for p in paths])).name or "runs"


def _fit(args) -> int:
    from analysis.fit import fit_sigmoid
    from analysis.law import FitError, SigmoidFit

    try:
        text = sys.stdin.read() if args.path == "-" else open(args.path).read()
        data = json.loads(text)
        if not isinstance(data, dict) or "compute" not in data or "reward" not in data:
            raise ValueError('expected an object with "compute" and "reward" lists')
        compute, reward = data["compute"], data["reward"]
        r0, c_min, runs = data.get("r0"), data.get("c_min"), data.get("runs")
        if not isinstance(compute, list) or not isinstance(reward, list):
            raise ValueError('"compute" and "reward" must be lists of numbers')
        compute = [float("nan") if x is None else float(x) for x in compute]
        reward = [float("nan") if x is None else float(x) for x in reward]
        r0 = None if r0 is None else float(r0)
        c_min = None if c_min is None else float(c_min)
    except (OSError, ValueError, TypeError) as err:
        print(f"error: {args.path}: {err}", file=sys.stderr)
        return 2
    try:
        if args.method == "paper":
            if runs is not None:
                print("error: --method paper fits one run: drop \"runs\"", file=sys.stderr)
                return 2
            fit = fit_sigmoid(compute, reward, r0=r0, c_min=c_min, method="paper")
        else:
            fit = fit_sigmoid(compute, reward, r0=r0, c_min=c_min, runs=runs)
    except FitError as err:
        fit = SigmoidFit.failed(err.reason, method=args.method)
    out = fit.to_dict()
    if args.extrapolate is not None and fit.ok:
        from analysis.extrapolate import extrapolation_check

        ex = extrapolation_check(compute, reward, fraction=args.extrapolate, r0=r0, c_min=c_min, runs=runs)
        out["extrapolation"] = {
            "status": ex.status, "fraction": ex.fraction, "fitted_up_to": ex.c_fit, "end": ex.c_end,
            "predicted": ex.predicted, "predicted_ci": list(ex.predicted_ci), "observed": ex.observed,
            "power_law": None if ex.power is None or not ex.power.ok else
            {"A": ex.power.A, "D": ex.power.D, "B": ex.power.B, "predicted": ex.power_predicted},
        }
    print(json.dumps(_clean(out), indent=2, allow_nan=False))
    return 0 if fit.ok else 1


def _clean(x):
    """JSON without NaN or inf: NaN -> null, inf -> "inf" / "-inf"."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, float):
        if x != x:
            return None
        if x in (float("inf"), float("-inf")):
            return "inf" if x > 0 else "-inf"
    return x


if __name__ == "__main__":
    sys.exit(main())
