"""Synthetic validation curves with a known truth, for the benchmark (bench/bench_fit.py) and the tests.

A curve follows Eq. 1 plus a slow run-level wobble (an AR(1) process in compute, `wobble`) and the binomial noise
of `n_prompts` x `samples` validation answers per point; the point at compute 0 has the binomial noise only. Two
sets: `benchmark_curves` (runs that pass their midpoint, the mock's noise) and `heldout_like_curves` (runs that stop
near their midpoint, with more noise), and `drifting_curves` (those, drifting off their law as real runs do). `mock_curve` is a run of generator=mock without the trainer: its validation
(`mean_at_k`, which the mock generator calls too), its run-to-run A, its wobble and its clock, for the power bench.
What each set draws: docs/fitting.md#synthetic-curves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.law import sigmoid_law


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
    truth: Truth  # the law this run follows (a mock run: its own A)
    compute: np.ndarray
    reward: np.ndarray
    step: np.ndarray | None = None  # the optimizer step of each point, where the curve has steps


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
    """The benchmark's range: A in 0.5-0.75, B in 1-3, C_mid in 1.5k-9k GPU-hours, R0 in 0.25-0.40."""
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


# --- the held-out-like set --------------------------------------------------------------------------------------------

HELDOUT_C_MAX = 16_000.0  # a LOO run's budget, GPU-hours
R0_EXTRA_SD = 0.005  # the pre-RL point's own error, beyond the binomial noise


def heldout_like_curve(rng: np.random.Generator) -> Curve:
    """One curve as hard as the held-out set's, in the three ways real runs are hard:
    - runs that stop near their midpoint: C_mid log-uniform in 1.5k-12k GPU-hours, runs end at 16k (1.3 to 11
      C_mid); with B down to 1 (a slow approach), A is then loosely pinned;
    - a correlated wobble of sd 0.001-0.0065 over 300-3,000 GPU-hours (up to 1.6x the mock's sd);
    - noisy early points: extra white noise of sd up to 0.02 at C = 0, decaying over 500-2,000 GPU-hours (so
      points just past the 1.5k cut can still carry it), and the pre-RL point off by sd 0.005 (R0 is measured
      from it).
    A in 0.45-0.80 (the paper's grid), B in 1-3, R0 in 0.20-0.40; a point every 100-400 GPU-hours; the paper's
    1,000 prompts x 16 samples of binomial noise."""
    truth = heldout_like_truth(rng)
    compute = np.arange(0.0, HELDOUT_C_MAX + 1e-9, float(rng.uniform(100.0, 400.0)))
    rate = truth(compute) + wobble(rng, compute, float(rng.uniform(0.001, 0.0065)), float(rng.uniform(300.0, 3000.0)))
    early_sd, early_gpu_hours = float(rng.uniform(0.0, 0.02)), float(rng.uniform(500.0, 2000.0))
    early = early_sd * np.exp(-compute / early_gpu_hours) * rng.standard_normal(compute.size)
    early[0] = R0_EXTRA_SD * rng.standard_normal()
    n = 1000 * 16
    reward = rng.binomial(n, np.clip(rate + early, 0.0, 1.0)) / n
    return Curve(truth=truth, compute=compute, reward=reward)


def heldout_like_truth(rng: np.random.Generator) -> Truth:
    """The held-out-like set's laws: A in 0.45-0.80 (the paper's grid), B in 1-3, C_mid log-uniform in 1.5k-12k
    GPU-hours, R0 in 0.20-0.40."""
    return Truth(
        A=float(rng.uniform(0.45, 0.80)),
        B=float(rng.uniform(1.0, 3.0)),
        C_mid=float(math.exp(rng.uniform(math.log(1500.0), math.log(12000.0)))),
        R0=float(rng.uniform(0.20, 0.40)),
    )


def heldout_like_curves(n: int, seed: int = 0) -> list[Curve]:
    """n curves of the held-out-like set (heldout_like_curve)."""
    rng = np.random.default_rng(seed)
    return [heldout_like_curve(rng) for _ in range(n)]


def drifting_curves(n: int, seed: int = 0) -> list[Curve]:
    """n held-out-like curves that also drift off their law as real runs do (docs/fitting.md#real-noise): slow
    departures of sd 0.002-0.006 correlated over a quarter of the run to all of it, on top of the held-out-like
    noise; what the generated sets lacked beside the public runs."""
    rng = np.random.default_rng([seed, 31])
    out = []
    for curve in heldout_like_curves(n, seed):
        slow = wobble(rng, curve.compute, float(rng.uniform(0.002, 0.006)),
                      float(rng.uniform(0.25, 1.0)) * HELDOUT_C_MAX)
        out.append(Curve(truth=curve.truth, compute=curve.compute, reward=np.clip(curve.reward + slow, 0.0, 1.0)))
    return out


# --- runs of generator=mock, without the trainer -------------------------------------------------------------------


def mean_at_k(rng: np.random.Generator, rate: float, quantiles: np.ndarray, samples: int, spread: float) -> float:
    """mean@k over a fixed validation set whose prompts' pass rates are the `quantiles` of a Beta with mean `rate`
    and concentration `spread` (prompts differ in difficulty), each prompt answered `samples` times (binomial)."""
    from scipy.special import betaincinv

    per_prompt = betaincinv(rate * spread, (1 - rate) * spread, quantiles)
    return float(rng.binomial(samples, per_prompt).sum() / (len(per_prompt) * samples))


@dataclass(frozen=True)
class MockNoise:
    """generator=mock's noise (conf/generator/mock.yaml), and its schedule: `steps` optimizer steps of `rows`
    completions each, validated every `val_every` steps, `budget` GPU-hours at the reference length."""

    val_prompts: int = 1000
    val_samples: int = 16
    spread: float = 4.0
    wobble_sd: float = 0.004
    wobble_gpu_hours: float = 1000.0
    run_sd_A: float = 0.006
    steps: int = 50
    val_every: int = 1
    budget: float = 16_000.0
    rows: int = 32


def mock_curve(rng: np.random.Generator, truth: Truth, noise: MockNoise = MockNoise(), *, steps: int | None = None,
               run_A: float | None = None) -> Curve:
    """One run of `truth` as generator=mock logs it, to `steps` (default noise.steps) of a budget planned for
    noise.steps: the run's A is truth.A plus a run-to-run draw (or `run_A`); a step costs budget / steps GPU-hours
    scaled by the mean of its rows' drawn lengths (the mock's clock, before any length control cuts them); a point
    every val_every steps is mean@k (`mean_at_k`) of the law plus the wobble. The returned truth is the run's."""
    steps = noise.steps if steps is None else steps
    drawn = truth.A + noise.run_sd_A * rng.standard_normal()
    A = min(drawn if run_A is None else run_A, 1.0)
    run = Truth(A=A, B=truth.B, C_mid=truth.C_mid, R0=truth.R0)
    per_step = noise.budget / noise.steps * rng.gamma(5.0, 0.1, size=(steps, noise.rows)).mean(axis=1) / 0.5
    compute = np.concatenate([[0.0], np.cumsum(per_step)])
    step = np.arange(0, steps + 1, noise.val_every)
    compute = compute[step]
    rate = np.clip(run(compute) + wobble(rng, compute, noise.wobble_sd, noise.wobble_gpu_hours), 1e-4, 1 - 1e-4)
    quantiles = (np.arange(noise.val_prompts) + 0.5) / noise.val_prompts
    reward = np.array([mean_at_k(rng, float(r), quantiles, noise.val_samples, noise.spread) for r in rate])
    return Curve(truth=run, compute=compute, reward=reward, step=step)
