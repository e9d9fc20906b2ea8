"""What a sweep's design can resolve before it runs: the expected resolution on A, between runs and between recipes,
and the GPU-hours, of one seed at the full budget against several seeds, shorter ones, or replicates of the base.

The Gaussian limit of the fit (analysis/information.py) on a paper-shaped law (ScaleRL's Table 1: A 0.61, B 1.92,
C_mid at 2,542 of 16,000 GPU-hours, R0 0.30) in units of the run's budget, observed as the sweep would observe it
(its validation points, the binomial noise of its validation set, the mock's slow wobble), plus the spread between
runs of one recipe (analysis/spread.py). The power bench's Gaussian layer (bench/bench_power.py) and
`sweep.dry_run=true` print these. Why: docs/fitting.md#seeds-where-they-pay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.information import covariance
from analysis.rank import CRITICAL, _z
from analysis.spread import PRIOR_SD_A

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

    def gpu_hours(self, variants: int) -> float:
        """GPU-hours as a multiple of one full run of each of `variants` variants plus one of the base."""
        return self.fraction * (self.seeds * variants + self.base_seeds) / (variants + 1)


DESIGNS = (Design("one seed, full budget"), Design("two seeds, half the budget each", 2, 2, 0.5),
           Design("one seed, two of the base", 1, 2), Design("two seeds, full budget", 2, 2))


def white_sd(val_prompts: int, val_samples: int, rate: float = 0.5) -> float:
    """The sd of one validation point: mean@k over val_prompts x val_samples answers (binomial), narrowed by the
    prompts' spread of difficulty as the mock's is."""
    return PROMPT_SPREAD * math.sqrt(rate * (1 - rate) / (val_prompts * val_samples))


def sd_A(points: int, fraction: float = 1.0, *, val_prompts: int = 1000, val_samples: int = 16,
         law: tuple[float, float, float, float] = PAPER_LAW, runs: int = 1) -> float:
    """The sd of A fitted on `runs` runs of `points` validation points evenly spaced to the full budget, cut at
    `fraction` of it (the law in units of the budget; the fit's own c_min)."""
    every = 1.0 / points
    c = np.arange(0.0, fraction + every / 2, every)
    noise = {"sd_white": white_sd(val_prompts, val_samples), "sd_wobble": WOBBLE_SD, "corr_gpu_hours": WOBBLE_SHARE}
    return float(math.sqrt(covariance(c, law, noise, runs=runs)[0, 0]))


@dataclass(frozen=True)
class Expected:
    design: Design
    runs: float  # the resolution on A between these runs (9 times in 10)
    recipes: float  # the same between the recipes
    gpu_hours: float  # a multiple of the one-seed full sweep's
    identified: bool  # the law's C_mid is reached within the runs' budget (else no claim on A at all)


def expected(design: Design, *, points: int, variants: int, val_prompts: int = 1000, val_samples: int = 16,
             spread_sd: float = PRIOR_SD_A, law: tuple[float, float, float, float] = PAPER_LAW) -> Expected:
    """The design's expected resolution on A (runs, recipes) and GPU-hours, on the paper-shaped law."""
    kw = dict(val_prompts=val_prompts, val_samples=val_samples, law=law)
    per_run = sd_A(points, design.fraction, **kw)
    z = CRITICAL + _z(0.9)
    runs = z * math.sqrt(per_run**2 / design.seeds + per_run**2 / design.base_seeds)
    var = per_run**2 + spread_sd**2
    recipes = z * math.sqrt(var / design.seeds + var / design.base_seeds)
    return Expected(design=design, runs=runs, recipes=recipes, gpu_hours=design.gpu_hours(variants),
                    identified=design.fraction >= law[2])
