"""The vLLM sampling engine: the interface of our torch engine (ablate/generators/engine.py: `start`, `step`, `load`,
`running`, `version`, `decode_steps`), decoded by vLLM's own `LLMEngine` with continuous batching.

Written against vLLM 0.32.0 (the project's `vllm` extra), read from the source of its wheel; the paths cited below
are inside the `vllm` package of that version. NOTHING HERE HAS RUN ON A GPU YET: the module imports and lints
without vLLM, but every vLLM call is unverified until tests/test_vllm.py passes on a CUDA machine.

How it works
- One vLLM request per row (n=1), its prompt the row's token ids (`vllm.inputs.tokens_input`), outputs as deltas
  (`RequestOutputKind.DELTA`), with the sampled token's log-prob (`logprobs=0`). `step()` is one
  `LLMEngine.step()`: one token for every running request (continuous batching), and each token goes through the
  torch engine's own rule code (`engine.append_token`): stop ids, `</think>`, the interruption budget, truncation.
- The engine runs IN THIS PROCESS: `VLLM_ENABLE_V1_MULTIPROCESSING=0` (vllm/envs.py; read by
  `LLMEngine.from_engine_args`, vllm/v1/engine/llm_engine.py) gives an `InprocClient` around an `EngineCore` whose
  `UniProcExecutor` holds the model (vllm/v1/engine/core_client.py, vllm/v1/executor/uniproc_executor.py). Async
  scheduling is switched off (`async_scheduling=False`, vllm/config/vllm.py turns it on by default), so a
  `step()` schedules, runs and samples one batch and returns its tokens (`EngineCore.step`,
  vllm/v1/engine/core.py): no forward pass is in flight between two steps, which is where `load` runs.
- `load` writes the new weights in place into the running model with the model's own `load_weights(iterable of
  (name, tensor))` (HF names: q/k/v and gate/up are fused by vLLM's loader), reached by `LLMEngine.apply_model`
  -> `collective_rpc("apply_model")` -> `WorkerBase.apply_model(fn)` = `fn(worker.get_model())`
  (vllm/v1/worker/worker_base.py): the pattern of TRL's colocate mode (`...driver_worker.model_runner.model
  .load_weights`). Parameters keep their storage, so compiled graphs and CUDA graphs stay valid. Running requests
  are not touched: they keep their KV cache (computed with the old weights, as in PipelineRL) and go on with the
  new weights. For an unquantized model on CUDA nothing needs re-processing after the copy
  (`UnquantizedLinearMethod.process_weights_after_loading` is a no-op on CUDA, vllm/model_executor/layers/linear.py);
  a quantized model would need `collective_rpc("reload_weights", ...)` (layerwise reload,
  vllm/model_executor/model_loader/reload/inplace.py) instead.
- Prefix cache after a load: `LLMEngine.reset_prefix_cache()` exists but refuses while any request holds KV blocks
  (`BlockPool.reset_prefix_cache`, vllm/v1/core/block_pool.py), i.e. exactly when a load happens mid-generation;
  `reset_running_requests=True` would preempt and recompute every running row. So each request carries a
  `cache_salt` that changes at every load: the salt enters the hash of a prompt's first block and so of every block
  after it (`generate_block_hash_extra_keys`, vllm/v1/core/kv_cache_utils.py), and a request started after a load
  can never hit a block computed before it. A row re-added after its interruption keeps the salt it started with:
  it reuses its own blocks, as a running row keeps its cache. When nothing is running, the cache is also reset.
- FP32 LM head: vLLM 0.32 has a switch after all, `hf_overrides={"head_dtype": "float32"}`
  (`ModelConfig.head_dtype`, vllm/config/model.py): `LogitsProcessor._apply_head`
  (vllm/model_executor/layers/logits_processor.py) then computes the logits as `torch.mm(h, W.T,
  out_dtype=float32)` on CUDA (bf16 operands, fp32 accumulation and output) instead of a bf16 matmul. No patch is
  needed; the constructor checks that the loaded model's logits processor took it.
- The recorded log-prob is that of the distribution the token was sampled from (temperature applied), like the
  torch engine's: `logprobs_mode="processed_logprobs"` (`ModelConfig.logprobs_mode`; the sampler takes it after
  temperature, vllm/v1/worker/gpu/sample/sampler.py). The default, raw_logprobs, is before temperature.
- Interruption: when a row still thinking reaches its budget, its request is aborted, the phrase is appended at
  once (forced: sampled False, log-prob 0, the current version), and a new request continues from prompt + tokens
  so far with max_tokens = max_answer_tokens (its prefix blocks come from the prefix cache; with an empty phrase
  the request is replaced all the same, for its new cap). The torch engine forces one phrase token per decode
  step; here they all go in at the step the budget is reached. Everything else a row records is the same.
- Stop ids go to vLLM as `stop_token_ids` with `ignore_eos=True`, so it stops on exactly `limits.stop_ids`
  (`check_stop`, vllm/v1/core/sched/utils.py) and not on the model's own eos or generation_config
  (`generation_config="vllm"`). No tokenizer is loaded (`skip_tokenizer_init`, `detokenize=False`): token ids in,
  token ids out.
- Also there for the pipeline driver, as on the torch engine: `limits`, `waves` (the rows of each `start` call
  until all have ended), `rng`, `device`; and `close()` shuts the engine core down.
- Randomness: each request gets a seed from this engine's `rng` (a torch.Generator: `get_state`/`set_state`
  like the torch engine's), so vLLM's sampler does not draw it from the process's numpy RNG
  (vllm/v1/worker/gpu/sample/states.py). vLLM seeds the process's global RNGs while it starts in-process
  (vllm/engine/arg_utils.py warns about it): they are restored after construction.

Verified (CPU, without vLLM): the row bookkeeping, against a stand-in for `LLMEngine` (a scratch check, not in the
repo): over random limits, budgets, phrases, loads and waves, every row's tokens, sampled flags, done, truncated,
interrupted and answer count equal the torch engine's rules replayed on the same sampled tokens, each row ends
once, and no request is left behind.
Not verified (no GPU run yet): everything that touches vLLM: the API calls and arguments above were read from the
0.32.0 source, never run; that the in-place load reaches every parameter of the default (V2) model runner's model
under torch.compile and CUDA graphs (it should: same storage); that vLLM in-process sits well beside the trainer
on one GPU; the head_dim 16 of the test's tiny Llama on the attention backend vLLM picks; the tests' tolerances;
speed.
"""

from __future__ import annotations

import os
import random
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ablate.generators.engine import Limits, Sequence, append_token

VLLM_VERSION = "0.32.0"


@dataclass
class _Live:
    """A row in flight, and the cache salt its requests use."""

    row: Sequence
    salt: str


class VLLMEngine:
    """Same interface and row semantics as `Engine`, decoded by an in-process vLLM `LLMEngine`."""

    def __init__(self, model_path: str, limits: Limits, *, head_dtype: torch.dtype, temperature: float, pad_id: int,
                 seed: int, version: int = 0, gpu_memory_utilization: float = 0.5,
                 max_model_len: int | None = None, dtype: str = "bfloat16"):
        self.limits, self.head_dtype, self.temperature, self.pad_id = limits, head_dtype, temperature, pad_id
        self.version = version
        self.decode_steps = 0
        self.device = torch.device("cuda")
        self.rng = torch.Generator()  # seeds of the requests
        self.rng.manual_seed(seed)
        self.waves: list[list[Sequence]] = []  # the rows of each start() call, until all have ended
        self._live: dict[str, _Live] = {}  # request id -> row
        self._ended: list[Sequence] = []  # rows that ended outside step() (no room left under max_model_len)
        self._requests = 0
        self._loads = 0  # the cache salt's generation: +1 at every load
        self._llm = self._make_engine(model_path, seed, gpu_memory_utilization, max_model_len, dtype)
        self._max_model_len = int(self._llm.model_config.max_model_len)
        self._check_head()

    # ------------------------------------------------------------------------------------------ construction
    def _make_engine(self, model_path: str, seed: int, gpu_memory_utilization: float,
                     max_model_len: int | None, dtype: str):
        import vllm
        from vllm.engine.arg_utils import EngineArgs
        from vllm.engine.llm_engine import LLMEngine

        if vllm.__version__ != VLLM_VERSION:
            warnings.warn(f"VLLMEngine was written against vllm {VLLM_VERSION}, this is {vllm.__version__}",
                          stacklevel=3)
        # In-process engine core (vllm/envs.py, read lazily until the engine core caches the variables):
        # `load` needs the model in this process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        args = EngineArgs(
            model=model_path, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len, enable_prefix_caching=True, async_scheduling=False,
            logprobs_mode="processed_logprobs", hf_overrides={"head_dtype": str(self.head_dtype).removeprefix("torch.")},
            generation_config="vllm", skip_tokenizer_init=True, disable_log_stats=True,
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
        """New weights between two steps; running requests keep their KV cache and go on with them."""
        from vllm.config import set_current_vllm_config

        config = self._llm.vllm_config

        def load_weights(model: torch.nn.Module) -> set[str]:
            with set_current_vllm_config(config):
                loaded = model.load_weights(iter(state.items()))
            torch.cuda.synchronize()
            # The check vLLM's own loader makes (vllm/model_executor/model_loader/default_loader.py): every
            # parameter got a weight; a model whose loader reports no names (None) cannot be checked.
            return set() if loaded is None else {name for name, _ in model.named_parameters()} - set(loaded)

        missing = self._llm.apply_model(load_weights)[0]
        if missing:
            raise RuntimeError(f"load: {len(missing)} vLLM parameters got no weight, e.g. {sorted(missing)[:5]}")
        self.version = version
        self._loads += 1  # new requests hash their blocks apart from everything computed so far
        self._llm.set_weight_version(str(version))
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
                if row.done or not self._add(row, live.salt):
                    ended.append(row)
            elif out.finished:  # vLLM's own end (max_model_len), not one of the rules
                row.done = row.truncated = True
                self._drop(out.request_id, aborted=False)
                ended.append(row)
        self.waves = [w for w in self.waves if not all(r.done for r in w)]
        self.decode_steps += 1
        return ended

    # ---------------------------------------------------------------------------------------------- helpers
    def _append(self, row: Sequence, token: int, logprob: float, sampled: bool) -> None:
        append_token(row, self.limits, self.version, token, logprob, sampled)  # the torch engine's rules, shared

    def _add(self, row: Sequence, salt: str) -> bool:
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
            seed=int(torch.randint(0, 2**62, (1,), generator=self.rng)),
        )
        request_id = f"row-{self._requests}"
        self._requests += 1
        self._llm.add_request(request_id, tokens_input(prompt, cache_salt=salt), params)
        self._live[request_id] = _Live(row, salt)
        return True

    def _drop(self, request_id: str, *, aborted: bool) -> None:
        del self._live[request_id]
        if aborted:
            self._llm.abort_request([request_id])
