"""Submission with submitit: one job array per sweep, de-duplicated by signature, with a manifest.

This package knows nothing of RL: it takes job specs (a name, a signature, the arguments of one callable) and a
launcher config, and it submits. Which runs are already done is asked of a callable the caller passes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence


@dataclass
class JobSpec:
    name: str  # the variant
    signature: str  # the run's identity
    args: tuple = ()  # what the callable gets
    meta: dict = field(default_factory=dict)  # carried into the manifest (e.g. the MLflow run id)


@dataclass
class Submitted:
    spec: JobSpec
    job: Any = None  # a submitit Job, or None while a local job waits for a free slot
    skipped_as: Optional[str] = None  # set when the spec was already done: what the done-callable answered

    @property
    def job_id(self) -> str:
        return self.job.job_id if self.job is not None else ""


def slurm_available() -> bool:
    """A SLURM controller answers here (`scontrol ping`), not merely `srun` on the PATH."""
    if shutil.which("scontrol") is None:
        return False
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "UP" in out.stdout


def resolve_cluster(requested: str) -> str:
    if requested == "auto":
        return "slurm" if slurm_available() else "local"
    if requested == "slurm" and not slurm_available():
        raise RuntimeError("launcher.cluster=slurm but no SLURM controller answers `scontrol ping` on this machine; "
                           "run from a login node, or use launcher=local")
    return requested


def executor_parameters(launcher: Mapping[str, Any], cluster: str, job_name: str) -> dict:
    """submitit's parameters for the launcher config (shared names bare, SLURM's with the slurm_ prefix)."""
    params: dict[str, Any] = {"name": job_name, "timeout_min": launcher["timeout_min"], "nodes": launcher["nodes"],
                              "gpus_per_node": launcher["gpus_per_node"], "cpus_per_task": launcher["cpus_per_task"]}
    if launcher.get("mem_gb"):
        params["mem_gb"] = launcher["mem_gb"]
    if cluster == "slurm":
        for key in ("partition", "account", "qos", "constraint"):
            if launcher.get(key):
                params[f"slurm_{key}"] = launcher[key]
        params["slurm_array_parallelism"] = launcher["array_parallelism"]
        if launcher.get("setup"):
            params["slurm_setup"] = list(launcher["setup"])
        if launcher.get("additional"):
            params["slurm_additional_parameters"] = dict(launcher["additional"])
    if cluster == "local":
        params.pop("cpus_per_task")
        params.pop("mem_gb", None)
    return params


def make_executor(folder: Path, cluster: str, parameters: Mapping[str, Any]):
    import submitit

    executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster)  # files named <job id>_...
    executor.update_parameters(**parameters)
    return executor


class Submission:
    """The jobs of one sweep. On the local cluster at most `max_parallel` run at once: `poll()` starts the next."""

    def __init__(self, fn: Callable, specs: Sequence[JobSpec], executor, cluster: str, folder: Path,
                 done: Callable[[JobSpec], Optional[str]] = lambda spec: None, max_parallel: int = 0):
        self.fn, self.executor, self.cluster, self.folder = fn, executor, cluster, folder
        self.items = [Submitted(spec, skipped_as=done(spec)) for spec in specs]
        self.max_parallel = max_parallel or (os.cpu_count() or 1)
        self.submitted_at = time.time()

    @property
    def pending(self) -> list[Submitted]:
        return [it for it in self.items if it.skipped_as is None and it.job is None]

    def start(self) -> "Submission":
        todo = self.pending
        if not todo:
            return self
        if self.cluster == "local":
            self.poll()
        else:
            with self.executor.batch():  # one job array
                jobs = [self.executor.submit(self.fn, *it.spec.args) for it in todo]
            for it, job in zip(todo, jobs):
                it.job = job
        self.write_manifest()
        return self

    def running(self) -> list[Submitted]:
        return [it for it in self.items if it.job is not None and not it.job.done()]

    def poll(self) -> None:
        """Start waiting local jobs while fewer than max_parallel run."""
        free = self.max_parallel - len(self.running())
        started = False
        for it in self.pending[:max(free, 0)]:
            it.job = self.executor.submit(self.fn, *it.spec.args)
            started = True
        if started:
            self.write_manifest()

    def finished(self) -> bool:
        return not self.pending and not self.running()

    def write_manifest(self) -> Path:
        """folder/manifest.json: per variant its job id, signature and what the caller put in meta."""
        self.folder.mkdir(parents=True, exist_ok=True)
        rows = [{"variant": it.spec.name, "signature": it.spec.signature, "job_id": it.job_id,
                 "skipped_as": it.skipped_as, **it.spec.meta} for it in self.items]
        path = self.folder / "manifest.json"
        path.write_text(json.dumps({"cluster": self.cluster, "jobs": rows}, indent=2))
        return path


def submit(fn: Callable, specs: Sequence[JobSpec], launcher: Mapping[str, Any], folder: Path, job_name: str,
           done: Callable[[JobSpec], Optional[str]] = lambda spec: None) -> Submission:
    """Submit every spec that `done` does not answer for, as one job array; return at once."""
    cluster = resolve_cluster(str(launcher["cluster"]))
    executor = make_executor(folder, cluster, executor_parameters(launcher, cluster, job_name))
    return Submission(fn, specs, executor, cluster, folder, done=done,
                      max_parallel=int(launcher.get("max_parallel_local") or 0)).start()


