"""generator=hf: our own sampling engine (ablate/generators/engine.py) on a copy of the policy, driven by the
pipeline (ablate/generators/pipeline.py), on CPU or one GPU. Validation samples the trainer's current policy.

Compute: every device the job holds is busy for the whole wall-clock time of the run (the generator and the
trainer share them), so each step adds devices x its wall-clock seconds: all visible GPUs of every node of the job,
or 1 a node for the CPU (ablate/parallel.py: devices_held). With train.reference_tflops set, a step adds the
device-hours its FLOPs take at that throughput on the layout train.reference_layout names instead
(ablate/compute.py): on a shared machine wall time measures the neighbours as much as the run, and FLOPs are the
same on every run of the same tokens.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ablate import parallel
from ablate.compute import ReferenceClock, StepFlops
from ablate.generators.engine import Engine, Limits, decode
from ablate.generators.pipeline import Pipeline
from ablate.generators.remote import RemoteEngine
from ablate.policy import compute_dtype
from ablate.registry import build
from ablate.tasks.base import THINK_END


def limits_for(cfg: DictConfig, tokenizer, length_control) -> Limits:
    think_end = tokenizer.convert_tokens_to_ids(THINK_END)
    phrase = length_control.phrase
    return Limits(
        max_think_tokens=int(cfg.generation.max_think_tokens), max_answer_tokens=int(cfg.generation.max_answer_tokens),
        stop_ids=(tokenizer.eos_token_id,),
        think_end_id=think_end if think_end != tokenizer.unk_token_id else None,
        phrase_ids=tuple(tokenizer.encode(phrase, add_special_tokens=False)) if phrase else ())


def head_dtype(cfg: DictConfig) -> torch.dtype:
    """The precision option's head dtype when it applies to the generator side, else the model's dtype."""
    return getattr(torch, cfg.precision.head_dtype if cfg.precision.generator_side else cfg.model.dtype)


class HFGenerator(Pipeline):
    engine_process = True  # its engine can run in a process of its own (run.generator_gpus=1: generators/remote.py)

    def __init__(self, max_waves: int, concurrent: bool, val_wave_rows: int, *, cfg: DictConfig, task, sampler,
                 policy: torch.nn.Module | parallel.Weights, **_: object):
        self.cfg = cfg
        length_control = build(cfg.length_control)
        self.limits = limits_for(cfg, task.tokenizer, length_control)
        self.engine_args = {"head_dtype": head_dtype(cfg), "compute_dtype": compute_dtype(cfg.model),
                            "temperature": float(cfg.generation.temperature), "pad_id": task.tokenizer.pad_token_id}
        engine = self.make_engine(policy, task.tokenizer)
        super().__init__(engine, task, sampler, build(cfg.off_policy), length_control,
                         prompts_per_step=int(cfg.batch.prompts_per_step),
                         samples_per_prompt=int(cfg.batch.samples_per_prompt), max_waves=max_waves,
                         max_think_tokens=int(cfg.generation.max_think_tokens), concurrent=concurrent, seed=cfg.seed)
        self.val_wave_rows = val_wave_rows
        self.devices = parallel.devices_held(engine.device)
        self.clock = None
        if cfg.train.reference_tflops:
            layout = cfg.train.reference_layout
            self.clock = ReferenceClock(float(cfg.train.reference_tflops), None if layout is None else list(layout),
                                        self.off_policy)

    def make_engine(self, policy: torch.nn.Module | parallel.Weights, tokenizer) -> Engine | RemoteEngine:
        """The engine that decodes the pipeline's rows: ours, on its own copy of the policy in the compute dtype; in
        this process, or (run.generator_gpus=N) in the engine processes the job started, streamed the weights."""
        weights = parallel.weights_of(policy)
        if self.engines_apart:
            return self.remote_engine(weights)
        model = copy.deepcopy(weights.module()).to(self.engine_args["compute_dtype"]).eval()
        return Engine(model, self.limits, seed=self.cfg.seed, **self.engine_args)

    @property
    def engines_apart(self) -> bool:
        """The engines decode in processes of their own (run.generator_gpus > 0)."""
        return int(self.cfg.run.get("generator_gpus", 0)) > 0

    def remote_engine(self, weights: parallel.Weights, **how) -> RemoteEngine:
        """Rank 0's handle on the engine processes, streamed `weights`; `how`: RemoteEngine's build and
        tensor_parallel (default: our engine, one process each)."""
        model = OmegaConf.to_container(self.cfg.model, resolve=True)
        return RemoteEngine(model, self.limits, weights, seed=self.cfg.seed, **how, **self.engine_args)

    def describe(self) -> dict:
        """Logged with the run's parameters: the devices it holds, and the weights one decoding device holds (the
        whole model's, or a tensor-parallel rank's share)."""
        return {"generator.devices": self.devices, "generator.params_per_gpu": self.engine.params}

    def validate(self, compute: float, *, policy: torch.nn.Module | parallel.Weights, step: int) -> float:
        """mean@k pass rate over the validation split: k = task.val_samples samples per prompt, sampled from the
        trainer's current policy with the run's generation settings (seeded by the step: reproducible). Engines in
        processes of their own sample it there, from the weights just published to them (their staging copy, in
        their dtype, or what vLLM decodes with when it received them itself; the rows dealt across them); otherwise
        this process samples the policy itself."""
        task, k = self.task, int(self.cfg.task.val_samples)
        seed = self.cfg.seed * 1_000_003 + step
        rng = np.random.default_rng([self.cfg.seed, step, 11])
        rows = [row for index in range(task.size("val")) for row in self._rows("val", index, 0, k, rng)]
        if self.engine.stages:
            self.engine.decode_staged(rows, seed, self.max_waves, self.val_wave_rows)
        else:
            module = parallel.weights_of(policy).module()
            was_training = module.training
            module.eval()
            decode(Engine(module, self.limits, seed=seed, **self.engine_args), rows, self.max_waves,
                   self.val_wave_rows)
            module.train(was_training)
        return float(np.mean([self._passed("val", r) for r in rows]))

    def step_gpu_hours(self, rollouts, wall_seconds: float, flops: StepFlops, step: int) -> float:
        """Device-hours of a step: what its FLOPs take on the reference layout when train.reference_tflops is set
        (reproducible, whatever else the machine runs), else every device held for its wall-clock time."""
        if self.clock is None:
            return self.devices * wall_seconds / 3600.0
        return self.clock.step(step, flops)

    def perf(self) -> dict:
        perf = super().perf()
        if self.clock is not None and self.clock.layout is not None:  # the reference layout's generator idle share
            perf["compute/generator_idle_frac"] = self.clock.generator_idle_frac()
        return perf

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.clock is not None:
            state["clock"] = self.clock.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.clock is not None and "clock" in state:
            self.clock.load_state_dict(state["clock"])
