"""The generation pipeline: prompts in, finished batches out, weights from the trainer in between.

One engine (ours in torch, or vLLM) decodes; this driver decides when it may start the prompts of a batch and
when it may take new weights, both by the off-policy option's rules (ablate/offpolicy.py), and hands the trainer
batch s once its B prompts x G samples have all ended. Every prompt the sampler gives is started once, for one
batch, and trained once: batches are assembled from the rows they were started for, never from a shared pool.

Two ways to run the same rules:
- concurrent (generation.concurrent=true): the engine decodes in its own thread while the trainer trains; weights
  published after a step reach it at the first decode step after they arrive (wall-clock timing decides which).
- deterministic (false): one thread; the trainer's `batch(s)` decodes until batch s is complete, and weights
  published after step s are taken before the next decode step. The update points are fixed decode-step counts, so
  the same seed and config give the same tokens, rewards and validation curve.

Between two looks the engine runs free (`Engine.advance`): until a wave ends (the only event that lets the rules
start a wave or take weights), one step when a wave is due, at most RUN_AHEAD_STEPS steps, and in the concurrent
mode RUN_AHEAD_S seconds (weights published meanwhile wait that long at most). An engine process so answers once
per run of steps, not once per step; in one process the tokens are the same as step by step.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from collections.abc import Callable, Iterator

import numpy as np
import torch

from ablate.generators.base import Engine, Interrupted
from ablate.generators.engine import Sequence
from ablate.distributed.layouts import Weights, weights_of
from ablate.rollouts import Rollouts
from ablate.tasks.base import PromptsExhausted

RUN_AHEAD_STEPS = 256  # decode steps an engine takes between two looks of the pipeline, at most
RUN_AHEAD_S = 0.05  # concurrent mode: and seconds (a decode step of an 8B model on a GPU: ~20-50 ms); an engine
# may ask for more (RemoteEngine.run_ahead_s: a look at engine processes is a round trip to each)


class Pipeline:
    def __init__(self, engine: Engine, task, sampler, off_policy, length_control, *, prompts_per_step: int,
                 samples_per_prompt: int, max_waves: int, max_think_tokens: int, concurrent: bool, seed: int,
                 reward: tuple[float, float] = (1.0, 0.0)):
        self.engine, self.task, self.sampler = engine, task, sampler
        self.reward = reward  # (right, wrong): the task's reward of a checked answer
        self.off_policy, self.length_control = off_policy, length_control
        self.B, self.G, self.max_waves = prompts_per_step, samples_per_prompt, max_waves
        self.max_think_tokens = max_think_tokens
        self.tok = task.tokenizer
        self.rng = np.random.default_rng([seed, 7])  # thinking budgets
        self.lock = threading.Condition()
        self.next_batch = 1  # the next batch whose prompts the engine would start
        self.started: dict[int, list[int]] = {}  # batch -> its prompts (started, not yet trained)
        self.ended: dict[int, list[Sequence]] = {}  # batch -> its rows that have ended
        self.replay: list[tuple[int, list[int]]] = []  # started before a restart: start them again first
        self.pending: tuple[dict | None, int] | None = None  # published weights not yet loaded (None: staged)
        self.error: BaseException | None = None
        self.exhausted: PromptsExhausted | None = None  # the sampler had no prompts left for batch next_batch
        self.stopping = False
        self.holds = 0  # `paused()` callers: the generator thread waits between two looks while any holds it
        self.advancing = False  # the generator thread is in engine.advance (outside the lock)
        self.generator_idle_s = self.trainer_wait_s = 0.0
        self.clock_start = time.perf_counter()
        self.window = {"start": self.clock_start, "tokens": 0, "load_s": 0.0, "looks": 0,  # since the last `perf()`
                       "steps": engine.decode_steps}
        self.thread: threading.Thread | None = None
        if concurrent:
            self.thread = threading.Thread(target=self._run, name="generator", daemon=True)

    # ------------------------------------------------------------------------------------------- trainer side
    def batch(self, step: int, compute: float = 0.0, stop: Callable[[], bool] | None = None) -> Rollouts:
        """Batch `step`: blocks until its rows have all ended, then hands them over (once); raises Interrupted when
        `stop()` turns true meanwhile (asked after each look in the deterministic mode, every second in the
        concurrent one)."""
        if self.thread is not None and self.thread.ident is None:
            self.thread.start()
        waited = time.perf_counter()
        with self.lock:
            while not self._complete(step):
                if isinstance(self.error, FloatingPointError):  # diverged weights: the trainer says so
                    raise FloatingPointError(str(self.error)) from self.error
                if self.exhausted is not None and step not in self.started:  # no prompts left for this batch
                    raise PromptsExhausted(str(self.exhausted))
                if self.error is not None:
                    raise RuntimeError(f"the generator failed: {type(self.error).__name__}: {self.error}") \
                        from self.error
                if stop is not None and stop():
                    raise Interrupted(f"batch {step}, before its rows had all ended")
                if self.thread is None:
                    self._advance()
                else:
                    self.lock.wait(timeout=1.0)
            rows = self.ended.pop(step)
            prompts = self.started.pop(step)
        self.trainer_wait_s += time.perf_counter() - waited
        return self._rollouts(prompts, rows)

    def publish(self, policy: torch.nn.Module | Weights, version: int) -> None:
        """The weights after optimizer step `version`; the engine takes them between two decode steps. Engines in
        processes of their own get them now, streamed into a staging copy there (`stages`), and take that copy at
        the same point; an engine here gets the policy's tensors (a copy, when the generator runs meanwhile)."""
        weights = weights_of(policy)
        if self.engine.stages:
            with self.lock:  # the staging copy is about to change: a version the engine has not taken is skipped
                self.pending = None
            self.engine.stage(weights, version)
            state = None  # the engine's `load` takes what was staged
        else:
            state = weights.module().state_dict()
            if self.thread is not None:  # the trainer goes on changing its tensors meanwhile: a copy, in the
                dtype = self.engine.weights_dtype  # engine's dtype (half the fp32 masters' memory in bf16)
                state = {name: tensor.detach().to(dtype if tensor.is_floating_point() else tensor.dtype, copy=True)
                         for name, tensor in state.items()}
        with self.lock:
            self.pending = (state, version)
            self.lock.notify_all()

    def reset_weights(self, policy: torch.nn.Module | Weights, version: int) -> None:
        """Load these weights now, whatever the rules (a resumed run starts from its checkpoint's policy). Before the
        first batch only: the generator thread is not running yet."""
        assert self.thread is None or self.thread.ident is None, "reset_weights after the generator started"
        weights = weights_of(policy)
        with self.lock:
            if self.engine.stages:  # staged, then taken
                self.engine.stage(weights, version)
                self.engine.load(None, version)
            else:
                self.engine.load(weights.stream(), version)
            if not self.replay:  # nothing was started ahead: go on from the next step
                self.next_batch = version + 1

    def perf(self) -> dict:
        """Since the run started: the generator's idle and the trainer's waiting fractions. Since the last call
        (a step): the engines' tokens per second per engine (one device each), their seconds loading weights, and
        the decode steps they ran per look of the pipeline (per request, for engines in processes of their own)."""
        now = time.perf_counter()
        wall = max(now - self.clock_start, 1e-9)
        with self.lock:
            window, self.window = self.window, {"start": now, "tokens": 0, "load_s": 0.0, "looks": 0,
                                                "steps": self.engine.decode_steps}
        return {"perf/decode_steps_per_look": (self.engine.decode_steps - window["steps"]) / max(window["looks"], 1),
                "perf/generator_idle_frac": self.generator_idle_s / wall,
                "perf/trainer_wait_frac": self.trainer_wait_s / wall,
                "perf/generator_tokens_per_s_per_gpu": window["tokens"] / max(now - window["start"], 1e-9)
                / self.engine.devices,
                "perf/engine_load_s": window["load_s"]}

    def close(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        if self.thread is not None and self.thread.is_alive():
            self.thread.join(timeout=60)
        self.engine.close()

    def state_dict(self) -> dict:
        """Prompts started and not trained yet (they are started again after a restart), and the random streams."""
        with self.lock:
            return {"started": sorted(self.started.items()), "rng": self.rng.bit_generator.state,
                    "engine_rng": self.engine.rng.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.replay = [(batch, list(prompts)) for batch, prompts in state["started"]]
        if self.replay:
            self.next_batch = self.replay[0][0]
        self.rng.bit_generator.state = state["rng"]
        self.engine.rng.set_state(state["engine_rng"])

    # ---------------------------------------------------------------------------------------- generator side
    def _run(self) -> None:
        try:
            while True:
                with self.lock:
                    while self.holds and not self.stopping:
                        self.lock.wait(timeout=1.0)
                    if self.stopping:
                        return
                    self._load_and_start()
                    if not self.engine.running:  # held back by the off-policy rule: wait for new weights
                        idle = time.perf_counter()
                        self.lock.wait(timeout=1.0)
                        self.generator_idle_s += time.perf_counter() - idle
                        continue
                    reach = self._reach()
                    self.window["looks"] += 1
                    self.advancing = True
                try:
                    ended = self.engine.advance(*reach)
                finally:
                    with self.lock:
                        self.advancing = False
                        self.lock.notify_all()
                with self.lock:
                    self._collect(ended)
                    if ended:
                        self.lock.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the trainer at its next batch()
            with self.lock:
                self.error = err
                self.lock.notify_all()

    def _advance(self) -> None:
        """Deterministic mode: one decode step (after taking weights and starting prompts, as the rules allow)."""
        self._load_and_start()
        if not self.engine.running:
            raise RuntimeError(f"the generator cannot start batch {self.next_batch} with weights of version "
                               f"{self.engine.version}: the off-policy rule holds it back, and nothing is running")
        self.window["looks"] += 1
        self._collect(self.engine.advance(*self._reach()))

    def _reach(self) -> tuple[int, float]:
        """How far the engine may decode before the next look: (steps, seconds; 0: no time limit)."""
        if self._may_start():  # another wave starts after the next step: waves stay one step apart at least
            return 1, 0.0
        return RUN_AHEAD_STEPS, getattr(self.engine, "run_ahead_s", RUN_AHEAD_S) if self.thread is not None else 0.0

    def _may_start(self) -> bool:
        return len(self.engine.waves) < self.max_waves and self.exhausted is None and \
            self.off_policy.may_start(self.next_batch, self.engine.version)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The engine is the caller's while inside: the generator thread is held between two looks (its running rows
        stay where they are, as vLLM's pause_generation(mode="keep") keeps them), and goes on after."""
        with self.lock:
            self.holds += 1
            while self.advancing:
                self.lock.wait(timeout=1.0)
        try:
            yield
        finally:
            with self.lock:
                self.holds -= 1
                self.lock.notify_all()

    def settle(self) -> int:
        """Load the weights published last now, if the off-policy rule lets the engine take them now (as it would
        at its next look); returns the version the engine then holds. Validation on the engine itself needs the
        newest."""
        with self.lock:
            self._load_pending()
            return self.engine.version

    def _load_pending(self) -> None:
        if self.pending is not None:
            state, version = self.pending
            if (self.off_policy.in_flight or not self.engine.running) and \
                    self.off_policy.may_load(version, self.next_batch):
                began = time.perf_counter()
                self.engine.load(state, version)
                self.window["load_s"] += time.perf_counter() - began
                self.pending = None

    def _load_and_start(self) -> None:
        self._load_pending()
        # At most one new wave per decode step, as continuous batching admits requests: waves stay staggered, so
        # new weights land in the middle of the others' rows.
        if self._may_start() and self._start(self.next_batch):
            self.next_batch += 1

    def _start(self, batch: int) -> bool:
        """Start batch `batch`'s prompts; False when there are none left (the batches started go on to the end)."""
        if self.replay and self.replay[0][0] == batch:
            prompts = self.replay.pop(0)[1]
        else:
            try:
                prompts = self.sampler.next(self.B)
            except PromptsExhausted as why:
                self.exhausted = why
                return False
        self.started[batch] = prompts
        self.ended[batch] = []
        self.engine.start([row for index in prompts for row in self.rows("train", index, batch, self.G, self.rng)])
        return True

    def rows(self, split: str, index: int, batch: int, count: int, rng: np.random.Generator) -> list[Sequence]:
        """`count` rows sampling problem `index` of `split`, each with its thinking budget (length control)."""
        ids = self.task.encode_prompt(self.task.problem(split, index).prompt)
        return [Sequence(prompt_index=index, batch=batch, prompt_ids=ids,
                         think_budget=self.length_control.think_budget(rng, self.max_think_tokens))
                for _ in range(count)]

    def _collect(self, ended: list[Sequence]) -> None:
        for row in ended:
            self.ended[row.batch].append(row)
            self.window["tokens"] += len(row.tokens)

    def _complete(self, step: int) -> bool:
        return step in self.ended and len(self.ended[step]) == self.B * self.G

    # ------------------------------------------------------------------------------------------------ rollouts
    def _rollouts(self, prompts: list[int], rows: list[Sequence]) -> Rollouts:
        order = {index: position for position, index in enumerate(prompts)}
        rows = sorted(rows, key=lambda r: order[r.prompt_index])  # stable: a prompt's G samples stay in order
        correct = torch.tensor([self.passed("train", r) for r in rows], device=torch.device("cpu"))
        return assemble(rows, correct, group=[order[r.prompt_index] for r in rows], pad_id=self.tok.pad_token_id,
                        reward=self.reward)

    def passed(self, split: str, row: Sequence) -> bool:
        """The row's final answer is right (a truncated row never passes)."""
        ids = row.tokens[:-1] if row.tokens and row.tokens[-1] in self.engine.limits.stop_ids else row.tokens
        text = self.tok.decode(ids, skip_special_tokens=False)
        return not row.truncated and self.task.correct(text, self.task.problem(split, row.prompt_index))


def assemble(rows: list[Sequence], correct: torch.Tensor, group: list[int], pad_id: int,
             reward: tuple[float, float] = (1.0, 0.0)) -> Rollouts:
    """Rows -> padded tensors on the host (the learner moves them to its device): prompts left-padded,
    completions right-padded; a right answer's reward reward[0], a wrong one's reward[1]."""
    N, host = len(rows), torch.device("cpu")
    Tp = max(len(r.prompt_ids) for r in rows)
    T = max(max(len(r.tokens) for r in rows), 1)
    prompt_tokens = torch.full((N, Tp), pad_id, dtype=torch.long, device=host)
    prompt_mask = torch.zeros((N, Tp), dtype=torch.bool, device=host)
    tokens = torch.full((N, T), pad_id, dtype=torch.long, device=host)
    mask = torch.zeros((N, T), dtype=torch.bool, device=host)
    logprobs = torch.zeros((N, T), device=host)
    versions = torch.zeros((N, T), dtype=torch.long, device=host)
    for i, r in enumerate(rows):
        n = len(r.tokens)
        prompt_tokens[i, Tp - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, device=host)
        prompt_mask[i, Tp - len(r.prompt_ids):] = True
        if n:
            tokens[i, :n] = torch.tensor(r.tokens, device=host)
            mask[i, :n] = torch.tensor(r.sampled, device=host)
            logprobs[i, :n] = torch.tensor(r.logprobs, device=host)
            versions[i, :n] = torch.tensor(r.versions, device=host)
            versions[i, n:] = r.versions[-1]
    return Rollouts(
        prompt_ids=torch.tensor([r.prompt_index for r in rows], device=host),
        group=torch.tensor(group, device=host), prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, tokens=tokens,
        mask=mask, gen_logprobs=logprobs, versions=versions,
        lengths=torch.tensor([len(r.tokens) for r in rows], device=host),
        rewards=torch.where(correct.to(host), reward[0], reward[1]).float(),
        correct=correct.to(host), truncated=torch.tensor([r.truncated for r in rows], device=host))
