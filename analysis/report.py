"""MLflow runs -> sigmoid fits per variant -> ranking and verdicts -> fits.csv, report.md, report.html, PNG plots ->
back to MLflow (attached to the sweep's parent run).

`make_report` is the whole pipeline; `python -m analysis report` is a thin shell around it (analysis/__main__.py).
Runs that are seeds of one variant are fitted together (analysis.runs.group_seeds); one row per variant.
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

import numpy as np

from analysis.extrapolate import Extrapolation, extrapolation_check
from analysis.fit import CI_LEVEL, FitError, SigmoidFit, fit_sigmoid, prepare
from analysis.joint import CommonAFit, fit_common_A
from analysis.posterior import fit_state
from analysis.plots import plot_linearized, plot_overview, plot_params, plot_variant
from analysis.rank import A_TIE, Ranked, Verdict, rank_fits, verdict
from analysis.runs import NoRuns, RunCurve, find_sweep_parent, group_seeds, load_runs, resolve_tracking_uri

BASELINE = "scalerl"
CSV_COLUMNS = ["variant", "A", "A_lo", "A_hi", "B", "B_lo", "B_hi", "C_mid", "R0", "n_points", "status"]
# after the eleven: the ranking (rank; the tie group's common A and the B at it), the verdict against the base
# (dB at the pair's common A, verdict_common_A, unless A moved), the seeds, the half-run extrapolation check
CSV_EXTRA = ["C_mid_lo", "C_mid_hi", "rank", "rank_common_A", "rank_B", "rank_B_lo", "rank_B_hi", "verdict", "dA",
             "dB", "verdict_common_A", "n_seeds", "label", "run_ids", "extrap_fit_to", "extrap_predicted",
             "extrap_lo", "extrap_hi", "extrap_observed", "powerlaw_A", "powerlaw_predicted", "notes"]
ARTIFACT_DIR = "report"
EXTRAPOLATION_FRACTION = 0.5


@dataclass
class ReportRow:
    """One variant (its seeds pooled) in rank order. `status` is the fit status, with the runs' state appended
    when one did not finish (e.g. "ok; run RUNNING (provisional)"); `dA`, `dB` the change vs the base recipe."""

    rank: int | None
    variant: str
    label: str  # the variant, with a run id appended when two rows share a variant name
    curves: list[RunCurve] = field(repr=False)
    fit: SigmoidFit
    status: str
    note: str
    verdict: Verdict
    ranked: Ranked = field(repr=False)
    extrapolation: Extrapolation = field(repr=False)
    plot: Path = field(default=Path())

    @property
    def run_id(self) -> str:
        return self.curves[0].run_id

    @property
    def run_ids(self) -> list[str]:
        return [c.run_id for c in self.curves]

    @property
    def run_status(self) -> str:
        states = [c.status for c in self.curves]
        return states[0] if len(set(states)) == 1 else ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states)))

    @property
    def curve(self) -> RunCurve:
        return self.curves[0]

    @property
    def n_seeds(self) -> int:
        return len(self.curves)

    @property
    def dA(self) -> float | None:
        return self.verdict.dA

    @property
    def dB(self) -> float | None:
        return self.verdict.dB


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
    plots: list[Path] = field(default_factory=list)  # one per variant
    params_plot: Path | None = None
    linearized: Path | None = None
    base: str | None = None  # label of the base recipe's row

    @property
    def variants_csv(self) -> Path:
        return self.out_dir / "variants.csv"

    @property
    def paths(self) -> list[Path]:
        figures = [p for p in (self.params_plot, self.linearized) if p is not None]
        return [self.csv, self.variants_csv, self.markdown, self.html, self.overview, *figures, *self.plots]


def make_report(
    experiment: str,
    tracking_uri: str | None = None,
    out_dir=None,
    sweep: str | None = None,
    run_ids: Collection[str] | None = None,
) -> Report:
    """Fit every variant of `experiment` (optionally one sweep, or only `run_ids`), rank them, write the report
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

    groups = group_seeds(curves)
    labels = _labels(groups)
    states = [_state(group) for group in groups]
    fits = [st if isinstance(st, SigmoidFit) else st.fit for st in states]

    def common(indices: list[int]) -> CommonAFit:
        bad = [labels[i] for i in indices if isinstance(states[i], SigmoidFit)]
        if bad:
            raise FitError(f"no fit for {', '.join(bad)}")
        return fit_common_A([states[i].data for i in indices], [states[i] for i in indices])

    ranked = rank_fits(list(zip(labels, fits)), common=common)
    base_i = _base_index(groups, fits)
    rows = []
    for r in ranked:
        group, fit = groups[r.index], r.fit
        if base_i is None:
            v = verdict(fit, None)
        elif r.index == base_i:
            v = Verdict("base", dA=0.0, dB=0.0, detail="the base recipe") if fit.ok else verdict(fit, None)
        else:
            i = r.index
            v = verdict(fit, fits[base_i], common=lambda i=i: common([i, base_i]))
        rows.append(ReportRow(
            rank=r.rank,
            variant=group[0].variant,
            label=r.name,
            curves=group,
            fit=fit,
            status=_status(fit, group),
            note="; ".join(n for n in (r.note, *fit.notes, *(n for c in group for n in c.notes)) if n),
            verdict=v,
            ranked=r,
            extrapolation=_extrapolate(group),
            plot=out / f"fit-{_safe(r.name)}.png",
        ))

    for row in rows:
        title = f"{row.label} ({_seeds(row)}, {row.run_status})"
        plot_variant(row.curves, row.fit, row.plot, title, extrap=row.extrapolation)
    overview = plot_overview([(row.label, row.curves, row.fit) for row in rows], out / "overview.png")
    base_label = labels[base_i] if base_i is not None else None
    params_plot = plot_params([(row.label, row.fit, row.ranked.b_fit) for row in rows], base_label,
                              out / "params.png", A_TIE)
    linear_items = [(row.label, row.curves, row.ranked.b_fit or row.fit) for row in rows]
    linearized = plot_linearized(linear_items, out / "linearized.png")

    report = Report(
        experiment=experiment,
        sweep=sweep,
        rows=rows,
        out_dir=out,
        csv=_write_run_csv(rows, out / "fits.csv"),
        markdown=out / "report.md",
        html=out / "report.html",
        overview=overview,
        table_md=_markdown_table(rows),
        plots=[row.plot for row in rows],
        params_plot=params_plot,
        linearized=linearized,
        base=base_label,
    )
    _write_csv(rows, report.variants_csv)
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


# --- fitting -----------------------------------------------------------------------------------------------------


def _pooled(group: list[RunCurve]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    compute = np.concatenate([c.compute for c in group])
    reward = np.concatenate([c.pass_rate for c in group])
    runs = np.concatenate([np.full(c.compute.size, k) for k, c in enumerate(group)])
    return compute, reward, runs


def fit_group(group: list[RunCurve], *, A: float | None = None) -> SigmoidFit:
    """The seeds of one variant fitted together (R0: the mean of their step-0 points); a failed fit is a record
    with the reason as status."""
    compute, reward, runs = _pooled(group)
    try:
        return fit_sigmoid(compute, reward, runs=runs, A=A)
    except FitError as err:
        return SigmoidFit.failed(err.reason, n_runs=len(group))


def _state(group: list[RunCurve]):
    """The group's fit with its grid (for common-A refits), or a failed SigmoidFit record."""
    compute, reward, runs = _pooled(group)
    try:
        data = prepare(compute, reward, runs=runs)
        return fit_state(data)
    except FitError as err:
        return SigmoidFit.failed(err.reason, n_runs=len(group))


def _extrapolate(group: list[RunCurve]) -> Extrapolation:
    compute, reward, runs = _pooled(group)
    return extrapolation_check(compute, reward, fraction=EXTRAPOLATION_FRACTION, runs=runs)


def _status(fit: SigmoidFit, group: list[RunCurve]) -> str:
    unfinished = [c.status for c in group if c.status != "FINISHED"]
    if not unfinished:
        return fit.status
    states = sorted(set(unfinished))
    running = any(s in ("RUNNING", "SCHEDULED") for s in states)
    what = "run" if len(group) == 1 else f"{len(unfinished)} of {len(group)} runs"
    tail = " (provisional)" if running and fit.ok else ""
    return f"{fit.status}; {what} {'/'.join(states)}{tail}"


def _base_index(groups: list[list[RunCurve]], fits: list[SigmoidFit]) -> int | None:
    """The base recipe: the scalerl variant (the fitted one with the most seeds, then the first)."""
    candidates = [i for i, g in enumerate(groups) if g[0].variant == BASELINE]
    if not candidates:
        return None
    return max(candidates, key=lambda i: (fits[i].ok, len(groups[i]), -i))


def _labels(groups: list[list[RunCurve]]) -> list[str]:
    names = [group[0].variant for group in groups]
    return [name if names.count(name) == 1 else f"{name} ({group[0].run_id[:7]})" for name, group in zip(names, groups)]


def _seeds(row: ReportRow) -> str:
    return f"{row.n_seeds} seeds" if row.n_seeds > 1 else f"run {row.run_id[:8]}"


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


def _csv_num(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return f"{x:.6g}"


def _write_run_csv(rows: list[ReportRow], path: Path) -> Path:
    """fits.csv (DESIGN.md): one row per run, the eleven documented columns, then its run id and its variant's rank
    and verdict. A variant with one run has its row as in variants.csv; each seed of a pooled variant is fitted alone
    here (its pooled fit is in variants.csv)."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS + ["run_id", "variant_rank", "verdict"])
        for row in rows:
            for curve in row.curves:
                if row.n_seeds == 1:
                    fit = row.fit
                else:
                    state = _state([curve])
                    fit = state if isinstance(state, SigmoidFit) else state.fit
                numbers = ([fit.A, *fit.ci["A"], fit.B, *fit.ci["B"], fit.C_mid, fit.R0, fit.n_points] if fit.ok
                           else [math.nan] * (len(CSV_COLUMNS) - 2))
                status = row.status if row.n_seeds == 1 else _status(fit, [curve])
                writer.writerow([row.variant, *(_csv_num(x) for x in numbers), status, curve.run_id,
                                 "" if row.rank is None else row.rank, row.verdict.label])
    return path


def _write_csv(rows: list[ReportRow], path: Path) -> Path:
    """variants.csv: one row per variant (seeds pooled), the eleven documented columns first, then the rest (rank,
    the common-A refit, the verdict, the seeds, the extrapolation check); rows in rank order."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS + CSV_EXTRA)
        for row in rows:
            fit, v, ex, b_fit = row.fit, row.verdict, row.extrapolation, row.ranked.b_fit
            if fit.ok:
                numbers = [fit.A, *fit.ci["A"], fit.B, *fit.ci["B"], fit.C_mid, fit.R0, fit.n_points]
                c_ci = list(fit.ci["C_mid"])
            else:
                numbers = [math.nan] * (len(CSV_COLUMNS) - 2)
                c_ci = [math.nan, math.nan]
            rank_b = [row.ranked.common_A, b_fit.B, *b_fit.ci["B"]] if b_fit is not None else [None] * 4
            ex_numbers = [ex.c_fit if ex.ok else None, ex.predicted, *ex.predicted_ci, ex.observed,
                          ex.power.A if ex.power is not None and ex.power.ok else None, ex.power_predicted]
            writer.writerow([
                row.variant, *(_csv_num(x) for x in numbers), row.status,
                *(_csv_num(x) for x in c_ci), "" if row.rank is None else row.rank, *(_csv_num(x) for x in rank_b),
                v.label, _csv_num(v.dA), _csv_num(v.dB), _csv_num(v.common_A),
                row.n_seeds, row.label, " ".join(row.run_ids), *(_csv_num(x) for x in ex_numbers), row.note,
            ])
    return path


def _num(x: float, digits: int) -> str:
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    return f"{x:.{digits}f}"


def _compute(x: float) -> str:
    return "∞" if math.isinf(x) else (f"{x:,.0f}" if x >= 10 else f"{x:.3g}")


def _delta(x: float | None, digits: int) -> str:
    return "" if x is None else f"{x:+.{digits}f}"


TABLE_HEADERS = ["rank", "variant", "seeds", "A [90% CI]", "B [90% CI]", "C_mid GPU-h [90% CI]",
                 f"ΔA vs {BASELINE}", f"ΔB vs {BASELINE}", "verdict", "status", "notes"]


def _change(row: ReportRow) -> tuple[str, str]:
    v = row.verdict
    if v.label in ("no fit", "no base") or v.dA is None:
        return "", ""
    dB = _delta(v.dB, 2)
    if v.common_A is not None and v.label != "moves A":
        dB += f" (at A={v.common_A:.3f})"
    return _delta(v.dA, 3), dB


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
                *_change(row),
            ]
        else:
            numbers = [""] * 5
        rank = "" if row.rank is None else str(row.rank)
        cells.append([rank, row.label, str(row.n_seeds), *numbers, row.verdict.label, row.status, row.note])
    return cells


def _md_line(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _markdown_table(rows: list[ReportRow]) -> str:
    lines = [_md_line(TABLE_HEADERS), "|" + "---|" * len(TABLE_HEADERS)]
    lines += [_md_line(cells) for cells in _table_cells(rows)]
    return "\n".join(lines)


EXTRAP_HEADERS = ["variant", "fitted up to GPU-h", "end GPU-h", "predicted end [90%]", "observed end",
                  "error", "power law: A", "power law: predicted end", "power law: error"]


def _extrap_cells(rows: list[ReportRow]) -> list[list[str]]:
    cells = []
    for row in rows:
        ex = row.extrapolation
        if not ex.ok:
            cells.append([row.label, "", "", ex.status, _num(ex.observed, 3) if math.isfinite(ex.observed) else "",
                          "", "", "", ""])
            continue
        power = ex.power if ex.power is not None and ex.power.ok else None
        cells.append([
            row.label, _compute(ex.c_fit), _compute(ex.c_end),
            f"{ex.predicted:.3f} [{ex.predicted_ci[0]:.3f}, {ex.predicted_ci[1]:.3f}]",
            f"{ex.observed:.3f}", f"{ex.error:+.3f}",
            f"{power.A:.3f}" if power else "", f"{ex.power_predicted:.3f}" if power else "",
            f"{ex.power_error:+.3f}" if power else "",
        ])
    return cells


def _verdict_lines(report: Report) -> list[str]:
    lines = []
    for row in report.rows:
        if row.verdict.label in ("base",):
            continue
        lines.append(f"{row.label}: {row.verdict.label}" + (f" ({row.verdict.detail})" if row.verdict.detail else ""))
    return lines


def _intro(report: Report) -> list[str]:
    """The explanatory paragraphs shared by the markdown and the HTML report."""
    sweep = f", sweep {report.sweep}" if report.sweep else ""
    n_runs = sum(row.n_seeds for row in report.rows)
    counts = {}
    for row in report.rows:
        counts[row.verdict.label] = counts.get(row.verdict.label, 0) + 1
    summary = ", ".join(f"{n} {label}" for label, n in counts.items() if label != "base")
    base = (f"Verdicts against the base recipe {report.base}: {summary}." if report.base
            else f"No {BASELINE} run: no verdicts against a base recipe.")
    return [
        f"Experiment {report.experiment}{sweep}: {len(report.rows)} variants from {n_runs} runs, "
        f"{sum(r.fit.ok for r in report.rows)} fitted. {base}",
        "Each variant's validation pass rate R is fitted against training compute C (GPU-hours) with the sigmoid "
        "law of ScaleRL (Eq. 1): R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B). "
        "A is the ceiling: the pass rate the recipe approaches with unlimited compute. B is the efficiency: how "
        "steeply the curve climbs towards A (higher is faster). C_mid is the compute at half of the gain A - R0. "
        "R0 is the pass rate before RL (step 0), not fitted. Seeds of one variant are fitted together.",
        f"Points below 1.5/16 of a run's final compute are left out, as in the paper. Intervals are "
        f"{CI_LEVEL:.0%} likelihood-ratio intervals under a noise model fitted to each variant's residuals (white "
        "noise plus a slow wobble correlated in compute); a bound of 1 on A, or ∞ on B or C_mid, means the data do "
        "not bound that side (typically: the run stopped before its midpoint).",
        f"Ranking (the paper's rule, made explicit): by A, highest first. Variants whose A are within {A_TIE} of "
        "the group's best, or whose A intervals overlap it, are tied on A: they are refitted together with one "
        "common A (a shared parameter, so its uncertainty widens every B interval) and ranked by their B at it; "
        "overlapping B intervals are a tie (same rank).",
        f"Verdict against {BASELINE}: \"moves A\" when A differs by more than {A_TIE} and the intervals do not "
        "overlap; else \"moves B\" when, refitted with their common A, the B intervals do not overlap; else \"no "
        "detectable change\". ΔB is at that common A (shown) unless A moved.",
    ]


def _markdown(report: Report) -> str:
    parts = [f"# Sigmoid fits: {report.experiment}", "", *(p + "\n" for p in _intro(report)), report.table_md, ""]
    verdicts = _verdict_lines(report)
    if verdicts:
        parts += ["## Verdicts", "", *(f"- {line}" for line in verdicts), ""]
    parts += ["## A and B side by side", "", f"![A and B]({report.params_plot.name})", ""]
    parts += ["## Curves and fits", "", f"![all variants]({report.overview.name})", ""]
    parts += ["## Linearized (slope B)", "", f"![linearized]({report.linearized.name})", ""]
    parts += ["## Extrapolation check", "",
              f"Each variant refitted on the first {EXTRAPOLATION_FRACTION:.0%} of its compute; the fit's prediction "
              "for the end of the run (mean over its last 5% of compute) against what was observed there, and a "
              "power law R = A - D/C^B fitted to the same points, for contrast.", ""]
    parts += [_md_line(EXTRAP_HEADERS), "|" + "---|" * len(EXTRAP_HEADERS)]
    parts += [_md_line(cells) for cells in _extrap_cells(report.rows)]
    parts += ["", "## Per variant", ""]
    parts += [f"![{row.label}]({row.plot.name})" for row in report.rows]
    return "\n".join(parts) + "\n"


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1250px; margin: 2em auto;
       padding: 0 1em; color: #1f2328; line-height: 1.45; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.88em; width: 100%; }
th, td { border: 1px solid #d0d7de; padding: 0.35em 0.6em; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } tr:nth-child(even) td { background: #fbfcfd; }
td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.failed td { color: #9a3412; }
td.v-movesA { font-weight: 600; color: #9a3412; } td.v-movesB { font-weight: 600; color: #1d4ed8; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; }
.plots img { max-width: 100%; border: 1px solid #d0d7de; }
.wide img { max-width: 100%; }
p.small { font-size: 0.9em; color: #57606a; }
"""


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _html_table(headers: list[str], rows_cells: list[list[str]], classes: list[str], num_cols: range) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for klass, cells in zip(classes, rows_cells):
        tds = []
        for i, c in enumerate(cells):
            cls = ' class="num"' if i in num_cols else ""
            if headers[i] == "verdict" and c in ("moves A", "moves B"):
                cls = f' class="v-{c.replace(" ", "")}"'
            tds.append(f"<td{cls}>{esc(c)}</td>")
        body.append(f"<tr{klass}>{''.join(tds)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n" + "\n".join(body) + "\n</tbody></table>"


def _html(report: Report) -> str:
    esc = html.escape
    classes = ["" if row.fit.ok else ' class="failed"' for row in report.rows]
    table = _html_table(TABLE_HEADERS, _table_cells(report.rows), classes, range(2, 8))
    extrap = _html_table(EXTRAP_HEADERS, _extrap_cells(report.rows), [""] * len(report.rows), range(1, 9))
    intro = "".join(f"<p>{esc(p)}</p>" for p in _intro(report)[:1])
    method = "".join(f'<p class="small">{esc(p)}</p>' for p in _intro(report)[1:])
    verdicts = "".join(f"<li>{esc(line)}</li>" for line in _verdict_lines(report))
    plots = "\n".join(_img(row.plot, row.label) for row in report.rows)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Sigmoid fits: {esc(report.experiment)}</title>
<style>{CSS}</style></head>
<body>
<h1>Sigmoid fits: {esc(report.experiment)}</h1>
{intro}
{table}
{f"<h2>Verdicts</h2><ul>{verdicts}</ul>" if verdicts else ""}
<h2>A and B side by side</h2>
<div class="wide">{_img(report.params_plot, "A and B with intervals")}</div>
<h2>Curves and fits</h2>
<div class="wide">{_img(report.overview, "all variants")}</div>
<h2>Linearized: log F(R) against log C, slope B</h2>
<div class="wide">{_img(report.linearized, "linearized")}</div>
<h2>Extrapolation check</h2>
<p class="small">Each variant refitted on the first {EXTRAPOLATION_FRACTION:.0%} of its compute; the prediction for
the end of the run (mean over its last 5% of compute) against what was observed, and a power law R = A - D/C^B
fitted to the same points, for contrast.</p>
{extrap}
<h2>Per variant</h2>
<div class="plots">
{plots}
</div>
<h2>Method</h2>
{method}
</body></html>
"""
