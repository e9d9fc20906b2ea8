"""Rank 0's failure, told to the job's other processes within seconds: rank 0, failing, writes it to the job's
store; every other trainer rank and engine process watches the store from a thread of its own and ends itself when
it is there, or when the store (on node 0, with rank 0) is gone. A process blocked in an NCCL collective that rank 0
will never join would otherwise wait until run.data_timeout_min. Why: docs/distributed.md#when-rank-0-fails."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

FAILED = "ablate/rank-0-failed"  # the store's key: rank 0's error, one line
ENDED = 70  # the exit code of a process a watcher ended: the job's one-line report names the error it followed


def tell(store, why: BaseException) -> None:
    """Rank 0, failing: say why to the watchers (a store that cannot be reached tells them too: it is gone)."""
    try:
        store.set(FAILED, f"{type(why).__name__}: {why}".splitlines()[0][:2000])
    except Exception as err:  # noqa: BLE001 - the run's own error is the one to raise
        logging.getLogger(__name__).warning("rank 0 could not tell the other processes that it failed: %r", err)


@contextmanager
def watching(store, who: str, *, every_s: float = 1.0, end: Callable[[int], None] = os._exit) -> Iterator[None]:
    """While inside: a thread asks `store` every `every_s` seconds whether rank 0 failed; when it did, or when two
    asks in a row fail (the store is gone with node 0's launcher), it says so on stderr, naming `who`, and calls
    `end(ENDED)` (default: this process ends at once, whatever its main thread is blocked in). Leave as soon as the
    job's last barrier is passed (rank 0's wind-up may fail before it comes there): a clean rank 0, and its store,
    may be gone soon after it."""
    done = threading.Event()

    def watch() -> None:
        failed_asks = 0
        while not done.wait(every_s):
            try:
                failed = store.check([FAILED])
                failed_asks = 0
            except Exception as err:  # noqa: BLE001 - unreachable: counted, then taken as rank 0's end
                failed_asks += 1
                if failed_asks < 2:
                    continue
                why = f"the job's store on node 0 is gone ({type(err).__name__})"
            else:
                if not failed:
                    continue
                why = store.get(FAILED).decode()
            if done.is_set():  # left meanwhile: a clean end
                return
            print(f"{who} stops: rank 0 failed: {why}", file=sys.stderr, flush=True)
            _note(f"rank 0 failed: {why}")
            end(ENDED)
            return

    thread = threading.Thread(target=watch, name="ablate-rank-0-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _note(message: str) -> None:
    """`message` in the error file torch's launcher reads for this process, where it runs under one: when it is the
    first to end (rank 0's process lingering after its error), the job's one line quotes rank 0's error, not this
    process's exit code."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w") as fp:
            json.dump({"message": {"message": message, "extraInfo": {"timestamp": str(int(time.time()))}}}, fp)
    except OSError as err:
        logging.getLogger(__name__).warning("could not write %s: %r", path, err)
