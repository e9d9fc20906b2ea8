"""MLflow: one parent run per sweep, one child run per variant, metrics buffered and flushed with log_batch.

Names (docs/design.md#names-users-rely-on): tags ablate.sweep, ablate.variant, ablate.axis, ablate.choice,
ablate.signature, plus ablate.role (sweep | variant); params are the flattened resolved config; metrics are logged at
step = optimizer step.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from analysis.runs import server_problem  # the one check of a server, shared with the report

log = logging.getLogger(__name__)

MAX_METRICS_PER_BATCH = 1000  # MLflow's limit for one log_batch call
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_LENGTH = 6000


class TrackingUnavailable(RuntimeError):
    """The tracking store cannot be reached or written: raised before any job starts."""


def resolve_uri(uri: str) -> str:
    """Make a relative sqlite path absolute, so jobs started from other folders write to the same database."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


def check_reachable(uri: str, timeout_s: float = 5.0) -> str:
    """Fail fast with a clear message when the tracking store does not answer. Returns the resolved URI."""
    uri = resolve_uri(uri)
    if uri.startswith(("http://", "https://")):
        problem = server_problem(uri, timeout_s)
        if problem:
            raise TrackingUnavailable(
                f"MLflow tracking server {uri} {problem}. Start it, fix MLFLOW_TRACKING_URI or tracking.uri, or "
                f"unset it to use a local sqlite database."
            )
    elif uri.startswith("sqlite:///"):
        folder = Path(uri[len("sqlite:///"):]).parent
        if not folder.is_dir():
            raise TrackingUnavailable(f"the folder of the MLflow database {uri} does not exist: {folder}")
        if not os.access(folder, os.W_OK):
            raise TrackingUnavailable(f"the folder of the MLflow database {uri} is not writable: {folder}")
    try:
        client(uri).search_experiments(max_results=1)  # creates and migrates a new sqlite database here, once
    except Exception as err:  # noqa: BLE001 - a refusal of the credentials is said in one line; the rest as is
        said = f"{err} {getattr(err, 'error_code', '')}"
        refused = re.search(r"\b(401|403)\b|UNAUTHENTICATED|PERMISSION_DENIED", said)
        if refused is None:
            raise
        raise TrackingUnavailable(
            f"MLflow tracking server {uri} refused this user ({refused.group(0)}): set MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD to an account with access (docs/cluster.md)") from None
    return uri


def client(uri: str):
    from mlflow.tracking import MlflowClient

    # a new sqlite store's "Creating initial MLflow database tables..." is MLflow's news, not the user's
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=resolve_uri(uri))


def experiment_id(mlflow_client, name: str) -> str:
    """The id of the experiment `name`, made if there is none. Sweeps started side by side into one store may both
    find none: the one whose create then loses takes the other's."""
    from mlflow.exceptions import MlflowException

    experiment = mlflow_client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return mlflow_client.create_experiment(name)
        except MlflowException as err:
            experiment = mlflow_client.get_experiment_by_name(name)
            if err.error_code != "RESOURCE_ALREADY_EXISTS" or experiment is None:
                raise
    if experiment.lifecycle_stage == "deleted":
        raise TrackingUnavailable(f"MLflow experiment '{name}' is deleted; restore it or pick another name")
    return experiment.experiment_id


def _quote(value: str) -> str:
    return "'" + value.replace("'", "\\'") + "'"


def find_runs(mlflow_client, exp_id: str, **tags: str) -> list:
    """Runs of the experiment whose ablate.* tags equal the given values, newest first."""
    terms = [f"tags.`ablate.{key}` = {_quote(value)}" for key, value in tags.items()]
    return mlflow_client.search_runs(
        [exp_id], filter_string=" and ".join(terms), order_by=["attributes.start_time DESC"], max_results=1000
    )


def find_finished(mlflow_client, exp_id: str, signature: str):
    """The newest FINISHED variant run with this signature, or None."""
    for run in find_runs(mlflow_client, exp_id, signature=signature, role="variant"):
        if run.info.status == "FINISHED":
            return run
    return None


def sweep_parent(mlflow_client, exp_id: str, sweep_id: str, tags: Mapping[str, str]) -> str:
    """The parent run of this sweep: found by its id (a re-run of the same sweep reuses it), else created."""
    existing = find_runs(mlflow_client, exp_id, sweep=sweep_id, role="sweep")
    if existing:
        run_id = existing[0].info.run_id
        if existing[0].info.status != "RUNNING":
            mlflow_client.update_run(run_id, status="RUNNING")
        return run_id
    run = mlflow_client.create_run(
        exp_id, run_name=sweep_id, tags={"ablate.role": "sweep", "ablate.sweep": sweep_id, **tags}
    )
    return run.info.run_id


def create_variant_run(mlflow_client, exp_id: str, name: str, tags: Mapping[str, str],
                       parent_run_id: Optional[str] = None) -> str:
    """A child run for one variant, SCHEDULED until its job starts it."""
    all_tags = {"ablate.role": "variant", **tags}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    run = mlflow_client.create_run(exp_id, run_name=name, tags=all_tags)
    mlflow_client.update_run(run.info.run_id, status="SCHEDULED")
    return run.info.run_id


def param_key(key: str) -> str:
    """An MLflow-legal param name: `generator.effects.loss=dapo.A` -> `generator.effects.loss:dapo.A`."""
    return re.sub(r"[^\w\-. :/]", "_", key.replace("=", ":"))[:250]


class RunLogger:
    """Buffers metrics and params of one run and writes them with log_batch.

    A flush happens every `flush_every` points or `flush_seconds`, and at close. A store that fails is retried; if it
    still fails, the points are appended to `spill_path` (JSON lines) so that nothing already measured is lost.
    """

    def __init__(self, uri: str, run_id: str, flush_every: int = 200, flush_seconds: float = 10.0,
                 spill_path: Optional[Path] = None, retries: int = 3):
        self.uri, self.run_id = resolve_uri(uri), run_id
        self.client = client(self.uri)
        self.flush_every, self.flush_seconds, self.retries = flush_every, flush_seconds, retries
        self.spill_path = spill_path
        self._metrics: list = []
        self._last_flush = time.monotonic()
        self._logged_through: dict[str, int] = {}  # after a resume: per key, the last step already in the store

    def status(self) -> str:
        """The run's status in the store: SCHEDULED, RUNNING, FINISHED, FAILED or KILLED."""
        return self.client.get_run(self.run_id).info.status

    def mark_running(self) -> None:
        """The run's setup is done: it is RUNNING."""
        self.client.update_run(self.run_id, status="RUNNING")

    def resume(self) -> dict[str, float]:
        """For a run continued by a new process: from now on, skip points at steps the store already holds (what
        the previous process logged after its last checkpoint). Returns each metric's last logged value."""
        last: dict[str, float] = {}
        for key in self.client.get_run(self.run_id).data.metrics:
            history = self.client.get_metric_history(self.run_id, key)
            if history:
                newest = max(history, key=lambda m: (m.step, m.timestamp))
                self._logged_through[key], last[key] = newest.step, newest.value
        return last

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._metrics.extend(Metric(key, float(value), now, int(step)) for key, value in metrics.items()
                             if step > self._logged_through.get(key, -1))
        if len(self._metrics) >= self.flush_every or time.monotonic() - self._last_flush > self.flush_seconds:
            self.flush()

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(param_key(k), (json.dumps(v) if isinstance(v, (list, dict)) else str(v))[:MAX_PARAM_LENGTH])
                 for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self._write(params=items[i:i + MAX_PARAMS_PER_BATCH])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, value)

    def flush(self) -> None:
        pending, self._metrics = self._metrics, []
        self._last_flush = time.monotonic()
        for i in range(0, len(pending), MAX_METRICS_PER_BATCH):
            self._write(metrics=pending[i:i + MAX_METRICS_PER_BATCH])

    def _write(self, metrics: Iterable = (), params: Iterable = ()) -> None:
        metrics, params = list(metrics), list(params)
        for attempt in range(self.retries):
            try:
                self.client.log_batch(self.run_id, metrics=metrics, params=params, synchronous=True)
                return
            except Exception as err:  # noqa: BLE001 - any store error: retry, then spill
                if getattr(err, "error_code", None) == "INVALID_PARAMETER_VALUE":
                    raise  # a bug in what we log, not a store that is down: retrying cannot help
                last = err
                time.sleep(min(2.0 ** attempt, 10.0))
        self._spill(metrics, params, last)

    def _spill(self, metrics: list, params: list, err: Exception) -> None:
        if self.spill_path is None:
            raise TrackingUnavailable(f"could not write to MLflow run {self.run_id} at {self.uri}: {err}")
        self.spill_path.parent.mkdir(parents=True, exist_ok=True)
        with self.spill_path.open("a") as f:
            for m in metrics:
                f.write(json.dumps({"key": m.key, "value": m.value, "step": m.step, "timestamp": m.timestamp}) + "\n")
            for p in params:
                f.write(json.dumps({"param": p.key, "value": p.value}) + "\n")
        log.warning("MLflow write failed (%s); %d points kept in %s", err, len(metrics) + len(params), self.spill_path)

    def close(self, status: str) -> None:
        """Flush what is buffered and mark the run FINISHED, FAILED or KILLED."""
        try:
            self.flush()
        finally:
            self.client.set_terminated(self.run_id, status=status)
