"""Filtering and length control, against values derived by hand."""

from __future__ import annotations

import pytest
import torch

from ablate.rl.filtering import PromptFilter, zero_variance
from ablate.rl.length_control import Interruption, LengthPenalty, Truncation


def test_zero_variance_drops_groups_whose_rewards_are_all_equal():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    group = torch.tensor([0, 0, 1, 1, 2, 2, 3])  # group 0 all 1, group 1 mixed, group 2 all 0, group 3 a singleton
    assert zero_variance(rewards, group).tolist() == [False, False, True, True, False, False, False]


def test_npr_last_vs_cumulative():
    # prompt 7: epoch 1 passes 1/2, epoch 2 passes 2/2. last: 1.0 >= 0.9 -> retired; cumulative: (0.5+1)/2 = 0.75 -> kept
    ids, first, second = torch.tensor([7, 7]), torch.tensor([True, False]), torch.tensor([True, True])
    last, cumulative = PromptFilter(npr_mode="last"), PromptFilter(npr_mode="cumulative")
    for f in (last, cumulative):
        f.observe(ids, first)
        assert f.retired() == set()
        f.observe(ids, second)
    assert last.retired() == {7} and cumulative.retired() == set()
    assert last.sampleable([5, 7, 9]) == [5, 9]
    assert PromptFilter(no_positive_resampling=False, npr_mode="last").sampleable([7]) == [7]


def test_npr_state_round_trips():
    f = PromptFilter(npr_mode="cumulative")
    f.observe(torch.tensor([1, 1, 2, 2]), torch.tensor([True, True, True, False]))
    g = PromptFilter(npr_mode="cumulative")
    g.load_state_dict(f.state_dict())
    assert g.retired() == f.retired() == {1}
    assert g.state_dict() == f.state_dict()


def test_length_penalty_is_dapos_overlong_formula():
    # L_max = 14336, L_cache = 2048: 0 up to 12288; (12288 - |y|) / 2048 above; -1 beyond 14336
    lp = LengthPenalty(l_cache_frac=2048 / 14336)
    y = torch.tensor([100, 12288, 13312, 14336, 15000])
    assert lp.reward_shaping(y, 14336).tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert Truncation().reward_shaping(y, 14336).tolist() == [0.0] * 5


def test_interruption_budget_is_drawn_in_its_range():
    import numpy as np

    ctl = Interruption(think_budget_min_frac=10240 / 12288, think_budget_max_frac=1.0, phrase="time is up")
    budgets = [ctl.think_budget(np.random.default_rng(i), 12288) for i in range(300)]
    assert min(budgets) >= 10240 and max(budgets) <= 12288 and len(set(budgets)) > 100
    assert Truncation().think_budget(np.random.default_rng(0), 12288) is None


# ------------------------------------------------------------------------ No-Positive-Resampling never ends a run badly
def _retire_all(sampler, prompt_ids):
    """Every prompt passed on every sample: NPR retires them all."""
    sampler.observe(torch.tensor(prompt_ids), torch.ones(len(prompt_ids), dtype=torch.bool))


def test_when_npr_retired_every_prompt_a_synthetic_task_draws_fresh_ones_the_same_after_a_resume():
    from ablate.config import compose
    from ablate.policy import build_tokenizer
    from ablate.registry import build
    from ablate.trainer import PromptSampler

    cfg = compose(["task.n_train_prompts=6", "task.n_val_prompts=4"])

    def fresh():
        task = build(cfg.task, tokenizer=build_tokenizer(cfg.model), seed=0)
        return task, PromptSampler(task.size("train"), 0, PromptFilter(), more=task.more_train)

    task, sampler = fresh()
    first = sampler.next(6)
    assert sorted(first) == list(range(6))  # one epoch: the 6 prompts
    _retire_all(sampler, first)
    second = sampler.next(4)  # nothing left: 6 fresh prompts come, and the draw goes on in them
    assert task.size("train") == 12 and set(second) <= set(range(6, 12)) and sampler.available() == 6
    val = {task.problem("val", i).prompt for i in range(4)}
    assert not val & {task.problem("train", i).prompt for i in range(12)}  # still no validation prompt
    saved = sampler.state_dict()
    # A resumed run (a new task and sampler, from the checkpoint) grows its task to the same prompts.
    task2, sampler2 = fresh()
    sampler2.load_state_dict(saved)
    assert [task2.problem("train", i) for i in range(12)] == [task.problem("train", i) for i in range(12)]
    assert sampler2.next(2) == sampler.next(2)


def test_an_epoch_starts_with_a_full_pool_while_the_task_has_more_prompts():
    """NPR retired 2 of 6 prompts: the next epoch starts with the 4 left plus 6 fresh ones (the pool back above the
    task's 6: one chunk of n_train_prompts); without more prompts (a finite data set), with the 4 left alone."""
    from ablate.config import compose
    from ablate.policy import build_tokenizer
    from ablate.registry import build
    from ablate.trainer import PromptSampler

    cfg = compose(["task.n_train_prompts=6", "task.n_val_prompts=4"])
    task = build(cfg.task, tokenizer=build_tokenizer(cfg.model), seed=0)
    growing = PromptSampler(task.size("train"), 0, PromptFilter(), more=task.more_train)
    finite = PromptSampler(6, 0, PromptFilter())
    for sampler in (growing, finite):
        assert sorted(sampler.next(6)) == list(range(6))
        _retire_all(sampler, [1, 4])
    nxt = growing.next(10)
    assert task.size("train") == 12 and growing.available() == 10
    assert sorted(nxt) == [0, 2, 3, 5, *range(6, 12)]  # the next epoch: every unretired prompt once
    assert sorted(finite.next(4)) == [0, 2, 3, 5] and finite.available() == 4


def test_a_finite_task_that_npr_used_up_ends_the_run_cleanly_saying_why(tmp_path, mlflow_uri):
    """task=math (a data set: no fresh prompts) with 4 training prompts, 2 a step, each retired once its pass rate
    is seen (npr_threshold 0). The generator runs a batch ahead (two waves): batches 1 and 2 take the 4 prompts;
    batch 3 starts after step 1, when only batch 1's prompts are retired, so it takes batch 2's again; after step
    2 all 4 are retired and batch 4 finds none. The run trains 3 steps, stops, FINISHED, tagged with the reason."""
    from ablate import tracking
    from ablate.config import compose
    from ablate.trainer import train

    cfg = compose(["task=math", "generation.max_prompt_tokens=256", "task.n_train_prompts=4", "task.n_val_prompts=2",
                   "task.val_samples=1",
                   "batch.prompts_per_step=2", "batch.samples_per_prompt=2", "filtering.npr_threshold=0.0",
                   "generation.max_think_tokens=4", "generation.max_answer_tokens=4", "train.steps=6",
                   f"paths.outputs={tmp_path}"])
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "npr"), "scalerl", {})
    state = train(cfg, run_id, mlflow_uri)
    run = client.get_run(run_id)
    assert state.step == 3 and run.info.status == "FINISHED"
    assert run.data.tags["ablate.stopped_early"] == ("stopped after step 3 of 6: No-Positive-Resampling retired all "
                                                     "4 training prompts and the task has no more")
    dropped = sorted(client.get_metric_history(run_id, "train/npr_dropped"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in dropped] == [(1, 2.0), (2, 4.0), (3, 4.0)]


@pytest.mark.e2e
def test_no_seed_crashes_the_default_run_when_npr_retires_its_prompts(tmp_path, mlflow_uri):
    """The default ScaleRL run on 10 seeds, on a short schedule with a training set NPR keeps exhausting (8 prompts,
    8 a step, each retired once its pass rate is seen): every run reaches its last step on fresh prompts. (Seed 7
    of the 1,000-step default used to fail at step ~730: 'No-Positive-Resampling retired every training prompt'.)"""
    from ablate import tracking
    from ablate.config import compose
    from ablate.trainer import train

    client = tracking.client(mlflow_uri)
    for seed in range(10):
        cfg = compose([f"seed={seed}", "train.steps=6", "train.val_every=100", "task.n_train_prompts=8",
                       "task.n_val_prompts=4", "task.val_samples=2", "task.warm_start_steps=50",
                       "filtering.npr_threshold=0.0", f"paths.outputs={tmp_path}"])
        run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "seeds"), "scalerl", {})
        seen = []
        state = train(cfg, run_id, mlflow_uri, progress=lambda step, total, metrics: seen.append(metrics))
        assert state.step == 6 and not state.stopped and client.get_run(run_id).info.status == "FINISHED", seed
        prompts = [m["train/npr_dropped"] + m["train/prompts_available"] for m in seen]  # the training set
        assert prompts[0] == 8 and prompts[-1] >= 16, (seed, prompts)  # fresh prompts were drawn
