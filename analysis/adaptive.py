"""The adaptive sweep's rule: at a rung, a variant is fitted beside the base recipe on the same compute, and either
stops (its verdict settled) or goes on.

`decide` forecasts the verdict at the full budget: it draws laws from both fits' posteriors, continues each curve to
its full budget with the noise its fit measured, refits, and takes the verdict of each forecast. The variant stops
when the verdict it has now is the forecasts' in at least `confidence` of them, and never while either curve's A is
not identified (analysis/law.py). `Decision` is what the job logs (as JSON, the tag `ablate.rung.<k>`) and the
report shows. Why this rule, and
how it was calibrated: docs/fitting.md#the-adaptive-sweep.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from analysis.fit import FitError, SigmoidFit, fit_sigmoid, fmt_compute
from analysis.rank import A_NOT_IDENTIFIED, verdict
from analysis.runs import SETTLED_TAG
from analysis.synthetic import wobble

RUNGS = (0.25, 0.5, 1.0)  # fractions of each variant's compute (its train.steps) at which it is looked at
CONFIDENCE = 0.95  # the share of forecasts whose verdict must be the verdict now
FORECASTS = 20  # continuations drawn per decision
RUNG_TAG = "ablate.rung.{k}"  # one per rung looked at: the Decision as JSON, written once
STOP, GO = "stop", "go on"


@dataclass(frozen=True)
class Curve:
    """What a run has logged: validation points (step, compute in GPU-hours, pass rate), step 0 first."""

    step: np.ndarray
    compute: np.ndarray
    reward: np.ndarray

    def upto(self, compute: float) -> Curve:
        keep = self.compute <= compute * (1 + 1e-9)
        return Curve(self.step[keep], self.compute[keep], self.reward[keep])

    def upto_step(self, step: int) -> Curve:
        keep = self.step <= step
        return Curve(self.step[keep], self.compute[keep], self.reward[keep])

    @property
    def c_max(self) -> float:
        return float(self.compute.max(initial=0.0))


@dataclass(frozen=True)
class Decision:
    rung: int  # 1-based
    step: int  # the variant's step at the rung
    steps: int  # its train.steps (the full budget)
    compute: float  # the compute both curves were fitted up to (GPU-hours)
    decision: str  # STOP or GO
    verdict: str  # the verdict now (analysis.rank's label)
    reason: str
    forecast: dict[str, float] = field(default_factory=dict)  # the verdict at the full budget -> share of forecasts
    band: list[list[float]] = field(default_factory=list)  # [compute, low, high]: the variant's 90% band to its budget

    @property
    def stop(self) -> bool:
        return self.decision == STOP

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Decision:
        return cls(**json.loads(text))

    def summary(self) -> str:
        """ "settled at rung 1 (step 12 of 50, 4,000 GPU-h): moves A, in 19 of 20 forecasts to the full budget" """
        where = f"rung {self.rung} (step {self.step} of {self.steps}, {fmt_compute(self.compute)} GPU-h)"
        return f"{'settled' if self.stop else 'went on'} at {where}: {self.reason}"


def rung_steps(steps: int, rungs: Sequence[float] = RUNGS) -> list[int]:
    """The steps at which a run of `steps` steps is looked at: each fraction's, rounded, the last one `steps`."""
    if not rungs or any(not 0 < f <= 1 for f in rungs) or list(rungs) != sorted(set(rungs)) or rungs[-1] != 1:
        raise ValueError(f"sweep.rungs must rise from above 0 to 1, e.g. [0.25, 0.5, 1.0], not {list(rungs)}")
    return sorted({max(1, min(steps, round(f * steps))) for f in rungs})


def decide(variant: Curve, base: Curve, *, rung: int, step: int, steps: int, confidence: float = CONFIDENCE,
           forecasts: int = FORECASTS, seed: int = 0) -> Decision:
    """The decision for `variant` at its rung (`step` of `steps`), beside `base`, which must have reached the
    variant's compute at that step: both are fitted up to it (the same compute: a base further on is cut there)."""
    variant = variant.upto_step(step)
    c_rung = variant.c_max
    base = base.upto(c_rung)
    args = dict(rung=rung, step=step, steps=steps, compute=c_rung)
    try:
        fit, base_fit = _fit(variant), _fit(base)
    except FitError as err:
        return Decision(decision=GO, verdict="no fit", reason=f"no fit yet ({err.reason})", **args)
    now = verdict(fit, base_fit).label
    band = _band(fit, c_rung, c_rung * steps / step)
    if step >= steps:
        return Decision(decision=STOP, verdict=now, reason="its full budget", band=band, **args)
    if not (fit.A_identified and base_fit.A_identified):
        return Decision(decision=GO, verdict=now, band=band, **args,
                        reason=f"{A_NOT_IDENTIFIED}: a curve has not reached its fitted C_mid")
    rng = np.random.default_rng(seed)
    labels = [_forecast_verdict(variant, fit, base, base_fit, steps / step, rng) for _ in range(forecasts)]
    shares = {label: labels.count(label) / len(labels) for label in sorted(set(labels), key=labels.count,
                                                                             reverse=True)}
    agree = shares.get(now, 0.0)
    said = f"{now}, in {labels.count(now)} of {len(labels)} forecasts to the full budget"
    if agree >= confidence:
        return Decision(decision=STOP, verdict=now, reason=said, forecast=shares, band=band, **args)
    return Decision(decision=GO, verdict=now, forecast=shares, band=band, **args,
                    reason=f"open: {said} (needs {confidence:.0%})")


def _fit(curve: Curve) -> SigmoidFit:
    return fit_sigmoid(curve.compute, curve.reward)


def _band(fit: SigmoidFit, c_rung: float, c_full: float, points: int = 12) -> list[list[float]]:
    """[compute, low, high]: the law's 90% band from the rung to the full budget (what the forecasts start from)."""
    c = np.geomspace(c_rung, c_full, points) if c_full > c_rung > 0 else np.array([c_full])
    lo, hi = fit.predict_interval(c)
    return [[float(x), float(a), float(b)] for x, a, b in zip(c, lo, hi)]


def _continue(curve: Curve, fit: SigmoidFit, scale: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The curve to its full budget (`scale` x its compute): its points as logged, then points at the same spacing in
    steps and the same compute a step, on a law drawn from the fit's posterior within its 90% intervals of A and B
    (the posterior's tails past them are the flat prior's: draws there made forecasts claim moves that the data
    rule out), with the noise the fit measured, white and the run's slow wobble, each at least half of the residual
    variance (a short curve's noise model underestimates it): docs/fitting.md#the-adaptive-sweep."""
    plausible = _plausible(fit)
    A, B, C_mid, R0 = plausible[rng.integers(len(plausible))]
    step, c = curve.step[curve.step > 0], curve.compute[curve.step > 0]
    per_step = c[-1] / step[-1]
    gap = int(np.median(np.diff(step))) if step.size > 1 else 1
    future = np.arange(step[-1] + gap, round(step[-1] * scale) + 1, gap) * per_step
    fitted = curve.compute >= fit.c_min
    half = float(np.sqrt(np.mean((fit.predict(curve.compute[fitted]) - curve.reward[fitted]) ** 2) / 2))
    noise = fit.noise or {}
    white, slow = max(noise.get("sd_white", 0.0), half), max(noise.get("sd_wobble", 0.0), half)
    r = (R0 + (A - R0) / (1 + (C_mid / future) ** B) + rng.normal(0.0, white, future.size)
         + wobble(rng, future, slow, noise.get("corr_gpu_hours", 0.0) or per_step))
    return np.concatenate([curve.compute, future]), np.concatenate([curve.reward, r])


def _plausible(fit: SigmoidFit) -> np.ndarray:
    """The fit's posterior draws inside its 90% intervals of A and B (all of them when none is)."""
    d = fit.draws
    inside = ((d[:, 0] >= fit.ci["A"][0]) & (d[:, 0] <= fit.ci["A"][1])
              & (d[:, 1] >= fit.ci["B"][0]) & (d[:, 1] <= fit.ci["B"][1]))
    return d[inside] if inside.any() else d


def _forecast_verdict(variant: Curve, fit: SigmoidFit, base: Curve, base_fit: SigmoidFit, scale: float,
                      rng: np.random.Generator) -> str:
    try:
        full = fit_sigmoid(*_continue(variant, fit, scale, rng))
        full_base = fit_sigmoid(*_continue(base, base_fit, scale, rng))
    except FitError:
        return "no fit"
    return verdict(full, full_base).label


def decisions_of(tags: dict) -> list[Decision]:
    """The decisions a run's tags hold, by rung."""
    found = []
    for key, value in tags.items():
        if key.startswith("ablate.rung."):
            try:
                found.append(Decision.from_json(value))
            except (TypeError, ValueError):
                continue
    return sorted(found, key=lambda d: d.rung)


def stopped_at(tags: dict) -> Decision | None:
    """The decision that stopped a run where it is (None: no adaptive sweep stopped it, or it was extended since)."""
    if SETTLED_TAG not in tags:
        return None
    return next((d for d in decisions_of(tags) if d.stop and d.step < d.steps), None)


def gpu_hours_saved(decision: Decision) -> float:
    """What stopping at this rung saved, at the compute a step it ran at: (steps - step) x compute / step."""
    if not decision.stop or decision.step >= decision.steps or decision.step <= 0:
        return 0.0
    return (decision.steps - decision.step) * decision.compute / decision.step
