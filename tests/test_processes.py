"""ablate/processes.py in this process: each kind of process-wide state `launch` changes given back by its own
context manager, also when the body raises; the one line a failed launch raises, derived by hand. The launch
itself, across processes, is tests/test_parallel.py's and tests/test_preflight.py's (-m e2e)."""

from __future__ import annotations

import logging
import os
import signal
from types import SimpleNamespace

import pytest

from ablate import processes
from ablate.distributed.watch import ENDED


class Boom(Exception):
    """What the bodies below raise."""


def _handler(signum, frame) -> None:  # a Python handler to tell apart from the defaults
    pass


@pytest.fixture
def signals_as_they_were():
    """Whatever a test does to these handlers, they are as they were after it."""
    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
    handlers = {sig: signal.getsignal(sig) for sig in sigs}
    yield
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)


def test_signal_handlers_kept_sets_them_back_when_the_body_raises(signals_as_they_were):
    signal.signal(signal.SIGHUP, _handler)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    with pytest.raises(Boom), processes.signal_handlers_kept((signal.SIGHUP, signal.SIGUSR1)):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGUSR1, _handler)
        raise Boom
    assert signal.getsignal(signal.SIGHUP) is _handler and signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_signal_handled_yields_the_handler_it_displaced_and_sets_it_back_when_the_body_raises(signals_as_they_were):
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    with pytest.raises(Boom), processes.signal_handled(signal.SIGUSR2, _handler) as displaced:
        assert displaced is signal.SIG_IGN and signal.getsignal(signal.SIGUSR2) is _handler
        raise Boom
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN


@pytest.mark.parametrize("before, inside", [(None, "ERROR"), ("", "ERROR"), ("INFO", "INFO")])
def test_environ_defaulted_sets_the_variable_back_or_unsets_it_when_the_body_raises(monkeypatch, before, inside):
    name = "ABLATE_TEST_PROCESSES_LEVEL"
    if before is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, before)
    with pytest.raises(Boom), processes.environ_defaulted(name, "ERROR"):
        assert os.environ[name] == inside
        os.environ[name] = "changed by the body"
        raise Boom
    assert os.environ.get(name) == before


def test_loggers_quieted_sets_each_level_back_when_the_body_raises():
    outer, inner = logging.getLogger("ablate-test-quiet"), logging.getLogger("ablate-test-quiet.inner")
    other = logging.getLogger("ablate-test-loud")
    outer.setLevel(logging.INFO)
    inner.setLevel(logging.NOTSET)
    other.setLevel(logging.DEBUG)
    with pytest.raises(Boom), processes.loggers_quieted("ablate-test-quiet", logging.ERROR):
        assert (outer.level, inner.level, other.level) == (logging.ERROR, logging.ERROR, logging.DEBUG)
        raise Boom
    assert (outer.level, inner.level, other.level) == (logging.INFO, logging.NOTSET, logging.DEBUG)


def test_loggers_to_file_writes_there_and_gives_the_loggers_back_when_the_body_raises(tmp_path):
    logger = logging.getLogger("ablate-test-to-file")
    logger.propagate, logger.level = True, logging.INFO
    path = tmp_path / "runs" / "some-run" / "launcher.log"  # its folder made
    with pytest.raises(Boom), processes.loggers_to_file(["ablate-test-to-file"], path):
        assert not logger.propagate
        logger.warning("a rank's traceback")
        (handler,) = logger.handlers
        raise Boom
    assert logger.propagate and logger.handlers == [] and handler.stream is None  # closed
    assert path.read_text().rstrip().endswith("WARNING ablate-test-to-file: a rank's traceback")


def test_process_state_kept_gives_every_kind_back_when_the_body_raises(tmp_path, monkeypatch, signals_as_they_were):
    """All five together, as `launch` holds them: the launcher's signals, USR2, TORCH_CPP_LOG_LEVEL, the launcher's
    loggers' levels, their file."""
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    elastic = logging.getLogger("torch.distributed.elastic.ablate-test")
    elastic.setLevel(logging.INFO)
    spawner = logging.getLogger("torch.multiprocessing")
    handlers, propagate = list(spawner.handlers), spawner.propagate
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, _handler)
    term = signal.getsignal(signal.SIGTERM)
    log = tmp_path / "launcher.log"
    with pytest.raises(Boom), processes.process_state_kept(_handler, log) as displaced:
        assert displaced is signal.SIG_IGN and signal.getsignal(signal.SIGUSR2) is _handler
        assert os.environ["TORCH_CPP_LOG_LEVEL"] == "ERROR" and elastic.level == logging.ERROR
        assert not spawner.propagate and len(spawner.handlers) == len(handlers) + 1
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as torch's launcher does, for good
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Boom
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN and signal.getsignal(signal.SIGHUP) is _handler
    assert signal.getsignal(signal.SIGTERM) is term and "TORCH_CPP_LOG_LEVEL" not in os.environ
    assert elastic.level == logging.INFO and spawner.handlers == handlers and spawner.propagate == propagate
    assert log.exists()


def test_slurms_warning_is_noted_once_and_passed_on_once(monkeypatch):
    killed = []
    monkeypatch.setattr(processes, "ranks_started_here", lambda: [101, 102])
    monkeypatch.setattr(processes.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    warning = processes.SlurmWarning()
    assert not warning.came
    warning.note(signal.SIGUSR2, None)
    warning.note(signal.SIGUSR2, None)  # SLURM's, then ours passed back: still once
    assert warning.came and killed == [(101, signal.SIGUSR2), (102, signal.SIGUSR2)]


def _failed(exitcode: int, timestamp: int, message, error_file: str = "") -> SimpleNamespace:
    """What torch's launcher says of a failed process (its ProcessFailure's fields that the line reads)."""
    return SimpleNamespace(exitcode=exitcode, timestamp=timestamp, message=message, error_file=error_file)


TRACEBACK = {"message": "Traceback (most recent call last):\n  File \"x.py\", line 1, in fn\nValueError: boom\n",
             "extraInfo": {"py_callstack": "...", "timestamp": "7"}}


def test_the_failure_line_names_the_first_rank_that_failed_on_its_own_and_its_last_line():
    """Rank 0 failed first (5) but was ended by a watcher (ENDED): rank 1, at 7, is the one that failed on its own.
    Its message is torch's record (a dict): its last line. Its traceback is in its error file, or in `log` where the
    launcher's notes went."""
    failures = {0: _failed(ENDED, 5, "rank 1 failed: ValueError: boom", "/e0.json"),
                1: _failed(1, 7, TRACEBACK, "/e1.json")}
    written = {"/e0.json", "/e1.json"}
    assert processes.failure_line(failures, 2, None, written) == \
        "trainer rank 1 failed: ValueError: boom (its log: /e1.json)"
    assert processes.failure_line(failures, 2, "/runs/r/launcher.log", written) == \
        "trainer rank 1 failed: ValueError: boom (its log: /runs/r/launcher.log)"


def test_the_failure_line_picks_by_time_not_rank_and_names_an_engine_process():
    """Ranks 1 (at 8) and 3 (at 2), 2 trainer ranks: rank 3 is the engine's process and failed first. Where every
    process was ended by a watcher, the first of them all."""
    failures = {1: _failed(1, 8, "RuntimeError: later"), 3: _failed(1, 2, "RuntimeError: first", "/e3.json")}
    assert processes.failure_line(failures, 2, None, {"/e3.json"}) == \
        "the generator engine's process (rank 3) failed: RuntimeError: first (its log: /e3.json)"
    ended = {0: _failed(ENDED, 9, "a", "/e0.json"), 1: _failed(ENDED, 4, "rank 0 failed: b", "/e1.json")}
    assert processes.failure_line(ended, 2, None, {"/e0.json", "/e1.json"}) == \
        "trainer rank 1 failed: rank 0 failed: b (its log: /e1.json)"


def test_the_failure_line_of_a_process_with_no_python_error_is_its_exit_code():
    """Exit code 3 and no error file (os._exit): torch's message is a link to its docs; the line says the code. Killed
    by a signal (exit code -9), torch's message is the signal's, kept. The error file named but not written: above."""
    docs = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
    assert processes.failure_line({0: _failed(3, 1, docs, "/e0.json")}, 2, None, set()) == \
        "trainer rank 0 failed: it exited with code 3 (its log: above)"
    assert processes.failure_line({0: _failed(3, 1, docs)}, 2, "/runs/r/launcher.log", set()) == \
        "trainer rank 0 failed: it exited with code 3 (its log: /runs/r/launcher.log)"
    killed = {1: _failed(-9, 1, "Signal 9 (SIGKILL) received by PID 4242")}
    assert processes.failure_line(killed, 2, None, set()) == \
        "trainer rank 1 failed: Signal 9 (SIGKILL) received by PID 4242 (its log: above)"


@pytest.mark.parametrize("message", ["", {"message": ""}, {"extraInfo": {}}, " \n ", None])
def test_the_failure_line_of_an_empty_message_is_a_question_mark(message):
    assert processes.failure_line({0: _failed(1, 1, message, "/e0.json")}, 1, None, {"/e0.json"}) == \
        "trainer rank 0 failed: ? (its log: /e0.json)"
