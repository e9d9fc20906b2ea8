"""A generator engine in a process of its own (run.generator_gpus=1): it decodes there, on its own device, while
the pipeline that decides what it decodes and when it takes new weights stays with trainer rank 0.

The split is at the engine's interface (ablate/generators/engine.py: start, step, load, running, waves, rng), the
one the pipeline already drives; the pipeline's rules (k-staleness, every prompt started once and trained once,
the deterministic schedule) are therefore unchanged, and a deterministic run gives the same tokens as with the
engine in rank 0's process. As PipelineRL's actor and inference processes, prime-rl's orchestrator and inference
server: rank 0 asks, the engine process answers.

Transport (torch.distributed, groups made by ablate/parallel.py when the job starts, one pair per engine process):
- `control`, gloo whatever the device: each call of `RemoteEngine` is one request from rank 0 and one reply from
  the engine process (pickled objects: the rows started, the rows that ended, the random state, errors as text).
- `weights`, the job's backend (nccl on GPUs, gloo on the CPU): `load` sends the weights one tensor at a time,
  already in the engine's dtype (bf16 halves the traffic), and the engine copies each into its own tensor.

`RemoteEngine` lives in rank 0; `serve` is the whole life of the engine's process (ablate/parallel.py starts it).
Data parallel over several engine processes, and vLLM engines in them, are not built yet (the config check says so).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Mapping

import torch
import torch.distributed as dist

from ablate import parallel
from ablate.generators.engine import Engine, Limits, Sequence

_CLOSED: set[int] = set()  # engine processes rank 0 has told to close


def _exchange(message, src: int, group):
    """`message` from rank `src` to the other member of `group` (the receiver passes None and gets it)."""
    box = [message]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


class _RemoteRng:
    """The engine's sampling generator, as the pipeline's checkpoint reads and restores it."""

    def __init__(self, engine: RemoteEngine):
        self.engine = engine

    def get_state(self) -> torch.Tensor:
        return self.engine._call("rng_get")

    def set_state(self, state: torch.Tensor) -> None:
        self.engine._call("rng_set", state)


class RemoteEngine:
    """Rank 0's handle on the engine in another process: the `Engine` interface, each call a request answered by
    that process. Thread-safe (the concurrent pipeline's thread steps it while the trainer checkpoints)."""

    def __init__(self, model: Mapping, limits: Limits, weights: Mapping[str, torch.Tensor], *, seed: int,
                 **engine_args):
        engines = parallel.engine_groups()
        if len(engines) != 1:
            raise RuntimeError(f"{len(engines)} generator engine processes were started; this engine drives one "
                               "(run.generator_gpus=1, in a job started by ablate.parallel.launch)")
        (self.rank, self.control, self.weights_group), = engines
        self.limits = limits
        self._lock = threading.Lock()
        self._rows: dict[int, Sequence] = {}  # key -> the pipeline's own row object, updated in place as it ends
        self._next_key = 0
        self.waves: list[int] = []  # rows per wave in flight (the pipeline counts them)
        reply = self._call("init", dict(model), limits, seed, engine_args)
        self.device, self.weights_dtype = torch.device(reply["device"]), reply["dtype"]
        self.rng = _RemoteRng(self)
        self.load(weights, version=0)

    @property
    def running(self) -> int:
        return len(self._rows)

    def start(self, rows: list[Sequence]) -> None:
        keyed = {}
        for row in rows:
            keyed[self._next_key] = row
            self._next_key += 1
        self.waves = self._call("start", list(keyed.items()))
        self._rows.update(keyed)

    def step(self) -> list[Sequence]:
        ended, self.waves = self._call("step")
        mine = []
        for key, row in ended:
            own = self._rows.pop(key)
            own.__dict__.update(row.__dict__)  # the pipeline's object, as the engine left it
            mine.append(own)
        return mine

    def load(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """The weights, one tensor at a time in the engine's dtype, over the weights group; the engine process
        refuses (before anything is sent) a set that misses one of its tensors or has one it lacks."""
        weights = weights if isinstance(weights, Mapping) else dict(weights)
        with self._lock:
            _exchange(("load", version, list(weights)), 0, self.control)
            self._raise(_exchange(None, self.rank, self.control))
            for name, tensor in weights.items():
                dist.broadcast(tensor.detach().to(self.weights_dtype).contiguous(), src=0, group=self.weights_group)
            self._raise(_exchange(None, self.rank, self.control))
        self.version = version

    def checksums(self) -> dict[str, str]:
        """sha256 of each of the engine's tensors (its own copy, in its dtype)."""
        return self._call("checksums")

    def close(self) -> None:
        if self.rank not in _CLOSED:
            self._call("close")
            _CLOSED.add(self.rank)

    def _call(self, *request):
        with self._lock:
            _exchange(request, 0, self.control)
            return self._raise(_exchange(None, self.rank, self.control))

    def _raise(self, reply):
        status, payload = reply
        if status == "error":
            raise RuntimeError(f"the generator engine's process (rank {self.rank}): {payload}")
        return payload


def release() -> None:
    """Rank 0, ending: close every engine process that was never started or closed (the trainer may have ended
    before building its generator), so that they leave their loop and the job ends together."""
    for rank, control, _ in parallel.engine_groups():
        if rank not in _CLOSED:  # waiting for its next request
            _exchange(("close",), 0, control)
            _exchange(None, rank, control)
            _CLOSED.add(rank)


def checksum(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()


def serve() -> None:
    """The engine process: answer rank 0's requests until it says close."""
    rank = dist.get_rank()
    ((_, control, weights_group),) = [e for e in parallel.engine_groups() if e[0] == rank]
    engine: Engine | None = None
    keys: dict[int, int] = {}  # id of a running row -> rank 0's key for it
    while True:
        name, *args = _exchange(None, 0, control)
        try:
            if name == "close":
                _exchange(("ok", None), rank, control)
                return
            if name == "init":
                engine = _build(*args)
                reply = {"device": str(engine.device), "dtype": engine.weights_dtype}
            elif name == "load":
                version, names = args
                own = engine.model.state_dict()
                if set(names) != set(own):
                    missing, extra = sorted(set(own) - set(names)), sorted(set(names) - set(own))
                    raise ValueError(f"new weights miss {len(missing)} of the engine's tensors "
                                     f"({', '.join(missing[:3])}) and have {len(extra)} it lacks "
                                     f"({', '.join(extra[:3])})")
                _exchange(("ok", None), rank, control)  # ready: rank 0 sends the tensors
                engine.load(_received(names, own, weights_group), version)
                reply = None
            elif name == "start":
                keys.update({id(row): key for key, row in args[0]})
                engine.start([row for _, row in args[0]])
                reply = [len(w.rows) for w in engine.waves]
            elif name == "step":
                done = [(keys.pop(id(row)), row) for row in engine.step()]
                reply = (done, [len(w.rows) for w in engine.waves])
            elif name == "rng_get":
                reply = engine.rng.get_state()
            elif name == "rng_set":
                engine.rng.set_state(args[0])
                reply = None
            elif name == "checksums":
                reply = {n: checksum(t) for n, t in engine.model.state_dict().items()}
            else:
                raise RuntimeError(f"unknown request {name!r}")
            answer = ("ok", reply)
        except Exception as err:  # noqa: BLE001 - rank 0 raises it, with its cause, in the trainer
            answer = ("error", f"{type(err).__name__}: {err}")
        _exchange(answer, rank, control)


def _build(model: dict, limits: Limits, seed: int, engine_args: dict) -> Engine:
    """The engine's own model: the trainer's architecture, in the compute dtype, on this process's device (its
    weights arrive with the first load)."""
    from omegaconf import OmegaConf

    from ablate.policy import build_policy, build_tokenizer

    cfg = OmegaConf.create(model)
    policy = build_policy(cfg, seed, build_tokenizer(cfg))
    return Engine(policy.to(engine_args["compute_dtype"]).eval(), limits, seed=seed, **engine_args)


def _received(names: list[str], own: dict[str, torch.Tensor], group):
    """(name, tensor) pairs as they arrive from rank 0, one buffer at a time."""
    for name in names:
        buffer = torch.empty_like(own[name])
        dist.broadcast(buffer, src=0, group=group)
        yield name, buffer
