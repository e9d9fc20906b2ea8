"""`python -m launch status`: where each job of a sweep stands, from its manifest, the scheduler and the tracking store.

The manifest (outputs/<study>/jobs/<sweep>/manifest.json, written at submission) names each variant's job id and
MLflow run id, the tracking URI and the metrics worth showing; SLURM's accounting (sacct) says each job's state;
MLflow says how far its run got. A failed job shows the end of its traceback.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ALIVE = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING", "REQUEUE_HOLD",
         "REQUEUE_FED"}
SHOWN = {"PENDING": "pending", "RUNNING": "running", "COMPLETED": "completed", "FAILED": "failed",
         "CANCELLED": "cancelled", "TIMEOUT": "timeout", "REQUEUED": "requeued", "NODE_FAIL": "failed",
         "OUT_OF_MEMORY": "failed", "PREEMPTED": "requeued", "BOOT_FAIL": "failed", "DEADLINE": "failed"}


def find_manifests(root: Path = Path("outputs")) -> list[Path]:
    """Every sweep manifest under root, newest first."""
    return sorted(root.glob("*/jobs/*/manifest.json"), key=lambda p: p.stat().st_mtime, reverse=True)


def load_manifest(sweep: Optional[str] = None, root: Path = Path("outputs")) -> tuple[Path, dict]:
    manifests = find_manifests(root)
    if sweep:
        manifests = [m for m in manifests if m.parent.name == sweep]
    if not manifests:
        known = ", ".join(sorted({m.parent.name for m in find_manifests(root)})) or "none"
        what = f"sweep '{sweep}'" if sweep else "any sweep"
        raise FileNotFoundError(f"no manifest for {what} under {root.resolve()} (sweeps there: {known})")
    return manifests[0], json.loads(manifests[0].read_text())


def slurm_states(job_ids: list[str]) -> dict[str, str]:
    """SLURM state per job id (array tasks as 123_4), from sacct; squeue for jobs sacct does not know yet."""
    ids = sorted({j for j in job_ids if j})
    if not ids or shutil.which("sacct") is None:
        return {}
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(ids)],
                         capture_output=True, text=True, timeout=60)
    states = {}
    for line in out.stdout.splitlines():
        job, _, state = line.partition("|")
        states[job.strip()] = state.split()[0] if state.strip() else "UNKNOWN"
    missing = [j for j in ids if j not in states]
    if missing and shutil.which("squeue"):  # submitted a moment ago: the controller knows it, accounting not yet
        queued = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T"], capture_output=True, text=True, timeout=60)
        for line in queued.stdout.splitlines():
            job, _, state = line.partition("|")
            if job.strip() in missing:
                states[job.strip()] = state.strip()
    return states


def pending_reasons(job_ids: list[str]) -> dict[str, str]:
    """Why SLURM holds each of these jobs pending (squeue's reason: Priority, Resources, BeginTime, PartitionConfig,
    ...), for the pending ones; empty where squeue does not answer."""
    ids = {j for j in job_ids if j}
    if not ids or shutil.which("squeue") is None:
        return {}
    out = subprocess.run(["squeue", "-h", "-r", "-t", "PENDING", "-o", "%i|%r"], capture_output=True, text=True,
                         timeout=60)
    reasons = {}
    for line in out.stdout.splitlines():
        job, _, reason = line.partition("|")
        if job.strip() in ids and reason.strip() not in ("", "None"):
            reasons[job.strip()] = reason.strip()
    return reasons


def local_states(job_ids: list[str]) -> dict[str, str]:
    """Local jobs are processes: RUNNING while their pid lives."""
    states = {}
    for job in job_ids:
        try:
            os.kill(int(job), 0)
            states[job] = "RUNNING"
        except (ValueError, ProcessLookupError, PermissionError):
            states[job] = "ENDED"
    return states


def job_states(manifest: dict) -> dict[str, str]:
    ids = [row["job_id"] for row in manifest["jobs"] if row.get("job_id")]
    return slurm_states(ids) if manifest.get("cluster") == "slurm" else local_states(ids)


@dataclass
class Row:
    variant: str
    job_id: str
    state: str
    run_status: str
    step: Optional[int]
    values: dict
    error: Optional[str] = None


def rows(manifest: dict, tail_lines: int = 15) -> list[Row]:
    states = job_states(manifest)
    pending = [job for job, state in states.items() if state == "PENDING"]
    reasons = pending_reasons(pending) if pending and manifest.get("cluster") == "slurm" else {}
    client = _client(manifest.get("tracking_uri"))
    shown_metrics = manifest.get("metrics", [])
    out = []
    for job in manifest["jobs"]:
        run_status, step, values = "", None, {}
        if client is not None and job.get("run_id"):
            try:
                run = client.get_run(job["run_id"])
                run_status = run.info.status
                metrics = {m.key: m for m in run.data._metric_objs}
                steps = [m.step for m in metrics.values()]
                step = max(steps) if steps else None
                values = {k: metrics[k].value for k in shown_metrics if k in metrics}
            except Exception:  # noqa: BLE001 - a status display must not fail on one run
                run_status = "?"
        if job.get("skipped_as"):
            state = "skipped"
        else:
            raw = states.get(job.get("job_id", ""), "UNKNOWN")
            state = SHOWN.get(raw, raw.lower())
            if job.get("job_id") in reasons:  # pending, and why: a request no node can hold never starts
                state = f"{state} ({reasons[job['job_id']]})"
            if manifest.get("cluster") != "slurm" and raw == "ENDED":
                state = {"FINISHED": "completed", "FAILED": "failed", "KILLED": "cancelled"}.get(run_status, "ended")
        error = _traceback_tail(manifest, job, tail_lines) if state == "failed" else None
        out.append(Row(job["variant"], job.get("job_id", ""), state, run_status, step, values, error))
    return out


def _traceback_tail(manifest: dict, job: dict, lines: int) -> Optional[str]:
    folder = Path(manifest.get("folder", ""))
    for name in (f"{job['job_id']}_0_log.err", f"{job['job_id']}_log.err"):
        path = folder / name
        if path.exists():
            text = path.read_text(errors="replace").strip().splitlines()
            return "\n".join(text[-lines:])
    return None


def _client(uri: Optional[str]):
    if not uri:
        return None
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def number(x: float) -> str:
    """A metric for people: thousands separated from 100 up ("2,542"), three significant digits below and no
    exponent ("0.0000685", "0.950"), so that a tiny run's GPU-hours neither print as 0.000 nor change form down a
    column."""
    if x != x or x in (float("inf"), float("-inf")):
        return str(x)
    if x == 0:
        return "0"
    text = f"{x:.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"
    return f"{x:,.0f}" if abs(float(text)) >= 100 else text


def render(manifest_path: Path, manifest: dict, table: list[Row]) -> str:
    metrics = manifest.get("metrics", [])
    head = ["variant", "job", "state", "run", "step", *metrics]
    lines = [head]
    for r in table:
        lines.append([r.variant, r.job_id or "-", r.state, r.run_status or "-", "" if r.step is None else str(r.step),
                      *[number(r.values[m]) if m in r.values else "" for m in metrics]])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = [f"sweep {manifest_path.parent.name} ({manifest.get('cluster')}), manifest {manifest_path}"]
    text += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in lines]
    for r in table:
        if r.error:
            text.append(f"\n{r.variant} (job {r.job_id}) failed:\n{r.error}")
    return "\n".join(text)


def cancel(manifest: dict) -> list[str]:
    """Cancel every job of the sweep still alive; returns their ids."""
    states = job_states(manifest)
    alive = [job for job, state in states.items() if state in ALIVE]
    if not alive:
        return []
    if manifest.get("cluster") == "slurm":
        subprocess.run(["scancel", *sorted({a.split("_")[0] if "_" in a else a for a in alive})], check=True,
                       timeout=60)
    else:
        import signal

        for job in alive:
            os.kill(int(job), signal.SIGINT)
    return alive
