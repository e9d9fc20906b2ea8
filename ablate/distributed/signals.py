"""SLURM's warning (USR2, before a time limit or a preemption) in a job's processes: the launcher's process notes it
and passes it on once, the ranks are born with it blocked and take it once their handler is set, and rank 0 stops
for the requeue. Why each step: docs/design.md#trainer-ranks."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def ranks_born_with_the_warning_blocked(note: Callable) -> Iterator[None]:
    """Start the ranks inside this: they are born with USR2 blocked (a process inherits its parent's signal mask),
    so a warning that comes while a rank still imports torch waits until `take_the_warning` instead of ending it.
    Meanwhile this process's own warning is taken by a thread of its own, for `note`."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    done = threading.Event()

    def wait() -> None:
        while not done.is_set():
            if signal.sigtimedwait({signal.SIGUSR2}, 0.1) is not None:
                note(signal.SIGUSR2, None)

    waiter = threading.Thread(target=wait, name="ablate-warning", daemon=True)
    waiter.start()
    try:
        yield
    finally:
        done.set()
        waiter.join()
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # one that came since goes to `note`, still installed


def take_the_warning(handler) -> None:
    """A rank's answer to SLURM's warning, set: then unblock it, which delivers one that came while it started."""
    signal.signal(signal.SIGUSR2, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})


def defer_the_warning() -> None:
    """Block USR2 again (rank 0, as the trainer starts): one that comes during start-up (the model's build, FSDP's
    broadcasts, a checkpoint's load: minutes at 8B) waits for the trainer's own handler (ablate.trainer's
    PreemptionNotice unblocks it) instead of ending this rank in the middle of a collective its peers are in."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})


def stop_for_requeue(signum, frame) -> None:
    """Rank 0's answer once the trainer has checkpointed: end here; the launcher's process requeues the job."""
    raise SystemExit(0)


def ranks_started_here() -> list[int]:
    """The rank processes this process started (the spawn start method's children; /proc, as on a SLURM node)."""
    me, ranks = str(os.getpid()), []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == me:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                if b"multiprocessing.spawn" in command and b"resource_tracker" not in command:
                    ranks.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return ranks
