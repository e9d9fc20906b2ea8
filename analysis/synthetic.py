"""Synthetic validation curves with a known truth, for the benchmark (bench/bench_fit.py) and the tests.

A curve follows Eq. 1 plus a slow run-level wobble (an AR(1) process in compute, `wobble`) and the binomial noise
of `n_prompts` x `samples` validation answers per point; the point at compute 0 has the binomial noise only. Two
sets: `benchmark_curves` (runs that pass their midpoint, the mock's noise) and `heldout_like_curves` (runs that stop
near their midpoint, with more noise), and `drifting_curves` (those, drifting off their law as real runs do). `mock_curve` is a run of generator=mock without the trainer: its validation
(`mean_at_k`, which the mock generator calls too), its run-to-run A, its wobble and its clock, for the power bench:
the functions the mock generator draws by, and given a run's MockStreams the very run it draws.
What each set draws: docs/fitting.md#synthetic-curves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

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


@dataclass(frozen=True)
class WobblePoint:
    """Where a wobble is: its value at compute `at`; `value` None before its first point."""

    value: float | None = None
    at: float = 0.0


def wobble_next(rng: np.random.Generator, last: WobblePoint, compute: float, sd: float, length: float) -> WobblePoint:
    """The wobble one point on, at `compute` > 0: a stationary AR(1) process in compute (an Ornstein-Uhlenbeck
    process sampled at the points, corr(w(C1), w(C2)) = exp(-|C1 - C2| / length)), its first point drawn from the
    stationary law N(0, sd^2) like every later one. One normal per point. The one wobble of the synthetic curves and
    of generator=mock (ablate/generators/mock.py, point by point as it validates)."""
    z = rng.standard_normal()
    if last.value is None:
        return WobblePoint(sd * z, compute)
    rho = math.exp(-max(compute - last.at, 0.0) / length)
    return WobblePoint(rho * last.value + math.sqrt(1 - rho * rho) * sd * z, compute)


def wobble(rng: np.random.Generator, compute: np.ndarray, sd: float, length: float) -> np.ndarray:
    """The wobble (wobble_next) at every point of `compute`, in order: corr(w(C1), w(C2)) = exp(-|C1 - C2| / length),
    sd `sd` at every point, the first included; zero at C <= 0 (no draw), and everywhere when sd is 0."""
    out = np.zeros(len(compute))
    if sd <= 0:
        return out
    last = WobblePoint()
    for i, c in enumerate(compute):
        if c > 0:
            last = wobble_next(rng, last, float(c), sd, length)
            out[i] = last.value
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


def validation_quantiles(prompts: int) -> np.ndarray:
    """The fixed validation set's prompts as the midpoints of `prompts` equal shares of their Beta (mean_at_k)."""
    return (np.arange(prompts) + 0.5) / prompts


def validation_rate(run: Truth, compute: float, wobble_value: float) -> float:
    """The mean pass rate a mock validation draws around at `compute`: the run's law plus the wobble, kept inside
    (0, 1) by 1e-4. Scalar, one point at a time, as generator=mock validates (the same floats in mock_curve)."""
    return min(max(float(run(compute)) + wobble_value, 1e-4), 1 - 1e-4)


@dataclass(frozen=True)
class MockNoise:
    """generator=mock's noise and clock, and a run's schedule: `steps` optimizer steps of `rows` completions each,
    validated every `val_every` steps, `budget` GPU-hours at the reference length. The defaults are
    conf/generator/mock.yaml's (and ablate/schema.py's; tests/test_mock_noise.py holds the three equal);
    ablate/generators/mock.py's `mock_noise` reads a run's config into one. `max_length` 0: completion lengths as
    shares of the generation limit, uncut (the power bench's); > 0: whole tokens cut at that limit, as the mock
    generator's are (without a length control's thinking budget, the same lengths)."""

    val_prompts: int = 1000
    val_samples: int = 16
    spread: float = 4.0  # generator.prompt_spread
    wobble_sd: float = 0.004
    wobble_gpu_hours: float = 1000.0
    run_sd_A: float = 0.006
    reference_length_frac: float = 0.5
    steps: int = 50
    val_every: int = 1
    budget: float = 16_000.0  # generator.gpu_hours
    rows: int = 32
    max_length: int = 0


@dataclass(frozen=True)
class MockStreams:
    """The random streams of one mock run: its A (`run`), its completion lengths (the clock's), its wobble, its
    validation answers, and the rest of its rollouts (pass or fail, tokens: the mock generator's alone). `of(seed)`:
    each a stream of its own, so mock_curve and the generator (ablate/generators/mock.py) given one seed draw one
    run, whatever else each draws between; `shared(rng)`: all one generator, drawn in mock_curve's order (the run's A,
    the lengths, the wobble, the validations)."""

    run: np.random.Generator
    lengths: np.random.Generator
    wobble: np.random.Generator
    validation: np.random.Generator
    rollouts: np.random.Generator

    @classmethod
    def of(cls, seed: int) -> MockStreams:
        return cls(*(np.random.default_rng([seed, k]) for k in range(len(fields(cls)))))

    @classmethod
    def shared(cls, rng: np.random.Generator) -> MockStreams:
        return cls(*(rng for _ in fields(cls)))

    def state_dict(self) -> dict:
        return {f.name: getattr(self, f.name).bit_generator.state for f in fields(self)}

    def load_state_dict(self, state: dict) -> None:
        for f in fields(self):
            getattr(self, f.name).bit_generator.state = state[f.name]


def run_truth(rng: np.random.Generator, truth: Truth, run_sd_A: float, run_A: float | None = None) -> Truth:
    """A mock run's own law: its A its variant's plus a run-to-run draw of sd `run_sd_A` (or `run_A`, the draw made
    all the same), at most 1; B, C_mid and R0 the variant's."""
    drawn = truth.A + run_sd_A * rng.standard_normal()
    return replace(truth, A=min(drawn if run_A is None else run_A, 1.0))


def completion_length_fracs(rng: np.random.Generator, size) -> np.ndarray:
    """generator=mock's completion lengths before any limit, as shares of the generation limit (max_think_tokens +
    max_answer_tokens): Gamma(5, 0.1), mean 0.5, the reference_length_frac at which a run's budget holds."""
    return rng.gamma(5.0, 0.1, size=size)


def whole_tokens(fracs: np.ndarray, max_length: int) -> np.ndarray:
    """Lengths drawn as shares of the generation limit, in whole tokens (rounded up)."""
    return np.ceil(max_length * fracs).astype(int)


def thinking_and_answer(natural: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Completions of `natural` whole tokens as generator=mock writes them, before any limit: 85% thinking, the rest
    the answer, at least one token of each."""
    think = np.maximum(np.round(natural * 0.85).astype(int), 1)
    return think, np.maximum(natural - think, 1)


def length_share(lengths: np.ndarray, max_length: float) -> np.ndarray | float:
    """A step's mean completion length (the last axis's) as a share of the generation limit `max_length`."""
    return np.mean(lengths, axis=-1) / max_length


def step_gpu_hours(hours_per_step: float, share, reference_length_frac: float):
    """generator=mock's step-cost law (conf/generator/mock.yaml): a step costs its share of the run's budget
    (hours_per_step = gpu_hours / steps) scaled by its completions' mean length as a share of the generation limit
    (`share`, length_share), over the reference share at which the budget holds. The mock generator's clock
    (ablate/generators/mock.py's SimulatedClock) and mock_curve's."""
    return hours_per_step * share / reference_length_frac


def mock_compute(rng: np.random.Generator, noise: MockNoise, steps: int) -> np.ndarray:
    """A mock run's compute after each of `steps` steps of a budget planned for noise.steps, from 0 at step 0: each
    step's noise.rows lengths drawn (completion_length_fracs; in whole tokens cut at noise.max_length where it is
    set, as the mock's generation limit cuts them: thinking_and_answer), costed by step_gpu_hours."""
    fracs = completion_length_fracs(rng, (steps, noise.rows))
    if noise.max_length > 0:
        think, answer = thinking_and_answer(whole_tokens(fracs, noise.max_length))
        share = length_share(np.minimum(think + answer, noise.max_length), noise.max_length)
    else:
        share = length_share(fracs, 1.0)
    per_step = step_gpu_hours(noise.budget / noise.steps, share, noise.reference_length_frac)
    return np.concatenate([[0.0], np.cumsum(per_step)])


def mock_validations(streams: MockStreams, run: Truth, compute: np.ndarray, noise: MockNoise) -> np.ndarray:
    """A mock run's validations at `compute`: the wobble at every point, then mean@k (`mean_at_k`) about
    validation_rate at each, as the mock generator validates."""
    wobbles = wobble(streams.wobble, compute, noise.wobble_sd, noise.wobble_gpu_hours)
    quantiles = validation_quantiles(noise.val_prompts)
    rates = [validation_rate(run, float(c), float(w)) for c, w in zip(compute, wobbles)]
    return np.array([mean_at_k(streams.validation, r, quantiles, noise.val_samples, noise.spread) for r in rates])


def mock_curve(draws: np.random.Generator | MockStreams, truth: Truth, noise: MockNoise = MockNoise(), *,
               steps: int | None = None, run_A: float | None = None) -> Curve:
    """One run of `truth` as generator=mock logs it, to `steps` (default noise.steps) of a budget planned for
    noise.steps: the run's A drawn (run_truth, or `run_A`); the mock's clock (mock_compute); a point every val_every
    steps (mock_validations). `draws`: one generator for everything (MockStreams.shared), or a run's MockStreams
    (MockStreams.of the mock generator's seed: the generator's own run). The returned truth is the run's."""
    streams = draws if isinstance(draws, MockStreams) else MockStreams.shared(draws)
    steps = noise.steps if steps is None else steps
    run = run_truth(streams.run, truth, noise.run_sd_A, run_A)
    step = np.arange(0, steps + 1, noise.val_every)
    compute = mock_compute(streams.lengths, noise, steps)[step]
    return Curve(truth=run, compute=compute, reward=mock_validations(streams, run, compute, noise), step=step)
