"""LM-head precision: the log-probs of the sampled tokens, from the hidden states, with the head in fp32 or bf16.

`head(hidden [.., H], weight [V, H], targets [..], *, bias=None, temperature=1, operands=None, chunk_size)
-> logp [..] float32`

One autograd Function (`_Head`) computes the logits chunk by chunk (`chunk_size` rows at a time) and recomputes each
chunk's in the backward: neither pass ever holds more than one chunk's [chunk_size, V] logits, instead of the whole
[N, T, V] (at V = 128k and 16k tokens that is 8 GB in fp32), and the weight's gradient is summed over the chunks in
one fp32 [V, H] accumulator on every device, so that however many chunks a micro-batch has, it is rounded at most
once (docs/training.md#the-lm-heads-gradient). The log-softmax itself is always taken in fp32; what the option
decides is the precision of the head's matmul: its operands (hidden states and weights, rounded to `operands`) and
its sum and output (the logits), and autocast (the decoder's bf16 compute) cannot override it. The temperature
divides the logits, as the generators do. Why the fp32 head takes bf16 operands: docs/peers.md#the-lm-heads-precision.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch


def _wide(t: torch.Tensor) -> bool:
    """Whether torch's GEMMs take this tensor's operands into a wider output in one kernel (torch.mm's and
    torch.addmm's out_dtype, tensor cores for bf16 operands): on CUDA. Elsewhere the operands are upcast first, which
    gives the same products (bf16 values are exact in fp32)."""
    return t.device.type == "cuda"


def _mm_wide(x: torch.Tensor, y: torch.Tensor, out: torch.dtype) -> torch.Tensor:
    """x @ y summed into `out` in one GEMM (CUDA; tests on the CPU put the upcast product here)."""
    return torch.mm(x, y, out_dtype=out)


def _addmm_wide_(acc: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """acc += x @ y, the products summed into acc's dtype in one GEMM, in place (CUDA; tests put the upcast here)."""
    return torch.addmm(acc, x, y, out_dtype=acc.dtype, out=acc)


def _mm(x: torch.Tensor, y: torch.Tensor, out: torch.dtype) -> torch.Tensor:
    """x @ y with its products summed into `out`."""
    if x.dtype == y.dtype == out:
        return torch.mm(x, y)
    if _wide(x) and x.dtype == y.dtype:
        return _mm_wide(x, y, out)
    return torch.mm(x.to(out), y.to(out))


def _addmm_(acc: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
    """acc += x @ y, summed into acc's dtype (fp32)."""
    if x.dtype == y.dtype == acc.dtype:
        acc.addmm_(x, y)
    elif _wide(x) and x.dtype == y.dtype:
        _addmm_wide_(acc, x, y)
    else:
        acc.addmm_(x.to(acc.dtype), y.to(acc.dtype))


def _held(t: torch.Tensor, operands: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    """An operand as the products take it: rounded to `operands`; where no GEMM takes those into `dtype` directly
    (off CUDA), upcast again (the same values). A no-op for a tensor already so."""
    rounded = t.to(operands)
    return rounded if _wide(t) else rounded.to(torch.promote_types(operands, dtype))


class _Head(torch.autograd.Function):
    """log softmax((h @ W.T + b) / temperature)[y] for h [M, H], W [V, H], y [M], chunked over the M rows.

    Forward: each chunk's logits (its products summed into `dtype`), their log-sum-exp kept ([M] fp32). Backward: each
    chunk's logits again, d logp / d logits = (onehot(y) - softmax) / temperature times the incoming gradient, rounded
    to the operands' dtype as autocast's matmuls round theirs; h's gradient a chunk at a time, W's (and b's) summed
    over the chunks into fp32 and returned so: autograd rounds it once to the weight's own dtype (none for fp32
    masters)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, dtype, operands, temperature, chunk_size):
        h, w = _held(hidden, operands, dtype), _held(weight, operands, dtype)
        b = None if bias is None else bias.to(dtype)
        M = targets.shape[0]
        lse = torch.empty(M, dtype=torch.float32, device=hidden.device)
        logp = torch.empty(M, dtype=torch.float32, device=hidden.device)
        for start in range(0, M, chunk_size):
            rows = slice(start, start + chunk_size)
            logits = _Head.logits(h[rows], w, b, dtype, temperature)
            lse[rows] = torch.logsumexp(logits, dim=-1)
            logp[rows] = logits.gather(-1, targets[rows, None]).squeeze(-1) - lse[rows]
        ctx.save_for_backward(h, w, b, targets, lse)
        ctx.dtypes = (hidden.dtype, dtype, operands)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return logp

    @staticmethod
    def logits(h: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], dtype: torch.dtype,
               temperature: float) -> torch.Tensor:
        logits = _mm(h, w.T, dtype)
        if b is not None:
            logits = logits + b
        return logits.float() / temperature if temperature != 1.0 else logits.float()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        h, w, b, targets, lse = ctx.saved_tensors
        hidden_dtype, dtype, operands = ctx.dtypes
        want_h, want_w, want_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty(h.shape, dtype=hidden_dtype, device=h.device) if want_h else None
        grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if want_w else None
        grad_b = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device) if want_b else None
        for start in range(0, targets.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            g = _Head.logits(h[rows], w, b, dtype, ctx.temperature)  # the chunk's logits, recomputed
            g.sub_(lse[rows, None]).exp_().neg_()  # -softmax, in their place
            g.scatter_add_(1, targets[rows, None], torch.ones_like(g[:, :1]))  # + onehot(y)
            g.mul_((grad[rows] / ctx.temperature)[:, None])
            if grad_b is not None:
                grad_b += g.sum(dim=0)
            g = g.to(operands)  # as autocast rounds a matmul's incoming gradient
            if grad_h is not None:
                grad_h[rows] = _mm(g, w, dtype)
            if grad_w is not None:
                _addmm_(grad_w, g.T, h[rows])
        return grad_h, grad_w, grad_b, None, None, None, None, None


def selected_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, dtype: torch.dtype,
                      bias: Optional[torch.Tensor] = None, operands: Optional[torch.dtype] = None,
                      temperature: float = 1.0, chunk_size: int = 1024) -> torch.Tensor:
    """log softmax((hidden @ weight.T + bias) / temperature)[targets], the matmul's operands rounded to `operands`
    (None: `dtype`) and its products summed into `dtype`, the logits; chunked over rows (`_Head`)."""
    operands = operands or dtype
    if operands == torch.float16:
        raise ValueError("the LM head with float16 operands: its gradient would be rounded to fp16 with no loss "
                         "scale, and small ones flushed to zero; compute in bfloat16 (model.dtype=bfloat16)")
    shape = targets.shape
    flat_h, flat_y = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if flat_y.numel() == 0:
        return torch.zeros(shape, dtype=torch.float32, device=hidden.device)
    off = torch.amp.is_autocast_available(hidden.device.type)  # autocast cannot override the option's dtypes
    with torch.autocast(hidden.device.type, enabled=False) if off else contextlib.nullcontext():
        logp = _Head.apply(flat_h, weight, bias, flat_y, dtype, operands, float(temperature), chunk_size)
    return logp.reshape(shape)


def fp32_head(hidden, weight, targets, *, bias=None, temperature: float = 1.0, operands=None, chunk_size: int = 1024,
              **_) -> torch.Tensor:
    """FP32 LM head (ScaleRL, MiniMax-M1): logits summed and kept in fp32 from operands in the model's compute
    dtype (`operands`: bf16 at the paper's precision), as vLLM's fp32 head computes them (bf16 hidden states and
    weights into fp32 logits, one GEMM on tensor cores). The trainer's head is thereby the generator's, up to the
    order of the sums: docs/peers.md#the-lm-heads-precision measured it against fp32 operands (fp32_exact).

    ScaleRL computes them so on both the generator and the trainer (A 0.52 -> 0.61 in its ablation); TRL's
    cast_lm_head_to_fp32 does the trainer side only. The generator side belongs to each generator.
    """
    return selected_logprobs(hidden, weight, targets, dtype=torch.float32, bias=bias, operands=operands,
                             temperature=temperature, chunk_size=chunk_size)


def fp32_exact(hidden, weight, targets, *, bias=None, temperature: float = 1.0, chunk_size: int = 1024,
               **_) -> torch.Tensor:
    """FP32 LM head with fp32 operands (TRL's cast_lm_head_to_fp32: the hidden states and the head upcast): the
    trainer's logits within ~1e-6 of exact, and ~5e-3 a token from the generator's, whose operands are bf16
    (docs/peers.md#the-lm-heads-precision); a true fp32 GEMM, ~15x slower than bf16 tensor cores on an H100.
    Deviation: none of the paper's; an option for comparing the two readings of "fp32 head"."""
    return selected_logprobs(hidden, weight, targets, dtype=torch.float32, bias=bias, temperature=temperature,
                             chunk_size=chunk_size)


def bf16(hidden, weight, targets, *, bias=None, temperature: float = 1.0, chunk_size: int = 1024,
         **_) -> torch.Tensor:
    """BF16 logits (the base algorithm): the head's matmul in bf16, as a bf16 model computes it by default."""
    return selected_logprobs(hidden, weight, targets, dtype=torch.bfloat16, bias=bias, temperature=temperature,
                             chunk_size=chunk_size)
