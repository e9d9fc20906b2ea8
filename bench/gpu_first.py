"""What only a GPU can show, in at most 3 minutes: gpu_check.py's first step (docs/testing.md#gpu-minutes).

1. attention: a Llama-3-shaped decoder (32 heads, 8 K/V heads, 2 layers of Llama-3.1-8B's width) through the
   learner, one row of 8k and of 16k tokens, bf16 compute under sdpa_kernel([FLASH_ATTENTION]) and fp32 compute under
   sdpa_kernel([EFFICIENT_ATTENTION]): each raises where its kernel is not eligible; a second step's peak memory
   (AdamW's moments made by the first) beside the memory model's estimate of that micro-batch (ablate/memory.py);
2. the LM head's weight gradient at 1 and 32 chunks against fp64, on the GPU's own kernels (tensor cores);
3. the fp32 head (bf16 operands into fp32) against fp32_exact (fp32 operands): seconds forward and backward at
   V 128,256, H 4,096, 16,384 tokens;
4. FSDP2 on one rank (NCCL) with the fp32 head: its step's loss and weights against one process's;
5. the learner at a paper-like length mix (a Llama-3.2-1B-shaped model, rows of lognormal lengths up to 8k) beside
   plain transformers (fp32 weights, bf16 autocast, sdpa, the loss over the full vocabulary, fused AdamW) on the
   same micro-batches: tokens/s and 6N-MFU;
6. the CUDA context: what the process holds outside torch's allocator, against the memory model's figure.

    python bench/gpu_first.py            # on a GPU: one table, exit 1 if a check failed
    python bench/gpu_first.py --small    # on a CPU: the same code at toy shapes, to check it runs
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time

import torch
from omegaconf import OmegaConf

from ablate import cost, memory
from ablate.config import compose
from ablate.policy import build_policy
from ablate.rl import precision
from ablate.rollouts import Rollouts
from retired_plan import micro_batches
from ablate.trainer import Learner
from bench_gpu import estimate_bytes

LLAMA3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
             "vocab_size": 128256, "tie_word_embeddings": False}
LLAMA3_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
             "vocab_size": 128256, "tie_word_embeddings": True, "num_hidden_layers": 16}
SMALL = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
         "vocab_size": 4096}


class Checks:
    """The table's rows: (part, case, figure, verdict); `ok` false once any verdict failed."""

    def __init__(self):
        self.rows, self.ok = [], True

    def add(self, part: str, case: str, figure: str, passed: bool | None = None) -> None:
        self.rows.append((part, case, figure, "-" if passed is None else "ok" if passed else "FAILED"))
        self.ok &= passed is not False
        print(f"{part}: {case}: {figure} {'' if passed is None else 'ok' if passed else 'FAILED'}", flush=True)

    def table(self) -> str:
        rows = [("part", "case", "figure", "check"), *self.rows]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _folder(shape: dict, layers: int) -> str:
    """A config.json of this shape (no weights: the model is made from it with random ones)."""
    import transformers

    folder = tempfile.mkdtemp(prefix="gpu-first-")
    transformers.LlamaConfig(**{"num_hidden_layers": layers, "max_position_embeddings": 131072,
                                "rope_theta": 500000.0, **shape}).save_pretrained(folder)
    return folder


def _cfg(folder: str, device: torch.device, dtype: str, *overrides: str):
    cfg = compose(["experiment=paper_8b", "run=one_process", "run.trainer_gpus=1", "run.generator_gpus=0",
                   f"model.path={folder}", f"model.dtype={dtype}", f"model.device={device.type}",
                   "optim.warmup_steps=1", *overrides])
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))


def _rollouts(lengths: list[int], prompt: int, vocab: int, device: torch.device, seed: int = 0) -> Rollouts:
    """Rows of `prompt` prompt tokens and these completion lengths (random tokens; rewards 0 and 1 in turn)."""
    g = torch.Generator().manual_seed(seed)
    n, width = len(lengths), max(lengths)
    lengths_t = torch.tensor(lengths)
    mask = torch.arange(width)[None, :] < lengths_t[:, None]
    tokens = torch.randint(3, vocab, (n, width), generator=g) * mask
    return Rollouts(prompt_ids=torch.arange(n) // 2, group=torch.arange(n) // 2,
                    prompt_tokens=torch.randint(3, vocab, (n, prompt), generator=g),
                    prompt_mask=torch.ones(n, prompt, dtype=torch.bool), tokens=tokens, mask=mask,
                    gen_logprobs=-torch.rand(n, width, generator=g) * mask, versions=torch.zeros_like(tokens),
                    lengths=lengths_t, rewards=(torch.arange(n) % 2).float(),
                    correct=torch.zeros(n, dtype=torch.bool), truncated=torch.zeros(n, dtype=torch.bool)).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gb(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else float("nan")


def _kernel(device: torch.device, dtype: str):
    """Only FlashAttention (bf16) or only the memory-efficient kernel (fp32): SDPA raises where it is not eligible."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION if dtype == "bfloat16" else SDPBackend.EFFICIENT_ATTENTION])


def attention(checks: Checks, device: torch.device, small: bool) -> None:
    folder = _folder(SMALL if small else LLAMA3_8B, layers=2)
    for dtype in ("bfloat16", "float32"):
        kernel = "flash" if dtype == "bfloat16" else "memory-efficient"
        for tokens in ((512, 1024) if small else (8192, 16384)):
            cfg = _cfg(folder, device, dtype)
            learner = Learner(cfg, build_policy(cfg.model, read_weights=False))
            ro = _rollouts([tokens - 256] * 2, 256, learner.policy.config.vocab_size, device)
            keep = torch.ones(ro.n, dtype=torch.bool, device=device)
            try:
                with _kernel(device, dtype):
                    learner.step(ro, ro.rewards, keep)  # AdamW's moments made: the steady state the model counts
                    _reset(device)
                    _sync(device)
                    began = time.perf_counter()
                    learner.step(ro, ro.rewards, keep)
                    _sync(device)
                seconds = time.perf_counter() - began
                peak, model = _peak_gb(device), estimate_bytes(cfg, ro) / 1e9  # the micro-batch's
                checks.add("attention", f"{dtype} {kernel}, 2 rows x {tokens}",
                           f"{seconds:.2f} s, peak {peak:.1f} GB, memory model {model:.1f}",
                           passed=math.isnan(peak) or peak <= model * 1.1)
            except RuntimeError as why:  # no eligible kernel: sdpa_kernel raises
                checks.add("attention", f"{dtype} {kernel}, 2 rows x {tokens}", str(why).splitlines()[0][:90],
                           passed=False)
            del learner


def _grad_error(chunks: int, device: torch.device, tokens: int, H: int, V: int) -> float:
    torch.manual_seed(0)
    hidden = torch.randn(tokens, H, device=device, dtype=torch.float64)
    weight = torch.randn(V, H, device=device, dtype=torch.float64) * 3 / H ** 0.5
    targets = torch.randint(0, V, (tokens,), device=device)
    upstream = torch.randn(tokens, device=device, dtype=torch.float64)
    w64 = weight.clone().requires_grad_()
    logits = hidden @ w64.T
    ((logits.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(logits, -1)) * upstream).sum().backward()
    del logits
    w = weight.float().requires_grad_()
    logp = precision.fp32_head(hidden.float(), w, targets, operands=torch.bfloat16, chunk_size=tokens // chunks)
    (logp * upstream.float()).sum().backward()
    return float((w.grad.double() - w64.grad).norm() / w64.grad.norm())


def head_gradient(checks: Checks, device: torch.device, small: bool) -> None:
    tokens, H, V = (2048, 128, 2048) if small else (8192, 4096, 32768)
    one, many = _grad_error(1, device, tokens, H, V), _grad_error(32, device, tokens, H, V)
    checks.add("head gradient", f"fp32_head (bf16 operands), V {V}, H {H}, {tokens} tokens",
               f"vs fp64: {one:.2e} at 1 chunk, {many:.2e} at 32", passed=many <= 1.5 * one)


def head_speed(checks: Checks, device: torch.device, small: bool) -> None:
    tokens, H, V = (1024, 128, 4096) if small else (16384, 4096, 128256)
    torch.manual_seed(0)
    hidden = torch.randn(tokens, H, device=device)
    weight = (torch.randn(V, H, device=device) * 0.02).requires_grad_()
    targets = torch.randint(0, V, (tokens,), device=device)
    times = {}
    for name, head in (("fp32_head", precision.fp32_head), ("fp32_exact", precision.fp32_exact)):
        for attempt in range(2):  # the first warms up
            weight.grad = None
            h = hidden.clone().requires_grad_()
            _reset(device)
            _sync(device)
            began = time.perf_counter()
            head(h, weight, targets, operands=torch.bfloat16).sum().backward()
            _sync(device)
            times[name] = (time.perf_counter() - began, _peak_gb(device))
    (fused, fused_gb), (exact, exact_gb) = times["fp32_head"], times["fp32_exact"]
    checks.add("head speed", f"V {V}, H {H}, {tokens} tokens, forward + backward",
               f"fp32_head {fused:.3f} s ({fused_gb:.1f} GB), fp32_exact {exact:.3f} s ({exact_gb:.1f} GB): "
               f"{exact / fused:.1f}x")


def fsdp_one_rank(checks: Checks, device: torch.device, small: bool) -> None:
    import torch.distributed as dist

    from ablate.distributed.layouts import FSDP

    folder = _folder(SMALL if small else {**LLAMA3_8B, "vocab_size": 32768}, layers=2)
    cfg = _cfg(folder, device, "bfloat16")
    ro = _rollouts([700, 300, 1500, 900] if not small else [40, 20, 60, 30], 128 if not small else 16,
                   cfg.model.get("vocab_size") or 4096, device)
    keep = torch.ones(ro.n, dtype=torch.bool, device=device)
    results = []
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1, device_id=torch.device("cuda", torch.cuda.current_device())
                            if device.type == "cuda" else None)
    try:
        for ranks in (None, FSDP(trainer_gpus=1)):
            learner = Learner(cfg, build_policy(cfg.model, read_weights=False), ranks=ranks)
            loss = learner.step(ro, ro.rewards, keep)["loss/policy"]
            whole = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in learner.policy.parameters()]
            results.append((loss, [p.detach().float().cpu().flatten()[:100_000] for p in whole]))
            del learner
    finally:
        dist.destroy_process_group()
    (one, w_one), (fsdp, w_fsdp) = results
    moved = max(float((a - b).abs().max()) for a, b in zip(w_one, w_fsdp))
    checks.add("FSDP2, 1 rank", "fp32 head, bf16 layers, NCCL" if device.type == "cuda" else "gloo",
               f"loss {fsdp:.6f} vs one process {one:.6f}; weights after the step within {moved:.1e}",
               passed=abs(fsdp - one) <= 1e-3 * max(abs(one), 1e-3) + 1e-5 and moved < 1e-5)


def _mix(rows: int, cap: int, seed: int = 0) -> list[int]:
    """Completion lengths as a reasoning run's: lognormal (median a fifth of the cap), cut at the cap."""
    g = torch.Generator().manual_seed(seed)
    drawn = torch.exp(torch.randn(rows, generator=g) * 0.8 + math.log(cap / 5))
    return [max(16, min(cap, int(x))) for x in drawn]


def _plain_step(model, optimizer, ro: Rollouts, batches: list[torch.Tensor]) -> None:
    """Plain transformers on the same micro-batches: rows right-padded to the micro-batch's longest, causal (no mask:
    padding follows the real tokens), the loss over the full vocabulary's log-softmax of the completion tokens."""
    for rows in batches:
        prompt, comp = ro.prompt_tokens[rows], ro.tokens[rows, :int(ro.lengths[rows].max())]
        ids = torch.cat([prompt, comp], dim=1)
        with torch.autocast(ids.device.type, dtype=torch.bfloat16):
            logits = model(input_ids=ids, use_cache=False).logits[:, prompt.shape[1] - 1:-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, comp[..., None])[..., 0]
        (-(logp * ro.mask[rows, :comp.shape[1]]).sum() / 1e4).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def learner_speed(checks: Checks, device: torch.device, small: bool) -> None:
    shape = {**SMALL, "num_hidden_layers": 2} if small else LLAMA3_1B
    folder = _folder({k: v for k, v in shape.items() if k != "num_hidden_layers"}, shape["num_hidden_layers"])
    rows, cap, budget = (16, 256, 1024) if small else (64, 7936, 16384)
    cfg = _cfg(folder, device, "bfloat16", f"train.micro_batch_tokens={budget}", "train.micro_batch_size=1024",
               "train.activation_checkpointing=false")
    lengths = _mix(rows, cap)
    ro = _rollouts(lengths, 256 if not small else 16, shape["vocab_size"], device)
    tokens = float(ro.prompt_mask.sum() + ro.lengths.sum())
    keep = torch.ones(ro.n, dtype=torch.bool, device=device)
    learner = Learner(cfg, build_policy(cfg.model, read_weights=False))
    n_params = sum(p.numel() for p in learner.policy.parameters())
    batches = micro_batches(ro.prompt_mask.sum(dim=1) + ro.lengths, keep, 1024, budget)
    # the device's kind's dense bf16 peak, the cost model's (ablate.cost.PEAK_TFLOPS); no MFU for another kind
    peak = (cost.peak_tflops(torch.cuda.get_device_name(device)) or math.nan) if device.type == "cuda" else math.nan
    for name in ("ours", "plain transformers"):
        if name == "ours":
            step = lambda: learner.step(ro, ro.rewards, keep)  # noqa: E731
        else:
            del learner
            model = build_policy(cfg.model, read_weights=False)
            model.config._attn_implementation = "sdpa"
            optimizer = torch.optim.AdamW(model.parameters(), lr=5e-7, fused=device.type == "cuda")
            step = lambda: _plain_step(model, optimizer, ro, batches)  # noqa: E731
        times = []
        for _ in range(3):  # the first warms up
            _reset(device)
            _sync(device)
            began = time.perf_counter()
            step()
            _sync(device)
            times.append(time.perf_counter() - began)
        seconds = sum(times[1:]) / 2
        checks.add("learner", f"{name}, {rows} rows <= {cap} (mean {sum(lengths) / rows:.0f}), {len(batches)} "
                   f"micro-batches of <= {budget}", f"{seconds:.2f} s/step, {tokens / seconds:,.0f} tokens/s, "
                   f"MFU {6 * n_params * tokens / seconds / (peak * 1e12):.1%}, peak {_peak_gb(device):.1f} GB")


def cuda_context(checks: Checks, device: torch.device, small: bool) -> None:
    """What the process holds on the GPU outside torch's allocator after the parts above (CUDA's context, its loaded
    kernels, cuBLAS's workspaces): the device's used memory less torch's reserved, against the memory model's
    figure for an engine process (memory.CUDA_CONTEXT, measured so on an H200)."""
    if device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info()
    outside = (total - free - torch.cuda.memory_reserved()) / 1e9
    stated = memory.CUDA_CONTEXT / memory.GB
    checks.add("CUDA context", "device used - torch reserved, after the parts above",
               f"{outside:.2f} GB (the memory model: {stated:.2f})", passed=outside <= 1.25 * stated)


PARTS = {"attention": attention, "head-gradient": head_gradient, "head-speed": head_speed, "fsdp": fsdp_one_rank,
         "learner": learner_speed, "context": cuda_context}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="toy shapes (a CPU)")
    parser.add_argument("--parts", default=",".join(PARTS))
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}",
          flush=True)
    checks, began = Checks(), time.perf_counter()
    for part in args.parts.split(","):
        try:
            PARTS[part](checks, device, args.small)
        except Exception as why:  # noqa: BLE001 - one part's failure is a row; the others still run
            checks.add(part, "raised", f"{type(why).__name__}: {str(why).splitlines()[0][:120]}", passed=False)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"\n{checks.table()}\n({time.perf_counter() - began:.0f} s)")
    return 0 if checks.ok else 1


if __name__ == "__main__":
    sys.exit(main())
