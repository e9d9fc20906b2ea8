"""Packed rows (ablate/policy.py: `packed_logprobs`, `PackedScorer`) against the per-row form (`completion_logprobs`,
`Scorer`): the same log-probs and the same gradients, in fp32 on the CPU, for a Llama-3- and a Qwen3-shaped model
with grouped K/V (4 query heads, 2 K/V heads), rows of different lengths (prompts of 1 to 7 tokens, a completion of
one token); under FSDP2 on 2 gloo ranks too (e2e). The CUDA branch (torch's varlen attention) is emulated here by
each torch's varlen_attn (2.10's, 2.11's, 2.13's own signature and wrapper, the kernel a per-row SDPA; 2.9's: none):
where varlen runs, K/V reach it grouped, and where it does not the learner keeps the padded form and says so once.
The device reads a packed pass and a learner step make are counted (`HostReads`). Negative controls: a pass whose
attention crosses rows fails the same comparison by far. Why packed, and why not transformers' sdpa:
docs/training.md#packed-rows.
"""

from __future__ import annotations

import collections
import contextlib
import copy

import pytest
import torch
import transformers
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode

from ablate import policy
from ablate.config import compose
from ablate.policy import PackedScorer, Scorer, linear_attention, packed_logprobs
from ablate.registry import build
from ablate.rl import precision
from conftest import spawn_ranks
from real_models import LLAMA3_CONFIG, QWEN3_CONFIG

aten = torch.ops.aten

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


# -------------------------------------------------------------------- the CUDA branch: torch's varlen, emulated
class HostReads(TorchDispatchMode):
    """Counts what would make the host wait on a CUDA device: the ops whose result the host reads (a tensor's item,
    int, float or bool: `_local_scalar_dense`; `nonzero`, `masked_select`, indexing with a boolean mask, whose size
    only the device knows) and `Tensor.tolist`, which no op shows on the CPU; each read with `phase`, which the test
    sets. A `paused()` stretch counts nothing: the emulated kernel's own work, which reads nothing on a GPU. (The copies
    a `.cpu()` of a CUDA tensor makes are no-ops here: none is in a pass.)"""

    SIZED = frozenset({aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
                       aten.repeat_interleave.Tensor})
    INDEXING = frozenset({aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                          aten._index_put_impl_.default})

    def __init__(self):
        super().__init__()
        self.phase, self.reads, self.stopped = "before", [], False

    def read(self, what: str) -> None:
        if not self.stopped:
            self.reads.append((self.phase, what))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        by_mask = func in self.INDEXING and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                                for i in args[1] or ())
        if func in self.SIZED or by_mask:
            self.read(str(func))
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def paused(self):
        was, self.stopped = self.stopped, True
        try:
            yield
        finally:
            self.stopped = was

    def per_phase(self) -> dict[str, int]:
        return dict(collections.Counter(phase for phase, _ in self.reads))


@contextlib.contextmanager
def host_reads(monkeypatch):
    """A HostReads counting (Tensor.tolist wrapped for it) while the block runs."""
    reads, tolist = HostReads(), torch.Tensor.tolist

    def counted(self):
        reads.read("tolist")
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    with reads:
        yield reads


def _rows_attended(query, key, value, cu_seq_q, max_q, scale, causal: bool) -> torch.Tensor:
    """What FlashAttention's varlen kernel computes, on the CPU: SDPA on each row's slice (fp32 accumulation, the
    result in the query's dtype), K/V head j // groups for query head j; with varlen's checks on its arguments (int32
    bounds on the queries' device, the Python-int longest row)."""
    assert query.ndim == key.ndim == value.ndim == 3 and isinstance(max_q, int)
    assert cu_seq_q.dtype == torch.int32 and cu_seq_q.device == query.device
    edges = cu_seq_q.tolist()
    assert edges[-1] == query.shape[0] and max_q == max(b - a for a, b in zip(edges[:-1], edges[1:]))
    groups = query.shape[1] // key.shape[1]
    out = [torch.nn.functional.scaled_dot_product_attention(
        *(t[a:b].float().repeat_interleave(g, dim=1).transpose(0, 1)[None] for t, g in ((query, 1), (key, groups),
                                                                                         (value, groups))),
        is_causal=causal, scale=scale)[0].transpose(0, 1).to(query.dtype) for a, b in zip(edges[:-1], edges[1:])]
    return torch.cat(out)


def _torch_varlen(version: str, calls: list, reads: HostReads | None = None):
    """torch.nn.attention.varlen.varlen_attn of torch `version` ("2.10", "2.11", "2.13"): its Python signature
    exactly, and what its wrapper does with the arguments, the kernel emulated (`_rows_attended`); each call recorded
    in `calls` as (dtype, query's shape, key's shape, window, enable_gqa, bounds, scale, K/V data pointers).
    The signatures, from each version's torch/nn/attention/varlen.py (no git tag could be fetched here: the pytorch
    snapshot is 4 GB, over the 500 MB a fetch brings):

    - 2.10 (docs.pytorch.org/docs/stable/nn.attention.varlen.html as stored while 2.10 was stable; the module's source
      as mirrored in the code index): `varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
      is_causal=False, return_aux=None)`, which calls `torch.ops.torch_attn._varlen_attn(query, key, value, cu_seq_q,
      cu_seq_k, max_q, max_k, is_causal)`: no scale, no window, no head check.
    - 2.11 (docs.pytorch.org/docs/main/nn.attention.varlen.html as stored between 2.10 and 2.12; pytorch/pytorch's
      torch/nn/attention/varlen.py at 000459dc in the code index; enable_gqa came after, pytorch/pytorch#179468 of
      2026-04-06): `varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
      window_size=(-1, -1))`, whose body is `is_causal = window_size == (-1, 0)` and the op: no head check, so
      grouped K/V reach FlashAttention-2, which takes them forward and backward.
    - 2.13 (the installed torch 2.13.0, git cf30153c): `varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q,
      max_k, *, return_aux=None, scale=None, window_size=(-1, -1), enable_gqa=False, seqused_k=None,
      block_table=None, num_splits=None)`, which raises ValueError("Expect query and key/value to have the same
      number of heads ...") for grouped K/V without enable_gqa (2.12's signature is the same)."""

    def attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale, window_size, enable_gqa):
        with reads.paused() if reads is not None else contextlib.nullcontext():
            calls.append((query.dtype, tuple(query.shape), tuple(key.shape), tuple(window_size), enable_gqa,
                          cu_seq_q.tolist(), scale, (key.data_ptr(), value.data_ptr())))
            assert cu_seq_k is cu_seq_q and max_k == max_q
            return _rows_attended(query, key, value, cu_seq_q, max_q, scale, causal=tuple(window_size) == (-1, 0))

    def varlen_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, None, (-1, 0) if is_causal else (-1, -1),
                      None)

    def varlen_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1)):
        return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale, window_size, None)

    def varlen_2_13(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
        if not enable_gqa and query.size(1) != key.size(1):
            raise ValueError("Expect query and key/value to have the same number of heads")
        return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale, window_size, enable_gqa)

    return {"2.10": varlen_2_10, "2.11": varlen_2_11, "2.13": varlen_2_13}[version]


def _on_torch(monkeypatch, version: str, calls: list | None = None, reads: HostReads | None = None) -> list:
    """This process as a CUDA one with torch `version`'s varlen attention ("2.9": none): its kernels taken to run here
    (`_kernels_run`), its varlen_attn the emulated one. Returns the list its calls go to."""
    calls = [] if calls is None else calls
    monkeypatch.setattr(policy, "_kernels_run", lambda device, compute: True)
    varlen = None if version == "2.9" else _torch_varlen(version, calls, reads)
    monkeypatch.setattr(policy, "_varlen_attn", lambda: varlen)
    return calls


PASS_BOUNDS = [0, *torch.tensor(PROMPTS).add(torch.tensor(COMPLETIONS)).cumsum(0).tolist()]


@pytest.mark.parametrize("version", ["2.11", "2.13"])
def test_the_cuda_branch_emulated_gives_the_per_row_forms_values_and_gradients_with_kv_grouped(monkeypatch, version):
    """The varlen branch on torch 2.11 and 2.13's own signatures: one call a layer over the whole pass, its rows'
    bounds, the causal window, the model's scale, and K/V grouped as the model made them ([S, K/V heads, D], never
    repeated: 2.11's wrapper checks no heads, 2.13's takes enable_gqa); the same log-probs and gradients as the
    per-row form in fp32. Under bf16 autocast the branch hands the kernel bf16 (a custom op: autocast would not cast
    it)."""
    calls = _on_torch(monkeypatch, version)
    per_row, packed = _both("llama3")
    total, gqa = sum(PROMPTS) + sum(COMPLETIONS), {"2.11": None, "2.13": True}[version]
    assert [c[:7] for c in calls] == [(torch.float32, (total, HEADS, 16), (total, KV_HEADS, 16), (-1, 0), gqa,
                                       PASS_BOUNDS, 16 ** -0.5)] * LAYERS
    _assert_same(per_row, packed)
    calls.clear()
    batch, _ = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        packed_logprobs(PackedScorer(_model("llama3"), precision.fp32_head).model, *batch, precision.fp32_head)
    assert [c[0] for c in calls] == [torch.bfloat16] * LAYERS


def test_the_varlen_branch_copies_no_query_key_or_value(monkeypatch):
    """The kernel needs only the last dimension contiguous: q, k, v reach it as the views they are (a query laid
    out head-major, as transformers' projections make it before the transpose, is not copied to a contiguous one)."""
    calls = _on_torch(monkeypatch, "2.13")
    S, D = 6, 16
    query = torch.randn(HEADS, S, D).transpose(0, 1)  # [S, heads, D], heads outermost in memory
    key, value = (torch.randn(KV_HEADS, S, D).transpose(0, 1) for _ in range(2))
    bounds = torch.tensor([0, 2, 6], dtype=torch.int32)
    assert not query.is_contiguous() and query.stride(-1) == 1
    out = policy._varlen(query, key, value, bounds, 4, None)
    assert calls[0][7] == (key.data_ptr(), value.data_ptr())
    torch.testing.assert_close(out, policy._by_row(query, key, value, bounds, 4, None), rtol=0, atol=1e-6)


@pytest.mark.parametrize("version", ["2.9", "2.10", "2.11", "2.13"])
def test_varlen_runs_where_torch_has_the_signature_the_packed_pass_calls(monkeypatch, version):
    """packs_rows(None, ...), the one answer to "does varlen run here": on CUDA in bf16, where torch's varlen_attn
    takes scale= and window_size= (2.11 on); not on torch 2.10 (its varlen_attn takes is_causal= and no scale: the
    call would raise TypeError) nor 2.9 (no varlen module), where the learner keeps the padded form."""
    _on_torch(monkeypatch, version)
    assert policy.packs_rows(None, torch.device("cuda"), torch.bfloat16) == (version in ("2.11", "2.13"))
    assert policy.packs_rows(True, torch.device("cuda"), torch.bfloat16)


@pytest.mark.parametrize("version", ["2.9", "2.10"])
def test_packed_rows_forced_on_a_torch_without_that_varlen_attend_row_by_row(monkeypatch, version):
    """run.packed_rows=true on torch 2.10 or 2.9 (on CUDA in bf16): the packed pass attends row by row (`_by_row`,
    as on the CPU), never calling 2.10's varlen_attn with arguments it does not take; the per-row form's log-probs
    and gradients."""
    calls = _on_torch(monkeypatch, version)
    by_row, rows = policy._by_row, []
    monkeypatch.setattr(policy, "_by_row", lambda *args: rows.append(1) or by_row(*args))
    per_row, packed = _both("qwen3")
    assert calls == [] and len(rows) == LAYERS
    _assert_same(per_row, packed)


def _learner(packed_rows: str):
    from ablate.trainer import Learner

    cfg = OmegaConf.create(OmegaConf.to_container(compose(["generator=mock", "train.micro_batch_size=4",
                                                          f"run.packed_rows={packed_rows}"]),
                                                  resolve=True, enum_to_str=True))
    return cfg, Learner(cfg)


@pytest.mark.parametrize("version,packed_rows,packed,says", [
    ("2.13", "null", True, "packed rows, attention within each row by torch's varlen_attn"),
    ("2.10", "null", False, "padded rows (the per-row Scorer): torch "),
    ("2.9", "null", False, "padded rows (the per-row Scorer): torch "),
    ("2.10", "true", True, "packed rows (run.packed_rows=true), attended row by row: torch "),
    ("2.13", "false", False, "padded rows (run.packed_rows=false)"),
])
def test_the_learner_says_its_form_once_in_the_runs_log(monkeypatch, capsys, version, packed_rows, packed, says):
    """The learner's form, and why, one line on stderr when it is built: packed through varlen, padded where varlen
    does not run, or packed row by row where run.packed_rows=true forces it there; a step's passes add none."""
    _on_torch(monkeypatch, version)
    cfg, learner = _learner(packed_rows)
    assert learner.packed == packed and isinstance(learner.scorer, PackedScorer) == packed
    ro = build(cfg.generator, cfg=cfg).rollouts(list(range(4)), 0, compute=2000.0)
    learner.step(ro, torch.arange(ro.n, dtype=torch.float32) % 3, torch.ones(ro.n, dtype=torch.bool))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("learner: ")]
    assert len(lines) == 1 and lines[0].startswith(f"learner: {says}"), lines


def test_a_packed_pass_reads_the_device_once_before_its_forward_and_never_in_its_backward(monkeypatch):
    """On the CUDA branch (emulated), scoring a packed pass reads the device once (its sizes and longest row, one
    `tolist`, before the decoder runs: no probe of the positions by transformers' mask code), and its backward reads
    nothing."""
    with host_reads(monkeypatch) as reads:
        calls = _on_torch(monkeypatch, "2.13", reads=reads)
        batch, upstream = _batch()
        scorer = PackedScorer(_model("llama3"), precision.fp32_head)
        decoder = scorer.model.get_decoder()
        forward = decoder.forward
        monkeypatch.setattr(decoder, "forward",
                            lambda **kwargs: setattr(reads, "phase", "decoder") or forward(**kwargs))
        reads.phase = "scoring"
        logp = scorer(*batch)
        reads.phase = "backward"
        (logp * upstream).sum().backward()
    assert len(calls) == LAYERS
    assert [r for r in reads.reads if r[0] != "before"] == [("scoring", "tolist")], reads.reads


def test_a_learner_step_reads_the_device_once_a_pass_and_none_between_its_forward_and_backward(monkeypatch):
    """A packed learner step on the CUDA branch (emulated): each pass reads the device once, in its scoring before the
    decoder; nothing between its forward and its backward (the log-prob gap summed on the device), nor in its
    backward, nor after it (the loss summed on the device, read once after the step's last pass with the gap)."""
    with host_reads(monkeypatch) as reads:
        _on_torch(monkeypatch, "2.13", reads=reads)
        cfg, learner = _learner("true")
        ro = build(cfg.generator, cfg=cfg).rollouts(list(range(8)), 0, compute=2000.0)
        scorer, backward, passes = learner.scorer, torch.Tensor.backward, []

        def scored(*args):
            reads.phase = f"forward {len(passes)}"
            passes.append(scorer(*args))
            reads.phase = f"loss {len(passes) - 1}"
            return passes[-1]

        def backed(self, *args, **kwargs):
            reads.phase = f"backward {len(passes) - 1}"
            backward(self, *args, **kwargs)
            reads.phase = f"after {len(passes) - 1}"

        learner.scorer = scored
        monkeypatch.setattr(torch.Tensor, "backward", backed)
        reads.reads.clear()
        learner.step(ro, torch.arange(ro.n, dtype=torch.float32) % 3, torch.ones(ro.n, dtype=torch.bool))
    counts, last = reads.per_phase(), len(passes) - 1
    assert len(passes) > 2
    assert [counts.get(f"forward {i}", 0) for i in range(len(passes))] == [1] * len(passes), counts
    assert not any(counts.get(f"{phase} {i}") for phase in ("loss", "backward") for i in range(len(passes))), counts
    assert not any(counts.get(f"after {i}") for i in range(last)), counts
    assert counts.get(f"after {last}", 0) <= 4, counts  # the step's own: its loss and gap, its metrics


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
    where = spawn_ranks(_rank, tmp_path, nprocs=WORLD)
    ranks = [torch.load(where / f"out.{r}", weights_only=False) for r in range(WORLD)]
    for family in FAMILIES:
        batch, upstream = _batch()
        one = _scored(Scorer(_model(family), precision.fp32_head), batch, upstream)  # one process, every row
        for form, _ in FORMS:
            logp = torch.zeros_like(one[0])
            for rank, rows in enumerate(SHARES):
                logp[rows] = ranks[rank][family, form][0]
            for rank in range(WORLD):  # each rank holds the whole batch's gradient, summed over the ranks
                _assert_same(one, (logp, ranks[rank][family, form][1]))
