"""MLflow runs -> sigmoid fits -> ranking -> fits.csv, report.md, report.html, PNG plots -> back to MLflow.

`make_report` is the whole pipeline; `python -m analysis report` is a thin shell around it (analysis/__main__.py).
"""

from __future__ import annotations

import base64
import csv
import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection

from analysis.fit import CI_LEVEL, FitError, SigmoidFit, fit_sigmoid
from analysis.plots import plot_overview, plot_run  # matplotlib itself is imported when a figure is drawn
from analysis.rank import A_TIE, rank_fits
from analysis.runs import NoRuns, RunCurve, find_sweep_parent, load_runs, resolve_tracking_uri

BASELINE = "scalerl"
CSV_COLUMNS = ["variant", "A", "A_lo", "A_hi", "B", "B_lo", "B_hi", "C_mid", "R0", "n_points", "status"]
ARTIFACT_DIR = "report"


@dataclass
class ReportRow:
    """One run in rank order. `status` is the fit status, with the run state appended when the run did not
    finish (e.g. "ok; run FAILED"); `dA`, `dB` are the change vs the scalerl run (None without one)."""

    rank: int | None
    variant: str
    label: str  # the variant, with the run id appended when two runs share a variant name
    run_id: str
    run_status: str
    curve: RunCurve = field(repr=False)
    fit: SigmoidFit
    status: str
    note: str
    dA: float | None
    dB: float | None
    plot: Path


@dataclass
class Report:
    experiment: str
    sweep: str | None
    rows: list[ReportRow]
    out_dir: Path
    csv: Path
    markdown: Path
    html: Path
    overview: Path
    table_md: str  # the ranked table alone, in markdown
    artifact_run_id: str | None = None  # the parent run the files were attached to
    artifact_error: str | None = None  # why attaching failed, when it did
    plots: list[Path] = field(default_factory=list)

    @property
    def paths(self) -> list[Path]:
        return [self.csv, self.markdown, self.html, self.overview, *self.plots]


def make_report(
    experiment: str,
    tracking_uri: str | None = None,
    out_dir=None,
    sweep: str | None = None,
    run_ids: Collection[str] | None = None,
) -> Report:
    """Fit every variant run of `experiment` (optionally one sweep, or only `run_ids`), rank them, write the report
    files to out_dir (default reports/<experiment>) and attach them to the sweep's parent run under report/.

    Raises analysis.runs.AnalysisError subclasses for bad input (unknown experiment, no runs, no server)."""
    uri = resolve_tracking_uri(tracking_uri)
    curves = load_runs(experiment, uri, sweep, run_ids)
    if not curves:
        where = f" for sweep {sweep!r}" if sweep else ""
        where += " among the given run ids" if run_ids is not None else ""
        raise NoRuns(f"no variant runs in experiment {experiment!r}{where}")
    out = Path(out_dir) if out_dir is not None else Path("reports") / _safe(experiment)
    out.mkdir(parents=True, exist_ok=True)

    labels = _labels(curves)
    fits = [_fit(curve) for curve in curves]
    rows = _rows(curves, labels, fits, out)
    for row in rows:
        plot_run(row.curve, row.fit, row.plot, f"{row.label} (run {row.run_id[:8]}, {row.run_status})")
    overview = plot_overview([(row.label, row.curve, row.fit) for row in rows], out / "overview.png")

    table_md = _markdown_table(rows)
    report = Report(
        experiment=experiment,
        sweep=sweep,
        rows=rows,
        out_dir=out,
        csv=_write_csv(rows, out / "fits.csv"),
        markdown=out / "report.md",
        html=out / "report.html",
        overview=overview,
        table_md=table_md,
        plots=[row.plot for row in rows],
    )
    report.markdown.write_text(_markdown(report))
    report.html.write_text(_html(report))

    parent = _parent_run(curves, experiment, uri, sweep)
    if parent is not None:
        try:
            _attach(uri, parent, report.paths)
            report.artifact_run_id = parent
        except Exception as err:  # the local files are written; a store we cannot write to is not fatal
            report.artifact_error = f"could not attach the report to run {parent}: {err}"
    return report


# --- fitting and ranking ---------------------------------------------------------------------------------------


def _fit(curve: RunCurve) -> SigmoidFit:
    try:
        return fit_sigmoid(curve.compute, curve.pass_rate)
    except FitError as err:
        return SigmoidFit.failed(err.reason)


def _labels(curves: list[RunCurve]) -> list[str]:
    names = [curve.variant for curve in curves]
    return [name if names.count(name) == 1 else f"{name} ({curve.run_id[:7]})" for name, curve in zip(names, curves)]


def _rows(curves: list[RunCurve], labels: list[str], fits: list[SigmoidFit], out: Path) -> list[ReportRow]:
    base = next((fit for curve, fit in zip(curves, fits) if curve.variant == BASELINE and fit.ok), None)
    rows = []
    for ranked in rank_fits(list(zip(labels, fits))):
        curve, fit = curves[ranked.index], ranked.fit
        status = fit.status if curve.status == "FINISHED" else f"{fit.status}; run {curve.status}"
        notes = [n for n in (ranked.note, *fit.notes, *curve.notes) if n]
        has_delta = base is not None and fit.ok
        rows.append(
            ReportRow(
                rank=ranked.rank,
                variant=curve.variant,
                label=ranked.name,
                run_id=curve.run_id,
                run_status=curve.status,
                curve=curve,
                fit=fit,
                status=status,
                note="; ".join(notes),
                dA=fit.A - base.A if has_delta else None,
                dB=fit.B - base.B if has_delta else None,
                plot=out / f"fit-{_safe(ranked.name)}.png",
            )
        )
    return rows


def _parent_run(curves: list[RunCurve], experiment: str, uri: str, sweep: str | None) -> str | None:
    """The sweep's parent run: the run tagged role=sweep for --sweep, else the one parent all runs share."""
    if sweep:
        parent = find_sweep_parent(experiment, sweep, uri)
        if parent:
            return parent
    parents = {curve.parent_run_id for curve in curves}
    return parents.pop() if len(parents) == 1 and None not in parents else None


def _attach(uri: str, run_id: str, paths: list[Path]) -> None:
    """Log exactly the files of this report (not whatever else lies in out_dir) under report/."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    for path in paths:
        client.log_artifact(run_id, str(path), artifact_path=ARTIFACT_DIR)


# --- formatting ------------------------------------------------------------------------------------------------


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "run"


def _csv_num(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return f"{x:.6g}"


def _write_csv(rows: list[ReportRow], path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for row in rows:
            fit = row.fit
            if fit.ok:
                numbers = [fit.A, *fit.ci["A"], fit.B, *fit.ci["B"], fit.C_mid, fit.R0, fit.n_points]
            else:
                numbers = [math.nan] * (len(CSV_COLUMNS) - 2)
            writer.writerow([row.variant, *(_csv_num(x) for x in numbers), row.status])
    return path


def _num(x: float, digits: int) -> str:
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    return f"{x:.{digits}f}"


def _compute(x: float) -> str:
    return "∞" if math.isinf(x) else (f"{x:.0f}" if x >= 10 else f"{x:.3g}")


def _delta(x: float | None, digits: int) -> str:
    return "" if x is None else f"{x:+.{digits}f}"


TABLE_HEADERS = ["rank", "variant", "A [90% CI]", "B [90% CI]", "C_mid GPU-h [CI]", "R0",
                 f"ΔA vs {BASELINE}", f"ΔB vs {BASELINE}", "n", "status", "notes"]


def _table_cells(rows: list[ReportRow]) -> list[list[str]]:
    cells = []
    for row in rows:
        fit = row.fit
        if fit.ok:
            (a_lo, a_hi), (b_lo, b_hi), c_ci = fit.ci["A"], fit.ci["B"], fit.ci["C_mid"]
            numbers = [
                f"{_num(fit.A, 3)} [{_num(a_lo, 3)}, {_num(a_hi, 3)}]",
                f"{_num(fit.B, 2)} [{_num(b_lo, 2)}, {_num(b_hi, 2)}]",
                f"{_compute(fit.C_mid)} [{_compute(c_ci[0])}, {_compute(c_ci[1])}]",
                _num(fit.R0, 3),
                _delta(row.dA, 3),
                _delta(row.dB, 2),
                str(fit.n_points),
            ]
        else:
            numbers = [""] * 7
        rank = "" if row.rank is None else str(row.rank)
        cells.append([rank, row.label, *numbers, row.status, row.note])
    return cells


def _markdown_table(rows: list[ReportRow]) -> str:
    def line(cells):
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    lines = [line(TABLE_HEADERS), "|" + "---|" * len(TABLE_HEADERS)]
    lines += [line(cells) for cells in _table_cells(rows)]
    return "\n".join(lines)


def _intro(report: Report) -> list[str]:
    """The header paragraphs shared by the markdown and the HTML report."""
    sweep = f", sweep {report.sweep}" if report.sweep else ""
    return [
        f"Experiment {report.experiment}{sweep}: {len(report.rows)} runs, "
        f"{sum(r.fit.ok for r in report.rows)} fitted.",
        "Each run's validation pass rate R is fitted against training compute C (GPU-hours) with the sigmoid law "
        "of ScaleRL (Eq. 1): R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B).",
        "A is the asymptotic pass rate: the ceiling the recipe approaches with unlimited compute. "
        "B is the compute efficiency: how steeply the curve climbs towards A (higher is faster). "
        "C_mid is the compute at which half of the gain A - R0 is reached. "
        "R0 is the pass rate before RL (step 0) and is not fitted.",
        f"Points below 1.5/16 of each run's final compute are left out of the fit, as in the paper. "
        f"Intervals are {CI_LEVEL:.0%}, from the fit's Jacobian (Student t, B and C_mid in log space, the error of "
        f"R0 propagated); ∞ or a bound of [R0, 1] means the data do not pin that side down.",
        f"Ranking: by A, highest first; A values within {A_TIE} of the group's best count as a tie on A and are "
        "ranked by B instead. Runs whose fit failed come last with the reason. "
        f"ΔA and ΔB are differences to the {BASELINE} run's fit; B is compared as fitted (the paper refits runs "
        "tied on A with a common A before comparing B; not done here yet).",
    ]


def _markdown(report: Report) -> str:
    parts = [f"# Sigmoid fits: {report.experiment}", "", *(p + "\n" for p in _intro(report)), report.table_md, ""]
    parts += ["## Plots", "", f"![all runs]({report.overview.name})", ""]
    parts += [f"![{row.label}]({row.plot.name})" for row in report.rows]
    return "\n".join(parts) + "\n"


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1200px; margin: 2em auto;
       padding: 0 1em; color: #1f2328; line-height: 1.45; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.9em; width: 100%; }
th, td { border: 1px solid #d0d7de; padding: 0.35em 0.6em; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } tr:nth-child(even) td { background: #fbfcfd; }
td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.failed td { color: #9a3412; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; }
.plots img { max-width: 100%; border: 1px solid #d0d7de; }
.overview img { max-width: 100%; }
"""


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _html(report: Report) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in TABLE_HEADERS)
    body = []
    for row, cells in zip(report.rows, _table_cells(report.rows)):
        klass = "" if row.fit.ok else ' class="failed"'
        tds = "".join(f'<td class="num">{esc(c)}</td>' if 2 <= i <= 8 else f"<td>{esc(c)}</td>"
                      for i, c in enumerate(cells))
        body.append(f"<tr{klass}>{tds}</tr>")
    plots = "\n".join(_img(row.plot, row.label) for row in report.rows)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Sigmoid fits: {esc(report.experiment)}</title>
<style>{CSS}</style></head>
<body>
<h1>Sigmoid fits: {esc(report.experiment)}</h1>
{"".join(f"<p>{esc(p)}</p>" for p in _intro(report))}
<table><thead><tr>{head}</tr></thead>
<tbody>
{chr(10).join(body)}
</tbody></table>
<h2>All runs</h2>
<div class="overview">{_img(report.overview, "all runs")}</div>
<h2>Per run</h2>
<div class="plots">
{plots}
</div>
</body></html>
"""
