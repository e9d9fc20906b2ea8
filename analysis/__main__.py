"""python -m analysis report --experiment NAME [--tracking-uri URI] [--out DIR] [--sweep ID]

Exit codes: 0 ok; 2 bad input (unknown experiment, no runs, tracking store unreachable), one line on stderr.
"""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help="fit, rank and report the variant runs of an MLflow experiment")
    report.add_argument("--experiment", required=True, help="MLflow experiment name (one study)")
    report.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    report.add_argument("--out", default=None, help="output directory (default: reports/<experiment>)")
    report.add_argument("--sweep", default=None, help="only the runs of this sweep id (tag ablate.sweep)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from analysis.report import make_report
    from analysis.runs import AnalysisError

    try:
        report = make_report(args.experiment, tracking_uri=args.tracking_uri, out_dir=args.out, sweep=args.sweep)
    except AnalysisError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report.table_md)
    print()
    for path in report.paths:
        print(f"wrote {path}")
    if report.artifact_run_id:
        print(f"attached to MLflow run {report.artifact_run_id} under report/")
    if report.artifact_error:
        print(f"warning: {report.artifact_error}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
