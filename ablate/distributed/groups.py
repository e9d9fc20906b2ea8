"""The process groups of one process of a job, as an object handed to what uses them (the trainer layout, the
engines' handle in rank 0, an engine process's server), never module state."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

CONTROL_TIMEOUT = timedelta(hours=12)  # run.control_timeout_min's default: a wait for rank 0's next call
DATA_TIMEOUT = timedelta(minutes=30)  # run.data_timeout_min's default: one collective of weights or gradients


@dataclass
class Groups:
    """`leading`: rank 0 of a launched job, which tells the other trainer ranks each collective call it makes
    (leader.py), over `control`, a gloo group of the trainer ranks (the control plane: on the CPU whatever the
    device, with a timeout long enough for rank 0's longest silence). `engines`: per engine process, its rank in the job and its control group with rank 0 (in rank 0:
    all of them; in an engine process: its own). `weights`: rank 0 with every engine process, which the weights are
    broadcast over. `closed`: the engine processes rank 0 has told to close. A process of one has none of them."""

    leading: bool = False
    control: object | None = None
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


def connect(store, rank: int, trainers: int, engines: int, backend: str, *, leading: bool = False,
            control=None, control_timeout: timedelta = CONTROL_TIMEOUT,
            data_timeout: timedelta = DATA_TIMEOUT) -> Groups:
    """This process's groups in a job of `trainers` trainer ranks and `engines` engine processes (ranks trainers ..),
    made from `store` (the job's rendezvous store) in rank 0 and in each engine process; the other trainer ranks make
    none. They live outside the trainer ranks' torch.distributed world, so that vLLM in an engine process can make
    its own. Per engine process a `control` group with rank 0 (gloo, whatever the device: requests and replies as
    pickled objects; `control_timeout`), and `weights`, rank 0 with every engine process (`backend`: nccl on GPUs;
    `data_timeout`). `control`: the trainer ranks' control group, made by the caller (every trainer rank takes part)."""
    if rank == 0:
        return Groups(leading=leading, control=control,
                      engines=[(trainers + i, _group(store, f"control-{i}", 0, 2, "gloo", control_timeout))
                               for i in range(engines)],
                      weights=_group(store, "weights", 0, 1 + engines, backend, data_timeout) if engines else None)
    if rank >= trainers:
        index = rank - trainers
        return Groups(engines=[(rank, _group(store, f"control-{index}", 1, 2, "gloo", control_timeout))],
                      weights=_group(store, "weights", 1 + index, 1 + engines, backend, data_timeout))
    return Groups(leading=leading, control=control)


def _group(store, name: str, rank: int, size: int, backend: str, timeout: timedelta):
    """torch's own gloo or NCCL process group on its own prefix of the store (as vLLM's stateless groups are)."""
    import torch.distributed as dist

    prefixed = dist.PrefixStore(f"ablate-engines/{name}", store)
    if backend == "nccl":  # (untested here: the CPU build has no NCCL)
        from torch.distributed.distributed_c10d import ProcessGroupNCCL

        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        return ProcessGroupNCCL(prefixed, rank, size, options)
    return dist.ProcessGroupGloo(prefixed, rank, size, timeout)
