"""The policy: a transformers causal LM, and the log-probs of completions under it with the configured LM head.

Works with any transformers causal LM that exposes `get_decoder()` (the hidden states) and
`get_output_embeddings()` (the LM head): the head is applied by the precision option, so the [N, T, vocab] logits
are never built whole. Models whose logits get more than the head (Gemma's final soft-capping) are not covered.

Mixed precision, the standard way: the trainer's weights (and so AdamW's state) are fp32 masters, and the decoder
computes in `model.dtype` under autocast (bf16 for real models: matmuls in bf16, fp32 accumulation, the residual
stream and norms in fp32). At the paper's lr 5e-7 an update is ~1e-5 of a weight: bf16 weights (8 bits of
mantissa) would round most of it away. The LM head never runs under autocast: its dtype is the precision option's.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Callable

import torch
from omegaconf import DictConfig, OmegaConf


def build_tokenizer(model: DictConfig):
    """model.path set: its tokenizer. Unset: the word-level tokenizer made in code (ablate/tasks/tokenizer.py)."""
    if model.path:
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint(model), **hub_args(model))
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer
    from ablate.tasks.tokenizer import build_tokenizer as code_tokenizer

    return code_tokenizer()


def checkpoint(model: DictConfig) -> str:
    """model.path as every read of it takes it: a local folder with `~` expanded (the checks before submit expand it
    too), or a hub name as it is."""
    return os.path.expanduser(str(model.path))


def hub_args(model: DictConfig) -> dict:
    """What every read of model.path passes (transformers' from_pretrained; vLLM's EngineArgs): the revision and
    whether the folder's own code may run."""
    return {"revision": model.get("revision"), "trust_remote_code": bool(model.get("trust_remote_code", False))}


def end_of_turn_id(tokenizer) -> int | None:
    """The special token the tokenizer's chat template closes an assistant's turn with (<|im_end|> for Qwen's
    ChatML, <|eot_id|> for Llama-3), found by rendering one turn; None without a template or such a token."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    marker = "ablate-end-of-turn-marker"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "?"},
                                              {"role": "assistant", "content": marker}], tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot render a plain turn names no end
        return None
    after = text.rpartition(marker)[2]
    special = {t: i for t, i in tokenizer.get_added_vocab().items() if after.startswith(t)}
    return special[max(special, key=len)] if special else None


def stop_token_ids(model: DictConfig, generation: DictConfig, tokenizer) -> tuple[int, ...]:
    """The token ids a completion ends at: generation.stop_token_ids when set; else TRL's rule, the eos ids of the
    model's generation_config.json with the tokenizer's eos before them when they lack it, and then the end of an
    assistant's turn in the tokenizer's chat template (a base model's eos, <|endoftext|>, is not where its ChatML
    turn ends: docs/training.md#stop-tokens)."""
    vocab = len(tokenizer)
    if generation.get("stop_token_ids"):
        ids = tuple(int(i) for i in generation.stop_token_ids)
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise ValueError(f"generation.stop_token_ids={list(ids)}: {bad} not in the tokenizer's {vocab} ids")
        return ids
    ids = []
    if model.path:
        import transformers

        try:
            eos = transformers.GenerationConfig.from_pretrained(checkpoint(model),
                                                                revision=model.get("revision")).eos_token_id
        except OSError:  # no generation_config.json: the tokenizer alone
            eos = None
        ids = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id not in ids:
        ids.insert(0, tokenizer.eos_token_id)
    turn = end_of_turn_id(tokenizer)
    if turn is not None and turn not in ids:
        ids.append(turn)
    return tuple(ids)


def describe_stops(ids: tuple[int, ...], tokenizer) -> str:
    """'<|im_end|> 151645, <|endoftext|> 151643': the stop ids as a user recognises them."""
    return ", ".join(f"{tokenizer.convert_ids_to_tokens(i)} {i}" for i in ids)


def device_of(model: DictConfig) -> torch.device:
    if model.get("device", "auto") == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(model.device)


def compute_dtype(model: DictConfig) -> torch.dtype:
    """The dtype the decoder computes in (`model.dtype`); the weights themselves stay fp32."""
    return getattr(torch, model.dtype)


def autocast(device: torch.device, dtype: torch.dtype):
    """The decoder's compute context: autocast to `dtype`, or nothing when that is fp32 (the weights' own dtype)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def build_policy(model: DictConfig, seed: int = 0, tokenizer=None, *, read_weights: bool = True,
                 dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """model.path set: load it (a local folder or a hub name). Unset: a tiny Llama with random weights, its
    vocabulary model.vocab_size or (0) the tokenizer's. On model.device, with fp32 (master) weights whatever
    model.dtype says: that is the compute dtype (`autocast`).

    read_weights=False: the architecture alone, made on model.device in `dtype` with random weights, model.path's
    checkpoint never read: for a process whose weights come from trainer rank 0 (another trainer rank, an engine
    process), which would otherwise hold a whole fp32 copy in host memory first (32 GB at 8B)."""
    import transformers

    if model.path and read_weights:
        built = transformers.AutoModelForCausalLM.from_pretrained(checkpoint(model), config=model_config(model),
                                                                  dtype=dtype, **hub_args(model)).to(device_of(model))
        return linear_attention(built, compute_dtype(model))
    config = model_config(model, tokenizer)
    torch.manual_seed(seed)
    with torch.device(device_of(model)):  # made where it runs (no CPU copy of a GPU model first)
        return linear_attention(transformers.AutoModelForCausalLM.from_config(config, dtype=dtype),
                                compute_dtype(model))


SDPA_LINEAR = "ablate_sdpa_linear"  # the name `linear_attention` registers its attention function under


def _sdpa_linear(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                 **kwargs):
    """transformers' sdpa attention, but for fp32 queries with grouped K/V and no mask (the trainer's forward in
    fp32 compute): K/V repeated to the query's heads first. SDPA given grouped K/V (`enable_gqa`) has only its math
    kernel for fp32 (FlashAttention takes bf16/fp16, the memory-efficient kernel refuses grouped K/V), which builds
    [N, heads, L, L] scores: 34 GB for one 16k-token row at 32 heads. Repeated, the memory-efficient kernel runs,
    linear in L (docs/design.md#attention-kernels)."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    groups = query.shape[1] // key.shape[1]
    if query.dtype != torch.float32 or groups == 1 or attention_mask is not None or key.shape[2] != query.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    causal = query.shape[2] > 1 and (is_causal if is_causal is not None else getattr(module, "is_causal", True))
    out = torch.nn.functional.scaled_dot_product_attention(query, repeat_kv(key, groups), repeat_kv(value, groups),
                                                           dropout_p=dropout, scale=scaling, is_causal=causal)
    return out.transpose(1, 2).contiguous(), None


def linear_attention(model: torch.nn.Module, compute: torch.dtype) -> torch.nn.Module:
    """`model` with its attention through `_sdpa_linear` where that matters: it computes in fp32, its K/V heads are
    grouped, and it runs transformers' sdpa (a model set to another implementation keeps it). Registered in
    transformers' attention and mask interfaces (the mask as sdpa's) on first use."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = model.config
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or \
        config.num_attention_heads
    if compute != torch.float32 or kv_heads == heads or getattr(config, "_attn_implementation", None) != "sdpa":
        return model
    AttentionInterface.register(SDPA_LINEAR, _sdpa_linear)
    AttentionMaskInterface.register(SDPA_LINEAR, sdpa_mask)
    model.set_attn_implementation(SDPA_LINEAR)
    return model


def overrides(model: DictConfig) -> dict:
    """model.overrides as plain values (a rope_scaling dict, not a DictConfig)."""
    found = model.get("overrides")
    return OmegaConf.to_container(found, resolve=True) if isinstance(found, DictConfig) else dict(found or {})


def model_config(model: DictConfig, tokenizer=None):
    """The transformers config: model.path's with model.overrides replacing its fields, or the tiny Llama's from
    model's fields."""
    import transformers

    if model.path:
        config = transformers.AutoConfig.from_pretrained(checkpoint(model), **hub_args(model))
        for key, value in overrides(model).items():
            if not hasattr(config, key):
                raise ValueError(f"model.overrides.{key}: {type(config).__name__} of model.path={model.path} has "
                                 f"no field {key!r}")
            setattr(config, key, value)
        return config
    vocab = model.vocab_size or len(tokenizer if tokenizer is not None else build_tokenizer(model))
    if tokenizer is not None and vocab < len(tokenizer):
        raise ValueError(f"model.vocab_size={vocab} is smaller than the tokenizer's {len(tokenizer)} tokens")
    return transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=model.hidden_size,
        intermediate_size=model.get("intermediate_size", 0) or 4 * model.hidden_size,
        num_hidden_layers=model.num_layers, num_attention_heads=model.num_heads, num_key_value_heads=model.num_heads,
        max_position_embeddings=4096, tie_word_embeddings=bool(model.get("tie_embeddings", False)),
    )


@torch.no_grad()
def weights_in(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`model` with its floating-point parameters in `dtype` (in place), its buffers as they are: the rotary
    embedding's frequencies stay fp32, as the trainer computes them and as transformers makes a model in a dtype
    (`model.to(dtype)` would round them to bf16: angles off by up to 2^-9 of themselves, a log-prob gap of its own)."""
    for param in model.parameters():
        if param.is_floating_point():
            param.data = param.data.to(dtype)
    return model


def completion_logprobs(model: torch.nn.Module, prompt_tokens: torch.Tensor, prompt_mask: torch.Tensor,
                        tokens: torch.Tensor, lengths: torch.Tensor, head: Callable,
                        temperature: float = 1.0, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """log pi(tokens[i, t] | prompt_i, tokens[i, :t]) for t < lengths[i]; [N, T] float32 (0 past the length).

    prompt_tokens [N, P] left-padded (prompt_mask marks the real ones); tokens [N, T] right-padded to `lengths`.
    Injected tokens are part of the context like any other; the loss mask keeps them out of the loss.
    With a sampling temperature, the log-probs are those of the tempered distribution the generator sampled from.
    The decoder runs under `autocast(compute_dtype)`; the head in the precision option's dtype (its operands, for
    the fp32 head, in `compute_dtype`).

    Each row goes in left-aligned (its prompt's real tokens at positions 0.., then its completion, padding only at
    the end, the columns no row reaches dropped) with no attention mask: causality alone keeps every real token from
    the padding after it, so attention runs as `is_causal` (FlashAttention or the memory-efficient kernel on a GPU,
    GQA's native path) instead of with a [N, 1, L, L] mask built from the padding (docs/design.md#the-memory-model).
    """
    N, P = prompt_tokens.shape
    T = tokens.shape[1]
    steps = torch.arange(T, device=tokens.device)
    inside = steps[None, :] < lengths[:, None]
    real = prompt_mask.sum(dim=1)  # [N] each prompt's real tokens (its left padding: P - real)
    L = int((real + lengths).max())  # the longest row, left-aligned
    at = torch.arange(L, device=tokens.device)
    columns = (at[None, :] + (P - real)[:, None]).clamp(max=P + T - 1)  # row i's column j: column j + its padding
    aligned = torch.cat([prompt_tokens, tokens], dim=1).gather(1, columns)
    with autocast(tokens.device, compute_dtype):
        hidden = model.get_decoder()(input_ids=aligned, position_ids=at[None, :].expand(N, L),
                                     use_cache=False).last_hidden_state  # no K/V copied into a cache nobody reads
    # the state at position p predicts the token at p + 1: completion token t of row i at real_i - 1 + t
    where = (real[:, None] - 1 + steps[None, :]).clamp(max=L - 1)
    predicting = hidden.gather(1, where[:, :, None].expand(N, T, hidden.shape[-1]))
    lm_head = model.get_output_embeddings()
    # the head's operands in the compute dtype where the precision option takes them so (the generator's: bf16
    # hidden states and weights); the temperature divides the logits, as the generators do
    logp = head(predicting, lm_head.weight, tokens, bias=lm_head.bias, temperature=temperature, operands=compute_dtype)
    return torch.where(inside, logp, torch.zeros_like(logp))


class Scorer(torch.nn.Module):
    """`completion_logprobs` of a model with its head, as a module: what a data-parallel wrapper (FSDP2,
    ablate/distributed/layouts.py) wraps, so that its hooks gather every weight the log-probs use, the LM head included (the
    head is applied from its weight, not by calling the LM head module). Holds the model as `model`."""

    def __init__(self, model: torch.nn.Module, head: Callable, temperature: float = 1.0,
                 compute_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.model, self.head = model, head
        self.temperature, self.compute_dtype = temperature, compute_dtype

    def forward(self, prompt_tokens: torch.Tensor, prompt_mask: torch.Tensor, tokens: torch.Tensor,
                lengths: torch.Tensor) -> torch.Tensor:
        return completion_logprobs(self.model, prompt_tokens, prompt_mask, tokens, lengths, self.head,
                                   temperature=self.temperature, compute_dtype=self.compute_dtype)


def compile_layers(model: torch.nn.Module, on: bool | None = None, **options) -> torch.nn.Module:
    """`model` with each decoder layer compiled in place (`torch.nn.Module.compile`: its names, its state dict and its
    hooks as they were), with dynamic shapes: a pass of new lengths reuses the layer's graphs instead of compiling its
    own. on=None: where it runs on CUDA (on the CPU every test's model would wait on the compiler). `options` go to
    torch.compile (a test's `backend`). In place before FSDP2 wraps the layers (as torchtitan orders them: FSDP2's hooks
    run eagerly around the compiled layer) and under activation checkpointing, which recomputes the compiled layer:
    docs/training.md#a-compiled-decoder."""
    if on is None:
        on = next(model.parameters()).is_cuda
    if on:
        for layer in model.get_decoder().layers:
            layer.compile(**{"dynamic": True, **options})
    return model


# ------------------------------------------------------------------------------------------------- packed rows
PACKED = "ablate_packed"  # `packed_attention` registers its functions as PACKED + "_over_" + the model's own


def _attention_dtype(query: torch.Tensor) -> torch.dtype:
    """The dtype attention computes in: autocast's on the queries' device where it is on, else the queries' own."""
    kind = query.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else query.dtype


def _varlen_attn():
    """torch.nn.attention.varlen.varlen_attn, or None where this torch has no such module (2.9 and before)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@functools.cache
def _parameters(function: Callable) -> frozenset[str]:
    """The names of `function`'s parameters, its signature read once (a pure function of the function)."""
    return frozenset(inspect.signature(function).parameters)


@torch.compiler.assume_constant_result  # a fact of the installed torch: a compiled layer takes its value, untraced
def _varlen_form() -> str:
    """How `_varlen` calls this torch's varlen attention: "enable_gqa" where it takes `scale`, a causal
    `window_size` and `enable_gqa` (torch 2.12 on), "grouped" where it takes the first two alone (2.11: grouped K/V go
    as they are, as its wrapper checks no heads), "" where it takes neither: none (2.9 and before) or 2.10's, which
    takes `is_causal=` and no `scale` (docs/training.md#packed-rows)."""
    varlen_attn = _varlen_attn()
    names = _parameters(varlen_attn) if varlen_attn is not None else frozenset()
    if not {"scale", "window_size"} <= names:
        return ""
    return "enable_gqa" if "enable_gqa" in names else "grouped"


def _kernels_run(device: torch.device, compute: torch.dtype) -> bool:
    """Whether torch's varlen kernels (FlashAttention's) run on `device` computing in `compute`: CUDA, bf16 or fp16.
    Tests on the CPU emulate it (tests/test_packing.py)."""
    return device.type == "cuda" and compute in (torch.bfloat16, torch.float16)


def packs_rows(setting: bool | None, device: torch.device, compute: torch.dtype) -> bool:
    """Whether the learner packs its passes (run.packed_rows): as set, else where torch's varlen attention runs (CUDA,
    bf16 or fp16 compute, a torch whose varlen_attn `_varlen` can call: `_varlen_form`). `packs_rows(None, ...)` is
    the one answer to "does varlen run here": a packed attention call (`_packed`) takes `_varlen` where it says so,
    `_by_row` elsewhere. Unpacked elsewhere: the per-row loop costs more than the padding it saves (a learner step
    0.19 s packed against 0.05 s per row on the embedded default on the CPU): docs/training.md#packed-rows."""
    if setting is not None:
        return bool(setting)
    return _kernels_run(device, compute) and bool(_varlen_form())


def describe_packing(setting: bool | None, device: torch.device, compute: torch.dtype) -> str:
    """The learner's form as the run's log says it once: packed through varlen, packed row by row (run.packed_rows=true
    where varlen does not run), or padded, and why."""
    if not _kernels_run(device, compute):
        why = f"torch's varlen attention runs on CUDA in bf16 or fp16, not on {device.type} in {compute}"
    elif not _varlen_form():
        why = (f"torch {torch.__version__} has no varlen attention that takes scale= and window_size= (2.11 on; 2.10's "
               f"takes is_causal= and no scale)")
    else:
        why = ""
    if setting is None and not why:
        return f"packed rows, attention within each row by torch's varlen_attn (torch {torch.__version__})"
    if setting is None:
        return f"padded rows (the per-row Scorer): {why}"
    if setting and why:
        return f"packed rows (run.packed_rows=true), attended row by row: {why}"
    return f"{'packed' if setting else 'padded'} rows (run.packed_rows={str(bool(setting)).lower()})"


def _varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bounds: torch.Tensor, longest: int,
            scale: float | None) -> torch.Tensor:
    """Causal attention within each row of a packed sequence: query [S, heads, D], key/value [S, K/V heads, D],
    bounds [rows + 1] int32 (row r is tokens bounds[r]:bounds[r + 1]), longest the longest row; [S, heads, D].
    One varlen kernel in the compute dtype (a custom op: autocast does not cast it), grouped K/V given as they are:
    FlashAttention-2 takes them forward and backward, and torch says so with `enable_gqa` where it takes it. No copy
    of q, k, v: the kernel needs only their last dimension contiguous, which the heads' views of a projection keep."""
    dtype = _attention_dtype(query)
    query, key, value = (t.to(dtype) for t in (query, key, value))
    grouped = {"enable_gqa": key.shape[1] != query.shape[1]} if _varlen_form() == "enable_gqa" else {}
    return _varlen_attn()(query, key, value, bounds, bounds, longest, longest, scale=scale, window_size=(-1, 0),
                          **grouped)


@torch.compiler.disable  # eager in a compiled layer (`compile_layers`): one graph break, not a loop unrolled per row
def _by_row(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bounds: torch.Tensor, longest: int,
            scale: float | None) -> torch.Tensor:
    """`_varlen`'s result where it cannot run (the CPU; fp32 compute; a torch without it): SDPA on each row's slice,
    causal with no mask, K/V repeated to the query's heads (the memory-efficient kernel's case in fp32:
    `_sdpa_linear`), so that memory stays linear in the row's tokens. Flex attention with a document mask has no
    backward on the CPU in torch 2.13. Never traced by torch.compile: its rows' bounds read to the host (once a layer)
    would break the graph there anyway, and a traced loop over them would be specialized to the pass's number of rows
    (a recompile for each)."""
    groups = query.shape[1] // key.shape[1]
    edges = bounds.tolist()
    out = [torch.nn.functional.scaled_dot_product_attention(
        query[start:end].transpose(0, 1)[None], key[start:end].repeat_interleave(groups, dim=1).transpose(0, 1)[None],
        value[start:end].repeat_interleave(groups, dim=1).transpose(0, 1)[None], is_causal=True, scale=scale,
    )[0].transpose(0, 1) for start, end in zip(edges[:-1], edges[1:]) if end > start]
    return torch.cat(out)


def _packed(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, *, unpacked: str,
            cu_seq_lens_q=None, cu_seq_lens_k=None, max_length_q=None, max_length_k=None, **kwargs):
    """transformers' attention call, for a model set to `packed_attention`. A packed call (one given the pass's row
    bounds, `cu_seq_lens_q`, as `packed_logprobs` passes them: query [1, heads, S, D], the empty mask) attends within
    each row alone: `_varlen` where `packs_rows(None, ...)` says varlen runs, `_by_row` elsewhere. Any other call
    goes to the model's own implementation."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if cu_seq_lens_q is None:
        return ALL_ATTENTION_FUNCTIONS[unpacked](module, query, key, value, attention_mask, dropout=dropout,
                                                 scaling=scaling, **kwargs)
    masked = attention_mask is not None and attention_mask.numel() > 0
    if query.shape[0] != 1 or masked or dropout or kwargs.get("sliding_window"):
        raise ValueError(f"a packed attention call takes one sequence, no mask, no dropout and no sliding window: got "
                         f"a batch of {query.shape[0]}, mask {masked}, dropout {dropout}, "
                         f"sliding window {kwargs.get('sliding_window')}")
    if cu_seq_lens_k is not None and cu_seq_lens_k is not cu_seq_lens_q:
        raise ValueError("a packed attention call attends within each row: its key bounds are its query bounds")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [S, heads, D]: varlen's layout
    attend = _varlen if packs_rows(None, q.device, _attention_dtype(q)) else _by_row
    return attend(q, k, v, cu_seq_lens_q, int(max_length_q), scaling)[None], None


def _packed_mask(*, unpacked: str, attention_mask=None, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                 **kwargs):
    """transformers' mask for a model set to `packed_attention`: none for a call with no padding and no cache (a packed
    pass, whose rows `_packed` keeps apart, or one causal row: transformers would build a dense [S, S] block mask
    from the positions that restart at each row); the model's own mask for any other call."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    if attention_mask is None and q_length == kv_length and not q_offset and not kv_offset:
        return None
    return ALL_MASK_ATTENTION_FUNCTIONS[unpacked](attention_mask=attention_mask, q_length=q_length,
                                                  kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
                                                  **kwargs)


def packed_attention(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with its attention through `_packed` and its masks through `_packed_mask`, each falling back to the
    model's own implementation (sdpa, `ablate_sdpa_linear`) for any call that is not a packed pass: the trainer's
    policy also decodes validation's prompts, padded, with a cache. Registered in transformers' attention and mask
    interfaces on first use; a model already set so is returned as it is."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    unpacked = model.config._attn_implementation
    if unpacked.startswith(PACKED):
        return model
    if unpacked not in ALL_ATTENTION_FUNCTIONS:
        raise ValueError(f"packed rows keep the model's own attention for its other calls, but {unpacked!r} is not "
                         f"in transformers' attention interface: set the model to sdpa")
    name = f"{PACKED}_over_{unpacked}"
    AttentionInterface.register(name, functools.partial(_packed, unpacked=unpacked))
    AttentionMaskInterface.register(name, functools.partial(_packed_mask, unpacked=unpacked))
    model.set_attn_implementation(name)
    return model


def packed_logprobs(model: torch.nn.Module, prompt_tokens: torch.Tensor, prompt_mask: torch.Tensor,
                    tokens: torch.Tensor, lengths: torch.Tensor, head: Callable, temperature: float = 1.0,
                    compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`completion_logprobs` (the same arguments, the same [N, T] result, 0 past each length) from one packed
    sequence: the rows' real tokens (each prompt's, then its completion's) one row after another, [1, sum of rows'
    tokens], no padding; positions restarting at 0 at each row; attention within each row (`packed_attention`, which
    `model` must be set to); the head applied to the states that predict the completions' tokens, those alone.
    Why packed, and why not through transformers' sdpa: docs/training.md#packed-rows."""
    N, P = prompt_tokens.shape
    T = tokens.shape[1]
    device = tokens.device
    steps = torch.arange(T, device=device)
    inside = steps[None, :] < lengths[:, None]  # [N, T] the completions' tokens
    real = prompt_mask.sum(dim=1)
    sizes = real + lengths  # [N] each row's tokens
    total, longest, completions, promptless = torch.stack([sizes.sum(), sizes.max(), lengths.sum(),
                                                           (real == 0).sum()]).tolist()  # the pass's one device read
    if promptless:
        raise ValueError(f"{promptless} of {N} rows have no prompt token: a row's first completion token needs a "
                         f"state before it")
    kept = torch.cat([prompt_mask.bool(), inside], dim=1)  # [N, P + T] each row's real tokens, in order
    where = kept.flatten().nonzero_static(size=total)[:, 0]
    ids = torch.cat([prompt_tokens, tokens], dim=1).flatten()[where]
    positions = (kept.cumsum(dim=1) - 1).flatten()[where]  # 0.. in each row
    bounds = torch.zeros(N + 1, dtype=torch.int32, device=device)
    bounds[1:] = sizes.cumsum(dim=0)
    # an empty 4-D mask: transformers hands a 4-D mask to the layers as it is, building none and probing the positions
    # for packed rows by none of its own (a read from the device); `_packed` takes it as no mask
    unmasked = torch.zeros(1, 1, 0, 0, dtype=torch.bool, device=device)
    with autocast(device, compute_dtype):
        hidden = model.get_decoder()(input_ids=ids[None], attention_mask=unmasked, position_ids=positions[None],
                                     use_cache=False, cu_seq_lens_q=bounds, cu_seq_lens_k=bounds,
                                     max_length_q=longest, max_length_k=longest).last_hidden_state[0]
    # the state at a row's position p predicts its token p + 1: row i's completion token t at bounds[i] + real_i - 1 + t
    chosen = inside.flatten().nonzero_static(size=completions)[:, 0]  # [M] (row, t) of each completion token, flat
    at = (bounds[:-1, None] + real[:, None] - 1 + steps[None, :]).flatten()[chosen]
    lm_head = model.get_output_embeddings()
    logp = head(hidden[at], lm_head.weight, tokens.flatten()[chosen], bias=lm_head.bias, temperature=temperature,
                operands=compute_dtype)
    return torch.zeros(N * T, dtype=logp.dtype, device=device).index_put((chosen,), logp).view(N, T)


class PackedScorer(Scorer):
    """The Scorer with its rows packed (`packed_logprobs`): the same inputs and [N, T] log-probs, no compute on
    padding. Sets the model's attention to `packed_attention` (for good: its other calls keep the model's own)."""

    def __init__(self, model: torch.nn.Module, head: Callable, temperature: float = 1.0,
                 compute_dtype: torch.dtype = torch.float32):
        super().__init__(packed_attention(model), head, temperature, compute_dtype)

    def forward(self, prompt_tokens: torch.Tensor, prompt_mask: torch.Tensor, tokens: torch.Tensor,
                lengths: torch.Tensor) -> torch.Tensor:
        return packed_logprobs(self.model, prompt_tokens, prompt_mask, tokens, lengths, self.head,
                               temperature=self.temperature, compute_dtype=self.compute_dtype)
