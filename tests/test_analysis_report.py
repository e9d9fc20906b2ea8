"""End to end on a real sqlite MLflow store: runs logged as `ablate` logs them -> make_report -> files + artifacts.

The store is built once for the module (a fresh sqlite database costs ~2 s of migrations).
"""

import csv
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from analysis import make_report
from analysis.fit import sigmoid_law
from analysis.report import CSV_COLUMNS
from analysis.runs import ExperimentNotFound, NoRuns, TrackingUnavailable, load_runs

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "loo-study"
SWEEP = "loo-3fa2c1"
OTHER_SWEEP = "loo-9b0d77"
GPU_HOURS_PER_STEP = 10.0  # 1,600 steps = 16,000 GPU-hours
R0 = 0.30


@dataclass(frozen=True)
class Variant:
    name: str
    A: float
    B: float
    C_mid: float
    last_step: int = 1600
    val_every: int = 25
    status: str = "FINISHED"
    sweep: str = SWEEP


# Known truths. scalerl and loo-savg tie on A (0.61 vs 0.60) and loo-savg has the higher B: it ranks first.
VARIANTS = [
    Variant("scalerl", 0.61, 1.9, 2542.0),
    Variant("loo-dapo", 0.55, 1.77, 2542.0),
    Variant("loo-savg", 0.60, 2.4, 2600.0),
    Variant("loo-fp32", 0.52, 1.6, 3000.0),
    Variant("loo-lp", 0.58, 1.9, 2542.0, last_step=25),  # two validation points only: the fit must fail
    Variant("loo-8op", 0.58, 1.9, 2542.0, last_step=400, status="FAILED"),  # crashed at 4,000 GPU-hours
    Variant("scalerl", 0.62, 1.9, 2542.0, sweep=OTHER_SWEEP),  # another sweep in the same experiment
]


@dataclass
class Study:
    uri: str
    root: Path
    parents: dict  # sweep id -> parent run id


def _log_variant(client, experiment_id, parent_id, v: Variant, seed: int) -> str:
    tags = {
        "mlflow.parentRunId": parent_id,
        "ablate.role": "variant",
        "ablate.sweep": v.sweep,
        "ablate.variant": v.name,
        "ablate.axis": "none" if v.name == "scalerl" else v.name.removeprefix("loo-"),
        "ablate.choice": v.name,
        "ablate.signature": f"{seed:012x}",
    }
    run_id = client.create_run(experiment_id, run_name=v.name, tags=tags).info.run_id
    now = int(time.time() * 1000)
    # compute every 10 steps, validation every 25: steps 25, 75, ... need interpolated compute
    metrics = [Metric("compute/gpu_hours", s * GPU_HOURS_PER_STEP, now, s) for s in range(0, v.last_step + 1, 10)]
    val_steps = np.arange(0, v.last_step + 1, v.val_every)
    truth = sigmoid_law(val_steps * GPU_HOURS_PER_STEP, v.A, v.B, v.C_mid, R0)
    rate = np.random.default_rng(seed).binomial(16_000, truth) / 16_000
    rate[0] = R0
    metrics += [Metric("val/pass_rate", float(r), now, int(s)) for s, r in zip(val_steps, rate)]
    metrics += [Metric("train/reward_mean", 0.0, now, int(s)) for s in val_steps]
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i : i + 1000])
    client.set_terminated(run_id, v.status)
    return run_id


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Study:
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    # an explicit artifact location: the default for a sqlite store is ./mlruns in the working directory
    experiment_id = client.create_experiment(EXPERIMENT, artifact_location=(root / "artifacts").as_uri())
    parents = {}
    for sweep in (SWEEP, OTHER_SWEEP):
        tags = {"ablate.role": "sweep", "ablate.sweep": sweep}
        parents[sweep] = client.create_run(experiment_id, run_name=sweep, tags=tags).info.run_id
    for seed, v in enumerate(VARIANTS):
        _log_variant(client, experiment_id, parents[v.sweep], v, seed)
    for parent_id in parents.values():
        client.set_terminated(parent_id, "FINISHED")
    return Study(uri=uri, root=root, parents=parents)


@pytest.fixture(scope="module")
def report(study, tmp_path_factory):
    return make_report(EXPERIMENT, tracking_uri=study.uri, out_dir=tmp_path_factory.mktemp("report"), sweep=SWEEP)


def _csv_rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_load_runs_joins_compute_on_step(study):
    curves = load_runs(EXPERIMENT, study.uri, sweep=SWEEP)
    assert sorted(c.variant for c in curves) == sorted(v.name for v in VARIANTS if v.sweep == SWEEP)
    scalerl = next(c for c in curves if c.variant == "scalerl")
    assert scalerl.sweep == SWEEP and scalerl.axis == "none" and scalerl.status == "FINISHED"
    assert scalerl.parent_run_id == study.parents[SWEEP]
    assert list(scalerl.step[:3]) == [0, 25, 50]
    # step 25 has no compute entry: linear between step 20 (200 GPU-h) and step 30 (300 GPU-h)
    assert list(scalerl.compute[:3]) == [0.0, 250.0, 500.0]
    assert scalerl.pass_rate[0] == R0
    # the final validation (step 25) lies past the last compute entry (step 20) by less than one logging
    # interval (10 steps): extrapolated from the last segment, 20 + 5 steps at 10 GPU-h per step
    lp = next(c for c in curves if c.variant == "loo-lp")
    assert list(lp.step) == [0, 25] and list(lp.compute) == [0.0, 250.0]
    assert len(load_runs(EXPERIMENT, study.uri)) == len(VARIANTS)  # no sweep filter: both sweeps, no parents


def test_fits_csv_has_the_exact_columns_and_one_row_per_run(report):
    rows = _csv_rows(report.csv)
    assert rows[0] == CSV_COLUMNS
    assert sorted(r[0] for r in rows[1:]) == sorted(v.name for v in VARIANTS if v.sweep == SWEEP)


def test_ranking_follows_the_truth(report):
    order = [row.variant for row in report.rows]
    # the tie on A (0.61 / 0.60) is broken by B, then the distinct A values in order: 0.55, then 0.52
    known = [name for name in order if name in ("scalerl", "loo-savg", "loo-dapo", "loo-fp32")]
    assert known == ["loo-savg", "scalerl", "loo-dapo", "loo-fp32"]
    savg = next(row for row in report.rows if row.variant == "loo-savg")
    assert "tie on A with scalerl" in savg.note
    scalerl = next(row for row in report.rows if row.variant == "scalerl")
    assert scalerl.dA == 0.0 and savg.dB > 0
    assert scalerl.fit.A == pytest.approx(0.61, abs=0.01)


def test_degenerate_and_failed_runs_are_reported_not_fatal(report):
    rows = {r[0]: dict(zip(CSV_COLUMNS, r)) for r in _csv_rows(report.csv)[1:]}
    lp = rows["loo-lp"]
    assert lp["status"].startswith("too few points")
    assert all(lp[c] == "" for c in CSV_COLUMNS[1:-1])
    assert report.rows[-1].variant == "loo-lp" and report.rows[-1].rank is None
    assert rows["loo-8op"]["status"].endswith("run FAILED")
    assert rows["scalerl"]["status"] == "ok"
    assert float(rows["scalerl"]["A_lo"]) < float(rows["scalerl"]["A"]) < float(rows["scalerl"]["A_hi"])


def test_report_files_are_complete(report):
    md = report.markdown.read_text()
    assert "| rank | variant |" in md and "loo-savg" in md and "A is the asymptotic pass rate" in md
    html = report.html.read_text()
    # one overview + one figure per run, embedded so that the page stands alone
    assert html.count("data:image/png;base64,") == 1 + len(report.rows)
    assert 'src="fit-' not in html
    for path in report.paths:
        assert path.exists() and path.stat().st_size > 0
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in [report.overview, *report.plots])


def test_report_is_attached_to_the_sweep_parent(study, report):
    assert report.artifact_run_id == study.parents[SWEEP] and report.artifact_error is None
    client = MlflowClient(tracking_uri=study.uri)
    names = {Path(a.path).name for a in client.list_artifacts(study.parents[SWEEP], "report")}
    assert {"fits.csv", "report.md", "report.html", "overview.png"} <= names
    assert {p.name for p in report.plots} <= names


def test_runs_of_two_parents_are_reported_but_attached_nowhere(study, tmp_path):
    report = make_report(EXPERIMENT, tracking_uri=study.uri, out_dir=tmp_path)
    assert len(report.rows) == len(VARIANTS)
    assert report.artifact_run_id is None
    labels = [row.label for row in report.rows]
    assert len(set(labels)) == len(labels)  # the two scalerl runs are told apart


def test_run_ids_restrict_the_report(study, tmp_path):
    wanted = [c.run_id for c in load_runs(EXPERIMENT, study.uri, sweep=SWEEP) if c.variant in ("loo-dapo", "scalerl")]
    report = make_report(EXPERIMENT, tracking_uri=study.uri, out_dir=tmp_path, sweep=SWEEP, run_ids=wanted)
    assert [row.variant for row in report.rows] == ["scalerl", "loo-dapo"]
    assert report.artifact_run_id == study.parents[SWEEP]


def test_bad_input_errors_name_the_problem(study, tmp_path):
    with pytest.raises(ExperimentNotFound, match=r"'nope'.*loo-study"):
        make_report("nope", tracking_uri=study.uri, out_dir=tmp_path)
    with pytest.raises(NoRuns, match="no-such-sweep"):
        make_report(EXPERIMENT, tracking_uri=study.uri, out_dir=tmp_path, sweep="no-such-sweep")
    missing = tmp_path / "absent.db"
    with pytest.raises(TrackingUnavailable, match="no MLflow database"):
        load_runs(EXPERIMENT, f"sqlite:///{missing}")
    assert not missing.exists()  # MLflow was not allowed to create an empty store


def test_unreachable_server_fails_fast():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(TrackingUnavailable, match="does not answer"):
        load_runs(EXPERIMENT, f"http://127.0.0.1:{port}")
    assert time.monotonic() - start < 10


def _run_python(args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI="")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_cli_unknown_experiment_exits_2_with_one_line(study, tmp_path):
    proc = _run_python(["-m", "analysis", "report", "--experiment", "nope", "--tracking-uri", study.uri], tmp_path)
    assert proc.returncode == 2
    assert "'nope'" in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("error:")]) == 1
    assert not (tmp_path / "reports").exists()


def test_cli_report_never_imports_torch_or_the_trainer(study, tmp_path):
    # DESIGN.md, Boundaries: analysis imports neither torch nor the trainer (ablate.tracking, stdlib only, is fine)
    heavy = "('torch', 'hydra', 'ablate.trainer', 'ablate.generators', 'ablate.rl')"
    code = (
        "import sys, analysis\n"
        "assert not {'torch', 'mlflow', 'matplotlib'} & set(sys.modules), 'heavy import'\n"
        "from analysis.__main__ import main\n"
        f"rc = main(['report', '--experiment', {EXPERIMENT!r}, '--tracking-uri', {study.uri!r},"
        f" '--sweep', {OTHER_SWEEP!r}])\n"
        f"print('imported:', sorted(m for m in {heavy} if m in sys.modules))\n"
        "sys.exit(rc)\n"
    )
    proc = _run_python(["-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "imported: []" in proc.stdout
    assert "| 1 | scalerl |" in proc.stdout  # the ranked table on stdout
    assert f"wrote reports/{EXPERIMENT}/report.html" in proc.stdout  # default --out
    assert (tmp_path / "reports" / EXPERIMENT / "fits.csv").exists()
