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
    for row in range(4):  # each row's log-probs where its targets are: row by row, unchunked, by log_softmax
        h = hidden.detach().reshape(4, 6, -1)[row]
        expected = torch.log_softmax(h.double() @ weight.detach().double().T, -1).gather(-1, targets[row, :, None])
        torch.testing.assert_close(out[row].detach().double(), expected[:, 0], rtol=0, atol=1e-5)
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


WIDE_KERNELS = (precision._mm_wide, precision._addmm_wide_)  # CUDA's, as precision has them


@pytest.fixture
def tensor_cores(monkeypatch):
    """The CUDA branch of the head on the CPU: operands held in bf16 and every product taken by the wide GEMMs
    (torch.mm's and torch.addmm's out_dtype, which the CPU lacks), here the upcast product summed in fp32, as
    tensor cores sum bf16 products."""
    monkeypatch.setattr(precision, "_wide", lambda t: True)
    monkeypatch.setattr(precision, "_mm_wide", lambda x, y, out: torch.mm(x.float(), y.float()).to(out))
    monkeypatch.setattr(precision, "_addmm_wide_", lambda acc, x, y: acc.addmm_(x.float(), y.float()))


def _head_and_grads(hidden, weight, targets, upstream, chunk_size, **kwargs):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp = precision.fp32_head(h, w, targets, operands=torch.bfloat16, chunk_size=chunk_size, **kwargs)
    (logp * upstream).sum().backward()
    return logp.detach(), h.grad, w.grad


def test_the_cuda_branch_emulated_gives_the_upcast_paths_values_and_gradients(tensor_cores):
    """The CUDA branch (bf16 operands into fp32 products, the weight's gradient summed into fp32 by addmm) against
    the CPU's (the rounded operands upcast): the same products, so the same log-probs and gradients up to the order
    of fp32 sums; and on meta tensors, through torch's own out_dtype kernels, each gradient in its input's dtype."""
    hidden, weight, _, targets = _case(5, M=40, H=32, V=70)
    hidden, weight, upstream = hidden.detach() * 2, weight.detach(), torch.randn(40)
    emulated = _head_and_grads(hidden, weight, targets, upstream, chunk_size=7)
    with pytest.MonkeyPatch.context() as undo:
        undo.setattr(precision, "_wide", lambda t: False)
        upcast = _head_and_grads(hidden, weight, targets, upstream, chunk_size=7)
    for a, b in zip(emulated, upcast):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    with pytest.MonkeyPatch.context() as real:  # torch's own wide kernels, on meta: shapes and dtypes
        real.setattr(precision, "_mm_wide", WIDE_KERNELS[0])
        real.setattr(precision, "_addmm_wide_", WIDE_KERNELS[1])
        if torch.__version__ < (2, 13):  # 2.11's meta addmm.dtype_out takes the dtype for a scalar (CUDA's is right)
            real.setattr(precision, "_addmm_wide_", lambda acc, x, y: acc.add_(torch.mm(x, y, out_dtype=acc.dtype)))
        h = torch.randn(6, 8, device="meta", requires_grad=True)
        w = torch.randn(5, 8, device="meta", dtype=torch.bfloat16, requires_grad=True)
        logp = precision.fp32_head(h, w, torch.zeros(6, dtype=torch.long, device="meta"), operands=torch.bfloat16)
        logp.sum().backward()
    assert (logp.dtype, logp.shape, h.grad.dtype, w.grad.dtype) == (torch.float32, (6,), torch.float32,
                                                                    torch.bfloat16)


def _weight_grad_error(chunks: int, tokens: int = 4096, H: int = 128, V: int = 2048) -> float:
    """The head's weight gradient at `chunks` chunks against fp64's, relative (Frobenius)."""
    torch.manual_seed(0)
    hidden = torch.randn(tokens, H, dtype=torch.float64)
    weight = torch.randn(V, H, dtype=torch.float64) * 3 / H ** 0.5
    targets = torch.randint(0, V, (tokens,))
    upstream = torch.randn(tokens, dtype=torch.float64)
    w64 = weight.clone().requires_grad_()
    logits = hidden @ w64.T
    ((logits.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(logits, -1)) * upstream).sum().backward()
    got = _head_and_grads(hidden.float(), weight.float(), targets, upstream.float(), chunk_size=tokens // chunks)[2]
    return float((got.double() - w64.grad).norm() / w64.grad.norm())


def test_the_heads_weight_gradient_is_summed_in_fp32_however_many_chunks(tensor_cores):
    """A paper micro-batch is 16-32 chunks of 1,024 rows. Summed over chunks in bf16 (the one bf16 copy of the
    weight taking every chunk's bf16 gradient, as autograd adds them), the weight's gradient drifted from fp64's as
    the chunks grew (2.3e-3 at 1 chunk, 9.8e-3 at 128, on CUDA only: issue 42). In one fp32 accumulator it stays at
    the one-chunk error (the bf16 operands' own): within 1.5x of it at 64 chunks."""
    one, many = _weight_grad_error(1), _weight_grad_error(64)
    assert one < 4e-3 and many < 1.5 * one, (one, many)


def test_float16_operands_are_refused_naming_the_fix():
    hidden, weight, _, targets = _case(6)
    with pytest.raises(ValueError, match="float16 operands.*model.dtype=bfloat16"):
        precision.fp32_head(hidden, weight, targets, operands=torch.float16)


@pytest.fixture(scope="module")
def llama3_gqa(tmp_path_factory):
    """A Llama-3-shaped download with grouped K/V: 4 query heads, 2 K/V heads (Llama-3-8B: 32 and 8)."""
    from real_models import save_model

    return save_model("llama3", tmp_path_factory.mktemp("Llama-3.1-8B-Instruct"), heads=4, kv_heads=2)


def _scored_with_spy(monkeypatch, folder, dtype: str, attention: str | None = None):
    """completion_logprobs of the folder's model computing in `dtype`, and each attention call's (query heads, K/V
    heads, mask, is_causal, enable_gqa)."""
    from omegaconf import OmegaConf

    from ablate.policy import build_policy, completion_logprobs, compute_dtype

    cfg = OmegaConf.create({"name": "hf", "path": str(folder), "dtype": dtype, "device": "cpu"})
    model = build_policy(cfg)
    if attention:
        model.set_attn_implementation(attention)
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((query.shape[1], key.shape[1], attn_mask, is_causal, kwargs.get("enable_gqa", False)))
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    torch.manual_seed(2)
    prompt = torch.randint(0, 1000, (3, 6))
    prompt_mask = torch.ones(3, 6, dtype=torch.bool)
    prompt_mask[1, :2] = False
    tokens, lengths = torch.randint(0, 1000, (3, 5)), torch.tensor([5, 3, 4])
    with monkeypatch.context() as m:
        m.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
        logp = completion_logprobs(model, prompt, prompt_mask, tokens, lengths, precision.fp32_head,
                                   compute_dtype=compute_dtype(cfg))
    return logp, calls


def test_fp32_compute_on_grouped_k_v_repeats_them_so_that_a_linear_kernel_can_run(monkeypatch, llama3_gqa):
    """With no mask, transformers hands SDPA grouped K/V (`enable_gqa`): FlashAttention takes it in bf16, but in fp32
    only the math kernel does (the memory-efficient one refuses grouped K/V), which materialises [N, H, L, L] scores.
    In fp32 compute the trainer's forward now gives SDPA K/V repeated to the query's heads (the memory-efficient
    kernel's case on a GPU), causal, no mask; in bf16 it keeps the native grouped path; and the log-probs are
    transformers' own sdpa's (the same maths)."""
    fp32, calls = _scored_with_spy(monkeypatch, llama3_gqa, "float32")
    assert len(calls) == 2 and all(c == (4, 4, None, True, False) for c in calls), calls
    bf16, calls = _scored_with_spy(monkeypatch, llama3_gqa, "bfloat16")
    assert len(calls) == 2 and all(c == (4, 2, None, True, True) for c in calls), calls
    theirs, calls = _scored_with_spy(monkeypatch, llama3_gqa, "float32", attention="sdpa")
    assert all(c[:2] == (4, 2) for c in calls)
    torch.testing.assert_close(fp32, theirs, rtol=0, atol=1e-5)


def test_the_trainers_forward_builds_no_kv_cache(monkeypatch, llama3_gqa):
    """transformers' decoder makes a cache and copies every layer's K/V into it unless told not to: the trainer's
    forward reads no cache, so it asks for none."""
    import transformers

    updates = []
    update = transformers.cache_utils.DynamicLayer.update

    def counted(self, *args, **kwargs):
        updates.append(1)
        return update(self, *args, **kwargs)

    monkeypatch.setattr(transformers.cache_utils.DynamicLayer, "update", counted)
    _scored_with_spy(monkeypatch, llama3_gqa, "bfloat16")
    assert updates == []
