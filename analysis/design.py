"""What a sweep's design can answer before it runs: for seeds of each variant, seeds of the base recipe and the
length of each run, the resolution on A between runs and between recipes, the power at a stated question's margins,
the false-claim rate and the GPU-hours; and the cheapest design that answers the question (`answer`, `cheapest`).

One run's sd of A and B is the Gaussian limit of the fit (analysis/information.py) on a paper-shaped law (ScaleRL's
Table 1: A 0.61, B 1.92, C_mid at 2,542 of 16,000 GPU-hours, R0 0.30) in units of the run's budget, observed as the
sweep would observe it (its validation points, the binomial noise of its validation set, the mock's slow wobble),
times the real fitter's excess over the limit (FIT_SD); between recipes the spread between runs of one recipe
(analysis/spread.py) is added. `sweep.dry_run=true` prints it (ablate/run.py's print_designs). Why:
docs/fitting.md#seeds-where-they-pay, docs/fitting.md#a-stated-question.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.information import covariance
from analysis.rank import CRITICAL, _z
from analysis.spread import PRIOR_SD_A, RECIPES

PAPER_LAW = (0.61, 1.92, 2542.0 / 16000.0, 0.30)  # A, B, C_mid as a share of the budget, R0
WOBBLE_SD = 0.004  # the mock's slow wobble, sd and correlation length as a share of the budget (1,000 of 16,000)
WOBBLE_SHARE = 1000.0 / 16000.0
PROMPT_SPREAD = 0.86  # mean@k's sd over the binomial one, for prompts of spread difficulty (the mock's: measured)


@dataclass(frozen=True)
class Design:
    """`seeds` runs of each variant and `base_seeds` of the base recipe, each `fraction` of the budget long."""

    name: str
    seeds: int = 1
    base_seeds: int = 1
    fraction: float = 1.0


DESIGNS = (Design("one seed, full budget"), Design("two seeds, half the budget each", 2, 2, 0.5),
           Design("one seed, two of the base", 1, 2), Design("two seeds, full budget", 2, 2))


def white_sd(val_prompts: int, val_samples: int, rate: float = 0.5) -> float:
    """The sd of one validation point: mean@k over val_prompts x val_samples answers (binomial), narrowed by the
    prompts' spread of difficulty as the mock's is."""
    return PROMPT_SPREAD * math.sqrt(rate * (1 - rate) / (val_prompts * val_samples))


# --- a stated question: the cheapest design that answers it -----------------------------------------------------

POWER = 0.8  # the power a design must have at the margins to answer the question
LENGTHS = (1.0, 0.75, 0.5, 0.25)  # run lengths (shares of the budget) the search tries: those that reach C_mid
MAX_SEEDS = 256  # the most seeds of a variant the search tries
# the real fitter's sd of A over the Gaussian limit's, on the mock at the full budget: bench_power's run-level power
# at dA -0.02 (0.60, one seed each) puts the sd of dA at 0.0078 against the limit's 0.0056. At half the budget the
# limit is pessimistic for the fitter (power 0.33-0.43 measured, 0.10-0.20 by the limit): the factor is conservative
# there (docs/fitting.md#a-stated-question)
FIT_SD = 1.4


@dataclass(frozen=True)
class Question:
    """What a sweep is run to answer: moves of A (and of B) at least `margin_A` (`margin_B`) found with POWER, at
    the level of the runs or of the recipes (RUNS, RECIPES), within `budget` GPU-hours (None: no budget); `spread_A`,
    `spread_B`: the sd between runs of one recipe (the prior: sweep.run_sd_A, sweep.run_sd_B; 0 for B: unknown)."""

    margin_A: float
    margin_B: float | None = None
    level: str = RECIPES
    budget: float | None = None
    spread_A: float = PRIOR_SD_A
    spread_B: float = 0.0
    power: float = POWER


@dataclass(frozen=True)
class Answer:
    """A design's answer to a question: the sd of each change it compares (nan: no claim at that level), its power
    at the margins (the move claimed in its direction: Phi(margin / sd - CRITICAL)), its false-claim rate per claim
    at no effect, and its GPU-hours."""

    design: Design
    sd_dA: float
    sd_dB: float
    power_A: float
    power_B: float  # nan: no margin_B asked, or no claim on B at this level (its spread unknown): not asked of it
    false_claims: float
    gpu_hours: float
    identified: bool
    resolution: tuple[float, float]  # the move of A found 9 times in 10 between these runs and between the recipes

    def reaches(self, power: float = POWER) -> bool:
        return self.identified and self.power_A >= power and not self.power_B < power


def power_at(margin: float, sd: float, c: float = CRITICAL) -> float:
    """The chance a z-test at c claims a move of `margin` (its estimate's sd `sd`) in its direction."""
    from scipy.special import ndtr

    return float(ndtr(margin / sd - c)) if sd > 0 and math.isfinite(sd) else 0.0


def run_sds(fraction: float, *, points: int, val_prompts: int = 1000, val_samples: int = 16,
            law: tuple[float, float, float, float] = PAPER_LAW) -> tuple[float, float]:
    """One run's sd of A and of B (own fit) at `fraction` of the budget: the Gaussian limit of the fit, times FIT_SD."""
    every = 1.0 / points
    c = np.arange(0.0, fraction + every / 2, every)
    noise = {"sd_white": white_sd(val_prompts, val_samples), "sd_wobble": WOBBLE_SD, "corr_gpu_hours": WOBBLE_SHARE}
    cov = covariance(c, law, noise)
    return float(FIT_SD * math.sqrt(cov[0, 0])), float(FIT_SD * law[1] * math.sqrt(cov[1, 1]))


def answer(design: Design, q: Question, *, sds: tuple[float, float], hours: tuple[float, float],
           law: tuple[float, float, float, float] = PAPER_LAW) -> Answer:
    """`design`'s answer to `q`, its runs' sds of A and B (run_sds at its length), `hours`: the GPU-hours of one
    full-budget run of every variant together and of the base recipe."""
    from scipy.special import ndtr

    per_side = 1 / design.seeds + 1 / design.base_seeds
    recipes = q.level == RECIPES
    sd_dA = math.sqrt((sds[0] ** 2 + (q.spread_A**2 if recipes else 0.0)) * per_side)
    nine_in_ten = (CRITICAL + _z(0.9)) * math.sqrt(per_side)
    b_known = not recipes or q.spread_B > 0
    sd_dB = math.sqrt((sds[1] ** 2 + (q.spread_B**2 if recipes else 0.0)) * per_side) if b_known else math.nan
    identified = design.fraction >= law[2]
    power_B = power_at(q.margin_B, sd_dB) if q.margin_B and b_known else math.nan
    return Answer(design=design, sd_dA=sd_dA, sd_dB=sd_dB,
                  power_A=power_at(q.margin_A, sd_dA) if identified else 0.0, power_B=power_B,
                  false_claims=float(2 * ndtr(-CRITICAL)),
                  gpu_hours=design.fraction * (design.seeds * hours[0] + design.base_seeds * hours[1]),
                  identified=identified,
                  resolution=(nine_in_ten * sds[0], nine_in_ten * math.sqrt(sds[0] ** 2 + q.spread_A**2)))


def cheapest(q: Question, *, points: int, hours: tuple[float, float], val_prompts: int = 1000,
             val_samples: int = 16, law: tuple[float, float, float, float] = PAPER_LAW,
             lengths: tuple[float, ...] = LENGTHS, max_seeds: int = MAX_SEEDS) -> list[Answer]:
    """For each run length that reaches the law's C_mid, the cheapest design (seeds of a variant, seeds of the base)
    with `q.power` at the margins, cheapest first; none at a length where MAX_SEEDS a variant do not reach it. For
    n seeds a variant the base needs the fewest b with 1/n + 1/b <= (margin / ((CRITICAL + z_power) s))^2, s the
    sd of one run's estimate at the level (closed form, for A and for B)."""
    z = CRITICAL + _z(q.power)
    found = []
    for f in lengths:
        if f < law[2]:
            continue
        sds = run_sds(f, points=points, val_prompts=val_prompts, val_samples=val_samples, law=law)
        caps = []  # the largest 1/n + 1/b each margin allows
        recipes = q.level == RECIPES
        caps.append((q.margin_A / z) ** 2 / (sds[0] ** 2 + (q.spread_A**2 if recipes else 0.0)))
        if q.margin_B and (not recipes or q.spread_B > 0):
            caps.append((q.margin_B / z) ** 2 / (sds[1] ** 2 + (q.spread_B**2 if recipes else 0.0)))
        cap = min(caps)
        best = None
        for n in range(1, max_seeds + 1):
            if 1 / n >= cap:
                continue
            b = max(1, math.ceil(1 / (cap - 1 / n)))
            d = answer(Design(f"{n} a variant, {b} of the base", n, b, f), q, sds=sds, hours=hours, law=law)
            if not d.reaches(q.power):  # the cap's rounding
                d = answer(Design(f"{n} a variant, {b + 1} of the base", n, b + 1, f), q, sds=sds, hours=hours,
                           law=law)
            if d.reaches(q.power) and (best is None or d.gpu_hours < best.gpu_hours):
                best = d
        if best is not None:
            found.append(best)
    return sorted(found, key=lambda a: a.gpu_hours)
