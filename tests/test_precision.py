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


def test_rows_go_in_left_aligned_with_no_attention_mask_and_score_as_the_padded_form(monkeypatch):
    """The trainer's forward (completion_logprobs) took left-padded prompts and right-padded completions with their
    2-D padding mask, from which transformers built a [N, 1, L, L] mask for attention: on a GPU that rules out
    FlashAttention and GQA's native path, and costs a T^2 bias a layer. Now each row goes in left-aligned with no mask:
    a spy on torch's attention sees no mask and `is_causal` in every layer, the trailing columns no row reaches are
    dropped, and the log-probs are the padded form's (that form, computed here as before, with its mask and
    positions; fp32 on the CPU: within 1e-5)."""
    from omegaconf import OmegaConf

    from ablate.policy import build_policy, completion_logprobs

    model = build_policy(OmegaConf.create({"name": "tiny", "path": None, "vocab_size": 97, "hidden_size": 32,
                                           "num_layers": 2, "num_heads": 4, "dtype": "float32"}), seed=0)
    torch.manual_seed(1)
    dev = model.device
    prompt = torch.randint(3, 97, (4, 7), device=dev)
    prompt_mask = torch.ones(4, 7, dtype=torch.bool, device=dev)
    prompt_mask[0, :3], prompt_mask[2, :6] = False, False  # left padding: prompts of 4, 7, 1 and 7 tokens
    tokens = torch.randint(3, 97, (4, 9), device=dev)
    lengths = torch.tensor([9, 2, 5, 0], device=dev)

    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask, is_causal, query.shape[-2]))
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    logp = completion_logprobs(model, prompt, prompt_mask, tokens, lengths, precision.fp32_head)
    assert len(calls) == 2 and all(mask is None and causal for mask, causal, _ in calls)  # one per layer
    assert {length for *_, length in calls} == {4 + 9}  # the longest row left-aligned, not 7 + 9 columns
    monkeypatch.undo()

    # the padded form, as completion_logprobs computed it before
    inside = torch.arange(9, device=dev)[None, :] < lengths[:, None]
    attention = torch.cat([prompt_mask, inside], dim=1)
    positions = (attention.long().cumsum(dim=1) - 1).clamp(min=0)
    hidden = model.get_decoder()(input_ids=torch.cat([prompt, tokens], dim=1), attention_mask=attention.long(),
                                 position_ids=positions).last_hidden_state
    padded = precision.fp32_head(hidden[:, 6:15], model.get_output_embeddings().weight, tokens)
    padded = torch.where(inside, padded, torch.zeros_like(padded))
    assert (logp - padded).abs().max() < 1e-5
    assert (logp[3] == 0).all() and logp[1, 2:].eq(0).all()  # past each row's length


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


def test_the_fp32_head_takes_the_generators_bf16_operands_and_fp32_exact_does_not():
    """vLLM's fp32 head (and our engine's, on its bf16 copy) multiplies bf16 hidden states and weights into fp32
    logits. fp32_head with operands=bf16 is that head: equal to it, not to fp64; fp32_exact (fp32 operands) is
    fp64's to fp32's rounding and differs from the generator's by the operands' rounding (bench/bench_head.py:
    ~5e-3 a token at H 4096)."""
    hidden, weight, _, targets = _case(3, M=64, H=256, V=300)
    hidden, weight = hidden.detach() * 3, weight.detach() * 0.5
    exact = torch.log_softmax(hidden.double() @ weight.double().T, -1).gather(-1, targets[:, None])[:, 0]
    generator = torch.log_softmax(hidden.bfloat16().float() @ weight.bfloat16().float().T, -1) \
        .gather(-1, targets[:, None])[:, 0]
    ours = precision.fp32_head(hidden, weight, targets, operands=torch.bfloat16, chunk_size=16)
    exact32 = precision.fp32_exact(hidden, weight, targets, operands=torch.bfloat16, chunk_size=16)
    torch.testing.assert_close(ours, generator, rtol=0, atol=1e-5)  # fp32 sums in another order
    assert (exact32.double() - exact).abs().max() < 5e-5  # log-probs down to -34: fp32's own rounding
    assert (ours.double() - exact).abs().mean() > 10 * (exact32.double() - exact).abs().mean()
    assert (exact32 - generator).abs().mean() > 1e-4
    # without operands (a model computing in fp32) the fp32 head is exact
    assert (precision.fp32_head(hidden, weight, targets).double() - exact).abs().max() < 5e-5


def test_the_temperature_divides_the_logits_as_the_generators_do():
    hidden, weight, bias, targets = _case(4)
    hidden, weight, bias = hidden.detach(), weight.detach(), bias.detach()
    for head, dtype in ((precision.fp32_head, torch.float32), (precision.bf16, torch.bfloat16)):
        logits = (hidden.to(dtype) @ weight.to(dtype).T + bias.to(dtype)).float() / 0.6
        expected = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
        torch.testing.assert_close(head(hidden, weight, targets, bias=bias, temperature=0.6, chunk_size=8), expected,
                                   rtol=0, atol=1e-5)


def test_the_fused_bf16_matmul_of_cuda_in_value_gradient_and_device():
    """_RoundedMatmul (CUDA: torch.mm's out_dtype, which has no autograd) with its product put in as the upcast one
    (torch.mm has no out_dtype on CPU): the value and both gradients of the upcast path, the incoming gradient
    rounded to bf16 as autocast's matmuls round theirs; and on the meta device, with torch.mm's own out_dtype, an
    fp32 output and each gradient in its input's dtype."""
    class OnCpu(precision._RoundedMatmul):
        @staticmethod
        def mm(x, y):
            return x.float() @ y.float()

    a, b = torch.randn(6, 8, requires_grad=True), torch.randn(5, 8, requires_grad=True)
    upstream = torch.randn(6, 5)
    out = OnCpu.apply(a, b, torch.bfloat16)
    out.backward(upstream)
    a16, b16, g16 = a.detach().bfloat16().float(), b.detach().bfloat16().float(), upstream.bfloat16().float()
    torch.testing.assert_close(out, a16 @ b16.T, rtol=0, atol=0)
    torch.testing.assert_close(a.grad, g16 @ b16, rtol=0, atol=0)
    torch.testing.assert_close(b.grad, g16.T @ a16, rtol=0, atol=0)
    a = torch.randn(6, 8, device="meta", requires_grad=True)
    b = torch.randn(5, 8, device="meta", dtype=torch.bfloat16, requires_grad=True)
    out = precision._RoundedMatmul.apply(a, b, torch.bfloat16)
    out.sum().backward()
    assert (out.dtype, out.shape, a.grad.dtype, b.grad.dtype) == (torch.float32, (6, 5), torch.float32, torch.bfloat16)
