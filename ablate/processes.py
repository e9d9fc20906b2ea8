"""The processes of a job: `launch` starts the layout's trainer ranks and engine processes (torch's elastic
launcher, on this machine or on each node), rank 0 runs the trainer and leads, the other trainer ranks follow, the
engine processes serve rank 0. Each process's groups are made here and handed down. Why: docs/design.md#trainer-ranks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from ablate.distributed import groups as process_groups
from ablate.distributed.groups import Groups
from ablate.distributed.leader import Leader, follow
from ablate.distributed.signals import (defer_the_warning, ranks_born_with_the_warning_blocked, ranks_started_here,
                                        stop_for_requeue, take_the_warning, the_time_limit_taken)
from ablate.distributed.topology import engine_gpus, job_store, layout_name, nodes
from ablate.distributed.watch import ENDED, tell, watching

THEIRS = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)  # the signals torch's launcher takes; SIGTERM is ours
LAUNCHER_LOGGERS = ("torch.distributed.elastic", "torch.multiprocessing")  # its notes, and its spawner's


def launch(cfg, fn, *args, log: str | os.PathLike | None = None, **kwargs):
    """Run `fn(*args, groups=..., **kwargs)` (the trainer) on the layout `cfg.run` names, handing it this process's
    groups (ablate/distributed/groups.py); return what it returns.

    One process in all (one trainer rank, no engine process): here, in this process. More: `cfg.run.trainer_gpus`
    trainer ranks and `cfg.run.generator_gpus` engine processes (torch's elastic launcher, as torchrun; gloo on the
    CPU, nccl on GPUs), rank 0 running `fn`, the other trainer ranks following it, the engine processes serving it.
    The job itself is one process per node (a SLURM task, a local job): it starts its node's share of the ranks, so
    `python -m ablate` is not to be run under torchrun. On a job of several nodes (`topology.nodes`) node i starts ranks
    i x P .. i x P + P - 1 (P = the processes per node) and node 0 hosts the rendezvous; only node 0's call
    returns what `fn` returned (rank 0 is there), the others return None.

    A rank that fails raises one line here (`failure_line`): which rank, its error, and where its traceback is. The
    launcher's notes and that traceback go to the file `log` (the run's folder: `launch_log`) where one is given,
    else to stderr; in one process, its error is raised as it is, its traceback added to `log`. What the launch
    changes of this process (signal handlers, loggers, an environment variable) is given back as it was, however
    it ends (`process_state_kept`)."""
    trainers, engines = int(cfg.run.trainer_gpus), int(cfg.run.get("generator_gpus", 0))
    count, node, endpoint, run_id = nodes()
    if trainers + engines == 1 and count == 1:
        return _in_this_process(fn, args, kwargs, log)
    _check_the_spread(cfg, trainers, engines, count)
    from omegaconf import OmegaConf
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    plain = OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else cfg
    config = _launch_config(trainers + engines, count, node, endpoint, run_id)
    warning = SlurmWarning()
    with process_state_kept(warning.note, log) as displaced:
        try:
            with ranks_born_with_the_warning_blocked(warning.note), \
                    the_time_limit_taken(lambda: warning.came and node == 0, lambda: _requeue(displaced)):
                results = elastic_launch(config, rank_main)(plain, fn, args, kwargs)
        except SignalException as err:  # Ctrl-C reached the launcher: it stopped the ranks (rank 0 closed its run)
            if err.sigval == signal.SIGINT:
                raise KeyboardInterrupt from None
            raise
        except ChildFailedError as err:  # one line: which rank, and its error
            written = {f.error_file for f in err.failures.values() if f.error_file and os.path.isfile(f.error_file)}
            raise RuntimeError(failure_line(err.failures, trainers, log, written)) from None
    if node != 0:  # rank 0 and its result are on node 0 (whose task requeues the job at SLURM's warning)
        return None
    if warning.came and results[0] is None:  # rank 0 stopped at the warning, its checkpoint written: requeue
        _requeue(displaced)
    return results[0]


def _in_this_process(fn, args: tuple, kwargs: dict, log: str | os.PathLike | None):
    """`launch` with one process in all: `fn` here. Its error is raised as it is (the caller says it in one line),
    its traceback kept in the log."""
    try:
        return fn(*args, groups=Groups(), **kwargs)
    except Exception:
        if log is not None:
            _traceback_to(log)
        raise


def _check_the_spread(cfg, trainers: int, engines: int, count: int) -> None:
    """The layout's processes spread evenly over the job's nodes, each with a CUDA device of its own where the
    weights are on CUDA: else one clear error, before any rank starts."""
    world = trainers + engines
    if world % count:
        raise ValueError(f"{world} processes do not spread evenly over the job's {count} nodes")
    from ablate.policy import device_of

    if device_of(cfg.model).type == "cuda" and world // count > torch.cuda.device_count():
        raise ValueError(f"{layout_name(trainers, engines)}: this node has {torch.cuda.device_count()} CUDA "
                         "device(s), one per process (model.device=cpu runs them on the CPU)")


def _launch_config(world: int, count: int, node: int, endpoint: str, run_id: str):
    """torch's launcher's settings: this node's share of `world` processes, spawned, never restarted, the signals
    in THEIRS its to take. One node: a c10d rendezvous; several: static, node i's ranks i x P.. whatever order the
    nodes start in (rank 0, the leader, on node 0)."""
    from torch.distributed.launcher.api import LaunchConfig

    theirs = ",".join(sig.name for sig in THEIRS)
    if count == 1:
        return LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world, rdzv_backend="c10d",
                            rdzv_endpoint=endpoint, run_id=run_id, max_restarts=0, start_method="spawn",
                            signals_to_handle=theirs)
    return LaunchConfig(min_nodes=count, max_nodes=count, nproc_per_node=world // count, rdzv_backend="static",
                        rdzv_endpoint=endpoint, rdzv_configs={"rank": node}, run_id=run_id, max_restarts=0,
                        start_method="spawn", signals_to_handle=theirs)


class SlurmWarning:
    """SLURM's warning (USR2, before a time limit or a preemption) as the launching process sees it. It is rank 0's
    to act on: where it waits on a step's rollouts (or at the end of a learner update) it checkpoints (every rank
    writes its shards) and stops; then `launch` hands the warning to the handler it displaced (submitit's: requeue
    the job). Here it is only noted (`came`), and passed on to the ranks started here once (SLURM may have signalled
    them too: rank 0 holds it either way, the others ignore it)."""

    def __init__(self) -> None:
        self.came = False
        self._once = threading.Lock()

    def note(self, signum, frame) -> None:
        if self._once.acquire(blocking=False):
            self.came = True
            for pid in ranks_started_here():
                os.kill(pid, signal.SIGUSR2)


@contextlib.contextmanager
def process_state_kept(note_warning: Callable, log: str | os.PathLike | None) -> Iterator[Any]:
    """Inside: this process set for torch's launcher; after, however it ends, every kind of state given back as it
    was, the last set first. Yields the USR2 handler it displaced (submitit's requeue, the warning's owner).

    - SIGTERM, SIGINT, SIGHUP, SIGQUIT: torch's launcher takes them for good (to stop its ranks, then raise); after
      it they go back to their owners: submitit's bypass of SIGTERM lets this process requeue the job when SLURM
      signals it (its time limit, the requeue itself) instead of dying in the handler torch left. SIGTERM is not the
      launcher's (THEIRS): during it, after the warning, it is SLURM's time limit come before rank 0 has ended (a
      slow checkpoint, the engines' shutdown, the launcher's exit barrier), and the job is requeued at once
      (`the_time_limit_taken`), the launcher stopping the ranks on the way out (the last checkpoint written stands);
      before the warning it raises as torch's handler did.
    - USR2: `note_warning` (`SlurmWarning.note`).
    - TORCH_CPP_LOG_LEVEL, for the ranks: ERROR unless set, so no warnings of collectives a Ctrl-C cut off.
    - the launcher's loggers: ERROR, not its notes on starting and stopping its workers.
    - where `log` is given, the launcher's loggers written there instead of stderr."""
    with contextlib.ExitStack() as kept:
        kept.enter_context(signal_handlers_kept((signal.SIGTERM, *THEIRS)))
        displaced = kept.enter_context(signal_handled(signal.SIGUSR2, note_warning))
        kept.enter_context(environ_defaulted("TORCH_CPP_LOG_LEVEL", "ERROR"))
        kept.enter_context(loggers_quieted(LAUNCHER_LOGGERS[0], logging.ERROR))
        if log is not None:
            kept.enter_context(loggers_to_file(LAUNCHER_LOGGERS, log))
        yield displaced


@contextlib.contextmanager
def signal_handlers_kept(signals: Collection[signal.Signals]) -> Iterator[None]:
    """The Python handlers of `signals` as they were on entry, set again on exit, whatever the body set; a handler
    set outside Python (getsignal's None) cannot be set from here and is left as the body left it."""
    handlers = {sig: signal.getsignal(sig) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)


@contextlib.contextmanager
def signal_handled(sig: signal.Signals, handler: Callable) -> Iterator[Any]:
    """`sig` handled by `handler` inside; yields the handler it displaced, set again on exit."""
    displaced = signal.signal(sig, handler)
    try:
        yield displaced
    finally:
        signal.signal(sig, displaced)


@contextlib.contextmanager
def environ_defaulted(name: str, value: str) -> Iterator[None]:
    """The environment variable `name` set to `value` inside where it is unset or empty; on exit, as it was (unset
    again where it was unset)."""
    before = os.environ.get(name)
    os.environ[name] = before or value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextlib.contextmanager
def loggers_quieted(prefix: str, level: int) -> Iterator[None]:
    """Every logger made so far whose name starts with `prefix` (each of torch's launcher's modules has one, with a
    level of its own) at `level` inside; on exit, each at its own level again."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.startswith(prefix)]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, was in zip(loggers, levels):
            logger.setLevel(was)


@contextlib.contextmanager
def loggers_to_file(names: Collection[str], path: str | os.PathLike) -> Iterator[None]:
    """The loggers `names` (torch's launcher's: LAUNCHER_LOGGERS) written to the file `path` instead of passed up to
    stderr inside: a rank's traceback lands there, and the terminal gets `launch`'s one line. On exit the file is
    closed and the loggers pass their records up as they did."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loggers = [logging.getLogger(name) for name in names]
    propagate = [logger.propagate for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield
    finally:
        for logger, was in zip(loggers, propagate):
            logger.removeHandler(handler)
            logger.propagate = was
        handler.close()


def failure_line(failures: Mapping[int, Any], trainers: int, log: str | os.PathLike | None,
                 written: Collection[str]) -> str:
    """The one line `launch` raises when processes fail. `failures`: rank -> what torch's launcher says of it (a
    ProcessFailure: exitcode, timestamp, message, error_file); `trainers`: ranks below it are trainer ranks, the rest
    engine processes; `log`: the file the launcher's notes went to, if any; `written`: the error files that exist.

    The rank is the first to fail, less the processes that ended because another had failed (exit code ENDED:
    ablate/distributed/watch.py) unless all did; its error is the last line of its message. Where its traceback is:
    `log`, else its error file, else "above" (stderr). A process that exited with a code and left no error file
    raised no Python error: its exit code, not torch's message (a link to its docs)."""
    failures = {r: f for r, f in failures.items() if f.exitcode != ENDED} or failures
    rank = min(failures, key=lambda r: failures[r].timestamp)
    failure = failures[rank]
    message = failure.message.get("message", "") if isinstance(failure.message, dict) else failure.message
    where = failure.error_file if failure.error_file in written else "above"
    if failure.exitcode > 0 and where == "above":
        message = f"it exited with code {failure.exitcode}"
    if log is not None:
        where = str(log)
    who = f"trainer rank {rank}" if rank < trainers else f"the generator engine's process (rank {rank})"
    lines = str(message or "").strip().splitlines()
    return f"{who} failed: {lines[-1] if lines else '?'} (its log: {where})"


def launch_log(cfg, run_id: str) -> Path:
    """Where `launch` writes the launcher's notes and a failed rank's traceback for run `run_id`: its folder."""
    runs = cfg["paths"]["runs"] if isinstance(cfg, dict) else cfg.paths.runs
    return Path(str(runs)) / run_id / "launcher.log"


def _traceback_to(path: str | os.PathLike) -> None:
    """The exception being handled, its traceback added to the file `path`."""
    import traceback

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as log:
        log.write(traceback.format_exc())


def _requeue(displaced) -> NoReturn:
    """Hand SLURM's warning to the handler `launch` displaced: submitit's requeues the job, then exits."""
    if callable(displaced):
        displaced(signal.SIGUSR2, None)  # submitit: requeue, then SystemExit
    raise KeyboardInterrupt("SIGUSR2 with no handler to requeue the job")


@record  # a rank's error goes to a file its launcher reads: the one line `launch` raises names it
def rank_main(cfg: dict, fn, args: tuple, kwargs: dict):
    """One rank of `launch`: join the group; rank 0 runs `fn` and finally releases the others; they follow."""
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from ablate.generators import remote
    from ablate.policy import device_of

    trainers, engines = int(cfg["run"]["trainer_gpus"]), int(cfg["run"].get("generator_gpus", 0))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0))
    if rank >= trainers:  # a generator engine's process: its own GPU, no world of ours; serve rank 0
        return engine_main(cfg, rank, local, trainers, engines)
    on_gpu = device_of(OmegaConf.create(cfg["model"])).type == "cuda"  # the weights' device decides, not the machine
    if on_gpu:
        torch.cuda.set_device(local)
    backend = "nccl" if on_gpu else "gloo"
    control_timeout, data_timeout = _timeouts(cfg)
    # the data plane (weights, gradients) on the device's backend, its NCCL communicator bound to this rank's GPU
    dist.init_process_group(backend, world_size=trainers, rank=rank, timeout=data_timeout,
                            device_id=torch.device("cuda", local) if on_gpu else None)
    control = dist.new_group(backend="gloo", timeout=control_timeout)  # rank 0's calls: the control plane
    store = job_store()  # rank 0: the engine groups' rendezvous, and where it says it failed; the others watch it
    groups = process_groups.connect(store if rank == 0 else None, rank, trainers, engines, backend, leading=True,
                                    control=control, control_timeout=control_timeout, data_timeout=data_timeout)
    try:
        result, clean = None, False
        if rank != 0:
            take_the_warning(signal.SIG_IGN)  # the warning is rank 0's (`launch`)
            with watching(store, f"trainer rank {rank}"):  # up to the end: rank 0's wind-up may fail after its stop
                clean = _follow(OmegaConf.create(cfg), groups)
                if clean:  # rank 0 meets it here, or says it failed (docs/distributed.md#when-rank-0-fails)
                    dist.barrier(group=groups.control)
        else:
            try:
                # what the trainer hands the warning to once it has checkpointed: the end of this rank (the launcher's
                # process requeues the job); one that came while this rank started ends it here, before `fn`
                take_the_warning(stop_for_requeue)
                defer_the_warning()  # from here until the trainer's own handler, one waits (start-up's collectives)
                result, clean = fn(*args, groups=groups, **kwargs), True
            except SystemExit as stop:  # stopped at SLURM's warning (`stop_for_requeue`): an end like any other
                if stop.code not in (0, None):
                    raise
                clean = True
            finally:
                # the run is over: a warning now changes nothing, and would end this process once Python, exiting,
                # resets its handlers to the default (which for USR2 is to die: a finished job reported failed)
                signal.signal(signal.SIGUSR2, signal.SIG_IGN)
                if sys.exc_info()[1] is not None:  # failing: first tell the processes that may be where they
                    tell(store, sys.exc_info()[1])  # cannot see it (an NCCL collective this rank left)
                try:
                    _wind_up(Leader(groups, rank).stop, clean,  # failing, rank 0 meets nobody: the others must not wait
                             lambda: remote.release(groups),  # engine processes the trainer never reached
                             groups.shutdown)
                except Exception as why:  # clean until here: the others, told to stop, wait at the barrier below
                    tell(store, why)  # for a rank 0 that never comes (its process may outlive this): they end on it
                    raise
        # no rank tears the groups down while another may still be in them (a failed rank's launcher stops the others
        # instead); on the control plane: rank 0 may first be closing engine processes
        if clean and rank == 0:
            dist.barrier(group=groups.control)
        return result
    finally:
        dist.destroy_process_group()


def _wind_up(stop, clean: bool, *steps) -> None:
    """Rank 0's last calls (tell the others to stop, release the engines, close the groups), each made whatever the
    one before did. Where rank 0 is failing already, a call that fails too is only logged: the error reported
    (`launch`'s one line) stays the run's own, not what the wind-up tripped over after it."""
    failing = sys.exc_info()[1] is not None
    first = None
    for step in (lambda: stop(clean), *steps):
        try:
            step()
        except Exception as why:  # noqa: BLE001 - every step is tried; the first error is raised or logged
            if failing:
                logging.getLogger(__name__).warning("rank 0, failing, could not wind up: %r", why)
            first = first or why
    if first is not None and not failing:
        raise first


def engine_main(cfg: dict, rank: int, local: int, trainers: int, engines: int) -> None:
    """An engine process. With generator.tensor_parallel_size=t, processes trainers + k t .. + t - 1 make engine
    k (on one node: ablate.checks.check_run): on GPUs they see that engine's GPUs, each using its own; they form a
    torch.distributed world of their own (on the job's store) for vLLM's tensor parallelism (its external-launcher
    executor, as verl runs vLLM in torchrun's processes), with RANK and LOCAL_RANK as vLLM reads them. With t = 1 an
    engine process has no world (vLLM makes its own, of one). Then it joins rank 0's engine groups and serves rank 0
    until told to close."""
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from ablate.generators import remote
    from ablate.policy import device_of

    take_the_warning(signal.SIG_IGN)  # the warning is rank 0's (`launch`)
    tp = int(cfg["generator"].get("tensor_parallel_size", 1))
    engine, tp_rank = divmod(rank - trainers, tp)
    if str(cfg["model"].get("device", "auto")) != "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = engine_gpus(local, tp_rank, tp, os.environ.get("CUDA_VISIBLE_DEVICES"))
    on_gpu = device_of(OmegaConf.create(cfg["model"])).type == "cuda"
    if on_gpu:
        torch.cuda.set_device(tp_rank)
    store, watched = job_store(), job_store()  # the second for the watching thread alone
    for name in ("GROUP_RANK", "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        os.environ.pop(name, None)
    os.environ.update(RANK=str(tp_rank), LOCAL_RANK=str(tp_rank), WORLD_SIZE=str(tp), LOCAL_WORLD_SIZE=str(tp))
    backend = "nccl" if on_gpu else "gloo"
    control_timeout, data_timeout = _timeouts(cfg)
    if tp > 1:  # the data plane of vLLM's tensor parallelism: its collectives run only inside a request (a decode
        # step, a load), each rank of the engine having had the request over its own control group with rank 0
        # (gloo, control_timeout); between requests no rank waits here, so the data plane's timeout holds
        dist.init_process_group(backend, store=dist.PrefixStore(f"ablate-tp/{engine}", store), rank=tp_rank,
                                world_size=tp, timeout=data_timeout)
    groups = process_groups.connect(store, rank, trainers, engines, backend, control_timeout=control_timeout,
                                    data_timeout=data_timeout)
    try:
        with watching(watched, f"the generator engine's process (rank {rank})"):  # until rank 0 says close
            remote.serve(groups)
    finally:
        groups.shutdown()
        if dist.is_initialized():  # the tensor-parallel world (or vLLM's own), before the interpreter's exit
            dist.destroy_process_group()


def _timeouts(cfg: dict) -> tuple[timedelta, timedelta]:
    """(control plane, data plane) timeouts: run.control_timeout_min and run.data_timeout_min."""
    run = cfg["run"]
    return (timedelta(minutes=float(run.get("control_timeout_min", 720.0))),
            timedelta(minutes=float(run.get("data_timeout_min", 30.0))))


def _follow(cfg, groups: Groups) -> bool:
    """A trainer rank other than 0: build its learner on the FSDP layout when rank 0 builds its own, then make the
    calls rank 0 makes (ablate/distributed/leader.py)."""
    from ablate.policy import build_policy, build_tokenizer
    from ablate.registry import build
    from ablate.trainer import Learner

    def make_learner():
        ranks = build(cfg.run, groups=groups)  # the layout rank 0 builds (run=fsdp)
        # the architecture alone: FSDP.wrap gives every rank rank 0's weights (no copy of the checkpoint per rank)
        return Learner(cfg, build_policy(cfg.model, cfg.seed, build_tokenizer(cfg.model), read_weights=False),
                       ranks=ranks)

    return follow(groups, make_learner)
