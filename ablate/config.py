"""Composing configs in-process (one per sweep variant), reading an axis's choice, and a run's signature."""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
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
    """The config `python -m ablate OVERRIDES` would run, validated against the schema; inside `python -m ablate`,
    with the config folders its command line added (a sweep's variants find the user's own options too)."""
    schema.register()
    with _hydra():
        added = user_searchpath()
        searchpath = [f"hydra.searchpath=[{','.join(added)}]"] if added else []
        return hydra_compose(config_name=CONFIG_NAME, overrides=[*searchpath, *overrides])


USER_SOURCES = ("command-line", "hydra.searchpath in command-line")  # --config-dir; hydra.searchpath=[...]


def user_searchpath() -> list[str]:
    """The config folders `python -m ablate`'s command line added to the search path (`--config-dir DIR`,
    `'hydra.searchpath=[file:///DIR]'`), as search path entries; none outside the app."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return [f"{source.schema}://{source.path}" for source in HydraConfig.get().runtime.config_sources
            if source.provider in USER_SOURCES]


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
    config = {k: v for k, v in container.items() if k not in schema.NON_SEMANTIC_KEYS and k != "hydra"}
    for path in schema.NON_SEMANTIC_LEAVES:
        group, _, leaf = path.partition(".")
        if isinstance(config.get(group), dict) and leaf in config[group]:
            config[group] = {k: v for k, v in config[group].items() if k != leaf}
    return config


def signature(cfg: DictConfig) -> str:
    """A run's identity: a short hash of its semantic config, independent of key order, launcher and tracking."""
    return _digest(semantic(cfg))


def lineage(cfg: DictConfig) -> str:
    """A run's identity less its budget (train.steps): a run of a larger budget may extend a run of the same
    lineage from its checkpoint (`sweep.extend=true`)."""
    config = semantic(cfg)
    config["train"] = {key: value for key, value in config["train"].items() if key != "steps"}
    return _digest(config)


def _digest(config: dict) -> str:
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
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
