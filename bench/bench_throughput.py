"""Trainer throughput, ours against TRL's GRPOTrainer, in one run: the same tiny random model, the same 8 prompts x 8
samples per step, the same 24-token completion limit, one optimizer step per batch, one thread each.

Throughput = completion tokens generated (end-of-sequence included) per wall-clock second of whole RL steps
(generation, reward, loss, backward, optimizer), the first step left out as warm-up. The two are run in turns
(ours, TRL, ours, TRL, ...) so that noise on a shared machine hits both alike; the table gives each round.

    pip install -e '.[bench]'   # trl, datasets
    python bench/bench_throughput.py [--rounds 3] [--steps 12]

For a like-for-like step, ours runs with what TRL does here: no filtering (every sample is trained), plain
truncation at the limit (no thinking budget), no warm start, validation only at the ends (not timed).
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from common import run_trainer
from trl_grpo import trl_grpo_throughput

PROMPTS, SAMPLES, LIMIT = 8, 8, 24


def ours(steps: int) -> dict:
    run = run_trainer([
        f"train.steps={steps}", f"train.val_every={steps}", "task.warm_start_steps=0", "task.n_val_prompts=8",
        "task.val_samples=1", "filtering=none", "length_control=truncation", f"batch.prompts_per_step={PROMPTS}",
        f"batch.samples_per_prompt={SAMPLES}", "generation.max_think_tokens=16", "generation.max_answer_tokens=8",
        "train.micro_batch_size=64", "generator.max_waves=1", "train.checkpoint_every=100000"])
    (t0, _), *timed = run["steps"]
    # the last step's time includes the final validation: time the steps between the first and the last
    body = timed[:-1]
    tokens = sum(m["train/completion_tokens"] * PROMPTS * SAMPLES for _, m in body)
    return {"tokens_per_s": tokens / (body[-1][0] - t0), "seconds_per_step": (body[-1][0] - t0) / len(body),
            "mean_completion_length": tokens / (len(body) * PROMPTS * SAMPLES)}


def trl(steps: int) -> dict:
    from ablate.config import compose
    from ablate.policy import build_tokenizer
    from ablate.registry import build

    cfg = compose(["task.n_train_prompts=512"])
    task = build(cfg.task, tokenizer=build_tokenizer(cfg.model), seed=0)
    problems = [task.problem("train", i) for i in range(task.size("train"))]
    model = {"path": None, "vocab_size": 0, "hidden_size": cfg.model.hidden_size, "num_layers": cfg.model.num_layers,
             "num_heads": cfg.model.num_heads, "dtype": cfg.model.dtype}
    return trl_grpo_throughput(model_cfg=model, prompts=[p.prompt for p in problems],
                               answers=[p.answer for p in problems], prompts_per_step=PROMPTS,
                               samples_per_prompt=SAMPLES, max_completion_tokens=LIMIT, steps=steps, lr=3e-4, seed=0,
                               workdir=tempfile.mkdtemp(prefix="trl-"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'round':>5} {'ours tok/s':>11} {'TRL tok/s':>10} {'ratio':>6} {'ours s/step':>12} {'TRL s/step':>11} "
          f"{'ours len':>9} {'TRL len':>8}")
    ratios = []
    for r in range(args.rounds):
        a, b = ours(args.steps + 1), trl(args.steps)
        ratios.append(a["tokens_per_s"] / b["tokens_per_s"])
        print(f"{r + 1:>5} {a['tokens_per_s']:>11,.0f} {b['tokens_per_s']:>10,.0f} {ratios[-1]:>6.2f} "
              f"{a['seconds_per_step']:>12.3f} {b['seconds_per_step']:>11.3f} {a['mean_completion_length']:>9.1f} "
              f"{b['mean_completion_length']:>8.1f}", flush=True)
    ratios.sort()
    print(f"\nours / TRL tokens per second: median {ratios[len(ratios) // 2]:.2f} (min {ratios[0]:.2f}, "
          f"max {ratios[-1]:.2f}) over {args.rounds} rounds")


if __name__ == "__main__":
    main()
