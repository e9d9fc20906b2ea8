"""generator=mock: a simulator for mock runs, not a model.

Each run follows a known ground truth, the sigmoid law of the paper (Eq. 1) in compute C (GPU-hours):
    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)
with A, B, C_mid = conf's truth plus the effect of every axis choice the run makes ("loss=dapo": {A: -0.06, ...}).
Validation is mean@k over a fixed set of n prompts (the paper's 1,000 x mean@16), the same set for every run as in
the paper: the prompts' pass rates are the n quantiles of a Beta with mean R(C) (prompts differ in difficulty, and
their mean is R(C)), each of a prompt's k samples passes with its rate (binomial noise). On top: a run's A is off
its variant's by a run-to-run draw (sd run_sd_A), and a slow AR(1) wobble in compute moves the whole curve.
Training rollouts: each prompt has a fixed difficulty (a logit offset), its G samples pass with
sigmoid(logit R(C) + offset); completion lengths are drawn, then the length control's thinking budget (interruption)
and the generation limits cut them; token ids, generator log-probs and per-token policy versions (from the off-policy
mode's k) are random but shaped as a real generator's, so everything downstream of generation runs for real.

The noise and the clock are analysis/synthetic.py's, the functions mock_curve draws a run without the trainer by
(run_truth, wobble_next, validation_rate, mean_at_k, completion_length_fracs, step_gpu_hours), each from a stream of
the run's MockStreams: with one seed, the two draw one run (tests/test_mock_noise.py).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict

import numpy as np
import torch
from omegaconf import DictConfig

from ablate.compute import Clock, StepFlops
from ablate.config import choice_of, signature
from ablate.generators.base import Capabilities, Generator, Interrupted
from ablate.policy import build_tokenizer
from ablate.registry import build
from ablate.rollouts import Rollouts
from analysis.synthetic import (  # the law (Eq. 1), the noise and the clock: one implementation for both
    MockNoise, MockStreams, Truth, WobblePoint, completion_length_fracs, length_share, mean_at_k, run_truth,
    step_gpu_hours, thinking_and_answer, validation_quantiles, validation_rate, whole_tokens, wobble_next)

INJECTED_TOKEN = 1  # the mock's stand-in for the ids of an injected phrase
FIRST_SAMPLED_TOKEN = 4


def variant_truth(cfg: DictConfig) -> Truth:
    """The truth of the run `cfg` describes: the base truth plus every effect whose `path=choice` the run makes."""
    mock = cfg.generator
    A, B, C_mid = mock.truth.A, mock.truth.B, mock.truth.C_mid
    for key, effect in mock.effects.items():
        path, sep, choice = key.partition("=")
        if not sep:
            raise ValueError(f"generator.effects: key '{key}' must read path=choice, e.g. loss=dapo")
        if choice_of(cfg, path) == choice:
            A, B, C_mid = A + effect.A, B + effect.B, C_mid * effect.C_mid
    if not (mock.truth.R0 < A <= 1 and B > 0 and C_mid > 0):
        raise ValueError(f"generator: the effects give an impossible truth A={A}, B={B}, C_mid={C_mid}")
    return Truth(A=A, B=B, C_mid=C_mid, R0=mock.truth.R0)


def mock_noise(cfg: DictConfig) -> MockNoise:
    """The run's generator=mock settings and schedule as analysis/synthetic.py's MockNoise, name for name
    (prompt_spread is its spread, gpu_hours its budget; a step's rows are prompts_per_step x samples_per_prompt, its
    max_length the generation limit, max_think_tokens + max_answer_tokens)."""
    mock, gen, batch = cfg.generator, cfg.generation, cfg.batch
    return MockNoise(val_prompts=int(mock.val_prompts), val_samples=int(mock.val_samples),
                     spread=float(mock.prompt_spread), wobble_sd=float(mock.wobble_sd),
                     wobble_gpu_hours=float(mock.wobble_gpu_hours), run_sd_A=float(mock.run_sd_A),
                     reference_length_frac=float(mock.reference_length_frac), steps=int(cfg.train.steps),
                     val_every=int(cfg.train.val_every), budget=float(mock.gpu_hours),
                     rows=int(batch.prompts_per_step) * int(batch.samples_per_prompt),
                     max_length=int(gen.max_think_tokens) + int(gen.max_answer_tokens))


def run_seed(cfg: DictConfig) -> int:
    """The seed of the run `cfg` describes: cfg.seed and its signature (each variant and seed its own draws)."""
    return int(hashlib.sha256(f"{cfg.seed}:{signature(cfg)}".encode()).hexdigest()[:8], 16)


class SimulatedClock(Clock):
    """The simulated device-hours of a step: a share `hours_per_step` of the run's budget, scaled by the completion
    lengths drawn (relative to `reference_length_frac` of the longest completion, `max_length` tokens). A step
    dropped after `wall_seconds` of the `step_seconds` its rollouts are played in: that share of a step at the
    reference length (no lengths were drawn)."""

    devices = 0  # its validation is drawn, not run: no device-hours

    def __init__(self, hours_per_step: float, max_length: int, reference_length_frac: float,
                 step_seconds: float = 0.0):
        self.hours_per_step, self.max_length = hours_per_step, max_length
        self.reference_length_frac, self.step_seconds = reference_length_frac, step_seconds

    def gpu_hours(self, step: int, rollouts: Rollouts, wall_seconds: float, flops: StepFlops | None = None) -> float:
        """analysis/synthetic.py's step_gpu_hours on the lengths drawn (mock_curve's clock)."""
        share = float(length_share(rollouts.lengths.cpu().numpy(), self.max_length))
        return float(step_gpu_hours(self.hours_per_step, share, self.reference_length_frac))

    def dropped(self, wall_seconds: float) -> float:
        if self.step_seconds <= 0:  # rollouts come at once: no wait to drop
            return 0.0
        return self.hours_per_step * min(wall_seconds / self.step_seconds, 1.0)


class MockGenerator(Generator):
    """Rollouts and validation from the variant's known truth (the module's docstring); no weights, no engine."""

    capabilities = Capabilities(samples_policy=False)  # not the policy's rollouts: no warm start, no log-prob gap

    def __init__(self, *, cfg: DictConfig, sampler=None, **_: object):
        """Its settings are cfg.generator's (conf/generator/mock.yaml), read by mock_noise; its draws come from the
        run's MockStreams (run_seed)."""
        self.sampler = sampler  # the trainer's prompt sampler: batch() draws from it
        self.truth = variant_truth(cfg)
        path, _, choice = str(cfg.generator.crash_when).partition("=")
        self.crash_at = cfg.generator.crash_at_step if not path or choice_of(cfg, path) == choice else 0
        self.noise = mock_noise(cfg)
        self.streams = MockStreams.of(run_seed(cfg))
        self.rng = self.streams.rollouts  # pass or fail, thinking budgets, tokens, log-probs, versions
        self.run_truth = run_truth(self.streams.run, self.truth, self.noise.run_sd_A)
        self.val_quantiles = validation_quantiles(self.noise.val_prompts)
        self.length_control = build(cfg.length_control)
        self.off_policy = build(cfg.off_policy)
        self.gen = cfg.generation
        self.samples_per_prompt = int(cfg.batch.samples_per_prompt)
        self.samples_per_batch = int(cfg.batch.prompts_per_step)
        self.clock = SimulatedClock(self.noise.budget / self.noise.steps, self.noise.max_length,
                                    self.noise.reference_length_frac, float(cfg.generator.step_seconds))
        self.vocab = int(cfg.model.vocab_size) or len(build_tokenizer(cfg.model))
        self.phrase_tokens = len(self.length_control.phrase.split()) if self.length_control.phrase else 0
        self._wobble = WobblePoint()

    @property
    def step_seconds(self) -> float:
        """generator.step_seconds: the wall-clock seconds a batch's rollouts are played in; its clock's, which counts
        a dropped step's share of them."""
        return self.clock.step_seconds

    @step_seconds.setter
    def step_seconds(self, seconds: float) -> None:
        self.clock.step_seconds = float(seconds)

    def describe(self) -> dict:
        """Params logged with the run: the variant's truth and this run's A, so a report can be checked against them."""
        return {**{f"mock.truth.{k}": v for k, v in vars(self.truth).items()}, "mock.run.A": self.run_truth.A}

    def state_dict(self) -> dict:
        return {"streams": self.streams.state_dict(), "wobble": asdict(self._wobble)}

    def load_state_dict(self, state: dict) -> None:
        self.streams.load_state_dict(state["streams"])
        self._wobble = WobblePoint(**state["wobble"])

    # ------------------------------------------------------------------------------- the trainer's generator calls
    def batch(self, step: int, compute: float, stop: Callable[[], bool] | None = None) -> Rollouts:
        """Batch `step` (trained by policy version step - 1) of the sampler's next prompts, after
        generator.step_seconds of wall-clock time (decoding's, played: `stop` is asked every 0.1 s of it)."""
        if step == self.crash_at:
            raise RuntimeError(f"the simulated job crashes at step {step} (generator.crash_at_step)")
        until = time.monotonic() + self.step_seconds
        while (left := until - time.monotonic()) > 0:
            if stop is not None and stop():
                raise Interrupted(f"batch {step}, {left:.1f} s before it was ready")
            time.sleep(min(left, 0.1))
        return self.rollouts(self.sampler.next(self.samples_per_batch), step - 1, compute)

    # ------------------------------------------------------------------------------------------------ validation
    def validate(self, compute: float, **_: object) -> float:
        """mean@k pass rate over the simulated validation prompts at `compute` GPU-hours."""
        rate = validation_rate(self.run_truth, compute, self._advance_wobble(compute))
        return mean_at_k(self.streams.validation, rate, self.val_quantiles, self.noise.val_samples, self.noise.spread)

    def _advance_wobble(self, compute: float) -> float:
        """The wobble at `compute` (analysis/synthetic.py's wobble_next on its own stream; 0 at compute 0)."""
        if self.noise.wobble_sd <= 0 or compute <= 0:
            return 0.0
        self._wobble = wobble_next(self.streams.wobble, self._wobble, float(compute), self.noise.wobble_sd,
                                   self.noise.wobble_gpu_hours)
        return self._wobble.value

    # ------------------------------------------------------------------------------------------------- rollouts
    def rollouts(self, prompt_ids: list[int], step: int, compute: float) -> Rollouts:
        """G completions for each prompt, as the policy of `step` (trained on `compute` GPU-hours) would give."""
        G, P = self.samples_per_prompt, len(prompt_ids)
        N = P * G
        rate = min(max(self.run_truth(compute), 1e-4), 1 - 1e-4)
        offsets = np.array([self._difficulty(p) for p in prompt_ids])
        p_pass = 1 / (1 + np.exp(-(math.log(rate / (1 - rate)) + offsets)))
        correct = self.rng.random((P, G)) < p_pass[:, None]

        max_think, max_answer = int(self.gen.max_think_tokens), int(self.gen.max_answer_tokens)
        natural = whole_tokens(completion_length_fracs(self.streams.lengths, N), max_think + max_answer)
        think, answer = thinking_and_answer(natural)
        injected = np.zeros(N, dtype=int)
        truncated = np.zeros(N, dtype=bool)
        for i in range(N):
            budget = self.length_control.think_budget(self.rng, max_think)
            if budget is not None and think[i] > budget:  # interrupted: phrase injected, then the answer
                think[i], injected[i] = budget, self.phrase_tokens
                truncated[i] = answer[i] > max_answer
                answer[i] = min(answer[i], max_answer)
            elif think[i] + answer[i] > max_think + max_answer:  # cut at the generation limit
                truncated[i] = True
                answer[i] = max(max_think + max_answer - think[i], 0)
                think[i] = min(think[i], max_think + max_answer)
        lengths = think + injected + answer
        correct = correct.reshape(N) & ~truncated

        T = int(lengths.max())
        pos = np.arange(T)[None, :]
        inside = pos < lengths[:, None]
        is_injected = (pos >= think[:, None]) & (pos < (think + injected)[:, None])
        tokens = np.where(inside, self.rng.integers(FIRST_SAMPLED_TOKEN, self.vocab, size=(N, T)), 0)
        tokens = np.where(is_injected, INJECTED_TOKEN, tokens)
        mask = inside & ~is_injected
        logprobs = np.where(mask, -self.rng.exponential(0.7, size=(N, T)), 0.0)

        prompt_tokens = np.repeat(np.stack([self._prompt(p) for p in prompt_ids]), G, axis=0)
        host = torch.device("cpu")  # made from numpy, on the host: the learner moves them to its device

        def tensor(array, dtype=None) -> torch.Tensor:
            return torch.as_tensor(array, dtype=dtype, device=host)

        return Rollouts(
            prompt_ids=tensor(np.repeat(prompt_ids, G), torch.int64),
            group=tensor(np.repeat(np.arange(P), G), torch.int64),
            prompt_tokens=tensor(prompt_tokens, torch.int64),
            prompt_mask=tensor(np.ones(prompt_tokens.shape, dtype=bool)),
            tokens=tensor(tokens, torch.int64),
            mask=tensor(mask),
            gen_logprobs=tensor(logprobs, torch.float32),
            versions=tensor(self._versions(step, lengths, T), torch.int64),
            lengths=tensor(lengths, torch.int64),
            rewards=tensor(correct, torch.float32),
            correct=tensor(correct),
            truncated=tensor(truncated),
        )

    def _prompt(self, prompt_id: int) -> np.ndarray:
        """A prompt's fixed token ids (half the prompt budget)."""
        length = max(int(self.gen.max_prompt_tokens) // 2, 1)
        return np.random.default_rng([prompt_id, 1]).integers(FIRST_SAMPLED_TOKEN, self.vocab, size=length)

    def _difficulty(self, prompt_id: int) -> float:
        """A prompt's fixed logit offset: the same prompt is as hard in every epoch."""
        return float(np.random.default_rng(prompt_id).normal(0.0, 1.5))

    def _versions(self, step: int, lengths: np.ndarray, T: int) -> np.ndarray:
        """Per-token policy versions the off-policy mode allows (oldest = off_policy.oldest_version(step)).

        In flight (PipelineRL): each sequence starts at a version between the oldest and `step` and later tokens
        come from newer versions, its last token from `step`. Otherwise (PPO-off-policy) the whole batch comes
        from the oldest version.
        """
        oldest = self.off_policy.oldest_version(step)
        N = len(lengths)
        if not self.off_policy.in_flight:
            return np.full((N, T), oldest)
        start = self.rng.integers(oldest, step + 1, size=N)
        frac = np.minimum(np.arange(T)[None, :] / np.maximum(lengths[:, None] - 1, 1), 1.0)
        return np.floor(start[:, None] + (step - start)[:, None] * frac + 1e-9).astype(int)
