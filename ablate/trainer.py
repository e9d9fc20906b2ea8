"""The shared trainer: setup, train, cleanup. It calls what the config names and never branches on an option's name.

Step numbering: step 0 is the pre-RL validation at compute 0 (the law's R0); optimizer step s = 1..train.steps
trains on rollouts from policy versions s-1-k .. s-1 (version = optimizer steps applied so far) and its metrics are
logged at step s.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
from contextlib import contextmanager
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ablate.alarms import Alarms
from ablate.compute import StepFlops
from ablate.config import flatten
from ablate.generators.base import Interrupted, capabilities
from ablate.distributed.groups import Groups
from ablate.distributed.layouts import SHARDS, OneProcess, Weights
from ablate import plan
from ablate.policy import (PackedScorer, Scorer, build_policy, build_tokenizer, compile_layers, compute_dtype,
                           describe_packing, packs_rows)
from ablate.registry import build
from ablate.rl.aggregation import token_weights
from ablate.rollouts import Rollouts
from ablate.rungs import Rungs
from ablate.tasks.base import PromptsExhausted
from ablate.warm_start import cached_warm_start
from ablate.tracking import RunLogger

log = logging.getLogger(__name__)

Progress = Callable[[int, int, dict], None]  # (step, total steps, metrics of the step)


def checkpoint_layers(policy: torch.nn.Module, cfg: DictConfig) -> int:
    """Recompute the first of the policy's decoder layers in the backward, as many as train.activation_checkpointing
    says (true: all, false: none, a count; auto: the fewest the memory model needs on this job's GPU, as the check
    before submit said, ablate.checks.auto_checkpointed), keeping the others' activations: transformers' flag on
    each decoder layer (GradientCheckpointingLayer). The first, as the backward reaches them last, once the kept
    layers' activations are freed (docs/design.md#the-memory-model). Returns how many."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from ablate import checks, memory

    layers = [module for module in policy.modules() if isinstance(module, GradientCheckpointingLayer)]
    setting = cfg.train.activation_checkpointing
    if setting == "auto":
        on_slurm = "SLURM_JOB_ID" in os.environ  # launcher.gpu_memory_gb, else what the pre-flight took the GPU for
        count = checks.auto_checkpointed(cfg, checks.gpu_memory_gb(cfg, "slurm" if on_slurm else "local"))
    else:
        count = memory.checkpointed_layers(setting, len(layers))
    if count:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for i, layer in enumerate(layers):
            layer.gradient_checkpointing = i < count
    return count


class Learner:
    """One optimizer step: advantages -> per-token loss -> aggregation -> backward by micro-batch -> AdamW.

    Each piece is the function its config option names (normalization, loss, aggregation, precision). The
    aggregation's token weights are taken once on the whole batch, so micro-batches with gradient accumulation give
    the whole batch's gradient exactly, however the rows are grouped: the step's plan (ablate/plan.py: `padded`)
    deals the rows to the ranks and groups them by length into micro-batches, each cut to its own longest row, every
    rank running the same number of them with about the same work (`perf/learner_token_efficiency`: real tokens over
    the tokens computed, padding included; `perf/learner_imbalance`: the busiest rank's work over the mean rank's,
    minus 1). Every rank computes the same plan from every row's length.
    The weights and AdamW's state are fp32; the decoder computes in `model.dtype` (ablate/policy.py).
    `ranks` spreads the rows and the weights over trainer processes (ablate/distributed/layouts.py: OneProcess, the default,
    or FSDP); the weights, advantages and loss are the whole batch's on any number of them.
    `train/logprob_gap`: the mean |log pi_train - log pi_gen| over the trained tokens of the rows the generator sampled
    wholly with the weights this step scores (their version; absent when there are none): what the generator's
    numerics, and the weights it was sent, differ from the trainer's (the paper's FP32 LM head narrows it; a sync that
    went wrong shows as a jump). Rows that an in-flight update reached are left out: their earlier tokens' KV cache
    is of older weights, which moves their later log-probs too.
    """

    def __init__(self, cfg: DictConfig, policy: torch.nn.Module | None = None, ranks=None):
        self.policy = policy if policy is not None else build_policy(cfg.model, cfg.seed)
        self.policy.train()
        self.ranks = ranks if ranks is not None else OneProcess()
        self.normalize, self.loss = build(cfg.normalization), build(cfg.loss)
        self.aggregate = build(cfg.aggregation)
        self.micro_batch, self.micro_tokens = cfg.train.micro_batch_size, cfg.train.micro_batch_tokens
        shape = self.policy.config  # attention's work per squared token, in decoder tokens (ablate/plan.py)
        self.attention = shape.hidden_size * shape.num_hidden_layers / sum(p.numel() for p in self.policy.parameters())
        self.checkpointed = checkpoint_layers(self.policy, cfg)  # recompute decoder layers: memory for time
        # a pass's rows packed into one sequence, attention within each row, or side by side, each padded to the
        # pass's longest (run.packed_rows; unset: packed where varlen attention runs): docs/training.md#packed-rows
        setting, device = cfg.run.get("packed_rows"), next(self.policy.parameters()).device
        self.packed = packs_rows(setting, device, compute_dtype(cfg.model))
        if self.ranks.rank == 0:  # the form, and why, said once in the run's log
            print(f"learner: {describe_packing(setting, device, compute_dtype(cfg.model))}", file=sys.stderr,
                  flush=True)
        compile_layers(self.policy, cfg.run.get("compile_layers"))  # in place, before FSDP2 wraps the layers
        scorer = (PackedScorer if self.packed else Scorer)(self.policy, build(cfg.precision),
                                                            float(cfg.generation.temperature), compute_dtype(cfg.model))
        self.scorer = self.ranks.wrap(scorer)
        self.optimizer = torch.optim.AdamW(self.scorer.parameters(), lr=cfg.optim.lr, eps=cfg.optim.eps,
                                           betas=tuple(cfg.optim.betas), weight_decay=cfg.optim.weight_decay,
                                           fused=True)
        warmup = max(cfg.optim.warmup_steps, 1)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / warmup))

    def step_plan(self, lengths: torch.Tensor, trained: torch.Tensor) -> plan.Plan:
        """The step's plan (ablate/plan.py). Packed, a pass holds up to train.micro_batch_tokens real tokens (0: as
        many as the padded form's largest pass, micro_batch_size rows of the step's longest, so that the memory
        estimate of ablate/memory.py bounds both forms); padded, up to micro_batch_size rows and micro_batch_tokens
        padded tokens."""
        if self.packed:
            budget = self.micro_tokens or self.micro_batch * int(lengths.max())
            return plan.packed(lengths, trained, self.ranks.world, budget, self.attention)
        return plan.padded(lengths, trained, self.ranks.world, self.micro_tokens, self.micro_batch, self.attention)

    def weights(self) -> Weights:
        """The current weights as the generator and validation take them: streamed from the shards, or whole
        (ablate/distributed/layouts.py: Weights); taken after this step, before the next."""
        return Weights(self.ranks, self.policy)

    def step(self, ro: Rollouts, rewards: torch.Tensor, keep: torch.Tensor) -> dict:
        prompt_lengths = ro.prompt_mask.sum(dim=1)
        trained = (ro.mask & keep.to(ro.mask.device)[:, None]).any(dim=1)
        planned = self.step_plan(prompt_lengths + ro.lengths, trained)  # the same on every rank: no collective
        # FSDP's rank 0: the other ranks take the same step, each sent the rows it trains
        self.ranks.lead_step(ro, rewards, keep, [planned.rows(rank) for rank in range(self.ranks.world)])
        # every row's prompt and completion tokens on the host, read once before the passes (none reads the device
        # for its sizes but the scorer's own, before its forward: docs/training.md#packed-rows)
        prompt_host, length_host = torch.stack([prompt_lengths, ro.lengths]).tolist()
        device = next(self.policy.parameters()).device
        ro = ro.to(device)
        rewards, keep = rewards.to(device), keep.to(device)
        mask = ro.mask & keep[:, None]  # filtered prompts leave the loss
        adv = torch.zeros(ro.n, device=device)
        if keep.any():
            adv[keep] = self.normalize(rewards[keep], ro.group[keep])
        weights = token_weights(self.aggregate, mask, ro.group)  # of the whole batch, on every rank
        total = torch.zeros((), dtype=torch.float64, device=device)  # the loss, summed on the device
        version = self.scheduler.last_epoch  # the weights' version: optimizer steps taken (0: the initial weights)
        own = ((ro.versions == version) | ~mask).all(dim=1) & mask.any(dim=1)  # rows sampled wholly with them
        gap = torch.zeros(2, device=device)  # sum |log pi_train - log pi_gen| over those rows' tokens, and count
        batches = planned.passes[self.ranks.rank]  # every rank as many; an empty one (too few rows) weighs 0
        for i, batch in enumerate(batches):
            scored = batch or [planned.filler]
            rows, scale = torch.tensor(scored, dtype=torch.long, device=device), float(bool(batch))
            P, T = max(prompt_host[r] for r in scored), max(max(length_host[r] for r in scored), 1)
            prompt = slice(ro.prompt_tokens.shape[1] - P, None)  # prompts are left-padded, completions right-padded
            logp = self.scorer(ro.prompt_tokens[rows, prompt], ro.prompt_mask[rows, prompt], ro.tokens[rows, :T],
                               ro.lengths[rows])
            per_token = self.loss(logp, ro.gen_logprobs[rows, :T], adv[rows], mask[rows, :T])
            if batch:  # summed where fresh (no boolean indexing: its size would be read from the device)
                fresh = mask[rows, :T] & own[rows, None]
                gap += torch.stack([torch.where(fresh, (logp.detach() - ro.gen_logprobs[rows, :T]).abs(), 0).sum(),
                                    fresh.sum()])
            part = (per_token * weights[rows, :T]).sum() * scale
            self.ranks.sync_gradients(self.scorer, now=i == len(batches) - 1)
            part.backward()
            total += part.detach()
        # the step's one read from the device after its passes: the loss, and the log-prob gap's sum and count
        total, gap_sum, gap_count = (self.ranks.total(v) for v in torch.cat([total[None], gap]).tolist())
        if not math.isfinite(total):
            raise FloatingPointError(f"the policy loss is {total}: the run diverged")
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        metrics = {"loss/policy": total, "train/lr": lr,
                   "train/adv_abs_mean": float(adv[keep].abs().mean()) if keep.any() else 0.0,
                   "perf/learner_token_efficiency": planned.token_efficiency,
                   "perf/learner_imbalance": planned.imbalance}
        if gap_count:  # tokens sampled with the very weights scored here: the generator's numerics against ours
            metrics["train/logprob_gap"] = gap_sum / gap_count
        return metrics


class PromptSampler:
    """Epochs over the task's training prompts in a seeded random order, skipping prompts the filter retired.
    Thread-safe: a concurrent generator draws prompts while the trainer records pass rates.

    No-Positive-Resampling retires the prompts a model has solved. The paper's data set (53k prompts) is large
    enough that a run never runs short; a small one would, and what the filter leaves is the prompts nobody solves:
    at the embedded scale (4,096 prompts, ~2 epochs) the pool fell from 4,096 to the 1,050 unlearnable ones by step
    500, the batches went all zero-variance and the pass rate fell with them (0.73 -> 0.45, 32 prompts a step). So
    at each epoch's start, while fewer than the task's n_train_prompts are left, `more()` (the task's `more_train`)
    adds fresh ones: a task that can draw more keeps its pool full, as a large data set would; a finite one cannot,
    and when the filter has retired every prompt of it PromptsExhausted ends the run, cleanly."""

    def __init__(self, n_prompts: int, seed: int, prompt_filter, more: Callable[[], int] = lambda: 0):
        self.n, self.filter, self.more = n_prompts, prompt_filter, more
        self.pool = n_prompts  # the unretired prompts an epoch starts with, while the task has more
        self.rng = np.random.default_rng(seed)
        self.epoch: list[int] = []
        self.lock = threading.Lock()

    def next(self, count: int) -> list[int]:
        batch: list[int] = []
        with self.lock:
            while len(batch) < count:
                if not self.epoch:
                    self._new_epoch()
                batch.append(self.epoch.pop())
        return batch

    def _new_epoch(self) -> None:
        while self.n - len(self.filter.retired()) < self.pool:
            added = self.more()
            if not added:
                break
            self.n += added
        self.epoch = self.filter.sampleable(self.rng.permutation(self.n).tolist())
        if not self.epoch:
            raise PromptsExhausted(f"No-Positive-Resampling retired all {self.n} training prompts and the task has "
                                   "no more")

    def available(self) -> int:
        """Training prompts the filter has not retired."""
        with self.lock:
            return self.n - len(self.filter.retired())

    def observe(self, prompt_ids: torch.Tensor, correct: torch.Tensor) -> None:
        with self.lock:
            self.filter.observe(prompt_ids, correct)

    def state_dict(self) -> dict:
        with self.lock:
            return {"rng": self.rng.bit_generator.state, "epoch": list(self.epoch), "n": self.n,
                    "filter": self.filter.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        while self.n < state.get("n", self.n):  # the fresh prompts the run had drawn: drawn again, the same
            added = self.more()
            if not added:
                raise RuntimeError(f"the checkpoint has {state['n']} training prompts; the task gives {self.n}")
            self.n += added
        self.rng.bit_generator.state = state["rng"]
        self.epoch = list(state["epoch"])
        self.filter.load_state_dict(state["filter"])


@dataclass
class RunState:
    step: int = 0  # optimizer steps done
    gpu_hours: float = 0.0  # device-hours so far, across restarts
    flops: float = 0.0
    val_gpu_hours: float = 0.0  # device-hours spent validating: not in gpu_hours (the law's C), logged apart
    diverged: bool = False
    stopped: str = ""  # why the run ended before its last step, other than diverging (no training prompts left)
    settled: bool = False  # an adaptive sweep stopped it at a rung, its verdict settled: FINISHED, checkpoint kept
    requeued_at: int = -1  # the step it last stopped at for a requeue: stopped there again, nothing trained, it fails


class PreemptionNotice:
    """SIGUSR2 (SLURM's warning before a time limit or a preemption) is held until the trainer can act on it: at once
    while it waits on a step's rollouts (the step is dropped), else when the step in flight ends; then the trainer
    checkpoints and hands the signal to the handler that was installed before (submitit's, which requeues the job
    and exits). Without one, the run ends as KILLED after its checkpoint. A USR2 that comes after the
    last step changes nothing: the run ends as FINISHED and its job is not requeued."""

    def __init__(self):
        self.received, self.previous = False, None
        try:
            self.previous = signal.signal(signal.SIGUSR2, self._hold)
        except ValueError:  # not the main thread: signals cannot be caught here
            return
        # one that came while the run started (rank 0 defers it: ablate/distributed/signals.py) is taken now
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})

    def __enter__(self) -> PreemptionNotice:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _hold(self, signum, frame) -> None:
        self.received = True

    def close(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGUSR2, self.previous)
            self.previous = None

    def hand_over(self) -> None:
        previous = self.previous
        self.close()
        if callable(previous):
            previous(signal.SIGUSR2, None)  # submitit: requeue, then SystemExit
        raise KeyboardInterrupt("SIGUSR2 with no handler to requeue the job")


class Checkpoint:
    """<paths.runs>/<run id>/checkpoint.pt: everything a run needs to continue where it was (written atomically).
    Between steps, or during a step's wait for its rollouts (the learner still at the step before; the prompts the
    generator started are in its state, started again on resume: docs/training.md#time-limits). The sampler's state
    and the generator's are read at one moment, the generator held (`Generator.paused`): a concurrent generator
    that drew a wave between the two reads had it both started again and drawn again after a resume."""

    def __init__(self, folder: Path):
        self.path = folder / "checkpoint.pt"

    def save(self, state: RunState, learner: Learner, sampler: PromptSampler, generator) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with generator.paused():  # the prompts drawn and the prompts started, as of one moment
            drawn = {"sampler": sampler.state_dict(), "generator": generator.state_dict()}
        payload = {
            "state": vars(state).copy(), **learner.ranks.save(learner, self.path.parent, tag=state.step),
            "torch_rng": torch.get_rng_state(), **drawn, "clock": generator.clock.state_dict(),
        }
        tmp = self.path.with_suffix(".tmp")
        torch.save(payload, tmp)
        tmp.replace(self.path)
        learner.ranks.prune(self.path.parent, payload)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        for shards in self.path.parent.glob(SHARDS.format(tag="*")):  # FSDP's learner shards (ablate/distributed/layouts.py)
            shutil.rmtree(shards, ignore_errors=True)

    def load(self, state: RunState, learner: Learner, sampler: PromptSampler, generator) -> bool:
        if not self.path.exists():
            return False
        payload = torch.load(self.path, weights_only=False)
        for key, value in payload["state"].items():
            setattr(state, key, value)
        learner.ranks.load(learner, payload, self.path.parent)
        torch.set_rng_state(payload["torch_rng"])
        sampler.load_state_dict(payload["sampler"])
        generator.load_state_dict(payload["generator"])
        generator.clock.load_state_dict(payload.get("clock", payload["generator"].get("clock", {})))
        return True


def _one_ctrl_c(fn):
    """Ctrl-C ends a run once: the first raises KeyboardInterrupt (the run closes as KILLED, its metrics written),
    and the ones after it are ignored until `fn` has returned. A sweep passes Ctrl-C on to its workers, which the
    terminal has already sent them, and users press it twice: a second KeyboardInterrupt while the first unwound
    left the run RUNNING and its last metrics unwritten (tests/test_launch_local.py's slow Ctrl-C test, 2 times in
    8 with only launch/submit.py's `_ctrl_c_ignored`)."""

    def interrupt_once(signum, frame) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        # only the main thread gets signals; a process started with Ctrl-C ignored (a script's `&`) keeps it so
        if threading.current_thread() is not threading.main_thread() or \
                signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            return fn(*args, **kwargs)
        previous = signal.signal(signal.SIGINT, interrupt_once)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.signal(signal.SIGINT, previous)

    return wrapped


@_one_ctrl_c
def train(cfg: DictConfig, run_id: str, tracking_uri: str, *, progress: Progress | None = None,
          groups: Groups | None = None) -> RunState:
    """Run one variant to the end, logging to the MLflow run `run_id`; resume it from its checkpoint if it has one.
    `groups`: this process's process groups in a job of several (ablate/processes.py hands them in).

    Returns the final state. A non-finite loss ends the run cleanly: tag ablate.diverged=true, status FAILED.
    """
    torch.manual_seed(cfg.seed)
    folder = Path(cfg.paths.runs) / run_id
    tracker = RunLogger(tracking_uri, run_id, flush_every=cfg.tracking.flush_every, spill_path=folder / "spill.jsonl")
    if tracker.status() == "FINISHED":  # e.g. requeued just as it finished: done already
        print(f"run {run_id} is already FINISHED: nothing to do", file=sys.stderr, flush=True)
        return RunState(step=cfg.train.steps)
    # SLURM's warning is held from here, the run's start-up included (in one process nothing else defers it, and
    # submitit requeued at once, no stop counted: _Run._requeue); one after the last step only waits: the run ends
    with _run_ends(tracker), PreemptionNotice() as notice:
        run = _Run(cfg, run_id, tracker, folder, groups if groups is not None else Groups())
        with _closing(run.generator):
            run.train(notice, progress)
        tracker.close("FAILED" if run.state.diverged else "FINISHED")
        if not (run.state.diverged or run.state.settled or run.keeps_checkpoint):  # those may be extended
            run.checkpoint.remove()  # a finished run is not resumed; at 8B its optimizer state alone is ~100 GB
    return run.state


@contextmanager
def _run_ends(tracker: RunLogger):
    """The run's status in the store when it ends on an exception, mapped in this one place: KILLED on Ctrl-C,
    FAILED on an error, and RUNNING on SLURM's warning (SystemExit: the job is requeued and the run goes on in the
    next one); whatever was measured is flushed first."""
    try:
        yield
    except KeyboardInterrupt:
        tracker.close("KILLED")
        raise
    except SystemExit:
        tracker.flush()
        raise
    except BaseException:
        tracker.close("FAILED")
        raise


@contextmanager
def _closing(generator):
    """Close the generator when the run is over; a failure to close it while the run fails is logged, not raised
    (the run's own error says how it ended)."""
    try:
        yield generator
    except BaseException:
        try:
            generator.close()
        except Exception:  # noqa: BLE001 - the run's error wins
            log.exception("closing the generator of a run that had failed")
        raise
    generator.close()


class _Run:
    """One run's parts, built from its config (resumed from its checkpoint when it has one), and its loop."""

    def __init__(self, cfg: DictConfig, run_id: str, tracker: RunLogger, folder: Path, groups: Groups):
        self.cfg, self.run_id, self.tracker = cfg, run_id, tracker
        self.samples_policy = capabilities(cfg.generator).samples_policy  # False: a simulator (the mock)
        tokenizer = build_tokenizer(cfg.model)
        task = build(cfg.task, tokenizer=tokenizer, seed=cfg.seed,
                     max_prompt_tokens=cfg.generation.max_prompt_tokens)
        policy = build_policy(cfg.model, cfg.seed, tokenizer)
        if cfg.task.warm_start_steps > 0 and self.samples_policy:  # the same warm-started weights for every variant
            key = {"model": OmegaConf.to_container(cfg.model), "task": OmegaConf.to_container(cfg.task),
                   "seed": cfg.seed}  # the seed made the initial weights
            cached_warm_start(policy, task, Path(cfg.paths.cache), key, steps=cfg.task.warm_start_steps,
                              lr=cfg.task.warm_start_lr, batch_size=cfg.task.warm_start_batch,
                              compute_dtype=compute_dtype(cfg.model))
        self.prompt_filter, self.length_control = build(cfg.filtering), build(cfg.length_control)
        self.learner = Learner(cfg, policy, ranks=build(cfg.run, groups=groups))
        self.sampler = PromptSampler(task.size("train"), cfg.seed, self.prompt_filter, more=task.more_train)
        self.generator = build(cfg.generator, cfg=cfg, task=task, sampler=self.sampler, policy=self.learner.weights())
        self.checkpoint = Checkpoint(folder)
        self.rungs = Rungs(cfg, run_id, tracker)  # the adaptive sweep's looks (none outside one)
        self.alarms = Alarms(cfg, lambda tag, text: tracker.set_tags({tag: text}), simulated=not self.samples_policy)
        self.keeps_checkpoint = bool(cfg.sweep.get("keep_checkpoints"))  # at its last step, to be extended
        self.state = RunState()
        self.n_params = sum(p.numel() for p in self.learner.policy.parameters())
        self.resumed = False
        self._resume_or_start()
        tracker.mark_running()

    def _resume_or_start(self) -> None:
        """From the checkpoint when there is one (steps the killed process logged after it stay as they are; none is
        logged twice, and the device-hours it spent after it still count); else log the run's params."""
        state, tracker = self.state, self.tracker
        if self.checkpoint.load(state, self.learner, self.sampler, self.generator):
            state.settled, state.stopped = False, ""  # how the run ended before (a settled one is being extended)
            last = tracker.resume()
            state.gpu_hours = max(state.gpu_hours, last.get("compute/gpu_hours", 0.0))
            self.generator.reset_weights(self.learner.weights(), state.step)
            tracker.set_tags({"ablate.resumed_from": str(state.step)})
            self.resumed = True
            print(f"run {self.run_id} resumes from its step-{state.step} checkpoint", file=sys.stderr, flush=True)
        else:
            params = flatten(OmegaConf.to_container(self.cfg, resolve=True, enum_to_str=True))
            tracker.log_params({**params, **self.generator.describe(), "trainer.ranks": self.learner.ranks.world})

    def train(self, notice: PreemptionNotice, progress: Progress | None) -> None:
        """Step 0's validation (a new run), then every optimizer step left, checkpointing on schedule and on SLURM's
        warning; a diverged loss or an exhausted data set ends the loop early, saying so. The warning, while rank 0
        waits on a step's rollouts (no learner step in flight: minutes at the paper's scale, longer than the
        warning), drops that step, its wait's device-hours counted in compute/gpu_hours, and checkpoints the one
        before (docs/training.md#time-limits)."""
        cfg, state, tracker = self.cfg, self.state, self.tracker
        if state.step == 0 and not self.resumed:  # resumed at step 0: warned in step 1, step 0 logged already
            pass_rate = self._validate(0.0, self.learner.weights(), 0)
            tracker.log_metrics({"val/pass_rate": pass_rate, "compute/gpu_hours": 0.0, "compute/flops": 0.0,
                                 "compute/val_gpu_hours": state.val_gpu_hours}, step=0)
        tick = time.perf_counter()  # device time runs from here: every second of the job counts, waits included
        for step in range(state.step + 1, cfg.train.steps + 1):
            try:
                outcome = self._step(step, tick, stop=lambda: notice.received)
            except Interrupted:  # warned while waiting on this step's rollouts: the step before is saved as it ended
                state.gpu_hours += self.generator.clock.dropped(time.perf_counter() - tick)  # the wait held them all
                self._requeue(notice)
            if outcome is None:
                break
            metrics, ended, weights = outcome
            self.alarms.step(step, metrics, metrics["perf/learner_s"] + metrics["perf/weight_publish_s"])
            tick = ended
            if self._validates_at(step):  # one gather
                metrics["val/pass_rate"] = self._validate(state.gpu_hours, weights, step)
                tick = time.perf_counter()  # validation's time is not the next step's (docs/training.md)
                metrics["compute/val_gpu_hours"] = state.val_gpu_hours
                if self.generator.validated_on:  # 1: on the generator's engines (vLLM), 0: our torch engine
                    metrics["val/on_engine"] = float(self.generator.validated_on == "engine")
            if step % cfg.train.log_every == 0 or "val/pass_rate" in metrics:
                tracker.log_metrics(metrics, step=step)
            if step % cfg.train.checkpoint_every == 0 and step < cfg.train.steps:
                self._save()
            if progress is not None:
                progress(step, cfg.train.steps, metrics)
            decision = self.rungs.look(step)
            if decision is not None and decision.stop:  # settled: the run ends here, FINISHED, its checkpoint kept
                state.settled, state.stopped = True, decision.summary()
                self._save()
                break
            if notice.received and step < cfg.train.steps:  # preempted or at the time limit: save, then requeue
                self._requeue(notice)
        if self.keeps_checkpoint and state.step == cfg.train.steps and not state.diverged:
            self._save()  # its last step's: a larger train.steps goes on from here (sweep.extend=true)

    def _requeue(self, notice: PreemptionNotice) -> None:
        """SLURM's warning, at the step the learner is at: checkpoint it, then hand the warning over (submitit
        requeues the job). A run stopped here before, with no step trained since, fails instead: its jobs are warned
        before a step can end (a warning at or past the time limit, or a step longer than the job's time before it),
        and each would requeue the next for ever (docs/training.md#time-limits)."""
        state, cfg = self.state, self.cfg
        again = state.requeued_at == state.step
        state.requeued_at = state.step
        self._save()  # again too: what the stop added to the state (its wait's device-hours) is kept
        if again:
            delay, limit = cfg.launcher.get("signal_delay_s"), cfg.launcher.get("timeout_min")
            why = (f"stopped for a requeue at step {state.step} twice with no step trained between: SLURM's warning "
                   f"comes before a step can end (launcher.signal_delay_s={delay} s of the job's "
                   f"launcher.timeout_min={limit}, {60 * int(limit or 0):,} s). Not requeued again: lower "
                   f"launcher.signal_delay_s or raise launcher.timeout_min, and the same command goes on from the "
                   f"step-{state.step} checkpoint")
            self.tracker.set_tags({"ablate.requeue_loop": why})
            raise RuntimeError(why)
        self.tracker.set_tags({"ablate.requeued_at": str(state.step)})
        notice.hand_over()

    def _validates_at(self, step: int) -> bool:
        """Every train.val_every steps, at the step the generator validates each at (the same, or a few later where
        it decodes on its own engines: ablate/generators/base.py), the last step and the adaptive sweep's looks.
        Read from the step alone: a resumed run keeps the schedule."""
        cfg = self.cfg
        due = step - step % cfg.train.val_every
        return (due > 0 and self.generator.validation_step(due) == step) or step == cfg.train.steps \
            or self.rungs.due(step)

    def _validate(self, gpu_hours: float, weights: Weights, step: int) -> float:
        """The validation pass rate at this step; its device-hours go to state.val_gpu_hours, not to the law's C."""
        began = time.perf_counter()
        pass_rate = self.generator.validate(gpu_hours, policy=weights, step=step)
        seconds = time.perf_counter() - began
        self.state.val_gpu_hours += self.generator.clock.devices * seconds / 3600.0
        self.alarms.validated(pass_rate, seconds)
        return pass_rate

    def _save(self) -> None:
        began = time.perf_counter()
        self.tracker.flush()  # first: every step up to the checkpoint is in the store before a resume skips it
        self.checkpoint.save(self.state, self.learner, self.sampler, self.generator)
        self.alarms.saved(time.perf_counter() - began)

    def _step(self, step: int, tick: float, stop=None) -> tuple[dict, float, Weights] | None:
        """Optimizer step `step` (its device time counted from `tick`): rollouts, rewards, filtering, the learner's
        update, the weights to the generator; returns the step's metrics, when it ended and the weights published,
        or None when the run ends here. Interrupted (the generator's) when `stop()` turns true while the rollouts
        are awaited."""
        state, generator, tracker = self.state, self.generator, self.tracker
        l_max = self.cfg.generation.max_think_tokens + self.cfg.generation.max_answer_tokens
        try:
            rollouts = generator.batch(step, state.gpu_hours, stop)
            rewards = rollouts.rewards + self.length_control.reward_shaping(rollouts.lengths, l_max)
            keep = self.prompt_filter.keep(rewards, rollouts.group)
            self.sampler.observe(rollouts.prompt_ids, rollouts.correct)
            began = time.perf_counter()
            update = self.learner.step(rollouts, rewards, keep)
            if not self.samples_policy:  # a simulator's log-probs are made up: no gap to measure
                update.pop("train/logprob_gap", None)
            learner_s = time.perf_counter() - began
        except PromptsExhausted as err:  # a finite data set that NPR used up: the run ends here, saying so
            state.stopped = f"stopped after step {step - 1} of {self.cfg.train.steps}: {err}"
            tracker.set_tags({"ablate.stopped_early": state.stopped})
            print(f"run {self.run_id} {state.stopped}", file=sys.stderr, flush=True)
            return None
        except FloatingPointError as err:  # a non-finite loss, or logits of weights that went non-finite
            state.diverged = True
            tracker.set_tags({"ablate.diverged": "true", "ablate.diverged_step": str(step)})
            tracker.log_metrics({"train/diverged": 1.0}, step=step)
            log.warning("run %s diverged at step %d: %s", self.run_id, step, err)
            return None
        began = time.perf_counter()
        weights = self.learner.weights()
        generator.publish(weights, step)
        now = time.perf_counter()
        publish_s, wall = now - began, now - tick
        state.step = step
        flops = _step_flops(self.n_params, rollouts, keep)
        state.gpu_hours += generator.clock.gpu_hours(step, rollouts, wall, flops)
        state.flops += flops.total
        metrics = {
            "compute/gpu_hours": state.gpu_hours,
            "compute/flops": state.flops,
            "train/reward_mean": float(rewards.mean()),
            "train/pass_rate": float(rollouts.correct.float().mean()),
            "train/truncation_rate": float(rollouts.truncated.float().mean()),
            "train/zero_variance_frac": 1.0 - float(keep.float().mean()),
            "train/npr_dropped": float(len(self.prompt_filter.retired())),
            "train/prompts_available": float(self.sampler.available()),
            "train/completion_tokens": float(rollouts.lengths.float().mean()),
            **update,
            **_staleness(rollouts, step - 1),
            "perf/tokens_per_s": float(rollouts.mask.sum()) / max(wall, 1e-9),
            **_cluster_perf(self.cfg.run, self.n_params, rollouts, keep, learner_s, publish_s,
                            self.learner.ranks.world, {**generator.perf(), **generator.clock.perf()}),
        }
        return metrics, now, weights


def _staleness(rollouts: Rollouts, version: int) -> dict:
    """Optimizer steps between the policy that produced each trained token and the policy being updated."""
    mask = rollouts.mask
    n = int(mask.sum())
    if n == 0:
        return {}
    lag = (version - rollouts.versions).to(torch.float32)  # masked reductions: boolean indexing is slow here
    return {"train/staleness_min": float(torch.where(mask, lag, torch.inf).min()),
            "train/staleness_mean": float((lag * mask).sum()) / n,
            "train/staleness_max": float(torch.where(mask, lag, -torch.inf).max())}


def _cluster_perf(run: DictConfig, n_params: int, rollouts: Rollouts, keep: torch.Tensor, learner_s: float,
                  publish_s: float, ranks: int, generator: dict) -> dict:
    """What a cluster's user watches per step: the learner's seconds and (run.peak_tflops set) its MFU, 6 N per
    token it forwards (prompt and completion of the rows it trains, no padding; bench/bench_gpu.py's definition)
    over its ranks' peak; the weights' sync: gathered and handed over on the trainer side (publish), loaded on the
    engine's (the generator's own figures: idle and waiting fractions, tokens/s)."""
    perf = {**generator, "perf/learner_s": learner_s, "perf/weight_publish_s": publish_s,
            "perf/weight_sync_s": publish_s + generator.get("perf/engine_load_s", 0.0)}
    if run.peak_tflops > 0:
        kept = keep.to(rollouts.lengths.device)
        tokens = float((rollouts.prompt_mask.sum(dim=1).to(kept.device) + rollouts.lengths)[kept].sum())
        perf["perf/trainer_mfu"] = 6.0 * n_params * tokens / max(learner_s, 1e-9) / (ranks * run.peak_tflops * 1e12)
    return perf


def _step_flops(n_params: int, rollouts: Rollouts, keep: torch.Tensor) -> StepFlops:
    """2 N per generated token (forward), 6 N per trained token (forward and backward; the rows filtering keeps,
    the only ones the Learner runs): Kaplan et al. 2020."""
    generated = float(rollouts.lengths.sum())
    trained = float((rollouts.mask & keep[:, None].to(rollouts.mask.device)).sum())
    return StepFlops(generate=2.0 * n_params * generated, train=6.0 * n_params * trained)
