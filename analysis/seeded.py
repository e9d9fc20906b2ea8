"""The adaptive sweep with seeds, about the recipes: where the next seeds go (`seeds_to_add`) and what a look decides
of one variant (`look`).

Each side's precision on A is P = sum 1 / (s_i^2 + tau^2) over its seeds (analysis/spread.py's); a variant's
information on its change dA is I = 1 / (1 / P_v + 1 / P_b), its z the change over sqrt(1 / I), its information
fraction t = I / I_max. At look k of K every open variant is brought to k / K of I_max, one seed at a time where the
next buys the most information per GPU-hour (a seed of the base serves every open variant short of it); z is held
to the Lan-DeMets O'Brien-Fleming boundary at the variant's fractions so far (analysis/sequential.py), and a claim
not made is settled unmade when the full information would make it with a predictive probability below the
futility threshold (non-binding). bench/bench_seeds.py measures the rule; docs/fitting.md#an-adaptive-sweep-with-seeds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from analysis.rank import CRITICAL
from analysis.sequential import boundaries, predictive_claim

# on each run of a variant of an adaptive sweep with seeds: its looks' fractions, alpha and decision (JSON), so that
# the report holds its claims to the boundary its last look did (analysis/report.py)
SEEDED_LOOK_TAG = "ablate.seeded_look"


def information(p_v: np.ndarray | float, p_b: float) -> np.ndarray | float:
    """A variant's information on dA: 1 / (1 / P_v + 1 / P_b)."""
    return 1 / (1 / p_v + 1 / p_b)


def seeds_to_add(p_v: Sequence[float], p_b: float, w_v: Sequence[float], w_b: float, open_: Sequence[bool],
                 target: float, hours: tuple[float, float] = (1.0, 1.0)) -> tuple[np.ndarray, int]:
    """(more seeds of each variant, more of the base) that bring every open variant's information to `target`:
    each step the seed with the largest gain per GPU-hour, a variant's (`w_v`: its next seed's precision, `hours[0]`
    its GPU-hours) or the base's (`w_b`, `hours[1]`; its gain summed over the open variants still short). Ties go
    to the variant listed first, and to the variant over the base (within rounding: the same rule whatever form the
    precisions are summed in)."""
    p_v, w_v = np.asarray(p_v, float).copy(), np.asarray(w_v, float)
    open_ = np.asarray(open_, bool)
    more = np.zeros(p_v.size, int)
    more_base = 0
    while True:
        info = information(p_v, p_b)
        short = open_ & (info < target * (1 - 1e-9))
        if not short.any():
            return more, more_base
        gain_v = (information(p_v + w_v, p_b) - info) / hours[0]
        gain_b = float((information(p_v, p_b + w_b) - info)[short].sum()) / hours[1]
        v = int(np.argmax(np.where(short, gain_v, -1)))
        if gain_b > gain_v[v] * (1 + 1e-9):  # a tie (within rounding) goes to the variant
            p_b += w_b
            more_base += 1
        else:
            p_v[v] += w_v[v]
            more[v] += 1


@dataclass(frozen=True)
class SeededLook:
    """One look's decision about a variant's recipe: `claim` the sign of the move of A claimed (0: none), `settled`
    (claimed, or futile), `boundary` the |z| the look held it to, `times` its information fractions so far."""

    claim: int
    settled: bool
    boundary: float
    times: tuple[float, ...]


def fractions(t: float, times: Sequence[float], *, last: bool) -> tuple[float, ...]:
    """A look's information fractions: the earlier `times`, and t (min(I / I_max, 1)) where it is past the last of
    them (the last look at t = 1, an earlier one below it)."""
    times, t = list(times), min(t, 1.0)
    if not times or t > times[-1]:
        times.append(min(t, 1.0 if last else 1 - 1e-6))
    return tuple(times)


def boundary(times: Sequence[float], alpha: float) -> float:
    """The |z| a claim is held to at the last of `times`: the O'Brien-Fleming-type boundary spending alpha."""
    return boundaries(times, alpha)[-1]


def look(z: float, t: float, times: Sequence[float], *, last: bool, alpha: float, futility: float,
         spend: bool = True) -> SeededLook:
    """The look at a variant whose z is `z` at information fraction `t`, its earlier looks at `times` (fractions);
    the boundary spends `alpha` at those fractions (`spend` False: the one-look CRITICAL at every look, the negative
    control that spends no error); settled unmade where `last`, or where the predictive probability of a claim at
    t = 1 is below `futility`."""
    times = fractions(t, times, last=last)
    c = boundary(times, alpha) if spend else CRITICAL
    if abs(z) >= c:
        return SeededLook(int(np.sign(z)), True, c, times)
    futile = not last and predictive_claim(z, times[-1], CRITICAL) < futility
    return SeededLook(0, futile or last, c, times)


def z_of(change: float, p_v: float, p_b: float) -> float:
    """The change in A over its sd, sqrt(1 / P_v + 1 / P_b)."""
    return change / math.sqrt(1 / p_v + 1 / p_b)


def seeded_bound(tags: Sequence[dict]):
    """For the report: where a variant's runs carry an adaptive sweep with seeds' look (SEEDED_LOOK_TAG), the bound
    every recipe-level claim of it is held to (`bound(claim, extra)` of analysis/spread.py's recipe_verdict: the
    boundary at its looks' fractions); None for a variant no such look saw."""
    found = next((t[SEEDED_LOOK_TAG] for t in tags if SEEDED_LOOK_TAG in t), None)
    if found is None:
        return None
    said = json.loads(found)
    c = boundary(said["times"], float(said["alpha"]))
    return lambda name, extra: c
