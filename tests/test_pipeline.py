"""The pipeline's off-policy rules (docs/design.md#semantics-pinned): k at its boundaries, versions changing inside a
sequence, every prompt trained exactly once, the deterministic schedule, and a restart's replay."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from ablate.config import compose
from ablate.policy import build_policy, build_tokenizer
from ablate.registry import build
from ablate.trainer import PromptSampler

SMALL = ["generator.max_waves=3", "batch.prompts_per_step=2", "batch.samples_per_prompt=2",
         "generation.max_think_tokens=6", "generation.max_answer_tokens=3", "task.n_train_prompts=64",
         "task.n_val_prompts=8", "length_control=truncation"]


def _setup(*overrides):
    cfg = compose([*SMALL, *overrides])
    tok = build_tokenizer(cfg.model)
    task = build(cfg.task, tokenizer=tok, seed=cfg.seed)
    policy = build_policy(cfg.model, cfg.seed, tok)  # random weights: long rambling rows, mostly cut at 9 tokens
    sampler = PromptSampler(task.size("train"), cfg.seed, build(cfg.filtering))
    drawn = []
    draw = sampler.next
    sampler.next = lambda count: drawn.extend(draw(count)) or drawn[-count:]
    return cfg, policy, build(cfg.generator, cfg=cfg, task=task, sampler=sampler, policy=policy), drawn


def _train(generator, policy, steps):
    """What the trainer does around the generator: take batch s, change the weights, publish version s."""
    batches = []
    for step in range(1, steps + 1):
        batches.append(generator.batch(step))
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.01 * torch.randn_like(p))
        generator.publish(policy, step)
    generator.close()
    return batches


@pytest.mark.parametrize("concurrent", [False, True])
@pytest.mark.parametrize("k", [1, 2])
def test_pipeline_rl_k_bounds_staleness_at_exactly_k(k, concurrent):
    _, policy, generator, _ = _setup("off_policy=pipeline_rl", f"off_policy.k={k}", f"generator.concurrent={concurrent}")
    worst = 0
    for step, ro in enumerate(_train(generator, policy, 12), start=1):
        versions = ro.versions[ro.mask]
        assert versions.max() <= step - 1  # never a version the trainer has not made
        assert versions.min() >= step - 1 - k, f"step {step}: a token {step - 1 - versions.min()} steps old"
        worst = max(worst, int(step - 1 - versions.min()))
    if not concurrent:  # the deterministic schedule runs as far ahead as the rule lets it
        assert worst == k


def test_token_versions_change_inside_one_sequence_under_pipeline_rl():
    _, policy, generator, _ = _setup("off_policy=pipeline_rl", "off_policy.k=4")
    spans = [len(set(ro.versions[i][ro.mask[i]].tolist())) for ro in _train(generator, policy, 8)
             for i in range(ro.n)]
    assert max(spans) >= 2


@pytest.mark.parametrize("k", [1, 3])
def test_ppo_off_policy_k_generates_each_round_with_frozen_weights(k):
    _, policy, generator, _ = _setup("off_policy=ppo_off_policy", f"off_policy.k={k}")
    for step, ro in enumerate(_train(generator, policy, 9), start=1):
        round_start = (step - 1) - (step - 1) % k
        assert set(ro.versions[ro.mask].tolist()) == {round_start}, f"step {step}"


@pytest.mark.parametrize("mode", ["off_policy=pipeline_rl", "off_policy=ppo_off_policy"])
@pytest.mark.parametrize("concurrent", [False, True])
def test_every_prompt_drawn_is_trained_once_and_none_is_lost(mode, concurrent):
    cfg, policy, generator, drawn = _setup(mode, "off_policy.k=2", f"generator.concurrent={concurrent}")
    batches = _train(generator, policy, 10)
    trained = [pid for ro in batches for pid in ro.prompt_ids[:: cfg.batch.samples_per_prompt].tolist()]
    in_flight = [pid for batch in sorted(generator.pipeline.started) for pid in generator.pipeline.started[batch]]
    assert trained + in_flight == drawn  # in order, each once: trained, or started and still to be trained
    for ro in batches:
        G = cfg.batch.samples_per_prompt
        assert ro.n == cfg.batch.prompts_per_step * G
        assert (ro.prompt_ids.view(-1, G) == ro.prompt_ids.view(-1, G)[:, :1]).all()  # a group is one prompt
        assert ro.group.tolist() == [g for g in range(cfg.batch.prompts_per_step) for _ in range(G)]


def test_the_deterministic_schedule_reproduces_every_token():
    runs = []
    for _ in range(2):
        _, policy, generator, _ = _setup("off_policy=pipeline_rl", "off_policy.k=2")
        runs.append(_train(generator, policy, 6))
    for a, b in zip(*runs):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.versions, b.versions)
        assert torch.equal(a.gen_logprobs, b.gen_logprobs)


def test_a_restart_starts_the_prompts_it_had_not_trained_yet_first():
    cfg, policy, generator, drawn = _setup("off_policy=pipeline_rl", "off_policy.k=2")
    _train(generator, policy, 3)
    pending = dict(generator.pipeline.started)
    assert pending  # batches 4.. were started when the run stopped
    state = generator.state_dict()
    _, policy2, fresh, _ = _setup("off_policy=pipeline_rl", "off_policy.k=2")
    fresh.load_state_dict(state)
    fresh.reset_weights(policy, 3)
    nxt = fresh.batch(4)
    assert nxt.prompt_ids[:: cfg.batch.samples_per_prompt].tolist() == pending[4]
    assert set(nxt.versions[nxt.mask].tolist()) >= {3}
    fresh.close()


def test_a_restart_with_nothing_started_ahead_goes_on_at_the_next_step():
    _, policy, generator, _ = _setup("off_policy=ppo_off_policy", "off_policy.k=1")  # never starts ahead
    _train(generator, policy, 3)
    assert not generator.pipeline.started
    _, _, fresh, _ = _setup("off_policy=ppo_off_policy", "off_policy.k=1")
    fresh.load_state_dict(generator.state_dict())
    fresh.reset_weights(policy, 3)
    ro = fresh.batch(4)
    assert set(ro.versions[ro.mask].tolist()) == {3}
    assert min([*fresh.pipeline.started, *fresh.pipeline.ended], default=5) >= 5  # no batch before 4 was generated again
    fresh.close()


def test_a_batch_given_up_at_a_warning_is_started_again_on_resume(monkeypatch):
    """SLURM's warning while the trainer waits on batch 3 (docs/training.md#time-limits): `batch` raises Interrupted
    at the first look after its `stop()` says so (here: once batch 3 is under way, a decode step a look), and the
    state saved then (the learner still at version 2) holds batch 3's prompts as started: after a restart batch 3
    is made of exactly them, on the weights of version 2; none is lost, none drawn twice."""
    from ablate.generators import pipeline
    from ablate.generators.base import Interrupted

    monkeypatch.setattr(pipeline, "RUN_AHEAD_STEPS", 1)
    _, policy, generator, drawn = _setup("off_policy=ppo_off_policy", "off_policy.k=1")  # no batch started ahead
    for step in (1, 2):
        generator.batch(step)
        generator.publish(policy, step)
    looks, asked = [], []  # the looks at the engine; (looks so far, the answer) of each time stop() was asked
    look = generator.pipeline._advance
    monkeypatch.setattr(generator.pipeline, "_advance", lambda: looks.append(1) or look())

    def stop() -> bool:
        asked.append((len(looks), 3 in generator.pipeline.started))
        return asked[-1][1]

    with pytest.raises(Interrupted):
        generator.batch(3, 0.0, stop)
    # asked after each look (before the first too), given up at the first yes, with no look after it
    assert [n for n, _ in asked] == list(range(len(asked))) and [yes for _, yes in asked].index(True) == len(asked) - 1
    assert asked[-1][0] == len(looks) >= 1
    state = generator.state_dict()
    generator.close()
    started = dict(state["started"])
    assert list(started) == [3] and started[3] == drawn[-2:]  # batch 3's prompts, the last drawn
    _, _, fresh, _ = _setup("off_policy=ppo_off_policy", "off_policy.k=1")
    fresh.load_state_dict(state)
    fresh.reset_weights(policy, 2)
    ro = fresh.batch(3)
    assert ro.prompt_ids[::2].tolist() == started[3] and set(ro.versions[ro.mask].tolist()) == {2}
    fresh.close()


def test_a_checkpoint_reads_the_sampler_and_the_generator_at_one_moment(tmp_path):
    """The concurrent mode's generator thread draws a batch's prompts from the sampler whenever the rules let it, also
    while rank 0 checkpoints (most of all at SLURM's warning, which comes while the trainer waits on rollouts). The
    sampler's state and the generator's were read one after the other, each under its own lock: a wave drawn between
    the two reads was in the generator's state as started (started again on resume) and still in the sampler's
    epoch (drawn again), one batch trained twice. Here the thread is let draw exactly there: the hook on the
    sampler's read publishes the weights batch 2 waits for (PPO-off-policy-1: nothing is drawn ahead of them) and
    waits until the thread has drawn batch 2, or is held. Resumed from that checkpoint, batch 2 is the batch the
    thread drew after it, and batch 3 other prompts."""
    from ablate.trainer import Checkpoint, Learner, RunState

    mode = ("off_policy=ppo_off_policy", "off_policy.k=1", "generator.concurrent=true")
    cfg, policy, generator, drawn = _setup(*mode)
    pipeline, sampler, G = generator.pipeline, generator.pipeline.sampler, cfg.batch.samples_per_prompt
    generator.batch(1)  # batch 2 waits for version 1: the thread idles, between two looks
    assert len(drawn) == cfg.batch.prompts_per_step
    read = sampler.state_dict

    def read_then_let_the_generator_draw() -> dict:
        state = read()
        generator.publish(policy, 1)  # batch 2 may start now
        with pipeline.lock:  # the thread drew batch 2, or it is held until both states are read
            assert pipeline.lock.wait_for(lambda: 2 in pipeline.started or pipeline.holds, timeout=60)
        return state

    sampler.state_dict = read_then_let_the_generator_draw
    Checkpoint(tmp_path).save(RunState(step=1), Learner(cfg, policy), sampler, generator)
    del sampler.state_dict
    after = generator.batch(2).prompt_ids[::G].tolist()  # drawn once the checkpoint was written, or while
    generator.close()

    _, fresh_policy, fresh, _ = _setup(*mode)
    Checkpoint(tmp_path).load(RunState(), Learner(cfg, fresh_policy), fresh.pipeline.sampler, fresh)
    fresh.reset_weights(fresh_policy, 1)
    second = fresh.batch(2).prompt_ids[::G].tolist()
    fresh.publish(fresh_policy, 2)
    third = fresh.batch(3).prompt_ids[::G].tolist()
    fresh.close()
    assert second == after  # the batch the run would have trained next, started again or drawn again: once
    assert not set(second) & set(third), f"batch 2's prompts {second} trained again at step 3: {third}"


def test_the_concurrent_mode_gives_up_a_batch_within_a_look_of_its_stop():
    from ablate.generators.base import Interrupted

    _, policy, generator, _ = _setup("off_policy=ppo_off_policy", "off_policy.k=1", "generator.concurrent=true")
    generator.batch(1)
    with pytest.raises(Interrupted, match="batch 2"):
        generator.batch(2, 0.0, lambda: True)
    generator.close()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_generator_vllm_without_vllm_says_so_instead_of_decoding_with_torch():
    with pytest.raises(ModuleNotFoundError, match=r"generator=vllm needs vLLM.*pip install -e '\.\[vllm\]'"):
        _setup("generator=vllm")


@pytest.mark.parametrize("mode", ["off_policy=pipeline_rl", "off_policy=ppo_off_policy"])
def test_running_ahead_between_looks_gives_the_tokens_of_step_by_step(mode, monkeypatch):
    """The deterministic schedule with the engine running free between the pipeline's looks (until a wave ends,
    ablate.generators.engine.advance) against the same schedule looked at after every decode step: the same tokens,
    log-probs and versions (the in-flight loads land at the same decode steps), in a fraction of the looks."""
    from ablate.generators import pipeline

    runs = {}
    for reach in (1, pipeline.RUN_AHEAD_STEPS):
        monkeypatch.setattr(pipeline, "RUN_AHEAD_STEPS", reach)
        _, policy, generator, _ = _setup(mode, "off_policy.k=2", "generator.concurrent=false")
        batches = _train(generator, policy, 8)
        perf = generator.pipeline.perf()
        runs[reach] = (batches, perf["perf/decode_steps_per_look"])
    (one, per_one), (free, per_free) = runs.values()
    for a, b in zip(one, free):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.versions, b.versions)
        assert torch.equal(a.gen_logprobs, b.gen_logprobs)
    assert len({int(v) for ro in free for v in ro.versions[ro.mask].unique()}) >= 3  # loads landed throughout
    assert per_one <= 1.0 and per_free >= 2.0, (per_one, per_free)


def test_the_tasks_reward_of_a_right_and_a_wrong_answer_reaches_the_rollouts():
    """task.reward_correct / task.reward_wrong (the paper's +1 / -1 in experiment=paper_8b): each row's reward by its
    check, the check itself kept as it was (pass rates, No-Positive-Resampling)."""
    from ablate.generators.engine import Sequence
    from ablate.generators.pipeline import assemble

    rows = [Sequence(i, 1, [5, 6]) for i in range(4)]
    for r in rows:
        r.tokens, r.logprobs, r.versions, r.sampled = [7, 8], [-0.5, -0.5], [0, 0], [True, True]
    correct = torch.tensor([True, False, False, True])
    ro = assemble(rows, correct, [0, 0, 1, 1], pad_id=0, reward=(1.0, -1.0))
    assert ro.rewards.tolist() == [1.0, -1.0, -1.0, 1.0] and ro.rewards.dtype == torch.float32
    assert ro.correct.tolist() == correct.tolist()
    assert assemble(rows, correct, [0, 0, 1, 1], pad_id=0).rewards.tolist() == [1.0, 0.0, 0.0, 1.0]  # 1 / 0 default
    _, _, generator, _ = _setup("task.reward_correct=1", "task.reward_wrong=-1")
    assert generator.pipeline.reward == (1.0, -1.0)
    generator.close()


def test_paused_holds_the_generator_thread_between_two_looks_and_lets_it_go_on():
    """Validation on an engine in this process (vLLM) takes the engine for itself: while `paused()` holds it, the
    generator thread decodes nothing (its rows stay where they are); after, it goes on. settle() takes the weights
    published, as the thread would at its next look (PipelineRL)."""
    import time

    _, policy, generator, _ = _setup("off_policy=pipeline_rl", "off_policy.k=2", "generator.concurrent=true",
                                     "generation.max_think_tokens=200")
    pipeline, engine = generator.pipeline, generator.engine
    pipeline.thread.start()
    deadline = time.monotonic() + 60
    while engine.decode_steps < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    with pipeline.paused():
        held = engine.decode_steps
        time.sleep(0.5)
        assert engine.decode_steps == held and not pipeline.advancing
        generator.publish(policy, 1)
        assert pipeline.settle() == 1 == engine.version and pipeline.pending is None
    deadline = time.monotonic() + 60
    while engine.decode_steps == held and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.decode_steps > held
    generator.close()


@pytest.mark.e2e
def test_engine_processes_in_the_concurrent_mode_run_many_decode_steps_a_look(monkeypatch):
    """bench/bench_engines.py's pipeline in the concurrent mode on 2 engine processes whose decode steps take 10 ms
    more and whose every exchange with rank 0 30 ms more: each look still lets an engine run until a wave ends.
    Before, rank 0 paced the seconds between looks by its whole round trip (every exchange, each engine in turn,
    ~130 ms here) over the steps, and at over RUN_AHEAD_S (50 ms) an engine took one decode step a look for good."""
    from conftest import ROOT

    from ablate.generators.pipeline import RUN_AHEAD_STEPS

    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # the spawned processes import the bench by name
    import bench_engines

    overrides = ["model=tiny", "model.device=cpu", "batch.prompts_per_step=4", "batch.samples_per_prompt=4",
                 "generation.max_think_tokens=24", "generation.max_answer_tokens=8", "length_control=truncation",
                 "generator.max_waves=2", "generator.concurrent=true"]
    r = bench_engines.measure(2, overrides, RUN_AHEAD_STEPS, batches=4, decode_s=0.01, exchange_s=0.03)
    assert r["steps_per_look"] >= 4, r
