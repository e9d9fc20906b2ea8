"""Filtering and length control, against values derived by hand."""

from __future__ import annotations

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
