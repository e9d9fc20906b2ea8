"""Synthetic validation curves with a known truth, for the benchmark (bench/bench_fit.py) and the tests.

A curve follows Eq. 1 (R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)) plus the two kinds of noise a real run shows:
- a slow run-level wobble: an AR(1) process in compute (sd `wobble_sd`, correlation length `wobble_gpu_hours`)
  added to the pass rate, as the mock generator does (conf/generator/mock.yaml: sd 0.004 over 1,000 GPU-hours);
- binomial noise of `n_prompts` x `samples` validation answers per point (the paper's 1,000 prompts x mean@16).
The point at compute 0 (the pre-RL pass rate) has the binomial noise only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.fit import sigmoid_law


@dataclass(frozen=True)
class Truth:
    A: float
    B: float
    C_mid: float
    R0: float

    def __call__(self, compute) -> np.ndarray:
        return sigmoid_law(compute, self.A, self.B, self.C_mid, self.R0)


@dataclass(frozen=True)
class Curve:
    truth: Truth
    compute: np.ndarray
    reward: np.ndarray


def wobble(rng: np.random.Generator, compute: np.ndarray, sd: float, length: float) -> np.ndarray:
    """A stationary AR(1) process in compute: corr(w(C1), w(C2)) = exp(-|C1 - C2| / length); zero at C <= 0."""
    out = np.zeros(len(compute))
    if sd <= 0:
        return out
    value, at = sd * rng.standard_normal(), None
    for i, c in enumerate(compute):
        if c <= 0:
            continue
        if at is not None:
            rho = math.exp(-(c - at) / length)
            value = rho * value + math.sqrt(1 - rho * rho) * sd * rng.standard_normal()
        out[i], at = value, c
    return out


def make_curve(
    rng: np.random.Generator,
    truth: Truth,
    *,
    c_max: float = 16_000.0,
    every: float = 200.0,
    n_prompts: int = 1000,
    samples: int = 16,
    wobble_sd: float = 0.004,
    wobble_gpu_hours: float = 1000.0,
) -> Curve:
    """One noisy run of `truth`, observed at compute 0, every, 2 every, ... up to c_max."""
    compute = np.arange(0.0, c_max + 1e-9, every)
    rate = truth(compute) + wobble(rng, compute, wobble_sd, wobble_gpu_hours)
    n = n_prompts * samples
    reward = rng.binomial(n, np.clip(rate, 0.0, 1.0)) / n
    return Curve(truth=truth, compute=compute, reward=reward)


def draw_truth(rng: np.random.Generator) -> Truth:
    """The benchmark's range (issue 4): A in 0.5-0.75, B in 1-3, C_mid in 1.5k-9k GPU-hours, R0 in 0.25-0.40."""
    return Truth(
        A=float(rng.uniform(0.5, 0.75)),
        B=float(rng.uniform(1.0, 3.0)),
        C_mid=float(rng.uniform(1500.0, 9000.0)),
        R0=float(rng.uniform(0.25, 0.40)),
    )


def benchmark_curves(n: int, seed: int = 0) -> list[Curve]:
    """n curves of the benchmark: truths from draw_truth, observed to 16k GPU-hours every 100-250 GPU-hours."""
    rng = np.random.default_rng(seed)
    curves = []
    for _ in range(n):
        truth = draw_truth(rng)
        every = float(rng.uniform(100.0, 250.0))
        curves.append(make_curve(rng, truth, every=every))
    return curves
