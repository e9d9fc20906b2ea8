"""Packed rows (ablate/policy.py: `packed_logprobs`, `PackedScorer`) against the per-row form (`completion_logprobs`,
`Scorer`): the same log-probs and the same gradients, in fp32 on the CPU, for a Llama-3- and a Qwen3-shaped model
with grouped K/V (4 query heads, 2 K/V heads), rows of different lengths (prompts of 1 to 7 tokens, a completion of
one token); under FSDP2 on 2 gloo ranks too (e2e). The CUDA branch (torch's varlen attention) is emulated here by a
reference that holds varlen_attn's contract. Negative controls: a pass whose attention crosses rows fails the same
comparison by far. Why packed, and why not transformers' sdpa: docs/training.md#packed-rows.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers

from ablate import policy
from ablate.policy import PackedScorer, Scorer, linear_attention, packed_logprobs
from ablate.rl import precision
from real_models import LLAMA3_CONFIG, QWEN3_CONFIG

FAMILIES = {"llama3": LLAMA3_CONFIG, "qwen3": QWEN3_CONFIG}
LAYERS, HEADS, KV_HEADS = 2, 4, 2
PROMPTS = [7, 3, 5, 1, 6]  # each row's real prompt tokens (left-padded to 7)
COMPLETIONS = [4, 1, 6, 2, 5]  # each row's completion tokens (right-padded to 6): one of a single token


def _model(family: str, seed: int = 0) -> torch.nn.Module:
    """The family's architecture (its rope, norms, tying) at 2 layers of width 64, 4 query and 2 K/V heads, a
    256-token vocabulary; random weights; its attention as build_policy sets it for fp32 compute."""
    config = transformers.AutoConfig.for_model(**{
        **FAMILIES[family], "vocab_size": 256, "bos_token_id": 1, "eos_token_id": 2, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": 16})
    torch.manual_seed(seed)
    return linear_attention(transformers.AutoModelForCausalLM.from_config(config), torch.float32)


def _batch(device: str = "cpu"):
    """Five rows as the learner gets them: prompts left-padded, completions right-padded; and an upstream gradient."""
    g = torch.Generator().manual_seed(1)
    N, P, T = len(PROMPTS), max(PROMPTS), max(COMPLETIONS)
    prompt_tokens = torch.randint(3, 256, (N, P), generator=g)
    prompt_mask = torch.arange(P)[None, :] >= P - torch.tensor(PROMPTS)[:, None]
    prompt_tokens[~prompt_mask] = 0
    tokens = torch.randint(3, 256, (N, T), generator=g)
    lengths = torch.tensor(COMPLETIONS)
    upstream = torch.randn(N, T, generator=g)
    return tuple(t.to(device) for t in (prompt_tokens, prompt_mask, tokens, lengths)), upstream.to(device)


def _scored(scorer: torch.nn.Module, batch, upstream) -> tuple[torch.Tensor, dict]:
    """The scorer's log-probs and the gradient of sum(logp * upstream) for every parameter."""
    logp = scorer(*batch)
    (logp * upstream).sum().backward()
    return logp.detach(), {n: p.grad.detach().clone() for n, p in scorer.model.named_parameters()}


def _both(family: str):
    """(per-row log-probs, their gradients), (packed log-probs, their gradients): one model's weights, two copies."""
    batch, upstream = _batch()
    model = _model(family)
    per_row = _scored(Scorer(copy.deepcopy(model), precision.fp32_head), batch, upstream)
    packed = _scored(PackedScorer(model, precision.fp32_head), batch, upstream)
    return per_row, packed


def _assert_same(per_row, packed, atol: float = 1e-5) -> None:
    (logp, grads), (packed_logp, packed_grads) = per_row, packed
    torch.testing.assert_close(packed_logp, logp, rtol=0, atol=atol, msg=lambda m: f"log-probs: {m}")
    for name, grad in grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=0, atol=atol, msg=lambda m: f"{name}'s grad: {m}")


def _gap(per_row, packed) -> float:
    """The largest |packed - per-row| over the log-probs."""
    return float((packed[0] - per_row[0]).abs().max())


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_log_probs_and_gradients_equal_the_per_row_forms(family):
    per_row, packed = _both(family)
    logp = per_row[0]
    inside = torch.arange(logp.shape[1])[None, :] < torch.tensor(COMPLETIONS)[:, None]
    assert (logp[inside] < 0).all() and (packed[0][~inside] == 0).all()  # real log-probs, 0 past each length
    assert all(g.abs().sum() > 0 for g in packed[1].values())  # every weight has a gradient, the head's included
    _assert_same(per_row, packed)


def test_the_packed_pass_attends_row_by_row_with_no_mask_and_the_head_on_completions_alone(monkeypatch):
    """On the CPU each SDPA call is one row's slice of the packed sequence (causal, no mask, K/V repeated to the
    query's heads): no [S, S] mask, no call over the whole sequence; and the head takes the completions' 18 states."""
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((query.shape[0], query.shape[1], key.shape[1], query.shape[2], attn_mask, is_causal))
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    heads = []

    def head(hidden, *args, **kwargs):
        heads.append(tuple(hidden.shape))
        return precision.fp32_head(hidden, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    batch, _ = _batch()
    PackedScorer(_model("qwen3"), head)(*batch)
    rows = [(1, HEADS, HEADS, p + c, None, True) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert calls == rows * LAYERS
    assert heads == [(sum(COMPLETIONS), 64)]


def test_with_activation_checkpointing_the_recomputed_layers_attend_packed_too(monkeypatch):
    """paper_8b recomputes each decoder layer in the backward: the recomputation gets the pass's row bounds again
    (one packed attention a layer in the forward, one in the backward), and the gradients stay the per-row form's."""
    batch, upstream = _batch()
    model = _model("qwen3")
    per_row = _scored(Scorer(copy.deepcopy(model), precision.fp32_head), batch, upstream)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    calls, by_row = [], policy._by_row
    monkeypatch.setattr(policy, "_by_row", lambda *args: calls.append(args[3].tolist()) or by_row(*args))
    packed = _scored(PackedScorer(model, precision.fp32_head), batch, upstream)
    assert len(calls) == 2 * LAYERS
    _assert_same(per_row, packed)


def _emulated_varlen(calls: list):
    """torch.nn.attention.varlen.varlen_attn as FlashAttention computes it, on the CPU: its argument checks (as
    torch makes them, and what the kernel needs: int32 bounds on the queries' device, the causal window), then each
    row's softmax(q k^T * scale) v written out, K/V head j // groups for query head j."""

    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                    enable_gqa=False, **kwargs):
        assert query.ndim == key.ndim == value.ndim == 3 and not kwargs
        assert cu_seq_q.dtype == cu_seq_k.dtype == torch.int32 and cu_seq_q.device == query.device
        if not enable_gqa and query.shape[1] != key.shape[1]:
            raise ValueError("Expect query and key/value to have the same number of heads")
        edges = cu_seq_q.tolist()
        assert edges == cu_seq_k.tolist() and edges[-1] == query.shape[0]
        assert max_q == max_k == max(b - a for a, b in zip(edges[:-1], edges[1:]))
        calls.append((query.dtype, tuple(query.shape), tuple(key.shape), tuple(window_size), enable_gqa, edges))
        groups = query.shape[1] // key.shape[1]
        scale = scale if scale is not None else query.shape[-1] ** -0.5
        out = []
        for a, b in zip(edges[:-1], edges[1:]):
            q, k, v = query[a:b].transpose(0, 1), key[a:b].transpose(0, 1), value[a:b].transpose(0, 1)
            k, v = k[torch.arange(q.shape[0]) // groups], v[torch.arange(q.shape[0]) // groups]
            scores = (q.float() @ k.float().transpose(1, 2)) * scale
            if window_size == (-1, 0):  # causal: query i sees keys 0..i
                scores = scores.masked_fill(torch.ones(b - a, b - a, dtype=torch.bool).triu(1), -math.inf)
            out.append((scores.softmax(dim=-1) @ v.float()).to(query.dtype).transpose(0, 1))
        return torch.cat(out)

    return varlen_attn


def test_the_cuda_branch_emulated_gives_the_per_row_forms_values_and_gradients(monkeypatch):
    """The varlen branch (CUDA, bf16/fp16 compute) with torch's kernel emulated on the CPU: one call a layer over the
    whole pass, its rows' bounds, the causal window, grouped K/V given as they are; the same log-probs and gradients
    as the per-row form in fp32. Under bf16 autocast the branch hands the kernel bf16 (a custom op: autocast would
    not cast it)."""
    calls = []
    monkeypatch.setattr(policy, "_varlen_runs", lambda query: True)
    monkeypatch.setattr(policy, "_varlen_attn", lambda: _emulated_varlen(calls))
    per_row, packed = _both("llama3")
    total = sum(PROMPTS) + sum(COMPLETIONS)
    bounds = [0, *torch.tensor(PROMPTS).add(torch.tensor(COMPLETIONS)).cumsum(0).tolist()]
    assert calls == [(torch.float32, (total, HEADS, 16), (total, KV_HEADS, 16), (-1, 0), True, bounds)] * LAYERS
    _assert_same(per_row, packed)
    calls.clear()
    batch, _ = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        packed_logprobs(PackedScorer(_model("llama3"), precision.fp32_head).model, *batch, precision.fp32_head)
    assert [c[0] for c in calls] == [torch.bfloat16] * LAYERS


def test_the_cuda_branch_on_torch_2_11_repeats_grouped_kv_for_a_varlen_without_enable_gqa(monkeypatch):
    """torch 2.11's varlen_attn (the lent GPUs' image) takes no enable_gqa: K/V repeated to the query's heads, the same
    log-probs and gradients; with it (2.12 on) they go as they are (the test above)."""
    calls = []
    emulated = _emulated_varlen(calls)

    def varlen_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1)):  # torch 2.11.0's signature
        return emulated(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window_size=window_size)

    monkeypatch.setattr(policy, "_varlen_runs", lambda query: True)
    monkeypatch.setattr(policy, "_varlen_attn", lambda: varlen_2_11)
    per_row, packed = _both("llama3")
    total = sum(PROMPTS) + sum(COMPLETIONS)
    assert {c[1:5] for c in calls} == {((total, HEADS, 16), (total, HEADS, 16), (-1, 0), False)}
    _assert_same(per_row, packed)


def _whole_sequence_causal(query, key, value, bounds, longest, scale):
    """A plan whose attention crosses rows: one causal attention over the whole packed sequence."""
    groups = query.shape[1] // key.shape[1]
    q, k, v = (t.repeat_interleave(g, dim=1).transpose(0, 1)[None] for t, g in ((query, 1), (key, groups),
                                                                              (value, groups)))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)[0].transpose(0, 1)


def _positions_not_restarting(monkeypatch, model):
    """Positions 0..S-1 over the whole packed sequence, as a plain concatenation would give them."""
    decoder = model.get_decoder()
    forward = decoder.forward

    def counting_on(**kwargs):
        ids = kwargs["input_ids"]
        return forward(**{**kwargs, "position_ids": torch.arange(ids.shape[1], device=ids.device)[None]})

    monkeypatch.setattr(decoder, "forward", counting_on)


def crossing(monkeypatch, family: str, control: str):
    """(per-row, packed) for a packed pass whose attention crosses rows: `control` = "causal" (one causal attention
    over the flattened sequence, positions restarting) or "concatenated" (that, and positions 0..S-1 as well)."""
    batch, upstream = _batch()
    model = _model(family)
    per_row = _scored(Scorer(copy.deepcopy(model), precision.fp32_head), batch, upstream)
    monkeypatch.setattr(policy, "_by_row", _whole_sequence_causal)
    if control == "concatenated":
        _positions_not_restarting(monkeypatch, model)
    return per_row, _scored(PackedScorer(model, precision.fp32_head), batch, upstream)


@pytest.mark.parametrize("control", ["causal", "concatenated"])
def test_a_packed_pass_whose_attention_crosses_rows_fails_the_comparison_by_far(monkeypatch, control):
    """The negative control: the same comparison on a pass that lets each row attend to the rows before it fails,
    by orders of magnitude more than its 1e-5 tolerance (the first row, which has no row before it, still agrees)."""
    per_row, packed = crossing(monkeypatch, "llama3", control)
    with pytest.raises(AssertionError, match="log-probs"):
        _assert_same(per_row, packed)
    assert _gap(per_row, packed) > 1e-2, _gap(per_row, packed)
    torch.testing.assert_close(packed[0][0], per_row[0][0], rtol=0, atol=1e-5)


def test_positions_that_do_not_restart_move_nothing_while_rows_stay_apart(monkeypatch):
    """Rotary embeddings see only the distance between a query and a key: with attention kept within each row,
    positions that run on over the pass (0..S-1) give the same log-probs up to fp32 rounding. So restarting positions
    is not what keeps the rows apart (the attention is: the control above); the packed form restarts them anyway, as
    the generator saw each row."""
    batch, upstream = _batch()
    model = _model("llama3")
    per_row = _scored(Scorer(copy.deepcopy(model), precision.fp32_head), batch, upstream)
    _positions_not_restarting(monkeypatch, model)
    packed = _scored(PackedScorer(model, precision.fp32_head), batch, upstream)
    assert _gap(per_row, packed) < 1e-4


def test_a_packed_models_other_calls_keep_its_own_attention():
    """The trainer's policy also decodes validation's prompts (ablate/generators/engine.py): left-padded, with a mask
    and a cache. Once set to packed attention, those calls give what they gave before, to the bit."""
    model = _model("qwen3")
    ids = torch.randint(3, 256, (2, 6))
    attention = torch.ones(2, 6, dtype=torch.long)
    attention[1, :3] = 0

    def decoded(m):
        cache = transformers.DynamicCache()
        positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
        first = m.get_decoder()(input_ids=ids, attention_mask=attention, position_ids=positions,
                                past_key_values=cache, use_cache=True).last_hidden_state
        grown = torch.cat([attention, torch.ones(2, 1, dtype=torch.long)], dim=1)
        step = m.get_decoder()(input_ids=ids[:, -1:], attention_mask=grown, position_ids=positions[:, -1:] + 1,
                               past_key_values=cache, use_cache=True).last_hidden_state
        return first, step

    before = decoded(model)
    PackedScorer(model, precision.fp32_head)
    assert model.config._attn_implementation == "ablate_packed_over_ablate_sdpa_linear"
    for a, b in zip(decoded(model), before):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    PackedScorer(model, precision.fp32_head)  # set twice: once
    assert model.config._attn_implementation == "ablate_packed_over_ablate_sdpa_linear"


def test_packed_log_probs_make_every_tensor_on_their_inputs_device():
    """Under a meta default device with CPU inputs (tests/test_device.py's probe), the packed log-probs come out on
    the CPU, equal to the same call made normally."""
    from test_device import meta_default

    batch, _ = _batch()
    scorer = PackedScorer(_model("llama3"), precision.fp32_head)
    with torch.no_grad():
        expected = scorer(*batch)
        with meta_default():
            got = scorer(*batch)
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_row_without_a_prompt_token_is_refused_naming_it():
    (prompt_tokens, prompt_mask, tokens, lengths), _ = _batch()
    prompt_mask[3] = False
    with pytest.raises(ValueError, match="1 of 5 rows have no prompt token"):
        PackedScorer(_model("llama3"), precision.fp32_head)(prompt_tokens, prompt_mask, tokens, lengths)


# ------------------------------------------------------------------------------------------- FSDP2 on 2 gloo ranks
WORLD = 2
SHARES = [[0, 2, 4], [1, 3]]  # the rows each rank scores


def _compiled(scorer):
    """A scorer whose decoder layers are compiled in place before FSDP2 wraps them, as Learner does with
    run.compile_layers (aot_eager: dynamo and AOTAutograd's graphs without inductor's minute of code generation)."""
    from ablate.policy import compile_layers

    return lambda model, head: scorer(compile_layers(model, True, backend="aot_eager"), head)


# each form, made from a model and a head: per row, packed, and both with their decoder layers compiled
FORMS = (("per_row", Scorer), ("packed", PackedScorer), ("per_row, compiled", _compiled(Scorer)),
         ("packed, compiled", _compiled(PackedScorer)))


def _rank(rank: int, init_file: str, out: str) -> None:
    """On each rank, per family and form: the scorer wrapped by the FSDP layout, its share of the rows scored, the
    gradient of their loss summed over the ranks (FSDP's reduce-scatter), gathered whole."""
    import torch.distributed as dist

    from ablate.distributed.layouts import FSDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        rows = torch.tensor(SHARES[rank])
        batch, upstream = _batch()
        results = {}
        for family in FAMILIES:
            for form, make in FORMS:
                scorer = FSDP().wrap(make(_model(family), precision.fp32_head))
                logp = scorer(*(t[rows] for t in batch))
                (logp * upstream[rows]).sum().backward()
                grads = {n: p.grad.full_tensor().detach().clone() for n, p in scorer.model.named_parameters()}
                results[family, form] = (logp.detach(), grads)
        torch.save(results, f"{out}.{rank}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.e2e
def test_under_fsdp_on_two_ranks_packed_rows_give_the_one_process_per_row_forms_values_and_gradients(tmp_path):
    """Each form under the FSDP layout on 2 gloo ranks, its decoder layers eager or compiled (issue 46: the compiled
    decoder composes with FSDP2), gives the one-process per-row form's log-probs and summed gradients within 1e-5."""
    torch.multiprocessing.start_processes(_rank, args=(str(tmp_path / "init"), str(tmp_path / "out.pt")),
                                          nprocs=WORLD, start_method="spawn")
    ranks = [torch.load(tmp_path / f"out.pt.{r}", weights_only=False) for r in range(WORLD)]
    for family in FAMILIES:
        batch, upstream = _batch()
        one = _scored(Scorer(_model(family), precision.fp32_head), batch, upstream)  # one process, every row
        for form, _ in FORMS:
            logp = torch.zeros_like(one[0])
            for rank, rows in enumerate(SHARES):
                logp[rows] = ranks[rank][family, form][0]
            for rank in range(WORLD):  # each rank holds the whole batch's gradient, summed over the ranks
                _assert_same(one, (logp, ranks[rank][family, form][1]))
