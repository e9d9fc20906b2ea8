"""The adaptive sweep inside a run: at each rung, the run reads the sweep's curves from MLflow and decides whether
it stops (`Rungs.look`).

A variant is fitted beside the base recipe cut at the same compute (analysis/adaptive.py's `decide`); a base that
has not got that far yet is waited for, up to `sweep.base_wait_min`, then the variant goes on undecided. The base
recipe stops at a rung only when every other variant of the sweep has stopped at or before it. Each decision is a
tag written once (`ablate.rung.<k>`); a run that comes back to a rung (requeued, restarted) takes the one logged.
Why the decision is taken in the jobs: docs/design.md#the-adaptive-sweep.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

from omegaconf import DictConfig

from analysis.adaptive import (FUTILITY, GO, RUNG_TAG, RUNGS, STOP, Curve, Decision, check_rule, decide,
                               decisions_of, rung_steps)
from analysis.law import fmt_compute
from analysis.rank import ALPHA, BASELINE
from analysis.runs import END_REASON_TAG, SETTLED_TAG, load_curve

POLL_S = 10.0


def check_settings(sweep: DictConfig, steps: int) -> None:
    """An adaptive sweep's settings, before anything is submitted (a bad one would fail every job at its first
    rung): one ValueError naming the key."""
    rung_steps(steps, list(sweep.rungs))
    check_rule(float(sweep.alpha), float(sweep.futility), _margin(sweep))


def _margin(sweep) -> float | None:
    margin = sweep.get("margin_A")
    return None if margin is None else float(margin)


class Rungs:
    """The looks one run of an adaptive sweep takes. `due(step)`: a rung's step (not the last: a run at its full
    budget simply ends). `look(step)`: the decision there, logged (None: not a rung)."""

    def __init__(self, cfg: DictConfig, run_id: str, tracker, *, poll_s: float = POLL_S,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        sweep = cfg.sweep  # .get: a job's config from before these keys (a requeued one) has none of them
        self.runs = dict(sweep.get("runs") or {})  # variant name -> run id, handed in by the sweep
        # sweep.extend: runs go to their full budget (a settled one from its checkpoint): no stops
        # several seeds: the adaptive sweep with seeds, whose looks are the sweep's, at whole seeds (ablate/seeding.py)
        seeds = max(int(sweep.get("seeds", 1)), int(sweep.get("base_seeds", 1)))
        self.active = bool(sweep.get("adaptive")) and bool(self.runs) and not sweep.get("extend") and seeds == 1
        self.steps = int(cfg.train.steps)
        self.rungs = rung_steps(self.steps, list(sweep.get("rungs", RUNGS))) if self.active else []
        self.run_id, self.tracker, self.seed = run_id, tracker, int(cfg.seed)
        self.alpha, self.futility = float(sweep.get("alpha", ALPHA)), float(sweep.get("futility", FUTILITY))
        self.margin_A = _margin(sweep)
        self.wait_s = 60.0 * float(sweep.get("base_wait_min", 120.0))
        self.poll_s, self.clock, self.sleep = poll_s, clock, sleep
        self.is_base = self.runs.get(BASELINE) == run_id

    def due(self, step: int) -> bool:
        return step in self.rungs[:-1]

    def look(self, step: int) -> Decision | None:
        if not self.due(step):
            return None
        rung = self.rungs.index(step) + 1
        client = self.tracker.client
        logged = {d.rung: d for d in decisions_of(client.get_run(self.run_id).data.tags)}
        if rung in logged:  # decided before a restart: the same decision again
            decision = logged[rung]
        else:
            self.tracker.flush()  # every point up to this step is in the store before the curve is read
            history = list(logged.values())
            decision = self._base_decides(rung, step) if self.is_base else self._variant_decides(rung, step, history)
            tags = {RUNG_TAG.format(k=rung): decision.to_json()}
            if decision.stop:
                tags |= {SETTLED_TAG: str(step), END_REASON_TAG: decision.summary()}
            self.tracker.set_tags(tags)
        name = next((n for n, run_id in self.runs.items() if run_id == self.run_id), self.run_id)
        print(f"{name} {decision.summary()}", file=sys.stderr, flush=True)
        return decision

    def _said(self, rung: int, step: int, compute: float, decision: str, verdict: str, reason: str) -> Decision:
        return Decision(rung=rung, step=step, steps=self.steps, compute=compute, decision=decision, verdict=verdict,
                        reason=reason)

    def _variant_decides(self, rung: int, step: int, history: list[Decision]) -> Decision:
        client = self.tracker.client
        mine = load_curve(client, self.run_id)
        c_rung = float(mine.compute[mine.step <= step].max(initial=0.0))
        base_id = self.runs.get(BASELINE)
        deadline = self.clock() + self.wait_s
        while True:
            base = load_curve(client, base_id) if base_id else None
            if base is not None and (base.c_max >= c_rung or base.status not in ("RUNNING", "SCHEDULED")):
                break
            if base is None or self.clock() >= deadline:
                why = ("the sweep has no base recipe" if base is None else
                       f"the base recipe had not reached {fmt_compute(c_rung)} GPU-h after {self.wait_s / 60:.0f} min")
                return self._said(rung, step, c_rung, GO, "", f"undecided: {why}")
            self.sleep(self.poll_s)
        if base.c_max < c_rung:  # the base ended (settled, failed) short of this compute: nothing to compare at it
            return self._said(rung, step, c_rung, GO, "", f"undecided: the base recipe ended ({base.status}) at "
                                                          f"{fmt_compute(base.c_max)} GPU-h, short of this compute")
        return decide(Curve(mine.step, mine.compute, mine.pass_rate), Curve(base.step, base.compute, base.pass_rate),
                      rung=rung, step=step, steps=self.steps, history=history, alpha=self.alpha,
                      futility=self.futility, margin_A=self.margin_A)

    def _base_decides(self, rung: int, step: int) -> Decision:
        client = self.tracker.client
        c_now = float(load_curve(client, self.run_id).c_max)
        others = {name: run_id for name, run_id in self.runs.items() if name != BASELINE}
        open_ = []
        for name, run_id in others.items():
            run = client.get_run(run_id)
            settled = any(d.stop and d.rung <= rung for d in decisions_of(run.data.tags))
            if not settled and run.info.status != "FAILED":  # a failed one needs no base
                open_.append(name)
        if open_:
            return self._said(rung, step, c_now, GO, "base",
                              f"the base recipe: {', '.join(sorted(open_))} may still need it")
        return self._said(rung, step, c_now, STOP, "base", "the base recipe: every variant has settled")
