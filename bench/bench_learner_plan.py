"""The learner's plan (ablate/plan.py) on a ScaleRL-like step, no model: today's plan beside the balanced padded plan
and the balanced packed one, early, mid and late in training.

    python bench/bench_learner_plan.py                   # the paper preset's step: 768 rows, 16 ranks, 65,536 tokens
    python bench/bench_learner_plan.py --today-only      # today's plan alone (what ran before ablate/plan.py:
                                                         # bench/retired_plan.py)
    python bench/bench_learner_plan.py --ranks 8 --budget 32768 --kept 0.7

Prints, for each regime, the lengths' summary and for each plan: real / computed decoder tokens, real / computed
attention (sum of squared row lengths attended over), passes a rank, dummy passes, `imbalance` (the busiest rank's
work over the mean rank's, minus 1) and `lockstep` (each pass waiting for its slowest rank, as FSDP's collectives
do) and `paced` (the work summed over passes at the slowest rank's pace: what the step's time goes with), work being
decoder tokens plus attention at an 8B Llama's weight (ablate/plan.py: ATTENTION_8B); and the seconds it all took. Padded passes: at most 8 rows (train.micro_batch_size) and 65,536 padded tokens
(paper_8b's train.micro_batch_tokens); packed passes: at most 65,536 real tokens.

The length law (seeded; 48 prompts x 16 samples, every row trained unless --kept < 1): a prompt of lognormal length,
median 250 tokens (sigma 0.6, 32..2,048); its samples' thinking lognormal around the prompt's own median (the
regime's median x lognormal(0, 0.5): prompts differ in difficulty), the samples' sigma the regime's; a thinking over
its budget is interrupted there, the budget uniform in 10,240..12,288 a row (the interruption at 10-12k), and gets
the interruption's phrase (20 tokens); then an answer, lognormal, median 200 (sigma 0.8, at most 2,048). Regimes:
early: thinking median 1,500 tokens, sigma 0.9 (short completions, a long tail; 3% interrupted); mid: 4,000, sigma
0.7 (10%); late: 8,000, sigma 0.5 (long ones near the cap; 36%).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import retired_plan  # noqa: E402 - the plan the balanced ones replaced, beside this file
from ablate import plan  # noqa: E402

REGIMES = {"early": (1500, 0.9), "mid": (4000, 0.7), "late": (8000, 0.5)}  # thinking's median and sigma


def step_lengths(regime: str, prompts: int, samples: int, seed: int) -> torch.Tensor:
    """Every row's tokens (prompt + completion) of one step in `regime`, by the law in the docstring."""
    median, sigma = REGIMES[regime]
    rng = np.random.default_rng([seed, list(REGIMES).index(regime)])
    prompt = np.clip(np.round(rng.lognormal(np.log(250), 0.6, prompts)), 32, 2048).repeat(samples)
    own = (median * rng.lognormal(0.0, 0.5, prompts)).repeat(samples)  # each prompt's median: its difficulty
    think = np.round(rng.lognormal(np.log(own), sigma))
    budget = rng.integers(10240, 12289, prompts * samples)
    interrupted = think > budget
    think = np.where(interrupted, budget + 20, think)
    answer = np.clip(np.round(rng.lognormal(np.log(200), 0.8, prompts * samples)), 1, 2048)
    return torch.tensor(prompt + think + answer, dtype=torch.long)


def describe(lengths: torch.Tensor) -> str:
    n = lengths.double()
    q = torch.quantile(n, torch.tensor([0.5, 0.9], dtype=torch.float64)).tolist()
    return f"rows {len(n)}, tokens {int(n.sum()):,}: mean {n.mean():,.0f}, median {q[0]:,.0f}, p90 {q[1]:,.0f}, " \
           f"max {int(n.max()):,}"


def row(name: str, p: plan.Plan) -> str:
    return (f"  {name:<8} {p.real_tokens / 1e6:7.3f}M / {p.computed_tokens / 1e6:7.3f}M = {p.token_efficiency:5.3f}"
            f"   {p.attention_efficiency:5.3f}   {p.passes_per_rank:6d}   {p.dummies:6d}   {100 * p.imbalance:8.1f}%"
            f"   {100 * p.lockstep:7.1f}%   {p.paced / 1e6:6.3f}M")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--budget", type=int, default=65536, help="tokens a pass (padded: padded tokens)")
    parser.add_argument("--rows", type=int, default=8, help="rows a padded pass, at most")
    parser.add_argument("--kept", type=float, default=1.0, help="share of the rows trained (zero-variance filter)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--today-only", action="store_true", help="today's plan alone")
    a = parser.parse_args()
    print(f"{a.prompts} prompts x {a.samples} samples, {a.ranks} ranks, {a.budget:,} tokens a pass, padded passes "
          f"of at most {a.rows} rows; attention weighs {plan.ATTENTION_8B:.3g} decoder tokens per squared token; "
          f"seed {a.seed}")
    started = time.perf_counter()
    for regime in REGIMES:
        lengths = step_lengths(regime, a.prompts, a.samples, a.seed)
        kept = torch.rand(a.prompts, generator=torch.Generator().manual_seed(a.seed)) < a.kept
        trained = kept.repeat_interleave(a.samples)  # a prompt's rows kept or dropped together, as the filter does
        print(f"\n{regime}: thinking median {REGIMES[regime][0]:,}, sigma {REGIMES[regime][1]}; {describe(lengths)}"
              f"; trained {int(trained.sum())}")
        print(f"  {'plan':<8} {'decoder tokens real / computed':>31}   {'attn':>5}   {'passes':>6}   {'dummy':>6}"
              f"   {'imbalance':>9}   {'lockstep':>8}   {'paced':>7}")
        plans = {"today": retired_plan.round_robin(lengths, trained, a.ranks, a.budget, a.rows)}
        if not a.today_only:
            plans["padded"] = plan.padded(lengths, trained, a.ranks, a.budget, a.rows)
            plans["packed"] = plan.packed(lengths, trained, a.ranks, a.budget)
        for name, p in plans.items():
            print(row(name, p))
            for note in p.notes:
                print(f"           ({note})")
    print(f"\n{time.perf_counter() - started:.2f} s in all")


if __name__ == "__main__":
    main()
