"""LM-head precision: the log-probs of the sampled tokens, from the hidden states, with the head in fp32 or bf16.

`head(hidden [.., H], weight [V, H], targets [..], *, bias=None, chunk_size) -> logp [..] float32`

The logits are computed chunk by chunk (`chunk_size` rows at a time) under activation checkpointing: neither the
forward nor the backward ever holds more than one chunk's [chunk_size, V] logits, instead of the whole [N, T, V]
(at V = 128k and 16k tokens that is 8 GB in fp32). The log-softmax itself is always taken in fp32; what the option
decides is the precision of the head's matmul, i.e. of the logits, and autocast (the decoder's bf16 compute) is
switched off here so that it cannot override it.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.utils.checkpoint import checkpoint


def _chunk(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], targets: torch.Tensor,
           dtype: torch.dtype) -> torch.Tensor:
    with torch.autocast(hidden.device.type, enabled=False):
        logits = hidden.to(dtype) @ weight.to(dtype).T
        if bias is not None:
            logits = logits + bias.to(dtype)
        logits = logits.float()
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def selected_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, dtype: torch.dtype,
                      bias: Optional[torch.Tensor] = None, chunk_size: int = 1024) -> torch.Tensor:
    """log softmax(hidden @ weight.T + bias)[targets], computed with the head in `dtype`, chunked over rows."""
    shape = targets.shape
    flat_h, flat_y = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    weight = weight.to(dtype)  # once, not per chunk: the whole [V, H] head (a no-op when it is already in `dtype`)
    bias = None if bias is None else bias.to(dtype)
    out = []
    for start in range(0, flat_y.numel(), chunk_size):
        args = (flat_h[start:start + chunk_size], weight, bias, flat_y[start:start + chunk_size], dtype)
        out.append(checkpoint(_chunk, *args, use_reentrant=False) if grad else _chunk(*args))
    if not out:
        return torch.zeros(shape, dtype=torch.float32, device=hidden.device)
    return torch.cat(out).reshape(shape)


def fp32_head(hidden, weight, targets, *, bias=None, chunk_size: int = 1024, **_) -> torch.Tensor:
    """FP32 LM head (ScaleRL, MiniMax-M1): hidden states and head weights upcast, logits in fp32.

    ScaleRL computes them so on both the generator and the trainer (A 0.52 -> 0.61 in its ablation); TRL's
    cast_lm_head_to_fp32 does the trainer side only. The generator side belongs to each generator.
    """
    return selected_logprobs(hidden, weight, targets, dtype=torch.float32, bias=bias, chunk_size=chunk_size)


def bf16(hidden, weight, targets, *, bias=None, chunk_size: int = 1024, **_) -> torch.Tensor:
    """BF16 logits (the base algorithm): the head's matmul in bf16, as a bf16 model computes it by default."""
    return selected_logprobs(hidden, weight, targets, dtype=torch.bfloat16, bias=bias, chunk_size=chunk_size)
