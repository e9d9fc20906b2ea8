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
    assert cost.Throughput.of(8e9, 989.0, 0.22).generate == pytest.approx(2892.5)
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


def test_one_peak_a_gpu_kind_and_one_mfu_price_the_learner_in_the_cost_model_and_the_benches(monkeypatch, capsys):
    """A GPU kind's dense bf16 peak is one figure, ablate.cost.PEAK_TFLOPS, half the data sheets' "with sparsity"
    one: an SXM H100 or H200 989 TFLOP/s (1,979 / 2), an H100 or H200 NVL 835 (1,671 / 2), an H100 PCIe 756 (1,513 /
    2), an A100 312. Before, one "H100" entry priced the PCIe and NVL forms at the SXM's 989 (a PCIe H100 31% too
    fast). A device is matched by the name torch reports; a GH200 or any kind the table lacks is None. One default
    MFU, this learner's estimate cost.TRAIN_MFU (0.22), prices a trainer GPU in the pre-flight (launcher.train_mfu
    unset) and in bench/bench_cluster.py alike: 0.22 x 989e12 / (6 x 8e9) = 4,532.9 tokens/s at 8B; before, 0.32
    (6,593), plain transformers' on short rows. bench_gpu.py reads the CUDA device's kind, and refuses one the table
    lacks, naming --peak-tflops."""
    import sys
    from types import SimpleNamespace

    import torch

    from conftest import ROOT
    from test_compute import _bench_cluster

    assert cost.PEAK_TFLOPS == {"H100 SXM": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H200 SXM": 989.0,
                                "H200 NVL": 835.0, "A100": 312.0}
    names = {"NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA H100 PCIe": "H100 PCIe", "NVIDIA H100 NVL": "H100 NVL",
             "NVIDIA H200": "H200 SXM", "NVIDIA H200 NVL": "H200 NVL", "NVIDIA A100-SXM4-80GB": "A100",
             "NVIDIA A100 80GB PCIe": "A100", "NVIDIA GH200 480GB": None, "NVIDIA B200": None, "cpu": None}
    assert {name: cost.gpu_kind(name) for name in names} == names
    assert [cost.peak_tflops(name) for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
                                                "NVIDIA H200", "NVIDIA GH200 480GB")] == [989.0, 756.0, 835.0, 989.0,
                                                                                          None]

    assert cost.TRAIN_MFU == 0.22
    preflight = cost.throughput(compose(["experiment=paper_8b", "run.peak_tflops=0"]), 8e9).train
    assert preflight == pytest.approx(0.22 * 989e12 / 48e9) == pytest.approx(4532.9, abs=0.05)
    assert cost.throughput(compose(["experiment=paper_8b", "launcher.train_mfu=0.3"]), 8e9).train == \
        pytest.approx(0.3 * 989e12 / 48e9)  # given: the run's own measurement
    assert cost.throughput(compose(["experiment=paper_8b", "run.peak_tflops=756"]), 8e9).train == \
        pytest.approx(0.22 * 756e12 / 48e9)  # a PCIe H100's peak given
    monkeypatch.setattr(sys, "argv", ["bench_cluster.py"])
    _bench_cluster().main()
    assert f"trainer {preflight:,.0f} tokens/s (22% MFU)" in capsys.readouterr().out

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import bench_gpu

    args = SimpleNamespace(peak_tflops=0.0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert bench_gpu.peak_tflops(args, torch.device("cuda"), torch.bfloat16) == 756.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GH200 480GB")
    with pytest.raises(SystemExit, match=r"^NVIDIA GH200 480GB: no dense bf16 peak for its kind in "
                                         r"ablate.cost.PEAK_TFLOPS \(H100 SXM, H100 NVL, H100 PCIe, H200 SXM, H200 "
                                         r"NVL, A100\): give --peak-tflops$"):
        bench_gpu.peak_tflops(args, torch.device("cuda"), torch.bfloat16)
    assert bench_gpu.peak_tflops(SimpleNamespace(peak_tflops=756.0), torch.device("cuda"), torch.bfloat16) == 756.0


# SMALL on 4 generator + 2 trainer GPUs: a step generates in 16 x 200 / 1,000 / 4 = 0.8 s. Every row trained
# (filtering.zero_variance=false, loo-batch) at 0.3 MFU: 16 x 300 / 50,000 / 2 = 0.048 s. Half the rows (zero-variance
# filtering on: cost.KEPT) at 0.0015 MFU, 250 tokens/s: 8 x 300 / 250 / 2 = 4.8 s
LAYOUT = [*SMALL, "run=fsdp", "run.trainer_gpus=2", "run.generator_gpus=4"]


def test_the_side_that_binds_a_run_and_what_a_learner_twice_as_fast_saves_by_hand():
    """Generation binds loo-batch at 0.3 MFU: PipelineRL-8's 96 steps take 7.2 + 0.048 + 87 x 0.8 + 0.048 = 76.896 s
    (the test above); a learner twice as fast saves its two exposed trainings' halves, 0.048 s: 6 x 0.048 / 3600
    GPU-hours, 0.06%. The sides would be even at 1,000 x 0.8 / 0.048 = 16,667 generated tokens/s a generator GPU.
    Learning binds the recipe (half its rows trained) at 0.0015 MFU: the first round's 9 batches decode in 7.2 s and
    then the trainer never waits, 7.2 + 96 x 4.8 = 468 s; at twice the speed 7.2 + 96 x 2.4 = 237.6 s: 6 x 230.4 /
    3600 = 0.384 GPU-hours saved, 49.2%; even at 1,000 x 0.8 / 4.8 = 166.7 tokens/s. PPO-off-policy-8 at the same
    speeds takes turns: 12 rounds of 8 x (0.8 + 4.8) = 537.6 s, at twice the speed 12 x 8 x (0.8 + 2.4) = 307.2 s."""
    assert cost.rows_trained(compose(SMALL)) == cost.KEPT == 0.5
    assert cost.rows_trained(compose([*SMALL, "filtering.zero_variance=false"])) == 1.0

    generating = cost.binding(compose([*LAYOUT, "filtering.zero_variance=false"]), 1e9, 200.0)
    assert (generating.run.generate_s, generating.run.train_s) == pytest.approx((0.8, 0.048))
    assert (generating.run.binds, generating.run.turns) == ("generation", False)
    assert generating.run.gpu_hours == pytest.approx(6 * 76.896 / 3600)
    assert generating.saved == pytest.approx(6 * 0.048 / 3600)
    assert generating.saved / generating.run.gpu_hours == pytest.approx(0.048 / 76.896)
    assert generating.even == pytest.approx(1000 * 0.8 / 0.048)

    learning = cost.binding(compose([*LAYOUT, "launcher.train_mfu=0.0015"]), 1e9, 200.0)
    assert (learning.run.generate_s, learning.run.train_s) == pytest.approx((0.8, 4.8))
    assert (learning.run.binds, learning.run.turns) == ("learning", False)
    assert learning.run.gpu_hours == pytest.approx(6 * 468.0 / 3600)
    assert learning.faster.gpu_hours == pytest.approx(6 * 237.6 / 3600)
    assert learning.saved == pytest.approx(0.384) and learning.saved / learning.run.gpu_hours == pytest.approx(0.4923,
                                                                                                               abs=1e-4)
    assert learning.even == pytest.approx(1000 * 0.8 / 4.8)

    turns = cost.binding(compose([*LAYOUT, "launcher.train_mfu=0.0015", "off_policy=ppo_off_policy"]), 1e9, 200.0)
    assert (turns.run.binds, turns.run.turns) == ("learning", True)
    assert (turns.run.gpu_hours, turns.faster.gpu_hours) == pytest.approx((6 * 537.6 / 3600, 6 * 307.2 / 3600))
    # the engine beside trainer rank 0 (no generator GPUs): 3.2 s decoding on one GPU, then 0.096 s training on it
    alone = cost.binding(compose([*SMALL, "filtering.zero_variance=false"]), 1e9, 200.0)
    assert (alone.run.binds, alone.run.turns, alone.saved) == ("generation", True, pytest.approx(96 * 0.048 / 3600))


def test_the_preflight_says_which_side_binds_each_variant_and_what_a_2x_learner_saves(monkeypatch):
    """The pre-flight's cost lines, the learning-bound runs of the test above at 5 TFLOP/s (0.3 MFU: 250 tokens/s)
    for 9,600 steps: the recipe 7.2 + 9,600 x 4.8 = 46,087.2 s on 6 GPUs, 76.8 GPU-hours (at the full budget 14.4 +
    9,600 x 8 s, 128.0), 4.8 s a step, 12.8 h, its generators idle 1 - 9,600 x 0.8 / 46,087.2 = 83%; a learner twice
    as fast saves 9,600 x 2.4 s x 6 GPUs = 38.4 GPU-hours, 50%. PPO-off-policy: 1,200 rounds of 44.8 s, 89.6
    GPU-hours, and 38.4 saved of them, 43%."""
    from types import SimpleNamespace

    from ablate import checks, preflight

    monkeypatch.setattr(checks, "model_shape", lambda model: SimpleNamespace(params=1e9))
    base = [*LAYOUT, "run.peak_tflops=5", "train.steps=9600", "train.val_every=0"]
    planned = [SimpleNamespace(cfg=compose(base), variant=SimpleNamespace(label="scalerl")),
               SimpleNamespace(cfg=compose([*base, "off_policy=ppo_off_policy"]),
                               variant=SimpleNamespace(label="loo-8op"))]
    printed = "\n".join(preflight.cost_lines(planned)) + "\n"
    assert ("GPU-hours (ablate/cost.py's estimate: 1,000 tokens/s a generator GPU, 250 a trainer GPU at 30% MFU of 5 "
            "TFLOP/s; prompts at their budget, 100 tokens; completions of 200 on average, or 400; every row trained "
            "without zero-variance filtering, 50% with it):\n"
            "  scalerl: 77 GPU-hours (128), 5 s a step, 12.8 h on 6 GPUs, generators idle 83%\n") in printed
    assert ("the side that binds, at half the budget (generation: the generator GPUs' tokens/s; learning: the trainer "
            "GPUs' MFU):\n"
            "  scalerl: learning: 1 s generating, 5 s learning a step (50% of rows trained); a 2x learner saves 38 "
            "GPU-h (50%); generation binds below 167 tokens/s a generator GPU\n"
            "  loo-8op: learning (the two in turns): 1 s generating, 5 s learning a step (50% of rows trained); a 2x "
            "learner saves 38 GPU-h (43%); generation binds below 167 tokens/s a generator GPU\n") in printed
