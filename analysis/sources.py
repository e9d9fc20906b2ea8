"""Runs as another trainer logged them, before any mapping: a name, tags, params, and step-indexed metrics.

`SourceRun` is what every source gives (an MLflow experiment of any trainer: `mlflow_runs`; a file of curves:
analysis/tables.py); analysis/mapping.py says which metric is the reward, what compute is and which runs are which
variant, and turns them into the curves the report fits. Reading other trainers' runs: docs/bring-your-own-runs.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from analysis.runs import ExperimentNotFound, NoRuns, _client, _search_all

REPORT_ROLE_TAG = "analysis.role"  # a run the analysis made to hold a report (never a run to fit)
REPORT_ROLE = "report"


@dataclass(frozen=True)
class Series:
    """One metric of one run: its values at integer steps (sorted, one value a step), and when each was logged
    (seconds since the epoch; None where the source has no clock, as a file of curves)."""

    step: np.ndarray
    value: np.ndarray
    time: np.ndarray | None = None

    def __post_init__(self):
        if self.step.shape != self.value.shape or (self.time is not None and self.time.shape != self.step.shape):
            raise ValueError(f"a series needs as many steps as values (and times): {self.step.shape}, "
                             f"{self.value.shape}")


@dataclass
class SourceRun:
    """One run of a source. `metrics` lists the names it logged; `history(name)` loads one (an MLflow source
    fetches it when asked: an experiment's runs may log hundreds of metrics, the report reads two or three)."""

    id: str
    name: str
    metrics: tuple[str, ...]
    load: Callable[[str], Series] = field(repr=False)
    tags: dict = field(default_factory=dict, repr=False)
    params: dict = field(default_factory=dict, repr=False)
    status: str = "FINISHED"
    start_time: float | None = None  # seconds since the epoch (MLflow's run start), None where unknown
    loaded: dict = field(default_factory=dict, repr=False, compare=False)  # name -> Series, each loaded once

    def history(self, name: str) -> Series:
        """The metric `name`, loaded at its first call (an MLflow source's fetch) and kept for the next."""
        if name not in self.loaded:
            self.loaded[name] = self.load(name)
        return self.loaded[name]


def series_of(points) -> Series:
    """A Series from (step, value, time) triples in any order (time None where the source has no clock); of
    repeated steps (a restart logging a step again) the one logged last wins (the last given where there are no
    times)."""
    points = list(points)
    latest: dict[int, tuple[float, int, float]] = {}
    for order, (step, value, time) in enumerate(points):
        key = (time if time is not None else 0.0, order)
        held = latest.get(int(step))
        if held is None or key >= held[:2]:
            latest[int(step)] = (key[0], key[1], float(value))
    steps = np.array(sorted(latest), dtype=np.int64)
    values = np.array([latest[s][2] for s in steps], dtype=float)
    clocked = any(time is not None for _, _, time in points)
    times = np.array([latest[s][0] for s in steps], dtype=float) if clocked else None
    return Series(step=steps, value=values, time=times)


def mlflow_runs(experiment: str, tracking_uri: str | None = None) -> list[SourceRun]:
    """The runs of an MLflow experiment, whoever logged them, oldest first: every run but the deleted ones, the
    runs the analysis made to hold its reports, ablate's sweep parents, and runs that logged no metric (a parent of
    nested runs holds no curve)."""
    client = _client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ExperimentNotFound(f"experiment {experiment!r} not found at {client.tracking_uri}; experiments there: "
                                 + (", ".join(names) if names else "none"))
    found = [run for run in _search_all(client, exp.experiment_id, None)
             if run.data.tags.get(REPORT_ROLE_TAG) != REPORT_ROLE and run.data.tags.get("ablate.role") != "sweep"
             and run.data.metrics]
    if not found:
        raise NoRuns(f"experiment {experiment!r} at {client.tracking_uri} has no run with a logged metric")
    found.sort(key=lambda run: run.info.start_time or 0)

    def loader(run_id: str) -> Callable[[str], Series]:
        return lambda name: series_of([(m.step, m.value, m.timestamp / 1000.0)
                                       for m in client.get_metric_history(run_id, name)])

    return [SourceRun(id=run.info.run_id, name=run.info.run_name or run.info.run_id[:8],
                      metrics=tuple(sorted(run.data.metrics)), load=loader(run.info.run_id),
                      tags=dict(run.data.tags), params=dict(run.data.params), status=run.info.status,
                      start_time=(run.info.start_time / 1000.0) if run.info.start_time else None)
            for run in found]
