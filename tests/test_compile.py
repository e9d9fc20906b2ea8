"""A compiled decoder (ablate/policy.py: `compile_layers`): each decoder layer through torch.compile with dynamic
shapes, against the same layers eager. On the CPU, with a tiny Qwen3-shaped model (2 layers, grouped K/V): the same
log-probs within fp32 rounding (1e-5) and the same gradients, packed and per row; five passes of new lengths (and
of 3 or 4 rows) compiled once and recompiled at most once more (the count printed, with dynamo's reasons); under
activation checkpointing (which recomputes the compiled layer in the backward); and with the default backend
(inductor: e2e, a minute of compiling on 2 cores). The others compile with `aot_eager`: dynamo's graphs and guards,
so its recompiles, are the same whatever the backend, and AOT autograd traces the backward as inductor's does,
without inductor's code generation (still 6-17 s a test on 2 shared cores: e2e too); the recompile count's tests
trace with dynamo alone (its `eager` backend), in the default suite. Packed on the CPU, `_by_row` runs eagerly in
the compiled layer: one graph break a layer (its rows' bounds read to the host), counted here.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import transformers
from omegaconf import OmegaConf

from ablate.config import compose
from ablate.policy import PackedScorer, Scorer, compile_layers, linear_attention
from ablate.rl import precision
from ablate.trainer import Learner
from real_models import QWEN3_CONFIG

LAYERS = 2
# five passes: (rows, prompt width, completion width), each of other lengths than the others
PASSES = [(3, 5, 6), (4, 7, 9), (3, 3, 11), (4, 8, 4), (3, 6, 13)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from nothing and leaves nothing compiled (nor its recompile reasons, nor dynamo's counts)
    to the next."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def _model(seed: int = 0) -> torch.nn.Module:
    """Qwen3's architecture at 2 layers of width 64, 4 query and 2 K/V heads, a 256-token vocabulary; random weights;
    its attention as build_policy sets it for fp32 compute."""
    config = transformers.AutoConfig.for_model(**{
        **QWEN3_CONFIG, "vocab_size": 256, "bos_token_id": 1, "eos_token_id": 2, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": LAYERS, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16})
    torch.manual_seed(seed)
    return linear_attention(transformers.AutoModelForCausalLM.from_config(config), torch.float32)


def _batch(rows: int, prompt: int, completion: int, seed: int = 1):
    """Rows as the learner gets them: prompts left-padded (the first row's 2 tokens shorter), completions
    right-padded to lengths of 1 to `completion` (the last row the longest); and an upstream gradient."""
    g = torch.Generator().manual_seed(seed)
    prompt_tokens = torch.randint(3, 256, (rows, prompt), generator=g)
    prompt_mask = torch.ones(rows, prompt, dtype=torch.bool)
    prompt_mask[0, :2] = False
    prompt_tokens[~prompt_mask] = 0
    tokens = torch.randint(3, 256, (rows, completion), generator=g)
    lengths = torch.randint(1, completion + 1, (rows,), generator=g)
    lengths[-1] = completion
    return (prompt_tokens, prompt_mask, tokens, lengths), torch.randn(rows, completion, generator=g)


def _scored(scorer: torch.nn.Module, batch, upstream) -> tuple[torch.Tensor, dict]:
    """The scorer's log-probs and the gradient of sum(logp * upstream) for every parameter (zeroed first)."""
    scorer.zero_grad(set_to_none=True)
    logp = scorer(*batch)
    (logp * upstream).sum().backward()
    return logp.detach(), {n: p.grad.detach().clone() for n, p in scorer.model.named_parameters()}


def _assert_same(eager, compiled, atol: float = 1e-5) -> None:
    (logp, grads), (compiled_logp, compiled_grads) = eager, compiled
    torch.testing.assert_close(compiled_logp, logp, rtol=0, atol=atol, msg=lambda m: f"log-probs: {m}")
    for name, grad in grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=0, atol=atol, msg=lambda m: f"{name}'s grad: {m}")


def _recompiles() -> list[str]:
    """Every recompile since the last reset, as dynamo's guard failure that caused it (torch._dynamo.guard_failures:
    each code object's failed guards, one entry a recompile)."""
    return [reason for reasons in torch._dynamo.guard_failures.values() for reason in reasons]


def _graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def _pair(form: str, checkpointed: bool = False, backend: str = "aot_eager"):
    """(eager scorer, compiled scorer) of one model's weights, in `form` (packed or per_row)."""
    make = {"packed": PackedScorer, "per_row": Scorer}[form]
    model = _model()
    if checkpointed:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    eager = make(copy.deepcopy(model), precision.fp32_head)
    return eager, make(compile_layers(model, True, backend=backend), precision.fp32_head)


@pytest.mark.e2e  # 6-17 s each on 2 shared cores: AOT autograd's tracing
@pytest.mark.parametrize("form", ["packed", "per_row"])
def test_compiled_layers_give_the_eager_log_probs_and_gradients(form):
    eager, compiled = _pair(form)
    batch, upstream = _batch(*PASSES[1])
    want, got = _scored(eager, batch, upstream), _scored(compiled, batch, upstream)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # it was compiled, not run eagerly
    assert all(g.abs().sum() > 0 for g in got[1].values())  # every weight has a gradient
    _assert_same(want, got)


@pytest.mark.parametrize("form", ["packed", "per_row"])
def test_five_passes_of_new_lengths_recompile_at_most_once(form, capsys):
    """Dynamic shapes: the first pass compiles each layer's graphs, the next four (other lengths, 3 or 4 rows)
    reuse them, but for at most one recompile (dynamo's duck sizing may first take two equal sizes for one: the
    packed pass's 4 heads and 3 rows' 4 bounds). Printed: the recompiles after each pass, and the graph breaks.
    Dynamo alone (backend `eager`): its guards decide the recompiles, whatever backend compiles the graphs."""
    eager, compiled = _pair(form, backend="eager")
    counts = []
    for rows, prompt, completion in PASSES:
        batch, upstream = _batch(rows, prompt, completion)
        _assert_same(_scored(eager, batch, upstream), _scored(compiled, batch, upstream))
        counts.append(len(_recompiles()))
    with capsys.disabled():
        print(f"\n{form}: {LAYERS} compiled layers, passes (rows, prompt, completion) {PASSES}: recompiles after each "
              f"pass {counts}; graph breaks {_graph_breaks()} ({dict(torch._dynamo.utils.counters['graph_break'])}); "
              f"graphs {torch._dynamo.utils.counters['stats']['unique_graphs']}; reasons {_recompiles()}")
    assert counts[-1] <= 1, _recompiles()
    # per row, the layer has no break; packed, each one is at `_by_row` run eagerly (none inside its loop over rows)
    breaks = torch._dynamo.utils.counters["graph_break"]
    assert all("_by_row" in reason for reason in breaks) and bool(breaks) == (form == "packed"), dict(breaks)


@pytest.mark.e2e  # 6-17 s each on 2 shared cores: AOT autograd's tracing
@pytest.mark.parametrize("form", ["packed", "per_row"])
def test_under_activation_checkpointing_the_compiled_layers_give_the_eager_gradients(form):
    """Each layer recomputed in the backward through its compiled forward: the eager, uncompiled and
    checkpointed form's gradients; and the recomputation's calls compiled nothing more."""
    eager, compiled = _pair(form, checkpointed=True)
    assert all(layer.gradient_checkpointing for layer in compiled.model.get_decoder().layers)
    batch, upstream = _batch(*PASSES[0])
    _assert_same(_scored(eager, batch, upstream), _scored(compiled, batch, upstream))
    assert _recompiles() == []


def test_compile_layers_leaves_a_cpu_model_eager_unless_asked_and_compiles_in_place():
    model = _model()
    names = [n for n, _ in model.named_parameters()]
    layers = model.get_decoder().layers
    assert compile_layers(model) is model and all(layer._compiled_call_impl is None for layer in layers)
    compile_layers(model, True, backend="aot_eager")
    assert all(layer._compiled_call_impl is not None for layer in layers)
    assert [n for n, _ in model.named_parameters()] == names  # the same names: checkpoints load as before


def test_the_learner_compiles_its_decoder_layers_when_run_compile_layers_is_set():
    cfg = OmegaConf.create(OmegaConf.to_container(compose(["generator=mock"]), resolve=True, enum_to_str=True))
    assert cfg.run.compile_layers is False  # off until a lent GPU has run it (None: on CUDA alone)
    assert all(layer._compiled_call_impl is None for layer in Learner(cfg).policy.get_decoder().layers)
    cfg.run.compile_layers = True
    assert all(layer._compiled_call_impl is not None for layer in Learner(cfg).policy.get_decoder().layers)


@pytest.mark.e2e
@pytest.mark.parametrize("form", ["packed", "per_row"])
def test_with_inductor_the_compiled_layers_give_the_eager_log_probs_and_gradients(form):
    """The default backend, its generated kernels: the same numbers within fp32 rounding, a minute of compiling."""
    eager, compiled = _pair(form, backend="inductor")
    for rows, prompt, completion in PASSES[:2]:
        batch, upstream = _batch(rows, prompt, completion)
        _assert_same(_scored(eager, batch, upstream), _scored(compiled, batch, upstream))
    assert len(_recompiles()) <= 1, _recompiles()
