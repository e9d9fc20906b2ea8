"""HF Trainer's trainer_state.json read as runs (analysis/trainer_state.py): files written by transformers' own
`TrainerState.save_to_json`, as a folder of runs whose newest checkpoint is read, as a checkpoint folder and as bare
files; one real `Trainer` run of a tiny random Llama on CPU, its checkpoint folders read back; each bad file gets its
one line.
"""

import json

import pytest
from transformers import TrainerState

from analysis.tables import TableError
from analysis.trainer_state import BadTrainerState, DuplicateRunName, TrainerStateNotFound, read_trainer_states

# A TRL GRPO run as its log calls go: training entries, evaluation entries at steps 0, 2 and 4 (eval_on_start), the
# step 2 training entry logged twice (a resumed run logs it again: the later one wins), and the summary entry.
HISTORY = [
    {"eval_reward": 0.125, "eval_loss": 1.5, "eval_runtime": 0.25, "epoch": 0.0, "step": 0},
    {"loss": 1.25, "reward": 0.25, "rewards/accuracy/mean": 0.5, "learning_rate": 0.001, "epoch": 0.5, "step": 1},
    {"loss": 1.0, "reward": 0.375, "rewards/accuracy/mean": 0.625, "learning_rate": 0.0005, "epoch": 1.0, "step": 2},
    {"eval_reward": 0.5, "eval_loss": 1.0, "eval_runtime": 0.25, "epoch": 1.0, "step": 2},
    {"loss": 0.875, "reward": 0.5, "rewards/accuracy/mean": 0.75, "learning_rate": 0.0005, "epoch": 1.0, "step": 2},
    {"loss": 0.75, "reward": 0.625, "learning_rate": 0.00025, "epoch": 1.5, "step": 3, "completions/text": "abc"},
    {"eval_reward": 0.75, "eval_loss": 0.5, "eval_runtime": 0.25, "epoch": 2.0, "step": 4},
    {"train_runtime": 12.5, "train_samples_per_second": 3.0, "total_flos": 1234.0, "train_loss": 0.9, "epoch": 2.0,
     "step": 4},
]


def save_state(folder, history, global_step, **fields):
    folder.mkdir(parents=True, exist_ok=True)
    TrainerState(log_history=history, global_step=global_step, max_steps=4, train_batch_size=8, logging_steps=1,
                 eval_steps=2, save_steps=2, **fields).save_to_json(str(folder / "trainer_state.json"))
    return folder / "trainer_state.json"


def checkpoints(run_folder, history):
    """checkpoint-2 and checkpoint-4 (written in the other order on purpose) as the Trainer saves them: each holds
    the history up to its step."""
    for step in (4, 2):
        save_state(run_folder / f"checkpoint-{step}", [e for e in history if e["step"] <= step], step)


def test_a_folder_of_runs_reads_each_runs_newest_checkpoint(tmp_path):
    checkpoints(tmp_path / "lr-1e-3-seed1", HISTORY)
    checkpoints(tmp_path / "lr-3e-3-seed1", HISTORY[:4])
    (tmp_path / "logs").mkdir()  # not a run: passed over
    runs = read_trainer_states([tmp_path])
    assert [run.name for run in runs] == ["lr-1e-3-seed1", "lr-3e-3-seed1"]
    run = runs[0]
    eval_reward = run.history("eval_reward")  # checkpoint-4's history: checkpoint-2's stops at step 2
    assert eval_reward.step.tolist() == [0, 2, 4] and eval_reward.value.tolist() == [0.125, 0.5, 0.75]
    assert eval_reward.time is None and run.start_time is None
    loss = run.history("loss")
    assert loss.step.tolist() == [1, 2, 3] and loss.value.tolist() == [1.25, 0.875, 0.75]  # step 2: the later entry
    assert run.history("rewards/accuracy/mean").value.tolist() == [0.5, 0.75]
    assert run.history("epoch").step.tolist() == [0, 1, 2, 3, 4]
    assert run.history("total_flos").step.tolist() == [4]  # the summary's figures: one point each, at the last step
    assert "step" not in run.metrics and "completions/text" not in run.metrics
    assert run.params == {"train_batch_size": "8", "max_steps": "4", "num_train_epochs": "0", "logging_steps": "1",
                          "eval_steps": "2", "save_steps": "2"}
    assert runs[1].history("eval_reward").step.tolist() == [0, 2]
    with pytest.raises(TableError, match="no metric 'eval_rewrd'"):
        run.history("eval_rewrd")


def test_a_run_folder_a_checkpoint_folder_and_bare_files(tmp_path):
    checkpoints(tmp_path / "out" / "base", HISTORY)
    (run,) = read_trainer_states(tmp_path / "out" / "base")  # a run's output_dir: its newest checkpoint
    assert run.name == "base" and run.history("eval_reward").step.tolist() == [0, 2, 4]
    (run,) = read_trainer_states([tmp_path / "out" / "base" / "checkpoint-2"])  # that checkpoint, named by its run
    assert run.name == "base" and run.history("eval_reward").step.tolist() == [0, 2]
    renamed = tmp_path / "no-kl-seed2.json"
    renamed.write_text((tmp_path / "out" / "base" / "checkpoint-4" / "trainer_state.json").read_text())
    saved = save_state(tmp_path / "out" / "short", HISTORY, 4, trial_params={"lr": 0.001})  # save_state()'s place
    runs = read_trainer_states([tmp_path / "out" / "base" / "checkpoint-4" / "trainer_state.json", renamed, saved])
    assert [run.name for run in runs] == ["base", "no-kl-seed2", "short"]
    assert runs[2].params["lr"] == "0.001"


def test_one_run_named_twice_is_refused(tmp_path):
    checkpoints(tmp_path / "base", HISTORY)
    with pytest.raises(DuplicateRunName, match=r"two runs named 'base': .*checkpoint-4.*checkpoint-2"):
        read_trainer_states([tmp_path / "base", tmp_path / "base" / "checkpoint-2"])


@pytest.mark.parametrize("text, message", [
    ("{\"log_history\": [", r"not JSON \(line 1: Expecting value\)"),
    (json.dumps({"global_step": 3, "best_metric": None}), r"no 'log_history' \(holds: best_metric, global_step\)"),
    (json.dumps([1, 2]), r"no 'log_history' \(holds: a JSON list\)"),
    (json.dumps({"log_history": {"step": 1}}), r"its 'log_history' is a JSON dict, not a list"),
    (json.dumps({"log_history": [{"step": 1, "loss": 1.0}, {"loss": 0.5, "epoch": 1.0}]}),
     r"log_history entry 2 has no 'step' \(it has: loss, epoch\)"),
    (json.dumps({"log_history": [{"step": 1.5, "loss": 1.0}]}), r"entry 1: its 'step' 1.5 is not a whole step"),
    (json.dumps({"log_history": [{"step": 1, "note": "x"}]}), r"its log_history holds no metric \(1 entries"),
])
def test_bad_files_are_refused_in_one_line_naming_the_file(tmp_path, text, message):
    file = tmp_path / "run" / "checkpoint-1" / "trainer_state.json"
    file.parent.mkdir(parents=True)
    file.write_text(text)
    with pytest.raises(BadTrainerState, match=message) as caught:
        read_trainer_states([tmp_path / "run"])
    assert str(caught.value).startswith(f"{file}: ") and "\n" not in str(caught.value)


def test_folders_without_a_trainer_state_are_refused_naming_what_was_looked_for(tmp_path):
    (tmp_path / "out" / "run" / "checkpoint-2").mkdir(parents=True)  # a save that never wrote its state
    with pytest.raises(TrainerStateNotFound, match=r"out: no trainer_state.json in it, in a checkpoint-N folder of it, "
                                                   r"nor in its subfolders' \(<run>/trainer_state.json"):
        read_trainer_states([tmp_path / "out"])
    with pytest.raises(TrainerStateNotFound, match="no trainer_state.json, checkpoint folder or folder of runs at"):
        read_trainer_states([tmp_path / "nowhere"])


def test_a_real_trainer_runs_checkpoints(tmp_path):
    """HF's own Trainer: a tiny random Llama, 6 steps on CPU, evaluated and saved every 2 steps; its output_dir holds
    checkpoint-2, -4 and -6, and the newest (6) is the one read."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                                         max_position_embeddings=16))
    rows = [{"input_ids": torch.arange(i, i + 8) % 64, "labels": torch.arange(i, i + 8) % 64} for i in range(8)]
    args = TrainingArguments(output_dir=str(tmp_path / "runs" / "tiny-seed0"), max_steps=6,
                             per_device_train_batch_size=2, learning_rate=1e-3, logging_steps=1, eval_strategy="steps",
                             eval_steps=2, save_strategy="steps", save_steps=2, save_only_model=True, report_to=[],
                             use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows[:4]).train()
    saved = sorted(p.name for p in (tmp_path / "runs" / "tiny-seed0").iterdir())
    assert saved == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]

    (run,) = read_trainer_states([tmp_path / "runs"])
    assert run.name == "tiny-seed0"
    eval_loss = run.history("eval_loss")
    assert eval_loss.step.tolist() == [2, 4, 6] and eval_loss.value[-1] < eval_loss.value[0]
    assert run.history("loss").step.tolist() == [1, 2, 3, 4, 5, 6]
    assert {"learning_rate", "grad_norm", "epoch", "eval_runtime"} <= set(run.metrics)
    assert run.params["train_batch_size"] == "2" and run.params["max_steps"] == "6"
    logged = json.loads((tmp_path / "runs" / "tiny-seed0" / "checkpoint-6" / "trainer_state.json").read_text())
    assert run.history("loss").value.tolist() == [e["loss"] for e in logged["log_history"] if "loss" in e]


def test_the_newest_checkpoint_is_the_highest_number_not_the_last_name(tmp_path):
    for step in (9, 10):  # "checkpoint-9" sorts after "checkpoint-10" as text
        save_state(tmp_path / "base" / f"checkpoint-{step}", [{"eval_reward": 0.25, "step": s} for s in range(step)],
                   step)
    (run,) = read_trainer_states([tmp_path / "base"])
    assert run.history("eval_reward").step.tolist() == list(range(10))
