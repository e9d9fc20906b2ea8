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
