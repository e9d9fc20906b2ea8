"""What every task gives the trainer and the generators.

A task is built as `build(cfg.task, tokenizer=..., seed=...)`. It holds two splits, `train` and `val` (held out:
no validation prompt is a training prompt), and scores a completion with an exact check of its final answer.
Completions may think first: the final answer is the text after the last `</think>` (all of it when there is none).
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_END = "</think>"


class PromptsExhausted(RuntimeError):
    """No training prompt is left to sample (No-Positive-Resampling retired them all) and the task has no more:
    the run ends there, cleanly, saying so."""


@dataclass(frozen=True)
class Problem:
    prompt: str | tuple  # the text the model continues, or a conversation: (role, content) turns (task.chat_template)
    answer: str  # the reference final answer


def final_answer(completion: str) -> str:
    """The text after the last `</think>` (the whole completion when the model did not think), stripped."""
    return completion.rpartition(THINK_END)[2].strip()


class Task:
    """Base class: subclasses fill `self.splits` ({"train": [...], "val": [...]}) and may override `correct`."""

    splits: dict[str, list[Problem]]

    def __init__(self, tokenizer, chat_template: bool = False, system_prompt: str | None = None,
                 chat_kwargs: dict | None = None, **_: object):
        self.tokenizer = tokenizer
        self.chat_template, self.system_prompt = chat_template, system_prompt
        self.chat_kwargs = dict(chat_kwargs or {})
        if chat_template and not getattr(tokenizer, "chat_template", None):
            raise ValueError("task.chat_template=true: the tokenizer has no chat template (a base model's may not: "
                             "leave it false and the prompt goes as text)")

    def encode_prompt(self, prompt: str | tuple) -> list[int]:
        """A prompt's token ids: the text as the tokenizer encodes it, its special tokens included (Llama-3's BOS);
        or, with task.chat_template, rendered as the user's turn of the tokenizer's chat template (after the system
        prompt's turn) with the assistant's turn opened, and encoded as rendered (the template writes its own BOS).
        A conversation, (role, content) turns, is rendered as it is (task.system_prompt first, if it has none)."""
        return list(self.tokenizer.encode(self.render(prompt), add_special_tokens=not self.chat_template))

    def render(self, prompt: str | tuple) -> str:
        """The text a prompt is encoded from (encode_prompt), as the pre-flight shows it."""
        if not self.chat_template:
            return prompt
        turns = [{"role": role, "content": content} for role, content in
                 (prompt if isinstance(prompt, tuple) else (("user", prompt),))]
        if self.system_prompt and turns[0]["role"] != "system":
            turns.insert(0, {"role": "system", "content": self.system_prompt})
        return self.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True,
                                                  **self.chat_kwargs)

    def size(self, split: str) -> int:
        return len(self.splits[split])

    def problem(self, split: str, index: int) -> Problem:
        return self.splits[split][index]

    def correct(self, completion: str, problem: Problem) -> bool:
        """Exact match of the final answer."""
        return final_answer(completion) == problem.answer

    def warm_start_example(self, index: int) -> tuple[str, str] | None:
        """(prompt, completion) for the supervised warm start, or None for a task that has none."""
        return None

    def train_origin(self) -> str:
        """Where the number of training prompts comes from, in words (the pre-flight says it beside the passes a run
        would make over them: ablate/checks.py's check_passes)."""
        return f"the task gives {self.size('train'):,} (task.n_train_prompts)"

    def more_train(self) -> int:
        """Add fresh training prompts, none a validation prompt; returns how many (0: a finite data set has no
        more). The same calls on the same task add the same prompts (a resumed run grows its task again)."""
        return 0
