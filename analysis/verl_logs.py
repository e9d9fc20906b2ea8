"""Runs from verl's own console and file loggers' output: `read_verl_logs(paths)` gives one `SourceRun` a file.

verl (https://github.com/verl-project/verl) logs a step's metrics through `verl.utils.tracking.Tracking`; two of its
backends write text a run leaves behind without any tracking server:
- `console` (`trainer.logger=[console]`): `LocalLogger.log` prints `concat_dict_to_str(data, step)` of
  verl/utils/logger/aggregate_logger.py, one line a step: `step:N - key:value - key:value ...`, the keys as logged,
  joined with " - ", and only the values that are a `numbers.Number`. Since verl commit
  18c6ffcf08ea2196a1d4ef0800d7a952c52f84db (2025-07-04, PR #2303) a value is `pprint.pformat(v)`: Python's repr, so
  a float is written in full (`0.3333333333333333`, `1e-07`, `nan`, `inf`), numpy 2's scalars as
  `np.float64(0.25)` / `np.float32(0.7)` / `np.int64(3)`, a bool as `True` (a Number, skipped here), a complex as
  `(1+2j)` (skipped); before it, `f"{v:.3f}"` (`0.012`, `-0.000`: three decimals, as every log of verl-data's
  baselines has it). Nothing is escaped, so a key holding ":" or " - " appears as it is (`x:y:4`, `k - j:2.5`): a
  field is split at its last ":" before a value of those forms, and a fragment that ends in no such value is part of
  the next field's key (a key "a:1 - b" would read as two fields; verl's keys hold neither). verl runs under Ray, whose
  driver log prefixes each line of an actor with its name and pid, often in colour
  (`\\x1b[36m(TaskRunner pid=1234)\\x1b[0m step:3 - ...`; `(main_task pid=...)` in verl 2024), interleaved with every
  other line the job prints (the config, progress bars, the validation samples): those are counted and skipped.
  verl validates before training (`trainer.val_before_train`, default True) and logs it at step 0 as a line of its
  own (`val-core/<data source>/reward/mean@N`; verl 2024, when it logged it, named it `test_score/<data source>`
  there and `val/test_score/<data source>` in training, which began at step 0 too, so step 0 held two lines). A line
  is one of verl's where, after Ray's prefix, it starts with `step:` and no space: one that goes on otherwise than
  `step:N - key:value - ...` is refused, naming its file and line (the last line, with no end of line, said to be
  perhaps cut short: verl ends every line it writes);
- `file`: `FileLogger.log` of verl/utils/tracking.py writes JSON Lines, `{"step": N, "data": {...}}` a line, with
  orjson (OPT_SERIALIZE_NUMPY: numpy scalars as numbers, arrays as lists; NaN and inf as null), to
  `$VERL_FILE_LOGGER_ROOT/<project_name>/<experiment_name>.jsonl` (or `$VERL_FILE_LOGGER_PATH`), opened anew at
  each start (verl commit 7bc70bbf0b6c3f46646d906824940fe7e38860d3, 2025-09-06, PR #3363).
Both as in the wheel verl==0.9.1 on PyPI (sha256 db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14);
its aggregate_logger.py is the blob of verl-project/verl at 1dda039b9c6311889a9c9a26040677e1254814f9 (main,
2026-08-22) and at tag v0.9.0 (483b8a009ba3a97563edee3a19887e4862b8094a); its FileLogger is that commit's.

A file's form is told from its content: the file logger's where its first non-blank line is a JSON object with a
"step", else a console log. A run is named by the file's stem (the file logger's is the experiment name; a console
log carries none but in the config it prints, where verl-data's 2024 PPO baselines all keep the example script's
`gemma2b_function_rm`): two files of one name are refused. Of a step logged twice (a resumed run appended to its
log), the value logged last wins (`series_of`). A value that is not a finite number (a bool, a complex, a string, a
list, NaN, inf) is skipped, in both forms alike: the file logger cannot write NaN or inf, so one run logged to both
reads the same from either. Neither form has a clock: the series have no times. A run's tags say what was read:
`verl.form` (console, file), `verl.step_lines` and `verl.other_lines` (the lines skipped as not verl's),
`verl.path`.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from analysis.sources import Series, SourceRun, series_of
from analysis.tables import TableError

CONSOLE = "console"
FILE = "file"
FORM_TAG = "verl.form"
STEP_LINES_TAG = "verl.step_lines"
OTHER_LINES_TAG = "verl.other_lines"
PATH_TAG = "verl.path"
EXPECTED = ("verl's console logger's `step:N - key:value - ...` lines, or its file logger's JSON Lines "
            "`{\"step\": N, \"data\": {...}}`")

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # Ray's colours around an actor's prefix
RAY_PREFIX = re.compile(r"\((?:[^()]*\s)?pid=\d+[^()]*\)\s")  # `(TaskRunner pid=1234) `, `(pid=7, ip=10.0.0.1) `
RAY_DEDUP = re.compile(r"\s*\[repeated \d+x across cluster\].*$")  # Ray's log deduplication's suffix
STEP_LINE = re.compile(r"step:(?P<step>\S+)(?P<rest>.*)$")
UNSIGNED = r"(?:\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|inf)"  # repr's and `:.3f`'s: never "0." nor ".5"
NUMBER = rf"[-+]?{UNSIGNED}"
VALUES = (  # what pprint.pformat writes for a numbers.Number (and `:.3f` before it): how each reads, None: skipped
    (re.compile(NUMBER), lambda found: float(found.group(0))),
    (re.compile(rf"np\.\w+\('?({NUMBER})'?\)"), lambda found: float(found.group(1))),  # np.float64(0.5)
    (re.compile(rf"Decimal\('({NUMBER})'\)"), lambda found: float(found.group(1))),
    (re.compile(r"Fraction\((-?\d+), (\d+)\)"), lambda found: int(found.group(1)) / int(found.group(2))),
    (re.compile(r"True|False"), None),
    (re.compile(rf"\({NUMBER}[-+]{UNSIGNED}j\)|{NUMBER}j|np\.complex\w*\(.*\)"), None),
)
FIELD = re.compile(r"(?P<key>.+):(?P<value>" + "|".join(f"(?:{pattern.pattern})" for pattern, _ in VALUES) + ")")


class VerlLogError(TableError):
    """A verl log that cannot be read as a run: the CLI prints its one line and exits 2."""


class VerlLogNotFound(VerlLogError):
    pass


class NoStepLines(VerlLogError):
    """A file with no step of verl's in it (or steps with no number)."""


class MalformedStepLine(VerlLogError):
    """A line that starts as verl's step lines do and does not go on as they do."""


class DuplicateRunName(VerlLogError):
    pass


def read_verl_logs(paths) -> list[SourceRun]:
    """One run a file (a path, or several), in the order given; each file's form is read from its content."""
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(path) for path in paths]
    if not paths:
        raise VerlLogNotFound(f"no verl log given ({EXPECTED})")
    runs = [_read_one(path) for path in paths]
    _refuse_duplicates(runs)
    return runs


def _read_one(path: Path) -> SourceRun:
    if not path.is_file():
        raise VerlLogNotFound(f"no verl log at {path}" + (" (a directory: give its log files)" if path.is_dir()
                                                            else ""))
    lines = path.read_text(encoding="utf-8-sig", errors="replace").split("\n")
    first = next((line for line in lines if line.strip()), None)
    if first is None:
        raise NoStepLines(f"{path} is empty; expected {EXPECTED}")
    form = FILE if _is_file_logger_line(first) else CONSOLE
    points, step_lines, other_lines = (_file_points if form == FILE else _console_points)(path, lines)
    if not step_lines:
        raise NoStepLines(f"{path}: no verl step line in its {other_lines} lines; expected {EXPECTED}")
    if not points:
        raise NoStepLines(f"{path}: {step_lines} verl step lines, none with a number in it")
    tags = {FORM_TAG: form, STEP_LINES_TAG: str(step_lines), OTHER_LINES_TAG: str(other_lines), PATH_TAG: str(path)}
    return _source_run(path.stem, {name: series_of(found) for name, found in points.items()}, tags)


def _refuse_duplicates(runs: list[SourceRun]) -> None:
    seen: dict[str, str] = {}
    for run in runs:
        path, held = run.tags[PATH_TAG], seen.get(run.name)
        if held is not None:
            raise DuplicateRunName(f"{path} is given twice" if held == path else
                                   f"two verl logs name the run {run.name!r}: {held} and {path} (a run is named by "
                                   "its file's stem: rename one)")
        seen[run.name] = path


# ---- the console logger's lines ----------------------------------------------------------------------------


def _console_points(path: Path, lines: list[str]) -> tuple[dict[str, list], int, int]:
    """metric -> [(step, value, None)] in file order, and the counts of step lines and of the other lines."""
    points: dict[str, list] = {}
    step_lines = other_lines = 0
    for number, line in enumerate(lines, start=1):
        found = _step_line(line)
        if found is None:
            other_lines += bool(line.strip())
            continue
        step_lines += 1
        step, fields = _parse_step_line(path, number, found, cut=number == len(lines) and bool(line))
        for key, value in fields:
            points.setdefault(key, []).append((step, value, None))
    return points, step_lines, other_lines


def _step_line(line: str) -> re.Match | None:
    """The line's `step:...` part, where the line is one of verl's step lines (after Ray's prefix, if any)."""
    clean = RAY_DEDUP.sub("", ANSI.sub("", line.rstrip("\r")))
    clean = clean.rsplit("\r", 1)[-1]  # a progress bar redrawn on the same line before it
    prefix = RAY_PREFIX.match(clean)
    return STEP_LINE.match(clean, prefix.end() if prefix else 0)


def _parse_step_line(path: Path, number: int, found: re.Match, cut: bool) -> tuple[int, list[tuple[str, float]]]:
    """The step and the (key, value) fields with a number; a line that does not parse is refused."""
    where = f"{path}: line {number}" + (" (the last, with no end of line: cut short?)" if cut else "")
    step, rest = found.group("step"), found.group("rest")
    if not re.fullmatch(r"-?\d+", step):
        raise MalformedStepLine(f"{where}: step {step!r} is not a whole number (verl writes `step:N - key:value`)")
    if rest and not rest.startswith(" - "):
        raise MalformedStepLine(f"{where}: {_show(rest)} after step:{step}; verl writes `step:N - key:value - ...`")
    fields, pending = [], []
    for piece in rest.split(" - ")[1:]:
        pending.append(piece)
        field = FIELD.fullmatch(" - ".join(pending))
        if field is not None:
            fields.append((field.group("key"), field.group("value")))
            pending = []
    if pending:
        raise MalformedStepLine(f"{where}: {_show(' - '.join(pending))} is no `key:value` with a number (verl "
                                "writes `step:N - key:value - ...`)")
    return int(step), [(key, value) for key, text in fields if (value := _value(text)) is not None]


def _value(text: str) -> float | None:
    """A field's value as verl printed it, None where it is no finite number."""
    for pattern, read in VALUES:
        found = pattern.fullmatch(text)
        if found is not None:
            value = read(found) if read is not None else None
            return value if value is not None and math.isfinite(value) else None
    return None


def _show(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


# ---- the file logger's JSON Lines --------------------------------------------------------------------------


def _is_file_logger_line(line: str) -> bool:
    try:
        point = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(point, dict) and "step" in point


def _file_points(path: Path, lines: list[str]) -> tuple[dict[str, list], int, int]:
    """metric -> [(step, value, None)] in file order, and the count of lines (every line is a step's)."""
    points: dict[str, list] = {}
    step_lines = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        step, data = _file_line(path, number, line, cut=number == len(lines))
        step_lines += 1
        for key, value in data.items():
            if _is_finite_number(value):
                points.setdefault(str(key), []).append((step, float(value), None))
    return points, step_lines, 0


def _file_line(path: Path, number: int, line: str, cut: bool) -> tuple[int, dict]:
    where = f"{path}: line {number}" + (" (the last, with no end of line: cut short?)" if cut else "")
    shape = "verl's file logger writes {\"step\": N, \"data\": {...}} a line"
    try:
        point = json.loads(line)
    except json.JSONDecodeError as err:
        raise MalformedStepLine(f"{where} is not JSON ({err.msg}); {shape}") from None
    if not isinstance(point, dict) or "step" not in point or not isinstance(point.get("data"), dict):
        raise MalformedStepLine(f"{where} is no step ({_show(line)}); {shape}")
    step = point["step"]
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not float(step).is_integer():
        raise MalformedStepLine(f"{where}: step {step!r} is not a whole number; {shape}")
    return int(step), point["data"]


def _is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ---- points to a run ---------------------------------------------------------------------------------------


def _source_run(name: str, series: dict[str, Series], tags: dict) -> SourceRun:
    def load(metric: str) -> Series:
        if metric not in series:
            raise VerlLogError(f"run {name!r} has no metric {metric!r}; it has: "
                               + ", ".join(repr(key) for key in series))
        return series[metric]

    return SourceRun(id=name, name=name, metrics=tuple(series), load=load, tags=tags)
