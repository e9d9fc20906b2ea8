"""Where a job's processes are: its nodes, this node's index, the rendezvous, the devices it holds, the GPUs an
engine process sees."""

from __future__ import annotations

import os
from datetime import timedelta

import torch


def layout_name(trainers: int, engines: int) -> str:
    """The layout as its config keys say it, for errors: `run.trainer_gpus=2 + run.generator_gpus=1`."""
    return f"run.trainer_gpus={trainers}" + (f" + run.generator_gpus={engines}" if engines else "")


def node_count() -> int:
    """The nodes of this job: SLURM's job of several, else 1."""
    return int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))


def devices_held(device: torch.device) -> int:
    """Every device the job holds, for its GPU-hours: each node's visible GPUs (trainer and generator GPUs alike, in
    use or not) x its nodes; a CPU counts one device a node."""
    return (torch.cuda.device_count() if device.type == "cuda" else 1) * node_count()


# the rendezvous port of a job of several nodes: RENDEZVOUS_PORT + job id mod 10,000, below Linux's ephemeral range
# (32,768-60,999 by default), from which the system hands out the ports of outgoing connections: a port there may be
# taken by any connection on the node (before: 29,500 + job mod 10,000, 67% of it inside that range)
RENDEZVOUS_PORT = 20_000


def rendezvous_port(job: str) -> int:
    return RENDEZVOUS_PORT + int(job) % 10_000


def nodes() -> tuple[int, int, str, str]:
    """(nodes, this node's index, rendezvous endpoint, run id) of the job: SLURM's job of several nodes (one task
    per node: submitit's default), the first node hosting the rendezvous on a port derived from the job id (every
    node computes the same one: `rendezvous_port`); else this machine alone."""
    import uuid

    count = node_count()
    if count == 1:
        return 1, 0, "localhost:0", uuid.uuid4().hex
    job, listed = os.environ["SLURM_JOB_ID"], os.environ["SLURM_JOB_NODELIST"]
    head = listed
    if "[" in listed or "," in listed:  # node[1-4] -> node1
        import subprocess

        head = subprocess.run(["scontrol", "show", "hostnames", listed], capture_output=True, text=True,
                              check=True).stdout.split()[0]
    return count, int(os.environ["SLURM_NODEID"]), f"{head}:{rendezvous_port(job)}", f"ablate-{job}"


def engine_gpus(local: int, tp_rank: int, tp: int, visible: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for the engine process of local rank `local`, rank `tp_rank` of an engine of `tp`: the
    engine's GPUs on this node (local ranks local - tp_rank ..), as the node lists them in `visible` (None: all)."""
    listed = visible.split(",") if visible else None
    return ",".join(listed[i] if listed else str(i) for i in range(local - tp_rank, local - tp_rank + tp))


def job_store():
    """The job's rendezvous store (the launcher's, at MASTER_ADDR:MASTER_PORT), as a client."""
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(minutes=10))
