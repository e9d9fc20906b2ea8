"""Files of curves read as runs (analysis/tables.py): one table written as CSV, Parquet and JSON Lines gives the same
runs; the same curves as a long table and as W&B's chart export give the same runs; the W&B file is written as W&B
writes it (every cell quoted, `__MIN`/`__MAX` companions, empty cells where a run has no point); each bad file gets
its one line.
"""

import csv
import json
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.runs import AnalysisError
from analysis.tables import (
    BadTableValue,
    ConflictingPoints,
    EmptyTable,
    TableError,
    TableNotFound,
    UnknownTableFormat,
    UnknownTableShape,
    read_table,
)

# Two seeds of the base and one of a variant, their rows interleaved as a logger that appends as runs go writes
# them; `seed-b` has no compute at step 20 (an empty cell, no point), `note` is a text column (a tag).
COLUMNS = ["run", "variant", "step", "compute", "reward", "note"]
ROWS = [
    ["seed-a", "base", 0, 0.0, 0.10, "first"],
    ["seed-b", "base", 0, 0.0, 0.12, "second"],
    ["no-kl", "no_kl", 0, 0.0, 0.11, "third"],
    ["seed-a", "base", 10, 2.5, 0.30, "first"],
    ["no-kl", "no_kl", 10, 2.5, 0.25, "third"],
    ["seed-b", "base", 10, 2.5, 0.28, "second"],
    ["seed-a", "base", 20, 5.0, 0.45, "first"],
    ["seed-b", "base", 20, None, 0.41, "second"],
]
EXPECTED = {  # run -> (tags, {metric: (steps, values)}), by hand from ROWS
    "seed-a": ({"variant": "base", "note": "first"},
               {"compute": ([0, 10, 20], [0.0, 2.5, 5.0]), "reward": ([0, 10, 20], [0.10, 0.30, 0.45])}),
    "seed-b": ({"variant": "base", "note": "second"},
               {"compute": ([0, 10], [0.0, 2.5]), "reward": ([0, 10, 20], [0.12, 0.28, 0.41])}),
    "no-kl": ({"variant": "no_kl", "note": "third"},
              {"compute": ([0, 10], [0.0, 2.5]), "reward": ([0, 10], [0.11, 0.25])}),
}


def write_csv(path, columns, rows):
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        writer.writerows([["" if cell is None else cell for cell in row] for row in rows])
    return path


def write_parquet(path, columns, rows):
    pq.write_table(pa.table({name: [row[i] for row in rows] for i, name in enumerate(columns)}), path)
    return path


def write_jsonl(path, columns, rows):
    path.write_text("".join(json.dumps({k: v for k, v in zip(columns, row) if v is not None}) + "\n"
                            for row in rows))
    return path


def as_plain(runs):
    """Runs as {name: (tags, {metric: (steps, values)})}, to compare with EXPECTED and with each other."""
    out = {}
    for run in runs:
        curves = {}
        for metric in run.metrics:
            series = run.history(metric)
            assert series.time is None  # no clock in these files
            curves[metric] = (series.step.tolist(), series.value.tolist())
        out[run.name] = (run.tags, curves)
    return out


def test_one_long_table_in_three_formats_gives_the_same_runs(tmp_path):
    read = {fmt: read_table(write(tmp_path / f"curves.{fmt}", COLUMNS, ROWS))
            for fmt, write in (("csv", write_csv), ("parquet", write_parquet), ("jsonl", write_jsonl))}
    for fmt, runs in read.items():
        assert [run.name for run in runs] == ["seed-a", "seed-b", "no-kl"], fmt  # first appearance in the file
        assert [run.metrics for run in runs] == [("compute", "reward")] * 3, fmt  # step, run, variant: no metrics
        assert all(run.start_time is None for run in runs)
        got = as_plain(runs)
        assert got.keys() == EXPECTED.keys()
        for name, (tags, curves) in EXPECTED.items():
            assert got[name][0] == tags, (fmt, name)
            for metric, (steps, values) in curves.items():
                assert got[name][1][metric][0] == steps, (fmt, name, metric)
                np.testing.assert_allclose(got[name][1][metric][1], values, rtol=0, atol=1e-12)
    assert as_plain(read["csv"]) == as_plain(read["parquet"]) == as_plain(read["jsonl"])
    (tmp_path / "curves.ndjson").write_bytes((tmp_path / "curves.jsonl").read_bytes())
    assert as_plain(read_table(tmp_path / "curves.ndjson")) == as_plain(read["csv"])


def test_a_run_without_steps_is_indexed_in_file_order(tmp_path):
    path = write_csv(tmp_path / "nostep.csv", ["run", "reward"],
                     [["a", 0.1], ["b", 0.5], ["a", 0.2], ["a", 0.3], ["b", 0.6]])
    got = {run.name: run.history("reward") for run in read_table(path)}
    assert got["a"].step.tolist() == [0, 1, 2] and got["a"].value.tolist() == [0.1, 0.2, 0.3]
    assert got["b"].step.tolist() == [0, 1] and got["b"].value.tolist() == [0.5, 0.6]


@pytest.fixture
def five_hours_west():
    """The process's local time zone 5 hours behind UTC (a POSIX TZ rule, no tz database needed), so that a zone-less
    time read as local would be 18,000 s off; restored after (CI's machines run in UTC, where the two agree)."""
    import time

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TZ", "XYZ+05")
        time.tzset()
        assert time.timezone == 5 * 3600 and datetime(2025, 3, 1, 12).timestamp() == 1740848400.0
        yield
    time.tzset()


def test_a_time_column_is_the_clock(tmp_path, five_hours_west):
    t0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc).timestamp()
    assert t0 == 1740830400.0  # 2025-03-01 12:00 UTC: 20,148 days after 1970-01-01, x 86,400 s, + 43,200 s
    path = write_csv(tmp_path / "clock.csv", ["run", "step", "timestamp", "reward"], [
        ["a", 0, "2025-03-01T12:00:00Z", 0.1],
        ["a", 1, "2025-03-01T13:00:00+01:00", 0.2],  # the same instant as 12:00 UTC: zones are honoured
        ["a", 2, "2025-03-01T12:30:00", 0.3],  # no zone: UTC
        ["b", 0, t0 + 60, 0.4],  # seconds since the epoch
    ])
    runs = {run.name: run for run in read_table(path)}
    assert runs["a"].history("reward").time.tolist() == [t0, t0, t0 + 1800]
    assert runs["a"].start_time == t0 and runs["b"].start_time == t0 + 60
    assert runs["b"].history("reward").time.tolist() == [t0 + 60]
    assert runs["a"].metrics == ("reward",)  # the clock is not a metric

    # Parquet's own timestamps give the same seconds.
    moments = [datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc), datetime(2025, 3, 1, 12, 30, tzinfo=timezone.utc)]
    pq.write_table(pa.table({"run": ["a", "a"], "step": [0, 2], "time": moments, "reward": [0.1, 0.3]}),
                   tmp_path / "clock.parquet")
    assert read_table(tmp_path / "clock.parquet")[0].history("reward").time.tolist() == [t0, t0 + 1800]


# The same curves as a W&B line chart of `reward` against `Step` exports them: the x column, then per run the value
# and the band, every cell quoted, an empty cell where the run has no point at that step. Two seeds of the base
# and the variant as separate runs; the band is the chart's sampling of its bucket (here set apart from the value so
# that reading it as data would show).
WANDB_CSV = '''"Step","seed-a - reward","seed-a - reward__MIN","seed-a - reward__MAX","seed-b - reward","seed-b - reward__MIN","seed-b - reward__MAX","no-kl - reward","no-kl - reward__MIN","no-kl - reward__MAX"
"0","0.1","0.05","0.15","0.12","0.07","0.17","0.11","0.06","0.16"
"10","0.3","0.25","0.35","0.28","0.23","0.33","0.25","0.2","0.3"
"20","0.45","0.4","0.5","0.41","0.36","0.46","","",""
'''  # noqa: E501 (a W&B export is one line a row)


def test_a_wandb_chart_export_gives_the_runs_of_the_long_table(tmp_path):
    path = tmp_path / "wandb_export_2025-03-01T12_00_00.000+00_00.csv"
    path.write_text(WANDB_CSV)
    runs = read_table(path)
    assert [run.name for run in runs] == ["seed-a", "seed-b", "no-kl"]
    assert [run.metrics for run in runs] == [("reward",)] * 3  # the __MIN / __MAX band is not a metric
    long = as_plain(read_table(write_csv(tmp_path / "long.csv", COLUMNS, ROWS)))
    for name, (_, curves) in as_plain(runs).items():
        assert curves["reward"] == long[name][1]["reward"], name
    assert all(run.tags == {} and run.start_time is None for run in runs)


def test_a_wandb_chart_against_another_metric_keeps_it_as_a_metric(tmp_path):
    # A chart drawn against compute: W&B adds each run's `_step` (and its band); a run's name may hold " - ".
    path = tmp_path / "wandb_export.csv"
    path.write_text(
        '"compute/gpu_hours","Group: lr - 3e-4 - _step","Group: lr - 3e-4 - _step__MIN",'
        '"Group: lr - 3e-4 - _step__MAX","Group: lr - 3e-4 - eval/reward","Group: lr - 3e-4 - eval/reward__MIN",'
        '"Group: lr - 3e-4 - eval/reward__MAX"\n'
        '"0.5","4","4","4","0.2","0.2","0.2"\n'
        '"1.5","12","12","12","0.4","0.4","0.4"\n')
    (run,) = read_table(path)
    assert run.name == "Group: lr - 3e-4"
    assert run.metrics == ("eval/reward", "compute/gpu_hours")  # `_step` is the step, not a metric
    assert run.history("eval/reward").step.tolist() == [4, 12]
    assert run.history("compute/gpu_hours").value.tolist() == [0.5, 1.5]
    assert run.history("compute/gpu_hours").step.tolist() == [4, 12]

    # Without the runs' `_step`: the row order, the same for every run (one row is one x).
    path.write_text('"compute/gpu_hours","a - eval/reward","a - eval/reward__MIN","a - eval/reward__MAX",'
                    '"b - eval/reward","b - eval/reward__MIN","b - eval/reward__MAX"\n'
                    '"0.5","0.2","0.2","0.2","",""\n"1.5","0.4","0.4","0.4","0.3","0.3","0.3"\n')
    a, b = read_table(path)
    assert a.history("eval/reward").step.tolist() == [0, 1] and b.history("eval/reward").step.tolist() == [1]
    assert b.history("compute/gpu_hours").value.tolist() == [1.5]


def test_a_wide_table_gives_the_runs_of_the_long_table(tmp_path):
    # EXPECTED's rewards as a hand-made export: a step column, then one column a run, empty where it has no point
    wide = write_csv(tmp_path / "wide.csv", ["Step", "seed-a", "seed-b", "no-kl"],
                     [[0, 0.10, 0.12, 0.11], [10, 0.30, 0.28, 0.25], [20, 0.45, 0.41, None]])
    rewards = {name: ({}, {"reward": metrics["reward"]}) for name, (_, metrics) in EXPECTED.items()}
    assert as_plain(read_table(wide)) == rewards
    parquet = write_parquet(tmp_path / "wide.parquet", ["step", "seed-a", "seed-b", "no-kl"],
                            [[0, 0.10, 0.12, 0.11], [10, 0.30, 0.28, 0.25], [20, 0.45, 0.41, None]])
    assert as_plain(read_table(parquet)) == rewards
    by_compute = write_csv(tmp_path / "by_compute.csv", ["compute", "a", "b"], [[0.0, 0.1, 0.2], [2.5, 0.3, None]])
    assert as_plain(read_table(by_compute)) == {
        "a": ({}, {"reward": ([0, 1], [0.1, 0.3]), "compute": ([0, 1], [0.0, 2.5])}),
        "b": ({}, {"reward": ([0], [0.2]), "compute": ([0], [0.0])})}
    # a long table that lost its run column is not read as runs named "reward" and "compute"
    lost = write_csv(tmp_path / "lost.csv", ["step", "reward", "compute"], [[0, 0.1, 0.0]])
    with pytest.raises(UnknownTableShape, match="no 'run' column"):
        read_table(lost)
    bad = write_csv(tmp_path / "bad.csv", ["step", "a"], [[0, 0.1], [1.5, 0.2]])
    with pytest.raises(BadTableValue, match=r"line 3, column 'step': '1.5' is not a whole step"):
        read_table(bad)


def test_the_same_value_twice_at_a_step_is_one_point(tmp_path):
    path = write_csv(tmp_path / "twice.csv", ["run", "step", "reward"], [["a", 0, 0.1], ["a", 1, 0.2], ["a", 1, 0.2]])
    assert read_table(path)[0].history("reward").step.tolist() == [0, 1]


def test_each_bad_file_gets_one_line(tmp_path):
    def error(path, kind):
        with pytest.raises(kind) as caught:
            read_table(path)
        assert isinstance(caught.value, AnalysisError)  # the CLI prints it and exits 2
        message = str(caught.value)
        assert "\n" not in message
        return message

    missing = tmp_path / "nope.csv"
    assert error(missing, TableNotFound) == f"no file of curves at {missing}"
    xlsx = tmp_path / "curves.xlsx"
    xlsx.write_text("x")
    assert error(xlsx, UnknownTableFormat) == (f"{xlsx}: unknown extension '.xlsx'; a file of curves is .csv, "
                                               ".parquet, .jsonl, .ndjson")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert error(empty, EmptyTable) == f"{empty} is empty"
    header = tmp_path / "header.csv"
    header.write_text("run,step,reward\n")
    assert error(header, EmptyTable) == f"{header} has columns ('run', 'step', 'reward') but no rows"
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n")
    assert error(blank, EmptyTable) == f"{blank} is empty"

    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"run,reward\n\xff\xfe,0.1\n")
    assert error(binary, TableError).startswith(f"{binary}: not a CSV file of UTF-8 text (line ")
    fake = tmp_path / "fake.parquet"
    fake.write_text("run,reward\n")
    assert error(fake, TableError).startswith(f"{fake}: not a Parquet file (")

    capital = write_csv(tmp_path / "capital.csv", ["Run", "step", "reward"], [["a", 0, 0.1]])
    assert error(capital, UnknownTableShape) == (
        f"{capital}: no 'run' column (columns found: 'Run', 'step', 'reward'); did you mean 'Run'? (column names "
        "are matched as written); a file of curves is a long table (a 'run' column, one point a row), a W&B "
        "chart export ('Step', then '<run> - <metric>' columns) or a wide table ('step', then a column a run)")
    neither = write_csv(tmp_path / "neither.csv", ["epoch", "loss"], [[0, 1.0]])
    assert error(neither, UnknownTableShape) == (
        f"{neither}: no 'run' column (columns found: 'epoch', 'loss'); a file of curves is a long table (a 'run' "
        "column, one point a row), a W&B chart export ('Step', then '<run> - <metric>' columns) or a wide table "
        "('step', then a column a run)")
    keys = write_jsonl(tmp_path / "keys.jsonl", ["run_name", "reward"], [["a", 0.1]])
    assert error(keys, UnknownTableShape) == (
        f"{keys}: no 'run' key (columns found: 'run_name', 'reward'); did you mean 'run_name'? (column names are "
        "matched as written); a JSON Lines file of curves is one point a line, with a run")

    text = write_csv(tmp_path / "text.csv", ["run", "step", "reward"], [["a", 0, 0.1], ["a", 1, "n/a"]])
    assert error(text, BadTableValue) == f"{text}: line 3, column 'reward': 'n/a' is not a number"
    text_pq = write_parquet(tmp_path / "text.parquet", ["run", "step", "reward"], [["a", 0, "0.1"], ["a", 1, "x"]])
    assert error(text_pq, BadTableValue) == f"{text_pq}: row 2, column 'reward': 'x' is not a number"
    wandb = tmp_path / "wandb.csv"
    wandb.write_text('"Step","a - reward","a - reward__MIN","a - reward__MAX"\n"0","0.1","0.1","0.1"\n'
                     '"1","NaN?","0.1","0.1"\n')
    assert error(wandb, BadTableValue) == f"{wandb}: line 3, column 'a - reward': 'NaN?' is not a number"

    same_name = tmp_path / "same_name.csv"  # W&B names a run by its display name, which need not be unique
    same_name.write_text('"Step","a - reward","a - reward__MIN","a - reward__MAX","a - reward"\n'
                         '"0","0.1","0.1","0.1","0.2"\n')
    assert error(same_name, TableError) == (
        f"{same_name}: the column 'a - reward' appears twice (a W&B export names a run by its display name: give "
        "the runs distinct names)")

    twice = write_csv(tmp_path / "twice.csv", ["run", "step", "reward"],
                      [["a", 0, 0.1], ["b", 0, 0.5], ["a", 0, 0.2]])
    assert error(twice, ConflictingPoints) == (
        f"{twice}: run 'a' has two values of 'reward' at step 0: 0.1 (line 2) and 0.2 (line 4)")
    variant = write_csv(tmp_path / "variant.csv", ["run", "variant", "step", "reward"],
                        [["a", "base", 0, 0.1], ["a", "no_kl", 1, 0.2]])
    assert error(variant, ConflictingPoints) == (
        f"{variant}: run 'a' has two variants, 'base' (line 2) and 'no_kl' (line 3); a run is one variant (name its "
        "seeds as runs of their own)")
