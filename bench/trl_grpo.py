"""The TRL half of the trainer-throughput benchmark: TRL's GRPOTrainer on ablate's tiny model, tokens/s on CPU.

`trl_grpo_throughput(...)` builds the tokenizer and the tiny random Llama exactly as ablate does, runs
`trl.GRPOTrainer` for `steps` optimizer steps on an in-memory `datasets.Dataset` with an exact-match reward, and
returns completion tokens generated per wall-clock second. Needs the `bench` extra (trl, datasets). How its GRPO step
is configured, and how that differs from a plain on-policy GRPO step: docs/testing.md#the-trainer-throughput-comparison.

    python bench/trl_grpo.py        # 8 prompts x 8 samples, 24 completion tokens, 5 steps, 1 thread
"""

from __future__ import annotations

import time
from typing import Any


def trl_grpo_throughput(*, model_cfg: dict, prompts: list[str], answers: list[str], prompts_per_step: int,
                        samples_per_prompt: int, max_completion_tokens: int, steps: int, lr: float, seed: int,
                        workdir: str) -> dict:
    """Run TRL's GRPOTrainer on CPU for `steps` optimizer steps; return its completion-token throughput.

    model_cfg: ablate's `model` config as a dict ({path, vocab_size, hidden_size, num_layers, num_heads, dtype});
    vocab_size None or absent means len(tokenizer). prompts/answers: the training problems (reward 1.0 when the
    stripped completion text equals the answer, else 0.0). Each step draws `prompts_per_step` prompts (TRL shuffles
    the dataset with `seed`, cycling through it when it runs out) and samples `samples_per_prompt` completions of at
    most `max_completion_tokens` tokens each. `workdir` is TRL's output_dir (nothing is saved there). Threads: the
    caller's torch.set_num_threads applies (the result reports it).

    Returns {"tokens_per_s", "seconds_per_step", "steps", "trl_version", ...}: the first step is warm-up and is not
    timed; the timed window runs from the end of step 1 to the end of the last step (wall clock, everything the
    trainer does in between: data loading, generation, reward, loss, backward, optimizer, logging), and
    tokens_per_s = completion tokens generated in steps 2..steps / that time. Completion tokens are counted from the
    token ids TRL generated: each completion up to and including its eos token (pad after it excluded), which is
    also what TRL logs as completions/mean_length (checked against it).
    """
    import datasets
    import torch
    import trl
    from omegaconf import OmegaConf
    from transformers import PrinterCallback, TrainerCallback

    from ablate.policy import build_policy
    from ablate.tasks.tokenizer import build_tokenizer

    if steps < 2:
        raise ValueError("steps: need at least 2 (the first one is warm-up and not timed)")
    if len(prompts) != len(answers) or not prompts:
        raise ValueError("prompts and answers: need the same, non-zero, number of each")

    tokenizer = build_tokenizer()
    cfg = dict(model_cfg)
    if cfg.get("vocab_size") is None:
        cfg["vocab_size"] = len(tokenizer)
    cfg.setdefault("path", None)
    model = build_policy(OmegaConf.create(cfg), seed=seed)
    # A fresh LlamaConfig says bos=1, eos=2 (<unk>, <bos> in our vocabulary): TRL stops at every eos id the model's
    # generation config declares as well as the tokenizer's, so both configs must carry the tokenizer's ids.
    for conf in (model.config, model.generation_config):
        conf.pad_token_id, conf.bos_token_id, conf.eos_token_id = (tokenizer.pad_token_id, tokenizer.bos_token_id,
                                                                   tokenizer.eos_token_id)

    batch = prompts_per_step * samples_per_prompt
    args = trl.GRPOConfig(
        output_dir=workdir,
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        per_device_train_batch_size=batch, gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        num_generations=samples_per_prompt, max_completion_length=max_completion_tokens,
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, use_vllm=False,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, max_steps=steps, seed=seed,
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
    )

    def exact_match(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    generations: list[tuple[float, int]] = []  # (seconds, completion tokens) of each generation call

    class Trainer(trl.GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, *rest, **kw):
            started = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *rest, **kw)
            generations.append((time.perf_counter() - started, sum(len(ids) for ids in completion_ids)))
            return completion_ids, logprobs

    ended: dict[int, float] = {}  # global step -> perf_counter at its end
    logged: dict[int, dict] = {}  # global step -> TRL's logs for it

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            ended[state.global_step] = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                logged[state.global_step] = dict(logs)

    dataset = datasets.Dataset.from_dict({"prompt": list(prompts), "answer": list(answers)})
    trainer = Trainer(model=model, reward_funcs=exact_match, args=args, train_dataset=dataset,
                      processing_class=tokenizer, callbacks=[Clock()])
    trainer.remove_callback(PrinterCallback)  # disable_tqdm=True would print every step's logs to stdout
    started = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - started

    if sorted(ended) != list(range(1, steps + 1)) or len(generations) != steps:
        raise RuntimeError(f"expected {steps} steps with one generation each, got steps {sorted(ended)} and "
                           f"{len(generations)} generations")
    for step, (_, tokens) in enumerate(generations, start=1):
        from_logs = round(logged[step]["completions/mean_length"] * batch)
        if from_logs != tokens:
            raise RuntimeError(f"step {step}: counted {tokens} completion tokens, TRL logged {from_logs}")
    timed = ended[steps] - ended[1]
    tokens = sum(t for _, t in generations[1:])
    generate_s = sum(s for s, _ in generations[1:])
    return {
        "tokens_per_s": tokens / timed,
        "seconds_per_step": timed / (steps - 1),
        "steps": steps,
        "trl_version": trl.__version__,
        "timed_steps": steps - 1,
        "completion_tokens": tokens,  # in the timed steps, eos included
        "completions_per_step": batch,
        "mean_completion_length": tokens / ((steps - 1) * batch),
        "generate_seconds_per_step": generate_s / (steps - 1),  # transformers generate, inside the step time
        "first_step_seconds": ended[1] - started,  # warm-up (not timed), trainer setup in train() included
        "total_seconds": total,
        "reward_mean": sum(logged[s].get("reward", 0.0) for s in range(2, steps + 1)) / (steps - 1),
        "torch_threads": torch.get_num_threads(),
        "transformers_version": __import__("transformers").__version__,
        "torch_version": torch.__version__,
    }


if __name__ == "__main__":
    import json
    import tempfile

    import torch

    from ablate.tasks.synthetic import SyntheticTask
    from ablate.tasks.tokenizer import build_tokenizer

    torch.set_num_threads(1)
    tok = build_tokenizer()
    task = SyntheticTask(tok, ops=["reverse"], min_digits=3, max_digits=6, n_train_prompts=64, n_val_prompts=8)
    problems = [task.problem("train", i) for i in range(task.size("train"))]
    with tempfile.TemporaryDirectory() as workdir:
        result = trl_grpo_throughput(
            model_cfg={"path": None, "vocab_size": len(tok), "hidden_size": 64, "num_layers": 2, "num_heads": 4,
                       "dtype": "float32"},
            prompts=[p.prompt for p in problems], answers=[p.answer for p in problems], prompts_per_step=8,
            samples_per_prompt=8, max_completion_tokens=24, steps=5, lr=1e-4, seed=0, workdir=workdir)
    print(json.dumps(result, indent=2))
