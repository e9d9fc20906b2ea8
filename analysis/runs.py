"""Load the variant runs of a study from MLflow as plain curves: (step, compute, pass rate) per run.

The contract (written by `ablate`, ablate/tracking.py): one experiment per study; a sweep parent run tagged
ablate.role=sweep; variant runs tagged ablate.role=variant, ablate.sweep, ablate.variant, ablate.axis,
ablate.choice, ablate.signature, with mlflow.parentRunId set when launched by a sweep. Metrics at integer
step = optimizer step: `val/pass_rate` (step 0 = the pre-RL pass rate) and `compute/gpu_hours` (cumulative).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Collection

import numpy as np

PASS_RATE = "val/pass_rate"
COMPUTE = "compute/gpu_hours"
END_REASON_TAG = "ablate.stopped_early"  # why a FINISHED run stopped before train.steps (the trainer's reason)
SETTLED_TAG = "ablate.settled_at"  # the step at which an adaptive sweep stopped the run, its verdict settled
EXTENDED_TAG = "ablate.extended_from"  # the step whose checkpoint `sweep.extend=true` took the run on from
UNTESTABLE_TAG = "ablate.untestable"  # why a variant's axis cannot show its effect at this scale (the sweep's)
ALL_SWEEPS = "all"  # `--sweep all`: every sweep of the experiment
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
HEALTH_TIMEOUT_S = 5.0


class AnalysisError(ValueError):
    """Bad input for an analysis (unknown experiment, no runs, unreachable tracking store): the CLI exits 2."""


class ExperimentNotFound(AnalysisError):
    pass


class NoRuns(AnalysisError):
    pass


class TrackingUnavailable(AnalysisError):
    pass


@dataclass
class RunCurve:
    """One variant run and its validation curve; compute[i] is the GPU-hours at step[i] (joined on step)."""

    run_id: str
    run_name: str
    variant: str
    axis: str
    choice: str
    signature: str
    status: str  # FINISHED, FAILED, RUNNING, KILLED
    sweep: str
    parent_run_id: str | None
    step: np.ndarray = field(repr=False)
    compute: np.ndarray = field(repr=False)
    pass_rate: np.ndarray = field(repr=False)
    notes: tuple[str, ...] = ()
    params: dict = field(default_factory=dict, repr=False)  # the run's MLflow params (the flattened config)
    last_step: int = 0  # the last optimizer step it logged (any metric)
    tags: dict = field(default_factory=dict, repr=False)
    unit: str = "GPU-hours"  # what compute counts: GPU-hours for ablate's runs; another trainer's may be steps

    @property
    def c_max(self) -> float:
        """The compute of its last validation point (0 before any)."""
        return float(self.compute.max(initial=0.0))

    def upto(self, compute: float) -> RunCurve:
        """The same run with its points up to `compute` GPU-hours (what it had logged when it got there)."""
        keep = self.compute <= compute * (1 + 1e-9)
        return replace(self, step=self.step[keep], compute=self.compute[keep], pass_rate=self.pass_rate[keep])

    @property
    def planned_steps(self) -> int | None:
        """train.steps of its config (None when not logged)."""
        try:
            return int(float(self.params["train.steps"]))
        except (KeyError, ValueError):
            return None

    @property
    def untestable(self) -> str:
        """Why its axis cannot show an effect at this scale (tag ablate.untestable, set by the sweep), or ""."""
        return self.tags.get(UNTESTABLE_TAG, "")

    @property
    def incomplete(self) -> str:
        """Why the run cannot be compared with finished ones, or "": not FINISHED ("FAILED at step 730 of 1,000"),
        or FINISHED short of its configured steps ("truncated at step 730 of 1,000", with the reason the trainer
        tagged, ablate.stopped_early, when there is one)."""
        planned = self.planned_steps
        of = f" of {planned:,}" if planned else ""
        if self.status != "FINISHED":
            return f"{self.status} at step {self.last_step:,}{of}"
        if planned and self.last_step < planned and SETTLED_TAG not in self.tags:  # settled: complete where it is
            reason = self.tags.get(END_REASON_TAG)
            return f"truncated at step {self.last_step:,}{of}" + (f": {reason}" if reason else "")
        return ""


def server_problem(uri: str, timeout_s: float = HEALTH_TIMEOUT_S) -> str | None:
    """What is wrong with the MLflow server at an http(s) URI ("does not answer (...)"), or None when /health is ok.

    Asked before anything else: MLflow's own client retries a dead server for minutes.
    """
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return None if response.status == 200 else f"answered {response.status} on /health"
    except (urllib.error.URLError, OSError) as err:
        return f"does not answer ({url}: {getattr(err, 'reason', err)})"


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """The argument, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory."""
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def check_tracking_uri(uri: str, timeout: float = HEALTH_TIMEOUT_S) -> None:
    """Fail fast instead of letting MLflow retry for minutes or create an empty database.

    http(s): GET <uri>/health with a short timeout. sqlite: the database file must exist (MLflow would otherwise
    create a fresh one, silently, wherever the command was run)."""
    if uri.startswith(("http://", "https://")):
        problem = server_problem(uri, timeout)
        if problem:
            raise TrackingUnavailable(f"MLflow tracking server {uri} {problem}")
    elif uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):].split("?", 1)[0]
        if path and path != ":memory:" and not Path(path).exists():
            raise TrackingUnavailable(f"no MLflow database at {Path(path).resolve()} (tracking URI {uri})")


def load_runs(
    experiment: str, tracking_uri: str | None = None, sweep: str | None = None, run_ids: Collection[str] | None = None
) -> list[RunCurve]:
    """The variant runs of `experiment` (optionally of one sweep id, or only `run_ids`), oldest first, with curves.

    `run_ids`, when given, selects alone: a sweep that reused a FINISHED run of another sweep lists it there.

    Deleted runs and sweep parents are left out; runs of any status are kept (the status is on the curve)."""
    client = _client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ExperimentNotFound(
            f"experiment {experiment!r} not found at {client.tracking_uri}; experiments there: "
            + (", ".join(names) if names else "none")
        )
    searched = _search_all(client, exp.experiment_id, None if run_ids is not None else sweep)
    runs = [run for run in searched if _is_variant(run.data.tags)]
    if run_ids is not None:
        wanted = set(run_ids)
        runs = [run for run in runs if run.info.run_id in wanted]
    runs.sort(key=lambda run: run.info.start_time or 0)
    return [_curve(client, run) for run in runs]


def load_curve(client, run_id: str) -> RunCurve:
    """One run and its curve, as it is in the store now (a running run's points so far)."""
    return _curve(client, client.get_run(run_id))


SINGLE = "none"  # the ablate.sweep tag of a run launched alone (`python -m ablate`), not by a sweep


@dataclass(frozen=True)
class SweepSeen:
    """One sweep of an experiment, as a report picks among them: its id (tag ablate.sweep; SINGLE: the runs
    launched alone; None: runs not logged by ablate), how many variant runs it has, and when the newest started."""

    id: str | None
    runs: int
    started: int  # ms since the epoch: the start of its newest variant run

    @property
    def single(self) -> bool:
        """Runs launched one at a time, not by a sweep (or not by ablate)."""
        return self.id in (SINGLE, None)

    @property
    def text(self) -> str:
        """ "sweep loo-807177 (9 runs)", "1 run launched alone (--sweep none)"."""
        n = f"{self.runs} run{'s' if self.runs != 1 else ''}"
        if self.id == SINGLE:
            return f"{n} launched alone (--sweep {SINGLE})"
        return f"{n} without a sweep tag" if self.id is None else f"sweep {self.id} ({n})"


def sweeps_of(experiment: str, tracking_uri: str | None = None) -> list[SweepSeen]:
    """The sweeps of `experiment`'s variant runs, the newest first (by their newest run); [] when the experiment
    does not exist (load_runs says so) or has no variant run."""
    client = _client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    seen: dict[str | None, list[int]] = {}
    for run in _search_all(client, exp.experiment_id, None):
        if _is_variant(run.data.tags):
            seen.setdefault(run.data.tags.get("ablate.sweep"), []).append(run.info.start_time or 0)
    found = [SweepSeen(id=key, runs=len(starts), started=max(starts)) for key, starts in seen.items()]
    return sorted(found, key=lambda s: s.started, reverse=True)


def pick_sweep(sweeps: list[SweepSeen]) -> SweepSeen | None:
    """The sweep a report takes by default: the newest sweep; runs launched alone only when there is no sweep (a
    lone run beside a sweep is seldom what the report was asked for: docs/analysis.md#which-runs)."""
    return next((s for s in sweeps if not s.single), sweeps[0] if sweeps else None)


def latest_sweep(experiment: str, tracking_uri: str | None = None) -> str | None:
    """The id of the sweep a report takes by default (`pick_sweep`); None when there is none, or its runs have no
    sweep tag (runs not logged by ablate: all are reported), or the experiment does not exist (load_runs says
    so)."""
    picked = pick_sweep(sweeps_of(experiment, tracking_uri))
    return picked.id if picked is not None else None


def find_sweep_parent(experiment: str, sweep: str, tracking_uri: str | None = None) -> str | None:
    """The run id of the parent run of `sweep` (tags ablate.role=sweep, ablate.sweep=sweep), or None."""
    client = _client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    query = f"tags.`ablate.role` = 'sweep' and tags.`ablate.sweep` = '{_quote(sweep)}'"
    found = client.search_runs([exp.experiment_id], filter_string=query, max_results=1)
    return found[0].info.run_id if found else None


# --- helpers ---------------------------------------------------------------------------------------------------


def _client(tracking_uri: str | None):
    from mlflow.tracking import MlflowClient

    uri = resolve_tracking_uri(tracking_uri)
    check_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri)


def _quote(value: str) -> str:
    return value.replace("'", "\\'")


def _search_all(client, experiment_id: str, sweep: str | None) -> list:
    query = f"tags.`ablate.sweep` = '{_quote(sweep)}'" if sweep else ""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=query, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _is_variant(tags: dict) -> bool:
    """Variant runs are tagged role=variant; a single run (no sweep) may carry only ablate.variant."""
    role = tags.get("ablate.role")
    return role == "variant" or (role is None and "ablate.variant" in tags)


def _history(client, run_id: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of a metric, sorted by step; of repeated steps (a restart re-logging) the last logged wins."""
    latest: dict[int, tuple[int, float]] = {}
    for m in client.get_metric_history(run_id, key):
        if m.step not in latest or m.timestamp >= latest[m.step][0]:
            latest[m.step] = (m.timestamp, m.value)
    steps = np.array(sorted(latest), dtype=np.int64)
    values = np.array([latest[s][1] for s in steps], dtype=float)
    return steps, values


def _join_on_step(val_steps, val, comp_steps, comp) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """Compute at each validation step: exact where logged, else linear in step between the neighbouring compute
    entries. Step 0 is compute 0 by definition. A validation step past the last compute entry by at most one
    logging interval (the final validation of a run) is extrapolated from the last segment; later ones are dropped."""
    if 0 not in comp_steps:
        order = np.argsort(np.append(0, comp_steps))
        comp_steps, comp = np.append(0, comp_steps)[order], np.append(0.0, comp)[order]
    last = comp_steps[-1]
    gap = int(np.median(np.diff(comp_steps))) if comp_steps.size > 1 else 0
    known = (val_steps >= 0) & (val_steps <= last + gap)
    notes = ()
    if not known.all():
        notes = (f"{int((~known).sum())} validation points past the last compute entry were dropped",)
    steps = val_steps[known]
    compute = np.interp(steps, comp_steps, comp)
    if comp_steps.size > 1:
        rate = (comp[-1] - comp[-2]) / (comp_steps[-1] - comp_steps[-2])
        compute = np.where(steps > last, comp[-1] + (steps - last) * rate, compute)
    return steps, compute, val[known], notes


def _curve(client, run) -> RunCurve:
    tags = run.data.tags
    val_steps, val = _history(client, run.info.run_id, PASS_RATE)
    comp_steps, comp = _history(client, run.info.run_id, COMPUTE)
    step, compute, pass_rate, notes = _join_on_step(val_steps, val, comp_steps, comp)
    last_step = int(max(val_steps.max(initial=0), comp_steps.max(initial=0)))
    return RunCurve(
        run_id=run.info.run_id,
        run_name=run.info.run_name or "",
        variant=tags.get("ablate.variant") or run.info.run_name or run.info.run_id[:8],
        axis=tags.get("ablate.axis", ""),
        choice=tags.get("ablate.choice", ""),
        signature=tags.get("ablate.signature", ""),
        status=run.info.status,
        sweep=tags.get("ablate.sweep", "none"),
        parent_run_id=tags.get("mlflow.parentRunId"),
        step=step,
        compute=compute,
        pass_rate=pass_rate,
        notes=notes,
        params=dict(run.data.params),
        last_step=last_step,
        tags=dict(tags),
    )


# --- what may be compared --------------------------------------------------------------------------------------

# The params that make two runs' curves comparable: the same model, task and generator. (model.device says where
# it ran, not what.)
SETUP_KEYS = ("task.name", "generator.name")
SETUP_PREFIXES = ("model.",)
SETUP_IGNORED = ("model.device",)


class NotComparable(AnalysisError):
    """The runs of one report differ in model, task or generator."""


def setup_of(curve: RunCurve) -> dict:
    """The params that must agree for curves to be ranked together (empty for a run without logged params)."""
    return {k: v for k, v in curve.params.items()
            if (k in SETUP_KEYS or k.startswith(SETUP_PREFIXES)) and k not in SETUP_IGNORED}


def check_comparable(curves: list[RunCurve]) -> None:
    """Raise NotComparable naming the params that differ and which runs (by sweep) have which value. Runs
    without params are not checked."""
    setups = [(curve, setup_of(curve)) for curve in curves if curve.params]
    keys = sorted({k for _, setup in setups for k in setup})
    differ = [k for k in keys if len({setup.get(k) for _, setup in setups}) > 1]
    if not differ:
        return
    described = []
    for key in differ[:3]:
        values: dict[str, set] = {}
        for curve, setup in setups:
            values.setdefault(str(setup.get(key, "(not set)")), set()).add(curve.sweep)
        described.append(f"{key}: " + "; ".join(f"{value} (sweep {', '.join(sorted(sweeps))})"
                                                for value, sweeps in sorted(values.items())))
    more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
    raise NotComparable(f"these runs differ in {', '.join(differ[:3])}{more} and cannot be ranked together: "
                        + " | ".join(described) + ". Report one at a time with --sweep ID")


# --- seeds of one variant --------------------------------------------------------------------------------------

# Params that say how or where a run ran, or describe it, not what it computes: they may differ between seeds.
# (ablate.schema.NON_SEMANTIC_KEYS, plus the seed and the mock generator's per-run description.)
NON_SEMANTIC_PREFIXES = ("name", "paths", "launcher", "tracking", "sweep", "axes", "seed", "mock", "hydra")


def semantic_params(params: dict) -> tuple:
    """The params that decide what a run computes, apart from its seed, as a hashable key."""
    return tuple(sorted((k, v) for k, v in params.items() if k.split(".", 1)[0] not in NON_SEMANTIC_PREFIXES))


def group_seeds(curves: list[RunCurve]) -> list[list[RunCurve]]:
    """Runs that are seeds of one variant, grouped (in order of first appearance).

    Seeds of one variant: the same `ablate.variant` tag and the same params apart from the seed and non-semantic
    keys. Runs without logged params cannot be compared that way: they are grouped by variant within one sweep."""
    groups: dict[tuple, list[RunCurve]] = {}
    for curve in curves:
        key = (curve.variant, semantic_params(curve.params)) if curve.params else (curve.variant, "sweep", curve.sweep)
        groups.setdefault(key, []).append(curve)
    return [_latest_per_signature(group) for group in groups.values()]


def _latest_per_signature(group: list[RunCurve]) -> list[RunCurve]:
    """Of runs with the same signature (the same config and seed: a relaunch), keep one: the last FINISHED one,
    else the last one. Its earlier attempts would count the same trajectory twice."""
    keep: dict[str, RunCurve] = {}
    for curve in group:  # oldest first
        key = curve.signature or curve.run_id
        held = keep.get(key)
        if held is None or curve.status == "FINISHED" or held.status != "FINISHED":
            keep[key] = curve
    return [curve for curve in group if keep.get(curve.signature or curve.run_id) is curve]
