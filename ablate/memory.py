"""The memory model: the bytes each process of a layout holds on its GPU at its peak, part by part, from the model's
shape and the run's settings, and the part that takes the room where one does not fit (checked before submit:
ablate.checks.check_memory; priced at scale: bench/bench_cluster.py). An estimate, not a measurement: what the parts
are and where they come from is in docs/design.md#the-memory-model; bench/gpu_check.py compares it with a GPU's
measured peak.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

GB = 1e9
MiB = 2**20
HEAD_CHUNK = 1024  # rows of logits the LM head computes at once (ablate/rl/precision.py)
VLLM_SHARE = "vLLM (gpu_memory_utilization)"  # an engine's part: vLLM's share of its GPU


@dataclass(frozen=True)
class Shape:
    """A decoder's shape (the defaults: Llama-3.1-8B, the size of experiment=paper_8b)."""

    layers: int = 32
    hidden: int = 4096
    intermediate: int = 14336
    heads: int = 32
    kv_heads: int = 8
    vocab: int = 128256
    tied: bool = False  # the LM head is the embedding's weight

    @classmethod
    def of(cls, config) -> Shape:
        """From a transformers config (a Llama, Qwen, Mistral...: the usual field names)."""
        heads = config.num_attention_heads
        return cls(layers=config.num_hidden_layers, hidden=config.hidden_size,
                   intermediate=config.intermediate_size, heads=heads,
                   kv_heads=getattr(config, "num_key_value_heads", None) or heads, vocab=config.vocab_size,
                   tied=bool(getattr(config, "tie_word_embeddings", False)))

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.hidden // self.heads

    @property
    def layer_matmul_params(self) -> int:  # q, o; k, v; gate, up, down
        return 2 * self.hidden ** 2 + 2 * self.hidden * self.kv_dim + 3 * self.hidden * self.intermediate

    @property
    def layer_params(self) -> int:
        return self.layer_matmul_params + 2 * self.hidden  # and its two norms

    @property
    def root_params(self) -> int:
        """The embeddings, the LM head (unless tied) and the final norm."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def tensors(self) -> list[int]:
        """Each weight tensor's elements, in the order a transformers Llama makes them: the embeddings; per layer
        q, k, v, o, gate, up, down and the two norms; the final norm; the LM head unless tied."""
        h, kv, i = self.hidden, self.kv_dim, self.intermediate
        layer = [h * h, kv * h, kv * h, h * h, i * h, i * h, h * i, h, h]
        return [self.vocab * h, *layer * self.layers, h] + ([] if self.tied else [self.vocab * h])


def layer_activation_bytes(shape: Shape, compute: int) -> int:
    """Bytes autograd keeps per token for one HF Llama decoder layer as the trainer computes it, with a fused
    attention kernel (SDPA: no T x T scores): in fp32 (compute 4), 32h + 8 kv_dim + 16 I + 4 heads + 8; in bf16
    (compute 2: autocast over fp32 weights, or FSDP's bf16 layers with the fp32 residual stream, which keep the same
    tensors), 30h + 4 kv_dim + 8 I + 4 heads + 8: the fp32 residual and norm tensors (the norms' inputs, outputs and
    rstd), each matmul's input cast to bf16, q and k after the rotary embedding (promoted to fp32), attention's
    output and fp32 log-sum-exp, the MLP's gate, up, SiLU and product. Equal to the byte to autograd's saved tensors
    on 8 shapes (tests/test_compute.py)."""
    h, kv, i, heads = shape.hidden, shape.kv_dim, shape.intermediate, shape.heads
    if compute >= 4:
        return 32 * h + 8 * kv + 16 * i + 4 * heads + 8
    return 30 * h + 4 * kv + 8 * i + 4 * heads + 8


def checkpointed_layers(setting, layers: int) -> int:
    """The decoder layers train.activation_checkpointing recomputes, given as a bool (true: every layer, false:
    none) or a count of them (the first that many); "auto" is sized by the layout (`fewest_checkpointed`)."""
    if isinstance(setting, bool):
        return layers if setting else 0
    if isinstance(setting, int) and 0 <= setting <= layers:
        return setting
    raise ValueError(f"train.activation_checkpointing={setting!r}: true, false, auto or a count of decoder layers "
                     f"from 0 to the model's {layers}")


def activation_bytes(shape: Shape, *, checkpointed: int, compute: int) -> int:
    """Bytes per token the decoder's activations hold at a micro-batch's peak with its first `checkpointed` layers
    recomputed in the backward: a recomputed layer keeps its fp32 input (4h), a kept one its whole set
    (`layer_activation_bytes`). The backward reaches the recomputed layers last, once the kept layers' sets are
    freed, and holds one layer's set more while it recomputes it: with a layer kept that is below the peak at the
    backward's start, with none (every layer recomputed) it adds a layer's set. So keeping the last layer costs
    nothing: k of L layers recomputed hold 4hk + (L - k) x the set, every layer 4hL + the set
    (docs/design.md#the-memory-model)."""
    kept = shape.layers - checkpointed
    return 4 * shape.hidden * checkpointed + max(kept, 1 if checkpointed else 0) * layer_activation_bytes(shape,
                                                                                                        compute)


def fewest_checkpointed(layers: int, peak: Callable[[int], float], gpu_bytes: float) -> tuple[int, bool]:
    """train.activation_checkpointing=auto: the fewest of `layers` decoder layers to recompute for the estimated
    peak (`peak(k)`, bytes with k recomputed, the margin of `margin` among them) to fit a GPU of `gpu_bytes`, and
    True; where no count fits, the count of the least peak (every layer but the last, `activation_bytes`) and
    False."""
    counts = range(layers + 1)
    fits = [k for k in counts if peak(k) <= gpu_bytes]
    return (fits[0], True) if fits else (min(counts, key=peak), False)


def kv_bytes_per_token(shape: Shape, compute: int) -> int:
    """A KV cache's bytes per token: K and V of every layer."""
    return 2 * shape.layers * shape.kv_dim * compute


# the setting that gives back a part's room, for the memory check's refusal (Process.overflow); the parts not here
# are fixed by the model's shape and the layout
SHRINKS = {
    "activations": "lower train.micro_batch_tokens (and recompute more layers, train.activation_checkpointing=auto "
                   "or true, if it does not)",
    "weights, gradients and AdamW state": "shard them over more trainer ranks (run=fsdp, run.trainer_gpus)",
    "whole fp32 gradient (run.sharded_gradients=false)": "set run.sharded_gradients=true",
    "whole copy of the policy (fp32)": "give the engines processes of their own (run.generator_gpus >= 1)",
    "generator's KV cache": "lower generator.max_waves, or more engines (run.generator_gpus)",
    "staging copy of the weights": "set generator.weight_transfer=direct (vLLM then takes the weights as they come: "
                                   "no staging copy; PipelineRL only), or a smaller model",
    "staging copy's fragmentation": "set generator.weight_transfer=direct (no staging copy; PipelineRL only)",
    "validation's KV cache (our engine; generator.val_wave_rows)": "lower generator.val_wave_rows",
    VLLM_SHARE: "lower generator.gpu_memory_utilization",
}


@dataclass
class Process:
    """One process of a layout on its GPU: its parts in bytes, largest first when read through `parts`; `sized`:
    the parts sized to the room the others leave (vLLM's share with generator.gpu_memory_utilization unset), which
    are at their least when the process does not fit."""

    name: str  # "trainer rank 0", "a trainer rank", "an engine process"
    bytes: dict[str, float] = field(default_factory=dict)
    sized: tuple[str, ...] = ()
    checkpointed: int = 0  # a trainer's decoder layers recomputed in the backward
    note: str = ""  # said after its parts: "activation checkpointing: 12 of 32 layers (...)"

    @property
    def total(self) -> float:
        return sum(self.bytes.values())

    @property
    def parts(self) -> list[tuple[str, float]]:
        return sorted(self.bytes.items(), key=lambda kv: -kv[1])

    def describe(self, gpu_gb: float | None = None) -> str:
        """'trainer rank 0: ~61 GB of 80 (weights, gradients and AdamW state 32, activations 20, ...)'."""
        of = f" of {gpu_gb:g}" if gpu_gb else ""
        parts = ", ".join(f"{name} {b / GB:,.1f}" for name, b in self.parts if b >= 0.05 * GB or len(self.bytes) < 3)
        return f"{self.name}: ~{self.total / GB:,.1f} GB{of} ({parts})" + (f"; {self.note}" if self.note else "")

    def takes_the_room(self) -> tuple[str, float]:
        """The part that takes the room when the process does not fit: the largest a setting can shrink
        (`SHRINKS`), the sized ones aside; the largest of all where none can."""
        movable = [(name, b) for name, b in self.parts if name in SHRINKS and name not in self.sized]
        return (movable or self.parts)[0]

    def overflow(self, gpu_bytes: float, fix: str | None = None) -> str:
        """Why the process does not fit a GPU of `gpu_bytes`, in one line: its parts summed, the part that takes the
        room and the setting that gives it back (`fix` where the caller sized it, else `SHRINKS`'s): 'each engine
        process: vLLM (gpu_memory_utilization) 22.2 + staging copy of the weights 16.1 + ... = 40.1 GB > 36 GB; the
        part that takes the room: staging copy of the weights, 16.1 GB; set generator.weight_transfer=direct ...'."""
        shown = [(name, b) for name, b in self.parts if b >= 0.05 * GB]
        rest = self.total - sum(b for _, b in shown)
        terms = [f"{name} {b / GB:,.1f}" for name, b in shown] + ([f"smaller parts {rest / GB:,.2f}"] if rest else [])
        part, size = self.takes_the_room()
        if part == VLLM_SHARE:  # set by hand: the most it may have beside the rest, rounded down
            most = math.floor(100 * (gpu_bytes - self.total + size) / gpu_bytes) / 100
            fix = (f"set generator.gpu_memory_utilization={most:.2f} or less (the room the rest leaves it), or unset "
                   "it to size it to that room")
        elif fix is None:
            fix = SHRINKS.get(part, "a GPU with more memory (launcher.gpu_memory_gb) or a smaller model")
        return (f"{self.name}: {' + '.join(terms)} = {self.total / GB:,.1f} GB > {gpu_bytes / GB:g} GB; the part "
                f"that takes the room: {part}, {size / GB:,.1f} GB; {fix}")


def longest_row(generation, *, phrase_tokens: int) -> int:
    """A row's tokens at its longest: generation.max_prompt_tokens + max_think_tokens + the phrase injected at the
    thinking budget (`phrase_tokens`, the interruption's in the policy's tokenizer; 0 where none is) +
    max_answer_tokens. The one figure for the length check before any run (ablate.checks.check_lengths), vLLM's
    max_model_len and the rows the memory model holds."""
    return (int(generation.max_prompt_tokens) + int(generation.max_think_tokens) + int(phrase_tokens)
            + int(generation.max_answer_tokens))


def checkpoint_bytes(shape: Shape, *, ranks: int) -> float:
    """What one trainer rank writes to a checkpoint: its shard of the fp32 weights and of AdamW's two moments (12
    bytes a parameter; the gradients are not saved)."""
    return 12 * shape.params / ranks


def micro_batch_tokens(rows: int, cap: int, row_tokens: float) -> float:
    """Tokens of the largest micro-batch of rows `row_tokens` long, padded: `rows` of them, fewer under the token cap
    `cap` (0: none; a row longer than the cap goes alone)."""
    if cap:
        rows = max(1, min(rows, int(cap // row_tokens)))
    return rows * row_tokens


def largest_micro_batch(rows: int, cap: int, longest: int) -> int:
    """Tokens of the largest micro-batch, padded, the trainer makes of rows at most `longest` tokens long
    (ablate.plan.padded's largest pass): `rows` of them, or under the token cap `cap` (0: none) k rows as wide as
    k x width <= cap allows, or one row alone. Rows shorter than the longest may fill the cap where the longest do
    not: 4 rows of 16,384 tokens fill 65,536 where rows of 16,404 (the interruption's phrase included) go 3 to a
    micro-batch. A packed learner's passes: `packed_pass_tokens`."""
    if not cap or rows * longest <= cap:
        return rows * longest
    return max([longest, *(k * min(longest, cap // k) for k in range(2, min(rows, cap) + 1))])


def packed_pass_tokens(rows: int, cap: int, longest: int) -> int:
    """Tokens of the largest packed pass the trainer makes of rows at most `longest` tokens long (ablate.plan.packed
    at Learner.step_plan's budget): the budget, the token cap `cap` where set, else `rows` x the step's longest row
    (at most `longest`), whatever rows fill it; a row longer than the cap goes alone. More than the padded form's
    `largest_micro_batch` where the cap is over `rows` x `longest`: 64 rows of 1 token fill a cap of 64 where 2 rows
    of 17 pad to 34."""
    return max(cap, longest) if cap else rows * longest


def varlen_backward(shape: Shape, *, tokens: float, rows: int, compute: int) -> dict[str, float]:
    """FlashAttention-2's varlen backward at its peak in one decoder layer, for a packed pass of `tokens` tokens in
    `rows` rows, in the compute dtype (`compute` bytes: bf16 or fp16, the only ones it takes), part by part as
    mha_varlen_bwd allocates them (Dao-AILab/flash-attention csrc/flash_attn/flash_api.cpp at v2.8.3, 060c918, and
    the copy torch builds, aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp, which
    torch.nn.attention.varlen's backward reaches through aten::_flash_attention_backward): `dq_accum`, fp32
    [tokens + 128 x rows, heads, head dim rounded up to a multiple of 32 (64 above 128)], and `softmax_d`, fp32
    [heads, tokens + 128 x rows] (128 rows of padding after each row, FlashAttention's largest block); with grouped
    K/V, dK and dV expanded to every query head, [tokens, heads, head dim] each in the compute dtype, before their
    sum over each group; and the dQ, dK and dV it returns. Not deterministic mode's (torch.use_deterministic_algorithms:
    dq_accum once per split). docs/design.md#the-memory-model."""
    heads, kv_heads, dim = shape.heads, shape.kv_heads, shape.hidden // shape.heads
    block = 32 if dim <= 128 else 64
    padded = tokens + 128 * rows
    parts = {"varlen attention's backward: fp32 dQ accumulator and softmax sums":
             4 * padded * heads * (-(-dim // block) * block + 1)}
    if kv_heads != heads:
        parts["varlen attention's backward: dK and dV expanded to every head"] = 2 * compute * tokens * heads * dim
    parts["varlen attention's backward: dQ, dK and dV"] = compute * tokens * (heads + 2 * kv_heads) * dim
    return parts


def head_backward(shape: Shape, *, micro_tokens: float, compute: int, head: int,
                  chunk: int = HEAD_CHUNK) -> dict[str, float]:
    """The LM head's part of a trainer rank's peak, at the start of its backward (ablate/rl/precision.py's `_Head`,
    as it runs on CUDA), part by part: the fp32 [V, H] accumulator the weight's gradient is summed into over the
    chunks (which becomes that gradient); the hidden states' fp32 gradient [N, H]; where the operands are narrower
    than fp32 (`min(compute, head)` bytes: bf16 under bf16 compute), the weight and the hidden states rounded to them
    once in the forward and kept for the backward; and one chunk of `chunk` rows at its peak, per row and vocabulary
    entry its fp32 logits (made the softmax's gradient in place), the previous chunk's gradient in the operands'
    dtype (still held as they are computed), and logits narrower than fp32 (the bf16 head's) before their fp32 copy:
    4 + 2 bytes for the fp32 head on bf16 operands. tests/test_memory.py holds it to the live bytes of the real
    Function on that path."""
    v, h = shape.vocab, shape.hidden
    operands = min(compute, head)
    parts = {"LM head's backward: fp32 accumulator of the weight's gradient": 4 * v * h,
             "LM head's backward: hidden states' gradient": 4 * micro_tokens * h}
    if operands < 4:
        parts["LM head's backward: weight in the operands' dtype"] = operands * v * h
        parts["LM head's backward: hidden states in the operands' dtype"] = operands * micro_tokens * h
    entry = 4 + operands + (head if head < 4 else 0)
    parts["LM head's backward: a chunk's logits, softmax and gradient"] = min(chunk, micro_tokens) * v * entry
    return parts


def trainer(shape: Shape, *, ranks: int, micro_tokens: float, checkpointing: bool | int, compute: int, head: int,
            sharded_gradients: bool = True, varlen_rows: int = 0, name: str = "a trainer rank") -> Process:
    """A trainer rank at its peak, the start of the backward of a micro-batch of `micro_tokens` tokens: fp32
    masters, AdamW's two moments and the fp32 gradients, sharded over `ranks`; under FSDP (ranks > 1) two layers
    gathered in the compute dtype and one layer's gradients before their reduce-scatter (and its fp32 copy for it),
    the root gathered in fp32 with the gradients of its embeddings and norm (the head's is the accumulator of
    `head_backward`), and (run.sharded_gradients=false) a whole fp32 gradient; in one process in bf16, autocast's
    copies of the matmuls' weights; the activations (`activation_bytes`; `checkpointing`: every layer recomputed,
    none, or a count of the first layers, `checkpointed_layers`); the LM head's fp32 inputs (the final norm's
    output) and its backward (`head_backward`; `head` bytes a float of its logits); packed, with attention in
    FlashAttention's varlen kernel, its backward's scratch for a pass of `varlen_rows` rows (`varlen_backward`; 0:
    none, attention row by row or padded). What the model cannot count tensor by tensor is `margin`'s."""
    n = shape.params
    p = Process(name)
    p.bytes["weights, gradients and AdamW state"] = 16 * n / ranks
    if ranks > 1:
        p.bytes["gathered layers"] = shape.layer_params * (2 * compute + compute + 4)
        head_weight = shape.vocab * shape.hidden
        p.bytes["gathered embeddings and head"] = 4 * shape.root_params + 4 * (shape.root_params - head_weight)
        if not sharded_gradients:
            p.bytes["whole fp32 gradient (run.sharded_gradients=false)"] = 4 * n
    elif compute < 4:
        p.bytes["autocast's copies of the weights"] = compute * shape.layers * shape.layer_matmul_params
    p.checkpointed = checkpointed = checkpointed_layers(checkpointing, shape.layers)
    p.bytes["activations"] = micro_tokens * activation_bytes(shape, checkpointed=checkpointed, compute=compute)
    # the head's inputs, the final norm's output over the fp32 residual stream, kept for its backward
    p.bytes["LM head's inputs"] = micro_tokens * shape.hidden * 4
    p.bytes.update(head_backward(shape, micro_tokens=micro_tokens, compute=compute, head=head))
    if varlen_rows:
        p.bytes.update(varlen_backward(shape, tokens=micro_tokens, rows=varlen_rows, compute=compute))
    return p


def torch_engine(shape: Shape, *, compute: int, copies: int, rows: float, row_tokens: float) -> dict[str, float]:
    """Our torch engine (generator=hf): `copies` of the weights in the compute dtype (its own; and a staging copy in
    an engine process) and the KV cache of `rows` rows at their longest."""
    return {"generator's weights": copies * compute * shape.params,
            "generator's KV cache": rows * row_tokens * kv_bytes_per_token(shape, compute)}


def cached_bytes(sizes: list[int]) -> int:
    """What torch's CUDA caching allocator reserves for tensors of these sizes (bytes), made in this order from an
    empty cache, as c10/cuda/CUDACachingAllocator.cpp lays them out: sizes rounded up to 512 bytes; up to 1 MiB from
    2 MiB segments, up to 10 MiB from 20 MiB ones, larger rounded up to 2 MiB, each new segment only when no free
    block of its pool holds the tensor (the smallest that does is split: a small one down to 512 bytes, a large one
    while more than 1 MiB is left)."""
    pools: dict[bool, list[int]] = {True: [], False: []}  # small?: free blocks' sizes
    reserved = 0
    for size in sizes:
        size = max(512, -(-size // 512) * 512)
        small = size <= MiB
        free = [b for b in pools[small] if b >= size]
        if free:
            block = min(free)
            pools[small].remove(block)
        else:
            block = 2 * MiB if small else 20 * MiB if size < 10 * MiB else -(-size // (2 * MiB)) * 2 * MiB
            reserved += block
        if block - size >= 512 if small else block - size > MiB:
            pools[small].append(block - size)
    return reserved


def staging_slack(shape: Shape, compute: int) -> float:
    """The staging copy's fragmentation: what the allocator reserves for its tensors (`cached_bytes`, made one by
    one as ablate/generators/remote.py builds the policy) beyond their bytes: at 8B, each layer's K and V (8 MiB
    each) share a 20 MiB segment, 4 MiB of it left over: 136 MB in all."""
    sizes = [compute * n for n in shape.tensors()]
    return float(cached_bytes(sizes) - sum(sizes))


VLLM_WORKSPACE = 4 * GB  # vLLM's share beyond its weights and KV cache: its profiled batch's activations, CUDA
# graphs, the sampler (an estimate, docs/design.md#the-memory-model)
# A process's memory outside torch's tensors (an engine's outside vLLM's share, a trainer's `margin`:
# docs/design.md#the-memory-model). The CUDA context, as measured on a lent H200 (2026-11-27, torch 2.11 / CUDA 13,
# bench/gpu_first.py): 0.99 GB of the device used outside torch's allocator once a process had run a learner, FSDP
# over NCCL and the fp32 head (its loaded kernels and cuBLAS's workspaces with it); PyTorch's maintainers give
# ~0.3-0.4 GB for a bare context (pytorch/pytorch#107667, #109888)
CUDA_CONTEXT = 1.0 * GB
# NCCL's ring buffers of one communicator (the weights group's broadcasts, which NCCL runs on rings only; the FSDP
# group's all-gathers and reduce-scatters, on rings where not on NVLS), as NCCL 2.2x sizes them (src/init.cc,
# src/transport/p2p.cc): per channel the receiving connection's LL (512 KiB), LL128 (4.6875 MiB) and SIMPLE
# (NCCL_BUFFSIZE, 4 MiB by default) buffers, 10 MiB in cuMem's 2 MiB granules, and the sending one's 2 MiB; for 32
# channels, the most NCCL logs show on an 8-GPU H100 node (16-24 collective, 32 peer-to-peer)
NCCL_RING = 32 * (10 + 2) * MiB
# and NVLink SHARP's (NVSwitch nodes; NCCL_NVLS_ENABLE=0: none): NVLS_NCHANNELS (16 on an H100) x 2 x NCCL_STEPS (8)
# x NCCL_NVLS_CHUNKSIZE (128 KiB) x one head per GPU of the node (8), src/transport/nvls.cc, and a 2 MiB granule of
# credits. NCCL >= 2.22 (NCCL_RUNTIME_CONNECT=1) sets it up at an NVLS algorithm's first use: FSDP's all-gathers and
# reduce-scatters take it on an NVSwitch node; the weights group's broadcasts never do (counted in case it is set up at
# init: NCCL_RUNTIME_CONNECT=0, an older NCCL)
NCCL_NVLS = 16 * 2 * 8 * 128 * 1024 * 8 + 2 * MiB
WEIGHTS_GROUP, FSDP_GROUP = "weights group", "FSDP group"  # the communicators a process of a layout may be in


def nccl_buffers(group: str) -> dict[str, float]:
    """NCCL's buffers on a GPU for one communicator of `group` (`NCCL_RING`, `NCCL_NVLS`: the same sizes whatever
    the collective, a ring keeping two connections a channel at any scale)."""
    return {f"NCCL's ring buffers ({group})": NCCL_RING, f"NCCL's NVLS buffers ({group})": NCCL_NVLS}


def outside_vllm(*, weights_group: bool = True) -> dict[str, float]:
    """What an engine's process holds outside vLLM's share, whatever it stages: the CUDA context, and in an engine
    process of its own NCCL's buffers of the weights group (beside trainer rank 0 the engine has none of its own)."""
    return {"CUDA context": CUDA_CONTEXT, **(nccl_buffers(WEIGHTS_GROUP) if weights_group else {})}


# The caching allocator's fragmentation on a trainer GPU: memory reserved in its segments that no tensor of the pass
# can take, as a share of the bytes torch's allocator hands out. A figure stated, not measured on this learner
# (docs/design.md#the-memory-model says why this one and what would measure it); the staging copy's is derived
# (`staging_slack`)
FRAGMENTATION = 0.05
FRAGMENTS = f"caching allocator's fragmentation ({FRAGMENTATION:.0%} of torch's tensors)"


def margin(parts: dict[str, float], *, groups: tuple[str, ...]) -> dict[str, float]:
    """What a trainer process holds beside its tensors' `parts`, which the model cannot count tensor by tensor: the
    CUDA context (`CUDA_CONTEXT`, measured), NCCL's buffers of each communicator in `groups` (`nccl_buffers`: the FSDP
    group's on every rank of several, the weights group's on rank 0 with engine processes), and the caching
    allocator's fragmentation, `FRAGMENTATION` of the bytes torch's allocator holds: every part but those, and but
    vLLM's share (a pool of vLLM's own, beside a trainer rank 0 with no engine processes)."""
    outside = {"CUDA context": CUDA_CONTEXT}
    for group in groups:
        outside.update(nccl_buffers(group))
    held = sum(b for name, b in parts.items() if name not in outside and name != VLLM_SHARE)
    return {**outside, FRAGMENTS: FRAGMENTATION * held}


def vllm_engine(*, gpu_bytes: float, utilization: float, weights_group: bool = True) -> dict[str, float]:
    """vLLM's share of the GPU (gpu_memory_utilization, of the memory the device reports: its weights, activations
    and KV cache) and what the process holds outside it (`outside_vllm`)."""
    return {VLLM_SHARE: utilization * gpu_bytes, **outside_vllm(weights_group=weights_group)}


def vllm_share(shape: Shape, *, compute: int, gpu_bytes: float, rows: float, row_tokens: float, beside: float,
               tensor_parallel: int = 1) -> float:
    """The gpu_memory_utilization an engine process gives vLLM when it is unset: what its rows need (its weights,
    the KV cache of `rows` rows at `row_tokens`, its workspace; a tensor-parallel rank's share), as far as the GPU
    has room beside the process's other parts (`beside` bytes: the staging copy, a validation cache) and what lives
    outside vLLM (`outside_vllm`), and never less than its weights and workspace with one row's cache (where even that
    has no room, the memory check names what took it). vLLM's unit: the GPU's memory as the device reports it
    (`gpu_bytes`)."""
    def share(rows: float) -> float:
        return (compute * shape.params + rows * row_tokens * kv_bytes_per_token(shape, compute)) / tensor_parallel \
            + VLLM_WORKSPACE

    outside = sum(outside_vllm().values())
    return max(min(share(rows), gpu_bytes - outside - beside), share(1)) / gpu_bytes


def vllm_room(shape: Shape, *, compute: int, gpu_bytes: float, utilization: float, tensor_parallel: int = 1) -> float:
    """Bytes of vLLM's share left once its weights are in (its KV cache and activations); negative: they do not fit."""
    return utilization * gpu_bytes - compute * shape.params / tensor_parallel
