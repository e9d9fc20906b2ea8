"""The memory model: the bytes each process of a layout holds on its GPU at its peak, part by part, from the model's
shape and the run's settings (checked before submit: ablate.checks.check_memory; priced at scale:
bench/bench_cluster.py). An estimate, not a measurement: what the parts are and where they come from is in
docs/design.md#the-memory-model; bench/gpu_check.py compares it with a GPU's measured peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GB = 1e9
HEAD_CHUNK = 1024  # rows of logits the LM head computes at once (ablate/rl/precision.py)


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


def kv_bytes_per_token(shape: Shape, compute: int) -> int:
    """A KV cache's bytes per token: K and V of every layer."""
    return 2 * shape.layers * shape.kv_dim * compute


@dataclass
class Process:
    """One process of a layout on its GPU: its parts in bytes, largest first when read through `parts`."""

    name: str  # "trainer rank 0", "a trainer rank", "an engine process"
    bytes: dict[str, float] = field(default_factory=dict)

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
        return f"{self.name}: ~{self.total / GB:,.1f} GB{of} ({parts})"


def longest_row(generation) -> int:
    """A row's tokens at its longest: generation.max_prompt_tokens + max_think_tokens + max_answer_tokens (the
    interruption's phrase aside)."""
    return int(generation.max_prompt_tokens) + int(generation.max_think_tokens) + int(generation.max_answer_tokens)


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


def trainer(shape: Shape, *, ranks: int, micro_tokens: float, checkpointing: bool, compute: int, head: int,
            sharded_gradients: bool = True, name: str = "a trainer rank") -> Process:
    """A trainer rank at its peak, the backward of a micro-batch of `micro_tokens` tokens: fp32 masters, AdamW's two
    moments and the fp32 gradients, sharded over `ranks`; under FSDP (ranks > 1) two layers gathered in the compute
    dtype and one layer's gradients before their reduce-scatter (and its fp32 copy for it), the root gathered in fp32
    with its gradient, and (run.sharded_gradients=false) a whole fp32 gradient; in one process in bf16, autocast's
    copies of the matmuls' weights; the activations (with activation checkpointing every layer's fp32 input and one
    layer recomputed whole); the LM head's fp32 inputs, its weight in the compute dtype and one chunk of its logits
    (`head` bytes a float) with their gradient."""
    n = shape.params
    p = Process(name)
    p.bytes["weights, gradients and AdamW state"] = 16 * n / ranks
    if ranks > 1:
        p.bytes["gathered layers"] = shape.layer_params * (2 * compute + compute + 4)
        p.bytes["gathered embeddings and head"] = 2 * 4 * shape.root_params
        if not sharded_gradients:
            p.bytes["whole fp32 gradient (run.sharded_gradients=false)"] = 4 * n
    elif compute < 4:
        p.bytes["autocast's copies of the weights"] = compute * shape.layers * shape.layer_matmul_params
    per_layer = layer_activation_bytes(shape, compute)
    kept = shape.layers * 4 * shape.hidden + per_layer if checkpointing else shape.layers * per_layer
    p.bytes["activations"] = micro_tokens * kept
    # the head's inputs, the final norm's output over the fp32 residual stream, kept for its backward; its weight
    # rounded once to the compute dtype (ablate/rl/precision.py); one chunk of its fp32 logits and their gradient
    p.bytes["LM head's inputs"] = micro_tokens * shape.hidden * 4
    if compute < 4:
        p.bytes["LM head's weight in the compute dtype"] = compute * shape.vocab * shape.hidden
    p.bytes["LM head chunk"] = 2 * HEAD_CHUNK * shape.vocab * max(head, 4)
    return p


def torch_engine(shape: Shape, *, compute: int, copies: int, rows: float, row_tokens: float) -> dict[str, float]:
    """Our torch engine (generator=hf): `copies` of the weights in the compute dtype (its own; and a staging copy in
    an engine process) and the KV cache of `rows` rows at their longest."""
    return {"generator's weights": copies * compute * shape.params,
            "generator's KV cache": rows * row_tokens * kv_bytes_per_token(shape, compute)}


VLLM_WORKSPACE = 4 * GB  # vLLM's share beyond its weights and KV cache: its profiled batch's activations, CUDA
# graphs, the sampler (an estimate, docs/design.md#the-memory-model)
OUTSIDE_VLLM = 2 * GB  # an engine process's memory outside vLLM's share: the CUDA context, NCCL's buffers


def vllm_engine(*, gpu_bytes: float, utilization: float) -> dict[str, float]:
    """vLLM's share of the GPU (gpu_memory_utilization, of the memory the device reports: its weights, activations
    and KV cache) and the CUDA context and NCCL's buffers beside it."""
    return {"vLLM (gpu_memory_utilization)": utilization * gpu_bytes, "CUDA context and NCCL": OUTSIDE_VLLM}


def vllm_share(shape: Shape, *, compute: int, gpu_bytes: float, rows: float, row_tokens: float, beside: float,
               tensor_parallel: int = 1) -> float:
    """The gpu_memory_utilization an engine process gives vLLM when it is unset: what its rows need (its weights,
    the KV cache of `rows` rows at `row_tokens`, its workspace; a tensor-parallel rank's share), as far as the GPU
    has room beside the process's other parts (`beside` bytes: the staging copy, a validation cache) and what lives
    outside vLLM, and never less than its weights and workspace with one row's cache (where even that has no room,
    the memory check names what took it). vLLM's unit: the GPU's memory as the device reports it (`gpu_bytes`)."""
    def share(rows: float) -> float:
        return (compute * shape.params + rows * row_tokens * kv_bytes_per_token(shape, compute)) / tensor_parallel \
            + VLLM_WORKSPACE

    return max(min(share(rows), gpu_bytes - OUTSIDE_VLLM - beside), share(1)) / gpu_bytes


def vllm_room(shape: Shape, *, compute: int, gpu_bytes: float, utilization: float, tensor_parallel: int = 1) -> float:
    """Bytes of vLLM's share left once its weights are in (its KV cache and activations); negative: they do not fit."""
    return utilization * gpu_bytes - compute * shape.params / tensor_parallel
