"""What every generator gives the trainer, and what an engine gives the pipeline that drives it.

A generator option (`conf/generator/*.yaml`) names a class that implements `Generator`: the trainer builds it as
`build(cfg.generator, cfg=cfg, task=task, sampler=sampler, policy=weights)` and calls only what is written here.
What the config checks need before anything is built (may it run engines in processes of their own?) is the class's
`capabilities`, read through `capabilities(cfg.generator)`. Why the contract has this shape: docs/design.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import torch
from omegaconf import DictConfig

if TYPE_CHECKING:
    from ablate.compute import Clock
    from ablate.generators.engine import Limits, Sequence
    from ablate.rollouts import Rollouts


class Interrupted(Exception):
    """`batch` stopped waiting because its `stop()` said so (SLURM's warning): the batch is dropped, and the generator
    is only to be closed."""


@dataclass(frozen=True)
class Capabilities:
    """What a generator option can do, known before it is built (the config checks read it before submit)."""

    samples_policy: bool = True  # its rollouts come from the policy (False: a simulator; no warm start, no gap)
    engine_processes: bool = False  # its engines can decode in processes of their own (run.generator_gpus > 0)
    # its engine can decode in trainer rank 0's process beside other trainer ranks (run=fsdp, run.generator_gpus=0);
    # vLLM cannot: it finds torch.distributed initialized there and makes its groups over every trainer rank
    beside_trainer_ranks: bool = True


class Generator(Protocol):
    """The trainer's side of generation. Subclass it (the methods a generator has no use for are no-ops here).

    Step numbering is the trainer's: `batch(s)` is optimizer step s's rollouts; `publish(weights, s)` hands over the
    weights after step s; `validate(compute, step=s)` is the pass rate the run logs at step s.
    """

    capabilities: ClassVar[Capabilities] = Capabilities()
    clock: Clock  # the run's device-hours per step (ablate/compute.py)
    validated_on: str = ""  # where the last validation decoded: "engine", "staging copy", "policy" ("": simulated)

    def batch(self, step: int, compute: float, stop: Callable[[], bool] | None = None) -> Rollouts:
        """Optimizer step `step`'s rollouts, `compute` device-hours into the run; blocks until they are complete, or
        raises Interrupted within a second or so of `stop()` turning true (asked between two looks at the engine)."""
        ...

    def validate(self, compute: float, *, policy, step: int) -> float:
        """The validation pass rate of `policy` (a module or ablate.distributed.layouts.Weights) at step `step`."""
        ...

    def validation_step(self, due: int) -> int:
        """The step at which a validation due at step `due` (train.val_every's) is made: `due`, or a later step
        where it decodes on the generator's own engines rather than a slower copy beside them."""
        return due

    def publish(self, policy, version: int) -> None:
        """The weights after optimizer step `version`, for the generator to take as its off-policy rule allows."""

    def reset_weights(self, policy, version: int) -> None:
        """Take these weights now, whatever the rules (a resumed run starts from its checkpoint's policy)."""

    @classmethod
    def engine_memory(cls, cfg: DictConfig, shape, gpu_bytes: float, *, processes: int,
                      row_tokens: int) -> dict[str, float]:
        """Bytes its engine holds on one GPU, part by part (ablate.memory): in trainer rank 0's process
        (processes=0) or in each of `processes` engine processes, its rows `row_tokens` long (memory.longest_row).
        Read before anything is built (the check before submit); a setting that cannot work at all raises
        ValueError naming it."""
        return {}

    def describe(self) -> dict:
        """Params logged once with the run."""
        return {}

    def perf(self) -> dict:
        """`perf/*` figures since the last call (one step)."""
        return {}

    def state_dict(self) -> dict:
        """What a checkpoint keeps to continue where the generator was."""
        return {}

    def paused(self) -> AbstractContextManager:
        """While inside, the generator draws no prompt from the sampler and changes nothing `state_dict` holds (a
        thread of its own is held between two looks at its engine): a checkpoint reads the sampler's state and this
        one's inside it, one moment for both (docs/training.md#time-limits)."""
        return nullcontext()

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()`'s output."""

    def close(self) -> None:
        """Stop threads and engine processes; the run is over."""


def capabilities(node: DictConfig | Mapping) -> Capabilities:
    """The capabilities of the generator option `node` (its `_target_`), read without building it."""
    from hydra.utils import get_object

    target = get_object(str(node["_target_"]))
    if Generator not in getattr(target, "__mro__", ()):  # a Protocol: subclassed, not checked structurally
        raise TypeError(f"generator={node.get('name', '?')}: {node['_target_']} does not implement "
                        "ablate.generators.base.Generator")
    return target.capabilities


class Engine(Protocol):
    """What the pipeline drives: a decoder of rows, one decode step per `step()` (a run of them per `advance`),
    whose weights change between steps. Ours in torch (engine.py), vLLM's (vllm_engine.py), or a handle on engines
    in processes of their own (remote.py), which `stages` weights: `stage` sends them now, `load(None, version)`
    takes what was staged."""

    stages: ClassVar[bool]  # new weights go to a staging copy first (`stage`), then `load(None, version)` takes it
    limits: Limits
    version: int  # the weights' version it decodes with
    rng: object  # its sampling stream: get_state() / set_state()
    waves: list  # the waves of rows in flight
    weights_dtype: torch.dtype  # the dtype it keeps its weights in
    devices: int  # the devices one decode step runs on (tokens/s are per device)
    decode_steps: int  # decode steps taken so far

    @property
    def running(self) -> int:
        """Rows still decoding."""
        ...

    def start(self, rows: list[Sequence]) -> None:
        """Start decoding `rows` (one wave)."""

    def step(self) -> list[Sequence]:
        """One decode step of every wave in flight; returns the rows that ended."""
        ...

    def advance(self, steps: int, seconds: float = 0.0) -> list[Sequence]:
        """Decode steps until one in which a wave ended, `steps` of them, or (seconds > 0) `seconds` passed; returns
        the rows that ended (ablate.generators.engine.advance, which in-process engines call)."""
        ...

    def load(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | None,
             version: int) -> None:
        """Decode with these weights from the next step on (None: the staged copy)."""

    def close(self) -> None:
        """Free the engine (and its processes)."""
