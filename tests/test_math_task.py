"""task=math: the sample file and user files, the held-out split, answer extraction and the equivalence checkers.

Both checkers (math_verify, when installed, and the sympy fallback) run on the same cases with the same expected
verdicts, so they agree with each other on every one of them.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from ablate.tasks import math as math_task
from ablate.tasks.base import Problem
from ablate.tasks.math import (
    MathTask,
    clean,
    equivalent,
    extract_answer,
    math_verify_equivalent,
    read_problems,
    sympy_equivalent,
)
from ablate.tasks.tokenizer import build_tokenizer

HAVE_MATH_VERIFY = math_task.mv_verify is not None

EQUAL = [  # (answer, reference)
    ("0.5", r"\frac{1}{2}"),
    (r"\frac{1}{2}", "0.5"),
    ("1,000", "1000"),
    ("1{,}000", "1000"),
    (r"\frac{3}{4}", "0.75"),
    ("3/4", r"\frac{3}{4}"),
    (r"\dfrac34", r"\frac{3}{4}"),
    (r"2\sqrt{2}", r"\sqrt{8}"),
    (r"\sqrt{2}+1", r"1+\sqrt{2}"),
    (r"\frac{\sqrt3}{2}", r"\frac{\sqrt{3}}{2}"),
    (r"\pi \cdot 25", r"25\pi"),
    ("12.0", "12"),
    ("10^6", "1000000"),
    ("2^{-3}", "0.125"),
    (r"\sqrt[3]{8}", "2"),
    ("-2.5", r"-\frac{5}{2}"),
    (r"\left(\frac{1}{2}\right)", "0.5"),
    ("0.333333", r"\frac13"),
    ("x = 5", "5"),
    (r"5\text{ cm}", "5"),
    (r"36\%", "36"),
    (r"90^\circ", "90"),
    ("2x", "x+x"),
]
DIFFERENT = [
    ("0.333", r"\frac{1}{3}"),
    ("13", "12"),
    ("3", "-3"),
    (r"\frac{4}{3}", r"\frac{3}{4}"),
    (r"2\sqrt{3}", r"2\sqrt{2}"),
    ("1000001", "1000000"),
    (r"\frac{1000001}{1000000}", "1"),  # exact numbers are compared exactly, not to 1e-6
    ("10^{-7}", "0"),
    ("1,001", "1000"),
    ("", "5"),
    ("}{", "5"),
    ("abc", "5"),
    (r"\frac{1}{0}", "5"),
    ("0/0", "0"),
    ("x+2", "x+1"),
]
GARBAGE = [  # completions; none may raise, none is correct, all are decided quickly
    "", "</think>", "no number here", r"\boxed{", r"\boxed{}", r"\boxed{}}}{{", r"\boxed{\frac{1}{}}", r"\boxed{\sqrt[}",
    r"\boxed{\frac}", r"\boxed{\sqrt}", r"\boxed{1/0}", r"\boxed{0/0}", r"\boxed{\infty}", r"\boxed{nan}",
    r"\boxed{zoo}", r"\boxed{9^{9^{9^{9}}}}", r"\boxed{9^9^9^9}", "\\boxed{9**9**9**9}", r"\boxed{10^{100000000}}",
    r"\boxed{99999999!}", r"\boxed{" + "(" * 30 + "1" + ")" * 30 + "}", r"\boxed{" + "{" * 30 + "}" * 30 + "}",
    r"\boxed{" + "9" * 5000 + "}", r"\boxed{__import__('os').system('false')}", r"\boxed{lambda: 1}",
    r"\boxed{1 if 1 else 2}", r"\boxed{\begin{pmatrix}1\\2\end{pmatrix}}", "\\boxed{\x00}", "\\boxed{\ud800}",
]


def checkers():
    mv = pytest.param(math_verify_equivalent, id="math_verify",
                      marks=pytest.mark.skipif(not HAVE_MATH_VERIFY, reason="math-verify not installed"))
    return [mv, pytest.param(sympy_equivalent, id="sympy")]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def task() -> MathTask:
    return MathTask(build_tokenizer(), n_val_prompts=10)


# ---- the splits

def test_the_sample_splits_are_disjoint_cover_the_file_and_follow_only_the_task_seed(task):
    problems = read_problems(math_task.SAMPLE)
    assert len(problems) >= 60
    val, train = ({p.prompt for p in task.splits[s]} for s in ("val", "train"))
    assert task.size("val") == len(val) == 10 and task.size("train") == len(train) == len(problems) - 10
    assert not val & train
    assert val | train == {task.template.format(problem=p["problem"]) for p in problems}

    again = MathTask(build_tokenizer(), n_val_prompts=10, seed=7)  # the run's seed does not move the split
    assert again.splits == task.splits
    other = MathTask(build_tokenizer(), n_val_prompts=10, task_seed=99)
    assert {p.prompt for p in other.splits["val"]} != val


def test_n_train_prompts_takes_that_many_of_the_rest_and_too_many_is_an_error(task):
    small = MathTask(build_tokenizer(), n_train_prompts=5, n_val_prompts=10)
    assert small.splits["val"] == task.splits["val"] and small.splits["train"] == task.splits["train"][:5]
    with pytest.raises(ValueError, match="distinct problems"):
        MathTask(build_tokenizer(), n_train_prompts=60, n_val_prompts=10)
    with pytest.raises(ValueError, match="distinct problems"):
        MathTask(build_tokenizer(), n_val_prompts=1000)


def test_the_prompt_is_the_template_and_the_sample_has_no_warm_start(task):
    custom = MathTask(build_tokenizer(), n_val_prompts=3, prompt_template="Q: {problem}\nA: \\boxed{{}}")
    assert all(p.prompt.startswith("Q: ") and p.prompt.endswith("A: \\boxed{}") for p in custom.splits["train"])
    assert "\\boxed{" in task.problem("val", 0).prompt and task.problem("val", 0).prompt.endswith("<think>\n")
    assert task.warm_start_example(0) is None
    with pytest.raises(ValueError, match="prompt_template"):
        MathTask(build_tokenizer(), prompt_template="{question} in \\boxed{}")
    with pytest.raises(ValueError, match="warm_start_steps=10.*solution"):
        MathTask(build_tokenizer(), warm_start_steps=10)


def test_the_configs_default_template_is_the_tasks():
    from ablate.config import compose

    assert compose(["task=math"]).task.prompt_template == math_task.DEFAULT_TEMPLATE  # two copies: kept equal


def test_every_sample_reference_is_read_by_both_checkers_and_accepted_boxed(task):
    for problem in task.splits["train"] + task.splits["val"]:
        assert task.correct(f"<think>work</think> The answer is $\\boxed{{{problem.answer}}}$.", problem), problem
        assert sympy_equivalent(clean(problem.answer), clean(problem.answer)), problem.answer
        if HAVE_MATH_VERIFY:
            assert math_verify_equivalent(clean(problem.answer), clean(problem.answer)), problem.answer


# ---- finding the answer

@pytest.mark.parametrize("text, answer", [
    (r"so \boxed{\frac{\sqrt{3}}{2}}.", r"\frac{\sqrt{3}}{2}"),
    (r"\boxed{1} no, \boxed{ 2 }", "2"),
    (r"\boxed{1} then \boxed{2", "1"),  # the last *complete* box
    (r"\boxed{2", None),  # cut off inside its only box: no answer, not the 2
    (r"\fbox{7}", "7"),
    ("I count 1,000 apples and 12 pears, so 1,234", "1,234"),
    ("x is -2.5", "-2.5"),
    ("about 3/4 of it", "3/4"),
    ("nothing", None),
])
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def test_only_the_text_after_thinking_is_scored(task):
    five = Problem(prompt="p", answer="5")
    assert task.correct(r"<think>maybe \boxed{7}</think> so 5", five)
    assert not task.correct(r"<think>it is \boxed{5}</think>", five)
    assert not task.correct(r"<think>5</think> \boxed{7} is not 5", five)


# ---- equivalence: both checkers on the same cases

@pytest.mark.parametrize("check", checkers())
def test_equal_answers_are_accepted(check):
    rejected = [case for case in EQUAL if not check(clean(case[0]), clean(case[1]))]
    assert not rejected


@pytest.mark.parametrize("check", checkers())
def test_different_answers_are_rejected(check):
    accepted = [case for case in DIFFERENT if check(clean(case[0]), clean(case[1]))]
    assert not accepted


@pytest.mark.parametrize("check", checkers())
def test_garbage_never_raises_is_never_correct_and_is_refused_quickly(check):
    start = time.perf_counter()
    for completion in GARBAGE:
        answer = extract_answer(completion) or ""
        assert check(clean(answer), "1") is False, completion
    assert time.perf_counter() - start < 2.0


def test_the_task_scores_garbage_as_wrong(task):
    one = Problem(prompt="p", answer="1")
    assert not any(task.correct(completion, one) for completion in GARBAGE)


def test_equivalent_falls_back_to_sympy_without_math_verify(monkeypatch):
    called = []
    monkeypatch.setattr(math_task, "mv_verify", None)
    monkeypatch.setattr(math_task, "sympy_equivalent", lambda a, r: called.append((a, r)) or True)
    assert equivalent(r"\frac{1}{2}", "0.5") and called == [(r"\frac{1}{2}", "0.5")]
    assert equivalent("1,000", "1000") and len(called) == 1  # equal once cleaned: no checker needed


@pytest.mark.skipif(not HAVE_MATH_VERIFY, reason="math-verify not installed")
def test_math_verify_works_off_the_main_thread():
    """Its timeout uses SIGALRM, which raises outside the main thread; the task turns it off there."""
    results = []
    worker = threading.Thread(target=lambda: results.append((math_verify_equivalent("0.25", r"\frac{1}{4}"),
                                                             math_verify_equivalent("0.26", r"\frac{1}{4}"))))
    worker.start()
    worker.join()
    assert results == [(True, False)]


# ---- user data

def test_a_user_data_path_is_read_split_and_scored(tmp_path):
    records = [{"problem": f"What is {n} + {n}?", "answer": str(2 * n), "solution": f"{n} + {n} = \\boxed{{{2 * n}}}"}
               for n in range(6)]
    records.append(dict(records[0]))  # a duplicate is dropped, so it cannot be in both splits
    path = write_jsonl(tmp_path / "mine.jsonl", records)
    task = MathTask(build_tokenizer(), data_path=str(path), n_val_prompts=2, prompt_template="{problem}",
                    warm_start_steps=10)
    assert task.size("val") == 2 and task.size("train") == 4
    assert not {p.prompt for p in task.splits["val"]} & {p.prompt for p in task.splits["train"]}
    problem = task.problem("train", 0)
    assert task.correct(f"\\boxed{{{problem.answer}}}", problem)
    assert not task.correct(f"\\boxed{{{int(problem.answer) + 1}}}", problem)
    prompt, solution = task.warm_start_example(5)  # cycles over the training problems
    assert prompt == task.problem("train", 1).prompt and solution.endswith(f"\\boxed{{{task.problem('train', 1).answer}}}")


@pytest.mark.parametrize("bad_line, message", [
    ("{not json", "not a JSON object"),
    ('["a list"]', "not a JSON object"),
    ('{"problem": "2+2?"}', "`answer`"),
    ('{"question": "2+2?", "answer": "4"}', "`problem`"),
    ('{"problem": "2+2?", "answer": ""}', "`answer`"),
])
def test_a_bad_line_is_an_error_naming_the_file_and_line(tmp_path, bad_line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"problem": "1+1?", "answer": 2}, "", bad_line])
    with pytest.raises((ValueError, TypeError), match=rf"bad\.jsonl:3: .*{message}"):
        MathTask(build_tokenizer(), data_path=str(path), n_val_prompts=1)


def test_a_missing_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        MathTask(build_tokenizer(), data_path=str(tmp_path / "nowhere.jsonl"))
