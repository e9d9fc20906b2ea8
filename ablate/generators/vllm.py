"""generator=vllm (GPU, the `vllm` extra): generator=hf's pipeline with vLLM decoding (ablate/generators/vllm_engine.py)
instead of our torch engine. The same rules, versions and interruption; weights pushed in place after every step
without dropping running sequences; the fp32 head through vLLM's head_dtype.

vLLM loads the model from a folder: model.path when set, else the tiny model and its tokenizer are saved under
paths.cache first. Validation samples the trainer's policy with our torch engine (exact, and kept off the vLLM
engine so that validation never interleaves with the pipeline's rows). Written against vLLM 0.32.0; see
vllm_engine.py for what has and has not run on a GPU.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from ablate.generators.hf import HFGenerator


class VLLMGenerator(HFGenerator):
    def __init__(self, gpu_memory_utilization: float = 0.5, **kwargs):
        self.gpu_memory_utilization = gpu_memory_utilization
        super().__init__(**kwargs)

    def make_engine(self, policy: torch.nn.Module, tokenizer):
        if importlib.util.find_spec("vllm") is None:
            raise ModuleNotFoundError("generator=vllm needs vLLM, which is not installed: pip install -e '.[vllm]' "
                                      "on a CUDA machine, or use generator=hf")
        from ablate.generators.vllm_engine import VLLMEngine

        cfg = self.cfg
        folder = cfg.model.path
        if not folder:  # the tiny model: vLLM reads a folder
            folder = str(Path(cfg.paths.cache) / f"vllm-model-{id(policy)}")
            policy.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        return VLLMEngine(folder, self.limits, seed=cfg.seed, gpu_memory_utilization=self.gpu_memory_utilization,
                          dtype=cfg.model.dtype, **self.engine_args)
