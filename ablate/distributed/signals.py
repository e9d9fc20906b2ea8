"""SLURM's warning (USR2, before a time limit or a preemption) in a job's processes: the launcher's process notes it
and passes it on once, the ranks are born with it blocked and take it once their handler is set, and rank 0 stops
for the requeue; the time limit itself (SIGTERM) come while torch's launcher still runs requeues the job. Why each
step: docs/design.md#trainer-ranks, docs/training.md#time-limits."""

from __future__ import annotations

import os
import select
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


@contextmanager
def the_time_limit_taken(warned: Callable[[], bool], requeue: Callable[[], None], grace_s: float = 1.0) \
        -> Iterator[None]:
    """Run torch's launcher inside this (in the main thread). SIGTERM once SLURM's warning was noted (`warned()`) is
    the time limit come before rank 0 has ended: `requeue()` (submitit's handler: requeue the job, then exit) at
    once, from this thread's handler; where this thread waits in C++ instead (the launcher's exit barrier, a store
    wait of up to 300 s, where no Python handler runs until it returns), from a thread that sees the signal arrive
    (Python's wakeup fd) and, `grace_s` later, requeues in its place: this thread raises what that raised once it
    runs again. Before the warning, SIGTERM raises what torch's launcher's own handler raises (SignalException: the
    launcher stops the ranks), the launcher having been told to leave SIGTERM alone."""
    claim, done, raised = threading.Lock(), threading.Event(), []

    def in_this_thread(signum, frame) -> None:
        if not warned():
            from torch.distributed.elastic.multiprocessing.api import SignalException

            sigval = signal.Signals(signum)
            raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the requeue's own SIGTERM (SLURM's), and any after it
        if claim.acquire(blocking=False):
            requeue()  # submitit's exits
            return
        done.wait()  # the other thread's requeue
        if raised:
            raise raised[0]

    read, write = os.pipe()
    os.set_blocking(write, False)
    stop = threading.Event()

    def in_a_thread() -> None:
        while not stop.is_set():
            if not select.select([read], [], [], 0.1)[0]:
                continue
            if int(signal.SIGTERM) not in os.read(read, 64) or not warned():
                continue
            if stop.wait(grace_s) or not claim.acquire(blocking=False):  # taken where it was sent
                continue
            try:
                requeue()
            except BaseException as why:  # noqa: BLE001 - submitit's exit, raised again in the main thread
                raised.append(why)
            finally:
                done.set()

    previous = signal.signal(signal.SIGTERM, in_this_thread)
    previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    watcher = threading.Thread(target=in_a_thread, name="ablate-time-limit", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        os.close(read)
        os.close(write)


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
