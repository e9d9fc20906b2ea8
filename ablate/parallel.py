"""How the learner spreads over trainer processes: which rows of a step each trains, and how the weights are held.

`OneProcess` (the default: no torch.distributed) and `FSDP` (FSDP2 per decoder layer, fp32 masters, the gradients
summed across ranks so that the step is the whole batch's) answer the same questions, so no caller asks which it
has. Also here: starting the processes (`launch`: trainer ranks and engine processes, on this machine or on each node
of the job), rank 0 leading and the others following (`follow`), the groups to the engine processes
(`connect_engines`), the learner's sharded checkpoints (DCP) and SLURM's warning in the ranks. Why, and the rules for
checkpoints and signals: docs/design.md#trainer-ranks.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record

SHARDS = "learner-{tag}"  # the DCP folder of a checkpoint, beside its payload


def _dealt(lengths: torch.Tensor, trained: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """The trained rows dealt to `rank` of `world` (a mask [N]): by length, longest first, round robin, so that
    every rank gets rows of every length and about the same number of tokens."""
    order = torch.argsort(lengths, descending=True, stable=True)
    order = order[trained[order]]
    mine = torch.zeros_like(trained)
    mine[order[rank::world]] = True
    return mine


class OneProcess:
    """Every row in this process (the default layout: one device, or the CPU)."""

    rank, world = 0, 1
    ranks = (1, 1)  # the trainer ranks this layout takes (checked before submit: ablate.config.check_run)

    def __init__(self, **_: object) -> None:
        pass

    def wrap(self, scorer: torch.nn.Module) -> torch.nn.Module:
        return scorer

    def share(self, lengths: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
        return trained

    def passes(self, count: int) -> int:
        """Forward/backward passes this step: here, one per micro-batch."""
        return count

    def total(self, value: float) -> float:
        return value

    def sync_gradients(self, scorer: torch.nn.Module, now: bool) -> None:
        pass

    def save(self, learner, folder: Path, tag: int) -> dict:
        """The learner's part of a checkpoint's payload."""
        return {"policy": learner.policy.state_dict(), "optimizer": learner.optimizer.state_dict(),
                "scheduler": learner.scheduler.state_dict()}

    def load(self, learner, payload: dict, folder: Path) -> None:
        learner.policy.load_state_dict(payload["policy"])
        learner.optimizer.load_state_dict(payload["optimizer"])
        learner.scheduler.load_state_dict(payload["scheduler"])

    def prune(self, folder: Path, payload: dict) -> None:
        """Called once `payload` is the checkpoint: remove what older checkpoints left (here, nothing)."""

    def weights(self, policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights, (name, tensor) one tensor at a time: what a generator engine loads."""
        yield from policy.state_dict().items()

    stream = weights  # one process: nothing to lead

    def gathered(self, policy: torch.nn.Module) -> torch.nn.Module:
        """The policy with the trainer's current weights, whole: here, the trainer's own."""
        return policy

    def lead_step(self, *batch) -> None:
        """Before a learner step: nothing to tell (FSDP's rank 0 sends the batch to the other ranks)."""


class FSDP:
    """Data parallel over the trainer ranks' process group with FSDP2 (torch.distributed.fsdp.fully_shard).

    Rows are dealt to the ranks by length (`_dealt`); every rank then runs as many forward/backward passes as the
    busiest one (FSDP's all-gathers and reduce-scatters pair up across ranks), a rank with fewer micro-batches
    running a pass whose loss is weighted 0. Gradients are reduce-scattered once, after the step's last pass, as a
    sum in fp32. Needs torch.distributed initialized (by `launch`, or by a test's processes) with a backend for the
    weights' device: nccl on GPUs, gloo on the CPU.
    """

    ranks = (2, None)

    def __init__(self, trainer_gpus: int = 2, generator_gpus: int = 0, **_: object) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("the FSDP layout needs torch.distributed initialized: its ranks are started by "
                               "ablate.parallel.launch (`python -m ablate run=fsdp` does)")
        self.group = trainer_group()
        self.rank, self.world = dist.get_rank(self.group), dist.get_world_size(self.group)
        if self.world != trainer_gpus:
            raise ValueError(f"run.trainer_gpus={trainer_gpus}, but {self.world} ranks were started")
        self.leads = _LEADING and self.rank == 0
        # rank 0's unsharded copy (`gathered`), for an engine in its process and validation there; none when the
        # engines have processes of their own: they get the weights streamed from the shards and validate there
        self.keeps_whole = self.rank == 0 and not generator_gpus
        self.full: torch.nn.Module | None = None
        self.device = torch.device("cpu")  # of the small tensors this layout reduces: the weights' device, once wrapped

    def wrap(self, scorer: torch.nn.Module) -> torch.nn.Module:
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self._lead("begin")
        self.device = next(scorer.parameters()).device
        with torch.no_grad():  # every rank starts from rank 0's weights (its warm start, or its checkpoint's)
            for tensor in scorer.state_dict().values():
                dist.broadcast(tensor, src=0, group=self.group)
        if self.keeps_whole:
            self.full = copy.deepcopy(scorer.model)
        mesh = DeviceMesh.from_group(self.group, self.device.type)  # the trainer ranks (engine processes apart)
        gathered = None if scorer.compute_dtype == torch.float32 else scorer.compute_dtype
        layers = MixedPrecisionPolicy(param_dtype=gathered, reduce_dtype=torch.float32)
        groups = [fully_shard(layer, mesh=mesh, mp_policy=layers) for layer in scorer.model.get_decoder().layers]
        groups.append(fully_shard(scorer, mesh=mesh, mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float32)))
        for group in groups:  # each shard group reduces its own gradients
            group.set_gradient_divide_factor(1.0)  # a sum over ranks: each rank's loss is its share of the whole
            group.set_force_sum_reduction_for_comms(True)  # as plain SUM (gloo has no pre-multiplied sum)
        return scorer

    def share(self, lengths: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
        return _dealt(lengths, trained, self.rank, self.world)

    def passes(self, count: int) -> int:
        return int(self._reduce(float(count), "MAX"))

    def total(self, value: float) -> float:
        return self._reduce(value, "SUM")

    def sync_gradients(self, scorer: torch.nn.Module, now: bool) -> None:
        scorer.set_requires_gradient_sync(now)

    def lead_step(self, *batch) -> None:
        self._lead("step", *batch)

    def gathered(self, policy: torch.nn.Module) -> torch.nn.Module | None:
        """Rank 0's unsharded copy of the policy with the trainer's current weights (gathered tensor by tensor), for
        an engine in rank 0's process and validation there; None on the other ranks. The copy costs rank 0 one model
        of memory, so it exists only without engine processes (run.generator_gpus=0): those take `stream`."""
        if self.rank == 0 and self.full is None:
            raise RuntimeError("rank 0 keeps no whole copy of the policy when the generator's engines have processes "
                               "of their own (run.generator_gpus > 0): stream the weights to them (Weights.stream)")
        self._lead("gather")
        if self.rank != 0:
            for _ in self.weights(policy):
                pass
            return None
        own = self.full.state_dict()
        with torch.no_grad():
            for name, tensor in self.weights(policy):
                own[name].copy_(tensor)
        return self.full

    def save(self, learner, folder: Path, tag: int) -> dict:
        """Every rank writes its shards of the weights and AdamW's state (DCP) to folder/learner-<tag>: first
        under a staging name, renamed once all ranks are done."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self._lead("save", folder, tag)
        name = SHARDS.format(tag=tag)
        staged, final = folder / f"{name}.partial", folder / name
        if self.rank == 0:
            shutil.rmtree(staged, ignore_errors=True)
        dist.barrier(group=self.group)
        model, optim = get_state_dict(learner.scorer, learner.optimizer)
        dcp.save({"model": model, "optim": optim}, checkpoint_id=staged, process_group=self.group)
        dist.barrier(group=self.group)
        if self.rank == 0:
            shutil.rmtree(final, ignore_errors=True)
            staged.rename(final)
        dist.barrier(group=self.group)
        return {"learner_shards": name, "scheduler": learner.scheduler.state_dict()}

    def load(self, learner, payload: dict, folder: Path) -> None:
        """Every rank reads its shards back (DCP reshards if the world size changed)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        if "learner_shards" not in payload:
            raise ValueError(f"the checkpoint in {folder} was written by one process, not by FSDP ranks: it holds no "
                             "learner shards to load")
        self._lead("load", {k: payload[k] for k in ("learner_shards", "scheduler")}, folder)
        model, optim = get_state_dict(learner.scorer, learner.optimizer)
        state = {"model": model, "optim": optim}
        dcp.load(state, checkpoint_id=folder / payload["learner_shards"], process_group=self.group)
        set_state_dict(learner.scorer, learner.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        learner.scheduler.load_state_dict(payload["scheduler"])

    def prune(self, folder: Path, payload: dict) -> None:
        if self.rank == 0:
            for old in folder.glob(SHARDS.format(tag="*")):
                if old.name != payload["learner_shards"]:
                    shutil.rmtree(old, ignore_errors=True)

    def weights(self, policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights, gathered one tensor at a time (an all-gather each, in the same order on every rank):
        at most one full tensor exists beside the shards, never the whole model. Every rank must run the iterator to
        its end; the ranks that feed no engine just drop what they get."""
        from torch.distributed.tensor import DTensor

        for name, tensor in policy.state_dict().items():
            yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor

    def stream(self, policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """Rank 0: `weights`, with the other trainer ranks taking part in each gather (they follow a "stream")."""
        self._lead("stream")
        yield from self.weights(policy)

    def _lead(self, name: str, *args) -> None:
        """On the leading rank 0: tell the following ranks to make the same call (`follow`)."""
        if self.leads:
            _broadcast((name, args))

    def _reduce(self, value: float, op: str) -> float:
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=self.group)
        return float(t.item())


class Weights:
    """The trainer's current weights as a generator takes them, whatever the layout holds: `names`, then `stream`,
    (name, full tensor) one at a time (FSDP: gathered from the shards on every trainer rank as they are taken, at
    most one full tensor beside them), for engines that keep their own copy; or `module`, the policy whole (the
    trainer's own in one process; FSDP: rank 0's gathered copy, gathered once per Weights), for what decodes in the
    trainer's process. A step's weights are one Weights: publishing and validating them gather once."""

    def __init__(self, ranks, policy: torch.nn.Module):
        self.ranks, self.policy = ranks, policy
        self._module: torch.nn.Module | None = None

    def names(self) -> list[str]:
        return list(self.policy.state_dict())

    def stream(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.ranks.stream(self.policy)

    def module(self) -> torch.nn.Module:
        if self._module is None:
            self._module = self.ranks.gathered(self.policy)
        return self._module


def weights_of(policy: torch.nn.Module | Weights) -> Weights:
    """A policy module (a test's, a tool's) as the trainer's Weights are taken; Weights as they are."""
    return policy if isinstance(policy, Weights) else Weights(OneProcess(), policy)


# ---- the processes of run=fsdp: started by `launch`, rank 0 leading, the others following

_LEADING = False  # set in the processes `launch` starts: rank 0 then broadcasts each collective call to the others
_ENGINES: list[tuple[int, object]] = []  # per engine process: (its rank in the job, its control group with rank 0)
_WEIGHTS = None  # rank 0 and every engine process: the weights' broadcasts
ENGINE_GROUP_TIMEOUT = timedelta(hours=2)  # an engine process waits this long for rank 0's next request


def connect_engines(store, rank: int, trainers: int, engines: int, backend: str) -> None:
    """The groups between rank 0 and the engine processes (ranks trainers .. trainers + engines - 1 of the job),
    made from `store` (the job's rendezvous store) on rank 0 and in each engine process; the other trainer ranks
    make none. They live outside the trainer ranks' torch.distributed world: an engine process has no world of ours,
    so that vLLM in it can make its own (vllm-project/vllm#3088). Per engine process a `control` group with rank 0
    (gloo, whatever the device: requests, replies and rows as pickled objects), and `weights`, rank 0 with every
    engine process (`backend`: nccl on GPUs), which the weights are broadcast over. Each is torch's own gloo or
    NCCL process group, built on its own prefix of the store (as vLLM's stateless groups are)."""
    global _ENGINES, _WEIGHTS
    if rank == 0:
        _ENGINES = [(trainers + i, _group(store, f"control-{i}", 0, 2, "gloo")) for i in range(engines)]
        _WEIGHTS = _group(store, "weights", 0, 1 + engines, backend) if engines else None
    elif rank >= trainers:
        index = rank - trainers
        _ENGINES = [(rank, _group(store, f"control-{index}", 1, 2, "gloo"))]
        _WEIGHTS = _group(store, "weights", 1 + index, 1 + engines, backend)


def disconnect_engines() -> None:
    """Shut the engine groups down while this process is alive (left to the interpreter's exit, a gloo group's
    threads may abort it), once rank 0 and the engines are done with them (`remote.serve` answered its close)."""
    global _ENGINES, _WEIGHTS
    for group in [control for _, control in _ENGINES] + ([_WEIGHTS] if _WEIGHTS is not None else []):
        group.shutdown()
    _ENGINES, _WEIGHTS = [], None


def _group(store, name: str, rank: int, size: int, backend: str):
    import torch.distributed as dist

    prefixed = dist.PrefixStore(f"ablate-engines/{name}", store)
    if backend == "nccl":  # (untested here: the CPU build has no NCCL)
        from torch.distributed.distributed_c10d import ProcessGroupNCCL

        options = ProcessGroupNCCL.Options()
        options._timeout = ENGINE_GROUP_TIMEOUT
        return ProcessGroupNCCL(prefixed, rank, size, options)
    return dist.ProcessGroupGloo(prefixed, rank, size, ENGINE_GROUP_TIMEOUT)


def trainer_group():
    """The trainer ranks' process group: the world of torch.distributed (the engine processes are not in it)."""
    import torch.distributed as dist

    return dist.group.WORLD


def weights_group():
    """Rank 0 and the engine processes (None when there are none)."""
    return _WEIGHTS


def engine_groups() -> list[tuple[int, object]]:
    """(rank in the job, control group) of each generator engine's process; empty when there are none."""
    return list(_ENGINES)


def launch(cfg, fn, *args, **kwargs):
    """Run `fn(*args, **kwargs)` (the trainer) on the layout `cfg.run` names; return what it returns.

    One process in all (one trainer rank, no engine process): here, in this process. More: `cfg.run.trainer_gpus`
    trainer ranks and `cfg.run.generator_gpus` engine processes (torch's elastic launcher, as torchrun; gloo on the
    CPU, nccl on GPUs), rank 0 running `fn`, the other trainer ranks following it, the engine processes serving it.
    The job itself is one process per node (a SLURM task, a local job): it starts its node's share of the ranks, so
    `python -m ablate` is not to be run under torchrun. On a job of several nodes (`_nodes`) node i starts ranks
    i x P .. i x P + P - 1 (P = the processes per node) and node 0 hosts the rendezvous; only node 0's call
    returns what `fn` returned (rank 0 is there), the others return None."""
    trainers, engines = int(cfg.run.trainer_gpus), int(cfg.run.get("generator_gpus", 0))
    world = trainers + engines
    nodes, node, endpoint, run_id = _nodes()
    if world == 1 and nodes == 1:
        return fn(*args, **kwargs)
    if world % nodes:
        raise ValueError(f"{world} processes do not spread evenly over the job's {nodes} nodes")
    from ablate.policy import device_of

    if device_of(cfg.model).type == "cuda" and world // nodes > torch.cuda.device_count():
        raise ValueError(f"{layout_name(trainers, engines)}: this node has {torch.cuda.device_count()} CUDA "
                         "device(s), one per process (model.device=cpu runs them on the CPU)")
    from omegaconf import OmegaConf
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    plain = OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else cfg
    if nodes == 1:
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world, rdzv_backend="c10d",
                              rdzv_endpoint=endpoint, run_id=run_id, max_restarts=0, start_method="spawn")
    else:  # static: node i's ranks are i x P.. whatever order the nodes start in (rank 0, the leader, on node 0)
        config = LaunchConfig(min_nodes=nodes, max_nodes=nodes, nproc_per_node=world // nodes, rdzv_backend="static",
                              rdzv_endpoint=endpoint, rdzv_configs={"rank": node}, run_id=run_id, max_restarts=0,
                              start_method="spawn")
    # the launcher's notes on starting and stopping its workers (each of its modules has a logger with its own level)
    quiet = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
             if name.startswith("torch.distributed.elastic")]
    levels = [log.level for log in quiet]
    for log in quiet:
        log.setLevel(logging.ERROR)
    # SLURM's warning (USR2, before a time limit or a preemption) is rank 0's to act on: at the end of its step it
    # checkpoints (every rank writes its shards) and stops; then this process hands the warning to the handler it
    # displaced (submitit's: requeue the job). Here it is only noted, and passed on to the ranks once (SLURM may
    # have signalled them too: rank 0 holds it either way, the others ignore it).
    warned: list[int] = []
    once = threading.Lock()

    def note_warning(signum, frame) -> None:
        if once.acquire(blocking=False):
            warned.append(signum)
            for pid in _ranks_started_here():
                os.kill(pid, signal.SIGUSR2)

    displaced = signal.signal(signal.SIGUSR2, note_warning)
    cpp_log = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = cpp_log or "ERROR"  # the ranks: no warnings of collectives a Ctrl-C cut off
    try:
        with _ranks_born_with_the_warning_blocked(note_warning):
            results = elastic_launch(config, _rank_main)(plain, fn, args, kwargs)
    except SignalException as err:  # Ctrl-C reached the launcher: it stopped the ranks (rank 0 closed its run)
        if err.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise
    except ChildFailedError as err:  # one line: which rank, and its error
        rank, failure = err.get_first_failure()
        message = failure.message.get("message", "") if isinstance(failure.message, dict) else failure.message
        log = failure.error_file if os.path.isfile(failure.error_file) else "above"
        if failure.exitcode > 0 and log == "above":  # no Python error: torch's message would be a link to its docs
            message = f"it exited with code {failure.exitcode}"
        who = f"trainer rank {rank}" if rank < trainers else f"the generator engine's process (rank {rank})"
        raise RuntimeError(f"{who} failed: {str(message).strip().splitlines()[-1] if message else '?'}"
                           f" (its log: {log})") from None
    finally:
        for log, level in zip(quiet, levels):
            log.setLevel(level)
        if cpp_log is None:
            os.environ.pop("TORCH_CPP_LOG_LEVEL")
        signal.signal(signal.SIGUSR2, displaced)
    if node != 0:  # rank 0 and its result are on node 0 (whose task requeues the job at SLURM's warning)
        return None
    if warned and results[0] is None:  # rank 0 stopped at the warning, its checkpoint written: requeue
        if callable(displaced):
            displaced(signal.SIGUSR2, None)  # submitit: requeue, then SystemExit
        raise KeyboardInterrupt("SIGUSR2 with no handler to requeue the job")
    return results[0]


@contextmanager
def _ranks_born_with_the_warning_blocked(note: Callable) -> Iterator[None]:
    """SLURM's warning (USR2) reaches every process of the job, whenever it comes: also a rank still starting
    (importing torch), where USR2 still does what it does by default, which is to end the process. The job would
    fail instead of requeuing. So this thread blocks USR2 while it starts the ranks: they are born with it blocked
    (a process inherits its parent's signal mask), and a warning waits in each until `_rank_main` has set that rank's
    handler and unblocks it. Meanwhile this process's own warning is taken by a thread of its own, for `note` (the
    Python handler `note` still catches it where another thread, started before and not blocking it, gets it)."""
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


def _take_the_warning(handler) -> None:
    """A rank's answer to SLURM's warning, set: then unblock it (`_ranks_born_with_the_warning_blocked`), which
    delivers one that came while the rank was starting."""
    signal.signal(signal.SIGUSR2, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})


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


def _nodes() -> tuple[int, int, str, str]:
    """(nodes, this node's index, rendezvous endpoint, run id) of the job: SLURM's job of several nodes (one task
    per node: submitit's default), the first node hosting the rendezvous on a port derived from the job id (every
    node computes the same one); else this machine alone."""
    import uuid

    nodes = node_count()
    if nodes == 1:
        return 1, 0, "localhost:0", uuid.uuid4().hex
    job, listed = os.environ["SLURM_JOB_ID"], os.environ["SLURM_JOB_NODELIST"]
    head = listed
    if "[" in listed or "," in listed:  # node[1-4] -> node1
        import subprocess

        head = subprocess.run(["scontrol", "show", "hostnames", listed], capture_output=True, text=True,
                              check=True).stdout.split()[0]
    return nodes, int(os.environ["SLURM_NODEID"]), f"{head}:{29500 + int(job) % 10000}", f"ablate-{job}"


@record  # a rank's error goes to a file its launcher reads: the one line `launch` raises names it
def _rank_main(cfg: dict, fn, args: tuple, kwargs: dict):
    """One rank of `launch`: join the group; rank 0 runs `fn` and finally releases the others; they follow."""
    import torch.distributed as dist
    from omegaconf import OmegaConf

    global _LEADING
    _LEADING = True
    from ablate.generators import remote
    from ablate.policy import device_of

    trainers, engines = int(cfg["run"]["trainer_gpus"]), int(cfg["run"].get("generator_gpus", 0))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0))
    if rank >= trainers:  # a generator engine's process: its own GPU, no world of ours; serve rank 0
        return _engine_main(cfg, rank, local, trainers, engines)
    on_gpu = device_of(OmegaConf.create(cfg["model"])).type == "cuda"  # the weights' device decides, not the machine
    if on_gpu:
        torch.cuda.set_device(local)
    backend = "nccl" if on_gpu else "gloo"
    dist.init_process_group(backend, world_size=trainers, rank=rank)
    if rank == 0:
        connect_engines(_job_store(), rank, trainers, engines, backend)
    try:
        if rank != 0:
            _take_the_warning(signal.SIG_IGN)  # the warning is rank 0's (`launch`)
            result = follow(OmegaConf.create(cfg))
        else:
            try:
                # what the trainer hands the warning to once it has checkpointed: the end of this rank (the launcher's
                # process requeues the job); one that came while this rank started ends it here, before `fn`
                _take_the_warning(_stop_for_requeue)
                result = fn(*args, **kwargs)
            except SystemExit as stop:  # stopped at SLURM's warning (`_stop_for_requeue`): an end like any other
                if stop.code not in (0, None):
                    raise
                result = None
            finally:
                # the run is over: a warning now changes nothing, and would end this process once Python, exiting,
                # resets its handlers to the default (which for USR2 is to die: a finished job reported failed)
                signal.signal(signal.SIGUSR2, signal.SIG_IGN)
                _broadcast(("stop", ()))
                remote.release()  # engine processes the trainer never reached (it ended before building them)
                disconnect_engines()
        dist.barrier()  # no rank tears the group down while another may still be in it (a failed rank's launcher
        # stops the others instead)
        return result
    finally:
        dist.destroy_process_group()


def _engine_main(cfg: dict, rank: int, local: int, trainers: int, engines: int) -> None:
    """An engine process. With generator.tensor_parallel_size=t, processes trainers + k t .. + t - 1 make engine
    k (on one node: ablate.config.check_run): on GPUs they see that engine's GPUs, each using its own; they form a
    torch.distributed world of their own (on the job's store) for vLLM's tensor parallelism (its external-launcher
    executor, as verl runs vLLM in torchrun's processes), with RANK and LOCAL_RANK as vLLM reads them. With t = 1 an
    engine process has no world (vLLM makes its own, of one). Then it joins rank 0's engine groups and serves rank 0
    until told to close."""
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from ablate.generators import remote
    from ablate.policy import device_of

    _take_the_warning(signal.SIG_IGN)  # the warning is rank 0's (`launch`)
    tp = int(cfg["generator"].get("tensor_parallel_size", 1))
    engine, tp_rank = divmod(rank - trainers, tp)
    if str(cfg["model"].get("device", "auto")) != "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = engine_gpus(local, tp_rank, tp, os.environ.get("CUDA_VISIBLE_DEVICES"))
    on_gpu = device_of(OmegaConf.create(cfg["model"])).type == "cuda"
    if on_gpu:
        torch.cuda.set_device(tp_rank)
    store = _job_store()
    for name in ("GROUP_RANK", "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        os.environ.pop(name, None)
    os.environ.update(RANK=str(tp_rank), LOCAL_RANK=str(tp_rank), WORLD_SIZE=str(tp), LOCAL_WORLD_SIZE=str(tp))
    backend = "nccl" if on_gpu else "gloo"
    if tp > 1:
        dist.init_process_group(backend, store=dist.PrefixStore(f"ablate-tp/{engine}", store), rank=tp_rank,
                                world_size=tp)
    connect_engines(store, rank, trainers, engines, backend)
    try:
        remote.serve()
    finally:
        disconnect_engines()
        if dist.is_initialized():  # the tensor-parallel world (or vLLM's own), before the interpreter's exit
            dist.destroy_process_group()


def engine_gpus(local: int, tp_rank: int, tp: int, visible: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for the engine process of local rank `local`, rank `tp_rank` of an engine of `tp`: the
    engine's GPUs on this node (local ranks local - tp_rank ..), as the node lists them in `visible` (None: all)."""
    listed = visible.split(",") if visible else None
    return ",".join(listed[i] if listed else str(i) for i in range(local - tp_rank, local - tp_rank + tp))


def _job_store():
    """The job's rendezvous store (the launcher's, at MASTER_ADDR:MASTER_PORT), as a client."""
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(minutes=10))


def _ranks_started_here() -> list[int]:
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


def _stop_for_requeue(signum, frame) -> None:
    raise SystemExit(0)  # the trainer keeps the run RUNNING; `launch` sees rank 0 end with nothing and requeues


def follow(cfg) -> None:
    """A rank other than 0: wait for the leader's calls and make the same ones, until it says stop."""
    from ablate.policy import build_policy, build_tokenizer
    from ablate.trainer import Learner

    ranks: FSDP | None = None
    learner = None
    while True:
        name, args = _broadcast(None)
        if name == "stop":
            return
        if name == "begin":  # the leader is building its learner: build ours (its weights come from rank 0's)
            ranks = FSDP(int(cfg.run.trainer_gpus))
            learner = Learner(cfg, build_policy(cfg.model, cfg.seed, build_tokenizer(cfg.model)), ranks=ranks)
        elif name == "step":
            try:
                learner.step(*args)
            except FloatingPointError:  # every rank sees the same non-finite loss: the leader ends the run
                pass
        elif name == "gather":
            ranks.gathered(learner.policy)
        elif name == "stream":
            for _ in ranks.weights(learner.policy):
                pass
        elif name == "save":
            ranks.save(learner, *args)
        elif name == "load":
            ranks.load(learner, *args)
        else:
            raise RuntimeError(f"unknown call from rank 0: {name!r}")


def _broadcast(message):
    """Rank 0's message to every rank (the others pass None and get it)."""
    import torch.distributed as dist

    box = [message]
    dist.broadcast_object_list(box, src=0, group=trainer_group())
    return box[0]
