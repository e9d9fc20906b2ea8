"""Runs that other trainers logged to MLflow, made for the tests of `python -m analysis report --experiment`.

`make_trl_experiment` runs TRL's real `GRPOTrainer` (the tiny random Llama and ablate's tokenizer, on the CPU, one
thread) with `report_to="mlflow"`: transformers' MLflowCallback writes the runs, named as a TRL user names them, into
a real MLflow store; the eval reward rises over each run. `make_verl_experiment` writes, with the MLflow client, runs
with the names, steps and sanitization of verl's MLflow logger, whose curves follow a known sigmoid law per variant:
no verl run is possible here (verl needs Ray and a GPU), so those runs carry verl's names only. What each trainer logs:
docs/bring-your-own-runs.md.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

# Digits are 10 of the tokenizer's 186 ids: a random model samples one in ~5% of its tokens, so every GRPO group has
# some reward spread from the first step, and the fraction rises towards 1 as the policy learns to write digits.
DIGITS = "0123456789"


@dataclass(frozen=True)
class ForeignRun:
    """One run a helper wrote: its MLflow run name, its variant and seed, and the seconds it took to train (0 for
    runs written without training)."""

    name: str
    variant: str
    seed: int
    seconds: float


@contextlib.contextmanager
def _mlflow_env(tracking_uri: str, experiment: str) -> Iterator[None]:
    """MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME set as a TRL user sets them (transformers' MLflowCallback reads
    them when training starts); the environment, mlflow's process-wide tracking URI and torch's threads restored
    afterwards. A URI set in this process with mlflow.set_tracking_uri would win over the variable, so it is set to
    the same store for the duration."""
    import mlflow
    import torch

    if mlflow.active_run() is not None:
        raise RuntimeError(f"an MLflow run is active in this process ({mlflow.active_run().info.run_id}): "
                           "the MLflowCallback would log into it instead of starting its own runs")
    saved_env, saved_threads, saved_uri = dict(os.environ), torch.get_num_threads(), mlflow.get_tracking_uri()
    os.environ.update(MLFLOW_TRACKING_URI=tracking_uri, MLFLOW_EXPERIMENT_NAME=experiment)
    set_before = mlflow.get_tracking_uri() != tracking_uri  # mlflow.set_tracking_uri's URI wins over the variable
    if set_before:
        mlflow.set_tracking_uri(tracking_uri)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved_threads)
        if set_before:
            mlflow.set_tracking_uri(saved_uri)
        for key in set(os.environ) - set(saved_env):  # MLflow's set_experiment adds MLFLOW_EXPERIMENT_ID
            del os.environ[key]
        os.environ.update({key: value for key, value in saved_env.items() if os.environ.get(key) != value})


CEILING = 0.8  # the most a completion earns: a ceiling below 1, as a task whose hardest problems stay unsolved (an
# eval reward that climbs to 1 leaves the fitted A at its bound, and every verdict on A or compute open)


def digit_fraction(completion_ids: list[list[int]], *, digit_ids: set[int], length: int) -> list[float]:
    """The reward: the digits among a completion's tokens, over the longest completion allowed (a completion that
    stops early earns no more than its digits), times CEILING."""
    return [CEILING * sum(t in digit_ids for t in ids) / length for ids in completion_ids]


def make_trl_experiment(tracking_uri: str, experiment: str, workdir: Path, *,
                        variants: dict[str, dict[str, Any]] | None = None, seeds: tuple[int, ...] = (1, 2),
                        steps: int = 30, eval_every: int = 1) -> list[ForeignRun]:
    """TRL's GRPOTrainer, one run per variant and seed, logged to MLflow by transformers' MLflowCallback.

    variants: run-name prefix -> the GRPOConfig fields that make that variant (default: two learning rates); a run
    is named "<prefix>-seed<seed>" (`run_name=`). Each run trains `steps` optimizer steps of 2 prompts x 4
    completions of at most 8 tokens, rewarded by `digit_fraction`, and evaluates 4 held-out prompts x 4 completions
    at step 0 (`eval_on_start`) and every `eval_every` steps. Returns the runs in the order they ran.

    Measured with the defaults (2-core machine, one thread): eval_reward rises from 0.02-0.05 at step 0 to 0.78-0.8
    (CEILING) by step 30 in an S, its middle near step 7 at lr 2e-2 and near step 12 at lr 1e-2 (the report: lr-2e-2
    needs 0.59x lr-1e-2's steps); the 4 runs take 34 s, imports included (the first run ~14 s, the others ~6-7 s).
    """
    import datasets
    import trl
    from omegaconf import OmegaConf
    from transformers import PrinterCallback

    from ablate.policy import build_policy
    from ablate.tasks.tokenizer import build_tokenizer

    variants = {"lr-1e-2": {"learning_rate": 1e-2}, "lr-2e-2": {"learning_rate": 2e-2}} if variants is None \
        else variants
    tokenizer = build_tokenizer()
    digit_ids = set(tokenizer.convert_tokens_to_ids(list(DIGITS)))
    length, generations = 8, 4

    def digits(completions, completion_ids, **_):
        return digit_fraction(completion_ids, digit_ids=digit_ids, length=length)

    words = ["reverse", "sort", "sum", "Let me", "time is up", "final answer", "now", "Okay"]
    train = datasets.Dataset.from_dict({"prompt": [f"{w} {c}" for w in words for c in "abcd"]})
    held_out = datasets.Dataset.from_dict({"prompt": ["sum x", "sort y", "reverse z", "Okay w"]})
    made = []
    with _mlflow_env(tracking_uri, experiment):
        for variant, fields in variants.items():
            for seed in seeds:
                started = time.perf_counter()
                model = build_policy(OmegaConf.create({"path": None, "vocab_size": len(tokenizer), "hidden_size": 64,
                                                       "num_layers": 2, "num_heads": 4, "dtype": "float32"}),
                                     seed=seed)
                for conf in (model.config, model.generation_config):  # as bench/trl_grpo.py: the tokenizer's ids
                    conf.pad_token_id, conf.bos_token_id, conf.eos_token_id = (
                        tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)
                name = f"{variant}-seed{seed}"
                args = trl.GRPOConfig(**{
                    **dict(output_dir=str(workdir / name), run_name=name, report_to="mlflow", seed=seed,
                           use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, use_vllm=False,
                           per_device_train_batch_size=2 * generations, per_device_eval_batch_size=4 * generations,
                           gradient_accumulation_steps=1, num_generations=generations,
                           max_completion_length=length, temperature=1.0, top_p=1.0, top_k=0, beta=0.0,
                           lr_scheduler_type="constant", warmup_steps=0, max_steps=steps, logging_steps=1,
                           eval_strategy="steps", eval_steps=eval_every, eval_on_start=True, save_strategy="no",
                           disable_tqdm=True, dataloader_num_workers=0),
                    **fields})
                trainer = trl.GRPOTrainer(model=model, reward_funcs=digits, args=args, train_dataset=train,
                                          eval_dataset=held_out, processing_class=tokenizer)
                trainer.remove_callback(PrinterCallback)  # disable_tqdm=True would print every step's logs
                trainer.train()
                made.append(ForeignRun(name=name, variant=variant, seed=seed,
                                       seconds=time.perf_counter() - started))
    return made


# ------------------------------------------------------------------------------------------------- verl's names

# verl's MLflow logger (verl/utils/tracking.py, _MlflowLoggingAdapter.log, at volcengine/verl@b178a3cd56f5): each key
# has "@" replaced by "_at_", runs of slashes collapsed to one, then every character outside [/\w.\- :] replaced by
# "_", before mlflow.log_metrics(metrics, step=step).
_VERL_INVALID = re.compile(r"[^/\w.\- :]")


def verl_metric_key(key: str) -> str:
    """The name verl's MLflow logger gives a metric key: "val-core/openai/gsm8k/reward/mean@4" ->
    "val-core/openai/gsm8k/reward/mean_at_4"."""
    return _VERL_INVALID.sub("_", re.sub(r"/+", "/", key.replace("@", "_at_")))


@dataclass(frozen=True)
class VerlVariant:
    """A variant of verl runs: the law its validation reward follows, in GPU-hours (n_gpus x the seconds of its steps
    / 3600), the seconds a step takes (timing_s/step, validation included), and the config it sets, as verl logs
    params (flattened with "/": {"actor_rollout_ref/actor/optim/lr": 1e-6})."""

    law: Any  # analysis.synthetic.Truth
    seconds_per_step: float = 90.0
    config: dict = field(default_factory=dict)


def _verl_val_metrics(rng, rate: float, *, data_source: str, n: int, prompts: int) -> dict[str, float]:
    """The validation metrics verl's _val_metrics_update makes for one data source whose reward is `rate` (binomial
    over prompts x n answers): mean@n, std@n, best@k / worst@k (k = 2, 4, ... up to n) as val-core or val-aux."""
    mean = float(rng.binomial(prompts * n, rate) / (prompts * n))
    out = {f"val-core/{data_source}/reward/mean@{n}": mean}
    if n > 1:
        out[f"val-aux/{data_source}/reward/std@{n}"] = math.sqrt(mean * (1 - mean))
        ks, k = [], 2
        while k < n:
            ks.append(k)
            k *= 2
        for k in [*ks, n]:
            section = "val-core" if k == n else "val-aux"
            out[f"{section}/{data_source}/reward/best@{k}/mean"] = 1 - (1 - mean) ** k
            out[f"{section}/{data_source}/reward/best@{k}/std"] = 0.01
            out[f"val-aux/{data_source}/reward/worst@{k}/mean"] = mean ** k
            out[f"val-aux/{data_source}/reward/worst@{k}/std"] = 0.01
    return out


def make_verl_experiment(tracking_uri: str, experiment: str, *, variants: dict[str, Any],
                         seeds: tuple[int, ...] = (1, 2), steps: int = 60, test_freq: int = 5, n_gpus: int = 8,
                         data_source: str = "openai/gsm8k",
                         val_n: int = 4, val_prompts: int = 1319, noise_seed: int = 0,
                         status: str = "FINISHED") -> list[ForeignRun]:
    """MLflow runs as verl's MLflow logger writes them (`trainer.logger=[console,mlflow]`), one per variant and seed,
    written here with the MLflow client: NO verl run is possible here (verl needs Ray and GPUs); these runs carry
    verl's metric names, steps, params and sanitization only, and a validation reward that follows a known law.

    `experiment` is verl's trainer.project_name (the MLflow experiment); a run is named "<variant>-seed<seed>", its
    trainer.experiment_name (the MLflow run name). variants: name -> VerlVariant, or the law alone (an
    analysis.synthetic.Truth, or its parameters as a dict {A, B, C_mid, R0}). As verl's RayPPOTrainer.fit logs:
    step 0 holds the validation before training alone (val_before_train); steps 1..`steps` hold the training
    metrics (training/global_step, timing_s/step, perf/..., critic/score/mean, ...), with the validation metrics in
    the same call at every `test_freq`-th step and at the last. The validation reward, val-core/<data_source>/reward/
    mean@<val_n> (logged as ..._at_<val_n>), is the law at C = n_gpus x step x seconds_per_step / 3600 GPU-hours plus
    a slow wobble (analysis.synthetic.wobble), drawn binomially over val_prompts x val_n answers. One timestamp per
    log call, as mlflow.log_metrics gives: step s at the run's start + s x seconds_per_step, so wall time x n_gpus is
    the same compute. verl never ends its MLflow run itself; MLflow's exit handler ends it FINISHED when verl's
    process exits normally (a killed one stays RUNNING): `status` says which.
    """
    import numpy as np
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from analysis.synthetic import Truth, wobble

    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    exp_id = found.experiment_id if found else client.create_experiment(experiment)
    made, start = [], 1_767_225_600_000  # 2026-01-01 00:00 UTC, ms: each run starts a day after the one before
    for v, (variant, spec) in enumerate(variants.items()):
        if not isinstance(spec, VerlVariant):
            spec = VerlVariant(law=spec if isinstance(spec, Truth) else Truth(**spec))
        for seed in seeds:
            rng = np.random.default_rng([noise_seed, v, seed])
            name = f"{variant}-seed{seed}"
            params = {"trainer/project_name": experiment, "trainer/experiment_name": name,
                      "trainer/logger/list_len": 2, "trainer/logger/0": "console", "trainer/logger/1": "mlflow",
                      "trainer/nnodes": 1, "trainer/n_gpus_per_node": n_gpus, "trainer/test_freq": test_freq,
                      "trainer/total_training_steps": steps, "trainer/val_before_train": True,
                      "data/seed": seed, "data/train_batch_size": 256, "algorithm/adv_estimator": "grpo",
                      "actor_rollout_ref/rollout/n": 8, "actor_rollout_ref/rollout/val_kwargs/n": val_n,
                      "actor_rollout_ref/actor/optim/lr": 1e-6, **spec.config}
            run = client.create_run(exp_id, start_time=start, run_name=name)
            run_id = run.info.run_id
            client.log_batch(run_id, params=[Param(k, str(val)) for k, val in params.items()])
            step = np.arange(steps + 1)
            compute = n_gpus * step * spec.seconds_per_step / 3600.0
            rate = np.clip(spec.law(compute) + wobble(rng, compute, 0.004, float(compute[-1]) / 4), 0.0, 1.0)
            for s in step:
                logged = {}
                if s == 0 or s % test_freq == 0 or s == steps:
                    logged.update(_verl_val_metrics(rng, float(rate[s]), data_source=data_source, n=val_n,
                                                    prompts=val_prompts))
                if s > 0:
                    score = float(rng.binomial(256 * 8, rate[s]) / (256 * 8))
                    logged.update({
                        "training/global_step": int(s), "training/epoch": 0,
                        "critic/score/mean": score, "critic/rewards/mean": score,
                        "actor/pg_loss": float(0.01 * rng.standard_normal()), "actor/entropy": 0.5,
                        "response_length/mean": 300.0, "timing_s/gen": 0.6 * spec.seconds_per_step,
                        "timing_s/update_actor": 0.3 * spec.seconds_per_step, "timing_s/step": spec.seconds_per_step,
                        "perf/total_num_tokens": 256 * 8 * 400, "perf/time_per_step": spec.seconds_per_step,
                        "perf/throughput": 256 * 8 * 400 / (spec.seconds_per_step * n_gpus)})
                at = start + int(round(1000 * s * spec.seconds_per_step))
                client.log_batch(run_id, metrics=[Metric(verl_metric_key(k), float(x), at, int(s))
                                                  for k, x in logged.items()])
            if status != "RUNNING":
                client.set_terminated(run_id, status=status,
                                      end_time=start + int(round(1000 * steps * spec.seconds_per_step)))
            made.append(ForeignRun(name=name, variant=variant, seed=seed, seconds=0.0))
            start += 86_400_000
    return made
