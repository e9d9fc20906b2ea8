"""The generator of every option that decodes with an engine: the pipeline (pipeline.py) driving the engine its
option makes (generator=hf: ours in torch; generator=vllm: vLLM's), in this process or in engine processes of
their own (remote.py), plus validation and the run's compute clock (ablate/compute.py).

An option is this class given its engine maker: `make_engine(generator, weights) -> Engine`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ablate.distributed.layouts import Weights, weights_of
from ablate.distributed.topology import devices_held
from ablate.compute import clock_for
from ablate.generators.base import Capabilities, Engine, Generator
from ablate.generators.engine import Engine as TorchEngine
from ablate.generators.engine import Limits, decode
from ablate.generators.pipeline import Pipeline
from ablate.generators.remote import RemoteEngine
from ablate.policy import compute_dtype, stop_token_ids, weights_in
from ablate.registry import build
from ablate.rollouts import Rollouts
from ablate.tasks.base import THINK_END


def limits_for(cfg: DictConfig, tokenizer, length_control) -> Limits:
    """The length rules for this tokenizer: `</think>` one token where it has one, else text matched in each row."""
    think_end = tokenizer.convert_tokens_to_ids(THINK_END)
    one_token = think_end is not None and think_end != tokenizer.unk_token_id
    phrase = length_control.phrase
    return Limits(
        max_think_tokens=int(cfg.generation.max_think_tokens), max_answer_tokens=int(cfg.generation.max_answer_tokens),
        stop_ids=stop_token_ids(cfg.model, cfg.generation, tokenizer),
        think_end_id=think_end if one_token else None,
        phrase_ids=tuple(tokenizer.encode(phrase, add_special_tokens=False)) if phrase else (),
        token_texts=None if one_token else tuple(tokenizer.batch_decode([[i] for i in range(len(tokenizer))])))


def head_dtype(cfg: DictConfig) -> torch.dtype:
    """The precision option's head dtype when it applies to the generator side, else the model's dtype."""
    return getattr(torch, cfg.precision.head_dtype if cfg.precision.generator_side else cfg.model.dtype)


class PipelineGenerator(Generator):
    """Rollouts from an engine the pipeline drives by the off-policy rules; validation on the trainer's policy."""

    capabilities = Capabilities(samples_policy=True, engine_processes=True)

    def __init__(self, make_engine: Callable[[PipelineGenerator, Weights], Engine], max_waves: int,
                 concurrent: bool, val_wave_rows: int, *, cfg: DictConfig, task, sampler,
                 policy: torch.nn.Module | Weights, **_: object):
        self.cfg, self.task = cfg, task
        self.max_waves, self.val_wave_rows = max_waves, val_wave_rows
        length_control = build(cfg.length_control)
        self.limits = limits_for(cfg, task.tokenizer, length_control)
        self.engine_args = {"head_dtype": head_dtype(cfg), "compute_dtype": compute_dtype(cfg.model),
                            "temperature": float(cfg.generation.temperature), "pad_id": task.tokenizer.pad_token_id}
        self.engines_apart = int(cfg.run.get("generator_gpus", 0)) > 0  # engine processes of their own
        engine = make_engine(self, weights_of(policy))
        off_policy = build(cfg.off_policy)
        self.pipeline = Pipeline(engine, task, sampler, off_policy, length_control,
                                 prompts_per_step=int(cfg.batch.prompts_per_step),
                                 samples_per_prompt=int(cfg.batch.samples_per_prompt), max_waves=max_waves,
                                 max_think_tokens=int(cfg.generation.max_think_tokens), concurrent=concurrent,
                                 seed=cfg.seed, reward=(float(cfg.task.reward_correct), float(cfg.task.reward_wrong)))
        self.engine = engine
        self.clock = clock_for(cfg.train, devices_held(engine.device), off_policy)

    @classmethod
    def engine_memory(cls, cfg: DictConfig, shape, gpu_bytes: float, *, processes: int,
                      row_tokens: int) -> dict[str, float]:
        """Our torch engine: its copy of the weights (and the staging copy, in a process of its own) and the KV
        cache of every row its waves may hold at once, at their longest (`row_tokens`)."""
        from ablate.memory import torch_engine

        rows = int(cfg.generator.max_waves) * int(cfg.batch.prompts_per_step) * int(cfg.batch.samples_per_prompt)
        return {**torch_engine(shape, compute=compute_dtype(cfg.model).itemsize,
                               copies=2 if processes else 1, rows=rows / max(processes, 1),
                               row_tokens=row_tokens),
                **cls.validation_memory(cfg, shape, engines=processes, row_tokens=row_tokens)}

    @staticmethod
    def validation_memory(cfg: DictConfig, shape, *, engines: int, row_tokens: int) -> dict[str, float]:
        """Validation decoded by our torch engine (on the policy, or on an engine process's staging copy), beside
        the generator's own rows: the KV cache of the validation rows it holds at once (at most max_waves waves of
        val_wave_rows; an engine's share of them), at their longest (`row_tokens`)."""
        from ablate.memory import kv_bytes_per_token

        g = cfg.generator
        share = -(-int(cfg.task.n_val_prompts) * int(cfg.task.val_samples) // max(engines, 1))
        at_once = min(share, int(g.max_waves) * int(g.val_wave_rows))
        return {"validation's KV cache (our engine; generator.val_wave_rows)":
                at_once * row_tokens * kv_bytes_per_token(shape, compute_dtype(cfg.model).itemsize)}

    # ------------------------------------------------------------------------------------------------- engines
    def local_engine(self, weights: Weights) -> TorchEngine:
        """Our torch engine in this process, on its own copy of the policy in the compute dtype."""
        model = weights_in(copy.deepcopy(weights.module()), self.engine_args["compute_dtype"]).eval()
        return TorchEngine(model, self.limits, seed=self.cfg.seed, **self.engine_args)

    def remote_engine(self, weights: Weights, **how) -> RemoteEngine:
        """Rank 0's handle on the engine processes, streamed `weights`; `how`: RemoteEngine's build and
        tensor_parallel (default: our engine, one process each)."""
        model = OmegaConf.to_container(self.cfg.model, resolve=True)
        return RemoteEngine(model, self.limits, weights, groups=weights.ranks.groups, seed=self.cfg.seed, **how,
                            **self.engine_args)

    # ------------------------------------------------------------------------------------------------ contract
    def batch(self, step: int, compute: float = 0.0, stop: Callable[[], bool] | None = None) -> Rollouts:
        return self.pipeline.batch(step, compute, stop)

    def publish(self, policy, version: int) -> None:
        self.pipeline.publish(policy, version)

    def reset_weights(self, policy, version: int) -> None:
        self.pipeline.reset_weights(policy, version)

    def perf(self) -> dict:
        return self.pipeline.perf()

    def state_dict(self) -> dict:
        return self.pipeline.state_dict()

    def paused(self):
        return self.pipeline.paused()

    def load_state_dict(self, state: dict) -> None:
        self.pipeline.load_state_dict(state)

    def close(self) -> None:
        self.pipeline.close()

    def describe(self) -> dict:
        """The devices the job holds, and the weights one decoding device holds (the whole model's, or a
        tensor-parallel rank's share)."""
        return {"generator.devices": devices_held(self.engine.device),
                "generator.params_per_gpu": self.engine.params}

    def validate(self, compute: float, *, policy: torch.nn.Module | Weights, step: int) -> float:
        """mean@k pass rate over the validation split: k = task.val_samples samples per prompt, sampled from the
        trainer's current policy with the run's generation settings (seeded by the step: reproducible). Engines in
        processes of their own sample it there, from the weights just published to them (on vLLM itself where it
        holds them or may take them now: docs/distributed.md#validation); otherwise this process samples the policy
        itself."""
        task, k = self.task, int(self.cfg.task.val_samples)
        seed = self.cfg.seed * 1_000_003 + step
        rng = np.random.default_rng([self.cfg.seed, step, 11])
        pipeline = self.pipeline
        rows = [row for index in range(task.size("val")) for row in pipeline.rows("val", index, 0, k, rng)]
        if self.engine.stages:
            on_engine = pipeline.settle() == step  # the engines hold this step's weights
            self.validated_on = self.engine.decode_staged(rows, seed, self.max_waves, self.val_wave_rows,
                                                          on_engine=on_engine)
        elif self._decoded_on_engine(rows, seed, step):
            self.validated_on = "engine"
        else:  # the policy itself, with our torch engine
            self.validated_on = "policy"
            module = weights_of(policy).module()
            was_training = module.training
            module.eval()
            decode(TorchEngine(module, self.limits, seed=seed, **self.engine_args), rows, self.max_waves,
                   self.val_wave_rows)
            module.train(was_training)
        return float(np.mean([pipeline.passed("val", r) for r in rows]))

    def _decoded_on_engine(self, rows: list, seed: int, step: int) -> bool:
        """Validation on the engine in this process when it decodes apart (vLLM), the generator thread held
        meanwhile, and it holds this step's weights or may take them now; False (nothing decoded) otherwise."""
        if not hasattr(self.engine, "decode_apart"):
            return False
        with self.pipeline.paused():
            if self.pipeline.settle() != step:
                return False
            self.engine.decode_apart(rows, seed, self.val_wave_rows)
        return True
