"""Sweeps: a sweep turns the composed config into variants, each a name plus the overrides that make it.

A sweep option (conf/sweep/*.yaml) names its function in `emit`; the function gets the composed config and returns
the variants (it also gets the command line's overrides). Nothing here is a hand-written list of variants: the LOO sweep reads the axis table (conf/axes/),
the recipes sweep reads `sweep.recipes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from omegaconf import DictConfig

from ablate.config import choice_of, format_choice, override_key

RECIPE_VARIANT = "scalerl"  # the name of the un-ablated recipe in a LOO sweep, as the paper writes it


@dataclass(frozen=True)
class Variant:
    name: str  # scalerl, loo-dapo, ... (tag ablate.variant: the seeds of a variant share it)
    overrides: tuple[str, ...] = ()  # applied after the command line's own overrides
    axis: str = "none"  # the axis it reverts (tag ablate.axis)
    choice: str = "none"  # the choice it reverts to (tag ablate.choice)
    meta: dict = field(default_factory=dict, compare=False)
    replica: int = 0  # 0: the run at the command line's seed; k: its k-th replicate seed (seed + k)

    @property
    def label(self) -> str:
        """The run's name in the sweep (its job, its line of progress): the variant's, "loo-dapo seed+1" for a
        replicate."""
        return self.name if not self.replica else f"{self.name} seed+{self.replica}"


def replicate(variants: Sequence[Variant], seed: int, seeds: int, base_seeds: int,
              counts: dict[str, int] | None = None) -> list[Variant]:
    """Each variant `seeds` times and the recipe (RECIPE_VARIANT) `base_seeds` times, the replicates at seed + 1,
    seed + 2, ... (sweep.seeds, sweep.base_seeds: docs/fitting.md#seeds-where-they-pay); `counts`: a variant's own
    number of seeds where it is more (sweep.extend=true: the seeds that settle its open verdict)."""
    if seeds < 1 or base_seeds < 1:
        raise ValueError(f"sweep.seeds={seeds}, sweep.base_seeds={base_seeds}: at least one run of each")
    out = []
    for v in variants:
        n = base_seeds if v.name == RECIPE_VARIANT else seeds
        n = max(n, (counts or {}).get(v.name, 0))
        out += [v] + [replace(v, overrides=(*v.overrides, f"seed={seed + k}"), replica=k) for k in range(1, n)]
    return out


def single(cfg: DictConfig, overrides: Sequence[str] = ()) -> list[Variant]:
    """sweep=none: the composed config itself, once, named after its recipe and any axis it changes by hand.

    `python -m ablate` -> scalerl; `python -m ablate loss=dapo` -> scalerl[loss=dapo].
    """
    recipe, changed = RECIPE_VARIANT, []
    axis_groups = {axis.path.split(".")[0] for axis in cfg.axes}
    for override in overrides:
        key = override_key(override)
        if key == "recipe":
            recipe = override.split("=", 1)[1]
        elif key.split(".")[0] in axis_groups:
            changed.append(override)
    return [Variant(name=f"{recipe}[{','.join(changed)}]" if changed else recipe)]


def loo(cfg: DictConfig, overrides: Sequence[str] = ()) -> list[Variant]:
    """sweep=loo: the recipe, then one variant per axis where the recipe's choice differs from the base's.

    For an axis `{path: loss, base: dapo, variant: loo-dapo}` and a recipe whose loss is cispo, the variant is the
    override `loss=dapo`; for a value axis such as `filtering.zero_variance`, the override sets the value.
    """
    variants = [Variant(name=RECIPE_VARIANT)]
    seen: set[str] = set()
    for axis in cfg.axes:
        if axis.variant in seen:
            raise ValueError(f"axes: two axes are named '{axis.variant}'")
        seen.add(axis.variant)
        base = format_choice(axis.base)
        if choice_of(cfg, axis.path) == base:
            continue  # the recipe already makes the base choice on this axis: nothing to leave out
        variants.append(Variant(axis.variant, (f"{axis.path}={base}",), axis=axis.path, choice=base))
    return variants


def recipes(cfg: DictConfig, overrides: Sequence[str] = ()) -> list[Variant]:
    """sweep=recipes: one variant per recipe in `sweep.recipes`, named after it."""
    if not cfg.sweep.recipes:
        raise ValueError("sweep=recipes needs a non-empty sweep.recipes list")
    return [Variant(r, (f"recipe={r}",), axis="recipe", choice=r) for r in cfg.sweep.recipes]

