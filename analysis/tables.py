"""Runs from a file of curves (CSV, Parquet, JSON Lines): `read_table(path)` gives the `SourceRun`s it holds.

Two forms, told apart by their columns (docs/bring-your-own-runs.md):
- a long table, one point a row: a `run` column, then `variant`, `step`, `time`/`timestamp` (all optional) and the
  metrics (`reward`, `compute`, ...: every other column that holds numbers). A run without a `step` column gets the
  steps 0, 1, 2, ... in the order of its rows in the file; rows of one run need not be contiguous. The `variant`
  (constant within a run) goes into the run's tags as tags["variant"], and so does any text column constant within
  the run (tags[column]); a JSON Lines file is read in this form only;
- W&B's chart export (a line chart's "Export CSV"): the chart's x-axis first (`Step`, or the metric it was drawn
  against), then for every run drawn and every metric `<run> - <metric>` with its companions `<run> - <metric>__MIN`
  and `<run> - <metric>__MAX`, an empty cell where the run has no point at that x. The companions are the chart's
  sampling band, not data: they are skipped. A chart drawn against another metric keeps that x column as a metric of
  every run; the steps are then the runs' own `<run> - _step` columns where the export has them (W&B writes them for
  such a chart), else the row order. The shape is as W&B's issues show it (the companions:
  https://github.com/wandb/wandb/issues/5222, https://github.com/wandb/wandb/issues/5349): the header
  `"Step","<run> - <metric>","<run> - <metric>__MIN","<run> - <metric>__MAX",...`, every cell quoted.
- a wide table, the commonest hand-made export: a step column first (`step`, `Step`, `global_step`, `_step`,
  `iteration`), then one column a run holding its reward (an empty cell where it has no point): each run's metric is
  `reward`. A first column `compute` (GPU-hours) instead gives each run the metric `compute` too, its steps the row
  order. No other column may be named like a long table's (`reward`, `variant`, `compute`, `time`): such a file is a
  long table lacking its `run` column, and is refused so.
A file has no clock unless it has a `time` or `timestamp` column (seconds since the epoch, or ISO 8601; a time with
no zone is UTC): then the series keep those times, and a run's start is its first.
"""

from __future__ import annotations

import csv
import difflib
import json
import math
from datetime import datetime, timezone
from pathlib import Path

from analysis.runs import AnalysisError
from analysis.sources import Series, SourceRun, series_of

RUN = "run"
VARIANT = "variant"
STEP = "step"
TIME_COLUMNS = ("time", "timestamp")  # the first of these the file has is its clock
WANDB_STEP = "Step"  # the x column of a W&B chart drawn against the step
WANDB_SEP = " - "  # `<run> - <metric>`
WANDB_BAND = ("__MIN", "__MAX")  # the companions of a W&B chart export's columns: the chart's band, not data
WANDB_RUN_STEP = "_step"  # `<run> - _step`: the run's step where the chart's x-axis is another metric
WIDE_STEPS = ("step", "steps", "global_step", "_step", "iteration", "iter")  # a wide table's first column (any case)
WIDE_COMPUTE = "compute"
WIDE_METRIC = "reward"  # what a wide table's cells are
LONG_NAMES = ("reward", "variant", "compute", "time", "timestamp", "step")  # a long table's columns, not runs


class TableError(AnalysisError):
    """A file of curves that cannot be read as runs: the CLI prints its one line and exits 2."""


class TableNotFound(TableError):
    pass


class UnknownTableFormat(TableError):
    """An extension other than .csv, .parquet, .jsonl, .ndjson."""


class EmptyTable(TableError):
    pass


class UnknownTableShape(TableError):
    """Neither a long table (a `run` column) nor a W&B chart export."""


class BadTableValue(TableError):
    """A cell that should hold a number (a metric, a step, a time) and does not."""


class ConflictingPoints(TableError):
    """A run given two values at one step of one metric, or two variants."""


def read_table(path) -> list[SourceRun]:
    """The runs of a file of curves, in the order they first appear in it; its form is read from its columns."""
    path = Path(path)
    if not path.is_file():
        raise TableNotFound(f"no file of curves at {path}" + (" (a directory)" if path.is_dir() else ""))
    suffix = path.suffix.lower()
    if suffix not in READERS:
        raise UnknownTableFormat(f"{path}: unknown extension {path.suffix or '(none)'!r}; a file of curves is "
                                 + ", ".join(READERS))
    columns, rows = READERS[suffix](path)
    if not columns:
        raise EmptyTable(f"{path} is empty")
    if not rows:
        raise EmptyTable(f"{path} has columns ({_names(columns)}) but no rows")
    if RUN in columns:
        return _long_runs(path, columns, rows)
    if suffix == ".csv" or suffix == ".parquet":
        if _is_wandb_export(columns):
            return _wandb_runs(path, columns, rows)
        if _is_wide(columns):
            return _wide_runs(path, columns, rows)
    raise UnknownTableShape(_shape_problem(path, columns, suffix))


# ---- reading the cells: (columns, rows), a row is (where, {column: cell}) with where "line 3" or "row 3" ---------


def _read_csv(path: Path) -> tuple[list[str], list[tuple[str, dict]]]:
    with path.open(newline="", encoding="utf-8-sig") as fh:  # -sig: a spreadsheet's BOM is not part of the header
        reader = csv.reader(fh)
        try:
            header = next(reader, [])
            _unique(path, header)
            rows = []
            for cells in reader:
                if not any(cell.strip() for cell in cells):
                    continue  # a blank line
                if len(cells) > len(header) and any(cell.strip() for cell in cells[len(header):]):
                    raise TableError(f"{path}: line {reader.line_num} has {len(cells)} cells, the header has "
                                     f"{len(header)}")
                rows.append((f"line {reader.line_num}", dict(zip(header, cells))))
        except (csv.Error, UnicodeDecodeError) as err:
            raise TableError(f"{path}: not a CSV file of UTF-8 text (line {reader.line_num}: {err})") from None
    return header, rows


def _read_parquet(path: Path) -> tuple[list[str], list[tuple[str, dict]]]:
    try:
        import pyarrow.parquet as pq  # installed with MLflow; imported here, only a Parquet file needs it

        table = pq.read_table(path)
    except ImportError:
        raise TableError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    except Exception as err:  # pyarrow's errors for a file that is not Parquet are of several kinds
        raise TableError(f"{path}: not a Parquet file ({type(err).__name__}: {err})") from None
    _unique(path, table.column_names)
    return list(table.column_names), [(f"row {i + 1}", row) for i, row in enumerate(table.to_pylist())]


def _read_jsonl(path: Path) -> tuple[list[str], list[tuple[str, dict]]]:
    columns: dict[str, None] = {}  # every key any line has, in the order they first appear
    rows = []
    try:
        lines = path.read_text(encoding="utf-8-sig").split("\n")
    except UnicodeDecodeError as err:
        raise TableError(f"{path}: not a JSON Lines file of UTF-8 text ({err})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            point = json.loads(line)
        except json.JSONDecodeError as err:
            raise TableError(f"{path}: line {number} is not JSON ({err.msg})") from None
        if not isinstance(point, dict):
            raise TableError(f"{path}: line {number} is a JSON {type(point).__name__}, not an object (one point a "
                             f"line: {{\"run\": ..., \"step\": ..., \"reward\": ...}})")
        columns.update(dict.fromkeys(point))
        rows.append((f"line {number}", point))
    return list(columns), rows


READERS = {".csv": _read_csv, ".parquet": _read_parquet, ".jsonl": _read_jsonl, ".ndjson": _read_jsonl}


def _unique(path: Path, columns) -> None:
    seen = set()
    for name in columns:
        if name in seen:
            raise TableError(f"{path}: the column {name!r} appears twice (a W&B export names a run by its display "
                             "name: give the runs distinct names)")
        seen.add(name)


# ---- the long form ------------------------------------------------------------------------------------------


def _long_runs(path: Path, columns: list[str], rows) -> list[SourceRun]:
    clock = next((name for name in TIME_COLUMNS if name in columns), None)
    data = [name for name in columns if name not in (RUN, VARIANT, STEP, clock)]
    metrics = [name for name in data if any(_is_number(cell) for _, cell in _cells(rows, name))]
    texts = [name for name in data if name not in metrics]

    by_run: dict[str, list] = {}  # run -> [(where, row)], in file order
    for where, row in rows:
        run = _text(row.get(RUN))
        if run is None:
            raise BadTableValue(f"{path}: {where} has no {RUN!r}")
        by_run.setdefault(run, []).append((where, row))

    runs = []
    for run, own in by_run.items():
        points: dict[str, list] = {name: [] for name in metrics}  # metric -> [(step, value, time, where)]
        for index, (where, row) in enumerate(own):
            step = _step(path, where, row.get(STEP)) if STEP in columns else index
            time = _time(path, where, clock, row.get(clock)) if clock else None
            for name in metrics:
                value = _number(path, where, name, row.get(name))
                if value is not None:
                    points[name].append((step, value, time, where))
        tags = {name: value for name in ([VARIANT] if VARIANT in columns else []) + texts
                if (value := _constant(path, run, name, own, refuse=name == VARIANT)) is not None}
        series = {name: _series(path, run, name, found) for name, found in points.items() if found}
        runs.append(_source_run(run, series, tags))
    return runs


def _constant(path: Path, run: str, column: str, own, refuse: bool) -> str | None:
    """The one value a run has in a column (None where it has none, or several and `refuse` is off)."""
    values = {}
    for where, row in own:
        value = _text(row.get(column))
        if value is not None:
            values.setdefault(value, where)
    if len(values) > 1 and refuse:
        (first, at), (second, then) = list(values.items())[:2]
        raise ConflictingPoints(f"{path}: run {run!r} has two {column}s, {first!r} ({at}) and {second!r} ({then}); "
                                f"a run is one {column} (name its seeds as runs of their own)")
    return next(iter(values)) if len(values) == 1 else None


# ---- W&B's chart export -------------------------------------------------------------------------------------


def _is_wandb_export(columns: list[str]) -> bool:
    return len(columns) >= 2 and all(WANDB_SEP in name for name in columns[1:])


def _wandb_runs(path: Path, columns: list[str], rows) -> list[SourceRun]:
    axis = columns[0]
    by_run: dict[str, dict[str, str]] = {}  # run -> {metric: column}, in the order the export lists them
    for column in columns[1:]:
        if column.endswith(WANDB_BAND):
            continue
        run, metric = column.rsplit(WANDB_SEP, 1)  # a run's name may hold " - " ("Group: a - b"); a metric's seldom
        by_run.setdefault(run.strip(), {})[metric.strip()] = column

    runs = []
    for run, named in by_run.items():
        own_step = named.pop(WANDB_RUN_STEP, None)
        points: dict[str, list] = {name: [] for name in named}
        if axis != WANDB_STEP:
            points[axis] = []
        for index, (where, row) in enumerate(rows):
            values = {name: _number(path, where, column, row.get(column)) for name, column in named.items()}
            if all(value is None for value in values.values()):
                continue  # the run has no point at this x
            if axis == WANDB_STEP:
                step = _step(path, where, row.get(axis), column=axis)
            elif own_step is not None and _number(path, where, own_step, row.get(own_step)) is not None:
                step = _step(path, where, row.get(own_step), column=own_step)
            else:
                step = index
            if axis != WANDB_STEP:
                values[axis] = _number(path, where, axis, row.get(axis))
            for name, value in values.items():
                if value is not None:
                    points[name].append((step, value, None, where))
        series = {name: _series(path, run, name, found) for name, found in points.items() if found}
        if series:
            runs.append(_source_run(run, series, {}))
    if not runs:
        raise EmptyTable(f"{path}: a W&B chart export with no point in it (columns: {_names(columns)})")
    return runs


# ---- the wide form -----------------------------------------------------------------------------------------


def _is_wide(columns: list[str]) -> bool:
    first = columns[0].strip().lower()
    return (len(columns) >= 2 and (first in WIDE_STEPS or first == WIDE_COMPUTE)
            and not any(name.strip().lower() in LONG_NAMES for name in columns[1:]))


def _wide_runs(path: Path, columns: list[str], rows) -> list[SourceRun]:
    axis = columns[0]
    by_steps = axis.strip().lower() in WIDE_STEPS
    runs = []
    for column in columns[1:]:
        points: dict[str, list] = {WIDE_METRIC: []} | ({} if by_steps else {WIDE_COMPUTE: []})
        for index, (where, row) in enumerate(rows):
            value = _number(path, where, column, row.get(column))
            if value is None:
                continue  # the run has no point on this row
            step = _step(path, where, row.get(axis), column=axis) if by_steps else index
            points[WIDE_METRIC].append((step, value, None, where))
            if not by_steps:
                compute = _number(path, where, axis, row.get(axis))
                if compute is None:
                    raise BadTableValue(f"{path}: {where} has no {axis!r}")
                points[WIDE_COMPUTE].append((step, compute, None, where))
        series = {name: _series(path, column.strip(), name, found) for name, found in points.items() if found}
        if series:
            runs.append(_source_run(column.strip(), series, {}))
    if not runs:
        raise EmptyTable(f"{path}: a wide table ({axis!r}, then a column a run) with no point in it")
    return runs


# ---- points to runs -----------------------------------------------------------------------------------------


def _series(path: Path, run: str, metric: str, points) -> Series:
    """One metric of one run; a step given twice must give one value (the same value twice is one point)."""
    first: dict[int, tuple[float, str]] = {}
    for step, value, _, where in points:
        held = first.setdefault(step, (value, where))
        if held[0] != value and not (math.isnan(held[0]) and math.isnan(value)):
            raise ConflictingPoints(f"{path}: run {run!r} has two values of {metric!r} at step {step}: {held[0]!r} "
                                    f"({held[1]}) and {value!r} ({where})")
    unique = {}
    for step, value, time, _ in points:
        unique.setdefault(step, (step, value, time))
    return series_of(unique.values())


def _source_run(name: str, series: dict[str, Series], tags: dict) -> SourceRun:
    def load(metric: str) -> Series:
        if metric not in series:
            raise TableError(f"run {name!r} has no metric {metric!r}; it has: {_names(series)}")
        return series[metric]

    starts = [float(s.time.min()) for s in series.values() if s.time is not None and s.time.size]
    return SourceRun(id=name, name=name, metrics=tuple(series), load=load, tags=tags,
                     start_time=min(starts) if starts else None)


# ---- cells --------------------------------------------------------------------------------------------------


def _cells(rows, column: str):
    return ((where, row.get(column)) for where, row in rows if not _empty(row.get(column)))


def _empty(cell) -> bool:
    return cell is None or (isinstance(cell, str) and not cell.strip())


def _is_number(cell) -> bool:
    if isinstance(cell, bool):
        return False
    if isinstance(cell, (int, float)):
        return True
    try:
        float(cell)
        return True
    except (TypeError, ValueError):
        return False


def _number(path: Path, where: str, column: str, cell) -> float | None:
    """A metric's cell as a float; None where it is empty (no point there)."""
    if _empty(cell):
        return None
    if not _is_number(cell):
        raise BadTableValue(f"{path}: {where}, column {column!r}: {cell!r} is not a number")
    return float(cell)


def _step(path: Path, where: str, cell, column: str = STEP) -> int:
    value = _number(path, where, column, cell)
    if value is None:
        raise BadTableValue(f"{path}: {where} has no {column!r}")
    if not value.is_integer():
        raise BadTableValue(f"{path}: {where}, column {column!r}: {cell!r} is not a whole step")
    return int(value)


def _time(path: Path, where: str, column: str, cell) -> float:
    """Seconds since the epoch, from a number of seconds, an ISO 8601 string or a timestamp (Parquet's)."""
    if _empty(cell):
        raise BadTableValue(f"{path}: {where} has no {column!r} (a file with a clock gives every point a time)")
    if isinstance(cell, datetime):
        moment = cell
    elif _is_number(cell):
        return float(cell)
    else:
        try:
            moment = datetime.fromisoformat(str(cell).strip())
        except ValueError:
            raise BadTableValue(f"{path}: {where}, column {column!r}: {cell!r} is neither seconds since the epoch "
                                "nor an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _text(cell) -> str | None:
    """A name or a tag as text: 3.0 and "3" are both "3"."""
    if _empty(cell):
        return None
    if isinstance(cell, float) and cell.is_integer():
        return str(int(cell))
    return str(cell).strip()


def _names(columns) -> str:
    return ", ".join(repr(name) for name in columns) or "none"


def _shape_problem(path: Path, columns: list[str], suffix: str) -> str:
    found = f"columns found: {_names(columns)}"
    near = [name for name in columns if name.lower() == RUN] or difflib.get_close_matches(RUN, columns, n=1,
                                                                                          cutoff=0.5)
    hint = f"; did you mean {near[0]!r}? (column names are matched as written)" if near else ""
    if suffix in (".jsonl", ".ndjson"):
        return f"{path}: no {RUN!r} key ({found}){hint}; a JSON Lines file of curves is one point a line, with a run"
    return (f"{path}: no {RUN!r} column ({found}){hint}; a file of curves is a long table (a {RUN!r} column, one "
            f"point a row), a W&B chart export ({WANDB_STEP!r}, then '<run>{WANDB_SEP}<metric>' columns) or a wide "
            f"table ({STEP!r}, then a column a run)")
