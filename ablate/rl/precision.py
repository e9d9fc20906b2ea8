"""LM-head precision: the log-probs of the sampled tokens, from the hidden states, with the head in fp32 or bf16.

`head(hidden [.., H], weight [V, H], targets [..], *, bias=None, temperature=1, operands=None, chunk_size)
-> logp [..] float32`

The logits are computed chunk by chunk (`chunk_size` rows at a time) under activation checkpointing: neither the
forward nor the backward ever holds more than one chunk's [chunk_size, V] logits, instead of the whole [N, T, V]
(at V = 128k and 16k tokens that is 8 GB in fp32). The log-softmax itself is always taken in fp32; what the option
decides is the precision of the head's matmul: its operands (hidden states and weights, rounded to `operands`) and
its sum and output (the logits), and autocast (the decoder's bf16 compute) is switched off here so that it cannot
override it. The temperature divides the logits, as the generators do. Why the fp32 head takes bf16 operands:
docs/peers.md#the-lm-heads-precision.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.utils.checkpoint import checkpoint


class _RoundedMatmul(torch.autograd.Function):
    """a @ b.T with a [N, H] and b [V, H] rounded to bf16 (or fp16) and summed into fp32 on tensor cores (torch.mm's
    out_dtype, CUDA only), which has no autograd of its own; the backward's two products likewise, the fp32 gradient
    rounded to the operands' dtype as under autocast, each returned in its input's dtype."""

    @staticmethod
    def mm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x @ y summed into fp32 (tests on CPU, where torch.mm has no out_dtype, put the upcast product here)."""
        return torch.mm(x, y, out_dtype=torch.float32)

    @classmethod
    def forward(cls, ctx, a: torch.Tensor, b: torch.Tensor, operands: torch.dtype) -> torch.Tensor:
        a16, b16 = a.to(operands), b.to(operands)
        ctx.save_for_backward(a16, b16)
        ctx.dtypes = (a.dtype, b.dtype)
        return cls.mm(a16, b16.T)

    @classmethod
    def backward(cls, ctx, grad: torch.Tensor):
        a16, b16 = ctx.saved_tensors
        g16 = grad.to(a16.dtype)
        return cls.mm(g16, b16).to(ctx.dtypes[0]), cls.mm(g16.T, a16).to(ctx.dtypes[1]), None


def _fused(device: torch.device, operands: torch.dtype, dtype: torch.dtype) -> bool:
    """Whether the head's matmul takes rounded operands into a wider output in one GEMM (_RoundedMatmul): on CUDA,
    for bf16 or fp16 operands into fp32 logits. Elsewhere the same numbers come from the rounded operands upcast."""
    return device.type == "cuda" and operands in (torch.bfloat16, torch.float16) and dtype == torch.float32


def _chunk(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], targets: torch.Tensor,
           dtype: torch.dtype, operands: torch.dtype, temperature: float) -> torch.Tensor:
    with torch.autocast(hidden.device.type, enabled=False):
        if _fused(hidden.device, operands, dtype):
            logits = _RoundedMatmul.apply(hidden, weight, operands)
        else:  # bf16 values are exact in fp32: the same products, summed in fp32 (a true fp32 GEMM)
            logits = hidden.to(operands).to(dtype) @ weight.T
        if bias is not None:
            logits = logits + bias.to(dtype)
        logits = logits.float() / temperature if temperature != 1.0 else logits.float()
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def selected_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, dtype: torch.dtype,
                      bias: Optional[torch.Tensor] = None, operands: Optional[torch.dtype] = None,
                      temperature: float = 1.0, chunk_size: int = 1024) -> torch.Tensor:
    """log softmax((hidden @ weight.T + bias) / temperature)[targets], the matmul's operands rounded to `operands`
    (None: `dtype`) and its products summed into `dtype`, the logits; chunked over rows."""
    operands = operands or dtype
    shape = targets.shape
    flat_h, flat_y = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    # once, not per chunk: the whole [V, H] head (a no-op when it is already in that dtype)
    weight = weight.to(operands) if _fused(hidden.device, operands, dtype) else weight.to(operands).to(dtype)
    bias = None if bias is None else bias.to(dtype)
    out = []
    for start in range(0, flat_y.numel(), chunk_size):
        args = (flat_h[start:start + chunk_size], weight, bias, flat_y[start:start + chunk_size], dtype, operands,
                temperature)
        out.append(checkpoint(_chunk, *args, use_reentrant=False) if grad else _chunk(*args))
    if not out:
        return torch.zeros(shape, dtype=torch.float32, device=hidden.device)
    return torch.cat(out).reshape(shape)


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
