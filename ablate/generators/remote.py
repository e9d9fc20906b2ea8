"""Generator engines in processes of their own (run.generator_gpus=N): they decode there, each on its own device,
while the pipeline that decides what they decode and when they take new weights stays with trainer rank 0.

`RemoteEngine` (in rank 0) speaks the engine interface (ablate/generators/engine.py) to them over one gloo `control`
group per engine process, deals each wave of rows across them, and streams each step's weights over the `weights`
group into their staging copies (or straight into vLLM: generator.weight_transfer=direct). `serve` is the whole life
of an engine's process (ablate/processes.py starts it). Transport, staging, validation and tensor parallelism:
docs/design.md#engine-processes.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import pickle
import threading
import time
from collections.abc import Callable, Mapping

import torch

from ablate.distributed.groups import Groups
from ablate.distributed.layouts import Weights
from ablate.generators.engine import Engine, Limits, Sequence, decode

log = logging.getLogger(__name__)


def _exchange(message, src: int, group):
    """`message` from member `src` of a control group (0: rank 0, 1: the engine process) to the other, who passes
    None and gets it: pickled, its length then its bytes broadcast over the group."""
    if group.rank() == src:
        data = torch.frombuffer(bytearray(pickle.dumps(message)), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.long)
    else:
        size = torch.zeros(1, dtype=torch.long)
    group.broadcast(size, src).wait()
    if group.rank() != src:
        data = torch.empty(int(size.item()), dtype=torch.uint8)
    group.broadcast(data, src).wait()
    return message if group.rank() == src else pickle.loads(data.numpy().tobytes())


class _RemoteRng:
    """The engines' sampling generators, as the pipeline's checkpoint reads and restores them (one state each)."""

    def __init__(self, engine: RemoteEngine):
        self.engine = engine

    def get_state(self) -> list[torch.Tensor]:
        return self.engine._all("rng_get")

    def set_state(self, states: list[torch.Tensor]) -> None:
        if not isinstance(states, list) or len(states) != len(self.engine.engines):
            raise ValueError(f"a checkpoint of the generator with {1 if not isinstance(states, list) else len(states)}"
                             f" engine(s) does not resume on run.generator_gpus={len(self.engine.engines)}")
        self.engine._all("rng_set", per_engine=[(state,) for state in states])


def engine_seed(seed: int, index: int) -> int:
    """Engine `index`'s sampling seed: the run's for the first (one engine samples as the in-process engine does)."""
    return seed + 1_000_003 * index


class RemoteEngine:
    """Rank 0's handle on the engines in other processes (run.generator_gpus of them): the `Engine` interface, each
    call a request answered by those processes. A wave of rows is dealt across the engines in contiguous slices
    (data parallel); a step asks every busy engine before waiting for any, so they decode at the same time; new
    weights are broadcast to all of them at once, tensor by tensor (`stage`). Thread-safe (the concurrent
    pipeline's thread steps it while the trainer publishes and checkpoints)."""

    stages = True  # new weights go to the engines' staging copies first (`stage`), then `load(None, ...)` takes them
    # the concurrent mode's seconds between two looks (pipeline.RUN_AHEAD_S in one process): a look is a round trip
    # to every engine, so a run of steps a look, not one (an 8B decode step: 20-50 ms); weights published meanwhile
    # wait that long at most, against a trainer step of minutes at that size
    run_ahead_s = 1.0

    def __init__(self, model: Mapping, limits: Limits, weights: Mapping[str, torch.Tensor] | Weights, *,
                 groups: Groups, seed: int, build: Callable | None = None, tensor_parallel: int = 1, **engine_args):
        """`model`: the policy's config (the engines' staging copies are built from it); `groups`: rank 0's groups
        with the engine processes (ablate/distributed/groups.py); `build(limits, seed,
        engine_args)`, called in each engine process, makes the engine that decodes there (None: ours, `Engine`);
        it is pickled, so a module-level function or a partial of one. `tensor_parallel` processes in a row make one
        engine (vLLM's tensor parallelism: each is asked the same, and they answer the same)."""
        # the engine processes' ranks; their groups are shut down by whoever made them (ablate/processes.py), once
        # the run is over (a process group left for the interpreter's exit to destroy may abort it)
        self.groups = groups
        self.engines = [rank for rank, _ in groups.engines]
        if not self.engines:
            raise RuntimeError("no generator engine processes were started (run.generator_gpus > 0, in a job started "
                               "by ablate.processes.launch)")
        if len(self.engines) % tensor_parallel:
            raise ValueError(f"{len(self.engines)} engine processes do not make engines of {tensor_parallel}")
        # engine k: the processes (indices into self.engines) of its tensor-parallel ranks
        self.members = [list(range(k, k + tensor_parallel)) for k in range(0, len(self.engines), tensor_parallel)]
        self.limits = limits
        self._lock = threading.Lock()
        self._rows: dict[int, Sequence] = {}  # key -> the pipeline's own row object, updated in place as it ends
        self._running = [0] * len(self.members)  # rows running on each engine
        self._next_key = 0
        self.waves: list[int] = []  # rows per wave in flight on the busiest engine (the pipeline counts them)
        self.decode_steps = 0  # of the engine that took the most in each request
        self._step_s = 0.0  # seconds a decode step took the slowest engine in the last request (0: none yet)
        replies = self._all("init", dict(model), limits, engine_args, build,
                            per_engine=[(engine_seed(seed, k),) for k, members in enumerate(self.members)
                                        for _ in members])
        self.device, self.weights_dtype = torch.device(replies[0]["device"]), replies[0]["dtype"]
        # the engines take new weights as they arrive, into what they decode with (no staging copy): validation
        # decodes there too, on every tensor-parallel rank
        self.receives = replies[0]["receives"]
        self.params = max(reply["params"] for reply in replies)  # weights held on one device (the most)
        self.rng = _RemoteRng(self)
        self.staged: int | None = None  # the version in the engines' staging copies
        self.load(weights, version=0)

    @property
    def running(self) -> int:
        return len(self._rows)

    @property
    def devices(self) -> int:
        """The devices decoding the pipeline's rows: one a process."""
        return len(self.engines)

    def start(self, rows: list[Sequence]) -> None:
        """The rows in contiguous slices, one per engine (the first engines take one more when they do not divide)."""
        keyed = []
        for row in rows:
            keyed.append((self._next_key, row))
            self._next_key += 1
        n = len(self.members)
        bounds = [len(keyed) * k // n for k in range(n + 1)]
        slices = [keyed[bounds[k]:bounds[k + 1]] for k in range(n)]
        busy = [k for k, part in enumerate(slices) if part]
        waves = self._each_engine("start", busy, [(slices[k],) for k in busy])
        for k in busy:
            self._running[k] += len(slices[k])
        self._rows.update(keyed)
        self.waves = max(waves, key=len, default=self.waves)

    def step(self) -> list[Sequence]:
        return self.advance(1)

    def advance(self, steps: int, seconds: float = 0.0) -> list[Sequence]:
        """Every busy engine decodes until a wave of its own ends, `steps` steps, or `seconds` (ablate.generators.
        engine.advance), all at once; one request and one answer each, however many steps they took. The seconds
        become a count of steps here, at the pace the slowest engine measured itself decoding in the last request:
        an engine's tensor-parallel processes must stop after the same step (each step is a collective among them),
        which their own clocks would not agree on. Before, the pace was rank 0's round trip over the steps, which
        holds every exchange and every engine in turn: once that passed `seconds`, an engine took one step a request
        for good."""
        if seconds > 0:
            steps = min(steps, max(1, int(seconds / self._step_s))) if self._step_s else 1
        busy = [k for k, count in enumerate(self._running) if count]
        mine, waves, took, pace = [], [], 0, 0.0
        for k, (ended, engine_waves, taken, spent) in zip(busy, self._each_engine("advance", busy,
                                                                                 [(steps,)] * len(busy))):
            took = max(took, taken)
            if taken:
                pace = max(pace, spent / taken)
            self._running[k] -= len(ended)
            waves.append(engine_waves)
            for key, row in ended:
                own = self._rows.pop(key)
                own.__dict__.update(row.__dict__)  # the pipeline's object, as the engine left it
                mine.append(own)
        self.waves = max(waves, key=len, default=[])
        self.decode_steps += took
        if took:
            self._step_s = pace
        return mine

    def _each_engine(self, name: str, engines: list[int], args: list[tuple] | None = None) -> list:
        """The same request to every process of each of `engines` (its own arguments from `args`); the answer of
        each engine's first process, once the others' match it (tensor-parallel ranks sample the same tokens)."""
        only = [i for k in engines for i in self.members[k]]
        per_engine = [args[j] for j, k in enumerate(engines) for _ in self.members[k]] if args else None
        replies = iter(self._all(name, per_engine=per_engine, only=only))
        answers = []
        for k in engines:
            first, *others = [next(replies) for _ in self.members[k]]
            if any(_outcome(other) != _outcome(first) for other in others):
                raise RuntimeError(f"the {len(self.members[k])} tensor-parallel processes of generator engine {k} "
                                   f"answered {name} differently")
            answers.append(first)
        return answers

    def stage(self, weights: Mapping[str, torch.Tensor] | Weights, version: int) -> None:
        """The weights into every engine's staging copy, one tensor at a time in the engines' dtype, broadcast to
        all of them at once (from FSDP's shards: each tensor gathered as it is sent); the copies they decode with
        stay as they are until `load`. An engine refuses (before anything is sent or gathered) a set that misses one
        of its tensors or has one it lacks."""
        names, pairs = (list(weights), weights.items()) if isinstance(weights, Mapping) else \
            (weights.names(), weights.stream())
        with self._lock:
            self._ask("stage", names, version)  # refused: nothing was sent, the staging copies keep what they had
            self.staged, device = None, None
            for _, tensor in pairs:
                tensor = tensor.detach().to(self.weights_dtype) if tensor.is_floating_point() else tensor.detach()
                self.groups.weights.broadcast(tensor.contiguous(), 0).wait()
                device = tensor.device
            _until_sent(device)
            self._answers()
            self.staged = version

    def load(self, weights: Mapping[str, torch.Tensor] | Weights | None, version: int) -> None:
        """The engines decode with these weights from their next step on (None: those staged, of `version`)."""
        if weights is not None:
            self.stage(weights, version)
        if self.staged != version:
            raise RuntimeError(f"the engines' staging copy holds weights of version {self.staged}, not {version}")
        self._all("load", version)
        self.version = version

    def decode_staged(self, rows: list[Sequence], seed: int, max_waves: int, wave_rows: int,
                      on_engine: bool = False) -> str:
        """Every row to its end with the weights last published (validation), dealt across the engines in slices,
        engine k sampling with engine_seed(seed, k) in its first process; the rows are filled in place. On the
        engines themselves where they receive the weights or `on_engine` (they hold the weights just published) and
        can decode apart (vLLM); else on their staging copies, with our torch engine. Returns which: "engine" or
        "staging copy"."""
        n = len(self.members)
        bounds = [len(rows) * k // n for k in range(n + 1)]
        busy = [k for k in range(n) if bounds[k + 1] > bounds[k]]
        args = [(rows[bounds[k]:bounds[k + 1]], engine_seed(seed, k)) for k in busy]
        if self.receives or on_engine:  # on the engines themselves: every tensor-parallel rank decodes
            done = self._each_engine("decode_staged", busy, [(max_waves, wave_rows, on_engine, *a) for a in args])
        else:  # on a staging copy: an engine's first process holds a whole one
            done = self._all("decode_staged", max_waves, wave_rows, on_engine, only=[self.members[k][0] for k in busy],
                             per_engine=args)
        for k, (where, ended) in zip(busy, done):
            for own, row in zip(rows[bounds[k]:bounds[k + 1]], ended):
                own.__dict__.update(row.__dict__)
        return where if busy else "staging copy"

    def checksums(self) -> list[dict[str, str]]:
        """sha256 of each of each engine's tensors (its own copy, in its dtype)."""
        return self._all("checksums")

    def close(self) -> None:
        with self._lock:
            open_ = [i for i, rank in enumerate(self.engines) if rank not in self.groups.closed]
            if open_:
                self._ask("close", only=open_)
                self.groups.closed.update(self.engines[i] for i in open_)

    def _all(self, name: str, *shared, per_engine: list[tuple] | None = None, only: list[int] | None = None) -> list:
        with self._lock:
            return self._ask(name, *shared, per_engine=per_engine, only=only)

    def _ask(self, name: str, *shared, per_engine: list[tuple] | None = None, only: list[int] | None = None) -> list:
        """(The lock held.) One request to each engine process, `only` these (indices into self.engines): the
        `shared` arguments, then its own from `per_engine`; all are sent before any answer is awaited. Their
        answers, in order; an error from any raises."""
        only = list(range(len(self.engines))) if only is None else only
        for j, i in enumerate(only):
            _exchange((name, *shared, *(per_engine[j] if per_engine else ())), 0, self._control(i))
        return self._answers(only)

    def _answers(self, only: list[int] | None = None) -> list:
        only = list(range(len(self.engines))) if only is None else only
        replies = [(self.engines[i], _exchange(None, 1, self._control(i))) for i in only]
        for rank, (status, payload) in replies:
            if status == "error":
                raise RuntimeError(f"the generator engine's process (rank {rank}): {payload}")
        return [payload for _, (_, payload) in replies]

    def _control(self, i: int):
        """Engine process i's control group with rank 0."""
        return self.groups.engines[i][1]


def _outcome(reply) -> list:
    """What a start or advance reply decided: the rows' tokens, the waves' sizes, the decode steps taken (not the
    seconds an advance took, which each tensor-parallel process measures on its own clock)."""
    if isinstance(reply, tuple):
        ended, waves, steps = reply[:3]
        return [(key, row.tokens) for key, row in ended] + [waves, steps]
    return reply


def release(groups: Groups) -> None:
    """Rank 0, ending: close every engine process that was never started or closed (the trainer may have ended
    before building its generator), so that they leave their loop and the job ends together."""
    for rank, control in groups.engines:
        if rank not in groups.closed:  # waiting for its next request
            _exchange(("close",), 0, control)
            _exchange(None, 1, control)
            groups.closed.add(rank)


def checksum(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()


class _Served:
    """An engine process's side of the protocol: one method per request RemoteEngine makes (the table `_REQUESTS`),
    each returning the reply. The engine, its staging copy (the policy's architecture, weights not yet taken), and
    rank 0's keys for the running rows."""

    def __init__(self, groups: Groups):
        self.weights_group = groups.weights
        self.engine: Engine | None = None
        self.staged: torch.nn.Module | None = None
        self.engine_args: dict = {}
        self.keys: dict[int, int] = {}  # id of a running row -> rank 0's key for it

    def init(self, model: dict, limits: Limits, engine_args: dict, build: Callable | None, seed: int) -> dict:
        self.engine_args = engine_args
        if build is None:
            self.staged = _torch_model(model, engine_args["compute_dtype"])
            self.engine = Engine(copy.deepcopy(self.staged), limits, seed=seed, **engine_args)
        else:
            self.engine = build(limits, seed, engine_args)
            # an engine that receives the weights itself needs no staging copy: only its names and shapes
            self.staged = _torch_model(model, engine_args["compute_dtype"], "meta" if self.engine.receives else None)
        engine = self.engine
        return {"device": str(engine.device), "dtype": engine.weights_dtype, "params": engine.params,
                "receives": engine.receives}

    def stage(self, names: list[str], version: int, ready: Callable[[], None]) -> None:
        own = self.staged.state_dict()
        _check_names(names, own)
        ready()  # rank 0 sends the tensors now
        if self.engine.receives:  # straight into the engine, which decodes with them now
            self.engine.receive({n: tuple(own[n].shape) for n in names}, {n: own[n].dtype for n in names}, version,
                                self.weights_group)
        else:
            _receive(names, own, self.weights_group)

    def load(self, version: int) -> None:
        self.engine.load(self.staged.state_dict(), version)

    def decode_staged(self, max_waves: int, wave_rows: int, on_engine: bool, rows: list[Sequence],
                      seed: int) -> list:
        # no staging copy (the engine's own weights are the newest), or the engine holds the staged ones: on it
        if self.engine.receives or (on_engine and hasattr(self.engine, "decode_apart")):
            self.engine.decode_apart(rows, seed, wave_rows)
            return ["engine", rows]  # a list: tensor-parallel ranks' replies are compared as they are (_outcome)
        decode(Engine(self.staged, self.engine.limits, seed=seed, **self.engine_args), rows, max_waves, wave_rows)
        return ["staging copy", rows]

    def start(self, keyed: list[tuple[int, Sequence]]) -> list[int]:
        self.keys.update({id(row): key for key, row in keyed})
        self.engine.start([row for _, row in keyed])
        return [len(w) for w in self.engine.waves]

    def advance(self, steps: int) -> tuple[list, list[int], int, float]:
        """The rows that ended, the waves left, the decode steps taken and the seconds they took here (not rank 0's
        round trip, which also holds the exchanges and the other engines)."""
        before, began = self.engine.decode_steps, time.perf_counter()
        done = [(self.keys.pop(id(row)), row) for row in self.engine.advance(steps)]
        return done, [len(w) for w in self.engine.waves], self.engine.decode_steps - before, \
            time.perf_counter() - began

    def rng_get(self):
        return self.engine.rng.get_state()

    def rng_set(self, state) -> None:
        self.engine.rng.set_state(state)

    def checksums(self) -> dict[str, str]:
        if not hasattr(self.engine, "model"):
            raise RuntimeError(f"{type(self.engine).__name__} keeps its weights in a layout of its own: no checksums "
                               "by the trainer's names")
        return {n: checksum(t) for n, t in self.engine.model.state_dict().items()}

    def close(self, rank: int) -> None:
        """The engine first (vLLM shuts its core and its groups down); a failure is said here, and ends all the same."""
        try:
            if self.engine is not None:
                self.engine.close()
        except Exception as err:  # noqa: BLE001 - rank 0 is ending
            log.warning("the generator engine's process (rank %d) could not close its engine: %s", rank, err)


_REQUESTS = {name: getattr(_Served, name)
             for name in ("init", "load", "decode_staged", "start", "advance", "rng_get", "rng_set", "checksums")}


def serve(groups: Groups) -> None:
    """The engine process: answer rank 0's requests (RemoteEngine's) until it says close."""
    ((rank, control),) = groups.engines
    served = _Served(groups)
    while True:
        name, *args = _exchange(None, 0, control)
        if name == "close":
            served.close(rank)
            _exchange(("ok", None), 1, control)
            return
        try:
            if name == "stage":  # two answers: ready for the tensors, then done
                served.stage(*args, ready=lambda: _exchange(("ok", None), 1, control))
                reply = None
            elif name in _REQUESTS:
                reply = _REQUESTS[name](served, *args)
            else:
                raise RuntimeError(f"unknown request {name!r}")
            answer = ("ok", reply)
        except Exception as err:  # noqa: BLE001 - rank 0 raises it, with its cause, in the trainer
            answer = ("error", f"{type(err).__name__}: {err}")
        _exchange(answer, 1, control)


def _torch_model(model: dict, dtype: torch.dtype, device: str | None = None) -> torch.nn.Module:
    """The trainer's architecture, made in the compute dtype on this process's device, or on `device` ("meta": names
    and shapes, no memory); model.path's checkpoint is not read: the weights come from rank 0 by `stage`."""
    from omegaconf import OmegaConf

    from ablate.policy import build_policy

    cfg = OmegaConf.create(model)
    if device is not None:
        cfg.device = device
    return build_policy(cfg, 0, read_weights=False, dtype=dtype).eval()


def _check_names(names: list[str], own: dict[str, torch.Tensor]) -> None:
    missing, extra = sorted(set(own) - set(names)), sorted(set(names) - set(own))
    problems = []
    if missing:
        problems.append(f"new weights miss {len(missing)} of the engine's tensors ({', '.join(missing[:3])})")
    if extra:
        problems.append(f"new weights have {len(extra)} tensors the engine lacks ({', '.join(extra[:3])})")
    if problems:
        raise ValueError("; ".join(problems))


@torch.no_grad()
def _receive(names: list[str], into: dict[str, torch.Tensor], group) -> None:
    """Rank 0's tensors, in the order of `names`, each broadcast straight into the staging copy's own tensor."""
    for name in names:
        group.broadcast(into[name], 0).wait()
    _until_sent(next(iter(into.values())).device if names else None)


def _until_sent(device: torch.device | None) -> None:
    """An NCCL work's `wait()` only orders this stream after it: block until the transfers are done, so that the
    sync's time (perf/weight_*_s) includes them and a reply says they have landed. Nothing to wait for on the CPU."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
