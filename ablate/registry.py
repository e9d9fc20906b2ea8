"""Build what a config option names: its `_target_` called with its fields (a class), or bound to them (a function)."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

RESERVED = ("name", "_target_")


def build(node: DictConfig | dict, **extra: Any) -> Any:
    """`{_target_: pkg.Cls, k: 8}` -> pkg.Cls(k=8, **extra); `{_target_: pkg.fn, eps: 0.2}` -> partial(fn, eps=0.2)."""
    fields = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    target = get_object(fields["_target_"])
    kwargs = {k: v for k, v in fields.items() if k not in RESERVED}
    kwargs.update(extra)
    if inspect.isclass(target):
        return target(**kwargs)
    return functools.partial(target, **kwargs)
