"""Composing configs in-process (one per sweep variant), reading an axis's choice, and a run's signature; the
command line's overrides checked against the keys a run reads, and the study (MLflow experiment) a run of the
user's own model or data is filed under."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

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
        cfg = hydra_compose(config_name=CONFIG_NAME, overrides=[*searchpath, *overrides], return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):  # as hydra's compose leaves it without return_hydra_config
        del cfg["hydra"]
    check_overrides(cfg, overrides, choices)
    file_study(cfg, overrides, choices)
    return cfg


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


def check_overrides(cfg: DictConfig, overrides: Sequence[str], choices: Mapping[str, Optional[str]]) -> None:
    """Every key the command line sets is one the run reads, else one ValueError naming it
    (docs/design.md#overrides-and-studies).

    `+key=value` adds a key only inside a dict of the user's own keys (the schema's dict-typed fields:
    model.overrides, task.chat_kwargs, launcher.additional, ...): `+train.step=10`, which Hydra suggests for the
    typo train.step, would be a key nothing reads beside train.steps. And a key of one option of a group is not set
    while another option is chosen: `task.data_path=x.jsonl` is task=math's, read by no other task. `cfg` is the
    config composed with `overrides`; `choices`, Hydra's choice in each group (a `+group=option` is a choice).
    """
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group
        if key == "hydra" or key.startswith("hydra.") or key in choices or override.is_delete():
            continue
        problem = _unread(cfg, key, choices) or (_not_in_schema(cfg, key, choices) if override.is_add() or
                                                 override.is_force_add() else None)
        if problem:
            raise ValueError(problem)


def _not_in_schema(cfg: DictConfig, key: str, choices: Mapping[str, Optional[str]]) -> Optional[str]:
    """Why a key added with `+` is one no run reads (None where the schema leaves room for it): the first part of its
    path that is not a field of the structured node above it, with the field it looks like."""
    node, path = cfg, []
    for part in key.split("."):
        kind = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
        if not (kind and dataclasses.is_dataclass(kind)):
            return None  # a dict of user keys (or a value: Hydra refused to go into it already)
        fields = [f.name for f in dataclasses.fields(kind)]
        if part not in fields:
            where = ".".join(path)
            readers = _readers(where, part, choices) if where else []
            if readers:
                return _read_by(f"{where}.{part}", where, readers, choices)
            close = difflib.get_close_matches(part, fields, n=1)
            named = ".".join([*path, part])
            return (f"{named}: no such key" + (f"; did you mean {'.'.join([*path, close[0]])}?" if close else "")
                    + " (+ adds a key only inside a dict of your own keys: model.overrides, task.chat_kwargs, ...)")
        node, path = node._get_node(part), [*path, part]
    return None


def _unread(cfg: DictConfig, key: str, choices: Mapping[str, Optional[str]]) -> Optional[str]:
    """Why a key of a group's base schema is not read by the option chosen (its schema's `unread`), or None."""
    group, _, rest = key.partition(".")
    if not rest or group not in schema.SCHEMAS or not isinstance(cfg.get(group), DictConfig):
        return None
    leaf = rest.split(".")[0]
    if leaf not in getattr(OmegaConf.get_type(cfg[group]), "unread", ()):
        return None
    return _read_by(f"{group}.{leaf}", group, _readers(group, leaf, choices), choices)


def _readers(group: str, leaf: str, choices: Mapping[str, Optional[str]]) -> list[str]:
    """The options of a group whose schema reads `leaf`: a field of theirs, not in their `unread`."""
    return [name for name, kind in schema.SCHEMAS.get(group, {}).items()
            if name != "option" and name != choices.get(group) and leaf in {f.name for f in dataclasses.fields(kind)}
            and leaf not in getattr(kind, "unread", ())]


def _read_by(key: str, group: str, readers: Sequence[str], choices: Mapping[str, Optional[str]]) -> str:
    chosen = choices.get(group) or "?"
    read = " or ".join(f"{group}={name}" for name in readers) or "no other option"
    return f"{key} is read by {read}; this run's {group} is {chosen}"


DEMO = "tiny"  # the embedded demo's study (conf/experiment/tiny.yaml)


def file_study(cfg: DictConfig, overrides: Sequence[str], choices: Mapping[str, Optional[str]]) -> Optional[str]:
    """The study a run of the user's own model or data is filed under: never the demo's
    (docs/design.md#overrides-and-studies).

    With the demo's preset (experiment=tiny, the default), a run with model.path or a data file set drops the demo's
    notes on what its scale cannot test (they are about the tiny model on its puzzles; notes the command line adds
    stay) and, without `experiment=` or `name=` on the command line, gets a study named from the model and the task
    (`Qwen3-1.7B-math`: its MLflow experiment and output folder). The new name (cfg changed in place), or None where
    the name stays.
    """
    if choices.get("experiment") != DEMO:
        return None
    model = None if OmegaConf.is_missing(cfg.model, "path") else cfg.model.get("path")
    if not model and not any(cfg.task.get(key) for key in ("data_path", "val_data_path") if key in cfg.task):
        return None
    keys = {override_key(o) for o in overrides}
    cfg.untestable = {axis: why for axis, why in cfg.untestable.items()
                      if "untestable" in keys or f"untestable.{axis}" in keys}
    if keys & {"name", "experiment"}:
        return None
    model_name = Path(str(model).rstrip("/")).name if model else str(cfg.model.name)
    cfg.name = "-".join(re.sub(r"[^A-Za-z0-9._-]+", "-", part).strip("-") for part in (model_name, cfg.task.name))
    return cfg.name


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
