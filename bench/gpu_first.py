"""What only a GPU can show, part by part, one table (bench/gpu_check.py's steps; docs/testing.md#gpu-minutes).

The packed learner's kernels and its compiled step (gpu_check.py's first and third steps), then the kernels, head,
FSDP2 and learner checks (its fourth):

1. varlen: torch's varlen attention on this GPU's torch, called directly as its version takes it (2.10's
   `is_causal`, 2.11's tuple `window_size`, 2.13's `enable_gqa`), on one packed pass of ~65,536 tokens at
   Llama-3-8B's attention (32 heads, 8 K/V heads, head dim 128): grouped K/V as they are, K/V repeated to the query's
   heads, and SDPA row by row (the learner's fall-back, `ablate.policy._by_row`), forward and backward in bf16, each
   against an fp32 reference (the largest error of its output and of each gradient) and timed, varlen's custom op
   counted in a profile of each call; then the learner's own packed attention, which must be varlen where the
   project's rule (policy.packs_rows) says it runs: a row-by-row fall-back there fails. Without the kernel (a CPU)
   the check says "varlen: not available on cpu" and counts that the row-by-row path ran;
2. compiled: a packed learner with compiled decoder layers (run.compile_layers=true) beside an eager one from the
   same weights, on rows of new lengths each step: the compile's seconds, the steady ones, dynamo's graphs, graph
   breaks and recompiles, each step's loss against the eager one's, varlen counted in a profiled step;
3. attention: a Llama-3-shaped decoder (32 heads, 8 K/V heads, 2 layers of Llama-3.1-8B's width) through the
   learner, two rows of 8k and of 16k tokens: bf16 compute packed (one pass, varlen's kernel, counted: no SDPA call
   is made, so no SDPA backend is forced) and fp32 compute padded under sdpa_kernel([EFFICIENT_ATTENTION]) (it raises
   where that kernel is not eligible); a second step's peak memory (AdamW's moments made by the first) beside the
   memory model's estimate of that pass (ablate/memory.py);
4. the LM head's weight gradient at 1 and 32 chunks against fp64, on the GPU's own kernels (tensor cores);
5. the fp32 head (bf16 operands into fp32) against fp32_exact (fp32 operands): seconds forward and backward at
   V 128,256, H 4,096, 16,384 tokens;
6. FSDP2 on one rank (NCCL) with the fp32 head: its step's loss and weights against one process's;
7. the learner at a paper-like length mix (a Llama-3.2-1B-shaped model, rows of lognormal lengths up to 8k), the same
   rows three ways, each labelled by its plan: ours packed, ours padded (run.packed_rows=false), and plain
   transformers (fp32 weights, bf16 autocast, sdpa, the loss over the full vocabulary, fused AdamW) on the padded
   form's very passes: tokens/s (real tokens) and 6N-MFU. Plain against ours padded is like for like; ours packed
   against them is what packing buys on these rows;
8. the CUDA context: what the process holds outside torch's allocator, against the memory model's figure.

    python bench/gpu_first.py                      # on a GPU: one table, exit 1 if a check failed
    python bench/gpu_first.py --parts varlen       # one part (gpu_check.py's steps choose theirs)
    python bench/gpu_first.py --small              # on a CPU: the same code at toy shapes, to check it runs
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import inspect
import math
import os
import sys
import tempfile
import time

import torch
from omegaconf import OmegaConf

from ablate import cost, memory
from ablate.config import compose
from ablate import policy
from ablate.policy import build_policy
from ablate.rl import precision
from ablate.rollouts import Rollouts
from ablate.trainer import Learner
from bench_gpu import (attention_calls, attention_verdict, compile_counts, compile_reset, estimate_bytes,
                       plan_label, varlen_expected)

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


def _mix(rows: int, cap: int, seed: int = 0) -> list[int]:
    """Completion lengths as a reasoning run's: lognormal (median a fifth of the cap), cut at the cap."""
    g = torch.Generator().manual_seed(seed)
    drawn = torch.exp(torch.randn(rows, generator=g) * 0.8 + math.log(cap / 5))
    return [max(16, min(cap, int(x))) for x in drawn]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gb(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else float("nan")


# ------------------------------------------------------------------------------- the packed learner's kernels
def _varlen_attn():
    """torch's varlen attention where this torch has it (torch.nn.attention.varlen, 2.10 on), else None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def varlen_here(device: torch.device) -> bool:
    """Whether torch's varlen kernel can run here: on CUDA (its kernels are FlashAttention's), where this torch has
    the module."""
    return device.type == "cuda" and _varlen_attn() is not None


def call_varlen(varlen_attn, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bounds: torch.Tensor,
                longest: int) -> torch.Tensor:
    """`varlen_attn` as its version takes it, causal within each row, at its default scale (1/sqrt(head dim)):
    torch 2.10's `is_causal=True` (it has no scale and no window), 2.11 and 2.13's `window_size=(-1, 0)` (a tuple: a
    list turns causality off); grouped K/V (fewer heads than the query's) with `enable_gqa=True` where it exists
    (2.13), as they are where it does not (2.10's and 2.11's wrappers check no heads; FlashAttention takes them).
    query [S, heads, D], key/value [S, K/V heads, D], bounds int32 [rows + 1] on their device, longest a Python int."""
    takes = inspect.signature(varlen_attn).parameters
    if "window_size" in takes:
        causal = {"window_size": (-1, 0)}
    elif "is_causal" in takes:
        causal = {"is_causal": True}
    else:
        raise TypeError(f"varlen_attn{inspect.signature(varlen_attn)}: neither window_size nor is_causal")
    grouped = {"enable_gqa": True} if "enable_gqa" in takes and key.shape[1] != query.shape[1] else {}
    return varlen_attn(query, key, value, bounds, bounds, longest, longest, **causal, **grouped)


def _pass_rows(small: bool) -> list[int]:
    """One packed pass's rows: a reasoning mix (`_mix`) up to 65,536 tokens; a few short rows at --small."""
    if small:
        return [37, 5, 60, 18]
    rows, total = [], 0
    for length in _mix(96, 8192, seed=1):
        if total + length > 65536:
            break
        rows.append(length)
        total += length
    return rows


def _attend(form: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor, longest: int,
            upstream: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One form's output and its gradients (query, key, value) for `upstream`: "grouped" and "repeated" through
    torch's varlen, "by row" through the learner's fall-back (`ablate.policy._by_row`: SDPA on each row's slice)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    if form == "by row":
        out = policy._by_row(q, k, v, bounds, longest, None)
    else:
        kk, vv = (k, v) if form == "grouped" else (t.repeat_interleave(groups, dim=1) for t in (k, v))
        out = call_varlen(_varlen_attn(), q, kk, vv, bounds, longest)
    out.backward(upstream)
    return out.detach(), q.grad, k.grad, v.grad


def _error(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> float:
    """The largest error of the output and of each gradient, each relative to its reference's largest value."""
    return max(float((g.float() - w).abs().max() / w.abs().max().clamp_min(1e-30)) for g, w in zip(got, want))


def _timed(form: str, q, k, v, bounds, longest: int, upstream, want, device: torch.device
           ) -> tuple[float, float, dict[str, int]]:
    """One form (`_attend`) warmed up, then timed over 3 calls (forward and backward), then profiled once: its error
    against `want`, its seconds a call, the attention ops it called."""
    _attend(form, q, k, v, bounds, longest, upstream)
    _sync(device)
    began = time.perf_counter()
    for _ in range(3):
        got = _attend(form, q, k, v, bounds, longest, upstream)
    _sync(device)
    seconds = (time.perf_counter() - began) / 3
    calls = attention_calls(functools.partial(_attend, form, q, k, v, bounds, longest, upstream))[1]
    return _error(got, want), seconds, calls


def varlen_kernels(checks: Checks, device: torch.device, small: bool) -> None:
    """Module docstring, 1: the kernel called directly, then the learner's packed attention."""
    heads, kv_heads, dim = (4, 2, 16) if small else (32, 8, 128)
    rows = _pass_rows(small)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    total, longest = sum(rows), max(rows)
    bounds = torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q, k, v, upstream = (torch.randn(total, n, dim, generator=g, device=device, dtype=dtype)
                         for n in (heads, kv_heads, kv_heads, heads))
    case = f"{len(rows)} rows, {total:,} tokens (<= {longest:,}), {heads}/{kv_heads} heads x {dim}, {str(dtype)[6:]}"
    want = _attend("by row", q.float(), k.float(), v.float(), bounds, longest, upstream.float())  # fp32 reference
    forms = ["by row", "grouped", "repeated"] if varlen_here(device) else ["by row"]  # by row: the bar
    if len(forms) == 1:
        checks.add("varlen", case, f"varlen: not available on {device.type}" if device.type != "cuda" else
                   f"varlen: not in torch {torch.__version__}")
    errors = {}
    for form in forms:
        try:
            errors[form], seconds, calls = _timed(form, q, k, v, bounds, longest, upstream, want, device)
        except Exception as why:  # noqa: BLE001 - one form's failure is a row; the next still runs
            checks.add("varlen", f"{form}: {case}", f"{type(why).__name__}: {str(why).splitlines()[0][:120]}",
                       passed=False)
            continue
        ran = (calls["varlen"] >= 1 and calls["varlen backward"] >= 1 and not calls["sdpa"]) if form != "by row" \
            else (calls["sdpa"] == len(rows) and not calls["varlen"])
        # as good as SDPA row by row in the same dtype, against fp32 (a lost causal window is ~100x off)
        close = form == "by row" or errors[form] <= 2 * errors.get("by row", 0.0) + 1e-3
        checks.add("varlen", f"{form}: {case}", f"{seconds * 1e3:.1f} ms forward + backward, error vs fp32 "
                   f"{errors[form]:.1e} (output and gradients); varlen x{calls['varlen']} (backward "
                   f"x{calls['varlen backward']}), SDPA x{calls['sdpa']}", passed=ran and close)
    packed_attention(checks, device, small)


def packed_attention(checks: Checks, device: torch.device, small: bool) -> None:
    """The learner's packed attention here (run.packed_rows=true, one step of a 2-layer model): which kernel ran
    against what the project's rule says runs here (bench_gpu.attention_verdict)."""
    folder = _folder({**(SMALL if small else LLAMA3_1B), "num_hidden_layers": 2}, layers=2)
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    cfg = _cfg(folder, device, dtype, "run.packed_rows=true", "train.activation_checkpointing=false")
    learner = Learner(cfg, build_policy(cfg.model, read_weights=False))
    lengths = [40, 12, 64] if small else [4000, 900, 2500]
    ro = _rollouts(lengths, 16, learner.policy.config.vocab_size, device)
    keep = torch.ones(ro.n, dtype=torch.bool, device=device)
    calls = attention_calls(functools.partial(learner.step, ro, ro.rewards, keep))[1]
    said, right = attention_verdict(calls, True, device, getattr(torch, dtype))
    checks.add("varlen", f"the learner's packed attention, {dtype}, {len(lengths)} rows, 2 layers", said,
               passed=right)


def compiled_step(checks: Checks, device: torch.device, small: bool) -> None:
    """Module docstring, 2: a compiled packed learner beside an eager one (the same weights, the same rows: 3
    steps of new lengths, then a profiled fourth)."""
    shape = {**SMALL, "num_hidden_layers": 2} if small else {**LLAMA3_1B, "num_hidden_layers": 4}
    folder = _folder({k: v for k, v in shape.items() if k != "num_hidden_layers"}, shape["num_hidden_layers"])
    rows, cap, budget = (6, 96, 256) if small else (24, 7936, 32768)
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    cfg = _cfg(folder, device, dtype, "run.packed_rows=true", f"train.micro_batch_tokens={budget}",
               "train.micro_batch_size=1024", "train.activation_checkpointing=false")
    steps = [_rollouts(_mix(rows, cap, seed=i), 16 if small else 256, shape["vocab_size"], device, seed=i)
             for i in range(4)]
    compile_reset()
    eager = Learner(cfg, build_policy(cfg.model, read_weights=False))
    compiled = Learner(OmegaConf.merge(cfg, {"run": {"compile_layers": True}}), build_policy(cfg.model,
                                                                                             read_weights=False))
    times, losses, calls = {"eager": [], "compiled": []}, {"eager": [], "compiled": []}, {}
    for i, ro in enumerate(steps):
        keep = torch.ones(ro.n, dtype=torch.bool, device=device)
        for name, learner in (("eager", eager), ("compiled", compiled)):
            _sync(device)
            began = time.perf_counter()
            if i < 3:
                metrics = learner.step(ro, ro.rewards, keep)
            else:
                metrics, calls = attention_calls(functools.partial(learner.step, ro, ro.rewards, keep))
            _sync(device)
            times[name].append(time.perf_counter() - began)
            losses[name].append(metrics["loss/policy"])
    counts = compile_counts()
    steady = {name: sum(t[1:3]) / 2 for name, t in times.items()}
    diff = max(abs(c - e) for c, e in zip(losses["compiled"], losses["eager"]))
    scale = max(abs(e) for e in losses["eager"])
    case = f"{shape['num_hidden_layers']} layers, {rows} rows <= {cap} a step, {dtype}"
    checks.add("compiled", f"packed, {case}", f"compile {times['compiled'][0] - steady['compiled']:.1f} s (first "
               f"step {times['compiled'][0]:.1f} s), steady {steady['compiled']:.3f} s against eager "
               f"{steady['eager']:.3f} s", passed=None)
    varlen = varlen_expected(device, getattr(torch, dtype))
    breaks = f" (the first: {counts['break']})" if counts["breaks"] else ""
    recompiles = f" (the first: {counts['recompile']})" if counts["recompiles"] else ""
    checks.add("compiled", "dynamo", f"{counts['graphs']} graphs, {counts['breaks']} graph breaks{breaks}, "
               f"{counts['recompiles']} recompiles{recompiles}",
               passed=counts["recompiles"] <= 1 and (counts["breaks"] == 0 or not varlen))
    checks.add("compiled", "loss against eager, 4 steps", f"largest |difference| {diff:.2e} (losses up to "
               f"{scale:.3g})", passed=diff <= 1e-2 * scale + 1e-6)
    said, right = attention_verdict(calls, True, device, getattr(torch, dtype))
    checks.add("compiled", "attention in a compiled step", said, passed=right)


def _kernel(device: torch.device, dtype: str, packed: bool):
    """Where SDPA runs (a padded pass), only FlashAttention (bf16) or only the memory-efficient kernel (fp32): SDPA
    raises where it is not eligible. A packed pass makes no SDPA call (varlen's kernel, counted instead): nothing to
    force there."""
    if device.type != "cuda" or packed:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION if dtype == "bfloat16" else SDPBackend.EFFICIENT_ATTENTION])


def attention(checks: Checks, device: torch.device, small: bool) -> None:
    folder = _folder(SMALL if small else LLAMA3_8B, layers=2)
    for dtype in ("bfloat16", "float32"):
        for tokens in ((512, 1024) if small else (8192, 16384)):
            cfg = _cfg(folder, device, dtype)
            learner = Learner(cfg, build_policy(cfg.model, read_weights=False))
            ro = _rollouts([tokens - 256] * 2, 256, learner.policy.config.vocab_size, device)
            keep = torch.ones(ro.n, dtype=torch.bool, device=device)
            planned = learner.step_plan((ro.prompt_mask.sum(dim=1) + ro.lengths).cpu(), keep.cpu())
            kernel = "varlen" if learner.packed else "flash" if dtype == "bfloat16" else "memory-efficient"
            case = f"{dtype}, {plan_label(planned)} (2 rows x {tokens}), {kernel}"
            try:
                with _kernel(device, dtype, learner.packed):
                    # AdamW's moments made: the steady state the model counts; its attention counted
                    _, calls = attention_calls(functools.partial(learner.step, ro, ro.rewards, keep))
                    _reset(device)
                    _sync(device)
                    began = time.perf_counter()
                    learner.step(ro, ro.rewards, keep)
                    _sync(device)
                seconds = time.perf_counter() - began
                peak, model = _peak_gb(device), estimate_bytes(cfg, ro, planned) / 1e9  # the pass's
                said, right = attention_verdict(calls, learner.packed, device, getattr(torch, dtype))
                checks.add("attention", case, f"{seconds:.2f} s, peak {peak:.1f} GB, memory model {model:.1f}; {said}",
                           passed=right and (math.isnan(peak) or peak <= model * 1.1))
            except RuntimeError as why:  # no eligible kernel: sdpa_kernel raises
                checks.add("attention", case, str(why).splitlines()[0][:90], passed=False)
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


def _plain_step(model, optimizer, ro: Rollouts, batches: list[torch.Tensor]) -> None:
    """Plain transformers on the given passes: rows right-padded to the pass's longest, causal (no mask: padding
    follows the real tokens), the loss over the full vocabulary's log-softmax of the completion tokens."""
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
    """The same rows three ways (module docstring, 7), each labelled by its plan; MFU counts the real tokens."""
    shape = {**SMALL, "num_hidden_layers": 2} if small else LLAMA3_1B
    folder = _folder({k: v for k, v in shape.items() if k != "num_hidden_layers"}, shape["num_hidden_layers"])
    rows, cap, budget = (16, 256, 1024) if small else (64, 7936, 16384)
    cfg = _cfg(folder, device, "bfloat16", f"train.micro_batch_tokens={budget}", "train.micro_batch_size=1024",
               "train.activation_checkpointing=false")
    lengths = _mix(rows, cap)
    ro = _rollouts(lengths, 256 if not small else 16, shape["vocab_size"], device)
    tokens = float(ro.prompt_mask.sum() + ro.lengths.sum())
    keep = torch.ones(ro.n, dtype=torch.bool, device=device)
    # the device's kind's dense bf16 peak, the cost model's (ablate.cost.PEAK_TFLOPS); no MFU for another kind
    peak = (cost.peak_tflops(torch.cuda.get_device_name(device)) or math.nan) if device.type == "cuda" else math.nan
    n_params = sum(p.numel() for p in build_policy(cfg.model, read_weights=False).parameters())

    def ours(packed: bool):
        learner = Learner(OmegaConf.merge(cfg, {"run": {"packed_rows": packed}}),
                          build_policy(cfg.model, read_weights=False))
        planned = learner.step_plan((ro.prompt_mask.sum(dim=1) + ro.lengths).cpu(), keep.cpu())
        return planned, lambda: learner.step(ro, ro.rewards, keep)

    def plain(passes: list[torch.Tensor]):
        model = build_policy(cfg.model, read_weights=False)
        model.config._attn_implementation = "sdpa"
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-7, fused=device.type == "cuda")
        return lambda: _plain_step(model, optimizer, ro, passes)

    def measure(name: str, label: str, packed: bool, step) -> None:
        times = []
        for attempt in range(3):  # the first warms up, its attention counted
            _reset(device)
            _sync(device)
            began = time.perf_counter()
            if attempt:
                step()
            else:
                calls = attention_calls(step)[1]
            _sync(device)
            times.append(time.perf_counter() - began)
        seconds = sum(times[1:]) / 2
        said, right = attention_verdict(calls, packed, device, torch.bfloat16)
        checks.add("learner", f"{name}, {label}; {rows} rows <= {cap} (mean {sum(lengths) / rows:.0f})",
                   f"{seconds:.2f} s/step, {tokens / seconds:,.0f} tokens/s, "
                   f"MFU {6 * n_params * tokens / seconds / (peak * 1e12):.1%}, peak {_peak_gb(device):.1f} GB; "
                   f"{said}", passed=None if right else False)

    planned, step = ours(packed=True)
    measure("ours", plan_label(planned), True, step)
    del step  # each form's model freed before the next is made
    gc.collect()
    planned, step = ours(packed=False)
    measure("ours", plan_label(planned), False, step)
    del step
    gc.collect()
    passes = [torch.tensor(batch, device=device) for batch in planned.passes[0] if batch]
    measure("plain transformers (sdpa)", f"ours padded's {len(passes)} passes", False, plain(passes))


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


PARTS = {"varlen": varlen_kernels, "compiled": compiled_step, "attention": attention, "head-gradient": head_gradient,
         "head-speed": head_speed, "fsdp": fsdp_one_rank, "learner": learner_speed, "context": cuda_context}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="toy shapes (a CPU)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which, in order: {', '.join(PARTS)}")
    args = parser.parse_args()
    unknown = [part for part in args.parts.split(",") if part not in PARTS]
    if unknown:
        raise SystemExit(f"--parts: {', '.join(unknown)}: none of {', '.join(PARTS)}")
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
