"""The report's words: the headline, the tables, the verdict lines; put together as the terminal text (at most 120
columns: the table's notes go below it) and as the page (`report_blocks`: one list of blocks, which analysis/page.py
renders as report.md and as report.html; the known truth of mock runs added to it by a pass of its own).

Which B is which is said wherever a B is shown: the table's B is each variant's own fit; a verdict's ΔB is the
B it compared (own fits, or both refitted "at common A 0.605"); a ranking tie group's B is at its common A.
"""

from __future__ import annotations

import math
import statistics
import textwrap

from analysis.adaptive import gpu_hours_saved, stopped_at
from analysis.law import CI_LEVEL, MIN_POINTS, fmt_compute
from analysis.page import Bullets, Details, Figure, Figures, Paragraphs, Table, Title, html, markdown, md_table
from analysis.published import CAPTION, published, setup_of
from analysis.rank import (A_NOT_IDENTIFIED, A_TIE, BASELINE, BOTH, CATEGORIES, CRITICAL, MISFIT, MOVES_A, MOVES_B,
                           MOVES_C, NO_CHANGE, NOT_TESTABLE)
from analysis.runs import ALL_SWEEPS, EXTENDED_TAG, SINGLE

WIDTH = 120  # the terminal text's widest line


# --- the headline ------------------------------------------------------------------------------------------------


def finding(report) -> list[str]:
    """What was found, in a sentence or two: the variants that moved and what (a move of C_mid in words: "loo-8op
    and loo-batch need 1.5x and 1.7x scalerl's compute to reach the same reward"), then what could not be seen and
    at what size (the median resolution of the verdicts of no change, or of all where every variant moved)."""
    if not report.base:
        name = report.base_name
        base = next((row for row in report.rows if row.variant == name and not row.incomplete), None)
        why = (f"{base.label}, the base every verdict compares with, has no fit (why: below)" if base is not None
               else f"no complete {name} run, the base every verdict compares with")
        return [f"No verdicts: {why}."]
    judged = [row for row in ordered_rows(report) if row.verdict.label in CATEGORIES]
    if not judged:
        return [f"Only {report.base} here: no variant to compare with it." if len(report.rows) == 1 else
                f"No variant could be compared with {report.base} (why: below)."]
    moved = [row for row in judged if row.verdict.label != NO_CHANGE]
    still = [row for row in judged if row.verdict.label == NO_CHANGE]
    first = f"Against {report.base}, " + ("; ".join(_moves(moved, report.base)) if moved else "no variant moved")
    doubt = [row.label for row in moved if row.recipe is not None and row.recipe.label == NO_CHANGE]
    if doubt:  # claims about these runs that do not hold about the recipes
        first += (f"; about the recipes (the spread between runs of one recipe added), {_joined(doubt)} "
                  f"show{'s' if len(doubt) == 1 else ''} no detectable change")
    seen = _unseen([row.verdict for row in (still or judged)])
    if not still:
        second = f"At this scale, {seen}."
    elif moved:
        who = (f"The other, {still[0].label}, shows" if len(still) == 1 else
               f"The other {len(still)} ({', '.join(row.label for row in still)}) show")
        second = f"{who} no detectable change: at this scale, {seen}."
    else:
        who = (f"{still[0].label} shows no" if len(still) == 1 else f"None of the {len(still)} shows a")
        second = f"{who} detectable change: at this scale, {seen}."
    return [first + ".", second]


def _joined(items: list[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _moves(rows, base: str) -> list[str]:
    """One clause a kind of move and its direction (its rows in the report's order): "loo-fp32 and loo-savg lower
    the ceiling A by 0.072 and 0.039", "loo-8op climbs more slowly towards its ceiling (B -0.61)", "loo-8op and
    loo-batch need 1.5x and 1.7x scalerl's compute to reach the same reward (C_mid, ...)"."""
    groups: dict[tuple, list] = {}
    for row in rows:
        v = row.verdict
        up = v.dA > 0 if v.label == MOVES_A else v.dB > 0 if v.label == MOVES_B else None
        groups.setdefault((v.label, up, row.label if v.label == BOTH else ""), []).append(row)
    clauses = []
    for (label, up, _), group in groups.items():
        names, one = _joined([row.label for row in group]), len(group) == 1
        if label == MOVES_A:
            small = [row.label for row in group if row.verdict.small]
            clauses.append(f"{names} {'raise' if up else 'lower'}{'s' if one else ''} the ceiling A by "
                           f"{_joined([f'{abs(row.verdict.dA):.3f}' for row in group])}"
                           + (f" ({'' if one else _joined(small) + ': '}small, within the paper's 0.02 between runs)"
                              if small else ""))
        elif label == MOVES_B:
            dB = ", ".join(f"{row.verdict.dB:+.2f}" for row in group)
            clauses.append(f"{names} climb{'s' if one else ''} {'faster' if up else 'more slowly'} towards "
                           f"{'its' if one else 'their'} ceiling (B {dB})")
        elif label == BOTH:
            v = group[0].verdict
            clauses.append(f"{names} {'raises' if v.dA > 0 else 'lowers'} the ceiling A by {abs(v.dA):.3f} and climbs "
                           f"{'faster' if v.dB > 0 else 'more slowly'} (B {v.dB:+.2f})")
        else:
            clauses.append(f"{names} need{'s' if one else ''} "
                           f"{_joined([f'{row.verdict.compute.ratio:.2g}x' for row in group])} {base}'s compute to "
                           "reach the same reward (C_mid, the compute at half the gain, moved; the ceiling A and the "
                           "slope B did not)")
    return clauses


def _unseen(verdicts) -> str:
    """ "no move of the ceiling A below 0.12, of the slope B below 0.50, nor of the compute needed by a factor below
    1.30 could be seen (one that size is found 9 times in 10; the median over the verdicts)": the resolutions of
    these verdicts in words, an open side said so."""
    res = [v.resolution for v in verdicts if v.resolution]
    factors = [v.compute.ratio_resolution for v in verdicts if v.compute is not None]
    if not res:
        return "how small a move could be seen is not known (no resolution)"
    dA, dB = statistics.median(r[0] for r in res), statistics.median(r[1] for r in res)
    factor = statistics.median(factors) if factors else math.nan
    sizes = [(f"of the ceiling A below {dA:#.2g}", "A", dA), (f"of the slope B below {dB:.2f}", "B", dB),
             (f"of the compute needed by a factor below {factor:.2f}", "the compute", factor)]
    said = [text for text, _, x in sizes if math.isfinite(x)]
    open_ = [name for _, name, x in sizes if math.isinf(x)]
    parts = []
    if said:
        phrase = said[0] if len(said) == 1 else f"{', '.join(said[:-1])}, nor {said[-1]}"
        median = "; the median over the verdicts" if len(res) > 1 else ""
        parts.append(f"no move {phrase} could be seen (one that size is found 9 times in 10{median})")
    if open_:
        parts.append(f"no move of {_joined(open_)} could be seen at any size (an interval is open)")
    return "; ".join(parts)


def headline(report) -> list[str]:
    """What was compared (and the experiment's sweeps not reported), the runs left out and why, the variants with no
    verdict, the runs with no fit and why (with the flag that changes it), the resolution in a line, the truth
    check. The finding itself is finding()'s."""
    n_runs = sum(row.n_seeds for row in report.rows)
    seeds = sorted({row.n_seeds for row in report.rows if not row.incomplete})
    per = (f"{seeds[0]} seed{'s' if seeds[0] > 1 else ''} per variant" if len(seeds) == 1
           else "seeds pooled" if seeds else "no complete run")
    what = report.source or f"{report.experiment}, {_scope(report)}"
    lines = [f"{what}: {_n(len(report.rows), 'variant')} from {_n(n_runs, 'run')} "
             f"({per}), {sum(r.fit.ok for r in report.rows)} fitted."]
    if report.others:
        lines.append(f"Not reported: {'; '.join(s.text for s in report.others)}. --sweep ID reports another, "
                     "--sweep all pools them.")
    if report.left_out:
        named = "; ".join(f"{row.label}: {row.incomplete}" for row in report.left_out)
        lines.append(f"No rank and no verdict (incomplete runs): {named}.")
    early = [row.label for row in report.rows if row.verdict.label == A_NOT_IDENTIFIED]
    if early:
        lines.append(f"No verdict yet, {A_NOT_IDENTIFIED} (a run's data stop before its fitted C_mid, nothing else "
                     f"moved): {', '.join(early)}.")
    departs = [row for row in ordered_rows(report) if row.misfit is not None and row.misfit.flagged]
    if departs:
        lines.append(misfit_line(report, departs))
    untestable = [row.label for row in ordered_rows(report) if row.verdict.label == NOT_TESTABLE]
    if untestable:  # the sweep's reasons run to paragraphs: they are the verdicts' (verdict_lines)
        lines.append(f"No verdict, {NOT_TESTABLE}: {', '.join(untestable)} (why: each one's verdict in the report).")
    lines += [no_fit_line(report, row) for row in report.rows if not row.fit.ok]
    checked = extrapolation_line(report)
    if checked:
        lines.append(checked)
    res, res_c, res_r = report.resolution, report.compute_resolution, report.recipe_resolution
    if res is not None:
        compute = f", compute {_res_c(res_c)}" if res_c is not None else ""
        b_said = _res_b(res_r[1]) if res_r is not None and report.spread.b_dof else "ΔB not compared"
        recipes = (f"; the recipes {_res_a(res_r[0])}, {b_said} (spread: {report.spread.source})"
                   if res_r is not None else "")
        lines.append(f"Resolution (found 9 times in 10, the median over the verdicts): these runs {_res_a(res[0])}, "
                     f"{_res_b(res[1])}{compute}{recipes}.")
    if report.has_truth:
        lines.append(truth_line(report))
    return lines


def _n(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def no_fit_line(report, row) -> str:
    """Why a row has no fit; where it has too few points, what --c-min (the compute below which points are left
    out) would keep: "loo-lp has no fit: too few points: 3 at compute >= c_min=0.00125 (need 5); --c-min 0 keeps
    all 9 after compute 0 (now: 1.5/16 of its largest compute, the paper's cut)"."""
    why = row.fit.status
    if not why.startswith("too few points"):
        return f"{row.label} has no fit: {why}."
    after = sum(x > 0 and math.isfinite(r) for c in row.curves for x, r in zip(c.compute, c.pass_rate))
    cut = f"--c-min {report.c_min:g}" if report.c_min is not None else "1.5/16 of its largest compute, the paper's cut"
    advice = (f"--c-min 0 keeps all {after} after compute 0 (now: {cut})" if after >= MIN_POINTS and report.c_min != 0
              else f"it has {after} after compute 0 in all, so no --c-min helps: run longer or validate more often "
                   "(train.val_every)")
    return f"{row.label} has no fit: {why.split(';')[0]}; {advice}."


def misfit_line(report, rows) -> str:
    """ "The law does not describe loo-x, beyond its own noise: loo-x falls below the law from 9,000 GPU-h on, by 0.031
    at its end (z = -5.2). No ceiling is read from it." (analysis/misfit.py)"""
    said = "; ".join(f"{row.label} {row.misfit.text(report.unit_short)}" for row in rows)
    one = len(rows) == 1
    return (f"The law does not describe {_joined([row.label for row in rows])}, beyond {'its' if one else 'their'} "
            f"own noise: {said}. No ceiling is read from {'it' if one else 'them'}.")


def extrapolation_line(report) -> str:
    """ "Extrapolation check: 7 of 8 ends fell inside their 90% prediction from the first half; loo-x's was not
    predicted (observed 0.612, predicted 0.641 [0.630, 0.652])." ("" where no check was made)"""
    made = [row for row in ordered_rows(report) if row.extrapolation.ok and math.isfinite(row.extrapolation.observed)
            and math.isfinite(row.extrapolation.predicted_ci[0])]
    if not made:
        return ""
    missed = [row for row in made if not row.extrapolation.covered]
    line = (f"Extrapolation check: {len(made) - len(missed)} of {_n(len(made), 'end')} fell inside "
            f"{'its' if len(made) == 1 else 'their'} 90% prediction from the first {_fraction(report):.0%} of the "
            "compute")
    if missed:
        said = "; ".join(f"{row.label}'s (observed {row.extrapolation.observed:.3f}, predicted "
                         f"{row.extrapolation.predicted:.3f} [{row.extrapolation.predicted_ci[0]:.3f}, "
                         f"{row.extrapolation.predicted_ci[1]:.3f}])" for row in missed)
        line += f"; not predicted: {said}"
    return line + "."


def truth_line(report) -> str:
    """ "Mock runs, known truth: 8 of 8 verdicts agree with it; about the recipes 7 of 8 (not: ...)." (the truth is
    beside each fit in the report)"""
    judged = [row for row in report.rows if row.expected is not None]
    wrong = [row.label for row in judged if row.truth_disagrees]
    recipes = [row for row in report.rows if row.recipe_expected is not None]
    wrong_r = [row.label for row in recipes if row.recipe_truth_disagrees]
    about = (f"; about the recipes {len(recipes) - len(wrong_r)} of {len(recipes)}"
             + (f" (not: {', '.join(wrong_r)})" if wrong_r else "") if recipes else "")
    return (f"Mock runs, known truth: {len(judged) - len(wrong)} of {len(judged)} verdicts agree with it"
            + (f" (not: {', '.join(wrong)})" if wrong else "") + about + ".")


def _scope(report) -> str:
    if report.sweep is None:
        return ("every run (none tagged with a sweep)" if report.picked else
                f"selected runs of sweep {', '.join(report.sweeps)}")
    if report.sweep == ALL_SWEEPS:
        return f"all sweeps ({', '.join(report.sweeps)})"
    if report.sweep == SINGLE:
        return f"the runs launched alone (--sweep {SINGLE})"
    return f"sweep {report.sweep}" + (" (the latest)" if report.picked else "")


def _res_a(x: float) -> str:
    return f"|ΔA| {x:.3f}" if math.isfinite(x) else "ΔA not resolved (an A interval is open)"


def _res_b(x: float) -> str:
    return f"|ΔB| {x:.2f}" if math.isfinite(x) else "ΔB not resolved (a B interval is open)"


def _res_c(factor: float) -> str:
    return f"x{factor:.2f}" if math.isfinite(factor) else "not resolved (an interval is open)"


# --- the ranked table --------------------------------------------------------------------------------------------

def table_headers(base: str = BASELINE) -> list[str]:
    return ["#", "variant", "A [90% CI]", "B own fit [90% CI]", f"ΔA vs {base}", "ΔB as compared", "verdict"]


TABLE_HEADERS = table_headers()


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
        cells.append([rank_text(row, rows), row.label, *numbers, dA, _delta_b(row), v.text])
    return cells


def rank_text(row, rows) -> str:
    """The row's rank (by A, then B), "=1" where another row shares it (a tie: their intervals overlap), "" for no
    rank."""
    if row.rank is None:
        return ""
    return f"={row.rank}" if sum(other.rank == row.rank for other in rows) > 1 else str(row.rank)


# The rows in the order the report shows them: the base first, then by the claim against it (CLAIM_ORDER), within a
# claim the largest change first (|ΔA| for a move of A, |ΔB| for one of B, the compute ratio for C_mid), the rest
# (no change, no verdict) by rank; rows with no rank (failed fits, incomplete runs) last.
CLAIM_ORDER = ("base", MOVES_A, BOTH, MOVES_B, MOVES_C, NO_CHANGE, A_NOT_IDENTIFIED, MISFIT, NOT_TESTABLE)


def ordered_rows(report) -> list:
    """report.rows in the order every table and the A/B plot show them (order_rows)."""
    return order_rows(report.rows)


def order_rows(rows) -> list:
    """The rows by CLAIM_ORDER, then the size of the change, then the rank (a stable sort: equal keys keep the
    ranking's order)."""
    def size(row) -> float:
        v = row.verdict
        if v.label in (MOVES_A, BOTH) and v.dA is not None:
            return abs(v.dA)
        if v.label == MOVES_B and v.dB is not None:
            return abs(v.dB)
        if v.label == MOVES_C and v.compute is not None and v.compute.ratio > 0:
            return abs(math.log(v.compute.ratio))
        return 0.0

    def key(row):
        label = row.verdict.label
        claim = CLAIM_ORDER.index(label) if label in CLAIM_ORDER and not row.incomplete else len(CLAIM_ORDER)
        return claim, row.rank is None, -size(row), row.rank if row.rank is not None else 0

    return sorted(rows, key=key)


def ranked_table(report) -> str:
    return md_table(table_headers(report.base_name), table_cells(report.rows))


# the terminal's table (at most WIDTH columns): the verdicts about these runs and about the recipes; the changes with
# their z and the resolution of each verdict are report.md's (the terminal says the resolutions in a line: headline)
TERMINAL_HEADERS = ["#", "variant", "A [90% CI]", "B own fit [90% CI]", "these runs", "the recipes"]


def terminal_cells(rows) -> list[list[str]]:
    """The terminal table's cells; the verdict about the recipes is "the same" where it is the one about these runs
    (the table stays within WIDTH, and what differs stands out)."""
    out = []
    for row, cells in zip(rows, table_cells(rows)):
        recipe = (row.recipe.text if row.recipe is not None and row.recipe.label in (*CATEGORIES, A_NOT_IDENTIFIED)
                  else "base" if row.verdict.label == "base" else "")
        out.append([*cells[:4], cells[6], "the same" if recipe == cells[6] != "base" else recipe])
    return out


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
            text += (f". Held to the adaptive sweep's test where it stopped, beside {report.base_name} cut at "
                     f"{fmt_compute(row.compared_to)} {report.unit_short}")
        r = row.recipe
        if r is not None and r.resolution:
            text += f". About the recipes: {r.text} (resolution {r.resolution_text}); {r.detail}"
            if row.to_close is not None:
                text += f"; {row.to_close.text(row.label, report.base_name)}"
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
    """What a sweep prints when it ends, on one screen (under 30 lines for a sweep of nine variants, every line at
    most WIDTH characters; a variant name too long for the table makes its row longer): the finding in a sentence or
    two, the headline (what was compared, what was left out and why, the resolution in a line), the table in the
    report's order (ordered_rows) with the verdicts about these runs and about the recipes, the adaptive sweep's
    total. The reasoning (each verdict's changes, tests and resolution, the ties, the fit notes, the truth table) is
    in report.md and report.html."""
    lines = [wrapped for line in finding(report) + headline(report) for wrapped in _wrap(line)]
    cells = terminal_cells(ordered_rows(report))
    lines += ["", md_table(TERMINAL_HEADERS, cells), ""]
    lines += _wrap("In the report's order: the base, then by verdict, the largest change first"
                   + ('; "=": a rank shared, the intervals overlap' if any(c[0].startswith("=") for c in cells) else "")
                   + ". Each verdict's changes, tests and resolution, the ties, the fits' notes"
                   + (" and the known truth" if report.has_truth else "") + ": report.md and report.html.")
    total = adaptive_total(report)
    if total:
        lines += _wrap(total)
    lines += [wrapped for line in stopped_lines(report) for wrapped in _wrap(line, "- ")]
    return "\n".join(lines)


def stopped_lines(report) -> list[str]:
    """An adaptive sweep's runs that stopped early or were taken on later, a line each in the report's order, with
    the cut of the base their verdict compared them with: "loo-fp32: moves A (stopped at step 20 of 40, 8,000 GPU-h
    saved; vs scalerl cut at 8,000 GPU-h)", "loo-fp32: moves A (extended from step 20; vs scalerl cut at ...)"."""
    lines = []
    for row in ordered_rows(report):
        tags = row.curves[0].tags if row.decisions else {}
        stop = stopped_at(tags) if row.decisions else None
        if stop is not None:
            said = f"stopped at step {stop.step} of {stop.steps}, {fmt_compute(gpu_hours_saved(stop))} GPU-h saved"
        elif EXTENDED_TAG in tags:
            said = f"extended from step {tags[EXTENDED_TAG]}"
        else:
            continue
        cut = (f"; vs {report.base_name} cut at {fmt_compute(row.compared_to)} GPU-h" if row.compared_to is not None
               else "")
        lines.append(f"{row.label}: {row.verdict.label} ({said}{cut})")
    return lines


# --- report.md and report.html -----------------------------------------------------------------------------------

# The table under the headline and the A/B plot: one line a variant, what it is and what the report says of it
COMPACT_HEADERS = ["variant", "A [90% CI]", "B own fit [90% CI]", "these runs", "the recipes"]
# behind it, collapsed: what each verdict rests on (the changes with their z, the resolutions) and the rank
def detail_headers(base: str = BASELINE) -> list[str]:
    return ["rank", "variant", f"ΔA vs {base} (z)", "ΔB as compared (z)", "compute to reach R* (z)", "resolution",
            "resolution (recipes)"]


# lower down: each fit as it stands
def full_headers(unit: str = "GPU-h") -> list[str]:
    return ["rank", "variant", "seeds", "A [90% CI]", "B own fit [90% CI]", f"C_mid {unit} [90% CI]", "status"]


DETAIL_HEADERS, FULL_HEADERS = detail_headers(), full_headers()
# a heading per claim in the HTML table (CLAIM_ORDER's, and the rest)
GROUPS = {"base": "the base recipe", MOVES_A: "moves A: another ceiling", BOTH: "moves A and B",
          MOVES_B: "moves B: another efficiency (how steeply it climbs)",
          MOVES_C: "moves C_mid: needs another amount of compute to reach the same reward",
          NO_CHANGE: "no detectable change at this resolution", A_NOT_IDENTIFIED: f"{A_NOT_IDENTIFIED}: the data stop "
          "before the fitted C_mid", MISFIT: f"{MISFIT}: the run departs from the law beyond its own noise",
          NOT_TESTABLE: NOT_TESTABLE, "": "no verdict: incomplete runs, failed fits"}


def _recipe_text(row) -> str:
    r = row.recipe
    if r is not None and r.label in (*CATEGORIES, A_NOT_IDENTIFIED):
        return r.text
    return "base" if row.verdict.label == "base" else ""


def compact_cells(rows) -> list[list[str]]:
    return [[cells[1], cells[2], cells[3], cells[6], _recipe_text(row)]
            for row, cells in zip(rows, table_cells(rows))]


def _z(v, claim: str) -> str:
    return f" (z {v.claims[claim].z:+.1f})" if claim in v.claims else ""


def detail_cells(rows) -> list[list[str]]:
    """Per row with a verdict: the changes against the base with their z, the compute ratio, the resolutions."""
    cells = []
    for row, short in zip(rows, table_cells(rows)):
        v, r = row.verdict, row.recipe
        judged = v.label in (*CATEGORIES, A_NOT_IDENTIFIED)
        dA = f"{v.dA:+.3f}{_z(v, 'A')}" if judged and v.dA is not None and v.A_identified else ""
        dB = f"{_delta_b(row)}{_z(v, 'B')}" if judged and _delta_b(row) else ""
        compute = f"{v.compute.ratio:.2f}x{_z(v, 'compute')}" if judged and v.compute is not None else ""
        recipe = r.resolution_text if r is not None and r.resolution else ""
        cells.append([short[0], short[1], dA, dB, compute, v.resolution_text if judged else "", recipe])
    return cells


def full_cells(rows) -> list[list[str]]:
    cells = []
    for row, short in zip(rows, table_cells(rows)):
        fit = row.fit
        c_mid = (f"{fmt_compute(fit.C_mid)} [{fmt_compute(fit.ci['C_mid'][0])}, {fmt_compute(fit.ci['C_mid'][1])}]"
                 if fit.ok else "")
        cells.append([short[0], short[1], str(row.n_seeds), short[2], short[3], c_mid, row.status])
    return cells


def ties_line(rows) -> str:
    """ "=1: 8 variants share rank 1 (...)": what a rank with "=" means, once; "" without a shared rank."""
    shared = sorted({row.rank for row in rows if row.rank is not None
                     and sum(other.rank == row.rank for other in rows) > 1})
    if not shared:
        return ""
    said = "; ".join(f"={k}: {', '.join(row.label for row in rows if row.rank == k)}" for k in shared)
    return (f"Rank: by A, then by B (at a common A where the A intervals overlap); \"=\" is a tie, the intervals "
            f"overlap: {said}.")


def method_paragraphs(report=None) -> list[str]:
    base, unit = (report.base_name, report.unit) if report is not None else (BASELINE, "GPU-hours")
    return [
        f"Each variant's validation pass rate R is fitted against training compute C ({unit}) with the sigmoid "
        "law of ScaleRL (Eq. 1): R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B). "
        "A is the ceiling: the pass rate the recipe approaches with unlimited compute. B is the efficiency: how "
        "steeply the curve climbs towards A (higher is faster). C_mid is the compute at half of the gain A - R0. "
        "R0 is the pass rate before RL (step 0), measured; the fit may move it within its error. Seeds of one "
        "variant are fitted together.",
        f"Points below 1.5/16 of a run's final compute are left out, as in the paper. Intervals are "
        f"{CI_LEVEL:.0%} likelihood-ratio intervals under a noise model fitted to each variant's residuals (white "
        "noise, a wobble correlated in compute, and slow departures from the law over a good part of the run); a "
        "bound of 1 on A, or ∞ on B or C_mid, means the data do not bound that side (typically: the run stopped "
        f"before its midpoint). A run that departs from the law beyond its own noise (it falls, keeps rising, or "
        f"steps, by at least {A_TIE} at its end) gets \"{MISFIT}\" instead of a verdict.",
        "Ranking: by A, highest first. Variants whose A intervals overlap the group's best are tied on A: they are "
        "refitted together with one common A (a shared parameter, so its uncertainty widens every B interval) and "
        "ranked by their B at it, unless the data fit one common A poorly (its likelihood-ratio test has p < 0.5): "
        "then by their own B. Overlapping B intervals are a tie (same rank).",
        f"Verdict against {base}: each claim is a z-test, the change over the standard error the two fits' "
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


def extrap_headers(unit: str = "GPU-h") -> list[str]:
    return ["variant", f"fitted up to {unit}", f"end {unit}", "observed end", "sigmoid: predicted end [90%]",
            "sigmoid: error", "power law: predicted end", "power law: error", "power law: ceiling"]


EXTRAP_HEADERS = extrap_headers()


def _pinned(power) -> bool:
    """The power law's A held at 1 (analysis.extrapolate.fit_power_law): the points rise with no ceiling below it."""
    return power.A >= 1.0


def extrap_cells(rows) -> list[list[str]]:
    """Per row: the half-run sigmoid's and power law's predictions of the run's end beside what was observed there;
    the power law's ceiling, "none below 1" where the fit held it at 1 (a bound, not a finding)."""
    cells = []
    for row in rows:
        ex = row.extrapolation
        if not ex.ok:
            cells.append([row.label, "", "", _num(ex.observed, 3) if math.isfinite(ex.observed) else "", ex.status,
                          "", "", "", ""])
            continue
        power = ex.power if ex.power is not None and ex.power.ok else None
        cells.append([
            row.label, fmt_compute(ex.c_fit), fmt_compute(ex.c_end), f"{ex.observed:.3f}",
            f"{ex.predicted:.3f} [{ex.predicted_ci[0]:.3f}, {ex.predicted_ci[1]:.3f}]", f"{ex.error:+.3f}",
            f"{ex.power_predicted:.3f}" if power else "", f"{ex.power_error:+.3f}" if power else "",
            ("none below 1" if _pinned(power) else f"{power.A:.3f}") if power else "",
        ])
    return cells


def extrap_text(report) -> str:
    """What the extrapolation table compares, and how many power laws found no ceiling below 1."""
    powers = [row.extrapolation.power for row in report.rows if row.extrapolation.ok
              and row.extrapolation.power is not None and row.extrapolation.power.ok]
    pinned = sum(_pinned(p) for p in powers)
    text = EXTRAP_TEXT.format(fraction=_fraction(report))
    if pinned:
        text += (f" The power law's ceiling is held at 1 (a pass rate's largest) in {pinned} of {len(powers)}: "
                 "through points that still rise it has no ceiling below 1, the misleading ceiling the paper warns "
                 "of; its predicted end shows what that costs.")
    return text


EXTRAP_TEXT = ("Each variant refitted on the first {fraction:.0%} of its compute; the fit's prediction of what will be "
               "observed at the end of the run (the mean over its last 5% of compute: the law's uncertainty, the "
               "noise of that mean, and the drift of real runs beyond their data, in its 90% interval) against what "
               "was observed there, and a power law R = A - D/C^B fitted to the same points, for contrast.")


# --- beside the paper ----------------------------------------------------------------------------------------

BESIDE_HEADERS = ["variant", "A here", "A, paper", "ΔA here", "ΔA, paper", "B here", "B, paper", "ΔB here",
                  "ΔB, paper"]


def beside_cells(report) -> list[list[str]]:
    """Each LOO variant's A and B beside the paper's (analysis/published.py); none for a sweep of other variants."""
    cells = []
    rows = ordered_rows(report)
    for row, short in zip(rows, table_cells(rows)):
        paper = published(row.label)
        if paper is not None:
            cells.append([row.label, short[2], paper.A, short[4], paper.dA, short[3], paper.B, short[5], paper.dB])
    return cells if any(row.label in ("scalerl", "loo-dapo") for row in report.rows) else []


def beside_caption(report) -> str:
    return CAPTION.format(setup=setup_of(report.rows[0].curve.params) if report.rows else "?")


def _fraction(report) -> float:
    return report.rows[0].extrapolation.fraction if report.rows else math.nan


# --- the page: report.md and report.html, one list of blocks (analysis/page.py renders it) -----------------------


def markdown_page(report) -> str:
    """report.md: report_blocks in Markdown (figures by file name; <details>, which GitHub and MLflow render)."""
    return markdown(report_blocks(report))


def html_page(report) -> str:
    """report.html: report_blocks in one self-contained file (figures and style inlined)."""
    return html(report_blocks(report))


def report_blocks(report) -> list:
    """The page, top to bottom: what a reader needs first on the first screen (the finding, the A/B plot), the table
    of one line a variant below it, what the verdicts rest on and why collapsed; then how the runs were read, the
    known truth of mock runs (known_truth, a pass of its own), the adaptive sweep, the paper; the other figures and
    tables; the method last. Every table in ordered_rows's order."""
    rows = ordered_rows(report)
    blocks = [*_opening(report, rows), *_verdicts(report), *_reading(report), *_adaptive(report),
              *_beside(report), *_figures(report), *_fits(report, rows), *_method(report)]
    return known_truth(report, blocks)


def _more_lines(report) -> list[str]:
    """The headline's lines the finding above the plot does not already say."""
    said = finding(report)
    return [line for line in headline(report) if line not in said]


PARAMS_CAPTION = ("A (ceiling) and B (efficiency) of each variant with its 90% interval, in the table's order; the "
                  "grey band is {base}'s A +- {margin} (the paper's margin: a move inside it is small), the dotted "
                  "lines {base}'s A and B; colour: the verdict about these runs.")
VERDICT_COLUMNS = ("verdict", "these runs", "the recipes")  # their cells coloured by the claim
COLOURED = (MOVES_A, MOVES_B, BOTH, MOVES_C)


def _table(headers: list[str], cells: list[list[str]], numeric: range, rows=None, groups: bool = False) -> Table:
    """A table of the page; with `rows` (the report rows of its lines), the failed ones marked, and with `groups`
    a heading per claim (GROUPS), each estimate and its interval on one line."""
    marks = [[c.split(" (")[0] if h in VERDICT_COLUMNS and c.split(" (")[0] in COLOURED else ""
              for h, c in zip(headers, line)] for line in cells]
    return Table(headers, cells, numeric, stacked=not groups, marks=marks,
                 failed=[not row.fit.ok or bool(row.incomplete) for row in rows] if rows is not None else (),
                 groups=[_group(row) for row in rows] if groups else ())


def _group(row) -> str:
    label = row.verdict.label
    return GROUPS[label if label in GROUPS and not row.incomplete else ""]


def _opening(report, rows) -> list:
    """The title, the finding, the A/B plot, the table of one line a variant, the rest of the headline; the changes
    with their z, the resolutions and the ranks collapsed below."""
    base = report.base or report.base_name
    ties = ties_line(rows)
    return [
        Title(f"Sigmoid fits: {report.experiment}", level=1),
        Paragraphs([" ".join(finding(report))], style="finding", id="finding"),
        Figure(report.params_plot, "A and B of each variant, with their 90% intervals",
               PARAMS_CAPTION.format(base=base, margin=A_TIE), id="forest"),
        _table(COMPACT_HEADERS, compact_cells(rows), range(1, 3), rows, groups=True),
        Paragraphs(_more_lines(report), style="small"),
        Details("Changes, z-values, resolutions and ranks", [
            _table(detail_headers(report.base_name), detail_cells(rows), range(2, 5), rows),
            Paragraphs([ties], style="small")]),
    ]


def _verdicts(report) -> list:
    """Each verdict's reasoning, and the notes (ties, the fits' warnings), collapsed."""
    notes = note_lines(report)
    return [
        Title("Verdicts"),
        Details("Why each verdict: what it rests on, its resolution", [Bullets(verdict_lines(report))]),
        *([Details("Notes: ties, the fits' warnings", [Bullets(notes)])] if notes else []),
    ]


def _reading(report) -> list:
    """Another trainer's runs: each choice the mapping inferred, each warning (report_other_runs)."""
    if not report.mapping:
        return []
    return [Title("How these runs were read"), Paragraphs([f"From {report.source}:"]), Bullets(report.mapping)]


ADAPTIVE_TITLE, BESIDE_TITLE, CURVES_TITLE = "What the adaptive sweep did", "Beside the paper", "Curves and fits"


def _adaptive(report) -> list:
    cells = adaptive_cells(report)
    if not cells:
        return []
    return [Title(ADAPTIVE_TITLE), _table(ADAPTIVE_HEADERS, cells, range(4, 6)),
            Paragraphs([adaptive_total(report)], style="small")]


def _beside(report) -> list:
    cells = beside_cells(report)
    if not cells:
        return []
    return [Title(BESIDE_TITLE), _table(BESIDE_HEADERS, cells, range(1, 9)),
            Paragraphs([beside_caption(report)], style="small")]


def _figures(report) -> list:
    base = report.base or report.base_name
    return [Title(CURVES_TITLE), Figure(report.overview, f"each variant beside {base}"),
            Title("Linearized: log F(R) against log C, slope B"), Figure(report.linearized, "linearized")]


def _fits(report, rows) -> list:
    """The extrapolation check, each fit as it stands, a figure per variant."""
    return [
        Title("Extrapolation check"), Paragraphs([extrap_text(report)], style="small"),
        _table(extrap_headers(report.unit_short), extrap_cells(rows), range(1, 9)),
        Title("Fits"), _table(full_headers(report.unit_short), full_cells(rows), range(3, 6), rows),
        Title("Per variant"), Figures([(row.plot, row.label) for row in rows]),
    ]


def _method(report) -> list:
    return [Title("Method"), Paragraphs(method_paragraphs(report), style="small")]


# --- the known truth of mock runs, added to the page by a pass of its own --------------------------------------

TRUTH_TITLE = "Known truth (generator=mock)"
TRUTH_BEFORE = (Title(ADAPTIVE_TITLE), Title(BESIDE_TITLE), Title(CURVES_TITLE))  # the first of these follows it


def known_truth(report, blocks: list) -> list:
    """`blocks` with the mock's truth after what the verdicts rest on and how the runs were read (before the first
    of TRUTH_BEFORE): a table of each fit beside its truth and the note on how it judges; mock runs only."""
    if not report.has_truth:
        return blocks
    at = next(k for k, block in enumerate(blocks) if block in TRUTH_BEFORE)
    cells = truth_cells(report)
    return [*blocks[:at], Title(TRUTH_TITLE), _table(TRUTH_HEADERS, cells, range(1, 11)),
            Paragraphs([TRUTH_NOTE], style="small"), *blocks[at:]]
