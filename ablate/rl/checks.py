"""Checks on a pairing of options, driven by what each option declares about itself, never by its name.

A loss declares `sequence_level = True` when its per-token loss is one value per sequence (GSPO: the sequence's
clipped ratio times its advantage, on every token of it). An aggregation declares `length_weighted = True` when a
sample with a per-sequence-constant loss weighs in proportion to its number of tokens (token_mean: all tokens share
one denominator; prompt_mean: the tokens of a prompt's samples do) and False when every sample gets one vote
(sample_mean). tests/test_peers.py checks each declaration against what the option computes.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable


class LengthWeightedSequenceLoss(UserWarning):
    """A sequence-level loss under a length-weighted aggregation: no longer the per-sequence objective."""


def _target(option: Any) -> Callable:
    """The function an option names: a config node's `_target_`, or a (partial of a) function as built."""
    target = option.get("_target_") if hasattr(option, "get") else None
    if target is not None:
        from hydra.utils import get_object

        return get_object(str(target))
    while isinstance(option, functools.partial):
        option = option.func
    return option


def _label(option: Any, target: Callable) -> str:
    name = option.get("name") if hasattr(option, "get") else None
    return str(name) if name is not None else getattr(target, "__name__", repr(target))


def length_weighted_sequence_loss(loss: Any, aggregation: Any) -> bool:
    """True when a sequence-level loss meets a length-weighted aggregation (GSPO under prompt_mean or token_mean)."""
    return bool(getattr(_target(loss), "sequence_level", False)) and \
        bool(getattr(_target(aggregation), "length_weighted", False))


def warn_on_pairing(loss: Any, aggregation: Any) -> bool:
    """Warn (LengthWeightedSequenceLoss; Python shows one such message once per process) when `loss` is
    sequence-level and `aggregation` length-weighted; return whether it warned. `loss` and `aggregation`: config
    nodes (cfg.loss, cfg.aggregation) or the built options.

    GSPO's objective is one term per sequence (a mean over sequences): that is what sample_mean gives it. Under
    prompt_mean (ScaleRL's aggregation) or token_mean a sequence of 3 tokens weighs 3 times one of 1 token. TRL warns
    likewise when its sequence-level importance sampling meets a token-level loss_type (dapo, bnpo, dr_grpo, cispo).
    """
    if not length_weighted_sequence_loss(loss, aggregation):
        return False
    lt, at = _target(loss), _target(aggregation)
    warnings.warn(
        f"loss={_label(loss, lt)} is a sequence-level loss (one ratio and one loss per sequence) and "
        f"aggregation={_label(aggregation, at)} weighs each sequence by its number of tokens: the objective is "
        "length-weighted, not GSPO's per-sequence one (aggregation=sample_mean gives that)",
        LengthWeightedSequenceLoss, stacklevel=2)
    return True
