"""generator=hf: the pipeline generator (pipelined.py) decoding with our own torch engine (engine.py) on a copy of
the policy, on CPU or one GPU, or in engine processes of their own (run.generator_gpus > 0; remote.py)."""

from __future__ import annotations

from ablate.distributed.layouts import Weights
from ablate.generators.base import Engine
from ablate.generators.pipelined import PipelineGenerator


def torch_engine(generator: PipelineGenerator, weights: Weights) -> Engine:
    """Our engine: here on its own copy of the policy, or one in each engine process, streamed the weights."""
    return generator.remote_engine(weights) if generator.engines_apart else generator.local_engine(weights)


class HFGenerator(PipelineGenerator):
    """The pipeline generator given our torch engine."""

    def __init__(self, max_waves: int, concurrent: bool, val_wave_rows: int, **context: object):
        super().__init__(torch_engine, max_waves, concurrent, val_wave_rows, **context)
