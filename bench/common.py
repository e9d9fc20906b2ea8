"""Shared by the trainer benchmarks: run the real trainer in this process, into a throwaway MLflow database, and
collect each step's metrics with the wall-clock time it ended at."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ablate import tracking
from ablate.config import compose
from ablate.trainer import train


def run_trainer(overrides: list[str], folder: str | None = None) -> dict:
    """Train one run with `overrides`; returns {"cfg", "steps": [(seconds since start, metrics)], "wall_s",
    "val": [(step, compute, pass rate)]}."""
    folder = folder or tempfile.mkdtemp(prefix="ablate-bench-")
    uri = f"sqlite:///{folder}/mlflow.db"
    cfg = compose([*overrides, f"paths.outputs={folder}/outputs"])
    client = tracking.client(uri)
    tracking.check_reachable(uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "bench"), "bench", {})
    steps: list[tuple[float, dict]] = []
    started = time.perf_counter()
    train(cfg, run_id, uri, progress=lambda step, total, metrics: steps.append((time.perf_counter(), metrics)))
    wall = time.perf_counter() - started
    history = {m.step: m.value for m in client.get_metric_history(run_id, "val/pass_rate")}
    compute = {m.step: m.value for m in client.get_metric_history(run_id, "compute/gpu_hours")}
    val = [(step, compute.get(step, 0.0), history[step]) for step in sorted(history)]
    return {"cfg": cfg, "steps": [(t - started, m) for t, m in steps], "wall_s": wall, "val": val,
            "folder": Path(folder)}
