"""Composing configs in-process (one per sweep variant), reading an axis's choice, and a run's signature."""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from ablate import schema

CONFIG_MODULE = "ablate.conf"
CONFIG_NAME = "config"


@contextmanager
def _hydra() -> Iterator[None]:
    """Use the running Hydra app when there is one (inside @hydra.main), else initialize one for the call."""
    if GlobalHydra.instance().is_initialized():
        yield
        return
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        yield


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """The config `python -m ablate OVERRIDES` would run, validated against the schema."""
    schema.register()
    with _hydra():
        return hydra_compose(config_name=CONFIG_NAME, overrides=list(overrides))


def override_key(override: str) -> str:
    """The key an override sets: `loss=dapo` -> `loss`, `+x.y=1` -> `x.y`, `~a` -> `a`."""
    return OverridesParser.create().parse_override(override).key_or_group


def merge_overrides(first: Sequence[str], then: Sequence[str]) -> list[str]:
    """`first` followed by `then`, less what `then` replaces: an override of the same key, or of a key inside it.

    `["loss.eps_max=5", "seed=3"]` then `["loss=dapo"]` -> `["seed=3", "loss=dapo"]`: CISPO's eps_max does not
    carry over to the DAPO variant (which has no such key).
    """
    replaced = {override_key(o) for o in then}

    def kept(override: str) -> bool:
        key = override_key(override)
        return not any(key == r or key.startswith(r + ".") for r in replaced)

    return [o for o in first if kept(o)] + list(then)


def choice_of(cfg: DictConfig, path: str) -> str:
    """The choice a config makes on an axis: the option's name for a group, the value (lower-case) for a key.

    `choice_of(cfg, "loss")` -> "cispo"; `choice_of(cfg, "filtering.zero_variance")` -> "true".
    """
    node = OmegaConf.select(cfg, path, throw_on_missing=True)
    if node is None and not _has(cfg, path):
        raise KeyError(f"axis path '{path}' is not in the config")
    if isinstance(node, DictConfig):
        if "name" not in node:
            raise KeyError(f"axis path '{path}' is a config node without a 'name' (not an option of a config group)")
        return str(node.name)
    return format_choice(node)


def format_choice(value: Any) -> str:
    """How a value is written on the command line: booleans as true/false, enums by value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(getattr(value, "value", value))


def _has(cfg: DictConfig, path: str) -> bool:
    parent, _, leaf = path.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node


def semantic(cfg: DictConfig) -> dict:
    """The part of a resolved config that decides what a run computes (not how or where it runs)."""
    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return {k: v for k, v in container.items() if k not in schema.NON_SEMANTIC_KEYS and k != "hydra"}


def signature(cfg: DictConfig) -> str:
    """A run's identity: a short hash of its semantic config, independent of key order, launcher and tracking."""
    canonical = json.dumps(semantic(cfg), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def flatten(container: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    if not isinstance(container, dict):
        return {prefix: container}
    flat: dict[str, Any] = {}
    for key, value in container.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


def check_model(model: DictConfig) -> None:
    """Fail at once, in one line, when model.path names no model that loads (before any run is created): a local
    folder needs a config.json that transformers reads; any other name is looked up on the Hugging Face hub (or in
    its local cache)."""
    if not model.path:
        return
    import transformers

    path = Path(str(model.path)).expanduser()
    looks_local = path.is_absolute() or str(model.path).startswith((".", "~")) or path.exists()
    if looks_local and not path.is_dir():
        raise ValueError(f"model.path={model.path}: no such folder")
    if looks_local and not (path / "config.json").is_file():
        raise ValueError(f"model.path={model.path}: the folder has no config.json (tried {path / 'config.json'})")
    try:
        transformers.AutoConfig.from_pretrained(str(path) if looks_local else str(model.path))
    except Exception as why:  # noqa: BLE001 - whatever transformers raises, said in one line
        where = f"its config.json ({path / 'config.json'})" if looks_local else \
            "not a local folder, and the Hugging Face hub (or its cache) gave no model of that name"
        reason = str(why).strip().splitlines()[0] if str(why).strip() else type(why).__name__
        raise ValueError(f"model.path={model.path}: {where}: {reason}") from None


def check_compute(train: DictConfig) -> None:
    """Fail at once, in one line, on a reference layout the clock cannot use (before any run is created)."""
    from ablate.compute import check_layout

    layout = train.get("reference_layout")
    check_layout(layout)
    if layout is not None and not train.reference_tflops > 0:
        raise ValueError(f"train.reference_layout={list(layout)} needs train.reference_tflops > 0 (the layout places "
                         f"FLOPs counted at that throughput; with 0, compute is wall-clock time and has no layout)")


def check_run(cfg: DictConfig) -> None:
    """Fail at once, in one line naming the numbers, on a trainer layout (`run`) its own option or the launcher's
    allocation cannot hold (before any run is created or job submitted)."""
    from hydra.utils import get_object

    from ablate.generators.base import capabilities
    from ablate.rl.checks import warn_on_pairing

    warn_on_pairing(cfg.loss, cfg.aggregation)  # GSPO x a length-weighted aggregation: a warning, once
    run, launcher = cfg.run, cfg.launcher
    n, g = int(run.trainer_gpus), int(run.get("generator_gpus", 0))
    least, most = getattr(get_object(run._target_), "ranks", (1, None))
    if n < least or (most is not None and n > most):
        holds = f"exactly {least}" if least == most else f"at least {least}"
        raise ValueError(f"run={run.name} with run.trainer_gpus={n}: this layout takes {holds} trainer rank"
                         f"{'s' if least > 1 else ''}" + (" (one rank is run=one_process)" if least > 1 else
                                                           " (more are run=fsdp)"))
    if g < 0:
        raise ValueError(f"run.generator_gpus={g}: 0 (the engine in trainer rank 0's process) or more (engine "
                         "processes of their own)")
    if g and not capabilities(cfg.generator).engine_processes:
        raise ValueError(f"run.generator_gpus={g}: generator={cfg.generator.name} has no engine that runs in a "
                         "process of its own (generator=hf and generator=vllm have)")
    tp = int(cfg.generator.get("tensor_parallel_size", 1))
    if tp < 1:
        raise ValueError(f"generator.tensor_parallel_size={tp}: 1 or more GPUs per engine")
    if tp > 1 and (g == 0 or g % tp):
        raise ValueError(f"generator.tensor_parallel_size={tp} with run.generator_gpus={g}: each engine takes {tp} "
                         f"GPUs in processes of their own, so run.generator_gpus must be a multiple of {tp}")
    transfer = cfg.generator.get("weight_transfer", "staged")
    if transfer not in ("staged", "direct"):
        raise ValueError(f"generator.weight_transfer={transfer}: staged or direct")
    if transfer == "direct":
        from ablate.registry import build

        if g == 0:
            raise ValueError("generator.weight_transfer=direct sends the weights to engine processes, and "
                             "run.generator_gpus=0 has none (the engine shares the trainer's process)")
        if not build(cfg.off_policy).loads_on_arrival:
            raise ValueError(f"generator.weight_transfer=direct takes each step's weights as they arrive, "
                             f"mid-generation; off_policy={cfg.off_policy.name} (in_flight="
                             f"{cfg.off_policy.get('in_flight')}) holds them back: use "
                             "generator.weight_transfer=staged")
    from ablate.parallel import layout_name

    layout, nodes = layout_name(n, g), int(launcher.nodes)
    if launcher.gpus_per_node > 0:
        held = nodes * int(launcher.gpus_per_node)
        if n + g > held:
            raise ValueError(f"{layout} does not fit the job: launcher.nodes={launcher.nodes} x "
                             f"launcher.gpus_per_node={launcher.gpus_per_node} = {held} GPUs")
    if (n + g) % nodes:  # each node starts the same number of processes (ablate/parallel.py: launch)
        raise ValueError(f"{layout} = {n + g} processes do not spread evenly over launcher.nodes={nodes}")
    per_node = (n + g) // nodes
    if tp > 1 and nodes > 1 and (n % tp or per_node % tp):  # engine k: processes n + k tp .. on one node
        raise ValueError(f"generator.tensor_parallel_size={tp}: an engine's GPUs must share a node, so "
                         f"run.trainer_gpus={n} and the {per_node} processes a node must be multiples of {tp}")
    cluster = getattr(launcher.cluster, "value", launcher.cluster)  # an enum in a composed config, a str in a plain one
    if nodes > 1 and cluster in ("local", "debug"):
        raise ValueError(f"launcher.nodes={nodes} needs SLURM (launcher=slurm): launcher={cluster} runs on this "
                         "machine alone")
