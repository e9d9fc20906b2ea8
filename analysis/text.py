"""The report's words: the headline, the tables, the verdict lines; put together as the terminal text (at most 120
columns: the table's notes go below it), report.md and report.html.

Which B is which is said wherever a B is shown: the table's B is each variant's own fit; a verdict's ΔB is the
B it compared (own fits, or both refitted "at common A 0.605"); a ranking tie group's B is at its common A.
"""

from __future__ import annotations

import base64
import html
import math
import textwrap
from pathlib import Path

from analysis.adaptive import gpu_hours_saved, stopped_at
from analysis.law import CI_LEVEL, fmt_compute
from analysis.published import CAPTION, published, setup_of
from analysis.rank import (A_NOT_IDENTIFIED, A_TIE, BASELINE, BOTH, CATEGORIES, CRITICAL, MOVES_A, MOVES_B, MOVES_C,
                           NO_CHANGE, NOT_TESTABLE)
from analysis.runs import ALL_SWEEPS, EXTENDED_TAG

WIDTH = 120  # the terminal text's widest line


# --- the headline ------------------------------------------------------------------------------------------------


def headline(report) -> list[str]:
    """What was compared, the verdicts in a line, the runs left out and why, the resolution, the truth check."""
    scope = _scope(report)
    n_runs = sum(row.n_seeds for row in report.rows)
    seeds = sorted({row.n_seeds for row in report.rows if not row.incomplete})
    per = (f"{seeds[0]} seed{'s' if seeds[0] > 1 else ''} per variant" if len(seeds) == 1
           else "seeds pooled" if seeds else "no complete run")
    lines = [f"{report.experiment}, {scope}: {len(report.rows)} rows from {n_runs} runs ({per}), "
             f"{sum(r.fit.ok for r in report.rows)} fitted."]
    if report.base:
        runs = _counts([row.verdict for row in report.verdicts])
        recipes = _counts([row.recipe for row in report.verdicts if row.recipe is not None])
        lines.append(f"Against {report.base}: {runs}." + (f" The recipes: {recipes}." if recipes != runs else
                                                          " The recipes: the same."))
    else:
        lines.append(f"No complete {BASELINE} run: no verdicts against the base recipe.")
    if report.left_out:
        named = "; ".join(f"{row.label}: {row.incomplete}" for row in report.left_out)
        lines.append(f"No rank and no verdict (incomplete runs): {named}.")
    early = [row.label for row in report.rows if row.verdict.label == A_NOT_IDENTIFIED]
    if early:
        lines.append(f"No verdict yet, {A_NOT_IDENTIFIED} (a run's data stop before its fitted C_mid, nothing else "
                     f"moved): {', '.join(early)}.")
    untestable = [row for row in report.rows if row.verdict.label == NOT_TESTABLE]
    if untestable:
        named = "; ".join(f"{row.label}: {row.verdict.detail}" for row in untestable)
        lines.append(f"No verdict, {NOT_TESTABLE}: {named}.")
    res, res_c, res_r = report.resolution, report.compute_resolution, report.recipe_resolution
    if res is not None:
        compute = (f", compute to reach a common reward {_res_c(res_c)}" if res_c is not None else "")
        recipes = (f"; between the recipes, {_res_a(res_r[0])} and {_res_b(res_r[1])} (the spread between runs of one "
                   f"recipe added: {report.spread.source})" if res_r is not None else "")
        lines.append(f"Resolution, found 9 times in 10 (median over the verdicts): between these runs "
                     f"{_res_a(res[0])}, {_res_b(res[1])}{compute}{recipes}. \"No detectable change\" means: none at "
                     "that resolution.")
    if report.has_truth:
        lines.append(truth_line(report))
    return lines


def _counts(verdicts) -> str:
    """ "2 moves A (1 small), 1 moves B" over CATEGORIES, or "no verdicts"."""
    counts = {label: 0 for label in CATEGORIES}
    small = 0
    for v in verdicts:
        counts[v.label] += v.label in counts
        small += v.small
    said = [f"{n} {label}" for label, n in counts.items() if n]
    said = [s + (f" ({small} small)" if s.endswith(f" {MOVES_A}") and small else "") for s in said]
    return ", ".join(said) or "no verdicts"


def truth_line(report) -> str:
    """ "Mock runs, known truth: 8 of 8 verdicts agree with it, about the recipes 8 of 8 (not: ...)." """
    judged = [row for row in report.rows if row.expected is not None]
    wrong = [row.label for row in judged if row.truth_disagrees]
    recipes = [row for row in report.rows if row.recipe_expected is not None]
    wrong_r = [row.label for row in recipes if row.recipe_truth_disagrees]
    about = (f"; about the recipes {len(recipes) - len(wrong_r)} of {len(recipes)}"
             + (f" (not: {', '.join(wrong_r)})" if wrong_r else "") if recipes else "")
    return (f"Mock runs, known truth: {len(judged) - len(wrong)} of {len(judged)} verdicts agree with it"
            + (f" (not: {', '.join(wrong)})" if wrong else "") + about
            + "; the truth is beside each fit in the report.")


def _scope(report) -> str:
    if report.sweep is None:
        return f"selected runs of sweep {', '.join(report.sweeps)}"
    if report.sweep == ALL_SWEEPS:
        return f"all sweeps ({', '.join(report.sweeps)})"
    return f"sweep {report.sweep}"


def _res_a(x: float) -> str:
    return f"|ΔA| >= {x:.3f}" if math.isfinite(x) else "any ΔA (not resolved: an A interval is open)"


def _res_b(x: float) -> str:
    return f"|ΔB| >= {x:.2f}" if math.isfinite(x) else "any ΔB (not resolved: a B interval is open)"


def _res_c(factor: float) -> str:
    return f"x{factor:.2f} or more" if math.isfinite(factor) else "by any factor (not resolved: an interval is open)"


# --- the ranked table --------------------------------------------------------------------------------------------

TABLE_HEADERS = ["#", "variant", "A [90% CI]", "B own fit [90% CI]", f"ΔA vs {BASELINE}", "ΔB as compared",
                 "verdict"]


def _num(x: float, digits: int) -> str:
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    return f"{x:.{digits}f}"


def _interval(x: float, ci: tuple[float, float], digits: int) -> str:
    return f"{_num(x, digits)} [{_num(ci[0], digits)}, {_num(ci[1], digits)}]"


def _delta_b(row) -> str:
    """dB with what it compares: "-0.41 at A 0.607" (both refitted with a common A) or "+0.02 own fits"."""
    v = row.verdict
    if v.dB is None or v.label not in CATEGORIES:
        return ""
    where = f"at A {v.common_A:.3f}" if v.common_A is not None else "own fits"
    return f"{v.dB:+.2f} {where}"


def table_cells(rows) -> list[list[str]]:
    cells = []
    for row in rows:
        fit, v = row.fit, row.verdict
        numbers = ([_interval(fit.A, fit.ci["A"], 3), _interval(fit.B, fit.ci["B"], 2)] if fit.ok else ["", ""])
        dA = f"{v.dA:+.3f}" if v.dA is not None and v.label in CATEGORIES else ""
        cells.append(["" if row.rank is None else str(row.rank), row.label, *numbers, dA, _delta_b(row), v.text])
    return cells


def md_line(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def md_table(headers: list[str], rows_cells: list[list[str]]) -> str:
    return "\n".join([md_line(headers), "|" + "---|" * len(headers)] + [md_line(c) for c in rows_cells])


def ranked_table(report) -> str:
    return md_table(TABLE_HEADERS, table_cells(report.rows))


# the terminal's table (at most WIDTH columns): the verdicts about these runs and about the recipes; the changes and
# resolutions go on one line a verdict below it (summary_lines)
TERMINAL_HEADERS = ["#", "variant", "A [90% CI]", "B own fit [90% CI]", "these runs", "the recipes"]


def terminal_cells(rows) -> list[list[str]]:
    out = []
    for row, cells in zip(rows, table_cells(rows)):
        recipe = (row.recipe.text if row.recipe is not None and row.recipe.label in (*CATEGORIES, A_NOT_IDENTIFIED)
                  else "base" if row.verdict.label == "base" else "")
        out.append([*cells[:4], cells[6], recipe])
    return out


def summary_lines(report) -> list[str]:
    """One line a verdict: the changes (z), then the resolution between these runs and between the recipes."""
    lines = []
    for row in report.rows:
        v, r = row.verdict, row.recipe
        if v.label not in (*CATEGORIES, A_NOT_IDENTIFIED):
            continue
        parts = [f"ΔA {v.dA:+.3f} (z {v.claims['A'].z:+.1f})" if v.A_identified and "A" in v.claims else
                 "A not identified yet"]
        parts.append(f"ΔB {v.dB:+.2f} {'at A ' + format(v.common_A, '.3f') if v.common_A is not None else 'own fits'}"
                     + (f" (z {v.claims['B'].z:+.1f})" if "B" in v.claims else ""))
        if v.compute is not None:
            parts.append(f"compute {v.compute.ratio:.2f}x")
        res = "resolves " + _short_res(v, r if r is not None and r.resolution else None)
        lines.append(f"{row.label}: {', '.join(parts)}{_where(row)}; {res}")
    return lines


def _where(row) -> str:
    """An adaptive sweep's run: " (stopped at step 20 of 40, 8,000 GPU-h saved; vs scalerl cut at 8,000 GPU-h)"."""
    if not row.decisions:
        return ""
    tags = row.curves[0].tags
    stop = stopped_at(tags)
    said = (f"stopped at step {stop.step} of {stop.steps}, {fmt_compute(gpu_hours_saved(stop))} GPU-h saved"
            if stop is not None else f"extended from step {tags[EXTENDED_TAG]}" if EXTENDED_TAG in tags
            else "ran its budget")
    cut = f"; vs {BASELINE} cut at {fmt_compute(row.compared_to)} GPU-h" if row.compared_to is not None else ""
    return f" ({said}{cut})"


def _short_res(v, recipes=None) -> str:
    """ "|ΔA| 0.016 (recipes 0.082), |ΔB| 0.50": the resolution between these runs, and between the recipes where
    it differs (a side not resolved: "ΔA open")."""
    out = []
    for k, name, digits in ((0, "ΔA", 3), (1, "ΔB", 2)):
        x = v.resolution[k]
        text = f"|{name}| {x:.{digits}f}" if math.isfinite(x) else f"{name} open"
        y = recipes.resolution[k] if recipes is not None else x
        if f"{y:.{digits}f}" != f"{x:.{digits}f}":
            text += f" (recipes {y:.{digits}f})" if math.isfinite(y) else " (recipes open)"
        out.append(text)
    return ", ".join(out)


# --- per variant: the verdict with its resolution, and the notes -------------------------------------------------


def verdict_lines(report) -> list[str]:
    """One line per row but the base: its verdict, what it rests on, its resolution; then the fit's notes."""
    lines = []
    for row in report.rows:
        v = row.verdict
        if v.label == "base":
            continue
        text = f"{row.label}: {v.text}"
        if v.label == NO_CHANGE and v.resolution:
            text += f" at this resolution ({v.resolution_text})"
        elif v.resolution:
            text += f" (resolution {v.resolution_text})"
        if v.detail:
            text += f". {v.detail[0].upper()}{v.detail[1:]}"
        if row.compared_to is not None:
            text += (f". Held to the adaptive sweep's test where it stopped, beside {BASELINE} cut at "
                     f"{fmt_compute(row.compared_to)} GPU-h")
        r = row.recipe
        if r is not None and r.resolution:
            text += f". About the recipes: {r.text} (resolution {r.resolution_text}); {r.detail}"
        lines.append(text + ".")
    return lines


def note_lines(report) -> list[str]:
    """Each group of variants tied on A (their A intervals overlap) or on B, once, with how the tie on A was
    ranked; then each note of a row's own (fit warnings, its runs'), naming every variant it holds for. Nine variants
    tied on A is one line, not nine."""
    lines, seen = [], set()
    for row in report.rows:
        r = row.ranked
        for names, what, rule in ((r.tie_with, "A", r.tie_rule), (r.b_tie_with, "B", "")):
            group = frozenset((r.name, *names))
            if names and (what, group) not in seen:
                seen.add((what, group))
                members = ", ".join(x.ranked.name for x in report.rows if x.ranked.name in group)
                lines.append(f"tie on {what} (the {what} intervals overlap): {members}{rule}.")
    by_note: dict[str, list[str]] = {}  # a note several variants share is one line naming them
    for row in report.rows:
        for note in row.own_notes:
            by_note.setdefault(note, []).append(row.label)
    for note, labels in by_note.items():
        lines.append(f"{', '.join(labels)}: {note}." if len(labels) == 1 else f"{note[0].upper()}{note[1:]}: "
                     f"{', '.join(labels)}.")
    return lines


# --- the known truth of mock runs --------------------------------------------------------------------------------

TRUTH_HEADERS = ["variant", "A fit", "A true", "ΔA fit", "ΔA true", "B fit", "B true", "ΔB fit", "ΔB true",
                 "compute fit", "compute true", "truth says", "verdict agrees", "recipes: ΔA true",
                 "recipes: truth says", "recipe verdict agrees"]
# the terminal's (at most WIDTH columns): the fitted ΔA and ΔB are in the ranked table above it
TERMINAL_TRUTH = ["variant", "A fit", "A true", "ΔA true", "B fit", "B true", "ΔB true", "compute true",
                  "truth says", "verdict agrees"]


def truth_cells(report, headers: list[str] = TRUTH_HEADERS) -> list[list[str]]:
    """Per row with a truth: fitted and true A, B, ΔA, ΔB, and the compute to reach the verdict's R* as a ratio to
    the base's, side by side; what the truth says the verdict should be at its resolution (analysis/truth.py) and
    whether the verdict (in the ranked table) agrees. B fit is the B the verdict compared (own fit, or at the common
    A it names); B true is the variant's own. Only the columns in `headers`."""
    cells = []
    for row in report.rows:
        t, e, v = row.truth, row.expected, row.verdict
        if t is None or not row.fit.ok:
            continue
        b_fit = v.B[0] if v.B is not None else row.fit.B
        judged = e is not None
        cell = {
            "variant": row.label, "A fit": f"{row.fit.A:.3f}", "A true": f"{t.A:.3f}",
            "ΔA fit": f"{v.dA:+.3f}" if v.dA is not None and judged else "",
            "ΔA true": f"{e.dA:+.3f}" if judged else "",
            "B fit": f"{b_fit:.2f}" + (f" at A {v.common_A:.3f}" if v.common_A is not None else ""),
            "B true": f"{t.B:.2f}",
            "ΔB fit": f"{v.dB:+.2f}" if v.dB is not None and judged else "",
            "ΔB true": f"{e.dB:+.2f}" if judged else "",
            "compute fit": f"{v.compute.ratio:.2f}x" if v.compute is not None and judged else "",
            "compute true": f"{math.exp(e.dlnC):.2f}x" if judged and e.dlnC is not None else "",
            "truth says": e.text if judged else "",
            "verdict agrees": ("no: " + row.truth_disagrees if row.truth_disagrees else "yes") if judged else "",
            "recipes: ΔA true": f"{row.recipe_expected.dA:+.3f}" if row.recipe_expected is not None else "",
            "recipes: truth says": row.recipe_expected.text if row.recipe_expected is not None else "",
            "recipe verdict agrees": (("no: " + row.recipe_truth_disagrees if row.recipe_truth_disagrees else "yes")
                                      if row.recipe_expected is not None else ""),
        }
        cells.append([cell[h] for h in headers])
    return cells


def truth_table(report, headers: list[str] = TRUTH_HEADERS) -> str:
    return md_table(headers, truth_cells(report, headers))


TRUTH_NOTE = ("Truth: the mock's params (mock.run.A: the runs' A, averaged over seeds; mock.truth.B: the "
              "variant's B; compute: the law's compute to reach the verdict's R*, over the base's). Truth says what "
              "the verdict must find (\"moved\": the true change is at least the verdict's resolution) and must not "
              "claim (\"unmoved\": no change); changes below the resolution are left out: either verdict is right. "
              "A compute change need not be named where A or B moved (they move it too). The recipes' truth is the "
              "variant's law before any run's own draw of A (mock.truth.A): what a recipe-level verdict is judged by.")


# --- the terminal text -------------------------------------------------------------------------------------------


def _wrap(text: str, bullet: str = "") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=bullet, subsequent_indent=" " * len(bullet),
                         break_long_words=True, break_on_hyphens=False) or [""]


ADAPTIVE_HEADERS = ["variant", "rungs", "stopped", "why", "GPU-h spent", "GPU-h saved"]


def adaptive_cells(report) -> list[list[str]]:
    """Per variant of an adaptive sweep: its rungs' decisions, where it stopped and why, GPU-hours spent and saved."""
    cells = []
    for row in report.rows:
        if not row.decisions:
            continue
        tags = row.curves[0].tags
        stop = stopped_at(tags)
        spent = max((c.c_max for c in row.curves), default=0.0)
        where = (f"rung {stop.rung}, step {stop.step} of {stop.steps}" if stop is not None else
                 f"extended from step {tags[EXTENDED_TAG]}" if EXTENDED_TAG in tags else "ran its budget")
        why = row.decisions[-1].reason if stop is None else stop.reason
        saved = gpu_hours_saved(stop) if stop is not None else 0.0
        cells.append([row.label, " ".join("stop" if d.stop else "go" for d in row.decisions), where, why,
                      fmt_compute(spent), fmt_compute(saved)])
    return cells


def adaptive_total(report) -> str:
    """ "The adaptive sweep spent 123,456 GPU-hours, 78% of the 158,000 its runs would have at their budgets." """
    rows = [row for row in report.rows if row.decisions]
    spent = sum(max((c.c_max for c in row.curves), default=0.0) for row in rows)
    stops = [stopped_at(row.curves[0].tags) for row in rows]
    saved = sum(gpu_hours_saved(stop) for stop in stops if stop is not None)
    if not rows or spent + saved <= 0:
        return ""
    return (f"The adaptive sweep spent {fmt_compute(spent)} GPU-hours, {spent / (spent + saved):.0%} of the "
            f"{fmt_compute(spent + saved)} its runs would have spent at their full budgets (saved: the steps left "
            "at the compute a step each run ran at). A stopped variant is judged where it stopped: its verdict's "
            "resolution says what that cost.")


def terminal_text(report) -> str:
    """What a sweep prints when it ends, on one screen: the headline, the ranked table with the verdicts about these
    runs and about the recipes, one line a verdict (its changes and resolutions), the adaptive sweep's total (every
    line at most WIDTH characters; a variant name too long for the table makes its row longer). The reasoning (each
    verdict's intervals and tests, the ties, the fit notes, the truth table) is in report.md and report.html."""
    lines = [wrapped for line in headline(report) for wrapped in _wrap(line)]
    lines += ["", md_table(TERMINAL_HEADERS, terminal_cells(report.rows)), ""]
    lines += [w for line in summary_lines(report) for w in _wrap(line, "- ")]
    total = adaptive_total(report)
    if total:
        lines += [""] + _wrap(total)
    lines += [""] + _wrap("Each verdict's tests, the ties, the fits' notes"
                          + (" and the known truth" if report.has_truth else "") + ": report.md and report.html.")
    return "\n".join(lines)


# --- report.md and report.html -----------------------------------------------------------------------------------

FULL_HEADERS = ["rank", "variant", "seeds", "A [90% CI]", "B own fit [90% CI]", "C_mid GPU-h [90% CI]",
                f"ΔA vs {BASELINE}", "ΔB as compared", "verdict", "resolution", "the recipes", "resolution (recipes)",
                "status"]


def full_cells(rows) -> list[list[str]]:
    cells = []
    for row, short in zip(rows, table_cells(rows)):
        fit = row.fit
        c_mid = (f"{fmt_compute(fit.C_mid)} [{fmt_compute(fit.ci['C_mid'][0])}, {fmt_compute(fit.ci['C_mid'][1])}]"
                 if fit.ok else "")
        r = row.recipe
        recipe = [r.text, r.resolution_text] if r is not None and r.resolution else ["", ""]
        cells.append([short[0], short[1], str(row.n_seeds), short[2], short[3], c_mid, short[4], short[5],
                      short[6], row.verdict.resolution_text, *recipe, row.status])
    return cells


def method_paragraphs() -> list[str]:
    return [
        "Each variant's validation pass rate R is fitted against training compute C (GPU-hours) with the sigmoid "
        "law of ScaleRL (Eq. 1): R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B). "
        "A is the ceiling: the pass rate the recipe approaches with unlimited compute. B is the efficiency: how "
        "steeply the curve climbs towards A (higher is faster). C_mid is the compute at half of the gain A - R0. "
        "R0 is the pass rate before RL (step 0), measured; the fit may move it within its error. Seeds of one "
        "variant are fitted together.",
        f"Points below 1.5/16 of a run's final compute are left out, as in the paper. Intervals are "
        f"{CI_LEVEL:.0%} likelihood-ratio intervals under a noise model fitted to each variant's residuals (white "
        "noise plus a slow wobble correlated in compute); a bound of 1 on A, or ∞ on B or C_mid, means the data do "
        "not bound that side (typically: the run stopped before its midpoint).",
        "Ranking: by A, highest first. Variants whose A intervals overlap the group's best are tied on A: they are "
        "refitted together with one common A (a shared parameter, so its uncertainty widens every B interval) and "
        "ranked by their B at it, unless the data fit one common A poorly (its likelihood-ratio test has p < 0.5): "
        "then by their own B. Overlapping B intervals are a tie (same rank).",
        f"Verdict against {BASELINE}: each claim is a z-test, the change over the standard error the two fits' "
        f"intervals give it (their facing sides), held to {CRITICAL:.2f} (a false claim 2 times in 100: the rule "
        f"\"the 90% intervals apart\" for two equally wide ones), or to an adaptive sweep's boundary at the look "
        f"it stopped. \"{MOVES_A}\" when A's is made, \"small\" when the change is below the paper's {A_TIE}; "
        f"\"{MOVES_B}\" when B's is; \"{BOTH}\"; \"{MOVES_C}\" when neither is but the compute each run needs to "
        f"reach a reward both reach (R*: the smaller of the two fits' rewards at the middle of their fitted compute, "
        f"in log C; its interval from the fit's posterior draws) differs: at a common A and B that ratio is the "
        f"ratio of their C_mid (a deviation: the paper compares A and B); else \"{NO_CHANGE}\". The B compared: "
        "where A moved, each run's own fit (a B at a common A would carry the A difference); where A is "
        "indistinguishable, both refitted with a common A (the paper's method), unless a common A fits poorly. "
        "Each verdict gives its resolution: the smallest |ΔA| and |ΔB| its comparison finds 9 times in 10, and the "
        "compute ratio. Runs that did not finish their configured steps get no verdict, nor do variants whose axis "
        "the sweep marks as not testable at its scale.",
        "These runs, or the recipes: the verdict above is about these runs (do they differ?). Two runs of one "
        "recipe differ too, by a spread between runs that one curve's intervals do not hold; the verdict about the "
        "recipes adds it: each seed fitted alone (own fits, A and B), the seeds of a variant combined with the "
        "spread as a random effect, the same test. The spread comes from replicate seeds where the sweep has them "
        "(sweep.seeds, sweep.base_seeds), combined with a stated prior (the paper's three runs of one recipe, A "
        "within +-0.015: an sd of 0.015, 2 degrees of freedom; sweep.run_sd_A).",
    ]


EXTRAP_HEADERS = ["variant", "fitted up to GPU-h", "end GPU-h", "predicted end [90%]", "observed end",
                  "error", "power law: A", "power law: predicted end", "power law: error"]


def extrap_cells(rows) -> list[list[str]]:
    cells = []
    for row in rows:
        ex = row.extrapolation
        if not ex.ok:
            cells.append([row.label, "", "", ex.status, _num(ex.observed, 3) if math.isfinite(ex.observed) else "",
                          "", "", "", ""])
            continue
        power = ex.power if ex.power is not None and ex.power.ok else None
        cells.append([
            row.label, fmt_compute(ex.c_fit), fmt_compute(ex.c_end),
            f"{ex.predicted:.3f} [{ex.predicted_ci[0]:.3f}, {ex.predicted_ci[1]:.3f}]",
            f"{ex.observed:.3f}", f"{ex.error:+.3f}",
            f"{power.A:.3f}" if power else "", f"{ex.power_predicted:.3f}" if power else "",
            f"{ex.power_error:+.3f}" if power else "",
        ])
    return cells


EXTRAP_TEXT = ("Each variant refitted on the first {fraction:.0%} of its compute; the fit's prediction for the end "
               "of the run (mean over its last 5% of compute) against what was observed there, and a power law "
               "R = A - D/C^B fitted to the same points, for contrast.")


# --- beside the paper ----------------------------------------------------------------------------------------

BESIDE_HEADERS = ["variant", "A here", "A, paper", "ΔA here", "ΔA, paper", "B here", "B, paper", "ΔB here",
                  "ΔB, paper"]


def beside_cells(report) -> list[list[str]]:
    """Each LOO variant's A and B beside the paper's (analysis/published.py); none for a sweep of other variants."""
    cells = []
    for row, short in zip(report.rows, table_cells(report.rows)):
        paper = published(row.label)
        if paper is not None:
            cells.append([row.label, short[2], paper.A, short[4], paper.dA, short[3], paper.B, short[5], paper.dB])
    return cells if any(row.label in ("scalerl", "loo-dapo") for row in report.rows) else []


def beside_caption(report) -> str:
    return CAPTION.format(setup=setup_of(report.rows[0].curve.params) if report.rows else "?")


def _fraction(report) -> float:
    return report.rows[0].extrapolation.fraction if report.rows else math.nan


def markdown_page(report) -> str:
    parts = [f"# Sigmoid fits: {report.experiment}", "", *(p + "\n" for p in headline(report)),
             ranked_table(report), "", "## Verdicts", "", *(f"- {line}" for line in verdict_lines(report)), ""]
    if report.has_truth:
        parts += ["## Known truth (generator=mock)", "", truth_table(report), "", TRUTH_NOTE, ""]
    if adaptive_cells(report):
        parts += ["## What the adaptive sweep did", "", md_table(ADAPTIVE_HEADERS, adaptive_cells(report)), "",
                  adaptive_total(report), ""]
    if beside_cells(report):
        parts += ["## Beside the paper", "", md_table(BESIDE_HEADERS, beside_cells(report)), "",
                  beside_caption(report), ""]
    parts += ["## Fits", "", md_table(FULL_HEADERS, full_cells(report.rows)), ""]
    notes = note_lines(report)
    if notes:
        parts += ["Notes:", "", *(f"- {line}" for line in notes), ""]
    parts += ["## Method", "", *(p + "\n" for p in method_paragraphs())]
    parts += ["## A and B side by side", "", f"![A and B]({report.params_plot.name})", ""]
    parts += ["## Curves and fits", "", f"![all variants]({report.overview.name})", ""]
    parts += ["## Linearized (slope B)", "", f"![linearized]({report.linearized.name})", ""]
    parts += ["## Extrapolation check", "", EXTRAP_TEXT.format(fraction=_fraction(report)), ""]
    parts += [md_table(EXTRAP_HEADERS, extrap_cells(report.rows))]
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
td.v-movesA, td.v-movesAandB { font-weight: 600; color: #9a3412; } td.v-movesB { font-weight: 600; color: #1d4ed8; }
td.v-movesC_mid { font-weight: 600; color: #047857; }
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
            if headers[i] in ("verdict", "the recipes") and c.split(" (")[0] in (MOVES_A, MOVES_B, BOTH, MOVES_C):
                cls = f' class="v-{c.split(" (")[0].replace(" ", "")}"'
            text = esc(c).replace(" [", "<br>[") if i in num_cols else esc(c)  # the interval under its estimate
            tds.append(f"<td{cls}>{text}</td>")
        body.append(f"<tr{klass}>{''.join(tds)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n" + "\n".join(body) + "\n</tbody></table>"


def html_page(report) -> str:
    esc = html.escape
    classes = ["" if row.fit.ok and not row.incomplete else ' class="failed"' for row in report.rows]
    table = _html_table(FULL_HEADERS, full_cells(report.rows), classes, range(3, 8))
    extrap = _html_table(EXTRAP_HEADERS, extrap_cells(report.rows), [""] * len(report.rows), range(1, 9))
    intro = "".join(f"<p>{esc(p)}</p>" for p in headline(report))
    method = "".join(f'<p class="small">{esc(p)}</p>' for p in method_paragraphs())
    verdicts = "".join(f"<li>{esc(line)}</li>" for line in verdict_lines(report))
    notes = "".join(f"<li>{esc(line)}</li>" for line in note_lines(report))
    truth = ""
    if report.has_truth:
        cells = truth_cells(report)
        truth = (f"<h2>Known truth (generator=mock)</h2>"
                 f"{_html_table(TRUTH_HEADERS, cells, [''] * len(cells), range(1, 11))}"
                 f'<p class="small">{esc(TRUTH_NOTE)}</p>')
    adaptive = adaptive_cells(report)
    if adaptive:
        truth += (f"<h2>What the adaptive sweep did</h2>"
                  f"{_html_table(ADAPTIVE_HEADERS, adaptive, [''] * len(adaptive), range(4, 6))}"
                  f'<p class="small">{esc(adaptive_total(report))}</p>')
    beside = beside_cells(report)
    if beside:
        truth += (f"<h2>Beside the paper</h2>"
                  f"{_html_table(BESIDE_HEADERS, beside, [''] * len(beside), range(1, 9))}"
                  f'<p class="small">{esc(beside_caption(report))}</p>')
    plots = "\n".join(_img(row.plot, row.label) for row in report.rows)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Sigmoid fits: {esc(report.experiment)}</title>
<style>{CSS}</style></head>
<body>
<h1>Sigmoid fits: {esc(report.experiment)}</h1>
{intro}
{table}
<h2>Verdicts</h2><ul>{verdicts}</ul>
{f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""}
{truth}
<h2>A and B side by side</h2>
<div class="wide">{_img(report.params_plot, "A and B with intervals")}</div>
<h2>Curves and fits</h2>
<div class="wide">{_img(report.overview, "all variants")}</div>
<h2>Linearized: log F(R) against log C, slope B</h2>
<div class="wide">{_img(report.linearized, "linearized")}</div>
<h2>Extrapolation check</h2>
<p class="small">{esc(EXTRAP_TEXT.format(fraction=_fraction(report)))}</p>
{extrap}
<h2>Per variant</h2>
<div class="plots">
{plots}
</div>
<h2>Method</h2>
{method}
</body></html>
"""
