"""analysis/verl_logs.py on logs written by verl's own loggers: `Tracking(..., default_backend=["console", "file"])`
of verl 0.9.1 (its two files under tests/data/verl/, loaded alone: tests/data/verl/README.md), its stdout captured
as the console log; the same lines behind Ray's prefixes among a job's other output; lines in the shape of verl's
published baseline logs (written here: those logs carry no licence); and the files refused, in one line each."""

from __future__ import annotations

import importlib.util
import sys
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from analysis.verl_logs import (CONSOLE, FILE, FORM_TAG, OTHER_LINES_TAG, STEP_LINES_TAG, DuplicateRunName,
                                MalformedStepLine, NoStepLines, VerlLogNotFound, read_verl_logs)

VERL = Path(__file__).parent / "data" / "verl"
VAL = "val-core/openai/gsm8k/reward/mean@4"
ODD_KEY = "ratio a - b:c"  # verl escapes nothing: the console line holds `ratio a - b:c:0.5`


def _load(monkeypatch, name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # removed again after the test
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tracking(monkeypatch, tmp_path):
    """verl's Tracking class; its file logger writes under tmp_path/<project>/<experiment>.jsonl."""
    _load(monkeypatch, "verl.utils.logger", VERL / "aggregate_logger.py")  # what tracking.py imports LocalLogger from
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path))
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    return _load(monkeypatch, "verl_tracking_under_test", VERL / "tracking.py").Tracking


def _logged() -> list[tuple[int, dict]]:
    """What a verl PPO run logs, a step at a time: validation before training at step 0 and every 2 steps, the
    training metrics from step 1, as Python and numpy numbers, with values that are no number (or not finite)."""
    steps = []
    for step in range(5):
        data = {}
        if step > 0:
            data.update({"training/global_step": step, "training/epoch": 0,
                         "critic/score/mean": 0.1 * step + 1 / 3, "actor/pg_loss": np.float64(-0.0123456789 * step),
                         "actor/lr": 1e-06, "timing_s/step": np.float32(12.5 + step / 4),
                         "perf/total_num_tokens": np.int64(40960 + step), ODD_KEY: 0.5 * step,
                         "actor/grad_norm": float("nan") if step == 3 else 2.0 ** -step,
                         "flag": True, "note": "text", "hist": np.array([1.0, 2.0])})
        if step % 2 == 0:
            data.update({VAL: np.float64(0.2 + 0.15 * step), "val-aux/openai/gsm8k/reward/std@4": 0.0})
        steps.append((step, data))
    return steps


def _expected(logged) -> dict[str, dict[int, float]]:
    """metric -> {step: value}: the finite numbers logged, as floats (the float32 values are exact in binary)."""
    out: dict[str, dict[int, float]] = {}
    for step, data in logged:
        for key, value in data.items():
            if isinstance(value, (int, float, np.number)) and not isinstance(value, bool) and np.isfinite(value):
                out.setdefault(key, {})[step] = float(value)
    return out


def _write_both(tracking, capsys, tmp_path) -> tuple[Path, Path]:
    """verl's console and file loggers' outputs of `_logged()`: (the captured stdout, the JSON Lines file)."""
    capsys.readouterr()
    run = tracking("proj", "exp-1", default_backend=["console", "file"])
    for step, data in _logged():
        run.log(data=data, step=step)
    run.finish()
    console = tmp_path / "console" / "exp-1.log"
    console.parent.mkdir()
    console.write_text(capsys.readouterr().out, encoding="utf-8")
    return console, tmp_path / "proj" / "exp-1.jsonl"


def _points(run) -> dict[str, dict[int, float]]:
    return {name: dict(zip(run.history(name).step.tolist(), run.history(name).value.tolist())) for name in run.metrics}


def test_verl_console_and_file_logs_read_back_point_by_point(tracking, capsys, tmp_path):
    console_log, file_log = _write_both(tracking, capsys, tmp_path)
    text = console_log.read_text()
    assert f"{ODD_KEY}:1.0" in text and "np.float64(" in text and "np.float32(" in text  # verl's own formatting
    expected = _expected(_logged())
    (console,), (file,) = read_verl_logs(console_log), read_verl_logs([file_log])
    for run, form in ((console, CONSOLE), (file, FILE)):
        assert run.name == "exp-1" and run.tags[FORM_TAG] == form and run.tags[STEP_LINES_TAG] == "5"
        assert set(run.metrics) == set(expected)  # the bool, the text, the list and the NaN skipped
        assert _points(run) == expected
        assert all(run.history(name).time is None for name in run.metrics) and run.start_time is None
    assert console.tags[OTHER_LINES_TAG] == "1"  # verl's "Creating file logger at ..." on stdout
    assert _points(console)[VAL] == {0: 0.2, 2: 0.5, 4: 0.8}
    assert _points(console)["actor/grad_norm"] == {1: 0.5, 2: 0.25, 4: 0.0625}  # step 3's NaN is no point
    assert _points(console)["timing_s/step"][3] == 13.25


def test_two_logs_of_one_name_are_refused(tracking, capsys, tmp_path):
    console_log, file_log = _write_both(tracking, capsys, tmp_path)
    with pytest.raises(DuplicateRunName) as err:
        read_verl_logs([console_log, file_log])
    assert str(err.value).count("\n") == 0 and str(console_log) in str(err.value) and str(file_log) in str(err.value)
    with pytest.raises(DuplicateRunName, match="exp-1.jsonl is given twice"):
        read_verl_logs([file_log, str(file_log)])


def test_a_ray_driver_log_reads_as_the_plain_console_log(tracking, capsys, tmp_path):
    console_log, _ = _write_both(tracking, capsys, tmp_path)
    noise = ["2026-12-01 10:00:00,000\tINFO worker.py:1832 -- Started a local Ray instance.",
             "\x1b[36m(TaskRunner pid=2664304)\x1b[0m {'trainer': {'experiment_name': 'exp-1',",
             "(WorkerDict pid=2673336) Qwen2ForCausalLM contains 7.62B parameters [repeated 7x across cluster]",
             "(TaskRunner pid=2664304) Let's start with the first step:",
             "(TaskRunner pid=2664304) step: 1 is to add the eggs",
             "Training Progress:  20%|██        | 1/5 [03:02<12:10, 182.60s/it]"]
    lines = []
    for index, line in enumerate(console_log.read_text().splitlines()):
        prefix = "(TaskRunner pid=2664304, ip=10.0.0.1) " if index == 2 else "\x1b[36m(TaskRunner pid=2664304)\x1b[0m "
        lines += [noise[index % len(noise)], prefix + line]
    ray_log = tmp_path / "ray" / "exp-1.log"
    ray_log.parent.mkdir()
    ray_log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (ray,), (plain,) = read_verl_logs([ray_log]), read_verl_logs([console_log])
    assert _points(ray) == _points(plain) == _expected(_logged())
    assert ray.tags[STEP_LINES_TAG] == "5" and ray.tags[OTHER_LINES_TAG] == str(len(lines) - 5)


def test_lines_in_the_shape_of_verls_published_baseline_logs(tmp_path):
    """verl's console lines as its baseline logs have them (github.com/eric-haibin-lin/verl-data, no licence: these
    lines are written here, values made up): verl 2024's `:.3f`, `main_task` actor, step 0 logged twice (the
    validation before training under its own name, then a training step); verl 2025's validation-only step 0."""
    old = tmp_path / "gemma-2-2b-it-ppo.log"
    old.write_text("\n".join([
        "\x1b[2m\x1b[36m(main_task pid=64899)\x1b[0m \"Initial validation metrics: {'test_score/openai/gsm8k': "
        "0.5206}\"",
        "\x1b[2m\x1b[36m(main_task pid=64899)\x1b[0m step:0 - test_score/openai/gsm8k:0.521",
        "\x1b[2m\x1b[36m(main_task pid=64899)\x1b[0m step:0 - timing/gen:48.956 - critic/kl:-0.000 - "
        "critic/lr(1e-4):0.100 - critic/score/mean:0.012",
        "\x1b[2m\x1b[36m(main_task pid=64899)\x1b[0m step:9 - timing/gen:44.911 - critic/score/mean:0.394 - "
        "val/test_score/openai/gsm8k:0.546",
    ]) + "\n")
    new = tmp_path / "qwen2-7b-fsdp2.log"
    new.write_text("\n".join([
        "(TaskRunner pid=2664304) step:0 - val-core/openai/gsm8k/reward/mean@1:0.229 - "
        "val-aux/openai/gsm8k/reward/std@1:0.000 - val-core/openai/gsm8k/reward/best@1/mean:0.229",
        "(TaskRunner pid=2664304) list(reward_extra_infos_dict.keys())=[]",
        "(TaskRunner pid=2664304) step:1 - actor/lr:0.000 - critic/score/mean:0.257 - timing_s/step:179.003 - "
        "perf/total_num_tokens:1503056.000 - perf/time_per_step:179.003",
        "(TaskRunner pid=2664304) step:5 - val-core/openai/gsm8k/reward/mean@1:0.856 - critic/score/mean:0.849 - "
        "timing_s/testing:45.697 - timing_s/step:219.373 - perf/total_num_tokens:1506857.000",
    ]) + "\n")
    old_run, new_run = read_verl_logs([old, new])
    assert (old_run.name, new_run.name) == ("gemma-2-2b-it-ppo", "qwen2-7b-fsdp2")
    assert _points(old_run)["test_score/openai/gsm8k"] == {0: 0.521}
    assert _points(old_run)["val/test_score/openai/gsm8k"] == {9: 0.546}
    assert _points(old_run)["critic/score/mean"] == {0: 0.012, 9: 0.394}
    assert _points(old_run)["critic/lr(1e-4)"] == {0: 0.1} and _points(old_run)["critic/kl"] == {0: -0.0}
    assert _points(new_run)["val-core/openai/gsm8k/reward/mean@1"] == {0: 0.229, 5: 0.856}
    assert _points(new_run)["val-core/openai/gsm8k/reward/best@1/mean"] == {0: 0.229}
    assert _points(new_run)["timing_s/step"] == {1: 179.003, 5: 219.373}
    assert _points(new_run)["perf/total_num_tokens"] == {1: 1503056.0, 5: 1506857.0}
    assert new_run.tags[OTHER_LINES_TAG] == "1"


def test_numbers_of_other_kinds_read_and_the_rest_is_skipped(tracking, capsys, tmp_path):
    capsys.readouterr()
    run = tracking("proj", "kinds", default_backend=["console"])
    run.log(data={"complex": 1 + 2j, "decimal": Decimal("1.5"), "fraction": Fraction(1, 4), "bool": True,
                  "int": 7, "tiny": 1e-07, "huge": 1e20, "inf": float("inf")}, step=3)
    log = tmp_path / "kinds.log"
    log.write_text(capsys.readouterr().out)
    assert "complex:(1+2j)" in log.read_text() and "fraction:Fraction(1, 4)" in log.read_text()
    (read,) = read_verl_logs([log])
    assert _points(read) == {"decimal": {3: 1.5}, "fraction": {3: 0.25}, "int": {3: 7.0}, "tiny": {3: 1e-07},
                             "huge": {3: 1e20}}


def test_a_step_logged_again_keeps_the_last_value(tmp_path):
    log = tmp_path / "resumed.log"
    log.write_text("step:1 - critic/score/mean:0.1\nstep:2 - critic/score/mean:0.2\n"
                   "step:2 - critic/score/mean:0.25\nstep:3 - critic/score/mean:0.3\n")
    (run,) = read_verl_logs(log)
    assert _points(run) == {"critic/score/mean": {1: 0.1, 2: 0.25, 3: 0.3}}


@pytest.mark.parametrize("name, text, said", [
    ("cut.log", "noise\nstep:1 - a:0.5\nstep:2 - a:0.5 - actor/pg_loss\nstep:3 - a:0.1\n",
     r"cut\.log: line 3: 'actor/pg_loss' is no `key:value` with a number"),
    ("ray.log", "(TaskRunner pid=1) step:2 - a:0.1 - b:hello\n", r"ray\.log: line 1: 'b:hello' is no `key:value`"),
    ("step.log", "step:1 - a:0.5\n\nstep:x - a:1\n", r"step\.log: line 3: step 'x' is not a whole number"),
    ("glued.log", "step:4 a:0.5\n", r"glued\.log: line 1: ' a:0.5' after step:4"),
    ("live.log", "step:1 - a:0.5\nstep:2 - a:0.",
     r"live\.log: line 2 \(the last, with no end of line: cut short\?\): 'a:0\.' is no"),
    ("cut.jsonl", '{"step": 1, "data": {"a": 0.1}}\n{"step": 2, "data": {"a": 0.',
     r"cut\.jsonl: line 2 \(the last, with no end of line: cut short\?\) is not JSON"),
    ("steps.jsonl", '{"step": 1, "data": {}}\n{"step": "two", "data": {}}\n',
     r"steps\.jsonl: line 2: step 'two' is not a whole number"),
    ("shape.jsonl", '{"step": 1, "data": {}}\n[1, 2]\n', r"shape\.jsonl: line 2 is no step"),
])
def test_a_malformed_step_line_is_refused_with_its_line_number(tmp_path, name, text, said):
    (tmp_path / name).write_text(text)
    with pytest.raises(MalformedStepLine, match=said) as err:
        read_verl_logs([tmp_path / name])
    assert "\n" not in str(err.value)


def test_files_without_verl_steps_are_refused_in_one_line(tmp_path):
    (tmp_path / "empty.log").write_text("")
    (tmp_path / "noise.log").write_text("Started a local Ray instance.\n\n(TaskRunner pid=1) step: 1 is to add\nok\n")
    (tmp_path / "bare.log").write_text("step:1\nstep:2 - flag:True\n")
    for name, said in (("empty.log", r"empty\.log is empty; expected verl's console logger's `step:N - key:value"),
                       ("noise.log", r"noise\.log: no verl step line in its 3 lines; expected verl's console"),
                       ("bare.log", r"bare\.log: 2 verl step lines, none with a number in it")):
        with pytest.raises(NoStepLines, match=said) as err:
            read_verl_logs([tmp_path / name])
        assert "\n" not in str(err.value)
    with pytest.raises(VerlLogNotFound, match="no verl log at .*missing.log"):
        read_verl_logs([tmp_path / "missing.log"])
    with pytest.raises(VerlLogNotFound, match="a directory"):
        read_verl_logs([tmp_path])
