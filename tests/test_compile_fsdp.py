"""A compiled decoder under FSDP2 (ablate/policy.py: `compile_layers`, then ablate/distributed/layouts.py: `FSDP`) on
2 gloo ranks: each decoder layer runs as one graph, with no graph break inside it, and passes of new lengths compile
nothing more. A tiny Llama-3 and a tiny Qwen3 (its q/k norms inside the attention), random weights, bf16 compute
(the layers' matmuls gathered in bf16, their norms in fp32: so they stay), the per-row form (the packed form on the
CPU breaks once a layer by design, at `_by_row`: tests/test_compile.py); three passes forward and backward. Counted
by a backend of the test's own: the graphs dynamo hands it and each call of them; in the default suite dynamo's
graphs alone (its guards decide the breaks and the recompiles, whatever the backend), and under e2e through AOT
autograd too, its backward graphs counted. With each norm a shard group of its own (issue 54), FSDP2's hooks on the
norms cut a Llama layer into 4 graphs and a Qwen3 layer into 9, with a recompile. Printed: the counts, and dynamo's
recompile reasons. Why the norms are the root's: docs/training.md#a-compiled-decoder.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from ablate.policy import Scorer, compile_layers, linear_attention
from ablate.rl import precision
from conftest import spawn_ranks
from real_models import LLAMA3_CONFIG, QWEN3_CONFIG

FAMILIES = {"llama3": LLAMA3_CONFIG, "qwen3": QWEN3_CONFIG}
WORLD, LAYERS = 2, 2
PASSES = [(3, 5, 6), (4, 7, 9), (2, 3, 11)]  # (rows, prompt width, completion width): three shapes


def _model(family: str) -> torch.nn.Module:
    config = transformers.AutoConfig.for_model(**{
        **FAMILIES[family], "vocab_size": 256, "bos_token_id": 1, "eos_token_id": 2, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": LAYERS, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16})
    torch.manual_seed(0)
    return linear_attention(transformers.AutoModelForCausalLM.from_config(config), torch.bfloat16)


def _batch(rows: int, prompt: int, completion: int):
    """Rows as the learner gets them (prompts left-padded, completions right-padded), and an upstream gradient."""
    g = torch.Generator().manual_seed(rows * 100 + completion)
    prompt_tokens = torch.randint(3, 256, (rows, prompt), generator=g)
    prompt_mask = torch.ones(rows, prompt, dtype=torch.bool)
    prompt_mask[0, :2] = False
    tokens = torch.randint(3, 256, (rows, completion), generator=g)
    lengths = torch.randint(1, completion + 1, (rows,), generator=g)
    lengths[-1] = completion
    return (prompt_tokens, prompt_mask, tokens, lengths), torch.randn(rows, completion, generator=g)


class Counted:
    """A torch.compile backend that counts the graphs dynamo hands it (`compiled`), each call of a forward graph and,
    through AOT autograd (aot_eager: its graphs run as traced), of a backward graph (`calls`), and the dtypes of the
    decoder weights each graph takes, by kind (`weights`: "norm" for a norm's, "matmul" for the others). aot=False:
    dynamo's graphs run as they are, their backward by autograd (counted none): dynamo alone decides the graphs,
    the breaks and the recompiles, seconds faster."""

    def __init__(self, aot: bool):
        self.aot, self.compiled, self.calls, self.weights = aot, 0, {"forward": 0, "backward": 0}, set()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        self.compiled += 1
        for node, example in zip(gm.graph.find_nodes(op="placeholder"), example_inputs):
            if "_parameters_weight" in node.name and isinstance(example, torch.Tensor):
                self.weights.add(("norm" if "norm" in node.name else "matmul", example.dtype))
        if not self.aot:
            return self._counted("forward", gm)
        return aot_autograd(fw_compiler=lambda fw, _: self._counted("forward", fw, boxed=True),
                            bw_compiler=lambda bw, _: self._counted("backward", bw, boxed=True))(gm, example_inputs)

    def _counted(self, kind: str, gm: torch.fx.GraphModule, boxed: bool = False):
        from torch._functorch.aot_autograd import make_boxed_func

        def run(*args):
            self.calls[kind] += 1
            return gm(*args)
        return make_boxed_func(run) if boxed else run


def _counts(family: str, aot: bool) -> dict:
    """On this rank: the family's model compiled, wrapped by the FSDP layout, and each pass forward and backward:
    after each, the graphs a layer ran (forward, backward), the graphs compiled and the recompiles so far."""
    from ablate.distributed.layouts import FSDP

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    backend = Counted(aot)
    scorer = FSDP().wrap(Scorer(compile_layers(_model(family), True, backend=backend), precision.fp32_head,
                                compute_dtype=torch.bfloat16))
    passes = []
    for shape in PASSES:
        batch, upstream = _batch(*shape)
        backend.calls.update(forward=0, backward=0)
        (scorer(*batch) * upstream).sum().backward()
        passes.append({"per layer": (backend.calls["forward"] / LAYERS, backend.calls["backward"] / LAYERS),
                       "compiled": backend.compiled,
                       "recompiles": sum(len(r) for r in torch._dynamo.guard_failures.values())})
    return {"passes": passes, "weights": backend.weights,
            "breaks": sum(torch._dynamo.utils.counters["graph_break"].values()),
            "reasons": [str(r)[:300] for rs in torch._dynamo.guard_failures.values() for r in rs]}


def _rank(rank: int, init_file: str, aot: bool, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        found = {family: _counts(family, aot) for family in FAMILIES}
        if rank == 0:
            torch.save(found, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


# dynamo alone (10-20 s on 2 shared cores); through AOT autograd too, its backward graphs counted (30-40 s: e2e)
@pytest.fixture(scope="module", params=["dynamo", pytest.param("aot", marks=pytest.mark.e2e)])
def counted(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("compile-fsdp")
    aot = request.param == "aot"
    return aot, torch.load(spawn_ranks(_rank, folder, aot, nprocs=WORLD) / "out", weights_only=False)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_under_fsdp_each_compiled_layer_is_one_graph_and_new_lengths_recompile_nothing(counted, family, capsys):
    aot, found = counted
    found = found[family]
    with capsys.disabled():
        print(f"\n{family} under FSDP2 on {WORLD} ranks, {LAYERS} compiled layers, passes {PASSES}: graphs a layer "
              f"ran (forward, backward) {[p['per layer'] for p in found['passes']]}; graphs compiled "
              f"{[p['compiled'] for p in found['passes']]}; recompiles {[p['recompiles'] for p in found['passes']]};"
              f" graph breaks {found['breaks']}; recompile reasons {found['reasons']}")
    assert all(p["per layer"] == (1, int(aot)) for p in found["passes"]), found["passes"]
    assert found["breaks"] == 0
    # the layers' graphs compiled in the first pass (one shared by both, where dynamo's guards let it), none after
    compiled = [p["compiled"] for p in found["passes"]]
    assert compiled == compiled[:1] * len(PASSES) and 1 <= compiled[0] <= LAYERS, found["reasons"]
    assert [p["recompiles"] for p in found["passes"]] == [0] * len(PASSES), found["reasons"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_compiled_layers_take_their_norms_in_fp32_and_their_matmuls_in_bf16(counted, family):
    """What keeps a layer whole must not cost the norms their fp32 weights (FSDP's bf16 gather would round them)."""
    weights = counted[1][family]["weights"]
    assert weights == {("norm", torch.float32), ("matmul", torch.bfloat16)}, weights
