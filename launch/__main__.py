"""`python -m launch status [--sweep ID] [--watch]` and `python -m launch cancel [--sweep ID]`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from launch import status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("status", "where each job of a sweep stands"), ("cancel", "cancel every live job of a sweep")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--sweep", help="sweep id (e.g. loo-3fa2c1); default: the newest")
        p.add_argument("--outputs", type=Path, default=Path("outputs"), help="where the studies' outputs are")
        if name == "status":
            p.add_argument("--watch", action="store_true", help="refresh every few seconds until every job ends")
            p.add_argument("--every", type=float, default=5.0, help="seconds between refreshes with --watch")
    args = parser.parse_args(argv)
    try:
        path, manifest = status.load_manifest(args.sweep, args.outputs)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.command == "cancel":
        cancelled = status.cancel(manifest)
        print(f"cancelled {len(cancelled)} job(s) of sweep {path.parent.name}: {' '.join(cancelled) or '-'}")
        return 0
    while True:
        table = status.rows(manifest)
        print(status.render(path, manifest, table), flush=True)
        if not args.watch or all(r.state not in ("pending", "running", "requeued") for r in table):
            return 1 if any(r.state == "failed" for r in table) else 0
        time.sleep(args.every)
        print()


if __name__ == "__main__":
    sys.exit(main())
