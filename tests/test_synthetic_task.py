"""task=synthetic's problem family: the ops' answers derived by hand, the op mix, and the splits kept apart."""

from __future__ import annotations

import hashlib

import pytest

from ablate.tasks.synthetic import OPS, SyntheticTask
from ablate.tasks.tokenizer import build_tokenizer


def test_each_op_answers_as_derived_by_hand():
    assert OPS["reverse"]("3141") == "1413" and OPS["sort"]("3141") == "1134" and OPS["sum"]("3141") == "9"
    digest = int(hashlib.sha256(b"3141").hexdigest(), 16)
    assert OPS["hash"]("3141") == str(digest)[:4] and len(OPS["hash"]("000")) == 3
    assert OPS["hash"]("3141") == OPS["hash"]("3141") != OPS["hash"]("3142")  # the prompt determines it


def test_op_weights_set_the_mix_and_the_splits_stay_apart():
    task = SyntheticTask(build_tokenizer(), ops=["reverse", "hash"], op_weights=[0.8, 0.2], min_digits=3,
                         max_digits=5, n_train_prompts=2000, n_val_prompts=500)
    train = [task.problem("train", i).prompt for i in range(2000)]
    share = sum(p.startswith("hash") for p in train) / len(train)
    assert 0.17 < share < 0.23  # 0.2, binomial sd 0.009
    assert not set(train) & {task.problem("val", i).prompt for i in range(500)}
    uniform = SyntheticTask(build_tokenizer(), ops=["reverse"], min_digits=3, max_digits=5, n_train_prompts=8,
                            n_val_prompts=4)
    assert uniform.problem("train", 0) == SyntheticTask(build_tokenizer(), ops=["reverse"], op_weights=[3.0],
                                                        min_digits=3, max_digits=5, n_train_prompts=8,
                                                        n_val_prompts=4).problem("train", 0)


@pytest.mark.parametrize("weights", [[1.0], [1.0, -1.0], [0.0, 0.0]])
def test_bad_op_weights_are_refused_naming_the_ops(weights):
    with pytest.raises(ValueError, match=r"task.op_weights: one weight >= 0 per op \(2: \['reverse', 'hash'\]\)"):
        SyntheticTask(build_tokenizer(), ops=["reverse", "hash"], op_weights=weights, min_digits=3, max_digits=5,
                      n_train_prompts=8, n_val_prompts=4)


def _splits_by_rng_choice(ops, op_weights, min_digits, max_digits, n_train, n_val, task_seed=1234):
    """The splits as the task drew them with rng.choice(p=...) per problem (the other form of one draw)."""
    import numpy as np

    p = np.asarray(op_weights, dtype=float) / sum(op_weights)
    rng, seen, splits = np.random.default_rng(task_seed), set(), []
    for count in (n_val, n_train):
        out = []
        while len(out) < count:
            op = ops[int(rng.choice(len(ops), p=p))]
            digits = "".join(str(d) for d in rng.integers(0, 10, size=int(rng.integers(min_digits, max_digits + 1))))
            prompt = f"{op} {digits}:"
            if prompt not in seen:
                seen.add(prompt)
                out.append((prompt, OPS[op](digits)))
        splits.append(out)
    return splits


def test_the_splits_are_the_draws_of_rng_choice_and_each_task_owns_its_copy():
    args = dict(ops=["sort", "hash"], op_weights=[0.8, 0.2], min_digits=3, max_digits=4, n_train_prompts=300,
                n_val_prompts=100)
    val, train = _splits_by_rng_choice(["sort", "hash"], [0.8, 0.2], 3, 4, 300, 100)
    task = SyntheticTask(build_tokenizer(), **args)
    assert [(p.prompt, p.answer) for p in task.splits["val"]] == val
    assert [(p.prompt, p.answer) for p in task.splits["train"]] == train
    again = SyntheticTask(build_tokenizer(), **args)  # the same splits (drawn once per process), not shared lists
    assert task.more_train() == 300 and len(task.splits["train"]) == 600
    assert len(again.splits["train"]) == 300 and [p.prompt for p in again.splits["train"]] == [t[0] for t in train]
    assert again.more_train() == 300 and again.splits["train"] == task.splits["train"]  # the same fresh draw
