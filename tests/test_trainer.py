"""The trainer path: every option of every axis, selected by config alone, runs real optimizer steps."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from ablate import tracking
from ablate.config import compose
from ablate.registry import build
from ablate.trainer import Learner, train

CONF = Path(__file__).resolve().parents[1] / "conf"
pytestmark = pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
AXES = ["loss", "aggregation", "normalization", "precision", "length_control", "off_policy", "filtering"]
AXIS_OPTIONS = [(g, f.stem) for g in AXES for f in sorted((CONF / g).glob("*.yaml"))]


@pytest.fixture(scope="module")
def shared_outputs(tmp_path_factory):
    """One outputs folder for the module: the warm start is made once and loaded by every other run."""
    return tmp_path_factory.mktemp("outputs")


@pytest.mark.parametrize("group,option", AXIS_OPTIONS, ids=[f"{g}={o}" for g, o in AXIS_OPTIONS])
def test_every_axis_option_runs_two_optimizer_steps(group, option, shared_outputs, mlflow_uri):
    """The real trainer (tiny model, synthetic task, generator=hf) with one option switched, for two steps."""
    cfg = compose([f"{group}={option}", "train.steps=2", "task.n_val_prompts=16", "task.val_samples=2",
                   f"paths.outputs={shared_outputs}"])
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "axes"), f"{group}={option}", {})
    seen = []
    state = train(cfg, run_id, mlflow_uri, progress=lambda step, total, metrics: seen.append(metrics))
    assert state.step == 2 and not state.diverged
    assert [m["train/lr"] for m in seen] == [cfg.optim.lr / cfg.optim.warmup_steps * s for s in (1, 2)]
    assert all(torch.isfinite(torch.tensor(m["loss/policy"])) for m in seen)
    assert client.get_run(run_id).data.params[group + ".name"] == option
    assert client.get_run(run_id).info.status == "FINISHED"


def test_packed_rows_train_two_steps_and_validate_through_the_models_own_attention(shared_outputs, mlflow_uri,
                                                                                   monkeypatch):
    """The real trainer with packed passes (run.packed_rows=true, the default on a GPU in bf16): two steps, every
    token it computes a real one, and validation decoding (padded, with a cache) through the model's own attention:
    every mask call of validation's padded prompts gets a mask that hides each row's padding from every query (the
    packed passes' calls, with no padding, get none). tests/test_packing.py holds those calls to the bit."""
    from ablate import policy

    masks = []  # (the padding mask given, the attention mask made) of every call with padding
    made = policy._packed_mask

    def seen(**kwargs):
        mask = made(**kwargs)
        given = kwargs.get("attention_mask")
        if given is None or bool(given.all()):
            assert mask is None or given is not None, "a packed pass's call got a mask"
        else:
            masks.append((given.bool(), mask))
        return mask

    monkeypatch.setattr(policy, "_packed_mask", seen)
    cfg = compose(["run.packed_rows=true", "train.steps=2", "train.val_every=2", "task.n_val_prompts=16",
                   "task.val_samples=2", f"paths.outputs={shared_outputs}"])
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "axes"), "packed", {})
    seen = []
    state = train(cfg, run_id, mlflow_uri, progress=lambda step, total, metrics: seen.append(metrics))
    assert state.step == 2 and not state.diverged
    assert [m["perf/learner_token_efficiency"] for m in seen] == [1.0, 1.0]
    assert all(torch.isfinite(torch.tensor(m["loss/policy"])) for m in seen)
    assert len(client.get_metric_history(run_id, "val/pass_rate")) == 2  # step 0 and step 2
    assert masks, "validation made no call with padded prompts"
    for given, mask in masks:  # [rows, kv] real tokens; the mask [rows, 1, queries, kv], True: attended
        assert isinstance(mask, torch.Tensor) and mask.shape[-1] == given.shape[1], (given.shape, mask)
        hidden = ~given[:, None, None, :].expand_as(mask)
        assert not mask[hidden].any() and mask.any(dim=-1)[given[:, None, -mask.shape[2]:]].all()


def test_the_learner_calls_the_configured_functions():
    cfg = OmegaConf.create(OmegaConf.to_container(
        compose(["loss=gspo", "aggregation=token_mean", "normalization=none", "precision=bf16", "generator=mock"]),
        resolve=True))
    learner = Learner(cfg)
    names = {f.func.__name__ for f in (learner.loss, learner.aggregate, learner.normalize, learner.scorer.head)}
    assert names == {"gspo", "token_mean", "none", "bf16"}
    assert learner.loss.keywords == {"eps_low": 3e-3, "eps_high": 5e-3}


def _gradient(cfg, ro, rewards, **learner_settings) -> torch.Tensor:
    learner = Learner(cfg)  # the same seed: the same initial policy
    for name, value in learner_settings.items():
        setattr(learner, name, value)
    learner.optimizer.step = lambda: None  # keep the gradient to compare it
    learner.optimizer.zero_grad = lambda set_to_none=True: None
    learner.step(ro, rewards, torch.ones(ro.n, dtype=torch.bool))
    return torch.cat([p.grad.flatten() for p in learner.policy.parameters()])


def test_micro_batching_in_the_learner_gives_the_whole_batch_gradient():
    cfg = OmegaConf.create(OmegaConf.to_container(compose(["generator=mock"]), resolve=True, enum_to_str=True))
    ro = build(cfg.generator, cfg=cfg).rollouts(list(range(8)), 0, compute=2000.0)
    rewards = torch.arange(ro.n, dtype=torch.float32) % 3  # every prompt has reward variance
    whole = _gradient(cfg, ro, rewards, micro_batch=ro.n)
    assert whole.abs().sum() > 0
    # micro-batches of 5 rows, split across prompts; then of at most 120 padded tokens, cut to their longest row
    assert ro.lengths.max() + ro.prompt_mask.sum(1).max() < 120 < ro.n * ro.tokens.shape[1]
    for settings in ({"micro_batch": 5}, {"micro_batch": ro.n, "micro_tokens": 120}):
        assert torch.allclose(_gradient(cfg, ro, rewards, **settings), whole, rtol=1e-4, atol=1e-8), settings


def test_the_logprob_gap_is_over_the_tokens_of_the_weights_scored_by_hand():
    """train/logprob_gap: the generator's log-probs 0.25 below the trainer's on the rows sampled with the weights
    being scored (version 0 at the first step), 50 below on rows of another version and on a row whose first token
    is older (an in-flight update reached it): the gap is 0.25, those rows are left out; at the next step no row is of
    version 1, and there is no gap to log."""
    cfg = OmegaConf.create(OmegaConf.to_container(compose(["generator=mock"]), resolve=True, enum_to_str=True))
    ro = build(cfg.generator, cfg=cfg).rollouts(list(range(8)), 0, compute=2000.0)
    learner = Learner(cfg)
    learner.micro_batch = ro.n  # one pass: the log-probs below are the learner's own
    P, T = int(ro.prompt_mask.sum(1).max()), int(ro.lengths.max())
    on = ro.to(next(learner.policy.parameters()).device)  # where Learner.step scores them (CUDA under device=auto)
    with torch.no_grad():
        logp = learner.scorer(on.prompt_tokens[:, -P:], on.prompt_mask[:, -P:], on.tokens[:, :T], on.lengths).cpu()
    other = (ro.group % 2 == 1)[:, None].expand(-1, T).clone()  # every other prompt's completions: another version
    ro.versions = torch.where(other, 5, 0)
    ro.versions[0, 0] = -1  # row 0 (prompt 0's): its first token of an older version, the rest of version 0
    other[0] = True
    ro.gen_logprobs = torch.zeros_like(ro.gen_logprobs)
    ro.gen_logprobs[:, :T] = torch.where(other, logp - 50.0, logp - 0.25)
    rewards = torch.arange(ro.n, dtype=torch.float32) % 3
    keep = torch.ones(ro.n, dtype=torch.bool)
    assert learner.step(ro, rewards, keep)["train/logprob_gap"] == pytest.approx(0.25, abs=1e-5)
    assert "train/logprob_gap" not in learner.step(ro, rewards, keep)


def test_activation_checkpointing_gives_the_same_gradient():
    plain = OmegaConf.create(OmegaConf.to_container(compose(["generator=mock"]), resolve=True, enum_to_str=True))
    ro = build(plain.generator, cfg=plain).rollouts(list(range(4)), 0, compute=2000.0)
    rewards = torch.arange(ro.n, dtype=torch.float32) % 3
    checkpointed = OmegaConf.merge(plain, {"train": {"activation_checkpointing": True}})
    assert Learner(checkpointed).policy.is_gradient_checkpointing
    torch.testing.assert_close(_gradient(checkpointed, ro, rewards), _gradient(plain, ro, rewards))


def _train(overrides: list[str], outputs, mlflow_uri: str, experiment: str):
    """The real trainer on the composed overrides, into a new scalerl run: (client, run_id, every step's metrics)."""
    cfg = compose([*overrides, f"paths.outputs={outputs}"])
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, experiment), "scalerl", {})
    seen = []
    train(cfg, run_id, mlflow_uri, progress=lambda step, total, metrics: seen.append(metrics))
    return client, run_id, seen


def test_the_math_task_runs_through_the_trainer_with_its_answer_checking(tmp_path, mlflow_uri, capsys):
    """task=math on the tiny model (it solves nothing: the point is the path, prompts in, checked answers out)."""
    client, run_id, seen = _train(["task=math", "generation.max_prompt_tokens=256", "train.steps=2",
                                   "task.n_val_prompts=4", "task.val_samples=2"],
                                  tmp_path, mlflow_uri, "math")
    assert len(seen) == 2 and client.get_run(run_id).info.status == "FINISHED"
    assert client.get_run(run_id).data.params["task.name"] == "math"
    assert all(0.0 <= m["train/reward_mean"] <= 1.0 for m in seen)
    # a random model: no answer is right; the run says so after its first step and validation
    assert seen[0]["train/pass_rate"] == 0.0
    tags = client.get_run(run_id).data.tags
    assert tags["ablate.alarm.no_reward"].startswith("no answer has been right yet")
    assert "WARNING (no_reward)" in capsys.readouterr().err
    assert ("ablate.alarm.truncated" in tags) == (seen[0]["train/truncation_rate"] >= 0.95)


def test_the_model_presets_build_the_sizes_they_say():
    from ablate.policy import build_policy

    for preset, low, high in (("tiny", 1e5, 3e5), ("small", 2e6, 6e6)):
        cfg = compose([f"model={preset}"])
        n = sum(p.numel() for p in build_policy(cfg.model, 0).parameters())
        assert low <= n <= high, (preset, n)


def test_flops_count_generated_tokens_and_the_trained_tokens_of_the_rows_filtering_keeps():
    from ablate.trainer import _step_flops

    cfg = OmegaConf.create(OmegaConf.to_container(compose(["generator=mock"]), resolve=True, enum_to_str=True))
    ro = build(cfg.generator, cfg=cfg).rollouts([0, 1], 0, compute=2000.0)
    keep = torch.ones(ro.n, dtype=torch.bool)
    keep[: ro.n // 2] = False  # the first prompt filtered out: its rows are generated, not trained
    generated, trained = int(ro.lengths.sum()), int(ro.mask[ro.n // 2:].sum())
    flops = _step_flops(1000, ro, keep)
    assert (flops.generate, flops.train) == (2 * 1000 * generated, 6 * 1000 * trained)
    assert flops.total == 2 * 1000 * generated + 6 * 1000 * trained


def test_with_a_reference_throughput_compute_is_the_runs_flops_at_it(tmp_path, mlflow_uri):
    """train.reference_tflops on one device: compute/gpu_hours = compute/flops / (TFLOP/s x 1e12 x 3600), step by
    step: the same on every machine, whatever else it runs."""
    client, run_id, seen = _train(["train.steps=3", "task.n_val_prompts=4", "task.val_samples=1",
                                   "train.reference_tflops=0.5", "train.reference_layout=null"], tmp_path, mlflow_uri,
                                  "clock")
    # the warm-started tiny model ends its rows and answers right: no alarm
    assert not [tag for tag in client.get_run(run_id).data.tags if tag.startswith("ablate.alarm.")]
    for m in seen:
        assert m["compute/gpu_hours"] == pytest.approx(m["compute/flops"] / (0.5e12 * 3600), rel=1e-12)
        assert "compute/generator_idle_frac" not in m
    assert seen[-1]["compute/flops"] > seen[0]["compute/flops"] > 0


@pytest.mark.parametrize("off_policy", ["pipeline_rl", "ppo_off_policy"])
def test_on_a_generator_and_a_trainer_device_every_device_counts_while_it_idles(tmp_path, mlflow_uri, off_policy):
    """train.reference_layout=[1, 1]: two devices for the whole run, so, at the end of a round of batches started on
    the same weights, at least the FLOPs at the throughput (each device does at most its own side's work) and at
    most twice that (the sides taking turns); PPO-off-policy-2's rounds take turns exactly: 2 x the FLOPs at the end
    of each round. (Mid-round a step also waits for the rest of its round's generation: more than 2x then.)"""
    *_, seen = _train(["train.steps=4", "task.n_val_prompts=4", "task.val_samples=1", "train.reference_tflops=1.0",
                       "train.reference_layout=[1,1]", f"off_policy={off_policy}", "off_policy.k=2"],
                      tmp_path, mlflow_uri, "clock2")
    hours_of_flops = [m["compute/flops"] / (1e12 * 3600) for m in seen]
    assert hours_of_flops[-1] * (1 - 1e-12) <= seen[-1]["compute/gpu_hours"] <= 2 * hours_of_flops[-1] * (1 + 1e-12)
    assert all(a["compute/gpu_hours"] < b["compute/gpu_hours"] for a, b in zip(seen, seen[1:]))
    assert all(0.0 <= m["compute/generator_idle_frac"] < 1.0 for m in seen)
    if off_policy == "ppo_off_policy":
        for end in (2, 4):
            assert seen[end - 1]["compute/gpu_hours"] == pytest.approx(2 * hours_of_flops[end - 1], rel=1e-12)


def test_the_cluster_metrics_of_a_step_by_hand():
    """perf/trainer_mfu = 6 N x tokens forwarded (prompt + completion of the kept rows) / learner seconds / (ranks x
    peak): N = 1000, kept row 3 prompt + 4 completion tokens (the other row, 2 + 5, filtered out), 2 s, 2 ranks of
    1000 FLOP/s: 6 * 1000 * 7 / 2 / 2000 = 10.5. Weight sync = the trainer's publish + the engine's load."""
    from ablate.trainer import _cluster_perf

    ro = SimpleNamespace(prompt_mask=torch.tensor([[False, True, True, True], [False, False, True, True]]),
                         lengths=torch.tensor([4, 5]))
    run = OmegaConf.create({"peak_tflops": 1e-9})
    perf = _cluster_perf(run, 1000, ro, torch.tensor([True, False]), 2.0, 0.25, 2, {"perf/engine_load_s": 0.5})
    assert perf["perf/trainer_mfu"] == pytest.approx(10.5)
    assert perf["perf/weight_sync_s"] == 0.75 and perf["perf/weight_publish_s"] == 0.25
    assert perf["perf/learner_s"] == 2.0 and perf["perf/engine_load_s"] == 0.5
    off = _cluster_perf(OmegaConf.create({"peak_tflops": 0.0}), 1000, ro, torch.tensor([True, True]), 2.0, 0.25, 1, {})
    assert "perf/trainer_mfu" not in off and off["perf/weight_sync_s"] == 0.25


def test_a_run_whose_setup_fails_ends_failed_not_scheduled(tmp_path, mlflow_uri):
    """A failure before the first step (here the policy: a vocabulary smaller than the tokenizer's) ends the run
    FAILED in the store, with the error raised as it was; before, the run stayed SCHEDULED."""
    cfg = compose(["generator=mock", "model.vocab_size=5", f"paths.outputs={tmp_path}"])
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "setup"), "scalerl", {})
    assert client.get_run(run_id).info.status == "SCHEDULED"
    with pytest.raises(ValueError, match="model.vocab_size=5 is smaller than the tokenizer's"):
        train(cfg, run_id, mlflow_uri)
    assert client.get_run(run_id).info.status == "FAILED"


def test_a_second_ctrl_c_while_the_first_unwinds_is_ignored_then_ctrl_c_is_as_before():
    """`train` takes Ctrl-C once (ablate.trainer._one_ctrl_c): a second SIGINT while the first KeyboardInterrupt
    unwinds (a sweep passing Ctrl-C on to its workers, which the terminal has already sent them) does not cut the
    run's close short; once `train` has returned, SIGINT is handled as it was before."""
    import os
    import signal
    import time

    from ablate.trainer import _one_ctrl_c

    closed = []

    @_one_ctrl_c
    def run() -> None:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the KeyboardInterrupt comes here
        except KeyboardInterrupt:
            os.kill(os.getpid(), signal.SIGINT)  # the second, while the run closes
            time.sleep(0.2)  # (without the guard: a second KeyboardInterrupt here)
            closed.append("KILLED")
            raise

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        run()
    assert closed == ["KILLED"]
    assert signal.getsignal(signal.SIGINT) is before


def test_validation_is_counted_apart_from_the_laws_compute(tmp_path, mlflow_uri, monkeypatch):
    """The wall clock counts a step's device-hours, not the validation after it (before, the next step's did):
    validation's go to compute/val_gpu_hours. Each validation here takes 1,000 s more on the trainer's clock (its
    perf_counter moved on, not slept: a loaded machine's slow steps are seconds, never that), on 1 device (CPU)."""
    import time

    from ablate import trainer
    from ablate.generators.pipelined import PipelineGenerator

    class Clock:  # the trainer's `time`, its perf_counter `offset` seconds ahead
        offset = 0.0

        def __getattr__(self, name):
            return getattr(time, name)

        def perf_counter(self):
            return time.perf_counter() + self.offset

    clock, real = Clock(), PipelineGenerator.validate

    def slow(self, *args, **kwargs):
        clock.offset += 1000.0
        return real(self, *args, **kwargs)
    monkeypatch.setattr(trainer, "time", clock)
    monkeypatch.setattr(PipelineGenerator, "validate", slow)
    *_, seen = _train(["train.steps=4", "train.val_every=2", "task.n_val_prompts=4", "task.val_samples=1",
                       "train.reference_tflops=0"], tmp_path, mlflow_uri, "val-apart")
    hours = [m["compute/gpu_hours"] for m in seen]
    steps = [b - a for a, b in zip([0.0, *hours], hours)]
    assert max(steps) < 500 / 3600  # step 3, after step 2's validation, too: each step its own time only
    # validations at steps 0, 2 and 4
    assert seen[1]["compute/val_gpu_hours"] >= 2000 / 3600 and seen[3]["compute/val_gpu_hours"] >= 3000 / 3600
    assert "compute/val_gpu_hours" not in seen[0]


def test_a_validation_waits_for_a_step_whose_weights_vllm_may_take(tmp_path, mlflow_uri, monkeypatch):
    """generator=vllm under PPO-off-policy-k validates a due step's weights at the next round's first step (a multiple
    of k), where vLLM takes them anyway, not mid-round on our torch engine; the last step cannot wait. Here its rule
    (VLLMGenerator.validation_step) runs on the hf generator (vLLM is not in this suite): k = 2, every 3 steps of
    7: validations at 0, 4 (3's), 6 and 7; under PipelineRL, 0, 3, 6 and 7."""
    from ablate.generators.pipelined import PipelineGenerator
    from ablate.generators.vllm import VLLMGenerator
    from ablate.offpolicy import PipelineRL, PPOOffPolicy, first_loadable

    assert [first_loadable(PPOOffPolicy(k=8), s) for s in (96, 97, 100, 104)] == [96, 104, 104, 104]
    assert [first_loadable(PipelineRL(k=8), s) for s in (97, 100)] == [97, 100]
    monkeypatch.setattr(PipelineGenerator, "validation_step", VLLMGenerator.validation_step)
    common = ["train.steps=7", "train.val_every=3", "task.n_val_prompts=2", "task.val_samples=1", "off_policy.k=2"]
    for off_policy, validated in (("ppo_off_policy", [4, 6, 7]), ("pipeline_rl", [3, 6, 7])):
        *_, seen = _train([*common, f"off_policy={off_policy}"], tmp_path / off_policy, mlflow_uri, off_policy)
        assert [step for step, m in enumerate(seen, 1) if "val/pass_rate" in m] == validated, off_policy


def test_a_progress_bar_writes_to_the_stderr_of_its_time_not_of_the_first_import(monkeypatch):
    """StepBar and SweepDisplay take sys.stderr when made: an in-process command whose stderr was captured (and
    closed) before must not leave a later one writing to it ("I/O operation on closed file")."""
    import io

    from ablate.progress import StepBar, SweepDisplay

    now = io.StringIO()
    monkeypatch.setattr(sys, "stderr", now)
    assert StepBar("scalerl").stream is now and SweepDisplay(None, None).stream is now
