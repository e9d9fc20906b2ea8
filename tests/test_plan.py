"""The learner's plan (ablate/plan.py): small cases derived by hand, the invariants on seeded length sets, today's
plan as the trainer ran it before (bench/retired_plan.py), and the learner's step following the plan and logging its
figures."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import ROOT
from omegaconf import OmegaConf

from ablate import plan
from ablate.config import compose
from ablate.distributed.layouts import OneProcess
from ablate.registry import build
from ablate.rollouts import Rollouts
from ablate.trainer import Learner

ALL = lambda n: torch.ones(n, dtype=torch.bool)  # noqa: E731
SIX = torch.tensor([9, 2, 7, 4, 5, 3])  # rows 0..5; longest first: 0 (9), 2 (7), 4 (5), 3 (4), 5 (3), 1 (2)


@pytest.fixture
def retired(monkeypatch):
    """bench/retired_plan.py: the plan the learner ran before these, kept for the benches that compare with it."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import retired_plan

    return retired_plan


def test_packed_bins_six_rows_on_two_ranks_by_hand():
    """30 tokens, a budget of 10, 2 ranks: at least ceil(30 / 20) = 2 passes a rank, 4 bins. Worst-fit decreasing
    (attention weighing 0): 9, 7, 5, 4 one a bin; 3 fits bins of 7, 5, 4 (not 9 + 3 = 12), into the lightest, 4's;
    2 fits those of 7, 5, 7, into 5's. Bins 9 | 7 | 5 2 | 4 3: the heaviest pair is pass 0 (9 to rank 0, 7 to rank
    1), then rank 1 (7 so far) takes the heavier of the rest (5 2, listed first of the two 7s)."""
    p = plan.packed(SIX, ALL(6), world=2, budget=10, attention=0.0)
    assert p.passes == [[[0], [3, 5]], [[2], [4, 1]]]
    assert (p.passes_per_rank, p.dummies, p.notes) == (2, 0, ())
    assert (p.real_tokens, p.computed_tokens, p.token_efficiency) == (30, 30, 1.0)
    assert (p.real_attention, p.computed_attention, p.attention_efficiency) == (184, 184, 1.0)
    assert p.imbalance == pytest.approx(16 / 15 - 1)  # ranks' work 16 and 14
    assert p.lockstep == pytest.approx((9 + 7) / 15 - 1)  # each pass at its slowest rank's pace: 9 then 7
    # attention at weight 0.01: rank 0's work 16 + 0.01 (81 + 16 + 9), rank 1's 14 + 0.01 (49 + 25 + 4)
    weighted = plan.packed(SIX, ALL(6), world=2, budget=10, attention=0.01)
    assert weighted.passes == p.passes
    assert weighted.imbalance == pytest.approx((16 + 1.06) / ((16 + 1.06 + 14 + 0.78) / 2) - 1)


def test_padded_runs_six_rows_on_two_ranks_by_hand():
    """At most 2 rows a pass, no token cap: the fewest runs of neighbours are 3 (9 7 | 5 4 | 3 2), so 4 passes
    (2 a rank). The lightest heaviest run of 4: the limit 9 leaves 5 runs (9 | 7 | 5 | 4 3 | 2), 10 leaves 4:
    9 | 7 | 5 4 (2 x 5 = 10 padded) | 3 2 (6). By work: 5 4 (10) and 9 to ranks 0 and 1, then 7 to rank 1 (9 so far)
    and 3 2 to rank 0: 16 each."""
    p = plan.padded(SIX, ALL(6), world=2, budget=0, max_rows=2, attention=0.0)
    assert p.passes == [[[4, 3], [5, 1]], [[0], [2]]]
    assert (p.passes_per_rank, p.dummies) == (2, 0)
    assert (p.real_tokens, p.computed_tokens) == (30, 9 + 7 + 2 * 5 + 2 * 3)
    assert (p.real_attention, p.computed_attention) == (184, 81 + 49 + 2 * 25 + 2 * 9)
    assert p.token_efficiency == pytest.approx(30 / 32) and p.attention_efficiency == pytest.approx(184 / 198)
    assert p.imbalance == 0.0 and p.lockstep == pytest.approx((10 + 7) / 16 - 1)


def test_todays_plan_by_hand_is_the_deal_and_the_cut_the_trainer_ran(retired):
    """Before ablate/plan.py the learner dealt the trained rows round robin longest first (row 5 is not trained:
    rank 0 gets rows 0, 4, 1; rank 1 gets 2, 3), cut each rank's into micro-batches (2 rows: 0 4 | 1 and 2 3) and ran
    as many passes as the busiest rank: rank 1 a dummy pass, row 0 alone, weighted 0."""
    trained = torch.tensor([True, True, True, True, True, False])
    p = retired.round_robin(SIX, trained, world=2, budget=0, max_rows=2, attention=0.0)
    assert [retired.deal(SIX, trained, r, 2).nonzero().squeeze(1).tolist() for r in range(2)] == [[0, 1, 4], [2, 3]]
    assert p.passes == [[[0, 4], [1]], [[2, 3], []]]
    assert (p.dummies, p.filler, p.passes_per_rank) == (1, 0, 2)
    assert (p.real_tokens, p.computed_tokens) == (27, 2 * 9 + 2 + 2 * 7 + 9)  # the dummy pass computes row 0
    assert p.imbalance == pytest.approx(23 / 21.5 - 1)  # rank 0: 18 + 2, rank 1: 14 + 9
    for seed in range(5):  # the rows of each rank's passes are the cut of the rows dealt to it, in order
        lengths = torch.randint(1, 200, (37,), generator=torch.Generator().manual_seed(seed))
        trained = torch.rand(37, generator=torch.Generator().manual_seed(seed + 9)) < 0.8
        p = retired.round_robin(lengths, trained, world=3, budget=400, max_rows=4)
        for rank in range(3):
            cut = retired.micro_batches(lengths, retired.deal(lengths, trained, rank, 3), 4, 400)
            assert p.passes[rank] == [b.tolist() for b in cut] + [[]] * (p.passes_per_rank - len(cut))


def test_a_dummy_pass_only_where_the_rows_are_too_few_and_said():
    """3 rows, 1 a pass, 2 ranks: 2 passes a rank and 4 passes for 3 rows; the dummy runs the shortest row (2)."""
    p = plan.padded(torch.tensor([4, 6, 2]), ALL(3), world=2, budget=0, max_rows=1, attention=0.0)
    assert p.passes == [[[1], []], [[0], [2]]] and p.filler == 2
    assert p.dummies == 1 and "1 dummy pass(es): 3 trained rows cannot fill 2 ranks x 2 passes" in p.notes[0]
    assert (p.computed_tokens, p.real_tokens) == (6 + 4 + 2 + 2, 12) and p.imbalance == pytest.approx(8 / 7 - 1)
    assert plan.packed(torch.tensor([4]), ALL(1), world=3, budget=10).dummies == 2


def test_a_row_longer_than_the_budget_goes_alone_and_is_said():
    """Packed, a budget of 10: row 0 (12 tokens) alone in a pass; 20 tokens need 2 passes; the rest share one."""
    p = plan.packed(torch.tensor([12, 3, 3, 2]), ALL(4), world=1, budget=10)
    assert p.passes == [[[0], [1, 2, 3]]]
    assert p.notes == ("1 row(s) longer than the budget of 10 tokens, each alone in a pass (the longest, row 0: "
                       "12 tokens)",)
    padded = plan.padded(torch.tensor([12, 3, 3, 2]), ALL(4), world=1, budget=10, max_rows=8)
    assert padded.passes[0][0] == [0] and padded.notes == p.notes


def _lengths(seed: int, n: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.tensor(np.clip(rng.lognormal(np.log(3000), 0.9, n), 50, 16000).astype(np.int64))


@pytest.mark.parametrize("world", [1, 2, 3, 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_row_once_the_same_passes_on_every_rank_the_budget_kept(world, seed, retired):
    lengths = _lengths(seed, 200)
    trained = torch.from_numpy(np.random.default_rng(seed + 100).random(200) < 0.8)
    budget, rows = 32768, 6
    fewest = len(retired.micro_batches(lengths, trained, rows, budget))  # today's cut of every row: the fewest runs
    order = sorted(trained.nonzero().squeeze(1).tolist(), key=lambda r: (-int(lengths[r]), r))  # longest first
    for p in (plan.padded(lengths, trained, world, budget, rows), plan.packed(lengths, trained, world, budget)):
        assert len(p.passes) == world and {len(r) for r in p.passes} == {p.passes_per_rank}
        every = sorted(row for rank in range(world) for row in p.rows(rank))
        assert every == trained.nonzero().squeeze(1).tolist()  # none lost, none doubled, none untrained
        n = int(trained.sum())
        assert p.dummies == max(0, world * p.passes_per_rank - n)
        for batch in (b for r in p.passes for b in r if len(b) > 1):
            lens = lengths[batch]
            if p.form == "padded":
                assert len(batch) <= rows and len(batch) * int(lens.max()) <= budget
                at = sorted(batch, key=order.index)  # a run of neighbours by length
                assert at == order[order.index(at[0]):order.index(at[0]) + len(batch)]
            else:
                assert int(lens.sum()) <= budget
        if p.form == "padded":
            assert p.passes_per_rank == math.ceil(fewest / world)
        else:
            assert p.passes_per_rank >= math.ceil(int(lengths[trained].sum()) / (world * budget))
            assert p.token_efficiency == 1.0 == p.attention_efficiency
        assert p == (plan.padded(lengths, trained, world, budget, rows) if p.form == "padded"
                     else plan.packed(lengths, trained, world, budget))  # deterministic in one process; across
        # processes and from what each rank is sent: test_every_rank_plans_the_same_from_what_it_is_sent


def test_the_balanced_plans_beat_todays_on_a_scalerl_like_step(retired):
    """768 rows of lognormal lengths on 16 ranks, 65,536 tokens a pass (bench/bench_learner_plan.py prints the
    regimes): the padded plan computes fewer tokens than today's with no dummy pass and a lighter busiest rank; the
    packed plan computes only real tokens, with the ranks within 5%."""
    lengths, trained = _lengths(7, 768), ALL(768)
    old = retired.round_robin(lengths, trained, 16, 65536, 8)
    new = plan.padded(lengths, trained, 16, 65536, 8)
    packed = plan.packed(lengths, trained, 16, 65536)
    assert new.computed_tokens < old.computed_tokens and new.imbalance < old.imbalance and new.paced < old.paced
    assert new.token_efficiency > 0.97 and new.dummies == 0 and new.passes_per_rank <= old.passes_per_rank
    assert packed.token_efficiency == 1.0 and packed.dummies == 0 and packed.imbalance <= 0.05
    assert packed.lockstep <= 0.05 and packed.passes_per_rank < new.passes_per_rank


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"lengths \[N\] and a bool trained \[N\]; got lengths \(3,\) and trained "
                                         r"\(4,\)"):
        plan.padded(torch.tensor([1, 2, 3]), ALL(4), 2, 0, 8)
    with pytest.raises(ValueError, match=r"world >= 1.*got world=0, budget=10$"):
        plan.packed(torch.tensor([1, 2, 3]), ALL(3), 0, 10)
    with pytest.raises(ValueError, match="got world=2, budget=10, max_rows=-1"):
        plan.padded(torch.tensor([1, 2, 3]), ALL(3), 2, 10, -1)
    with pytest.raises(ValueError, match="trained row 1 has length 0"):
        plan.packed(torch.tensor([3, 0]), ALL(2), 1, 10)


# model=tiny's attention weight (ablate/plan.py's law: hidden x layers / N), counted by hand: hidden 64, 2 layers,
# a vocabulary of 186 (the tokenizer made in code), MLP 4 x 64 = 256, untied head. N = embeddings and head
# 2 x 186 x 64 = 23,808, a layer's q, k, v, o 4 x 64^2 = 16,384 and MLP 3 x 64 x 256 = 49,152 and its two norms 128
# (65,664 a layer, 131,328 for 2), the final norm 64: 155,200. So 64 x 2 / 155,200 = 1 / 1,212.5.
TINY_ATTENTION = 64 * 2 / (2 * 186 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 256 + 2 * 64) + 64)


def _one_step(form: str):
    """A Learner (mock rollouts of 8 prompts, 4 rows a pass, `form`) after one step: (learner, rollouts, the rows of
    each scorer call, the step's metrics)."""
    cfg = OmegaConf.create(OmegaConf.to_container(compose(["generator=mock", "train.micro_batch_size=4", form]),
                                                  resolve=True, enum_to_str=True))
    ro = build(cfg.generator, cfg=cfg).rollouts(list(range(8)), 0, compute=2000.0)
    rewards, keep = torch.arange(ro.n, dtype=torch.float32) % 3, ALL(ro.n)
    learner = Learner(cfg)
    calls = []
    scorer = learner.scorer
    learner.scorer = lambda *args: calls.append(len(args[0])) or scorer(*args)
    return learner, ro, calls, learner.step(ro, rewards, keep)


def test_the_learner_steps_on_the_plan_and_logs_its_figures():
    """Learner.step runs the padded plan's passes with run.packed_rows=false (4 rows a pass: as many passes as the
    plan has) and logs its token efficiency and imbalance; the figures are the plan's of the step's lengths (prompt +
    completion)."""
    learner, ro, calls, metrics = _one_step("run.packed_rows=false")
    expected = plan.padded(ro.prompt_mask.sum(1) + ro.lengths, ro.mask.any(1), 1, 0, 4, TINY_ATTENTION)
    assert calls == [len(b) for b in expected.passes[0]] and len(calls) == math.ceil(int(ro.mask.any(1).sum()) / 4)
    assert metrics["perf/learner_token_efficiency"] == pytest.approx(expected.token_efficiency)
    assert 0.5 < metrics["perf/learner_token_efficiency"] < 1.0  # the mock's rows differ in length
    assert metrics["perf/learner_imbalance"] == 0.0  # one rank


def test_the_learner_packs_its_rows_up_to_the_padded_forms_largest_pass():
    """Packed (run.packed_rows=true), a pass holds up to train.micro_batch_tokens real tokens, or with none set, as
    many as the padded form's largest pass: micro_batch_size rows of the step's longest. Every token computed is
    real."""
    learner, ro, calls, metrics = _one_step("run.packed_rows=true")
    lengths = ro.prompt_mask.sum(1) + ro.lengths
    expected = plan.packed(lengths, ro.mask.any(1), 1, 4 * int(lengths.max()), TINY_ATTENTION)
    assert calls == [len(b) for b in expected.passes[0]]
    assert sum(calls) == int(ro.mask.any(1).sum())  # every trained row once
    assert len(calls) <= math.ceil(int(ro.mask.any(1).sum()) / 4)  # no more passes than the padded form's
    assert metrics["perf/learner_token_efficiency"] == 1.0 and metrics["perf/learner_imbalance"] == 0.0


def test_rows_are_packed_where_varlen_attention_runs_unless_said(monkeypatch):
    """Unset, run.packed_rows packs on CUDA in bf16 or fp16 (varlen's kernels; on a torch whose varlen_attn the
    packed pass can call, as 2.13's: tests/test_packing.py holds the other torches) and not elsewhere: on the CPU, or
    in fp32 on CUDA, the packed form attends row by row, slower than padding for small rows. Said, it is as said."""
    from ablate import policy
    from ablate.policy import packs_rows

    monkeypatch.setattr(policy, "_varlen_form", lambda: "enable_gqa")
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert packs_rows(None, cuda, torch.bfloat16) and packs_rows(None, cuda, torch.float16)
    assert not packs_rows(None, cuda, torch.float32) and not packs_rows(None, cpu, torch.bfloat16)
    assert packs_rows(True, cpu, torch.float32) and not packs_rows(False, cuda, torch.bfloat16)
    cfg = OmegaConf.create(OmegaConf.to_container(compose(["generator=mock"]), resolve=True, enum_to_str=True))
    assert cfg.run.packed_rows is None and not Learner(cfg).packed  # the CPU: per row


def test_the_learners_attention_weight_is_its_models_shape_counted_by_hand():
    cfg = OmegaConf.create(OmegaConf.to_container(compose(["generator=mock"]), resolve=True, enum_to_str=True))
    assert TINY_ATTENTION == pytest.approx(1 / 1212.5)
    assert Learner(cfg).attention == pytest.approx(TINY_ATTENTION, rel=1e-12)


def _rows(completions: list[int], prompt: int = 1) -> Rollouts:
    """Rollouts of len(completions) / 2 prompts x 2 samples: every prompt `prompt` tokens, row i's completion
    completions[i] tokens (random ids), every completion token trained, rewards 1, 0 in each group."""
    n, T = len(completions), max(completions)
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor(completions)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return Rollouts(prompt_ids=torch.arange(n) // 2, group=torch.arange(n) // 2,
                    prompt_tokens=torch.randint(3, 100, (n, prompt), generator=g),
                    prompt_mask=torch.ones(n, prompt, dtype=torch.bool),
                    tokens=torch.randint(3, 100, (n, T), generator=g) * mask, mask=mask,
                    gen_logprobs=torch.full((n, T), -1.0) * mask, versions=torch.zeros(n, T, dtype=torch.long),
                    lengths=lengths, rewards=torch.tensor([1.0, 0.0] * (n // 2)),
                    correct=torch.tensor([True, False] * (n // 2)), truncated=torch.zeros(n, dtype=torch.bool))


class _RankZeroOfTwo(OneProcess):
    """Rank 0 of 2 trainer ranks, in this process alone: the learner plans the step for 2 ranks and runs rank 0's
    passes (the other rank's and the collectives are not needed for the figures the step logs)."""

    rank, world = 0, 2


def test_the_learners_imbalance_at_two_ranks_by_hand():
    """Rows of 6, 4, 3 and 2 tokens (a prompt token each), 1 row a pass, on 2 ranks: 4 passes, 2 a rank. Dealt by
    work, heaviest first: 6 to rank 0 and 4 to rank 1, then rank 1 (the lighter so far) takes 3 and rank 0 takes 2.
    A pass of a row of L tokens works L + a L^2 (a: model=tiny's attention weight, counted by hand), so rank 0 works
    8 + 40a, rank 1 7 + 25a, and the imbalance is (8 + 40a) / (7.5 + 32.5a) - 1 (0.0666..., 1 / 15 at a = 0);
    rank 0 runs rows 0 and 3."""
    cfg = OmegaConf.create(OmegaConf.to_container(
        compose(["generator=mock", "train.micro_batch_size=1", "run.packed_rows=false"]), resolve=True,
        enum_to_str=True))
    learner = Learner(cfg, ranks=_RankZeroOfTwo())
    scorer, calls = learner.scorer, []
    learner.scorer = lambda *args: calls.append(args[0][:, -1].tolist()) or scorer(*args)  # each pass's prompts
    ro = _rows([5, 3, 2, 1])
    metrics = learner.step(ro, ro.rewards, ALL(4))
    a = TINY_ATTENTION
    assert metrics["perf/learner_imbalance"] == pytest.approx((8 + 40 * a) / (7.5 + 32.5 * a) - 1, rel=1e-9)
    assert metrics["perf/learner_imbalance"] == pytest.approx(1 / 15, abs=1e-3)  # attention's part is small
    assert calls == [[int(ro.prompt_tokens[0, 0])], [int(ro.prompt_tokens[3, 0])]]  # rows 0 and 3, one a pass
    assert metrics["perf/learner_token_efficiency"] == 1.0  # rows alone: no padding


PLAN_IN_ANOTHER_PROCESS = """
import json, sys
import numpy as np, torch
sys.path[:0] = [sys.argv[1]]
from ablate import plan
torch.set_num_threads(1)
out = {}
for seed in (0, 1, 2):
    rng = np.random.default_rng(seed)
    lengths = torch.tensor(np.clip(rng.lognormal(np.log(3000), 0.9, 200), 50, 16000).astype(np.int64))
    trained = torch.from_numpy(np.random.default_rng(seed + 100).random(200) < 0.8)
    for world in (1, 2, 3, 16):
        out[f"{seed} {world}"] = [plan.padded(lengths, trained, world, 32768, 6).passes,
                                  plan.packed(lengths, trained, world, 32768).passes]
print(json.dumps(out))
"""


def test_every_rank_plans_the_same_from_what_it_is_sent():
    """Every rank computes the step's plan itself (no collective): rank r > 0 from the batch rank 0 sends it
    (Rollouts.rows_only, made whole again by `expanded`), in a process of its own. Here: the learner's plan from rank
    1's batch is rank 0's, and a process with another hash seed and thread count plans the seeded steps of
    test_every_row_once_the_same_passes_on_every_rank_the_budget_kept as this one does."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    cfg = OmegaConf.create(OmegaConf.to_container(compose(["generator=mock", "train.micro_batch_size=3"]),
                                                  resolve=True, enum_to_str=True))
    ro = build(cfg.generator, cfg=cfg).rollouts(list(range(8)), 0, compute=2000.0)
    learner = Learner(cfg, ranks=_RankZeroOfTwo())
    keep = ALL(ro.n)
    lengths, trained = ro.prompt_mask.sum(1) + ro.lengths, ro.mask.any(1)
    mine = learner.step_plan(lengths, trained)
    rows = torch.tensor(mine.rows(1))
    sent = ro.rows_only(rows).expanded(rows)  # what rank 1 steps on
    theirs = learner.step_plan(sent.prompt_mask.sum(1) + sent.lengths, (sent.mask & keep[:, None]).any(1))
    assert theirs == mine and mine.passes[1] and len(set(map(len, mine.passes))) == 1

    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONHASHSEED="12345", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", PLAN_IN_ANOTHER_PROCESS, root], env=env, capture_output=True,
                          text=True, timeout=300, check=True)
    there = json.loads(done.stdout)
    for key, (padded, packed) in there.items():
        seed, world = map(int, key.split())
        lengths, trained = _lengths(seed, 200), torch.from_numpy(np.random.default_rng(seed + 100).random(200) < 0.8)
        assert plan.padded(lengths, trained, world, 32768, 6).passes == padded, key
        assert plan.packed(lengths, trained, world, 32768).passes == packed, key


def test_the_retired_cut_takes_rows_longest_first_within_the_row_and_token_caps(retired):
    lengths = torch.tensor([5, 9, 2, 9, 7, 1])
    trained = torch.tensor([True, True, True, True, True, False])  # row 5 has nothing in the loss
    as_lists = lambda batches: [b.tolist() for b in batches]  # noqa: E731
    assert as_lists(retired.micro_batches(lengths, trained, max_rows=2)) == [[1, 3], [4, 0], [2]]
    # 20 tokens: two rows of 9 (18) fit, a third does not (27); then 7 + 5 padded to 7 (14), a third 21
    assert as_lists(retired.micro_batches(lengths, trained, max_rows=10, max_tokens=20)) == [[1, 3], [4, 0], [2]]
    assert as_lists(retired.micro_batches(lengths, trained, max_rows=10, max_tokens=8)) == [[1], [3], [4], [0], [2]]
    assert as_lists(retired.micro_batches(lengths, trained, max_rows=10, max_tokens=100)) == [[1, 3, 4, 0, 2]]
    assert retired.micro_batches(lengths, torch.zeros(6, dtype=torch.bool), max_rows=4) == []
