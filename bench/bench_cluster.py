"""A cost model for the paper's LOO at its scale (no machine here has 80 GPUs): per variant, the step time, the
generator and trainer idle, the GPU-hours and the memory per GPU of `experiment=paper_8b` on 64 generator + 16
trainer GPUs, and for the whole sweep; beside the paper's 16,000 GPU-hours per LOO variant. A prediction, not a
measurement: its schedule is the reference clock's (ablate/compute.py), its throughputs and lengths are inputs, and
its defaults are the cost model's: raw vLLM's tokens/s measured on an H100, this learner's MFU as estimated, an SXM
H100's peak (ablate/cost.py, docs/design.md#the-cost-model).

    python bench/bench_cluster.py                       # paper_8b, H100 defaults
    python bench/bench_cluster.py --gen-tokens-per-s 400 --completion 9000 --kept 0.4
    python bench/bench_cluster.py --adaptive my_settle.json   # the adaptive sweep priced from another measurement

The adaptive sweep's column: each variant's expected share of its budget, from the rung at which it settled in the
mock's paper-shaped sweeps (bench/adaptive_settle.json, written by `bench_adaptive.py --settle-json`).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ablate.cost import (KEPT, PAPER_GPU_HOURS, PEAK_TFLOPS, PRICED_KIND, TRAIN_MFU, Throughput,  # noqa: E402
                         Work)
from ablate.cost import simulate as run_clock  # noqa: E402
from ablate.memory import (GB, Process, Shape, kv_bytes_per_token, largest_micro_batch,  # noqa: E402
                           layer_activation_bytes, micro_batch_tokens, staging_slack, trainer, vllm_engine, vllm_room)
from ablate.offpolicy import PipelineRL, PPOOffPolicy  # noqa: E402

SETTLED = Path(__file__).resolve().parent / "adaptive_settle.json"

@dataclass(frozen=True)
class Variant:
    name: str
    off_policy: object
    kept: float  # share of the rows trained


def variants(kept: float, k: int) -> list[Variant]:
    """ScaleRL and the LOO variants whose cost differs at this level of the model; the others cost what ScaleRL does
    (the loss, aggregation, normalization and head choices change a step's FLOPs by well under 1%; NPR changes which
    prompts are drawn, not how many). loo-lp's length penalty changes the completions' lengths in a way only a run
    shows: it is priced at the same lengths here (run the model again with its --completion to price it)."""
    pipeline, ppo = PipelineRL(k=k), PPOOffPolicy(k=k)
    return [Variant("scalerl", pipeline, kept), Variant("loo-8op", ppo, kept), Variant("loo-batch", pipeline, 1.0),
            *(Variant(name, pipeline, kept) for name in ("loo-dapo", "loo-savg", "loo-plan", "loo-fp32", "loo-lp",
                                                          "loo-npr"))]


def simulate(v: Variant, steps: int, gen_s: float, train_s: float, layout: tuple[int, int]) -> dict:
    """Run the reference clock over `steps` steps of constant work (GPU-seconds on one GPU per step)."""
    r = run_clock(v.off_policy, steps, gen_s, train_s * v.kept, layout)
    trainer_busy = steps * train_s * v.kept / layout[1]
    return {"gpu_hours": r.gpu_hours, "step_s": r.step_s, "gen_idle": r.generator_idle,
            "train_idle": max(1.0 - trainer_busy / (r.step_s * steps), 0.0), "wall_h": r.wall_h}


def sync_seconds(params: float, gb_per_s: float) -> float:
    """Seconds a generator GPU spends receiving a step's weights: 2 bytes (bf16) a parameter at `gb_per_s`."""
    return 2 * params / (gb_per_s * 1e9) if gb_per_s > 0 else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=float, default=8e9,
                   help="model parameters N (paper_8b: 8e9; the memory section takes Llama-3.1-8B's shape)")
    p.add_argument("--generators", type=int, default=64, help="generator GPUs (paper: 64)")
    p.add_argument("--trainers", type=int, default=16, help="trainer GPUs (paper: 16)")
    p.add_argument("--steps", type=int, default=1600, help="optimizer steps per run (experiment=paper_8b: 1,600)")
    p.add_argument("--prompts", type=int, default=48, help="prompts per step (paper: 48)")
    p.add_argument("--samples", type=int, default=16, help="completions per prompt (paper: 16)")
    p.add_argument("--prompt-len", type=float, default=400.0, help="mean prompt tokens (budget 2,048)")
    p.add_argument("--completion", type=float, default=8000.0, help="mean completion tokens (budget 14,336)")
    p.add_argument("--kept", type=float, default=KEPT,
                   help=f"share of rows zero-variance filtering keeps (default: ablate.cost.KEPT, {KEPT:g})")
    p.add_argument("--k", type=int, default=8, help="off-policy k (PipelineRL-k, PPO-off-policy-k)")
    p.add_argument("--gen-tokens-per-s", type=float, default=None,
                   help="generated tokens/s per generator GPU (default: the H100 anchor scaled by FLOPs)")
    p.add_argument("--train-mfu", type=float, default=TRAIN_MFU,
                   help=f"trainer 6N-MFU (default: this learner's, estimated: ablate.cost.TRAIN_MFU, {TRAIN_MFU:g})")
    p.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS[PRICED_KIND],
                   help=f"dense bf16 peak per GPU, TFLOP/s (default: an {PRICED_KIND}'s, ablate.cost.PEAK_TFLOPS)")
    p.add_argument("--sync-gb-per-s", type=float, default=20.0,
                   help="weight broadcast bandwidth to the generator GPUs, GB/s (0: no sync cost)")
    p.add_argument("--gpu-gb", type=float, default=85.0, help="memory per GPU, GB, as the device reports it (an \"80 GB\" H100: 85)")
    p.add_argument("--micro-rows", type=int, default=8, help="rows per micro-batch (train.micro_batch_size)")
    p.add_argument("--micro-tokens", type=int, default=65536,
                   help="tokens per micro-batch, padded, at most (train.micro_batch_tokens, paper_8b's; 0: no cap)")
    p.add_argument("--no-checkpointing", action="store_true",
                   help="train.activation_checkpointing=false (paper_8b: true)")
    p.add_argument("--max-len", type=int, default=16404, help="the longest row (memory.longest_row): paper_8b's "
                   "budgets, 16,384, and the interruption's phrase, 20 of Llama-3's tokens")
    p.add_argument("--utilization", type=float, default=0.5, help="vLLM's share of a GPU (gpu_memory_utilization)")
    p.add_argument("--direct", action="store_true", help="generator.weight_transfer=direct: no staged copy")
    p.add_argument("--waves", type=int, default=4, help="batches decoding at once (generator.max_waves)")
    p.add_argument("--adaptive", type=Path, default=SETTLED, help="where each variant settled (bench_adaptive.py)")
    a = p.parse_args()

    speed = Throughput.of(a.params, a.peak_tflops, a.train_mfu, a.gen_tokens_per_s)
    gen_tps, train_tps = speed.generate, speed.train
    rows = a.prompts * a.samples
    generated = rows * a.completion
    gen_s, train_s = Work(rows, a.prompt_len, a.completion).seconds(speed)  # one GPU's seconds, all rows trained
    sync_s = sync_seconds(a.params, a.sync_gb_per_s)
    gen_s += sync_s * a.generators  # every generator GPU receives instead of decoding
    layout = (a.generators, a.trainers)
    gpus = sum(layout)

    print(f"paper_8b on {gpus} GPUs ({a.generators} generating, {a.trainers} training), {a.steps} steps of "
          f"{a.prompts} x {a.samples} completions, {a.prompt_len:,.0f} + {a.completion:,.0f} tokens, "
          f"{a.kept:.0%} of rows kept")
    print(f"per GPU: generator {gen_tps:,.0f} tokens/s ({gen_tps * 2 * a.params / 1e12 / a.peak_tflops:.1%} MFU), "
          f"trainer {train_tps:,.0f} tokens/s ({a.train_mfu:.0%} MFU)")
    print(f"weight sync: {2 * a.params / 1e9:.0f} GB of bf16 to every generator GPU, {sync_s:.2f} s a step at "
          f"{a.sync_gb_per_s:g} GB/s (in the generation time below); each holds it twice (decoding + staging copy)")
    print(f"one step on the whole layout: generation {gen_s / a.generators:,.1f} s, training "
          f"{train_s * a.kept / a.trainers:,.1f} s ({train_s / a.trainers:,.1f} s for every row)\n")

    share = settled_shares(a.adaptive)
    print(f"{'variant':<10} {'step s':>8} {'gen idle':>9} {'trainer idle':>13} {'wall h':>8} {'GPU-hours':>10} "
          f"{'x scalerl':>10} {'x paper':>8} {'adaptive':>9}")
    total, adaptive, base = 0.0, 0.0, None
    for v in variants(a.kept, a.k):
        r = simulate(v, a.steps, gen_s, train_s, layout)
        base = base or r["gpu_hours"]
        total += r["gpu_hours"]
        adaptive += r["gpu_hours"] * share.get(v.name, 1.0)
        print(f"{v.name:<10} {r['step_s']:>8.1f} {r['gen_idle']:>9.1%} {r['train_idle']:>13.1%} {r['wall_h']:>8.1f} "
              f"{r['gpu_hours']:>10,.0f} {r['gpu_hours'] / base:>10.2f} {r['gpu_hours'] / PAPER_GPU_HOURS:>8.2f} "
              f"{r['gpu_hours'] * share.get(v.name, 1.0):>9,.0f}")
    print(f"\nthe sweep (9 variants): {total:,.0f} GPU-hours (paper: {9 * PAPER_GPU_HOURS:,.0f} at 16,000 each); "
          f"{9 * gpus} GPUs to run the variants side by side")
    if share:
        print(f"the adaptive sweep (sweep.adaptive=true), expected: {adaptive:,.0f} GPU-hours, {adaptive / total:.0%} "
              f"of the full sweep's (each variant's budget times its expected share, from {a.adaptive.name})")
    implied = generated * a.steps / (PAPER_GPU_HOURS * 3600 / gpus) / a.generators
    print(f"the paper's 16,000 GPU-hours over {a.steps} steps imply {implied:,.0f} generated tokens/s per generator "
          f"GPU at these lengths (if generation sets the pace)")
    print_memory(a, Shape())


def settled_shares(path: Path) -> dict[str, float]:
    """Per variant, the expected share of its budget an adaptive sweep spends on it: the rungs' fractions weighted
    by how many of the mock's sweeps stopped it there. {} when there is no such file."""
    import json

    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    fractions = data["rungs"]
    return {name: sum(n * f for n, f in zip(counts, fractions)) / max(sum(counts), 1)
            for name, counts in data["variants"].items()}


def print_memory(a, shape: Shape) -> None:
    """ablate/memory.py's estimate (what the check before submit reads) at these settings."""
    checkpointing = not a.no_checkpointing
    print(f"\nmemory per GPU ({a.gpu_gb:g} GB; an 8B Llama's decoder layer keeps "
          f"{layer_activation_bytes(shape, 2) / 1024:,.0f} KiB of activations per token in bf16):")
    mean = a.prompt_len + a.completion  # rows all of the mean length; rows up to the longest, as the check takes them
    for label, tokens in (("mean rows", micro_batch_tokens(a.micro_rows, a.micro_tokens, mean)),
                          ("longest rows", largest_micro_batch(a.micro_rows, a.micro_tokens, a.max_len))):
        m = trainer(shape, ranks=a.trainers, micro_tokens=tokens, checkpointing=checkpointing, compute=2, head=4)
        other = trainer(shape, ranks=a.trainers, micro_tokens=tokens, checkpointing=not checkpointing, compute=2,
                        head=4)
        verdict = "fits" if m.total <= a.gpu_gb * GB else "DOES NOT FIT"
        print(f"  trainer, {label} ({tokens:,.0f} tokens a micro-batch): {m.describe(a.gpu_gb)}: {verdict} "
              f"({'without' if checkpointing else 'with'} activation checkpointing: {other.total / GB:,.0f} GB)")
    rows_at_once = a.prompts * a.samples * a.waves / a.generators
    room = vllm_room(shape, compute=2, gpu_bytes=a.gpu_gb * GB, utilization=a.utilization)
    fits = max(room, 0.0) / (kv_bytes_per_token(shape, 2) * (a.prompt_len + a.completion))
    parts = vllm_engine(gpu_bytes=a.gpu_gb * GB, utilization=a.utilization)
    staged = {"staging copy of the weights": 2 * shape.params, "staging copy's fragmentation": staging_slack(shape, 2)}
    engine = Process("generator", parts if a.direct else {**parts, **staged})
    print(f"  {engine.describe(a.gpu_gb)}; vLLM's {a.utilization:g} of the GPU leaves at most {room / GB:.0f} GB of "
          f"KV cache: {fits:.0f} sequences of {a.prompt_len + a.completion:,.0f} tokens at once, of the "
          f"{rows_at_once:.0f} its {a.waves} waves start (the rest wait for room)")


if __name__ == "__main__":
    main()
