"""The processes of a job: `launch` starts the layout's trainer ranks and engine processes (torch's elastic
launcher, on this machine or on each node), rank 0 runs the trainer and leads, the other trainer ranks follow, the
engine processes serve rank 0. Each process's groups are made here and handed down. Why: docs/design.md#trainer-ranks.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from ablate.distributed import groups as process_groups
from ablate.distributed.groups import Groups
from ablate.distributed.leader import Leader, follow
from ablate.distributed.signals import (defer_the_warning, ranks_born_with_the_warning_blocked, ranks_started_here,
                                        stop_for_requeue, take_the_warning, the_time_limit_taken)
from ablate.distributed.topology import engine_gpus, job_store, layout_name, nodes
from ablate.distributed.watch import ENDED, tell, watching

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

    A rank that fails raises one line here: which rank, its error, and where its traceback is. The launcher's notes
    and that traceback go to the file `log` (the run's folder: `launch_log`) where one is given, else to stderr; in
    one process, its error is raised as it is, its traceback added to `log`."""
    trainers, engines = int(cfg.run.trainer_gpus), int(cfg.run.get("generator_gpus", 0))
    world = trainers + engines
    count, node, endpoint, run_id = nodes()
    if world == 1 and count == 1:
        try:
            return fn(*args, groups=Groups(), **kwargs)
        except Exception:  # raised as it is (the caller says it in one line); its traceback kept in the log
            if log is not None:
                _LogTo.traceback(log)
            raise
    if world % count:
        raise ValueError(f"{world} processes do not spread evenly over the job's {count} nodes")
    from ablate.policy import device_of

    if device_of(cfg.model).type == "cuda" and world // count > torch.cuda.device_count():
        raise ValueError(f"{layout_name(trainers, engines)}: this node has {torch.cuda.device_count()} CUDA "
                         "device(s), one per process (model.device=cpu runs them on the CPU)")
    from omegaconf import OmegaConf
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    plain = OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else cfg
    theirs = "SIGINT,SIGHUP,SIGQUIT"  # the signals torch's launcher takes; SIGTERM is this process's (below)
    if count == 1:
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world, rdzv_backend="c10d",
                              rdzv_endpoint=endpoint, run_id=run_id, max_restarts=0, start_method="spawn",
                              signals_to_handle=theirs)
    else:  # static: node i's ranks are i x P.. whatever order the nodes start in (rank 0, the leader, on node 0)
        config = LaunchConfig(min_nodes=count, max_nodes=count, nproc_per_node=world // count, rdzv_backend="static",
                              rdzv_endpoint=endpoint, rdzv_configs={"rank": node}, run_id=run_id, max_restarts=0,
                              start_method="spawn", signals_to_handle=theirs)
    # the launcher's notes on starting and stopping its workers (each of its modules has a logger with its own level)
    quiet = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
             if name.startswith("torch.distributed.elastic")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    to_file = _LogTo(log) if log is not None else None  # the launcher's, and the spawner's, notes
    # SLURM's warning (USR2, before a time limit or a preemption) is rank 0's to act on: where it waits on a step's
    # rollouts (or at the end of a learner update) it checkpoints (every rank writes its shards) and stops; then this
    # process hands the warning to the handler it displaced (submitit's: requeue the job). Here it is only noted,
    # and passed on to the ranks once (SLURM may have signalled them too: rank 0 holds it either way, the others
    # ignore it).
    warned: list[int] = []
    once = threading.Lock()

    def note_warning(signum, frame) -> None:
        if once.acquire(blocking=False):
            warned.append(signum)
            for pid in ranks_started_here():
                os.kill(pid, signal.SIGUSR2)

    displaced = signal.signal(signal.SIGUSR2, note_warning)
    # torch's launcher takes these for good (to stop its ranks, then raise); after it, they go back to their owners:
    # submitit's bypass of SIGTERM lets this process requeue the job when SLURM signals it (its time limit, the
    # requeue itself) instead of dying in the handler torch left. SIGTERM is not the launcher's (`theirs`): during
    # it, after the warning, it is SLURM's time limit come before rank 0 has ended (a slow checkpoint, the engines'
    # shutdown, the launcher's exit barrier), and the job is requeued at once, the launcher stopping the ranks on
    # the way out (the last checkpoint written stands); before the warning it raises as torch's handler did
    elastic = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    cpp_log = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = cpp_log or "ERROR"  # the ranks: no warnings of collectives a Ctrl-C cut off
    try:
        with ranks_born_with_the_warning_blocked(note_warning), \
                the_time_limit_taken(lambda: bool(warned) and node == 0, lambda: _requeue(displaced)):
            results = elastic_launch(config, rank_main)(plain, fn, args, kwargs)
    except SignalException as err:  # Ctrl-C reached the launcher: it stopped the ranks (rank 0 closed its run)
        if err.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise
    except ChildFailedError as err:  # one line: which rank, and its error
        # the first error, less the processes that ended because rank 0 had failed (ablate/distributed/watch.py)
        failures = {r: f for r, f in err.failures.items() if f.exitcode != ENDED} or err.failures
        rank = min(failures, key=lambda r: failures[r].timestamp)
        failure = failures[rank]
        message = failure.message.get("message", "") if isinstance(failure.message, dict) else failure.message
        where = failure.error_file if os.path.isfile(failure.error_file) else "above"
        if failure.exitcode > 0 and where == "above":  # no Python error: torch's message would be a link to its docs
            message = f"it exited with code {failure.exitcode}"
        if to_file is not None:
            where = str(log)
        who = f"trainer rank {rank}" if rank < trainers else f"the generator engine's process (rank {rank})"
        raise RuntimeError(f"{who} failed: {str(message).strip().splitlines()[-1] if message else '?'}"
                           f" (its log: {where})") from None
    finally:
        if to_file is not None:
            to_file.close()
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)
        if cpp_log is None:
            os.environ.pop("TORCH_CPP_LOG_LEVEL")
        signal.signal(signal.SIGUSR2, displaced)
        for sig, handler in elastic.items():
            if handler is not None:  # None: set outside Python, not restorable from here
                signal.signal(sig, handler)
    if node != 0:  # rank 0 and its result are on node 0 (whose task requeues the job at SLURM's warning)
        return None
    if warned and results[0] is None:  # rank 0 stopped at the warning, its checkpoint written: requeue
        _requeue(displaced)
    return results[0]


def launch_log(cfg, run_id: str) -> Path:
    """Where `launch` writes the launcher's notes and a failed rank's traceback for run `run_id`: its folder."""
    runs = cfg["paths"]["runs"] if isinstance(cfg, dict) else cfg.paths.runs
    return Path(str(runs)) / run_id / "launcher.log"


class _LogTo:
    """The launcher's loggers (torch.distributed.elastic's, and torch.multiprocessing's that stops the other ranks)
    written to the file `path` instead of stderr while it is open: a rank's traceback lands there, and the terminal
    gets `launch`'s one line."""

    NAMES = ("torch.distributed.elastic", "torch.multiprocessing")

    def __init__(self, path: str | os.PathLike):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.handler = logging.FileHandler(path)
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.loggers = [logging.getLogger(name) for name in self.NAMES]
        self.propagate = [logger.propagate for logger in self.loggers]
        for logger in self.loggers:
            logger.addHandler(self.handler)
            logger.propagate = False

    @staticmethod
    def traceback(path: str | os.PathLike) -> None:
        """The exception being handled, its traceback added to the file `path`."""
        import traceback

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as log:
            log.write(traceback.format_exc())

    def close(self) -> None:
        for logger, propagate in zip(self.loggers, self.propagate):
            logger.removeHandler(self.handler)
            logger.propagate = propagate
        self.handler.close()


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
