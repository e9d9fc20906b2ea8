"""torch's varlen attention run on the CPU, for the tests of the GPU checks: CPU kernels for the custom ops that
torch/nn/attention/varlen.py defines (`torch_attn::_varlen_attn` and its backward, the names 2.10 to 2.13 share),
computed as FlashAttention computes them (each row's softmax(q k^T * scale) v, causal where asked, K/V head j // groups
for query head j, grouped K/V taken as they are), so that torch's own `varlen_attn` runs here through its op and a
profile counts it; registered for the life of the `cpu_varlen` fixture; and stand-ins with torch 2.10's and 2.11's
signatures (their wrappers as those versions write them, over this torch's op)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch


def _rows(query, key, value, bounds, causal: bool, scale):
    """Each row's (scores' softmax, its K, its V, its query), K/V repeated to the query's heads, in fp32."""
    groups = query.shape[1] // key.shape[1]
    scale = scale if scale is not None else query.shape[-1] ** -0.5
    edges = bounds.tolist()
    for a, b in itertools.pairwise(edges):
        q, k, v = (t[a:b].transpose(0, 1).float() for t in (query, key, value))
        k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
        scores = q @ k.transpose(1, 2) * scale
        if causal:
            scores = scores.masked_fill(torch.ones(b - a, b - a, dtype=torch.bool).triu(1), -math.inf)
        yield a, b, scores, k, v, q, scale, groups


def _forward(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, scale=None, window_size=None,
             *rest):
    assert cu_seq_q.dtype == torch.int32 and cu_seq_q.tolist() == cu_seq_k.tolist()
    out, lse = torch.empty_like(query), torch.empty(query.shape[1], query.shape[0])
    for a, b, scores, _, v, _, _, _ in _rows(query, key, value, cu_seq_q, is_causal, scale):
        out[a:b] = (scores.softmax(-1) @ v).transpose(0, 1).to(query.dtype)
        lse[:, a:b] = scores.logsumexp(-1)
    return out, lse, torch.zeros(2, dtype=torch.uint64)


def _backward(grad, query, key, value, out, lse, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, rng_state, scale=None,
              window_size=None):
    dq, dk, dv = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
    for a, b, scores, k, v, q, scale_, groups in _rows(query, key, value, cu_seq_q, is_causal, scale):
        p, do = scores.softmax(-1), grad[a:b].transpose(0, 1).float()
        dp = do @ v.transpose(1, 2)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        dq[a:b] = (ds @ k * scale_).transpose(0, 1).to(query.dtype)
        dk[a:b] = (ds.transpose(1, 2) @ q * scale_).unflatten(0, (-1, groups)).sum(1).transpose(0, 1).to(key.dtype)
        dv[a:b] = (p.transpose(1, 2) @ do).unflatten(0, (-1, groups)).sum(1).transpose(0, 1).to(value.dtype)
    return dq, dk, dv


@pytest.fixture
def cpu_varlen():
    """CPU kernels for torch's varlen ops while the test runs (removed after it: the ops are the process's)."""
    pytest.importorskip("torch.nn.attention.varlen")
    library = torch.library.Library("torch_attn", "IMPL")
    library.impl("_varlen_attn", _forward, "CPU")
    library.impl("_varlen_attn_backward", _backward, "CPU")
    yield
    library._destroy()


def varlen_2_10(calls: list):
    """torch 2.10.0's `varlen_attn` (its signature and wrapper: `is_causal`, no scale or window, no head check)."""

    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        calls.append({"is_causal": is_causal})
        return torch.ops.torch_attn._varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal)[0]

    return varlen_attn


def varlen_2_11(calls: list, *, as_list: bool = False):
    """torch 2.11.0's `varlen_attn` (keyword-only scale and window_size, causal only where window_size == (-1, 0),
    no enable_gqa, no head check); `as_list`: a caller that hands it its window as a list, causality lost."""

    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1)):
        window_size = list(window_size) if as_list else window_size
        calls.append({"window_size": window_size, "scale": scale})
        is_causal = window_size == (-1, 0)
        return torch.ops.torch_attn._varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal,
                                                 scale, list(window_size))[0]

    return varlen_attn
