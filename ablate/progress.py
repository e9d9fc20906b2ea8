"""Progress for long work: a step bar for a run in the foreground, a live table for a local sweep.

On a terminal the display redraws in place; otherwise (CI, a log file) it prints a line when something changes,
at most every `every_s` seconds.
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


def hours(value: float) -> str:
    """Device-hours readable at both scales: 16,000 on a cluster, 0.00944 for a tiny run on a laptop."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = int(width * done / max(total, 1))
    return "#" * filled + "." * (width - filled)


class StepBar:
    """`scalerl [########........] 130/400  val 0.512  1,234 GPU-h  00:12`"""

    def __init__(self, name: str, stream: TextIO | None = None, every_s: float = 0.2):
        # sys.stderr as it is now (a default argument would hold the one of the first import: a closed capture later)
        self.name, self.stream = name, stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s if self.tty else 10.0
        self.started = time.monotonic()
        self.last_print = -1e9
        self.val: Optional[float] = None

    def __reduce__(self):
        """Sent to another process (a trainer rank): a bar of the same name on that process's stderr."""
        return (StepBar, (self.name,))

    def __call__(self, step: int, total: int, metrics: dict) -> None:
        self.val = metrics.get("val/pass_rate", self.val)
        now = time.monotonic()
        if now - self.last_print < self.every_s and step < total:
            return
        self.last_print = now
        val = f"val {self.val:.3f}" if self.val is not None else "val  -   "
        elapsed = int(now - self.started)
        line = (f"{self.name} [{_bar(step, total)}] {step}/{total}  {val}  "
                f"{hours(metrics.get('compute/gpu_hours', 0))} GPU-h  {elapsed // 60:02d}:{elapsed % 60:02d}")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if step >= total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


class SweepDisplay:
    """One row per variant, read from MLflow: state, step, last validation pass rate, compute so far."""

    def __init__(self, client, submission, stream: TextIO | None = None, every_s: float = 2.0):
        self.client, self.submission = client, submission
        self.stream = stream if stream is not None else sys.stderr  # as it is now (StepBar says why)
        self.tty = self.stream.isatty()
        self.every_s = every_s if self.tty else 15.0
        self.last_print, self.lines_drawn = -1e9, 0
        self.started = time.monotonic()
        self.last_rows: list[str] = []

    def rows(self) -> list[str]:
        out = [f"{'variant':<14} {'state':<10} {'step':>11}  {'val':>6}  {'GPU-h':>9}"]
        for it in self.submission.items:
            run_id = it.spec.meta.get("run_id")
            state, step, val, gpu = ("SKIPPED (done)" if it.skipped_as else "SUBMITTED"), "", "", ""
            try:
                run = self.client.get_run(run_id) if run_id else None
            except Exception:  # noqa: BLE001 - the display must never stop the sweep
                run = None
            if run is not None:
                if not it.skipped_as:
                    state = run.info.status
                metrics = {m.key: m for m in run.data._metric_objs}
                if "compute/gpu_hours" in metrics:
                    step, gpu = str(metrics["compute/gpu_hours"].step), hours(metrics['compute/gpu_hours'].value)
                if "val/pass_rate" in metrics:
                    val = f"{metrics['val/pass_rate'].value:.3f}"
            out.append(f"{it.spec.name:<14} {state:<10} {step:>11}  {val:>6}  {gpu:>9}")
        return out

    def update(self, final: bool = False) -> None:
        now = time.monotonic()
        if now - self.last_print < self.every_s and not final:
            return
        self.last_print = now
        rows = self.rows()
        elapsed = int(now - self.started)
        rows.append(f"elapsed {elapsed // 60:02d}:{elapsed % 60:02d}")
        if self.tty:
            if self.lines_drawn:
                self.stream.write(f"\x1b[{self.lines_drawn}F\x1b[J")
            self.stream.write("\n".join(rows) + "\n")
            self.lines_drawn = len(rows)
        elif rows[:-1] != self.last_rows or final:
            self.stream.write("\n".join(rows) + "\n")
        self.last_rows = rows[:-1]
        self.stream.flush()
