"""Weights from the trainer into vLLM through vLLM's weight-transfer API (start, update per chunk, finish, with
its layerwise reload): backend `ablate_inproc` hands an in-process engine the trainer's tensors, one decoder layer
at a time; backend `ablate_group` receives them over the job's weights group in engine processes
(generator.weight_transfer=direct). How and why: docs/design.md#weight-transfer-into-vllm.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

BACKEND = "ablate_inproc"
GROUP_BACKEND = "ablate_group"


@dataclass
class InProcessInitInfo(WeightTransferInitInfo):
    """Nothing to rendezvous: the trainer and the worker share a process."""


@dataclass
class InProcessUpdateInfo(WeightTransferUpdateInfo):
    """One chunk: the trainer's tensors themselves, by their Hugging Face names."""

    names: list[str] = field(default_factory=list)
    tensors: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self):
        if len(self.names) != len(self.tensors):
            raise ValueError(f"{len(self.names)} names for {len(self.tensors)} tensors")


class InProcessWeightTransferEngine(WeightTransferEngine[InProcessInitInfo, InProcessUpdateInfo]):
    """The worker side of `ablate_inproc`: the layerwise reload around the model's own `load_weights`."""

    init_info_cls = InProcessInitInfo
    update_info_cls = InProcessUpdateInfo

    def init_transfer_engine(self, init_info: InProcessInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """vLLM's, less its unconditional `torch.accelerator.synchronize()`, which raises on a CPU-only build."""
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type != "cpu":
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: InProcessUpdateInfo) -> None:
        self.model.load_weights(zip(update_info.names, update_info.tensors))

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        pass

    @staticmethod
    def trainer_send_weights(iterator, trainer_args: dict[str, Any]) -> None:
        """vLLM 0.26's trainer-side entry (abstract there; 0.32 moved it to `TrainerWeightTransferEngine`): the
        (name, tensor) pairs through the `InProcessSender` in `trainer_args["sender"]`."""
        trainer_args["sender"].send_weights(dict(iterator))


@dataclass
class GroupUpdateInfo(WeightTransferUpdateInfo):
    """One chunk: what rank 0 broadcasts next, in this order (the fields of vLLM's `NCCLWeightTransferUpdateInfo`)."""

    names: list[str] = field(default_factory=list)
    dtype_names: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    group: Any = None  # the job's weights group (the engine process's; handed in-process, never pickled)

    def __post_init__(self):
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(f"{len(self.names)} names, {len(self.dtype_names)} dtypes, {len(self.shapes)} shapes")


class GroupWeightTransferEngine(InProcessWeightTransferEngine):
    """The worker side of `ablate_group`: each tensor of a chunk broadcast from rank 0 over the job's weights group
    into a buffer on this worker's device, then the chunk through the model's `load_weights` (the layerwise reload
    around it, as `ablate_inproc`). The group is this process's (the worker runs in the engine process)."""

    update_info_cls = GroupUpdateInfo

    def receive_weights(self, update_info: GroupUpdateInfo) -> None:
        group = update_info.group
        if group is None:
            raise RuntimeError("weight transfer over the job's weights group, but none was given (an engine process "
                               "started by ablate.processes.launch has one)")
        pairs = []
        for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
            buffer = torch.empty(shape, dtype=getattr(torch, dtype_name), device=self.device)
            group.broadcast(buffer, 0).wait()
            pairs.append((name, buffer))
        self.model.load_weights(pairs)


def register() -> None:
    """Make `ablate_inproc` and `ablate_group` backends vLLM's worker can create (idempotent; before the engine
    starts)."""
    for name, engine in ((BACKEND, InProcessWeightTransferEngine), (GROUP_BACKEND, GroupWeightTransferEngine)):
        if name not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(name, engine)


class EngineClient:
    """vLLM's `VLLMWeightSyncClient` protocol (four methods) for an in-process `LLMEngine`: each call is a
    `collective_rpc` of the worker method of the same name, as vLLM's AsyncLLM and HTTP routes make them."""

    def __init__(self, llm):
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.collective_rpc("start_weight_update")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.llm.collective_rpc("update_weights", kwargs={"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.collective_rpc("finish_weight_update")
        if weight_version is not None and hasattr(self.llm, "set_weight_version"):  # 0.32 has it, 0.26 not
            self.llm.set_weight_version(weight_version)


def _layer(name: str) -> str:
    """The decoder layer a name belongs to (up to its first integer: `model.layers.3`), or the name itself."""
    parts = name.split(".")
    index = next((i for i, part in enumerate(parts) if part.isdigit()), None)
    return ".".join(parts[:index + 1]) if index is not None else name


def layer_groups(names: Iterable[str]) -> list[list[str]]:
    """Names in chunks of one decoder layer each (keyed by the first integer in the name: `model.layers.3.`),
    in the order first seen; names without one (embeddings, the final norm, the head) form chunks of their own."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(_layer(name), []).append(name)
    return list(groups.values())


def layer_runs(names: Iterable[str]) -> list[list[str]]:
    """`layer_groups` without reordering: consecutive names of one layer in a chunk (for a stream that arrives in
    this order)."""
    return [list(run) for _, run in itertools.groupby(names, key=_layer)]


class InProcessSender(TrainerWeightTransferEngine):
    """The trainer side of `ablate_inproc`: `send_weights` pushes one set of weights through the four phases.

    Subclasses vLLM's `TrainerWeightTransferEngine` for its contract (trainer_init once, send_weights each round);
    its constructor and factory signatures differ between vLLM 0.26 and 0.32, so this class is built directly."""

    def __init__(self, client: EngineClient, dtype: torch.dtype | None = None):
        self.client, self.dtype, self.source, self.is_sender = client, dtype, None, True

    @classmethod
    def trainer_init(cls, *_: Any, client: EngineClient, dtype: torch.dtype | None = None, **__: Any
                     ) -> InProcessSender:
        """`dtype`: the engine's (each layer is cast to it as it is sent, so vLLM's loaders copy without casting)."""
        sender = cls(client, dtype)
        client.init_weight_transfer_engine({})
        return sender

    def send_weights(self, weights: dict[str, torch.Tensor] | None = None, version: int | None = None) -> None:
        """Every tensor of `weights` (a state dict: name -> tensor) to the engine, then its version."""
        weights = self.source if weights is None else weights
        self.client.start_weight_update()
        for names in layer_groups(weights):
            tensors = [_full(weights[name]).to(self.dtype or weights[name].dtype) for name in names]
            self.client.update_weights({"names": names, "tensors": tensors})
        self.client.finish_weight_update(None if version is None else str(version))


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP shard) gathered whole; a plain tensor as it is."""
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor.detach()

