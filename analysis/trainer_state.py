"""Runs from HF Trainer's `trainer_state.json`: `read_trainer_states(paths)` gives the `SourceRun`s they hold.

The file is what transformers' `TrainerState.save_to_json` writes (transformers 5.19 when written:
`json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True)`) into every checkpoint folder
`<output_dir>/checkpoint-<global_step>/` of HF's Trainer, and so of TRL's trainers, and into `<output_dir>` itself
where `Trainer.save_state()` is called. Its `log_history` is every log call of the run so far, in order: training
entries (`loss`, `grad_norm`, `learning_rate`, `epoch`, TRL's `reward`, `rewards/<func>/mean`, ...), evaluation entries
(`eval_loss`, `eval_reward`, `eval_runtime`, ...) and, in a state saved after training, one summary entry at the last
step (`train_runtime`, `train_loss`, `total_flos`, ...); each entry has its `step` (the state's global_step). Every
number of an entry but its `step` is a point of a metric at that step (a summary's figures are one-point metrics);
text and nulls are skipped. Of a step a metric has twice (a resumed run logs again), the entry logged last wins. The
file has no clock: the series have no times and the runs no start. The state's own settings (`train_batch_size`,
`max_steps`, `num_train_epochs`, `logging_steps`, `eval_steps`, `save_steps`, a search's `trial_params`) are the run's
params, as text (MLflow's form).

A path is a `trainer_state.json` (or any file of that form), a folder holding one (a checkpoint folder, or an
output_dir where save_state wrote it), a run's output_dir (its newest checkpoint read: the highest N of
`checkpoint-N`, whose log_history holds the whole history), or a folder of runs (each subfolder one of the last
two). A run is named by its output_dir (the folder above `checkpoint-N`), else by the folder that holds its file, else
by the file's stem where the file has a name of its own; names must be distinct.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from analysis.sources import Series, SourceRun, series_of
from analysis.tables import TableError

STATE_FILE = "trainer_state.json"  # transformers' TRAINER_STATE_NAME
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")  # transformers' PREFIX_CHECKPOINT_DIR, "checkpoint-<step>"
HISTORY = "log_history"
STEP = "step"
SETTINGS = ("train_batch_size", "max_steps", "num_train_epochs", "logging_steps", "eval_steps", "save_steps")
TRIAL_PARAMS = "trial_params"


class TrainerStateError(TableError):
    """A trainer_state.json (or a folder of them) that cannot be read as runs: the CLI prints its one line and
    exits 2."""


class TrainerStateNotFound(TrainerStateError):
    pass


class BadTrainerState(TrainerStateError):
    """Not JSON, no log_history, or an entry without a step."""


class DuplicateRunName(TrainerStateError):
    pass


def read_trainer_states(paths) -> list[SourceRun]:
    """The runs of the given paths (a path or several), in the order given (a folder of runs: by name)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    found = [located for path in paths for located in _locate(Path(path))]
    if not found:
        raise TrainerStateNotFound("no trainer_state.json given")
    _distinct(found)
    return [_read_run(name, file) for name, file in found]


# ---- where the files are ------------------------------------------------------------------------------------


def _locate(path: Path) -> list[tuple[str, Path]]:
    """(run name, its trainer_state.json) for each run at `path`."""
    if path.is_file():
        return [(_file_run_name(path), path)]
    if not path.is_dir():
        raise TrainerStateNotFound(f"no trainer_state.json, checkpoint folder or folder of runs at {path}")
    own = _run_file(path)
    if own is not None:
        return [(_folder_run_name(path), own)]
    runs = [(_folder_run_name(sub), file) for sub in sorted(path.iterdir())
            if sub.is_dir() and (file := _run_file(sub)) is not None]
    if not runs:
        raise TrainerStateNotFound(f"{path}: no {STATE_FILE} in it, in a checkpoint-N folder of it, nor in its "
                                   f"subfolders' (<run>/{STATE_FILE}, <run>/checkpoint-N/{STATE_FILE})")
    return runs


def _run_file(folder: Path) -> Path | None:
    """The folder's own trainer_state.json, else its newest checkpoint's (highest N), else None."""
    if (folder / STATE_FILE).is_file():
        return folder / STATE_FILE
    checkpoints = [(int(match.group(1)), sub) for sub in folder.iterdir()
                   if sub.is_dir() and (match := CHECKPOINT.match(sub.name)) and (sub / STATE_FILE).is_file()]
    return max(checkpoints)[1] / STATE_FILE if checkpoints else None


def _folder_run_name(folder: Path) -> str:
    folder = folder.resolve()
    return folder.parent.name if CHECKPOINT.match(folder.name) else folder.name


def _file_run_name(file: Path) -> str:
    return _folder_run_name(file.parent) if file.name == STATE_FILE else file.stem


def _distinct(found: list[tuple[str, Path]]) -> None:
    seen: dict[str, Path] = {}
    for name, file in found:
        if name in seen:
            raise DuplicateRunName(f"two runs named {name!r}: {seen[name]} and {file} (a run is named by its "
                                   "output_dir; give each run a folder of its own)")
        seen[name] = file


# ---- one file -----------------------------------------------------------------------------------------------


def _read_run(name: str, file: Path) -> SourceRun:
    state = _load(file)
    points: dict[str, list] = {}
    for index, entry in enumerate(state[HISTORY], start=1):
        step = _step(file, index, entry)
        for key, value in entry.items():
            if key != STEP and _is_number(value):
                points.setdefault(key, []).append((step, float(value), None))
    if not points:
        raise BadTrainerState(f"{file}: its {HISTORY} holds no metric ({len(state[HISTORY])} entries; a state saved "
                              "before the first log call? read a later checkpoint)")
    series = {key: series_of(found) for key, found in points.items()}

    def load(metric: str) -> Series:
        if metric not in series:
            raise TrainerStateError(f"run {name!r} has no metric {metric!r}; it has: "
                                    + ", ".join(repr(key) for key in series))
        return series[metric]

    return SourceRun(id=name, name=name, metrics=tuple(series), load=load, params=_params(state))


def _load(file: Path) -> dict:
    try:
        state = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise BadTrainerState(f"{file}: not JSON text ({err})") from None
    except json.JSONDecodeError as err:
        raise BadTrainerState(f"{file}: not JSON (line {err.lineno}: {err.msg})") from None
    if not isinstance(state, dict) or HISTORY not in state:
        keys = ", ".join(sorted(state)[:8]) if isinstance(state, dict) else f"a JSON {type(state).__name__}"
        raise BadTrainerState(f"{file}: no {HISTORY!r} (holds: {keys or 'nothing'}); a trainer_state.json is what "
                              "HF's Trainer saves in each checkpoint-N folder")
    if not isinstance(state[HISTORY], list):
        raise BadTrainerState(f"{file}: its {HISTORY!r} is a JSON {type(state[HISTORY]).__name__}, not a list")
    return state


def _step(file: Path, index: int, entry) -> int:
    if not isinstance(entry, dict):
        raise BadTrainerState(f"{file}: {HISTORY} entry {index} is a JSON {type(entry).__name__}, not an object")
    if STEP not in entry:
        raise BadTrainerState(f"{file}: {HISTORY} entry {index} has no {STEP!r} (it has: "
                              + ", ".join(entry) + ")")
    step = entry[STEP]
    if not _is_number(step) or not float(step).is_integer():
        raise BadTrainerState(f"{file}: {HISTORY} entry {index}: its {STEP!r} {step!r} is not a whole step")
    return int(step)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # json reads NaN too: kept, as a point


def _params(state: dict) -> dict[str, str]:
    params = {key: str(state[key]) for key in SETTINGS if state.get(key) is not None}
    trial = state.get(TRIAL_PARAMS)
    if isinstance(trial, dict):
        params.update({key: str(value) for key, value in trial.items()})
    return params
