"""The reference clock (ablate/compute.py): device-hours of a run's FLOPs on a fixed layout, by the off-policy rule."""

import functools

import numpy as np
import pytest
import torch

from ablate.compute import ReferenceClock, StepFlops
from ablate.offpolicy import PipelineRL, PPOOffPolicy

TERA = 1e12  # at 1 TFLOP/s a device does this many FLOPs a second: a step's G and T below are in device-seconds


def _device_seconds(clock: ReferenceClock, steps: list[tuple[float, float]]) -> list[float]:
    """Cumulative device-seconds after each step, for steps of (G, T) device-seconds of work."""
    total, out = 0.0, []
    for step, (g, t) in enumerate(steps, start=1):
        total += clock.step(step, StepFlops(generate=g * TERA, train=t * TERA)) * 3600.0
        out.append(total)
    return out


def test_colocated_compute_is_the_flops_at_the_throughput():
    clock = ReferenceClock(0.5, None, PipelineRL(8))
    assert clock.step(1, StepFlops(generate=3e12, train=6e12)) == pytest.approx(9e12 / 0.5e12 / 3600)


def test_ppo_off_policy_takes_turns_pipeline_rl_overlaps_by_hand():
    """G = 2 s, T = 3 s a step on one generator and one trainer device, 80 steps.
    PPO-off-policy-8: rounds of 8 batches on frozen weights, then 8 steps: 10 x (16 + 24) s x 2 devices = 800.
    PipelineRL-8: the first round is batches 1-9 (all on version 0), 18 s; from then on the trainer is the slower
    side and never waits (batch b is ready at train_done(b - 9) + 2 s, long before step b - 1 ends): 18 + 80 x 3 s,
    x 2 devices = 516. With G and T swapped the generator sets the pace: version 1 exists at 27 + 2 = 29 s, then
    71 more batches of 3 s and the last step's 2 s: (29 + 213 + 2) x 2 = 488."""
    assert _device_seconds(ReferenceClock(1.0, [1, 1], PPOOffPolicy(8)), [(2.0, 3.0)] * 80)[-1] == pytest.approx(800)
    assert _device_seconds(ReferenceClock(1.0, [1, 1], PipelineRL(8)), [(2.0, 3.0)] * 80)[-1] == pytest.approx(516)
    assert _device_seconds(ReferenceClock(1.0, [1, 1], PipelineRL(8)), [(3.0, 2.0)] * 80)[-1] == pytest.approx(488)
    ppo = ReferenceClock(1.0, [1, 1], PPOOffPolicy(8))
    _device_seconds(ppo, [(2.0, 3.0)] * 80)
    assert ppo.generator_idle_frac() == pytest.approx(1 - 160 / 400)  # busy 80 x 2 s of 400 s


def test_ppo_rounds_add_up_to_the_serial_sum_at_every_round_end():
    """Two forms of one schedule: with random per-step work on [4 generator, 1 trainer] devices, PPO-off-policy-4's
    clock at each round's end equals 5 devices x the sum of every step's G / 4 + T (the two sides never overlap),
    mid-round extrapolations included. (Work varying 20% from step to step, as the completion lengths do.)"""
    rng = np.random.default_rng(0)
    steps = [(float(g), float(t)) for g, t in rng.uniform(1.6, 2.4, size=(40, 2))]
    seconds = _device_seconds(ReferenceClock(1.0, [4, 1], PPOOffPolicy(4)), steps)
    serial = np.cumsum([5 * (g / 4 + t) for g, t in steps])
    for end in range(4, 41, 4):
        assert seconds[end - 1] == pytest.approx(serial[end - 1], rel=1e-12)
    assert all(b >= a for a, b in zip(seconds, seconds[1:]))


def test_an_extrapolation_that_ran_ahead_is_never_taken_back_and_is_caught_up():
    """PPO-off-policy-4 on [1, 1], T = 0.5 s a step; round 1's batches are G = 4, 1, 1, 1 s: after step 1 the round
    is extrapolated to 4 x 4 = 16 s (step 1 done at 16.5 s: 33 device-seconds), after step 2 to 10 s. The count
    stays at 33 (it never goes down) until the truth passes it: round 2 (G = 2 s each) starts at 7 + 2 = 9 s, ends at
    17 s, its 4 steps done at 19 s: 2 x 19 = 38 device-seconds, the serial sum 2 x (7 + 2 + 8 + 2)."""
    steps = [(4.0, 0.5), (1.0, 0.5), (1.0, 0.5), (1.0, 0.5)] + [(2.0, 0.5)] * 4
    seconds = _device_seconds(ReferenceClock(1.0, [1, 1], PPOOffPolicy(4)), steps)
    assert seconds[:4] == pytest.approx([33.0] * 4)
    assert all(b >= a for a, b in zip(seconds, seconds[1:]))
    assert seconds[-1] == pytest.approx(38.0)


def test_pipeline_rl_never_costs_more_than_taking_turns_nor_less_than_the_busier_side():
    rng = np.random.default_rng(1)
    steps = [(float(g), float(t)) for g, t in rng.uniform(0.5, 4.0, size=(64, 2))]
    pipeline = _device_seconds(ReferenceClock(1.0, [1, 1], PipelineRL(8)), steps)[-1]
    turns = _device_seconds(ReferenceClock(1.0, [1, 1], PPOOffPolicy(8)), steps)[-1]
    busier = 2 * max(sum(g for g, _ in steps), sum(t for _, t in steps))
    assert busier <= pipeline + 1e-9 and pipeline < turns


def test_a_clock_restored_mid_round_goes_on_as_if_never_stopped():
    rng = np.random.default_rng(2)
    steps = [(float(g), float(t)) for g, t in rng.uniform(0.5, 4.0, size=(30, 2))]
    whole = ReferenceClock(1.0, [2, 1], PPOOffPolicy(8))
    expected = [whole.step(s, StepFlops(g * TERA, t * TERA)) for s, (g, t) in enumerate(steps, start=1)]
    first = ReferenceClock(1.0, [2, 1], PPOOffPolicy(8))
    got = [first.step(s, StepFlops(g * TERA, t * TERA)) for s, (g, t) in enumerate(steps[:13], start=1)]
    second = ReferenceClock(1.0, [2, 1], PPOOffPolicy(8))
    second.load_state_dict(first.state_dict())
    got += [second.step(s, StepFlops(g * TERA, t * TERA)) for s, (g, t) in enumerate(steps[13:], start=14)]
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("layout", [[0, 1], [1], [1, 2, 3]])
def test_a_bad_layout_is_named(layout):
    with pytest.raises(ValueError, match=r"train.reference_layout must be \[generator devices, trainer devices\]"):
        ReferenceClock(1.0, layout, PipelineRL(8))


def _bench_cluster():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "bench_cluster.py"
    spec = importlib.util.spec_from_file_location("bench_cluster", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks itself up there)
    spec.loader.exec_module(module)
    return module


def test_the_cluster_cost_model_times_both_schedules_as_derived_by_hand():
    # bench/bench_cluster.py on 2 generators + 1 trainer, 80 steps of 2 GPU-s generation and 1 GPU-s training of
    # which half the rows are kept: a batch decodes in 1 s, trains in 0.5 s.
    # PipelineRL-8: batches 1-9 start on the initial weights (one round, 9 s), steps 1-9 train 9 -> 13.5 s; batch s
    # >= 10 ends at s + 0.5 (the generator never waits again: it is never 8 steps ahead), so from step 17 the trainer
    # waits for it: step 80 done at 81 s. 3 GPUs x 81 s; generator busy 80 s of 81, trainer 40 s.
    # PPO-off-policy-8: 10 rounds of 8 s decoding, then 4 s training, in turn: 120 s.
    bench = _bench_cluster()
    pipeline = bench.simulate(bench.Variant("scalerl", PipelineRL(8), 0.5), 80, 2.0, 1.0, (2, 1))
    assert pipeline["gpu_hours"] == pytest.approx(3 * 81 / 3600) and pipeline["step_s"] == pytest.approx(81 / 80)
    assert pipeline["gen_idle"] == pytest.approx(1 / 81) and pipeline["train_idle"] == pytest.approx(1 - 40 / 81)
    turns = bench.simulate(bench.Variant("loo-8op", PPOOffPolicy(8), 0.5), 80, 2.0, 1.0, (2, 1))
    assert turns["gpu_hours"] == pytest.approx(3 * 120 / 3600)
    assert turns["gen_idle"] == pytest.approx(1 / 3) and turns["train_idle"] == pytest.approx(2 / 3)


def test_the_cluster_cost_model_charges_the_weight_sync_to_every_generator_gpu():
    # 8e9 parameters in bf16 = 16 GB; at 20 GB/s a generator GPU receives for 0.8 s a step; 0 GB/s: no sync cost
    bench = _bench_cluster()
    assert bench.sync_seconds(8e9, 20.0) == pytest.approx(0.8) and bench.sync_seconds(8e9, 0.0) == 0.0


def _saved_activation_bytes(shape, layers: int, compute: torch.dtype) -> int:
    """What autograd keeps per token of a forward of an HF Llama of `shape` with `layers` layers as the trainer runs
    it (fp32 weights; bf16: under autocast): the saved tensors' storages (each once; the weights left out), less
    what does not grow with the tokens (autocast's bf16 copies of the weights): the slope from 48 to 96 tokens."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaModel

    from ablate.policy import autocast

    config = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                         num_hidden_layers=layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaModel(config).train()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = []
    for count in (48, 96):
        saved: dict[int, int] = {}

        def keep(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in weights:
                saved[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), autocast(torch.device("cpu"), compute):
            model(torch.randint(0, shape.vocab, (1, count)))
        kept.append(sum(saved.values()))
    return (kept[1] - kept[0]) / 48


@pytest.mark.parametrize("compute", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("dims", [(64, 224, 4, 1), (96, 256, 6, 2)], ids=["gqa4", "gqa3"])
def test_the_memory_models_activations_per_layer_are_what_autograd_keeps(dims, compute):
    """ablate.memory's `layer_activation_bytes` against autograd's saved tensors in an HF Llama's decoder layer as
    the trainer computes (a 2-layer model's minus a 1-layer one's, per token): equal to the byte."""
    from ablate.memory import Shape, layer_activation_bytes

    hidden, intermediate, heads, kv_heads = dims
    shape = Shape(layers=1, hidden=hidden, intermediate=intermediate, heads=heads, kv_heads=kv_heads, vocab=64)
    layer = _saved_activation_bytes(shape, 2, compute) - _saved_activation_bytes(shape, 1, compute)
    assert layer == layer_activation_bytes(shape, 2 if compute == torch.bfloat16 else 4)


def test_the_memory_model_adds_up_a_trainer_and_a_generator_gpu_by_hand():
    # A shape of h 8, I 16, 2 heads, 1 KV head (kv_dim 4), 2 layers, vocab 10: a layer's matmuls have
    # 2*64 + 2*32 + 3*128 = 576 parameters, its norms 16; the root 2 x 80 + 8 = 168: 2 x 592 + 168 = 1,352 in all.
    # Per token a layer keeps 30*8 + 4*4 + 8*16 + 4*2 + 8 = 400 bytes in bf16, 32*8 + 8*4 + 16*16 + 8 + 8 = 560 in fp32.
    from ablate import memory

    shape = memory.Shape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, vocab=10)
    assert shape.layer_matmul_params == 576 and shape.params == 1352
    assert memory.layer_activation_bytes(shape, 2) == 400 and memory.layer_activation_bytes(shape, 4) == 560
    # 4 FSDP ranks, bf16, 1e6 tokens: 16 x 1,352 / 4 of state; two layers gathered in bf16 and one's gradients in
    # bf16 and fp32, 592 x (4 + 2 + 4); the root in fp32, 4 x 168, with its embeddings' and norm's gradients, 4 x 88;
    # 2 x 400 x 1e6 of activations (with checkpointing: every layer's fp32 input, 2 x 32, and one layer, 400); the
    # head's fp32 inputs, 1e6 x 8 x 4; its backward (bf16 operands into the fp32 head): the fp32 accumulator of its
    # weight's gradient (the root's last gradient), 4 x 80; the hidden states' fp32 gradient, 1e6 x 8 x 4; the weight
    # and the hidden states in bf16, 2 x 80 and 2 x 1e6 x 8; a chunk of 1,024 rows at 4 + 2 bytes an entry, x 10
    bare = memory.trainer(shape, ranks=4, micro_tokens=1e6, checkpointing=False, compute=2, head=4)
    head = {"LM head's backward: fp32 accumulator of the weight's gradient": 320,
            "LM head's backward: hidden states' gradient": 3.2e7,
            "LM head's backward: weight in the operands' dtype": 160,
            "LM head's backward: hidden states in the operands' dtype": 1.6e7,
            "LM head's backward: a chunk's logits, softmax and gradient": 1024 * 10 * 6}
    assert bare.bytes == {"weights, gradients and AdamW state": 5408, "gathered layers": 5920,
                          "gathered embeddings and head": 672 + 352, "activations": 8e8, "LM head's inputs": 3.2e7,
                          **head}
    assert bare.parts[0] == ("activations", 8e8)
    assert bare.total == 8e8 + 5408 + 5920 + 1024 + 3.2e7 + 320 + 3.2e7 + 160 + 1.6e7 + 61440
    assert memory.trainer(shape, ranks=4, micro_tokens=1e6, checkpointing=True, compute=2,
                          head=4).bytes["activations"] == 1e6 * (2 * 32 + 400)
    whole = memory.trainer(shape, ranks=4, micro_tokens=1, checkpointing=False, compute=2, head=4,
                           sharded_gradients=False)
    assert whole.bytes["whole fp32 gradient (run.sharded_gradients=false)"] == 4 * 1352
    one = memory.trainer(shape, ranks=1, micro_tokens=1, checkpointing=False, compute=2, head=2)
    assert one.bytes["autocast's copies of the weights"] == 2 * 2 * 576 and "gathered layers" not in one.bytes
    # the bf16 head: one row's chunk, its fp32 logits, the gradient in bf16 and the logits in bf16 before their copy
    assert one.bytes["LM head's backward: a chunk's logits, softmax and gradient"] == 1 * 10 * (4 + 2 + 2)
    fp32 = memory.trainer(shape, ranks=1, micro_tokens=1, checkpointing=False, compute=4, head=4)
    assert not any("operands' dtype" in part for part in fp32.bytes)  # fp32 operands: no rounded copies
    assert one.bytes["weights, gradients and AdamW state"] == 16 * 1352
    # engines: 1,352 bf16 weights, twice in an engine process, and a KV cache of 2 x 2 layers x 4 x 2 = 32 B a token
    assert memory.torch_engine(shape, compute=2, copies=2, rows=12, row_tokens=1000) == {
        "generator's weights": 2 * 2 * 1352, "generator's KV cache": 12 * 1000 * 32}
    # outside vLLM's share: the CUDA context (1.0 GB) and, in an engine process of its own, NCCL's buffers of the
    # weights group: 32 ring channels of 10 + 2 MiB, and NVLS's 16 channels x 2 x 8 steps x 128 KiB x 8 heads + 2 MiB
    ring, nvls = 32 * 12 * 2**20, 16 * 2 * 8 * 128 * 1024 * 8 + 2 * 2**20
    assert memory.vllm_engine(gpu_bytes=10e9, utilization=0.5) == {
        "vLLM (gpu_memory_utilization)": 5e9, "CUDA context": 1e9, "NCCL's ring buffers (weights group)": ring,
        "NCCL's NVLS buffers (weights group)": nvls}
    assert memory.vllm_engine(gpu_bytes=10e9, utilization=0.5, weights_group=False) == {
        "vLLM (gpu_memory_utilization)": 5e9, "CUDA context": 1e9}
    # unset, vLLM's share: what 12 rows of 1e8 tokens need, 2 x 1,352 + 12 x 1e8 x 32 = 38.4 GB and the 4 GB workspace,
    # 42.4 GB of a 100 GB GPU; of a 20 GB one, all the room beside what lives outside vLLM (1.0 GB + 402,653,184 +
    # 270,532,608) and 3 GB beside it (a staging copy, a validation cache), 15.33 GB: 0.77; of a 10 GB one, the least
    # vLLM runs with, one row: 3.2 + 4 GB, 0.72
    share = functools.partial(memory.vllm_share, shape, compute=2, rows=12, row_tokens=1e8, beside=3e9)
    assert share(gpu_bytes=100e9) == pytest.approx((2 * 1352 + 12 * 1e8 * 32 + memory.VLLM_WORKSPACE) / 100e9)
    assert share(gpu_bytes=20e9) == pytest.approx((20e9 - 1e9 - ring - nvls - 3e9) / 20e9)
    assert share(gpu_bytes=10e9) == pytest.approx((2 * 1352 + 1e8 * 32 + memory.VLLM_WORKSPACE) / 10e9)
    assert memory.vllm_room(shape, compute=2, gpu_bytes=1e4, utilization=0.25, tensor_parallel=2) == 2500 - 1352
    assert memory.micro_batch_tokens(8, 65536, 16384) == 4 * 16384 and memory.micro_batch_tokens(8, 0, 100) == 800
    assert memory.micro_batch_tokens(8, 1000, 16384) == 16384  # a row longer than the cap goes alone
