"""Every tensor is made on its inputs' device: the GPU's device bugs, caught on the CPU.

On a GPU, a tensor made without `device=` lands on the CPU beside CUDA inputs, and the next op fails ("Expected all
tensors to be on the same device"; docs/design.md#device-placement). On the CPU the same line is harmless, unless
the default device is something else: under `torch.set_default_device("meta")`, with every input on the CPU, a tensor
made without `device=` lands on meta, and then index_add raises, `.item()` raises, or the output comes back on meta.
Each test here runs the code under that default with CPU inputs and checks that what comes out is on the CPU and
equals the same call made normally. The whole-run tests cover the trainer, the Learner, the pipeline, the engine,
validation and checkpoints. `pytest -m gpu` runs the same runs on CUDA when there is one.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import fields

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from ablate import tracking
from ablate.config import compose
from ablate.policy import build_policy, build_tokenizer
from ablate.registry import build
from ablate.trainer import Learner, PromptSampler, train

SHORT = ["train.steps=3", "train.val_every=2", "train.checkpoint_every=2", "task.n_val_prompts=8",
         "task.val_samples=2", "task.warm_start_steps=20", "model.device=cpu"]


@contextmanager
def meta_default():
    """Tensors made without `device=` go to meta while inside."""
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


def _plain(cfg_overrides: list[str]):
    return OmegaConf.create(OmegaConf.to_container(compose(cfg_overrides), resolve=True, enum_to_str=True))


def _assert_same(a, b):
    """Same values, and on the CPU (nothing made on meta, nothing moved)."""
    if isinstance(a, torch.Tensor):
        assert a.device.type == "cpu", f"made on {a.device}"
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    else:
        assert a == b


def test_the_meta_default_catches_a_tensor_made_without_device():
    """The probe itself: the bug it is for shows under it (it raises, or its output lands on meta: torch 2.13 raises,
    2.11's meta index_add does not check the index's device), and is silent without it."""
    group = torch.tensor([0, 0, 1])

    def buggy(rewards):
        return torch.zeros(int(group.max()) + 1, dtype=rewards.dtype).index_add(0, group, rewards)

    rewards = torch.ones(3)
    assert buggy(rewards).tolist() == [2.0, 1.0]
    with meta_default():
        try:
            out = buggy(rewards)
        except RuntimeError as e:
            assert "same device" in str(e)
        else:
            assert out.device.type == "meta"


# ---------------------------------------------------------------------------------------------------- the RL core
def _rl_inputs():
    g = torch.Generator().manual_seed(0)
    N, T = 12, 7
    group = torch.arange(4).repeat_interleave(3)
    rewards = torch.tensor([1., 0., 1., 1., 1., 1., 0., 0., 1., 0., 0., 0.])
    mask = torch.rand(N, T, generator=g) > 0.3
    mask[5] = False  # a sample with no token in the loss
    logp = -torch.rand(N, T, generator=g)
    H, V = 8, 11
    return {"N": N, "T": T, "group": group, "rewards": rewards, "mask": mask, "logp": logp,
            "old_logp": logp - 0.1 * torch.randn(N, T, generator=g), "adv": torch.randn(N, generator=g),
            "per_token": torch.randn(N, T, generator=g), "lengths": torch.tensor([3, 9, 12, 14, 1, 2, 16, 5, 8, 10,
                                                                                   11, 13]),
            "hidden": torch.randn(N, T, H, generator=g), "weight": torch.randn(V, H, generator=g),
            "targets": torch.randint(0, V, (N, T), generator=g)}


def _call(group: str, option, x: dict):
    """The option's function(s) on CPU inputs: every output, for comparing."""
    if group == "loss":
        return [option(x["logp"], x["old_logp"], x["adv"], x["mask"])]
    if group == "aggregation":
        from ablate.rl.aggregation import token_weights

        return [option(x["per_token"], x["mask"], x["group"]), token_weights(option, x["mask"], x["group"])]
    if group == "normalization":
        return [option(x["rewards"], x["group"])]
    if group == "precision":
        return [option(x["hidden"], x["weight"], x["targets"], chunk_size=5)]
    if group == "length_control":
        return [option.reward_shaping(x["lengths"], 12), option.think_budget(np.random.default_rng(0), 100)]
    if group == "filtering":
        keep = option.keep(x["rewards"], x["group"])
        option.observe(x["group"] + 100, x["rewards"] > 0)
        return [keep, sorted(option.retired())]
    raise AssertionError(group)


RL_OPTIONS = [(g, o) for g in ("loss", "aggregation", "normalization", "precision", "length_control", "filtering")
              for o in {"loss": ["cispo", "dapo", "dapo_qwen", "gspo", "grpo"],
                        "aggregation": ["prompt_mean", "sample_mean", "token_mean"],
                        "normalization": ["batch", "prompt", "none"], "precision": ["fp32_head", "fp32_exact", "bf16"],
                        "length_control": ["interruption", "length_penalty", "truncation"],
                        "filtering": ["both", "zero_variance", "none"]}[g]]


@pytest.mark.parametrize("group,option", RL_OPTIONS, ids=[f"{g}={o}" for g, o in RL_OPTIONS])
def test_every_rl_core_option_makes_its_tensors_on_its_inputs_device(group, option):
    node = _plain([f"{group}={option}"])[group]
    expected = _call(group, build(node), _rl_inputs())
    with meta_default():
        got = _call(group, build(node), _cpu(_rl_inputs))
    for a, b in zip(got, expected):
        _assert_same(a, b)


def _cpu(make):
    """Inputs made on the CPU even while the default device is meta (as a GPU run's inputs are on the GPU)."""
    with torch.device("cpu"):
        return make()


# ------------------------------------------------------------------------------------- the learner, the pipeline
def test_a_learner_step_on_cpu_inputs_makes_nothing_on_another_device():
    cfg = _plain(["generator=mock", "model.dtype=bfloat16", "model.device=cpu"])
    ro = build(cfg.generator, cfg=cfg).rollouts(list(range(8)), 0, compute=2000.0)
    rewards = torch.arange(ro.n, dtype=torch.float32) % 3
    keep = torch.ones(ro.n, dtype=torch.bool)
    keep[:8] = False  # one prompt filtered out
    results = []
    for context in (torch.device("cpu"), meta_default()):
        learner = Learner(cfg)  # the same seed: the same weights
        with context:
            results.append((learner.step(ro, rewards, keep), [p.detach().clone() for p in learner.policy.parameters()]))
    (normal, weights), (under_meta, weights_meta) = results
    assert normal == under_meta
    for a, b in zip(weights_meta, weights):
        _assert_same(a, b)


def test_a_pipeline_round_makes_its_rollouts_on_the_host_and_validates():
    cfg = compose(["batch.prompts_per_step=2", "batch.samples_per_prompt=2", "task.n_val_prompts=4",
                   "task.val_samples=2", "model.device=cpu", "model.dtype=bfloat16"])
    tok = build_tokenizer(cfg.model)
    task = build(cfg.task, tokenizer=tok, seed=cfg.seed)
    runs = []
    for context in (torch.device("cpu"), meta_default()):
        policy = build_policy(cfg.model, cfg.seed, tok)
        sampler = PromptSampler(task.size("train"), cfg.seed, build(cfg.filtering))
        generator = build(cfg.generator, cfg=cfg, task=task, sampler=sampler, policy=policy)
        with context:
            first = generator.batch(1)
            generator.publish(policy, 1)
            second = generator.batch(2)
            pass_rate = generator.validate(0.0, policy=policy, step=2)
        generator.close()
        runs.append((first, second, pass_rate))
    for normal, under_meta in zip(runs[0][:2], runs[1][:2]):
        for f in fields(normal):
            _assert_same(getattr(under_meta, f.name), getattr(normal, f.name))
    assert runs[0][2] == runs[1][2]


# ------------------------------------------------------------------------------------------------------ whole runs
@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One warm start for the module's runs."""
    return tmp_path_factory.mktemp("cache")


def _whole_run(overrides: list[str], mlflow_uri: str, tmp_path, cache, context) -> list[dict]:
    cfg = compose([*SHORT, f"paths.outputs={tmp_path}", f"paths.cache={cache}", *overrides])
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "device"), "scalerl", {})
    seen = []
    with context:
        state = train(cfg, run_id, mlflow_uri, progress=lambda step, total, metrics: seen.append(metrics))
    assert state.step == 3 and not state.diverged
    assert client.get_run(run_id).info.status == "FINISHED"
    return seen


WHOLE_RUNS = {
    "hf-bf16-compute": ["model.dtype=bfloat16"],
    "hf-every-base-option": ["model.dtype=bfloat16", "loss=dapo", "aggregation=sample_mean", "normalization=prompt",
                             "precision=bf16", "length_control=length_penalty", "off_policy=ppo_off_policy",
                             "off_policy.k=2"],
    "mock": ["generator=mock"],
}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.e2e) if name == "hf-bf16-compute" else name
                                  for name in WHOLE_RUNS])
def test_a_whole_run_makes_every_tensor_on_its_device(name, mlflow_uri, tmp_path, cache):
    """setup, warm start, validation, generation, the Learner, a checkpoint (step 2), the last step: all under the
    meta default; the metrics equal a normal run's, except the wall-clock ones."""
    normal = _whole_run(WHOLE_RUNS[name], mlflow_uri, tmp_path / "normal", cache, torch.device("cpu"))
    under_meta = _whole_run(WHOLE_RUNS[name], mlflow_uri, tmp_path / "meta", cache, meta_default())
    for a, b in zip(under_meta, normal):
        deterministic = {k for k in a if not k.startswith(("perf/", "compute/gpu_hours", "compute/val_gpu_hours"))}
        assert {k: a[k] for k in deterministic} == {k: b[k] for k in deterministic}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(WHOLE_RUNS))
def test_a_whole_run_on_cuda(name, mlflow_uri, tmp_path, cache):
    seen = _whole_run([*WHOLE_RUNS[name], "model.device=cuda"], mlflow_uri, tmp_path, cache, torch.device("cuda"))
    assert all(np.isfinite(m["loss/policy"]) for m in seen)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_fp32_heads_fused_bf16_matmul_on_cuda_matches_the_upcast_one():
    """On CUDA the fp32 head takes bf16 operands into fp32 logits in one GEMM (torch.mm's out_dtype, tensor cores);
    on CPU the same numbers come from the rounded operands upcast. Log-probs and gradients agree to the order of
    the sums (the fused backward rounds the incoming gradient to bf16, as autocast's matmuls do)."""
    from ablate.rl import precision

    torch.manual_seed(0)
    hidden, weight = torch.randn(300, 512) * 2, torch.randn(4000, 512) * 0.05
    targets = torch.randint(0, 4000, (300,))
    upstream = torch.randn(300)
    results = []
    for device in ("cuda", "cpu"):
        h, w = hidden.to(device).requires_grad_(), weight.to(device).requires_grad_()
        logp = precision.fp32_head(h, w, targets.to(device), operands=torch.bfloat16, chunk_size=128)
        (logp * upstream.to(device)).sum().backward()
        results.append([t.detach().cpu() for t in (logp, h.grad, w.grad)])
    (on_gpu, on_cpu) = results
    torch.testing.assert_close(on_gpu[0], on_cpu[0], rtol=0, atol=1e-4)
    for fused, upcast in zip(on_gpu[1:], on_cpu[1:]):
        torch.testing.assert_close(fused, upcast, rtol=2e-2, atol=1e-3)
