"""The process groups of one process of a job, as an object handed to what uses them (the trainer layout, the
engines' handle in rank 0, an engine process's server), never module state."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

ENGINE_GROUP_TIMEOUT = timedelta(hours=2)  # an engine process waits this long for rank 0's next request


@dataclass
class Groups:
    """`leading`: rank 0 of a launched job, which tells the other trainer ranks each collective call it makes
    (leader.py). `engines`: per engine process, its rank in the job and its control group with rank 0 (in rank 0:
    all of them; in an engine process: its own). `weights`: rank 0 with every engine process, which the weights are
    broadcast over. `closed`: the engine processes rank 0 has told to close. A process of one has none of them."""

    leading: bool = False
    engines: list[tuple[int, object]] = field(default_factory=list)
    weights: object | None = None
    closed: set[int] = field(default_factory=set)

    @property
    def trainer(self):
        """The trainer ranks' group: torch.distributed's world (the engine processes are not in it)."""
        import torch.distributed as dist

        return dist.group.WORLD

    def shutdown(self) -> None:
        """Shut the engine groups down while this process is alive (left to the interpreter's exit, a gloo group's
        threads may abort it), once rank 0 and the engines are done with them."""
        for group in [control for _, control in self.engines] + ([self.weights] if self.weights is not None else []):
            group.shutdown()
        self.engines, self.weights = [], None


def connect(store, rank: int, trainers: int, engines: int, backend: str, *, leading: bool = False) -> Groups:
    """This process's groups in a job of `trainers` trainer ranks and `engines` engine processes (ranks trainers ..),
    made from `store` (the job's rendezvous store) in rank 0 and in each engine process; the other trainer ranks make
    none. They live outside the trainer ranks' torch.distributed world, so that vLLM in an engine process can make
    its own. Per engine process a `control` group with rank 0 (gloo, whatever the device: requests and replies as
    pickled objects), and `weights`, rank 0 with every engine process (`backend`: nccl on GPUs)."""
    if rank == 0:
        return Groups(leading=leading,
                      engines=[(trainers + i, _group(store, f"control-{i}", 0, 2, "gloo")) for i in range(engines)],
                      weights=_group(store, "weights", 0, 1 + engines, backend) if engines else None)
    if rank >= trainers:
        index = rank - trainers
        return Groups(engines=[(rank, _group(store, f"control-{index}", 1, 2, "gloo"))],
                      weights=_group(store, "weights", 1 + index, 1 + engines, backend))
    return Groups(leading=leading)


def _group(store, name: str, rank: int, size: int, backend: str):
    """torch's own gloo or NCCL process group on its own prefix of the store (as vLLM's stateless groups are)."""
    import torch.distributed as dist

    prefixed = dist.PrefixStore(f"ablate-engines/{name}", store)
    if backend == "nccl":  # (untested here: the CPU build has no NCCL)
        from torch.distributed.distributed_c10d import ProcessGroupNCCL

        options = ProcessGroupNCCL.Options()
        options._timeout = ENGINE_GROUP_TIMEOUT
        return ProcessGroupNCCL(prefixed, rank, size, options)
    return dist.ProcessGroupGloo(prefixed, rank, size, ENGINE_GROUP_TIMEOUT)
