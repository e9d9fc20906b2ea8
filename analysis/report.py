"""MLflow runs -> sigmoid fits per variant -> ranking and verdicts -> fits.csv, variants.csv, report.md, report.html,
PNG plots -> back to MLflow (attached to the sweep's parent run).

`make_report` is the whole pipeline for a sweep of ours, `report_other_runs` for another trainer's runs read by a
mapping (analysis/mapping.py; attached to a new run), both through `report_curves` (`python -m analysis report` is
a thin shell around them; the words, tables and the page's blocks are analysis/text.py, their rendering
analysis/page.py). `variant_rows` builds each variant's record once (`fitted`: its fit, or a failed fit's record,
told apart in `pooled_fit` alone) and then its row (`_row`: rank, verdicts, truth). One report compares one sweep,
runs of one setup (model, task, generator), and gives verdicts to complete, testable runs only; the seeds of a
variant are fitted together; mock runs are checked against their truth (analysis/truth.py). Reading a report:
docs/analysis.md; the method: docs/fitting.md.
"""

from __future__ import annotations

import csv
import functools
import math
import re
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Collection

import numpy as np

from analysis.extrapolate import Extrapolation, extrapolation_check
from analysis.fit import fit_sigmoid
from analysis.adaptive import Decision, decisions_of, report_rule, stopped_at
from analysis.seeded import seeded_bound
from analysis.joint import CommonAFit, fit_common_A
from analysis.law import FitError, SigmoidFit, prepare
from analysis.plots import plot_linearized, plot_overview, plot_params, plot_variant
from analysis.posterior import FitState, fit_state
from analysis.misfit import Misfit, misfit
from analysis.rank import (A_NOT_IDENTIFIED, A_TIE, BASELINE, CATEGORIES, MISFIT, NO_VERDICT, NOT_TESTABLE, Ranked,
                           Verdict, rank_fits, verdict)
from analysis.spread import MARGIN_A, Spread, ToClose, estimate, recipe_verdict, to_close
from analysis.runs import (
    ALL_SWEEPS,
    NoRuns,
    RunCurve,
    check_comparable,
    find_sweep_parent,
    group_seeds,
    load_runs,
    pick_sweep,
    resolve_tracking_uri,
    sweeps_of,
)
from analysis.labels import LabelError, labels_for, labels_line
from analysis.mapping import Mapping, MappingError, Resolved, curves as curves_of, resolve
from analysis.sources import REPORT_ROLE, REPORT_ROLE_TAG, SourceRun
from analysis.synthetic import Truth
from analysis.text import html_page, markdown_page, order_rows, terminal_text
from analysis.truth import Expected, expected, recipe_truth, run_truth

CSV_COLUMNS = ["variant", "A", "A_lo", "A_hi", "B", "B_lo", "B_hi", "C_mid", "R0", "n_points", "status"]
# after the eleven: the ranking (rank; the tie group's common A and the B at it), the verdict against the base
# (dA; dB as compared, dB_basis: own fits or common A, verdict_common_A; the resolution), the seeds, the
# half-run extrapolation check, and for mock runs the truth and whether the verdict agrees with it
CSV_EXTRA = ["C_mid_lo", "C_mid_hi", "rank", "rank_common_A", "rank_B", "rank_B_lo", "rank_B_hi", "verdict",
             "verdict_small", "dA", "dB", "dB_basis", "verdict_common_A", "resolution_dA", "resolution_dB",
             "R_star", "compute_ratio", "resolution_compute", "n_seeds", "label", "run_ids", "extrap_fit_to",
             "extrap_predicted", "extrap_lo", "extrap_hi",
             "extrap_observed", "powerlaw_A", "powerlaw_predicted", "true_A", "true_B", "true_C_mid", "true_dA",
             "true_dB", "true_compute_ratio", "truth_says", "truth_disagrees", "notes",
             "verdict_recipe", "dA_recipe", "resolution_dA_recipe", "resolution_dB_recipe", "spread_sd_A",
             "spread_sd_B", "spread_source", "recipe_truth_says", "recipe_truth_disagrees", "compared_to_gpu_hours",
             "extrap_covered", "misfit", "misfit_z", "more_seeds_variant", "more_seeds_base", "more_seeds_gpu_hours"]
# after the notes: the verdict about the recipes (the spread between runs added: analysis/spread.py) and what it used,
# its judgement by the mock's recipe truth, an adaptive sweep's cut of the base; whether the half-run check's
# prediction held the observed end, and the run's strongest departure from the law (analysis/misfit.py) with its z;
# what would settle an open recipe-level verdict at the margin (analysis/spread.py's to_close): more seeds of each side
ARTIFACT_DIR = "report"
EXTRAPOLATION_FRACTION = 0.5


@dataclass
class ReportRow:
    """One variant (its complete seeds pooled, or its incomplete runs) in rank order. `status` is the fit status,
    with why the runs are incomplete appended; `verdict` is against the base recipe ("no verdict" for incomplete
    runs)."""

    rank: int | None
    variant: str
    label: str  # the variant, with a run id appended when two rows share a variant name
    curves: list[RunCurve] = field(repr=False)
    fit: SigmoidFit
    status: str
    verdict: Verdict
    ranked: Ranked = field(repr=False)
    extrapolation: Extrapolation = field(repr=False)
    plot: Path = field(default=Path())
    incomplete: str = ""  # why its runs get no verdict ("FAILED at step 400 of 1,600"), "" for complete runs
    truth: Truth | None = None  # mock runs: the law the pooled curves follow
    expected: Expected | None = None  # mock runs: what the truth says the verdict should be at its resolution
    own_notes: tuple[str, ...] = ()  # the fit's warnings and its runs' notes (the note without the ties)
    decisions: tuple[Decision, ...] = ()  # an adaptive sweep's decisions at its rungs (of its first run)
    recipe: Verdict | None = None  # the verdict about the recipes: the spread between runs of one recipe added
    recipe_truth: Truth | None = None  # mock runs: the variant's own law (its recipe's, before any run's draw)
    recipe_expected: Expected | None = None
    compared_to: float | None = None  # an adaptive sweep's: the compute the base was cut at for its verdict
    misfit: Misfit | None = None  # the strongest departure from the law (flagged: the law does not describe it)
    to_close: ToClose | None = None  # an open recipe-level verdict: the seeds that would settle it at the margin

    @property
    def note(self) -> str:
        """Its ties (ranked.note), then its own notes."""
        return "; ".join(n for n in (self.ranked.note, *self.own_notes) if n)

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

    @property
    def truth_disagrees(self) -> str:
        """Mock runs: "" when the verdict is right by its truth (analysis/truth.py), else why not."""
        return _judged(self.expected, self.verdict)

    @property
    def recipe_truth_disagrees(self) -> str:
        """Mock runs: "" when the recipe-level verdict is right by the recipes' truth, else why not."""
        return _judged(self.recipe_expected, self.recipe)

    @property
    def B_label(self) -> str:
        """What the B of its ranking is: its own fit's, or at its tie group's common A."""
        if self.ranked.b_fit is not None and self.ranked.common_A is not None:
            return f"at common A {self.ranked.common_A:.3f}"
        return "own fit"


def _judged(want: Expected | None, v: Verdict | None) -> str:
    if want is None or v is None:
        return ""
    return want.judge(v.moves_A, v.dA, v.moves_B, v.dB, v.moves_C,
                      math.log(v.compute.ratio) if v.compute is not None else None)


@dataclass
class Report:
    experiment: str
    sweep: str | None  # the sweep reported (None: runs selected by id; ALL_SWEEPS: every sweep)
    rows: list[ReportRow]
    out_dir: Path
    csv: Path
    markdown: Path
    html: Path
    overview: Path
    table_md: str = ""  # what the terminal shows: the headline, the ranked table (<= 120 columns), the notes below
    artifact_run_id: str | None = None  # the parent run the files were attached to
    artifact_error: str | None = None  # why attaching failed, when it did
    plots: list[Path] = field(default_factory=list)  # one per variant
    params_plot: Path | None = None
    linearized: Path | None = None
    base: str | None = None  # label of the base recipe's row
    sweeps: tuple[str, ...] = ()  # the sweep ids of the runs reported
    spread: Spread = field(default_factory=Spread)  # the between-run spread the recipe-level verdicts use
    others: tuple = ()  # the experiment's other sweeps (runs.SweepSeen), not reported
    picked: bool = False  # the sweep was picked by default (runs.pick_sweep), not named
    c_min: float | None = None  # the fits' cut, in compute's unit (None: 1.5/16 of each run's largest compute)
    base_name: str = BASELINE  # the variant every verdict compares with
    unit: str = "GPU-hours"  # what compute counts (another trainer's runs may count steps, or tokens)
    source: str = ""  # where another trainer's runs came from ("MLflow experiment grpo at sqlite:///mlflow.db")
    mapping: tuple[str, ...] = ()  # how another trainer's runs were read: each choice inferred, each warning

    @property
    def unit_short(self) -> str:
        """The unit as a column header says it: "GPU-h", or the unit itself."""
        return "GPU-h" if self.unit == "GPU-hours" else self.unit

    @property
    def variants_csv(self) -> Path:
        return self.out_dir / "variants.csv"

    @property
    def paths(self) -> list[Path]:
        figures = [p for p in (self.params_plot, self.linearized) if p is not None]
        return [self.csv, self.variants_csv, self.markdown, self.html, self.overview, *figures, *self.plots]

    @property
    def left_out(self) -> list[ReportRow]:
        """Rows of incomplete runs: no rank, no verdict."""
        return [row for row in self.rows if row.incomplete]

    @property
    def verdicts(self) -> list[ReportRow]:
        """Rows with a verdict against the base (one of rank.CATEGORIES)."""
        return [row for row in self.rows if row.verdict.label in CATEGORIES]

    @property
    def has_truth(self) -> bool:
        return any(row.expected is not None for row in self.rows)

    @property
    def resolution(self) -> tuple[float, float] | None:
        """The median over the verdicts of their resolution (|dA|, |dB|); None without verdicts."""
        res = [row.verdict.resolution for row in self.verdicts if row.verdict.resolution]
        if not res:
            return None
        return statistics.median(r[0] for r in res), statistics.median(r[1] for r in res)

    @property
    def recipe_resolution(self) -> tuple[float, float] | None:
        """The median over the recipe-level verdicts of their resolution (|dA|, |dB|); None without any."""
        res = [row.recipe.resolution for row in self.verdicts if row.recipe is not None and row.recipe.resolution]
        if not res:
            return None
        return statistics.median(r[0] for r in res), statistics.median(r[1] for r in res)

    @property
    def compute_resolution(self) -> float | None:
        """The median over the verdicts of the compute ratio they resolve (a factor); None without any."""
        res = [row.verdict.compute.ratio_resolution for row in self.verdicts if row.verdict.compute is not None]
        return statistics.median(res) if res else None


def make_report(
    experiment: str,
    tracking_uri: str | None = None,
    out_dir=None,
    sweep: str | None = None,
    run_ids: Collection[str] | None = None,
    spread: Spread | None = None,
    c_min: float | None = None,
    margin_A: float = MARGIN_A,
) -> Report:
    """Fit every variant of one sweep of `experiment` (the latest unless `sweep` names one; ALL_SWEEPS: every
    sweep; or only `run_ids`), rank them, write the report files to out_dir (default reports/<experiment>) and
    attach them to the sweep's parent run under report/. `spread`: the prior of the between-run spread for the
    recipe-level verdicts (default: the one the sweep tagged on its parent run, else analysis/spread.py's). `c_min`:
    every fit leaves out the points below this compute (GPU-hours; default: 1.5/16 of each run's largest, the
    paper's cut; 0 keeps every point after compute 0).

    Raises analysis.runs.AnalysisError subclasses for bad input (unknown experiment, no runs, no server, runs of
    different models, tasks or generators)."""
    uri = resolve_tracking_uri(tracking_uri)
    seen = sweeps_of(experiment, uri) if run_ids is None and sweep != ALL_SWEEPS else []
    picked = sweep is None and run_ids is None
    if picked:
        chosen = pick_sweep(seen)
        sweep = chosen.id if chosen is not None else None
    curves = load_runs(experiment, uri, None if sweep == ALL_SWEEPS else sweep, run_ids)
    if not curves:
        where = f" for sweep {sweep!r}" if sweep and sweep != ALL_SWEEPS else ""
        where += " among the given run ids" if run_ids is not None else ""
        raise NoRuns(f"no variant runs in experiment {experiment!r}{where}")
    check_comparable(curves)
    parent = _parent_run(curves, experiment, uri, sweep)
    report = report_curves(
        curves, experiment, out_dir, prior=spread if spread is not None else _spread_prior(uri, parent),
        c_min=c_min, sweep=sweep if run_ids is None else None, others=tuple(s for s in seen if s.id != sweep),
        picked=picked, margin_A=margin_A)
    if parent is not None:
        try:
            _attach(uri, parent, report.paths)
            report.artifact_run_id = parent
        except Exception as err:  # the local files are written; a store we cannot write to is not fatal
            report.artifact_error = f"could not attach the report to run {parent}: {err}"
    return report


def report_other_runs(runs: list[SourceRun], mapping: Mapping = Mapping(), *, title: str, source: str,
                      out_dir=None, c_min: float | None = None, attach: tuple[str, str] | None = None,
                      from_file: bool = False, label: str | None = None) -> Report:
    """The report of another trainer's runs (an MLflow experiment of any trainer, a file of curves): `mapping`
    resolved against `runs` (analysis/mapping.py: what it infers is said in Report.mapping), then the same fits,
    ranks, verdicts and files as a sweep's. `attach`: (tracking URI, experiment) of an MLflow source, where a new
    run tagged analysis.role=report holds the files (the user's runs are never changed); None for a file
    (`from_file`: its column `reward` is the reward). `label`: how variants are shown (analysis/labels.py: short,
    the default, full, or a regular expression).

    Raises analysis.runs.AnalysisError subclasses (MappingError: a mapping that does not fit the runs)."""
    resolved = resolve(runs, mapping, source, from_file=from_file)
    found = curves_of(runs, resolved)
    try:
        labels = labels_for([curve.variant for curve in found], label)
    except LabelError as err:
        raise MappingError(str(err)) from None
    found = [replace(curve, variant=labels[curve.variant]) for curve in found]
    named = labels_line(labels)
    report = report_curves(found, title, out_dir, c_min=c_min, base=labels.get(resolved.base, resolved.base),
                           source=source, mapping=tuple([*resolved.said, *([named] if named else []),
                                                         *(f"warning: {w}" for w in resolved.warned)]))
    if attach is not None:
        uri, experiment = attach
        try:
            report.artifact_run_id = _attach_new_run(uri, experiment, report, resolved)
        except Exception as err:  # the local files are written; a store we cannot write to is not fatal
            report.artifact_error = f"could not attach the report to a new run of {experiment}: {err}"
    return report


def report_curves(curves: list[RunCurve], title: str, out_dir=None, *, prior: Spread = Spread(),
                  c_min: float | None = None, base: str | None = BASELINE, sweep: str | None = None,
                  others: tuple = (), picked: bool = False, source: str = "", mapping: tuple[str, ...] = (),
                  margin_A: float = MARGIN_A) -> Report:
    """Fit, rank and judge `curves` against the variant `base`, and write the report's files to out_dir (default
    reports/<title>): the pipeline after the runs are read, whoever logged them."""
    out = Path(out_dir) if out_dir is not None else Path("reports") / _safe(title)
    out.mkdir(parents=True, exist_ok=True)
    unit = curves[0].unit if curves else "GPU-hours"
    base_name = base if base is not None else BASELINE
    rows, used = variant_rows(curves, out, prior=prior, with_spread=True, c_min=c_min, base=base_name,
                              margin_A=margin_A)
    base_row = next((row for row in rows if row.verdict.label == "base"), None)
    for row in rows:
        title_of = f"{row.label} ({_seeds(row)}, {row.run_status})"
        stop = stopped_at(row.curves[0].tags)
        departs = row.misfit.text(unit if unit != "GPU-hours" else "GPU-h") if row.misfit and row.misfit.flagged else ""
        plot_variant(row.curves, row.fit, row.plot, title_of, extrap=row.extrapolation,
                     forecast=stop.band if stop is not None else None, departs=departs)
    shown = order_rows(rows)  # the order of the report's tables (the base first, then by the claim)
    verdicts = {row.label: row.verdict.text for row in rows}
    overview = plot_overview([(row.label, row.curves, row.fit) for row in shown], out / "overview.png",
                             base=base_row.label if base_row else None, verdicts=verdicts)
    params_plot = plot_params([(row.label, row.fit, row.ranked.b_fit) for row in shown],
                              base_row.label if base_row else None, out / "params.png", A_TIE, verdicts=verdicts)
    linear_items = [(row.label, row.curves, row.ranked.b_fit or row.fit, row.B_label) for row in rows]
    linearized = plot_linearized(linear_items, out / "linearized.png")

    report = Report(
        experiment=title,
        sweep=sweep,
        rows=rows,
        out_dir=out,
        csv=_write_run_csv(rows, out / "fits.csv", c_min),
        markdown=out / "report.md",
        html=out / "report.html",
        overview=overview,
        plots=[row.plot for row in rows],
        params_plot=params_plot,
        linearized=linearized,
        base=base_row.label if base_row else None,
        sweeps=tuple(sorted({c.sweep for c in curves})),
        spread=used,
        others=others,
        picked=picked,
        c_min=c_min,
        base_name=base_name,
        unit=unit,
        source=source,
        mapping=mapping,
    )
    report.table_md = terminal_text(report)
    _write_csv(rows, report.variants_csv, used)
    report.markdown.write_text(markdown_page(report))
    report.html.write_text(html_page(report))
    return report


# --- rows: fits, ranking, verdicts, truth ------------------------------------------------------------------------


@dataclass(frozen=True)
class Pooled:
    """A group of runs fitted together: the fit, and the posterior state behind it (its grid and points, which a
    common-A refit needs); no state where the fit failed (fit.status says why)."""

    fit: SigmoidFit
    state: FitState | None = None


def pooled_fit(group: list[RunCurve], c_min: float | None = None) -> Pooled:
    """The group's fit and its state, or a failed fit's record: the one place the two are told apart."""
    compute, reward, runs = _pooled(group)
    try:
        state = fit_state(prepare(compute, reward, runs=runs, c_min=c_min))
    except FitError as err:
        return Pooled(SigmoidFit.failed(err.reason, n_runs=len(group)))
    return Pooled(state.fit, state)


def common_A(pooled: list[Pooled], names: list[str]) -> CommonAFit:
    """Those fits refitted with one common A (analysis/joint.py); FitError naming the ones with no fit."""
    missing = [name for name, p in zip(names, pooled) if p.state is None]
    if missing:
        raise FitError(f"no fit for {', '.join(missing)}")
    return fit_common_A([p.state.data for p in pooled], [p.state for p in pooled])


@dataclass(frozen=True)
class Fitted:
    """One variant's runs fitted, before any comparison: the seeds pooled, each seed's own fit (the pooled one for a
    single run), the strongest departure from the law, and for mock runs the truths."""

    label: str
    curves: list[RunCurve]
    pooled: Pooled
    seeds: list[SigmoidFit]
    misfit: Misfit | None = None
    truth: Truth | None = None  # the law the pooled curves follow
    recipe_truth: Truth | None = None  # the variant's own law, before any run's draw

    @property
    def fit(self) -> SigmoidFit:
        return self.pooled.fit

    @property
    def incomplete(self) -> str:
        """Why its runs get no verdict ("" for complete runs)."""
        return "; ".join(sorted({c.incomplete for c in self.curves if c.incomplete}))


def fitted(group: list[RunCurve], label: str, c_min: float | None = None) -> Fitted:
    """The record of one variant (its runs in `group`), built in this one place."""
    pooled = pooled_fit(group, c_min)
    params = [c.params for c in group]
    return Fitted(label, group, pooled, _seed_fits(group, pooled, c_min), _misfit(group, pooled.fit),
                  run_truth(params), recipe_truth(params))


def _seed_fits(group: list[RunCurve], pooled: Pooled, c_min: float | None) -> list[SigmoidFit]:
    return [pooled.fit] if len(group) == 1 else [pooled_fit([c], c_min).fit for c in group]


def cut_at(base: Fitted, compute: float, c_min: float | None = None) -> Fitted:
    """The base as an adaptive sweep's verdict compares with it: its runs up to `compute`, refitted (its departure
    from the law and its truths stay the whole run's)."""
    curves = [c.upto(compute) for c in base.curves]
    pooled = pooled_fit(curves, c_min)
    return replace(base, curves=curves, pooled=pooled, seeds=_seed_fits(curves, pooled, c_min))


@dataclass(frozen=True)
class Judging:
    """What every row of one report is judged and drawn with."""

    out: Path
    c_min: float | None
    spread: Spread
    base_name: str
    unit: str  # as the verdicts' details say it ("GPU-h")
    margin_A: float = MARGIN_A  # the move of A that matters: an open recipe-level verdict says what settles it there


def variant_rows(curves: list[RunCurve], out: Path = Path("."), *, prior: Spread = Spread(),
                 with_spread: bool = False, c_min: float | None = None, base: str = BASELINE,
                 margin_A: float = MARGIN_A):
    """Complete runs: grouped into variants, fitted, ranked, judged against the base (these runs, and the recipes
    with the spread between runs that the seeds and `prior` give); then incomplete runs, grouped and fitted, with no
    rank and no verdict; every fit leaves out the points below `c_min` (None: the paper's cut, 1.5/16 of each
    run's largest compute); `base` names the variant they are judged against. A variant of an adaptive sweep is
    judged by the rule's own test where it stopped (or at its full budget), beside the base cut at its compute.
    Returns the rows (and the spread used, with_spread)."""
    complete = group_seeds([c for c in curves if not c.incomplete])
    groups = complete + group_seeds([c for c in curves if c.incomplete])
    variants = [fitted(group, label, c_min) for group, label in zip(groups, _labels(groups))]
    n = len(complete)
    ranked = rank_fits([(v.label, v.fit) for v in variants[:n]],
                       common=lambda indices: common_A([variants[i].pooled for i in indices],
                                                       [variants[i].label for i in indices]))
    ranked += [Ranked(rank=None, name=v.label, fit=v.fit, index=i) for i, v in enumerate(variants) if i >= n]
    used = estimate([v.seeds for v in variants[:n]], prior)
    unit = "GPU-h" if not curves or curves[0].unit == "GPU-hours" else curves[0].unit
    judging = Judging(out, c_min, used, base, unit, margin_A)
    base_variant = _base_of(variants[:n], base)
    base_at = functools.cache(lambda compute: cut_at(base_variant, compute, c_min))  # one refit a cut, this report's
    rows = [_row(variants[r.index], r, base_variant, base_at, judging) for r in ranked]
    return (rows, used) if with_spread else rows


def _row(variant: Fitted, r: Ranked, base: Fitted | None, base_at, judging: Judging) -> ReportRow:
    """The variant's row: its verdict against the base (cut where an adaptive sweep's rule stopped it: base_at) and
    about the recipes, what the truth says of both (mock runs)."""
    decisions = tuple(decisions_of(variant.curves[0].tags))
    rule = report_rule(decisions, max(c.c_max for c in variant.curves)) if variant is not base else None
    against = base_at(rule.compute) if rule is not None and base is not None else base
    v = _verdict(variant, against, variant is base, rule, judging)
    bound = rule.recipe_bound if rule is not None else seeded_bound([c.tags for c in variant.curves])
    recipe = (recipe_verdict(v, variant.fit, against.fit, variant.seeds, against.seeds, judging.spread, bound=bound)
              if against is not None and v.label in (*CATEGORIES, A_NOT_IDENTIFIED) else None)
    expected_, recipe_expected = _expected(variant, base, v, recipe)
    closing = None
    if recipe is not None and against is not None and variant is not base:
        cost = tuple(sum(c.c_max for c in side.curves) / len(side.curves) for side in (variant, base))
        closing = to_close(recipe, variant.seeds, base.seeds if base is not None else against.seeds, judging.spread,
                           cost, judging.margin_A)
    why = variant.incomplete
    return ReportRow(
        rank=r.rank,
        variant=variant.curves[0].variant,
        label=r.name,
        curves=variant.curves,
        fit=variant.fit,
        status=f"{variant.fit.status}; {why}" if why else variant.fit.status,
        own_notes=tuple(n for n in (*variant.fit.notes, *(n for c in variant.curves for n in c.notes)) if n),
        verdict=v,
        ranked=r,
        extrapolation=_extrapolate(variant.curves, judging.c_min),
        plot=judging.out / f"fit-{_safe(r.name)}.png",
        incomplete=why,
        truth=variant.truth,
        expected=expected_,
        decisions=decisions,
        recipe=recipe,
        recipe_truth=variant.recipe_truth,
        recipe_expected=recipe_expected,
        compared_to=rule.compute if rule is not None else None,
        misfit=variant.misfit,
        to_close=closing,
    )


def _expected(variant: Fitted, base: Fitted | None, v: Verdict, recipe: Verdict | None):
    """Mock runs: what the truth says the verdict should be at its resolution, and the recipe-level one; None
    where there is no truth or no verdict to judge."""
    seen = (variant.truth is not None and base is not None and base.truth is not None and v.label in CATEGORIES
            and v.resolution is not None)
    if not seen:
        return None, None
    judged = expected(variant.truth, base.truth, v.resolution, v.compute)
    recipe_seen = recipe is not None and variant.recipe_truth is not None and base.recipe_truth is not None
    return judged, (expected(variant.recipe_truth, base.recipe_truth, recipe.resolution, recipe.compute)
                    if recipe_seen else None)


def _verdict(variant: Fitted, base: Fitted | None, is_base: bool, rule, judging: Judging) -> Verdict:
    """Against the base: none for incomplete runs or an axis not testable; the base's own; a flagged misfit on
    either side; else analysis.rank.verdict, held to an adaptive sweep's rule where one looked."""
    fit, departs, name, unit = variant.fit, variant.misfit, judging.base_name, judging.unit
    untestable = next((c.untestable for c in variant.curves if c.untestable), "")
    if variant.incomplete:
        return Verdict(NO_VERDICT, detail=f"incomplete: {variant.incomplete}")
    if untestable and not is_base:
        return Verdict(NOT_TESTABLE, detail=untestable)
    if base is None:
        return verdict(fit, None, base_name=name)
    if is_base:
        if not fit.ok:
            return verdict(fit, None, base_name=name)
        tail = f"; {MISFIT}: it {departs.text(unit)}" if departs is not None and departs.flagged else ""
        return Verdict("base", dA=0.0, dB=0.0, detail=f"the base recipe{tail}")
    if departs is not None and departs.flagged and fit.ok:
        return Verdict(MISFIT, detail=f"{MISFIT}: the run {departs.text(unit)}, beyond its own noise; its A is not "
                                      "a ceiling, so no claim is made")
    if base.misfit is not None and base.misfit.flagged and fit.ok:
        return Verdict("no base", detail=f"{name}'s run {base.misfit.text(unit)}: {MISFIT}, so it has no ceiling to "
                                         "compare with")
    bounds, locked = (rule.bounds, rule.locked) if rule is not None else (None, ())
    return verdict(fit, base.fit, common=lambda: common_A([variant.pooled, base.pooled], [variant.label, base.label]),
                   bounds=bounds, locked=locked, base_name=name, unit=unit)


def _misfit(group: list[RunCurve], fit: SigmoidFit) -> Misfit | None:
    """The strongest departure of a variant's pooled points from its fit (None without a fit)."""
    if not fit.ok:
        return None
    compute, reward, runs = _pooled(group)
    try:
        return misfit(compute, reward, fit, runs=runs)
    except FitError:
        return None


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


def _extrapolate(group: list[RunCurve], c_min: float | None = None) -> Extrapolation:
    compute, reward, runs = _pooled(group)
    return extrapolation_check(compute, reward, fraction=EXTRAPOLATION_FRACTION, runs=runs, c_min=c_min)


def _base_of(complete: list[Fitted], base: str = BASELINE) -> Fitted | None:
    """The base recipe among complete variants: the variant `base` (the fitted one with the most seeds, then the
    first)."""
    candidates = [(k, v) for k, v in enumerate(complete) if v.curves[0].variant == base]
    if not candidates:
        return None
    return max(candidates, key=lambda kv: (kv[1].fit.ok, len(kv[1].curves), -kv[0]))[1]


def _labels(groups: list[list[RunCurve]]) -> list[str]:
    names = [group[0].variant for group in groups]
    return [name if names.count(name) == 1 else f"{name} ({group[0].run_id[:7]})" for name, group in zip(names, groups)]


def _seeds(row: ReportRow) -> str:
    return f"{row.n_seeds} seeds" if row.n_seeds > 1 else f"run {row.run_id[:8]}"


SPREAD_TAG = "ablate.spread_prior"  # the sweep's prior of the between-run spread (JSON: sd_A, sd_B, prior_dof)


def _spread_prior(uri: str, parent: str | None) -> Spread:
    """The prior a sweep tagged on its parent run (sweep.run_sd_A, .run_sd_B, .run_sd_dof), else the default."""
    if parent is None:
        return Spread()
    import json

    from mlflow.tracking import MlflowClient

    text = MlflowClient(tracking_uri=uri).get_run(parent).data.tags.get(SPREAD_TAG)
    try:
        said = json.loads(text) if text else {}
        return Spread(sd_A=float(said.get("sd_A", Spread.sd_A)), sd_B=float(said.get("sd_B", Spread.sd_B)),
                      prior_dof=float(said.get("prior_dof", Spread.prior_dof)))
    except (TypeError, ValueError):
        return Spread()


def _parent_run(curves: list[RunCurve], experiment: str, uri: str, sweep: str | None) -> str | None:
    """The sweep's parent run: the run tagged role=sweep for the sweep reported, else the one parent all runs
    share."""
    if sweep and sweep != ALL_SWEEPS:
        parent = find_sweep_parent(experiment, sweep, uri)
        if parent:
            return parent
    parents = {curve.parent_run_id for curve in curves}
    return parents.pop() if len(parents) == 1 and None not in parents else None


REPORT_RUN = "analysis-report"  # the name of the run that holds a report of another trainer's runs


def _attach_new_run(uri: str, experiment: str, report: Report, resolved: Resolved) -> str:
    """A new run in `experiment` (tagged analysis.role=report, so that a later report skips it) holding the report's
    files under report/ and the mapping it used as params; the runs it read are left as they were."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    run = client.create_run(exp.experiment_id, run_name=REPORT_RUN, tags={REPORT_ROLE_TAG: REPORT_ROLE})
    try:
        variants = sorted(set(resolved.variants.values()))
        rewards = sorted(set(resolved.reward.values()))
        for key, value in (("reward", ", ".join(rewards)), ("compute", resolved.compute.text),
                           ("base", resolved.base or ""), ("variants", ", ".join(variants)),
                           ("runs", str(len(resolved.reward)))):
            client.log_param(run.info.run_id, f"mapping.{key}", value[:6000])
        _attach(uri, run.info.run_id, report.paths)
    except Exception:
        client.set_terminated(run.info.run_id, status="FAILED")
        raise
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def _attach(uri: str, run_id: str, paths: list[Path]) -> None:
    """Log exactly the files of this report (not whatever else lies in out_dir) under report/."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    for path in paths:
        client.log_artifact(run_id, str(path), artifact_path=ARTIFACT_DIR)


# --- csv files ---------------------------------------------------------------------------------------------------


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "run"


def _csv_num(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return f"{x:.6g}"


def _write_run_csv(rows: list[ReportRow], path: Path, c_min: float | None = None) -> Path:
    """fits.csv: one row per run, the eleven columns of CSV_COLUMNS (docs/analysis.md), then its run id and its
    variant's rank and verdict. A variant with one run has its row as in variants.csv; each seed of a pooled variant
    is fitted alone here (its pooled fit is in variants.csv)."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS + ["run_id", "variant_rank", "verdict"])
        for row in rows:
            for curve in row.curves:
                if row.n_seeds == 1:
                    fit = row.fit
                else:
                    fit = pooled_fit([curve], c_min).fit
                numbers = ([fit.A, *fit.ci["A"], fit.B, *fit.ci["B"], fit.C_mid, fit.R0, fit.n_points] if fit.ok
                           else [math.nan] * (len(CSV_COLUMNS) - 2))
                status = row.status if row.n_seeds == 1 else (
                    f"{fit.status}; {curve.incomplete}" if curve.incomplete else fit.status)
                writer.writerow([row.variant, *(_csv_num(x) for x in numbers), status, curve.run_id,
                                 "" if row.rank is None else row.rank, row.verdict.label])
    return path


def _write_csv(rows: list[ReportRow], path: Path, spread: Spread = Spread()) -> Path:
    """variants.csv: one row per variant (seeds pooled), the eleven documented columns first, then the rest (rank,
    the common-A refit, the verdict and its resolution, the seeds, the extrapolation check, the truth of mock
    runs); rows in rank order."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS + CSV_EXTRA)
        for row in rows:
            r = row.recipe
            recipe = ([r.label, _csv_num(r.dA), *(_csv_num(x) for x in (r.resolution or (None, None)))]
                      if r is not None else [""] * 4)
            recipe += [_csv_num(spread.sd_A), _csv_num(spread.sd_B), spread.source] if r is not None else [""] * 3
            recipe += [row.recipe_expected.text if row.recipe_expected is not None else "", row.recipe_truth_disagrees,
                       _csv_num(row.compared_to)]
            departs = row.misfit
            recipe += ["" if not row.extrapolation.ok else str(row.extrapolation.covered).lower(),
                       departs.text(row.curve.unit if row.curve.unit != "GPU-hours" else "GPU-h")
                       if departs is not None and departs.flagged else "",
                       _csv_num(departs.z) if departs is not None else ""]
            k = row.to_close
            recipe += [k.variant, k.base, _csv_num(k.gpu_hours)] if k is not None else [""] * 3
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
            res = v.resolution or (None, None)
            c = v.compute
            res += (c.R_star, c.ratio, c.ratio_resolution) if c is not None else (None,) * 3
            t, e = row.truth, row.expected
            truth = [t.A, t.B, t.C_mid] if t is not None else [None] * 3
            truth += [e.dA, e.dB] if e is not None else [None] * 2
            truth += [math.exp(e.dlnC) if e is not None and e.dlnC is not None else None]
            writer.writerow([
                row.variant, *(_csv_num(x) for x in numbers), row.status,
                *(_csv_num(x) for x in c_ci), "" if row.rank is None else row.rank, *(_csv_num(x) for x in rank_b),
                v.label, "small" if v.small else "", _csv_num(v.dA), _csv_num(v.dB), v.b_basis,
                _csv_num(v.common_A), *(_csv_num(x) for x in res),
                row.n_seeds, row.label, " ".join(row.run_ids), *(_csv_num(x) for x in ex_numbers),
                *(_csv_num(x) for x in truth), e.text if e is not None else "", row.truth_disagrees, row.note,
                *recipe,
            ])
    return path
