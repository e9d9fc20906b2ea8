"""The memory model at its edges (ablate/memory.py): the LM head's backward against the live bytes of the real autograd
Function, FlashAttention's varlen backward and a trainer's margin, the engine GPU's memory outside vLLM part by part,
torch's caching allocator for the staging copy, pinned by hand at experiment=paper_8b, a packed learner's pass, and the
check before submit naming the part that takes the room and the setting that frees it."""

from __future__ import annotations

import json
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ablate import memory
from ablate.config import compose
from test_config import LLAMA_8B

MiB = 2**20
V8, H8, N8 = 128_256, 4096, 65_536  # Llama-3.1-8B's vocabulary and width; paper_8b's micro-batch (65,536 tokens)
PARAMS_8B = 8_030_261_248


@pytest.fixture(scope="module")
def llama_8b(tmp_path_factory):
    """An 8B Llama's config.json and the Llama-3 tokenizer (no weights: the check reads the shape alone)."""
    from real_models import save_tokenizer

    folder = tmp_path_factory.mktemp("models") / "llama-8b"
    save_tokenizer("llama3", folder)
    (folder / "config.json").write_text(json.dumps(LLAMA_8B))
    return folder


@pytest.fixture(scope="module")
def llama_tokenizer(llama_8b):
    """Its tokenizer, loaded once (seconds each time): the checks count the interruption's phrase in it."""
    from ablate.checks import tokenizer_of

    return tokenizer_of(compose(["experiment=paper_8b", f"model.path={llama_8b}"]).model)


class _LiveBytes(TorchDispatchMode):
    """Bytes of the tensor storages made under it and still alive (a storage once, whatever views it has; those of
    `known` tensors not at all), and their peak: what a device's caching allocator hands out, its rounding aside.
    `paused`: what runs meanwhile is not counted (an emulated CUDA kernel's own upcasts)."""

    def __init__(self, *known: torch.Tensor):
        super().__init__()
        self.now = self.peak = 0
        self.paused = False
        self.seen = {t.untyped_storage().data_ptr() for t in known}

    def count(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if key in self.seen or not size:
            return
        self.seen.add(key)
        self.now += size
        self.peak = max(self.peak, self.now)

        def freed():
            self.seen.discard(key)
            self.now -= size

        weakref.finalize(storage, freed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.paused:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.count(t)
        return out


@pytest.mark.parametrize("option,operands,compute,head", [("fp32_head", torch.bfloat16, 2, 4), ("bf16", None, 2, 2),
                                                          ("fp32_head", torch.float32, 4, 4)],
                         ids=["fp32-head-bf16-operands", "bf16-head", "fp32-head-fp32-operands"])
def test_the_heads_backward_is_what_the_real_function_holds_on_cudas_path(monkeypatch, option, operands, compute,
                                                                           head):
    """memory.head_backward against the live bytes of ablate/rl/precision.py's head on the path it takes on CUDA,
    emulated on the CPU (a wide GEMM's fp32 output counted, its upcasts not: on CUDA it reads the bf16 operands).
    V 4,096, H 64, 512 rows in chunks of 128. What the forward keeps for the backward: the weight and the hidden
    states in the operands' dtype (none for fp32 operands), and the [512] fp32 log-sum-exp. What the
    backward adds at its peak: the fp32 weight-gradient accumulator, the hidden states' fp32 gradient and one chunk:
    its fp32 logits made the softmax's gradient in place, the previous chunk's gradient in the operands' dtype, and
    the bf16 head's logits before their fp32 copy (6, 8 and 8 bytes an entry: 3.1 MB of 128 x 4,096 for the fp32
    head on bf16 operands), to the byte but the loss's scalar gradient."""
    from ablate.rl import precision

    live: list[_LiveBytes] = []

    def mm_wide(x, y, out):
        live[0].paused = True
        product = torch.mm(x.float(), y.float()).to(out)
        live[0].paused = False
        live[0].count(product)
        return product

    def addmm_wide_(acc, x, y):
        live[0].paused = True
        acc.addmm_(x.float(), y.float())
        live[0].paused = False
        return acc

    monkeypatch.setattr(precision, "_wide", lambda t: True)
    monkeypatch.setattr(precision, "_mm_wide", mm_wide)
    monkeypatch.setattr(precision, "_addmm_wide_", addmm_wide_)
    V, H, N, C = 4096, 64, 512, 128
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, H, generator=g, requires_grad=True)
    weight = (0.05 * torch.randn(V, H, generator=g)).requires_grad_()
    targets = torch.randint(0, V, (N,), generator=g)
    live.append(_LiveBytes(hidden, weight, targets))
    with live[0]:
        loss = getattr(precision, option)(hidden, weight, targets, operands=operands, chunk_size=C).sum()
        kept = live[0].now
        live[0].peak = kept
        loss.backward()
    added = live[0].peak - kept
    model = memory.head_backward(memory.Shape(vocab=V, hidden=H), micro_tokens=N, compute=compute, head=head,
                                 chunk=C)
    narrow = 2 if operands != torch.float32 else 4
    saved = {k: v for k, v in model.items() if "operands' dtype" in k}
    assert sum(saved.values()) == (narrow * (V + N) * H if narrow < 4 else 0)  # 2 x (4,096 + 512) x 64 in bf16
    assert kept == sum(saved.values()) + 4 * N + 4  # and the log-sum-exp, and the loss
    logits = 2 if option == "bf16" else 0
    assert sum(model.values()) - sum(saved.values()) == 4 * V * H + 4 * N * H + C * V * (4 + narrow + logits)
    assert added == sum(model.values()) - sum(saved.values()) + 4  # the loss's gradient, a scalar


def test_the_caching_allocator_and_the_staging_copys_fragmentation_by_hand():
    """torch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp) from an empty cache: up to 1 MiB from
    2 MiB segments, up to 10 MiB from 20 MiB ones, larger rounded up to 2 MiB. Three 8 MiB tensors take two 20 MiB
    segments (the first holds two, 4 MiB left over); 11 MiB takes 12; 100 bytes and 1 MiB + 1 byte take a 2 MiB and a
    20 MiB segment; a small tensor fits the 2 MiB segment's rest. An 8B Llama's staging copy in bf16: each layer's K
    and V (1,024 x 4,096 x 2 = 8 MiB) share a 20 MiB segment, 4 MiB over, 32 x 4 MiB; its 65 norms (8 KiB each) one
    2 MiB segment; every other tensor a multiple of 2 MiB: 134,217,728 + 2,097,152 - 532,480 = 135,782,400 bytes."""
    assert memory.cached_bytes([8 * MiB] * 3) == 40 * MiB
    assert memory.cached_bytes([11 * MiB]) == 12 * MiB
    assert memory.cached_bytes([100, MiB + 1]) == 22 * MiB
    assert memory.cached_bytes([100, 1000, 512]) == 2 * MiB
    assert memory.cached_bytes([8 * MiB, 3 * MiB, 8 * MiB]) == 20 * MiB  # 8 + 3, 9 left over: the next 8 fits it
    shape = memory.Shape()  # Llama-3.1-8B
    assert sum(shape.tensors()) == shape.params == PARAMS_8B
    assert memory.staging_slack(shape, 2) == 32 * 4 * MiB + 2 * MiB - 65 * 8192 == 135_782_400


def test_the_paper_trainers_lm_head_backward_by_hand(llama_8b, llama_tokenizer):
    """experiment=paper_8b (16 FSDP ranks, bf16 compute, the fp32 head, 65,536 tokens a micro-batch): the head's
    backward on a trainer rank, part by part, V 128,256 and H 4,096. The fp32 accumulator of the weight's gradient 4 V
    H = 2.10 GB (the gradient the gathered root held before: that part now counts its embeddings' and norm's alone);
    the weight in bf16, 2 V H = 1.05 GB; the hidden states in bf16, 2 x 65,536 x 4,096 = 0.54 GB, and their fp32
    gradient, 1.07 GB; a chunk of 1,024 rows at 6 bytes an entry, 0.79 GB: 5.55 GB in all, where the model counted
    2.1 (the bf16 weight and two fp32 chunks). The other ranks hold what rank 0 does but the weights group's NCCL
    buffers (the totals: test_the_paper_trainers_varlen_scratch_and_margin_by_hand)."""
    from ablate.checks import check_memory

    first, other, _ = check_memory(compose(["experiment=paper_8b", f"model.path={llama_8b}"]), 85.0,
                                   llama_tokenizer)
    head = {k: v for k, v in first.bytes.items() if k.startswith("LM head's backward")}
    assert head == {"LM head's backward: fp32 accumulator of the weight's gradient": 4 * V8 * H8,  # 2,101,346,304
                    "LM head's backward: hidden states' gradient": 4 * N8 * H8,  # 1,073,741,824
                    "LM head's backward: weight in the operands' dtype": 2 * V8 * H8,  # 1,050,673,152
                    "LM head's backward: hidden states in the operands' dtype": 2 * N8 * H8,  # 536,870,912
                    "LM head's backward: a chunk's logits, softmax and gradient": 1024 * V8 * 6}  # 788,004,864
    assert sum(head.values()) == 5_550_637_056
    root = 2 * V8 * H8 + H8
    assert first.bytes["gathered embeddings and head"] == 4 * root + 4 * (V8 * H8 + H8)  # 6,304,071,680
    assert other.bytes == {k: v for k, v in first.bytes.items() if "weights group" not in k}


def test_flashattentions_varlen_backward_by_hand():
    """memory.varlen_backward against mha_varlen_bwd's allocations (Dao-AILab/flash-attention
    csrc/flash_attn/flash_api.cpp at v2.8.3, 060c918; torch's copy in aten/src/ATen/native/transformers/cuda/
    flash_attn): dq_accum fp32 [T + 128 b, heads, head dim rounded up to 32 (64 above 128)] and softmax_d fp32
    [heads, T + 128 b]; dK and dV expanded to every head in bf16 where K/V are grouped; the dQ, dK, dV it returns.
    At paper_8b's pass, 65,536 tokens in 4 rows of 16,404, 32 / 8 heads of 128: 4 x 66,048 x 32 x (128 + 1) =
    1,090,584,576; 2 x 2 x 65,536 x 32 x 128 = 1,073,741,824; 2 x 65,536 x (32 + 16) x 128 = 805,306,368: 2.97 GB, the
    issue's ~3 GB. Head dim 80 rounds to 96, 160 to 192; without groups nothing is expanded."""
    paper = memory.varlen_backward(memory.Shape(), tokens=N8, rows=4, compute=2)
    assert paper == {"varlen attention's backward: fp32 dQ accumulator and softmax sums": 1_090_584_576,
                     "varlen attention's backward: dK and dV expanded to every head": 1_073_741_824,
                     "varlen attention's backward: dQ, dK and dV": 805_306_368}
    assert sum(paper.values()) == 2_969_632_768
    dim80 = memory.varlen_backward(memory.Shape(hidden=2560, heads=32, kv_heads=8), tokens=1000, rows=2, compute=2)
    assert dim80["varlen attention's backward: fp32 dQ accumulator and softmax sums"] == 4 * 1256 * 32 * (96 + 1)
    assert dim80["varlen attention's backward: dK and dV expanded to every head"] == 2 * 2 * 1000 * 32 * 80
    dim160 = memory.varlen_backward(memory.Shape(hidden=2560, heads=16, kv_heads=16), tokens=1000, rows=1, compute=2)
    assert dim160 == {"varlen attention's backward: fp32 dQ accumulator and softmax sums": 4 * 1128 * 16 * (192 + 1),
                      "varlen attention's backward: dQ, dK and dV": 2 * 1000 * 48 * 160}


def test_the_paper_trainers_varlen_scratch_and_margin_by_hand(llama_8b, llama_tokenizer):
    """experiment=paper_8b's trainer ranks, packed (bf16 on a GPU) at 65,536 tokens a pass, with FlashAttention's
    varlen backward (2,969,632,768: test_flashattentions_varlen_backward_by_hand) and the margin: the CUDA context
    (1.0 GB), NCCL's buffers of the FSDP group (32 x 12 MiB of rings, 402,653,184; 270,532,608 of NVLS) and, on rank 0,
    of the weights group as much again, and 5% of torch's tensors for the caching allocator's fragmentation. 16 + 64:
    the tensors before, 73,346,174,976 (73.3 GB), and the scratch make 76,315,807,744; 5% of it 3,815,790,387.2; rank
    0 82,477,969,715.2 (82.5 of 85 GB), the others 673,185,792 less. 8 + 8 on 2 nodes: the state doubles to
    16,060,522,496, the tensors 84,346,068,992 (the 81.4 GB the check passed, and the scratch): rank 0 at 90.9 GB,
    refused. Where it fits: per token of a pass 852,232 bytes (the activations 31 x 4h + one layer's set, 32 x 16,384 +
    241,800 = 766,088; the head's inputs and gradient 2 x 4h, its bf16 hidden states 2h; the scratch 4 x 32 x 129 + 2
    x 2 x 32 x 128 + 2 x 48 x 128 = 45,184) over 28,494,192,640 fixed (state, gathered layers 2,181,120,000 and root
    6,304,071,680, the head's accumulator 2,101,346,304, bf16 weight 1,050,673,152 and chunk 788,004,864, the 4 rows'
    128-row pads 8,454,144): 1.05 x (28,494,192,640 + 852,232 T) + 2,346,371,584 <= 85e9 at T <= 58,931, so 58,368
    (57 x 1,024) fits (84.5 GB) and 59,392 does not (85.4)."""
    from ablate.checks import check_memory

    def check(*overrides: str) -> list:
        return check_memory(compose(["experiment=paper_8b", f"model.path={llama_8b}", *overrides]), 85.0,
                            llama_tokenizer)

    ring, nvls = 32 * 12 * MiB, 16 * 2 * 8 * 128 * 1024 * 8 + 2 * MiB
    scratch = 1_090_584_576 + 1_073_741_824 + 805_306_368
    first, other, _ = check()
    margin = {k: v for k, v in first.bytes.items() if k == "CUDA context" or k.startswith(("NCCL's", "caching"))}
    tensors = first.total - sum(margin.values())
    assert tensors - scratch == pytest.approx(73_346_174_976) and tensors == pytest.approx(76_315_807_744)
    assert margin == pytest.approx({"CUDA context": 1e9, "NCCL's ring buffers (FSDP group)": ring,
                                    "NCCL's NVLS buffers (FSDP group)": nvls,
                                    "NCCL's ring buffers (weights group)": ring,
                                    "NCCL's NVLS buffers (weights group)": nvls,
                                    "caching allocator's fragmentation (5% of torch's tensors)": 3_815_790_387.2})
    assert first.total == pytest.approx(82_477_969_715.2) and first.total - other.total == pytest.approx(ring + nvls)
    assert first.describe(85.0).startswith("trainer rank 0: ~82.5 GB of 85 (activations 50.2, ")

    eight = ("run.trainer_gpus=8", "run.generator_gpus=8", "launcher.nodes=2")
    with pytest.raises(ValueError) as refused:
        check(*eight)
    said = str(refused.value)
    assert said.startswith("run.trainer_gpus=8 + run.generator_gpus=8 does not fit a GPU of 85 GB "
                           "(launcher.gpu_memory_gb): trainer rank 0: activations 50.2 + weights, gradients and AdamW "
                           "state 16.1 + "), said
    assert "= 90.9 GB > 85 GB; the part that takes the room: activations, 50.2 GB; set " \
           "train.micro_batch_tokens=58368 or less (the most that fits, in steps of 1,024), set " \
           "train.activation_checkpointing=auto (the fewest layers recomputed that fit, or the least memory), or " \
           "shard the state over more trainer GPUs (run.trainer_gpus); activation checkpointing: 32 of 32 layers" \
           in said, said
    fits, *_ = check(*eight, "train.micro_batch_tokens=58368")  # the negative control: the setting it names fits
    assert fits.total == pytest.approx(1.05 * (28_494_192_640 + 852_232 * 58_368) + 1e9 + 2 * (ring + nvls))
    assert fits.total <= 85e9 < fits.total + 1.05 * 852_232 * 1024
    with pytest.raises(ValueError, match=r"= 85\.4 GB > 85 GB; .* set train.micro_batch_tokens=58368 or less"):
        check(*eight, "train.micro_batch_tokens=59392")


def test_the_paper_engine_gpus_room_outside_vllm_by_hand(llama_8b, llama_tokenizer):
    """experiment=paper_8b's engine process on an "80 GB" H100 (85 GB as reported): outside vLLM's share, the CUDA
    context (1.0 GB, measured on a lent H200), NCCL's buffers of the weights group as NCCL sizes them (32 ring
    channels x (10 + 2) MiB = 402,653,184; NVLS, 16 channels x 2 x 8 steps x 128 KiB x 8 heads + 2 MiB of credits =
    270,532,608), the staging copy (2 x 8,030,261,248) and its fragmentation (135,782,400); vLLM sized to the rest:
    67,130,509,312 bytes (0.790), where the lump of 2 GB for context and NCCL left it 66.9."""
    from ablate.checks import check_memory

    *_, engine = check_memory(compose(["experiment=paper_8b", f"model.path={llama_8b}"]), 85.0, llama_tokenizer)
    outside = {"CUDA context": 1_000_000_000, "NCCL's ring buffers (weights group)": 32 * 12 * MiB,
               "NCCL's NVLS buffers (weights group)": 16 * 2 * 8 * 128 * 1024 * 8 + 2 * MiB,
               "staging copy of the weights": 2 * PARAMS_8B, "staging copy's fragmentation": 135_782_400}
    assert {k: engine.bytes[k] for k in outside} == outside
    assert set(engine.bytes) == {*outside, memory.VLLM_SHARE} and engine.sized == (memory.VLLM_SHARE,)
    assert engine.bytes[memory.VLLM_SHARE] == pytest.approx(85e9 - sum(outside.values())) == 67_130_509_312
    assert engine.total == pytest.approx(85e9)


def test_the_check_before_submit_names_the_part_that_takes_the_room(llama_8b, llama_tokenizer):
    """A process that does not fit fails in one line summing its parts and naming the part that takes the room, with
    the setting that gives it back. paper_8b's engines on a 39 GB GPU (its trainers at 16,384 tokens a micro-batch
    fit, 38.5 GB with their margin): vLLM's share, sized, is at its least (16.1 GB of weights, one row's 2.1 GB of KV
    cache, the 4 GB workspace), so the staging copy takes the room, not vLLM, the biggest part (which the check named
    before).
    vLLM's share set by hand to 0.9 on 85 GB: 76.5 GB takes the room; the most it may have beside the rest is 0.78
    of the GPU (67.1 GB, 0.790, rounded down). A trainer on 60 GB: the activations, 50.2 of 82.5 GB, named with the
    train.micro_batch_tokens that fits (39,936, derived as in
    test_the_paper_trainers_varlen_scratch_and_margin_by_hand) and with auto checkpointing, which keeps the last layer
    (1.07 GB less)."""
    from ablate.checks import check_memory

    def refusal(gpu_gb: float, *overrides: str) -> str:
        with pytest.raises(ValueError) as refused:
            check_memory(compose(["experiment=paper_8b", f"model.path={llama_8b}", *overrides]), gpu_gb,
                         llama_tokenizer)
        assert "\n" not in str(refused.value)
        return str(refused.value)

    said = refusal(39.0, "train.micro_batch_tokens=16384")
    assert said.startswith("run.trainer_gpus=16 + run.generator_gpus=64 does not fit a GPU of 39 GB "
                           "(launcher.gpu_memory_gb): each engine process: vLLM (gpu_memory_utilization) 22.2 + "
                           "staging copy of the weights 16.1 + CUDA context 1.0 + NCCL's ring buffers (weights group) "
                           "0.4 + NCCL's NVLS buffers (weights group) 0.3 + staging copy's fragmentation 0.1 = 40.1 "
                           "GB > 39 GB; the part that takes the room: staging copy of the weights, 16.1 GB; set "
                           "generator.weight_transfer=direct"), said
    said = refusal(85.0, "generator.gpu_memory_utilization=0.9")
    assert "= 94.4 GB > 85 GB; the part that takes the room: vLLM (gpu_memory_utilization), 76.5 GB; set " \
           "generator.gpu_memory_utilization=0.78 or less" in said, said
    said = refusal(60.0)
    assert "trainer rank 0: activations 50.2 + " in said and "= 82.5 GB > 60 GB; the part that takes the room: " \
           "activations, 50.2 GB; set train.micro_batch_tokens=39936 or less (the most that fits, in steps of " \
           "1,024), set train.activation_checkpointing=auto (the fewest layers recomputed that fit, or the least " \
           "memory), or shard the state over more trainer GPUs (run.trainer_gpus); activation checkpointing: 32 of " \
           "32" in said, said


@pytest.mark.parametrize("length_control, phrase", [("interruption", 20), ("truncation", 0)])
def test_a_rows_longest_length_is_one_figure_for_the_length_check_vllm_and_the_memory_model(
        llama_8b, llama_tokenizer, monkeypatch, length_control, phrase):
    """experiment=paper_8b's row at its longest: 2,048 + 12,288 + 2,048 tokens and, under the interruption, the 20
    Llama-3 tokens of the phrase injected at the thinking budget, 16,404 (16,384 under truncation). memory.longest_row
    gives it to the length check's line, to vLLM's max_model_len and to the memory model: loo-8op's last step
    (1,604, mid-round) is validated by our engine beside vLLM, 8 rows at once of 131,072 bytes a token (2 x 32
    layers x 1,024 x bf16), 8 x 16,404 x 131,072 bytes of KV cache. Before, the memory model left the phrase out
    (16,384) where the check and vLLM counted it. The trainer's largest micro-batch stays 65,536 tokens: 4 rows of
    16,384 fill the cap, where rows of 16,404 would go 3 to one."""
    import importlib.util
    import sys
    from types import ModuleType, SimpleNamespace

    import ablate.generators
    from ablate.checks import check_lengths, check_memory
    from ablate.generators.pipelined import limits_for
    from ablate.generators.vllm import VLLMEngines
    from ablate.registry import build

    cfg = compose(["experiment=paper_8b", f"model.path={llama_8b}", "off_policy=ppo_off_policy", "train.steps=1604",
                   f"length_control={length_control}"])
    longest = 2048 + 12288 + phrase + 2048
    if phrase:  # the phrase in Llama-3's tokens, by hand: `</think>` is no token of its own there
        ids = llama_tokenizer.encode(cfg.length_control.phrase, add_special_tokens=False)
        assert [llama_tokenizer.decode([i]) for i in ids] == [
            "Okay", ",", " time", " is", " up", ".", " Let", " me", " stop", " thinking", " and", " formulate", " a",
            " final", " answer", " now", ".", " </", "think", ">"]
    assert memory.longest_row(cfg.generation, phrase_tokens=phrase) == longest

    # the length check, before any run
    line = check_lengths(cfg, llama_tokenizer)
    assert line.endswith(f"rows of at most {longest:,} tokens"
                         + (f" (the interruption's phrase {phrase} of them)" if phrase else "")), line

    # vLLM's engine as generator=vllm makes it (vLLM itself stood in for: max_model_len is what it is given)
    made = {}

    class Engine:
        version = 0

        def __init__(self, folder, limits, **args):
            made.update(args)

        def load(self, state, version):
            pass

    fake = ModuleType("ablate.generators.vllm_engine")
    fake.VLLMEngine = Engine
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(ablate.generators, "vllm_engine", fake, raising=False)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: find_spec("json") if name == "vllm" else find_spec(name, *rest))
    generator = SimpleNamespace(cfg=cfg, task=SimpleNamespace(tokenizer=llama_tokenizer), engines_apart=False,
                                limits=limits_for(cfg, llama_tokenizer, build(cfg.length_control)), engine_args={})
    VLLMEngines(0.9, None, False, 1, "staged")(generator, SimpleNamespace(module=lambda: torch.nn.Linear(1, 1)))
    assert made["max_model_len"] == longest

    # the memory model, before submit
    first, _, engine = check_memory(cfg, 85.0, llama_tokenizer)
    kv_per_token = 2 * 32 * 1024 * 2
    assert memory.kv_bytes_per_token(memory.Shape.of(SimpleNamespace(**LLAMA_8B)), 2) == kv_per_token == 131_072
    assert engine.bytes["validation's KV cache (our engine; generator.val_wave_rows)"] == 8 * longest * kv_per_token
    assert first.bytes["LM head's backward: hidden states' gradient"] == 4 * N8 * H8


def test_the_largest_micro_batch_is_the_trainers_largest():
    """memory.largest_micro_batch, the memory model's micro-batch for a padded learner, against the passes the learner
    runs (Learner.step_plan: ablate/plan.py's padded plan, on 1 and on 2 ranks) of every set of k equal rows up to the
    longest, k up to twice the row cap: the largest padded pass it makes is the figure. Rows of one length are the
    worst case: a pass is padded to its longest row. By hand: 4 rows of 16,384 fill a cap of 65,536 where rows of
    16,404 go 3 to one (49,212); a row over the cap goes alone; no cap, the row cap alone decides. A packed learner's
    passes: test_a_packed_pass_fits_the_memory_models_micro_batch."""
    from ablate import plan

    assert memory.largest_micro_batch(8, 65536, 16404) == memory.largest_micro_batch(8, 65536, 16384) == 65536
    assert memory.micro_batch_tokens(8, 65536, 16404) == 3 * 16404  # rows all of the longest length
    assert memory.largest_micro_batch(3, 65536, 16404) == 3 * 16404 and memory.largest_micro_batch(1, 10, 30) == 30
    assert memory.largest_micro_batch(8, 1000, 16384) == 16384 and memory.largest_micro_batch(8, 0, 100) == 800
    for rows, cap, longest in [(8, 64, 17), (4, 64, 17), (3, 50, 40), (5, 0, 9), (6, 30, 7), (2, 10, 25), (1, 8, 8)]:
        padded = {1: 0, 2: 0}
        for width in range(1, longest + 1):
            for k in range(1, 2 * rows + 1):
                lengths, trained = torch.full((k,), width), torch.ones(k, dtype=torch.bool)
                for world in padded:
                    passes = plan.padded(lengths, trained, world, cap, rows).passes
                    padded[world] = max(padded[world], *(len(b) * width for p in passes for b in p))
        assert memory.largest_micro_batch(rows, cap, longest) == padded[1] == padded[2], (rows, cap, longest)


def test_a_packed_pass_fits_the_memory_models_micro_batch():
    """Packed (Learner.step_plan), a pass holds up to train.micro_batch_tokens real tokens whatever their rows, or
    unset micro_batch_size x the step's longest row; a row over the budget goes alone. The memory model counts a
    packed learner's pass from that budget (memory.packed_pass_tokens), where before it counted the padded form's,
    micro_batch_size x the longest row under the cap: 2 rows of at most 17 tokens and a cap of 64 counted 34 tokens,
    where 64 rows of 1 token make one packed pass of 64. Through the check: run.packed_rows=true, rows of at most
    5 + 8 + 4 = 17 tokens (truncation: no phrase), 2 rows and 64 tokens a pass: activations for 64 tokens; the padded
    form (run.packed_rows=false) keeps its 34. And ablate/plan.py's packed passes, of every set of k rows of each
    length up to the longest, on 1 and 2 ranks, never hold more than the figure, which 1-token rows reach."""
    from ablate import plan
    from ablate.checks import layout_memory, model_shape

    def tokens_counted(packed: bool) -> float:
        cfg = compose(["generator=mock", "length_control=truncation", "generation.max_prompt_tokens=5",
                       "generation.max_think_tokens=8", "generation.max_answer_tokens=4", "train.micro_batch_size=2",
                       "train.micro_batch_tokens=64", f"run.packed_rows={str(packed).lower()}"])
        trainer = layout_memory(cfg, 80.0)[0]
        per_token = memory.activation_bytes(model_shape(cfg.model), checkpointed=trainer.checkpointed,
                                            compute=getattr(torch, str(cfg.model.dtype)).itemsize)
        return trainer.bytes["activations"] / per_token

    assert tokens_counted(packed=True) == 64 and tokens_counted(packed=False) == 34
    assert memory.packed_pass_tokens(2, 64, 17) == 64 and memory.packed_pass_tokens(2, 10, 17) == 17
    assert memory.packed_pass_tokens(2, 0, 17) == 34 == memory.largest_micro_batch(2, 0, 17)
    for rows, cap, longest in [(2, 64, 17), (8, 64, 17), (4, 64, 17), (3, 50, 40), (5, 0, 9), (2, 10, 25), (1, 8, 8)]:
        most = 0
        for width in range(1, longest + 1):
            for k in range(1, 2 * max(cap, rows * longest) // width + 2, max(1, width // 3)):
                lengths, trained = torch.full((k,), width), torch.ones(k, dtype=torch.bool)
                budget = cap or rows * width  # Learner.step_plan's: the longest row of these is `width`
                for world in (1, 2):
                    passes = plan.packed(lengths, trained, world, budget).passes
                    most = max(most, *(len(b) * width for p in passes for b in p))
        assert most == memory.packed_pass_tokens(rows, cap, longest), (rows, cap, longest, most)


def test_selective_checkpointing_by_hand():
    """train.activation_checkpointing as a count k of the first decoder layers recomputed: each keeps its fp32 input,
    4h bytes a token; each kept layer its whole set P (bf16: 30h + 4 kv_dim + 8I + 4 heads + 8). The shape of
    tests/test_compute.py at 4 layers, h 8: 4h = 32, P = 400. The recomputed layers come first, so the backward
    reaches them once the kept layers' sets are freed, holding one set while it recomputes: k = 0..3 hold 4 x 400 =
    1,600, 32 + 3 x 400 = 1,232, 64 + 800 = 864, 96 + 400 = 496 bytes a token; k = 4 (true) 128 + one set, 528, more
    than k = 3: keeping the last layer costs nothing. Auto on a GPU of 1,000,000 bytes at 1,000 tokens (the peak
    holds its margin: memory.margin): 2 layers (864,000 fits, 1,232,000 does not); on 490,000 none fits, and auto
    takes the least, 3 of 4 (496,000), saying so."""
    shape = memory.Shape(layers=4, hidden=8, intermediate=16, heads=2, kv_heads=1, vocab=10)
    per_token = [memory.activation_bytes(shape, checkpointed=k, compute=2) for k in range(5)]
    assert per_token == [1600, 1232, 864, 496, 528]
    assert per_token[0] == 4 * memory.layer_activation_bytes(shape, 2)  # none: today's false
    for setting, k in [(False, 0), (True, 4), (0, 0), (3, 3)]:
        assert memory.trainer(shape, ranks=4, micro_tokens=1e6, checkpointing=setting, compute=2,
                              head=4).bytes["activations"] == 1e6 * per_token[k]
    assert memory.trainer(shape, ranks=4, micro_tokens=1, checkpointing=3, compute=2, head=4).checkpointed == 3
    peak = lambda k: 1000 * per_token[k]  # noqa: E731
    assert memory.fewest_checkpointed(4, peak, 1_000_000) == (2, True)
    assert memory.fewest_checkpointed(4, peak, 864_000) == (2, True)
    assert memory.fewest_checkpointed(4, peak, 490_000) == (3, False)
    assert memory.fewest_checkpointed(4, peak, 2_000_000) == (0, True)
    for bad in (5, -1, "sometimes", 2.5):
        with pytest.raises(ValueError, match=f"train.activation_checkpointing={bad!r}: true, false, auto or a count "
                                             "of decoder layers from 0 to the model's 4"):
            memory.checkpointed_layers(bad, 4)


def test_the_paper_trainers_auto_checkpointing_by_hand(llama_8b, llama_tokenizer):
    """experiment=paper_8b with train.activation_checkpointing=auto on an "80 GB" H100 (85 GB as reported), the
    trainer's margin in its peak (CUDA context 1.0 GB, rank 0's NCCL buffers 2 x 673,185,792, and 5% of its tensors:
    test_the_paper_trainers_varlen_scratch_and_margin_by_hand). At 16,384 tokens a micro-batch a row of 16,404
    tokens (the interruption's phrase included) goes alone; its tensors beside the activations come to 21,127,385,088
    bytes whatever the count, and FlashAttention's varlen backward for one row, 4 x 16,532 x 32 x 129 + 2 x 2 x
    16,404 x 32 x 128 + 2 x 16,404 x 48 x 128 = 743,311,872; P = 30 x 4,096 + 4 x 1,024 + 8 x 14,336 + 4 x 32 + 8 =
    241,800 bytes a token a kept layer, 4h = 16,384 a recomputed one: k of 32 recomputed hold 16,404 x (7,737,600 -
    225,416 k). With the margin, 1.05 x (21,870,696,960 + activations) + 2,346,371,584 <= 85e9 leaves the activations
    56,847,044,388 bytes, 3,465,438 a token: k = 18 holds 3,680,112, over; k = 19, 3,454,696: 16,404 x 3,454,696 =
    56,670,833,184, 84.8 GB in all: 19 of 32, 13 layers no longer recomputed. At 65,536 tokens, where every layer is
    recomputed today, auto keeps the last: 65,536 x (31 x 16,384 + 241,800) = 49,132,601,344, 1.05 x 1.07 GB less. On
    60 GB even that does not fit, and the refusal says so, with the train.micro_batch_tokens that fits."""
    from ablate.checks import check_memory

    def auto(gpu_gb: float, *overrides: str) -> list:
        return check_memory(compose(["experiment=paper_8b", f"model.path={llama_8b}",
                                     "train.activation_checkpointing=auto", *overrides]), gpu_gb, llama_tokenizer)

    first, other, _ = auto(85.0, "train.micro_batch_tokens=16384")
    assert first.checkpointed == other.checkpointed == 19
    assert first.bytes["activations"] == 16_404 * (7_737_600 - 225_416 * 19) == 56_670_833_184
    varlen = sum(b for part, b in first.bytes.items() if part.startswith("varlen"))
    assert varlen == 4 * 16_532 * 32 * 129 + 2 * 2 * 16_404 * 32 * 128 + 2 * 16_404 * 48 * 128 == 743_311_872
    outside = 1e9 + 2 * (32 * 12 * MiB + 16 * 2 * 8 * 128 * 1024 * 8 + 2 * MiB)
    assert first.total == pytest.approx(1.05 * (21_127_385_088 + varlen + 56_670_833_184) + outside)
    assert 1.05 * (21_127_385_088 + varlen + 16_404 * (7_737_600 - 225_416 * 18)) + outside > 85e9 >= first.total
    line = first.describe(85.0)
    assert line.startswith("trainer rank 0: ~84.8 GB of 85 (activations 56.7, ")
    assert line.endswith("; activation checkpointing: 19 of 32 layers (auto: the fewest that fit 85 GB with the "
                         "margin)"), line
    first, *_ = auto(85.0)
    assert first.checkpointed == 31 and first.bytes["activations"] == 65_536 * (31 * 16_384 + 241_800)
    every, *_ = check_memory(compose(["experiment=paper_8b", f"model.path={llama_8b}"]), 85.0, llama_tokenizer)
    assert every.checkpointed == 32 and every.total - first.total == pytest.approx(1.05 * 65_536 * 16_384)
    assert every.describe(85.0).endswith("; activation checkpointing: 32 of 32 layers "
                                         "(train.activation_checkpointing=true)")
    with pytest.raises(ValueError) as refused:
        auto(60.0)
    assert str(refused.value).endswith("; activation checkpointing: 31 of 32 layers (auto: the least memory, and no "
                                       "count fits 60 GB with the margin); by the memory model, "
                                       "docs/design.md#the-memory-model"), str(refused.value)
    assert "the part that takes the room: activations, 49.1 GB; set train.micro_batch_tokens=40960 or less (the " \
           "most that fits, in steps of 1,024), or shard the state" in str(refused.value), str(refused.value)


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_the_learner_recomputes_exactly_the_chosen_layers_and_the_gradient_is_unchanged():
    """A 4-layer tiny Llama, train.activation_checkpointing=2: the first two decoder layers run their forward twice
    a pass (once more in the backward, recomputed), the last two once; the gradient equals the one with nothing
    recomputed within fp32 rounding. With auto, the learner takes the count that the check before submit gives for
    launcher.gpu_memory_gb (here a GPU sized so that 2 layers fit, their margin included, and 1 does not)."""
    from omegaconf import OmegaConf

    from ablate.checks import layout_memory
    from ablate.registry import build
    from ablate.trainer import Learner, checkpoint_layers

    plain = OmegaConf.create(OmegaConf.to_container(compose(["generator=mock", "model.num_layers=4"]), resolve=True,
                                                    enum_to_str=True))
    ro = build(plain.generator, cfg=plain).rollouts(list(range(2)), 0, compute=2000.0)
    rewards = torch.arange(ro.n, dtype=torch.float32) % 3

    def step(setting) -> tuple[Learner, list[int], torch.Tensor]:
        """A learner's step with its optimizer held (the gradient kept), and its layers' forward calls."""
        learner = Learner(OmegaConf.merge(plain, {"train": {"activation_checkpointing": setting}}))
        calls = [0] * len(learner.policy.model.layers)

        def counted(i, forward):
            def forward_counted(*args, **kwargs):
                calls[i] += 1
                return forward(*args, **kwargs)
            return forward_counted

        for i, layer in enumerate(learner.policy.model.layers):  # the recompute's calls too (no module hook fires)
            layer.forward = counted(i, layer.forward)
        learner.optimizer.step = lambda: None
        learner.optimizer.zero_grad = lambda set_to_none=True: None
        learner.step(ro, rewards, torch.ones(ro.n, dtype=torch.bool))
        return learner, calls, torch.cat([p.grad.flatten() for p in learner.policy.parameters()])

    two, calls, gradient = step(2)
    passes = calls[3]
    assert two.checkpointed == 2 and passes >= 1 and calls == [2 * passes, 2 * passes, passes, passes]
    assert [layer.gradient_checkpointing for layer in two.policy.model.layers] == [True, True, False, False]
    none, calls, plain_gradient = step(False)
    assert none.checkpointed == 0 and not none.policy.is_gradient_checkpointing and calls == [passes] * 4
    assert gradient.abs().sum() > 0
    torch.testing.assert_close(gradient, plain_gradient)

    def peak(setting) -> float:
        return layout_memory(OmegaConf.merge(plain, {"train": {"activation_checkpointing": setting}}), 1.0)[0].total

    assert peak(0) > peak(1) > peak(2)
    auto = OmegaConf.merge(plain, {"train": {"activation_checkpointing": "auto"},
                                   "launcher": {"gpu_memory_gb": (peak(2) + peak(1)) / 2 / 1e9}})
    assert checkpoint_layers(none.policy, auto) == 2
    assert [layer.gradient_checkpointing for layer in none.policy.model.layers] == [True, True, False, False]
