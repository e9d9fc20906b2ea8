"""task=synthetic: a family of digit-string puzzles generated in code, scored by exact match.

Each problem is "<op> <digits>:" and its answer the digits transformed by the op: `reverse` (3141 -> 1413), `sort`
(3141 -> 1134), `sum` (3141 -> 9, the digit sum) or `hash` (digits of a SHA-256 of them: learnable by no model).
The lengths are drawn uniformly in [min_digits, max_digits]. The splits are drawn from one seeded stream and
deduplicated, validation first, so no validation prompt is ever a training prompt. The family is large, so the
training set can grow: when No-Positive-Resampling has retired prompts, an epoch starts topped up
(ablate/trainer.py, PromptSampler): `more_train` draws n_train_prompts fresh ones (from a stream of their own,
seeded by the task seed and how many came before: the same on every run and after a resume).

The warm start imitates a noisy teacher on problems of the same family (never a validation prompt): its answer is right with
probability `teacher_accuracy`, else a near miss (two neighbouring digits swapped; a sum off by one). The warm
model so learns the skill with the teacher's uncertainty, and starts RL near `teacher_accuracy`: what RL then does
is what it does for LLMs, raise the probability of answers the model can already give. (Supervised training on
clean answers takes a tiny model from 0 to 1 in a few seconds, with no useful start in between.)
"""

from __future__ import annotations

import hashlib

import numpy as np

from ablate.tasks.base import Problem, Task

def _hash(digits: str) -> str:
    """As many digits as the prompt's, from a SHA-256 of them: determined by the prompt, learnable by no model."""
    return str(int(hashlib.sha256(digits.encode()).hexdigest(), 16))[:len(digits)]


OPS = {
    "reverse": lambda d: d[::-1],
    "sort": lambda d: "".join(sorted(d)),
    "sum": lambda d: str(sum(int(c) for c in d)),
    "hash": _hash,  # the problems beyond the model: they put the ceiling of the pass rate below 1
}


_SPLITS: dict[tuple, tuple[list[Problem], list[Problem], frozenset[str]]] = {}  # drawn splits, per task


class SyntheticTask(Task):
    def __init__(self, tokenizer, ops: list[str], min_digits: int, max_digits: int, n_train_prompts: int,
                 n_val_prompts: int, teacher_accuracy: float = 1.0, seed: int = 0, task_seed: int = 1234,
                 op_weights: list[float] | None = None, **rest: object):
        super().__init__(tokenizer, **rest)  # the prompt's encoding
        unknown = sorted(set(ops) - set(OPS))
        if unknown or not ops:
            raise ValueError(f"task.ops: unknown op(s) {unknown or ops}; known: {sorted(OPS)}")
        weights = np.asarray(op_weights if op_weights else [1.0] * len(ops), dtype=float)
        if len(weights) != len(ops) or (weights < 0).any() or weights.sum() <= 0:
            raise ValueError(f"task.op_weights: one weight >= 0 per op ({len(ops)}: {ops}), not all 0; got "
                             f"{list(op_weights or [])}")
        self.op_p = weights / weights.sum()
        self._uniform = bool(np.all(self.op_p == self.op_p[0]))  # (drawn as it always was)
        self._cdf = np.cumsum(self.op_p)
        self._cdf /= self._cdf[-1]  # rng.choice(p=op_p)'s own table: one rng.random() and a search draw the same op
        if not 1 <= min_digits <= max_digits:
            raise ValueError(f"task: need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
        if not 0 <= teacher_accuracy <= 1:
            raise ValueError(f"task.teacher_accuracy must be in [0, 1], got {teacher_accuracy}")
        self.ops, self.min_digits, self.max_digits = list(ops), min_digits, max_digits
        self.teacher_accuracy = teacher_accuracy
        # The task's problems do not depend on the run's seed: every variant of a sweep sees the same task.
        room = len(self.ops) * sum(10 ** n for n in range(min_digits, max_digits + 1))
        if n_train_prompts + n_val_prompts > room // 2:
            raise ValueError(f"task: {n_train_prompts} + {n_val_prompts} prompts asked of a family of {room}: "
                             "raise max_digits")
        key = (tuple(self.ops), tuple(self.op_p.tolist()), min_digits, max_digits, n_train_prompts, n_val_prompts,
               task_seed)
        if key not in _SPLITS:  # a worker running variants in turn draws them once
            rng, drawn = np.random.default_rng(task_seed), set()
            val = self._draw(rng, n_val_prompts, drawn)
            _SPLITS[key] = (val, self._draw(rng, n_train_prompts, drawn), frozenset(drawn))
        val, train, drawn = _SPLITS[key]
        self.splits = {"train": list(train), "val": list(val)}  # this task's own lists: more_train extends train
        self._task_seed, self._chunk, self._room = task_seed, n_train_prompts, room
        self._splits_seen = set(drawn)  # fresh training prompts are drawn apart from these
        self._val = {p.prompt for p in val}  # the warm start's examples avoid these only (they may repeat)
        self._warm_rng_seed = task_seed + 1
        self._warm: list[Problem] = []

    def _draw(self, rng: np.random.Generator, count: int, seen: set[str], unique: bool = True) -> list[Problem]:
        """`count` problems none of which is in `seen`; `unique`: none twice either (each is added to `seen`)."""
        out: list[Problem] = []
        while len(out) < count:
            op = self.ops[int(rng.integers(len(self.ops))) if self._uniform
                          else int(self._cdf.searchsorted(rng.random(), side="right"))]
            size = int(rng.integers(self.min_digits, self.max_digits + 1))
            digits = "".join(map(str, rng.integers(0, 10, size=size).tolist()))
            prompt = f"{op} {digits}:"
            if prompt in seen:
                continue
            if unique:
                seen.add(prompt)
            out.append(Problem(prompt=prompt, answer=OPS[op](digits)))
        return out

    def more_train(self) -> int:
        """n_train_prompts fresh training prompts, while the family has room for them (half of it at most)."""
        train = self.splits["train"]
        if len(self._splits_seen) + self._chunk > self._room // 2:
            return 0
        rng = np.random.default_rng([self._task_seed, 2, len(train)])
        train.extend(self._draw(rng, self._chunk, self._splits_seen))
        return self._chunk

    def warm_start_example(self, index: int) -> tuple[str, str]:
        """Problem `index` of an endless stream of the same family, none of them a validation prompt (the stream
        may repeat a problem, or hold a training prompt, as SFT data overlaps RL data)."""
        if index >= len(self._warm):
            rng = np.random.default_rng([self._warm_rng_seed, len(self._warm)])
            self._warm.extend(self._draw(rng, max(256, index + 1 - len(self._warm)), self._val, unique=False))
        problem = self._warm[index]
        rng = np.random.default_rng([self._warm_rng_seed, index, 3])
        if rng.random() < self.teacher_accuracy:
            return problem.prompt, problem.answer
        return problem.prompt, near_miss(problem.answer, rng)


def near_miss(answer: str, rng: np.random.Generator) -> str:
    """A wrong answer close to `answer`: two neighbouring different digits swapped, else the number off by one."""
    spots = [i for i in range(len(answer) - 1) if answer[i] != answer[i + 1]]
    if spots:
        i = spots[int(rng.integers(len(spots)))]
        return answer[:i] + answer[i + 1] + answer[i] + answer[i + 2:]
    return str(int(answer) + (1 if answer[0] != "9" and rng.random() < 0.5 or int(answer) == 0 else -1))
