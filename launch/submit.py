"""Submission with submitit: one job array per sweep, de-duplicated by signature, with a manifest.

This package knows nothing of RL: it takes job specs (a name, a signature, the arguments of one callable) and a
launcher config, and it submits. Which runs are already done is asked of a callable the caller passes.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence


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
    index: Optional[int] = None  # local workers: the spec's place in its worker's list

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


def check_request(launcher: Mapping[str, Any]) -> None:
    """Fail before submitting, naming the resource, when no node of the job's partition (the default one when none
    is named) can hold what each of its nodes asks for: SLURM would accept the job and leave it pending for ever
    (reason PartitionConfig or Resources). From `sinfo`'s nodes; says nothing when sinfo does not answer."""
    partition = launcher.get("partition")
    command = ["sinfo", "-h", "-N", "-o", "%N|%P|%c|%m|%G"] + (["-p", str(partition)] if partition else [])
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return
    if out.returncode != 0:
        return
    nodes = [_node(line) for line in out.stdout.splitlines() if line.count("|") == 4]
    nodes = [n for n in nodes if partition or n["default"]]
    where = f"partition {partition}" if partition else "the default partition"
    if not nodes:
        raise ValueError(f"launcher.partition={partition}: SLURM has no such partition" if partition else
                         "launcher.partition is not set and SLURM has no default partition: name one")
    asked = {"cpus": int(launcher.get("cpus_per_task") or 1), "mem_mb": int(launcher.get("mem_gb") or 0) * 1024,
             "gpus": int(launcher.get("gpus_per_node") or 0)}
    names = {"cpus": ("launcher.cpus_per_task", "CPUs"), "mem_mb": ("launcher.mem_gb", "MB of memory"),
             "gpus": ("launcher.gpus_per_node", "GPUs")}
    for resource, need in asked.items():
        most = max(n[resource] for n in nodes)
        if need > most:
            key, what = names[resource]
            raise ValueError(f"{key}={launcher.get(key.split('.')[1])}: no node of {where} has that many {what} (the "
                             f"most: {most}); SLURM would leave the job pending for ever")
    holding = sum(all(n[r] >= need for r, need in asked.items()) for n in nodes)
    if holding < int(launcher.get("nodes") or 1):
        raise ValueError(f"launcher.nodes={launcher.get('nodes')}: {where} has {holding} node(s) that hold "
                         f"{asked['cpus']} CPUs, {asked['mem_mb'] // 1024} GB and {asked['gpus']} GPUs each")


def _node(line: str) -> dict:
    """One line of `sinfo -N -o %N|%P|%c|%m|%G`: the node's CPUs, memory (MB) and GPUs (gres gpu[:type]:N)."""
    _, partition, cpus, mem, gres = line.split("|")
    gpus = 0
    for item in gres.split(","):
        fields = item.split("(")[0].split(":")
        if fields[0] == "gpu" and fields[-1].isdigit():
            gpus += int(fields[-1])
    return {"default": partition.endswith("*"), "cpus": int(cpus.rstrip("+")), "mem_mb": int(mem.rstrip("+")),
            "gpus": gpus}


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
        params["slurm_signal_delay_s"] = launcher.get("signal_delay_s") or 120  # sized before submit (ablate/run.py)
        interface = launcher.get("network_interface")  # gloo's control plane and NCCL's data plane between nodes
        setup = [f"export GLOO_SOCKET_IFNAME={interface} NCCL_SOCKET_IFNAME={interface}"] if interface else []
        if setup or launcher.get("setup"):
            params["slurm_setup"] = setup + list(launcher.get("setup") or [])
        if launcher.get("additional"):
            params["slurm_additional_parameters"] = dict(launcher["additional"])
        if launcher.get("srun_args"):  # srun's own options: pyxis's --container-image, --container-mounts
            params["slurm_srun_args"] = list(launcher["srun_args"])
    if cluster == "local":
        params.pop("cpus_per_task")
        params.pop("mem_gb", None)
    return params


def make_executor(folder: Path, cluster: str, parameters: Mapping[str, Any], max_requeues: int = 20,
                  python: str | None = None):
    """submitit's executor; `python`, on SLURM, the command that runs the job's Python (launcher.python: inside a
    container, `apptainer exec --nv image.sif python`), else this interpreter."""
    import submitit

    executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster,  # files named <job id>_...
                                     slurm_max_num_timeout=max_requeues,
                                     **({"slurm_python": python} if python and cluster == "slurm" else {}))
    executor.update_parameters(**parameters)
    return executor


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the processes started inside (local jobs inherit this process's)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Processes started inside write their stdout and stderr to `path`, not to this terminal: submitit's local
    job controllers print what they have to say there (a KeyboardInterrupt traceback each, when they still took
    Ctrl-C: `_ctrl_c_ignored`). The jobs themselves write to their own log files, as on SLURM."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


class Requeueable:
    """Wraps a job's callable so submitit requeues it on preemption or at its time limit (USR2), with the same
    arguments: the callable must pick up where it left off (the trainer resumes its run from its checkpoint).

    Once the callable has returned, USR2 is ignored: the work is done, and there is nothing to save or requeue.
    SLURM sends the warning up to a minute early and whatever the job is doing, so it can come while Python shuts
    down, when the interpreter has put back the default action (terminate); the finished job would then end as
    FAILED, killed by signal 12.
    """

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        result = self.fn(*args)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        return result

    def checkpoint(self, *args: Any):
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args)


@contextmanager
def _ctrl_c_ignored() -> Iterator[None]:
    """Local workers' controllers (submitit's) are started with SIGINT ignored, which they keep (Python leaves an
    ignored SIGINT ignored). Ctrl-C in a terminal reaches every process of the sweep; a controller that took it
    sent its worker SIGINT and, one second later, SIGKILL: a run still closing then stayed RUNNING, its last metrics
    unwritten. Now the workers get Ctrl-C alone (`run_in_turn` takes it back), or from the sweep
    (`Submission.cancel`), and end their runs as KILLED in their own time."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _children(pid: int) -> list[int]:
    """The processes `pid` started (Linux's /proc; none when it has ended)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def run_in_turn(fn: Callable, arg_lists: Sequence[tuple]) -> list[Optional[str]]:
    """A local worker: fn(*args) for each item, one after the other in this process; per item None or its traceback.

    One failing item does not stop the others. Sharing a process saves each item the start-up of Python, torch and
    the rest (seconds per job on a laptop, where a sweep's jobs are short).
    """
    import traceback

    signal.signal(signal.SIGINT, signal.default_int_handler)  # its controller ignores Ctrl-C; this worker takes it
    errors: list[Optional[str]] = []
    for args in arg_lists:
        try:
            fn(*args)
            errors.append(None)
        except Exception:  # noqa: BLE001 - recorded per item; the worker goes on with the next
            text = traceback.format_exc()
            print(text, file=sys.stderr, flush=True)
            errors.append(text)
    return errors


class Submission:
    """The jobs of one sweep. SLURM and debug: one job per spec, as one job array. Local: at most `max_parallel`
    worker processes, each running its share of the specs in turn (run_in_turn); when each job takes `gpus_per_job`
    of this machine's `gpus` (their ids), each worker sees its own (CUDA_VISIBLE_DEVICES), and no more workers run
    than there are GPUs for."""

    def __init__(self, fn: Callable, specs: Sequence[JobSpec], executor, cluster: str, folder: Path,
                 done: Callable[[JobSpec], Optional[str]] = lambda spec: None, max_parallel: int = 0,
                 about: Optional[Mapping[str, Any]] = None, gpus: Sequence[str] = (), gpus_per_job: int = 0):
        self.fn, self.executor, self.cluster, self.folder = fn, executor, cluster, folder
        self.about = dict(about or {})  # what the caller wants in the manifest (e.g. where the runs are tracked)
        self.items = [Submitted(spec, skipped_as=done(spec)) for spec in specs]
        self.max_parallel = max_parallel or (os.cpu_count() or 1)
        # per local worker, the GPUs it sees (submitit's local executor sets CUDA_VISIBLE_DEVICES from these; by
        # default from gpus_per_node alone, the same first GPUs for every job)
        self.gpu_sets: list[Optional[list[int]]] = [None] * self.max_parallel
        if cluster == "local" and gpus_per_job > 0:
            if gpus_per_job > len(gpus):
                raise ValueError(f"each job takes {gpus_per_job} GPU(s) and this machine has {len(gpus)}")
            if not all(str(g).isdigit() for g in gpus):
                raise ValueError(f"CUDA_VISIBLE_DEVICES={','.join(map(str, gpus))}: local jobs need GPUs by index")
            sets = [[int(g) for g in gpus[i:i + gpus_per_job]]
                    for i in range(0, len(gpus) - gpus_per_job + 1, gpus_per_job)]
            self.gpu_sets = sets[:self.max_parallel]
            self.max_parallel = len(self.gpu_sets)

    @property
    def todo(self) -> list[Submitted]:
        return [it for it in self.items if it.skipped_as is None]

    def start(self) -> "Submission":
        todo = self.todo
        if not todo:
            return self
        if self.cluster == "local":
            shares = [todo[i::self.max_parallel] for i in range(min(self.max_parallel, len(todo)))]
            threads = str(max(1, (os.cpu_count() or 1) // len(shares)))  # workers share the cores, not oversubscribe
            with _environ(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", threads)), \
                    _output_to(self.folder / "local-controllers.log"), _ctrl_c_ignored():
                for share, gpu_set in zip(shares, self.gpu_sets):
                    if gpu_set is not None:  # LocalExecutor's own (AutoExecutor passes on only `setup` to it)
                        local = getattr(self.executor, "_executor", self.executor)
                        local.update_parameters(gpus_per_node=len(gpu_set), visible_gpus=gpu_set)
                    job = self.executor.submit(run_in_turn, self.fn, [it.spec.args for it in share])
                    for index, it in enumerate(share):
                        it.job, it.index = job, index
        else:
            with self.executor.batch():  # one job array
                jobs = [self.executor.submit(Requeueable(self.fn), *it.spec.args) for it in todo]
            for it, job in zip(todo, jobs):
                it.job = job
        self.write_manifest()
        return self

    def jobs(self) -> list:
        return list({id(it.job): it.job for it in self.todo}.values())

    def finished(self) -> bool:
        return all(job.done() for job in self.jobs())

    def cancel(self, signum: int = signal.SIGINT) -> None:
        """Stop the live jobs: on SLURM scancel; local, `signum` to each worker (its controller ignores Ctrl-C:
        `_ctrl_c_ignored`), whose run then ends as a Ctrl-C ends it."""
        for job in self.jobs():
            if job.done():
                continue
            if self.cluster != "local":
                job.cancel()
                continue
            process = getattr(job, "_process", None)  # submitit's LocalJob: its controller
            for pid in _children(process.pid) if process is not None else []:
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:  # ended meanwhile
                    pass

    def error(self, it: Submitted) -> Optional[str]:
        """Why this spec's job failed (the end of its traceback), or None if it did not."""
        if it.job is None:
            return None
        try:
            if it.index is not None:
                text = it.job.result()[it.index]
                return "\n".join(text.strip().splitlines()[-25:]) if text else None
            exc = it.job.exception()
        except Exception as err:  # noqa: BLE001 - the job died before writing its result
            exc = err
        if exc is None:
            return None
        tail = (it.job.stderr() or "").strip().splitlines()[-25:]
        return "\n".join(tail) if tail else str(exc)

    def write_manifest(self) -> Path:
        """folder/manifest.json: per variant its job id, signature and what the caller put in meta."""
        self.folder.mkdir(parents=True, exist_ok=True)
        rows = [{"variant": it.spec.name, "signature": it.spec.signature, "job_id": it.job_id,
                 "skipped_as": it.skipped_as, **it.spec.meta} for it in self.items]
        path = self.folder / "manifest.json"
        path.write_text(json.dumps({"cluster": self.cluster, "folder": str(self.folder), **self.about, "jobs": rows},
                                   indent=2))
        return path


def submit(fn: Callable, specs: Sequence[JobSpec], launcher: Mapping[str, Any], folder: Path, job_name: str,
           done: Callable[[JobSpec], Optional[str]] = lambda spec: None,
           about: Optional[Mapping[str, Any]] = None, gpus: Sequence[str] = (), gpus_per_job: int = 0) -> Submission:
    """Submit every spec that `done` does not answer for, as one job array; return at once. Local jobs that take
    `gpus_per_job` GPUs each share this machine's `gpus` (their ids) out between them."""
    cluster = resolve_cluster(str(launcher["cluster"]))
    executor = make_executor(folder, cluster, executor_parameters(launcher, cluster, job_name),
                             max_requeues=int(launcher.get("max_requeues", 20)), python=launcher.get("python"))
    return Submission(fn, specs, executor, cluster, folder, done=done,
                      max_parallel=int(launcher.get("max_parallel_local") or 0), about=about, gpus=gpus,
                      gpus_per_job=gpus_per_job).start()


