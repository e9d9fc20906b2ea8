"""Rank 0 leads the other trainer ranks: before each collective call of the layout (build, step, gather, stream,
save, load) it tells them to make the same one. Both ends of that protocol are here: `Leader`, rank 0's side, one
method per call, and `follow`, the other ranks' side, one entry per call in its table."""

from __future__ import annotations

from collections.abc import Callable

from ablate.distributed.groups import Groups


def _broadcast(message, groups: Groups):
    """Rank 0's message to every trainer rank (the others pass None and get it), over the control group (gloo: a
    follower waiting here holds no NCCL collective open, whose watchdog would end the job)."""
    import torch.distributed as dist

    box = [message]
    dist.broadcast_object_list(box, src=0, group=groups.control if groups.control is not None else groups.trainer)
    return box[0]


def _scatter(messages, groups: Groups):
    """Rank 0's message r to trainer rank r (the others pass None and get theirs), over the control group."""
    import torch.distributed as dist

    box = [None]
    dist.scatter_object_list(box, messages, src=0,
                             group=groups.control if groups.control is not None else groups.trainer)
    return box[0]


class Leader:
    """Rank 0's side: each method tells the following ranks to make the call of the same name (nothing when this
    process leads none: one process, or a follower itself)."""

    def __init__(self, groups: Groups, rank: int):
        self.groups, self.leads = groups, groups.leading and rank == 0

    def _tell(self, name: str, *args) -> None:
        if self.leads:
            _broadcast((name, args), self.groups)

    def begin(self) -> None:
        self._tell("begin")

    def step(self, shares: list) -> None:
        """The learner step, each following rank sent its own share of the batch (`shares[r]`: the batch with its
        rows alone, those rows, the rewards and the kept rows; rank 0's entry is not sent): a rank's rows, not the
        whole step's (~230 MB at the paper's 768 rows of 16k tokens)."""
        if self.leads:
            self._tell("step")
            _scatter([None, *shares[1:]], self.groups)

    def gather(self) -> None:
        self._tell("gather")

    def stream(self) -> None:
        self._tell("stream")

    def save(self, folder, tag: int) -> None:
        self._tell("save", folder, tag)

    def load(self, payload: dict, folder) -> None:
        self._tell("load", payload, folder)

    def stop(self, clean: bool = True) -> None:
        """The end: `clean` when rank 0 meets the others once more before they leave (False: it is failing)."""
        self._tell("stop", clean)


class _Follower:
    """A following rank's learner, built when rank 0 builds its own (its weights then come from rank 0's)."""

    def __init__(self, make_learner: Callable, groups: Groups):
        self.make_learner, self.learner, self.groups = make_learner, None, groups

    def begin(self) -> None:
        self.learner = self.make_learner()

    def step(self) -> None:
        rollouts, rows, rewards, keep = _scatter(None, self.groups)  # this rank's share (FSDP.lead_step)
        try:
            self.learner.step(rollouts.expanded(rows), rewards, keep)
        except FloatingPointError:  # every rank sees the same non-finite loss: rank 0 ends the run, and says stop
            return

    def gather(self) -> None:
        self.learner.ranks.gathered(self.learner.policy)

    def stream(self) -> None:
        for _ in self.learner.ranks.weights(self.learner.policy):  # take part in each gather, keep nothing
            pass

    def save(self, folder, tag: int) -> None:
        self.learner.ranks.save(self.learner, folder, tag)

    def load(self, payload: dict, folder) -> None:
        self.learner.ranks.load(self.learner, payload, folder)


_CALLS = {name: getattr(_Follower, name) for name in ("begin", "step", "gather", "stream", "save", "load")}


def follow(groups: Groups, make_learner: Callable) -> bool:
    """A trainer rank other than 0: make each call rank 0 tells it to, until it says stop; returns whether rank 0
    ends cleanly (and so meets this rank once more). `make_learner()` builds this rank's learner (on the FSDP layout)
    when rank 0 builds its own."""
    follower = _Follower(make_learner, groups)
    while True:
        name, args = _broadcast(None, groups)
        if name == "stop":
            return bool(args[0]) if args else True
        if name not in _CALLS:
            raise RuntimeError(f"unknown call from rank 0: {name!r}")
        _CALLS[name](follower, *args)
