"""The cost model (ablate/cost.py) against step times worked out by hand, and the pre-flight that prints it."""

from __future__ import annotations

import pytest

from ablate import cost
from ablate.config import compose

# 16 rows a step (4 prompts x 4), prompts at their budget of 100 tokens, completions of 200 (half of 300 + 100);
# a generator GPU at 1,000 tokens/s, a trainer GPU at 0.3 x 1,000 TFLOP/s / 6e9 FLOPs a token = 50,000 tokens/s:
# one GPU generates a step in 16 x 200 / 1,000 = 3.2 s and trains it in 16 x 300 / 50,000 = 0.096 s
SMALL = ["batch.prompts_per_step=4", "batch.samples_per_prompt=4", "generation.max_prompt_tokens=100",
         "generation.max_think_tokens=300", "generation.max_answer_tokens=100", "train.steps=96", "train.val_every=100",
         "task.n_val_prompts=10", "task.val_samples=4", "run.peak_tflops=1000", "launcher.train_mfu=0.3",
         "launcher.gen_tokens_per_s=1000", "off_policy.k=8"]


def test_throughputs_and_a_steps_seconds_by_hand():
    speed = cost.Throughput.of(1e9, 1000.0, 0.3, 1000.0)
    assert (speed.generate, speed.train) == pytest.approx((1000.0, 50_000.0))
    assert cost.Work(16, 100.0, 200.0).seconds(speed) == pytest.approx((3.2, 0.096))
    assert cost.Work(16, 100.0, 200.0, kept=0.5).seconds(speed) == pytest.approx((3.2, 0.048))
    # unset: raw vLLM's 26,000 tokens/s at 0.89B, by FLOPs: 26,000 x 0.89 / 8 at 8B
    assert cost.Throughput.of(8e9, 989.0, 0.32).generate == pytest.approx(2892.5)
    with pytest.raises(ValueError, match="launcher.train_mfu"):
        cost.Throughput.of(1e9, 1000.0, 1.5)


def test_a_pipeline_a_ppo_round_and_a_colocated_engine_by_hand():
    """On 4 generator + 2 trainer GPUs a step generates in 0.8 s and trains in 0.048 s. PipelineRL-8: batches 1-9 all
    start on weights 0, one round, trained from its end (7.2 s: the reference clock's rule, docs/design.md); batch 10
    waits for weights 1 (7.248 s), then 87 batches back to back and the last one's training: 7.248 + 69.6 + 0.048 =
    76.896 s. PPO-off-policy-8 generates a round of 8
    (6.4 s) and then trains its 8 steps (0.384 s) before the next round starts: 12 x 6.784 = 81.408 s. Every GPU
    counted: x 6 GPUs. With the engine in trainer rank 0's process on one GPU: 96 x (3.2 + 0.096) s on 1 GPU."""
    pipeline = cost.estimate(compose([*SMALL, "run=fsdp", "run.trainer_gpus=2", "run.generator_gpus=4"]), 1e9, 200.0)
    assert pipeline.step_s * 96 == pytest.approx(76.896)
    assert pipeline.gpu_hours == pytest.approx(6 * 76.896 / 3600)
    assert pipeline.generator_idle == pytest.approx(1 - 76.8 / 76.896)
    # one validation (step 0's: 96 steps, every 100th): 10 x 4 rows x 200 tokens / 1,000 tokens/s / 4 GPUs = 2 s
    assert pipeline.val_gpu_hours == pytest.approx(2.0 * 6 / 3600)
    ppo = cost.estimate(compose([*SMALL, "run=fsdp", "run.trainer_gpus=2", "run.generator_gpus=4",
                                 "off_policy=ppo_off_policy"]), 1e9, 200.0)
    assert ppo.gpu_hours == pytest.approx(6 * 12 * (6.4 + 0.384) / 3600)
    alone = cost.estimate(compose(SMALL), 1e9, 200.0)
    assert (alone.gpus, alone.generator_idle) == (1, 0.0)
    assert alone.gpu_hours == pytest.approx(96 * (3.2 + 0.096) / 3600)
    assert alone.val_gpu_hours == pytest.approx(10 * 4 * 200 / 1000 / 3600)


def test_the_warnings_margin_and_its_size_by_hand():
    """SMALL on 2 trainer + 4 generator GPUs, 1e9 parameters: the learner's update of 16 rows at the full budget
    (100 + 400 tokens) at 50,000 tokens/s on 2 GPUs, 16 x 500 / 50,000 / 2 = 0.08 s; a validation of 10 x 4 rows
    at half the budget, 40 x 200 / 1,000 / 4 GPUs = 2 s; 6 GB a rank written at 2 GB/s, 3 s; the requeue's 30 s.
    Sized: 1.5 x 35.08 s is under 120 s, so 120; a margin of 200 s is 300 s, whole minutes: 300."""
    cfg = compose([*SMALL, "run=fsdp", "run.trainer_gpus=2", "run.generator_gpus=4", "launcher.checkpoint_gb_per_s=2"])
    margin = cost.warning_margin(cfg, 1e9, 6e9)
    assert margin == pytest.approx({"learner step": 0.08, "validation": 2.0, "checkpoint": 3.0, "requeue": 30.0})
    assert cost.signal_delay(margin) == 120
    assert cost.signal_delay({"learner step": 170.0, "requeue": 30.0}) == 300  # 300 s exactly
    assert cost.signal_delay({"learner step": 171.0, "requeue": 30.0}) == 360  # 301.5 s: the next minute
    no_validation = cost.warning_margin(compose([*SMALL, "train.val_every=0"]), 1e9, 6e9)
    assert no_validation["validation"] == 0.0 and no_validation["learner step"] == pytest.approx(0.16)  # 1 GPU


def test_one_peak_a_gpu_kind_prices_the_learner_in_the_cost_model_and_the_benches(monkeypatch, capsys):
    """A GPU kind's dense bf16 peak is one figure, ablate.cost.PEAK_TFLOPS: 989 TFLOP/s for an H100 and for an H200
    (the same tensor cores). The pre-flight's cost model (run.peak_tflops unset) and bench/bench_cluster.py at its
    defaults price the learner alike, launcher.train_mfu 0.32 x 989e12 / (6 x 8e9) = 6,593 tokens/s a trainer GPU;
    before, bench_cluster priced it against 798 (an 8192^3 matmul measured on an H100: achieved, not the peak), 5,320.
    The anchor's 32% is of 989: FSDP2 trained 64 x 1,152 tokens of the 0.89B Llama in 1.24 s, 6 x 0.89e9 x 73,728 /
    1.24 s = 317 TFLOP/s (of 798 it would be 39.8%). bench_gpu.py reads the CUDA device's kind, and refuses one the
    table lacks, naming --peak-tflops."""
    import sys
    from types import SimpleNamespace

    import torch

    from conftest import ROOT
    from test_compute import _bench_cluster

    assert cost.PEAK_TFLOPS == {"H100": 989.0, "H200": 989.0}
    assert cost.peak_tflops("NVIDIA H100 80GB HBM3") == cost.peak_tflops("NVIDIA H200") == 989.0
    assert cost.peak_tflops("NVIDIA A100-SXM4-80GB") is None
    assert 6 * cost.ANCHOR_PARAMS * 64 * 1152 / 1.24 / 989e12 == pytest.approx(0.321, abs=0.0005)

    preflight = cost.throughput(compose(["experiment=paper_8b", "run.peak_tflops=0"]), 8e9).train
    assert preflight == pytest.approx(0.32 * 989e12 / 48e9) == pytest.approx(6593.3, abs=0.05)
    monkeypatch.setattr(sys, "argv", ["bench_cluster.py"])
    _bench_cluster().main()
    assert f"trainer {preflight:,.0f} tokens/s (32% MFU)" in capsys.readouterr().out

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import bench_gpu

    args = SimpleNamespace(peak_tflops=0.0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert bench_gpu.peak_tflops(args, torch.device("cuda"), torch.bfloat16) == 989.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(SystemExit, match=r"^NVIDIA A100-SXM4-80GB: no dense bf16 peak for its kind in "
                                         r"ablate.cost.PEAK_TFLOPS \(H100, H200\): give --peak-tflops$"):
        bench_gpu.peak_tflops(args, torch.device("cuda"), torch.bfloat16)
    assert bench_gpu.peak_tflops(SimpleNamespace(peak_tflops=756.0), torch.device("cuda"), torch.bfloat16) == 756.0
