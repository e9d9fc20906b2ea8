"""MLflow tracking against a real sqlite database: buffering, dead servers, nothing lost on failure."""

from __future__ import annotations

import json
import socket
import time

import pytest

from ablate import tracking
from conftest import run_cli


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is: nothing listens there


def test_metrics_are_buffered_and_flushed_in_batches(mlflow_uri, monkeypatch):
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "e"), "v", {"ablate.variant": "v"})
    logger = tracking.RunLogger(mlflow_uri, run_id, flush_every=50, flush_seconds=1e9)
    calls = []
    original = logger.client.log_batch
    monkeypatch.setattr(logger.client, "log_batch", lambda *a, **k: (calls.append(len(k["metrics"])), original(*a, **k)))
    for step in range(60):  # 2 metrics per step: 120 points -> flushes at 50 and 100, the rest (20) at close
        logger.log_metrics({"a/x": step, "b/y": 2 * step}, step=step)
    assert calls == [50, 50]
    logger.close("FINISHED")
    assert calls == [50, 50, 20]
    history = client.get_metric_history(run_id, "b/y")
    assert [(m.step, m.value) for m in history] == [(s, 2.0 * s) for s in range(60)]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_params_with_illegal_characters_are_renamed_not_rejected(mlflow_uri):
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "e"), "v", {})
    logger = tracking.RunLogger(mlflow_uri, run_id)
    logger.log_params({"generator.effects.loss=dapo.A": -0.06, **{f"p{i}": i for i in range(150)}})
    params = client.get_run(run_id).data.params
    assert params["generator.effects.loss:dapo.A"] == "-0.06" and len(params) == 151


def test_a_dead_tracking_server_is_reported_fast_and_clearly():
    uri = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    with pytest.raises(tracking.TrackingUnavailable, match="does not answer"):
        tracking.check_reachable(uri, timeout_s=2)
    assert time.monotonic() - started < 5


def test_a_server_that_refuses_the_user_is_reported_in_one_line():
    """A server behind MLflow's basic-auth app answers /health to anyone and 401 to an unknown user's API call."""
    import http.server
    import threading

    class Guarded(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = (200, b"OK") if self.path == "/health" else (401, b"You are not authenticated.")
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Guarded)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(tracking.TrackingUnavailable, match=r"refused this user \(401\): set "
                                                                r"MLFLOW_TRACKING_USERNAME"):
            tracking.check_reachable(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=2)
    finally:
        server.shutdown()


def test_a_missing_database_folder_is_reported(tmp_path):
    with pytest.raises(tracking.TrackingUnavailable, match="does not exist"):
        tracking.check_reachable(f"sqlite:///{tmp_path}/nope/mlflow.db")


def test_cli_with_a_dead_server_fails_before_any_job(tmp_path):
    uri = f"http://127.0.0.1:{_closed_port()}"
    out = run_cli("-m", "ablate", "sweep=loo", "launcher=local", env={"MLFLOW_TRACKING_URI": uri}, cwd=tmp_path)
    assert out.returncode == 2
    assert uri in out.stderr and "does not answer" in out.stderr
    assert not (tmp_path / "outputs" / "tiny" / "jobs").exists()  # nothing was submitted


def test_points_the_store_refuses_are_spilled_to_a_file_not_lost(mlflow_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's own retries back off for minutes
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "e"), "v", {})
    logger = tracking.RunLogger(mlflow_uri, run_id, flush_every=1000, spill_path=tmp_path / "spill.jsonl",
                                retries=2)
    logger.log_metrics({"val/pass_rate": 0.25}, step=3)
    logger.uri = f"http://127.0.0.1:{_closed_port()}"  # the server goes away mid-run
    logger.client = tracking.client(logger.uri)
    logger.flush()
    rows = [json.loads(line) for line in (tmp_path / "spill.jsonl").read_text().splitlines()]
    assert rows == [{"key": "val/pass_rate", "value": 0.25, "step": 3, "timestamp": rows[0]["timestamp"]}]


def test_two_sweeps_that_both_find_no_experiment_share_the_one_the_first_made(mlflow_uri):
    """The race of sweeps started side by side into one store (seen in CI: three mock sweeps, `Experiment(name=
    mock-truth) already exists`): both look, find none, both create; the loser takes the winner's experiment."""
    winner = tracking.client(mlflow_uri)
    made = tracking.experiment_id(winner, "side-by-side")

    class Late:  # looked before the winner's create landed, created after it
        def __init__(self, client):
            self.client, self.looked = client, False

        def get_experiment_by_name(self, name):
            if not self.looked:
                self.looked = True
                return None
            return self.client.get_experiment_by_name(name)

        def create_experiment(self, name):
            return self.client.create_experiment(name)

    assert tracking.experiment_id(Late(tracking.client(mlflow_uri)), "side-by-side") == made
    assert [e.name for e in winner.search_experiments()].count("side-by-side") == 1
