"""The adaptive sweep with seeds (`sweep.adaptive=true` with `sweep.seeds` or `sweep.base_seeds` above 1): the seeds
it plans and its looks, each taken by the sweep's command when every seed the sweep holds is FINISHED (the rule:
analysis/seeded.py).

Look k of `sweep.looks` is taken once every open variant has k / K of the fixed design's information on its change
of A (counted from the seeds at their planned variance); until then the seeds that bring it there are planned
(PLAN_TAG on the sweep's parent run) and run as new seeds of the same sweep. At the look, each open variant's
fractions and boundary go on its runs (SEEDED_LOOK_TAG) before the report is made, so the report holds its claims
to them; the report's z decides it (claimed, futile, open) and the look goes on the parent (LOOKS_TAG). The budget
(sweep.budget_gpu_hours) caps the seeds: where the next would pass it, the look is the last. Why:
docs/fitting.md#an-adaptive-sweep-with-seeds, docs/design.md#the-adaptive-sweep.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from analysis.seeded import SEEDED_LOOK_TAG, fractions, information, look, seeds_to_add

LOOKS_TAG = "ablate.seeded_looks"  # on the sweep's parent run: the looks taken (JSON list, one entry a look)
PLAN_TAG = "ablate.seeded_plan"  # on the sweep's parent run: the seeds each variant is to have (JSON)


def seeded(sweep) -> bool:
    """Whether the sweep is the adaptive sweep with seeds."""
    return bool(sweep.get("adaptive")) and max(int(sweep.get("seeds", 1)), int(sweep.get("base_seeds", 1))) > 1


@dataclass(frozen=True)
class Design:
    """What the looks are measured against: the fixed design's information on a change of A (`i_max`, 1 / (var (1/n
    + 1/b)) at its n seeds a variant and b of the base), one seed's variance of A about its recipe (`var`: its fit's
    sd squared plus the spread's), a seed's GPU-hours (`hours`: a variant's, the base's), and the rule's settings."""

    i_max: float
    var: float
    hours: tuple[float, float]
    looks: int
    alpha: float
    futility: float
    budget: float | None = None
    fixed: tuple[int, int] = (0, 0)  # the fixed design: seeds a variant, seeds of the base


def describe(design: Design, counts: Mapping[str, int], base: str) -> str:
    """The dry run's line: the looks, the fixed design they spend against, the seeds the first look needs."""
    first = first_plan(counts, base, design)
    return (f"the adaptive sweep with seeds (docs/fitting.md#an-adaptive-sweep-with-seeds): up to {design.looks} "
            f"looks about the recipes, spending sweep.alpha={design.alpha:g} against the fixed design of "
            f"{design.fixed[0]} seeds a variant and {design.fixed[1]} of the base; the first look at "
            f"{first[base]} of the base and {max(n for name, n in first.items() if name != base)} of each variant")


def planned_counts(tags: Mapping[str, str]) -> dict[str, int]:
    """The seeds each variant is to have, as the sweep's last look planned them ({} before any look)."""
    return {k: int(v) for k, v in json.loads(tags.get(PLAN_TAG, "{}")).items()}


def _more(counts: Mapping[str, int], base: str, open_: Sequence[str], design: Design, k: int) -> dict[str, int]:
    """The seeds to add (name -> how many) that bring every open variant to look k's share of the information."""
    names = [name for name in counts if name != base]
    add, add_base = seeds_to_add([counts[n] / design.var for n in names], counts[base] / design.var,
                                 [1 / design.var] * len(names), 1 / design.var, [n in open_ for n in names],
                                 design.i_max * k / design.looks, design.hours)
    return {n: int(a) for n, a in zip(names, add) if a} | ({base: add_base} if add_base else {})


def _hours(counts: Mapping[str, int], base: str, design: Design) -> float:
    return sum(n * design.hours[name == base] for name, n in counts.items())


def first_plan(counts: Mapping[str, int], base: str, design: Design) -> dict[str, int]:
    """The seeds each variant starts with: `counts` (sweep.seeds, sweep.base_seeds) and those that bring every
    variant to the first look's share of the information (within the budget)."""
    more = _more(counts, base, [n for n in counts if n != base], design, 1)
    plan = {n: counts[n] + more.get(n, 0) for n in counts}
    return plan if design.budget is None or _hours(plan, base, design) <= design.budget else dict(counts)


def take_look(client, parent: str, held: Mapping[str, Sequence[str]], base: str, design: Design,
              report: Callable[[], Sequence]) -> dict[str, int] | None:
    """The sweep's next looks, its variants' FINISHED runs `held` (name -> run ids; `base` the base recipe's name),
    its parent run `parent`: where the open variants have the next look's share of the information, that look
    (each open variant's fractions and boundary written on its runs, `report()` made: its rows' recipe-level
    verdicts held to them; each decided, the look recorded on the parent), and so on while no seed is needed; then
    the seeds each variant is to have for the next look (recorded on the parent), or None where the sweep is done:
    every verdict settled, or the last look taken (the budget spent before more seeds: a last look now)."""
    counts = {name: len(runs) for name, runs in held.items()}
    spent = _hours(counts, base, design)
    taken = json.loads(client.get_run(parent).data.tags.get(LOOKS_TAG, "[]"))
    while len(taken) < design.looks:
        k = len(taken) + 1
        earlier = {name: json.loads(client.get_run(runs[0]).data.tags.get(SEEDED_LOOK_TAG, "null")) or {}
                   for name, runs in held.items() if name != base}
        open_ = [name for name, said in earlier.items() if not said.get("settled")]
        if not open_:
            return None
        more = _more(counts, base, open_, design, k)
        last = k == design.looks
        if more:
            plan = {n: counts[n] + more.get(n, 0) for n in counts}
            if design.budget is None or _hours(plan, base, design) <= design.budget:
                client.set_tag(parent, PLAN_TAG, json.dumps(plan))
                print(f"the adaptive sweep with seeds: before look {k} of {design.looks}, "
                      + ", ".join(f"{n} +{a}" for n, a in more.items()) + " seeds (docs/fitting.md#an-adaptive-"
                      "sweep-with-seeds)")
                return plan
            last = True  # the budget is spent: the last look, with the seeds there are
        entry = _decide(client, held, counts, base, earlier, open_, design, k, last, report)
        entry["gpu_hours"] = round(spent, 6)
        taken.append(entry)
        client.set_tag(parent, LOOKS_TAG, json.dumps(taken))
        print_look(entry, design, budget_spent=last and k < design.looks)
        if last:
            return None
    return None


def _decide(client, held, counts, base: str, earlier, open_, design: Design, k: int, last: bool, report) -> dict:
    """Look k at the open variants: fractions and boundaries on their runs, the report, each one's decision."""
    b = counts[base]
    pending = {}  # name -> (its information fraction, its fractions with this look's)
    for name in open_:
        t = information(counts[name] / design.var, b / design.var) / design.i_max
        pending[name] = t, fractions(t, earlier[name].get("times", ()), last=last)
        _tag(client, held[name], {"times": pending[name][1], "alpha": design.alpha, "look": k, "claim": 0,
                                  "settled": False})
    rows = {row.variant: row for row in report()}
    decided = {}
    for name, (t, times) in pending.items():
        row = rows.get(name)
        claim = row.recipe.claims.get("A") if row is not None and row.recipe is not None else None
        if claim is None:  # no comparison of its recipe (no bounded fit): no verdict, and no seed more for it
            decided[name] = {"times": times, "alpha": design.alpha, "look": k, "claim": 0, "settled": True,
                             "z": None, "boundary": None}
        else:
            seen = look(claim.z, t, earlier[name].get("times", ()), last=last, alpha=design.alpha,
                        futility=design.futility)
            decided[name] = {"times": seen.times, "alpha": design.alpha, "look": k, "claim": seen.claim,
                             "settled": seen.settled, "z": round(claim.z, 4), "boundary": round(seen.boundary, 4)}
        _tag(client, held[name], decided[name])
    return {"look": k, "seeds": dict(counts),
            "decided": {n: {key: d[key] for key in ("claim", "settled", "z", "boundary")} for n, d in decided.items()}}


def _said(hours: float) -> str:
    return f"{hours:,.0f}" if hours >= 100 else f"{hours:.3g}"


def _tag(client, runs: Sequence[str], said: dict) -> None:
    for run_id in runs:
        client.set_tag(run_id, SEEDED_LOOK_TAG, json.dumps(said))


def print_look(entry: dict, design: Design, budget_spent: bool) -> None:
    """The look's lines: each variant looked at, its z against its boundary and its decision."""
    print(f"the adaptive sweep with seeds, look {entry['look']} of {design.looks} (docs/fitting.md#an-adaptive-sweep-"
          f"with-seeds): {sum(entry['seeds'].values())} seeds, {_said(entry['gpu_hours'])} GPU-hours"
          + ("; the budget (sweep.budget_gpu_hours) allows no more seeds: the last look" if budget_spent else ""))
    for name, d in entry["decided"].items():
        if d["z"] is None:
            print(f"  {name} ({entry['seeds'][name]} seeds): no verdict, its recipe not compared (the report says why)")
            continue
        said = ("claims A " + ("up" if d["claim"] > 0 else "down") if d["claim"] else
                "settled unmade" if d["settled"] else "open")
        print(f"  {name}: z {d['z']:+.2f} against {d['boundary']:.2f} ({entry['seeds'][name]} seeds): {said}")


__all__ = ["Design", "LOOKS_TAG", "PLAN_TAG", "describe", "first_plan", "planned_counts", "seeded", "take_look"]
