"""What the command line sets is what a run reads: a key nothing reads is refused naming it; a run of the user's own
model or data is filed under a study of its own, never the demo's; `--help` is short and ours."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException

from ablate import tracking
from ablate.config import compose
from conftest import run_main

PLUS = "(+ adds a key only inside a dict of your own keys: model.overrides, task.chat_kwargs, ...)"


@pytest.mark.parametrize("override,says", [
    ("+train.step=10", "train.step: no such key; did you mean train.steps?"),  # Hydra's own advice for train.step
    ("+train.step.every=10", "train.step: no such key; did you mean train.steps?"),  # the first part not in it
    ("+loss.eps_mx=3", "loss.eps_mx: no such key; did you mean loss.eps_max?"),
    ("+seeds=3", "seeds: no such key; did you mean seed?"),
    ("++batch.prompts=8", "batch.prompts: no such key; did you mean batch.prompts_per_step?"),
    ("+generation.colour=4", "generation.colour: no such key"),  # nothing close: no guess
])
def test_a_key_added_that_nothing_reads_is_refused_naming_it_and_the_key_it_looks_like(override, says):
    with pytest.raises(ValueError) as err:
        compose([override])
    assert str(err.value) == f"{says} {PLUS}"


def test_plus_adds_only_inside_the_dicts_of_your_own_keys_and_sets_what_is_there():
    """The schema's dict-typed fields are where user keys go; `++` of a key the schema has is a plain set."""
    cfg = compose(["+model.overrides.max_position_embeddings=32768", "+task.chat_kwargs.enable_thinking=false",
                   "+launcher.additional.mail_type=END", "+untestable.loss=not at this scale", "++train.steps=7"])
    assert cfg.model.overrides.max_position_embeddings == 32768 and cfg.task.chat_kwargs.enable_thinking is False
    assert cfg.launcher.additional.mail_type == "END" and cfg.untestable.loss == "not at this scale"
    assert cfg.train.steps == 7


def test_a_key_set_without_plus_that_the_schema_lacks_keeps_hydras_own_error_naming_it():
    with pytest.raises(ConfigCompositionException) as err:
        compose(["train.step=10"])
    assert "train.step" in str(err.value) and "Train" in str(err.value) + str(err.value.__cause__)


@pytest.mark.parametrize("overrides,key", [
    (["task.data_path=mine.jsonl"], "task.data_path"),  # a key of Task's that the synthetic task does not read
    (["+task.val_data_path=val.jsonl"], "task.val_data_path"),  # task=math's own, added where Hydra refused it
    (["+task.fields.problem=question"], "task.fields"),
])
def test_a_task_key_set_while_another_task_is_chosen_is_refused_naming_the_task_that_reads_it(overrides, key):
    with pytest.raises(ValueError) as err:
        compose(overrides)
    assert str(err.value) == f"{key} is read by task=math; this run's task is synthetic"
    with_math = compose(["task=math", *(o.lstrip("+") for o in overrides)])  # with the task that reads it: kept
    assert with_math.task.name == "math"


def test_the_command_line_errors_come_in_one_line_before_any_run(tmp_path):
    cases = {"+train.step=10": f"error: train.step: no such key; did you mean train.steps? {PLUS}",
             "task.data_path=mine.jsonl": "error: task.data_path is read by task=math; this run's task is synthetic"}
    for override, says in cases.items():
        for sweep in ("sweep=none", "sweep=loo"):
            out = run_main("-m", "ablate", override, sweep, cwd=tmp_path)
            assert (out.returncode, out.stderr.strip().splitlines()) == (2, [says]), out.stderr
    assert not (tmp_path / "mlflow.db").exists()


TINY_NOTES = ["aggregation", "length_control", "precision"]  # conf/experiment/tiny.yaml's untestable axes


@pytest.mark.parametrize("overrides,study,notes", [
    (["model=hf", "model.path=/models/Qwen3-1.7B/"], "Qwen3-1.7B-synthetic", []),  # the folder's name, the task
    (["model=hf", "model.path=Qwen/Qwen3-1.7B", "task=math"], "Qwen3-1.7B-math", []),  # a hub id: its model's name
    (["task=math", "task.data_path=/data/polaris.jsonl"], "tiny-math", []),  # data of one's own, the demo's model
    (["task=math", "task.val_data_path=/data/val.jsonl"], "tiny-math", []),
    (["model=hf", "model.path='/models/my model (v2)'"], "my-model-v2-synthetic", []),  # a name fit for a folder
    (["model=hf", "model.path=/m", "+untestable.loss=too short"], "m-synthetic", ["loss"]),  # one's own notes stay
    (["model=hf", "model.path=/models/Qwen3-1.7B", "name=mine"], "mine", []),  # the command line names it: kept
    (["model=hf", "model.path=/models/Qwen3-1.7B", "experiment=tiny"], "tiny", []),  # the demo by name: kept
    (["experiment=paper_8b", "model.path=/models/Qwen3-1.7B"], "paper_8b", []),  # a study's preset: its own name
    (["task=math"], "tiny", TINY_NOTES),  # the repo's own sample of problems: the demo still
    ([], "tiny", TINY_NOTES),
])
def test_a_run_of_your_own_model_or_data_gets_a_study_of_its_own(overrides, study, notes):
    """Named from the model and the task where the demo's preset would file it under `tiny`; and the demo's notes on
    what its scale cannot test (about the tiny model on its puzzles) only on the demo's runs."""
    cfg = compose(overrides)
    assert (cfg.name, cfg.tracking.experiment, cfg.paths.outputs) == (study, study, f"outputs/{study}")
    assert sorted(cfg.untestable) == notes
    mock = compose([*overrides, "generator=mock"])  # the mock run: the study's own, as the demo's is tiny-mock
    assert (mock.name, mock.tracking.experiment) == (study, f"{study}-mock")


@pytest.mark.e2e
def test_a_run_of_your_own_model_is_filed_in_its_study_in_mlflow_not_the_demos(tmp_path):
    """A whole run (2 mock steps, 15-45 s) of a model folder of one's own, with no experiment= nor name=: its MLflow
    run is in the study named from the folder and the task, untagged by the demo's notes; the demo's experiment is
    not even made."""
    from ablate.policy import build_policy, build_tokenizer

    folder = tmp_path / "models" / "my-model"
    model = compose([]).model
    tokenizer = build_tokenizer(model)
    build_policy(model, 0, tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = run_main("-m", "ablate", "model=hf", f"model.path={folder}", "generator=mock", "train.steps=2",
                   "task.warm_start_steps=0", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[0] == ("study 'my-model-synthetic' (MLflow experiment 'my-model-synthetic-mock', "
                                          "outputs/my-model-synthetic/): a model or data of your own, filed apart from "
                                          "the demo's 'tiny'; name=... chooses another")
    client = tracking.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert {e.name for e in client.search_experiments()} == {"Default", "my-model-synthetic-mock"}
    (run,) = client.search_runs([client.get_experiment_by_name("my-model-synthetic-mock").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["model.path"] == str(folder)
    assert not [tag for tag in run.data.tags if tag.startswith("ablate.untestable")]


def test_help_is_short_names_the_everyday_commands_and_every_group_a_user_chooses(tmp_path):
    from pathlib import Path

    out = run_main("-m", "ablate", "--help", cwd=tmp_path)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) <= 40, len(lines)
    assert lines[0].startswith("usage: python -m ablate ")
    for command in ("python -m ablate sweep=loo ", "sweep.dry_run=true  the dry run",
                    "generator=mock      the mock run", "python -m analysis report --experiment NAME", "--hydra-help",
                    "docs/first-run.md"):
        assert command in out.stdout, command
    conf = Path(__file__).resolve().parents[1] / "conf"
    for group in ("experiment", "model", "task", "generator", "sweep", "recipe", "launcher", "run", "loss",
                  "aggregation", "normalization", "precision", "length_control", "off_policy", "filtering"):
        row = next(line for line in lines if line.startswith(f"  {group} "))
        assert sorted(row.split("(")[0].split()[1:][::2]) == sorted(p.stem for p in (conf / group).glob("*.yaml"))
    assert next(line for line in lines if line.startswith("  model ")).split()[1] == "tiny"  # the default first
    assert not [line for line in lines if line.lstrip().startswith("schema/")]  # the internal groups: not here
    assert run_main("-m", "ablate", "-h", cwd=tmp_path).stdout == out.stdout


def test_hydra_help_is_hydras_whole_help(tmp_path):
    out = run_main("-m", "ablate", "--hydra-help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "== Configuration groups ==" in out.stdout and "schema/task: math, option, synthetic" in out.stdout
    assert "== Config ==" in out.stdout and "--config-dir,-cd" in out.stdout  # the app's help, then Hydra's flags
