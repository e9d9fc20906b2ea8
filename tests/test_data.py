"""task=math's data as users bring it (ablate/tasks/records.py): parquet and JSON files with their own field names, a
folder shaped like a hub download, conversations, a validation file of its own, prompts too long for the budget,
and the pre-flight that reads them before any run."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ablate.config import compose
from ablate.policy import build_tokenizer
from ablate.tasks.math import MathTask
from ablate.tasks.tokenizer import build_tokenizer as code_tokenizer
from real_models import save_model


def _verl_rows(n: int, offset: int = 0) -> list[dict]:
    """verl's layout: the question in a column of its own, the answer inside a nested record."""
    return [{"question": f"What is {i} + {i}?", "reward_model": {"ground_truth": str(2 * i), "style": "rule"},
             "data_source": "made-here"} for i in range(offset, offset + n)]


def _parquet(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


VERL_FIELDS = {"problem": "question", "answer": "reward_model.ground_truth"}


def test_a_parquet_file_with_other_field_names_is_read_through_the_mapping(tmp_path):
    """Before, only a JSONL of problem/answer was read: this file failed on the node."""
    path = _parquet(tmp_path / "train.parquet", _verl_rows(12))
    task = MathTask(code_tokenizer(), data_path=str(path), n_val_prompts=2, prompt_template="Q: {problem}",
                    fields=VERL_FIELDS)
    assert task.size("train") == 10 and task.size("val") == 2
    by_prompt = {p.prompt: p.answer for split in ("train", "val") for p in task.splits[split]}
    assert by_prompt == {f"Q: What is {i} + {i}?": str(2 * i) for i in range(12)}
    with pytest.raises(ValueError, match=r"train\.parquet:1: needs a non-empty string `reward_model\.answer`"):
        MathTask(code_tokenizer(), data_path=str(path), fields={"problem": "question", "answer": "reward_model.answer"})
    with pytest.raises(ValueError, match=r"task\.fields: unknown \['question'\]"):
        MathTask(code_tokenizer(), data_path=str(path), fields={"question": "question"})


def test_a_json_array_file_is_read_with_its_solutions(tmp_path):
    """DeepScaleR's shape: one JSON array of {problem, answer, solution}; the solutions feed the warm start."""
    rows = [{"problem": f"What is {i} times 3?", "answer": str(3 * i), "solution": f"3 x {i} = \\boxed{{{3 * i}}}"}
            for i in range(8)]
    (tmp_path / "deepscaler.json").write_text(json.dumps(rows))
    task = MathTask(code_tokenizer(), data_path=str(tmp_path / "deepscaler.json"), n_val_prompts=3,
                    prompt_template="{problem}", warm_start_steps=5)
    prompt, solution = task.warm_start_example(0)
    i = int(prompt.split()[2])
    assert solution == f"3 x {i} = \\boxed{{{3 * i}}}" and task.size("train") == 5


def test_a_folder_shaped_like_a_hub_download_reads_the_split_asked(tmp_path):
    folder = tmp_path / "Polaris-Dataset-53K"
    _parquet(folder / "data" / "train-00000-of-00001.parquet", _verl_rows(9))
    _parquet(folder / "data" / "test-00000-of-00001.parquet", _verl_rows(4, offset=100))
    train = MathTask(code_tokenizer(), data_path=str(folder), n_val_prompts=3, fields=VERL_FIELDS)
    test = MathTask(code_tokenizer(), data_path=str(folder), data_split="test", n_val_prompts=1, fields=VERL_FIELDS)
    assert (train.size("train"), train.size("val"), test.size("train"), test.size("val")) == (6, 3, 3, 1)
    assert all("What is 1" in p.prompt for p in test.splits["train"] + test.splits["val"])  # 100 to 103


def test_a_validation_file_of_its_own_holds_the_validation_prompts_and_none_of_them_trains(tmp_path):
    train_file = _parquet(tmp_path / "train.parquet", _verl_rows(12))  # problems 0-11
    val_file = _parquet(tmp_path / "val.parquet", _verl_rows(5, offset=10))  # 10-14: two also in the training file
    task = MathTask(code_tokenizer(), data_path=str(train_file), val_data_path=str(val_file), n_val_prompts=5,
                    prompt_template="{problem}", fields=VERL_FIELDS)
    val, train = ({p.prompt for p in task.splits[s]} for s in ("val", "train"))
    assert val == {f"What is {i} + {i}?" for i in range(10, 15)}
    assert train == {f"What is {i} + {i}?" for i in range(10)}
    assert task.dropped == {"in the validation file": 2}
    with pytest.raises(ValueError, match=r"val\.parquet has 5 distinct problems; task\.n_val_prompts=6"):
        MathTask(code_tokenizer(), data_path=str(train_file), val_data_path=str(val_file), n_val_prompts=6,
                 fields=VERL_FIELDS)


def test_prompts_past_the_budget_are_dropped_and_counted_or_refused(tmp_path):
    """The code's tokenizer spells "What" as one token and every other character as one: "What is 5 + 5?" is 12
    tokens, "What is 10 + 10?" 14."""
    path = _parquet(tmp_path / "train.parquet", _verl_rows(14))  # 0-9: 12 tokens; 10-13: 14
    task = MathTask(code_tokenizer(), data_path=str(path), n_val_prompts=2, prompt_template="{problem}",
                    fields=VERL_FIELDS, max_prompt_tokens=13)
    assert task.dropped == {"over 13 prompt tokens": 4} and task.size("train") + task.size("val") == 10
    assert MathTask(code_tokenizer(), data_path=str(path), n_val_prompts=2, prompt_template="{problem}",
                    fields=VERL_FIELDS, max_prompt_tokens=14).dropped == {}
    with pytest.raises(ValueError, match=r"4 prompts are longer than generation\.max_prompt_tokens=13 \(the longest "
                                         r"14 tokens\)"):
        MathTask(code_tokenizer(), data_path=str(path), prompt_template="{problem}", fields=VERL_FIELDS,
                 max_prompt_tokens=13, overlong_prompts="error")
    with pytest.raises(ValueError, match=r"0 distinct problems after dropping 14 over 10 prompt tokens \(the longest "
                                         r"14 tokens: raise generation\.max_prompt_tokens\)"):
        MathTask(code_tokenizer(), data_path=str(path), prompt_template="{problem}", fields=VERL_FIELDS,
                 max_prompt_tokens=10)


def test_a_hub_id_that_cannot_be_fetched_fails_in_one_line_naming_it(monkeypatch):
    import datasets
    import huggingface_hub

    for module in (datasets.config, huggingface_hub.constants):  # HF_HUB_OFFLINE=1, read when they were imported
        monkeypatch.setattr(module, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=r"^task\.data_path: could not read the hub dataset nobody/no-such-data "
                                         r"\(split 'train', revision v2\): ") as refused:
        MathTask(code_tokenizer(), data_path="nobody/no-such-data", data_revision="v2")
    assert "\n" not in str(refused.value)
    with pytest.raises(FileNotFoundError, match=r"task\.data_path=mine\.parquet: no such file or folder"):
        MathTask(code_tokenizer(), data_path="./mine.parquet")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """A Qwen3-1.7B-shaped folder (28 x 2048, 16 heads, 8 KV heads, tied) with the real Qwen3 tokenizer; no
    weights."""
    return save_model("qwen3", tmp_path_factory.mktemp("Qwen3-1.7B"), layers=28, hidden=2048, heads=16, kv_heads=8,
                      weights=False)


def test_a_conversation_is_rendered_by_the_chat_template_as_it_is(tmp_path, qwen):
    """verl's and TRL's conversational prompts: a list of turns, rendered with the tokenizer's template, the
    assistant's turn opened; a system prompt of the config's goes first only where the data has none."""
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "answer": str(2 * i)} for i in range(4)]
    rows[0]["prompt"].insert(0, {"role": "system", "content": "Answer in a box."})
    path = _parquet(tmp_path / "chat.parquet", rows)
    tokenizer = build_tokenizer(compose(["model=hf", f"model.path={qwen}"]).model)
    task = MathTask(tokenizer, data_path=str(path), n_val_prompts=1, fields={"problem": "prompt"},
                    chat_template=True, system_prompt="Be brief.", chat_kwargs={"enable_thinking": False})
    for problem in task.splits["train"] + task.splits["val"]:
        turns = [{"role": role, "content": content} for role, content in problem.prompt]
        i = int(turns[-1]["content"].split()[2])
        expected = ([] if i == 0 else [{"role": "system", "content": "Be brief."}]) + turns
        assert task.encode_prompt(problem.prompt) == tokenizer.apply_chat_template(
            expected, add_generation_prompt=True, tokenize=True, return_dict=False, enable_thinking=False)
        text = task.render(problem.prompt)
        assert text.startswith("<|im_start|>system\n" + ("Answer in a box." if i == 0 else "Be brief."))
        assert text.endswith(f"What is {i} + {i}?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    with pytest.raises(ValueError, match="conversations .* set task.chat_template=true"):
        MathTask(tokenizer, data_path=str(path), n_val_prompts=1, fields={"problem": "prompt"})


def test_the_dry_run_reads_the_data_and_prints_what_it_kept_and_the_first_prompt(tmp_path, qwen, capsys):
    """The pre-flight of a Qwen3-1.7B-shaped folder on a parquet file with other field names."""
    from ablate.run import run_sweep

    rows = _verl_rows(40) + [{"question": "What is " + " + ".join(["1"] * 300) + "?",
                              "reward_model": {"ground_truth": "300"}, "data_source": "long"}]
    path = _parquet(tmp_path / "polaris.parquet", rows + rows[:3])
    args = ["model=hf", f"model.path={qwen}", "task=math", f"task.data_path={path}", "task.fields.problem=question",
            "task.fields.answer=reward_model.ground_truth", "task.n_val_prompts=8", "task.chat_template=true",
            "+task.chat_kwargs.enable_thinking=false", "generation.max_prompt_tokens=256", "sweep=loo",
            "sweep.dry_run=true", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
    assert run_sweep(compose(args), args) == 0
    out = capsys.readouterr().out
    assert f"data ({path}): 32 training and 8 validation prompts; dropped 3 repeated, 1 over 256 prompt tokens" in out
    line = next(line for line in out.splitlines() if line.startswith("prompt (the first training one, "))
    assert "<|im_start|>user\\nSolve the following math problem." in line and line.endswith(
        "<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n'")
    assert not list(tmp_path.glob("mlflow.db*"))
