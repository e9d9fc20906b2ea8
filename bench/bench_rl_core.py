"""RL core on CPU: (1) loss + aggregation forward and backward at the paper's batch (N=768 completions, T=4096);
(2) peak memory of the log-prob path with the fp32 LM head at a 128k vocabulary, chunked vs the full logits at once.

    python bench/bench_rl_core.py                 # both parts
    python bench/bench_rl_core.py --part loss     # only (1)
    python bench/bench_rl_core.py --part memory   # only (2)
Each memory case runs in its own process; the figure is its peak RSS above what its inputs take.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch


def bench_losses(N: int, T: int, repeats: int) -> None:
    from ablate.rl import aggregation, losses

    torch.manual_seed(0)
    lengths = torch.randint(T // 8, T + 1, (N,))
    mask = torch.arange(T)[None, :] < lengths[:, None]
    group = torch.arange(N) // 16  # 48 prompts x 16 completions
    old = -torch.rand(N, T) * 3
    base = old + 0.05 * torch.randn(N, T)
    adv = torch.randn(N)
    print(f"(1) loss + aggregation, forward + backward, N={N} T={T} ({int(mask.sum()):,} tokens), "
          f"{torch.get_num_threads()} threads; median of {repeats}")
    print(f"    {'loss':<6} {'aggregation':<12} {'fwd ms':>8} {'fwd+bwd ms':>11}")
    for loss_fn in (losses.cispo, losses.dapo, losses.gspo, losses.grpo):
        for aggregate in (aggregation.prompt_mean, aggregation.sample_mean, aggregation.token_mean):
            fwd, both = [], []
            for _ in range(repeats):
                logp = base.clone().requires_grad_(True)
                t0 = time.perf_counter()
                value = aggregate(loss_fn(logp, old, adv, mask), mask, group)
                t1 = time.perf_counter()
                value.backward()
                t2 = time.perf_counter()
                fwd.append(t1 - t0)
                both.append(t2 - t0)
            print(f"    {loss_fn.__name__:<6} {aggregate.__name__:<12} {sorted(fwd)[repeats // 2] * 1e3:>8.1f} "
                  f"{sorted(both)[repeats // 2] * 1e3:>11.1f}")


def memory_case(method: str, M: int, H: int, V: int, chunk: int) -> dict:
    """Runs in a child process: forward + backward of the selected log-probs, peak RSS above the inputs."""
    from ablate.rl.precision import fp32_head

    torch.manual_seed(0)
    hidden = torch.randn(M, H, requires_grad=True)
    weight = (0.02 * torch.randn(V, H)).requires_grad_(True)
    targets = torch.randint(0, V, (M,))
    weight.grad = torch.zeros_like(weight)  # the gradients' own storage counts as input
    hidden.grad = torch.zeros_like(hidden)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    if method == "chunked":
        logp = fp32_head(hidden, weight, targets, chunk_size=chunk)
    else:
        logp = torch.log_softmax(hidden @ weight.T, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    logp.sum().backward()
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mb": (peak - base) / 1024, "seconds": seconds, "logp_sum": float(logp.sum())}


def bench_memory(M: int, H: int, V: int, chunk: int) -> None:
    full_mb = M * V * 4 / 2**20
    print(f"(2) log-probs of {M} tokens, hidden {H}, vocab {V:,}, fp32 head, forward + backward "
          f"(one [tokens, vocab] fp32 tensor = {full_mb:,.0f} MB)")
    results = {}
    for method in ("full", "chunked"):
        code = (f"import json, sys; sys.path.insert(0, 'bench'); from bench_rl_core import memory_case; "
                f"print(json.dumps(memory_case({method!r}, {M}, {H}, {V}, {chunk})))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        results[method] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[method]
        label = f"chunked ({chunk} rows)" if method == "chunked" else "full logits"
        print(f"    {label:<20} peak {r['peak_mb']:>8,.0f} MB above inputs   {r['seconds']:.2f} s")
    ratio = results["full"]["peak_mb"] / max(results["chunked"]["peak_mb"], 1e-9)
    same = abs(results["full"]["logp_sum"] - results["chunked"]["logp_sum"]) / abs(results["full"]["logp_sum"])
    print(f"    full / chunked peak: {ratio:.1f}x; sums of log-probs agree to {same:.1e} (relative)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("loss", "memory", "all"), default="all")
    parser.add_argument("--N", type=int, default=768)
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--chunk", type=int, default=256)
    args = parser.parse_args()
    if args.part in ("loss", "all"):
        bench_losses(args.N, args.T, args.repeats)
    if args.part in ("memory", "all"):
        bench_memory(args.tokens, args.hidden, args.vocab, args.chunk)


if __name__ == "__main__":
    main()
