"""The LM head's precision: chunked log-probs equal the full computation, in value and gradient."""

from __future__ import annotations

import pytest
import torch

from ablate.rl import precision


def _case(seed=0, M=37, H=16, V=50):
    torch.manual_seed(seed)
    hidden = torch.randn(M, H, requires_grad=True)
    weight = (0.3 * torch.randn(V, H)).requires_grad_(True)
    bias = (0.1 * torch.randn(V)).requires_grad_(True)
    targets = torch.randint(0, V, (M,))
    return hidden, weight, bias, targets


def test_fp32_head_chunked_equals_the_full_log_softmax_in_value_and_gradient():
    hidden, weight, bias, targets = _case()
    full = torch.log_softmax(hidden @ weight.T + bias, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    upstream = torch.randn(full.shape)
    grads_full = torch.autograd.grad((full * upstream).sum(), (hidden, weight, bias))
    chunked = precision.fp32_head(hidden, weight, targets, bias=bias, chunk_size=8)  # 37 rows: 5 chunks, last short
    grads_chunked = torch.autograd.grad((chunked * upstream).sum(), (hidden, weight, bias))
    assert chunked.dtype == torch.float32
    assert torch.allclose(chunked, full, atol=1e-5)
    for a, b in zip(grads_chunked, grads_full):
        assert torch.allclose(a, b, atol=1e-5)


def test_bf16_head_rounds_the_logits_and_fp32_does_not():
    hidden, weight, _, targets = _case(1, V=200)
    hidden = hidden.detach() * 4  # logits of a few units: bf16 keeps 8 bits of mantissa
    exact = torch.log_softmax(hidden.double() @ weight.detach().double().T, -1).gather(-1, targets[:, None])[:, 0]
    fp32 = precision.fp32_head(hidden, weight.detach(), targets)
    bf16 = precision.bf16(hidden, weight.detach(), targets)
    reference = torch.log_softmax((hidden.bfloat16() @ weight.detach().bfloat16().T).float(), -1)
    assert torch.allclose(bf16, reference.gather(-1, targets[:, None])[:, 0], atol=1e-6)
    assert (fp32.double() - exact).abs().max() < 1e-5
    assert (bf16.double() - exact).abs().max() > 1e-3  # the mismatch the fp32 head removes


def test_a_3d_batch_keeps_its_shape_and_an_empty_one_works():
    hidden, weight, _, _ = _case(2, M=24)
    targets = torch.randint(0, 50, (4, 6))
    out = precision.fp32_head(hidden.reshape(4, 6, -1), weight, targets, chunk_size=5)
    assert out.shape == (4, 6)
    empty = precision.fp32_head(torch.zeros(0, 3, 16), weight, torch.zeros(0, 3, dtype=torch.long))
    assert empty.shape == (0, 3)


def test_log_probs_of_a_transformers_causal_lm_match_its_own_logits():
    transformers = pytest.importorskip("transformers")
    from ablate.policy import build_policy, completion_logprobs
    from omegaconf import OmegaConf

    model_cfg = OmegaConf.create({"name": "tiny", "path": None, "vocab_size": 97, "hidden_size": 32,
                                  "num_layers": 2, "num_heads": 4, "dtype": "float32"})
    model = build_policy(model_cfg, seed=0)
    assert isinstance(model, transformers.PreTrainedModel)
    torch.manual_seed(0)
    dev = model.device  # cuda where there is one: the inputs go where the model is, as the trainer's do
    prompt = torch.randint(3, 97, (3, 5)).to(dev)
    prompt_mask = torch.ones(3, 5, dtype=torch.bool, device=dev)
    prompt_mask[1, :2] = False  # left padding
    tokens = torch.randint(3, 97, (3, 4)).to(dev)
    lengths = torch.tensor([4, 2, 3], device=dev)
    logp = completion_logprobs(model, prompt, prompt_mask, tokens, lengths, precision.fp32_head)
    for i in range(3):  # each row alone, unpadded, through the model's own forward and logits
        ids = torch.cat([prompt[i][prompt_mask[i]], tokens[i, :lengths[i]]])[None]
        logits = model(input_ids=ids).logits.float()
        p = prompt_mask[i].sum()
        expected = torch.log_softmax(logits[0, p - 1:p - 1 + lengths[i]], -1).gather(-1, ids[0, p:, None])[:, 0]
        assert torch.allclose(logp[i, :lengths[i]], expected, atol=1e-4), i


def test_the_bf16_head_casts_the_head_once_not_once_per_chunk():
    """At V = 128k and H = 4k the head is 0.5 G parameters: casting it for every chunk of 1,024 rows is a copy of it
    per chunk. Counted here as the copies of the [V, H] weight into bf16, forward and backward (recomputed chunks
    included), over 5 chunks: one."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Casts(TorchDispatchMode):
        def __init__(self, shape):
            super().__init__()
            self.shape, self.count = shape, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and tuple(args[0].shape) == self.shape and \
                    (kwargs or {}).get("dtype") == torch.bfloat16:
                self.count += 1
            return func(*args, **(kwargs or {}))

    hidden = torch.randn(10, 8, requires_grad=True)
    weight = torch.randn(32, 8, requires_grad=True)
    targets = torch.randint(0, 32, (10,))
    with Casts((32, 8)) as casts:
        precision.bf16(hidden, weight, targets, chunk_size=2).sum().backward()
    assert casts.count == 1 and weight.grad is not None
