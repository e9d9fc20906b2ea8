"""The report's figures, in the paper's style: pass rate against compute, fitted laws as lines, asymptotes dashed.

- overview: a panel per variant, its points and fitted law beside the base recipe's in grey (extrapolation dotted).
- variant: one variant, its seeds, the fit with its 90% band, A dashed, the half-run extrapolation and a power law.
- params: A and B with their 90% intervals side by side, the base recipe's values as reference lines, coloured by
  the verdict.
- linearized: log F(R) against log C, F(R) = C_mid^B / ((A - R0) / (R - R0) - 1) = C^B, so each variant is a line
  of slope B (the paper's plot for comparing B at a common A).
Compute is drawn in the unit that suits the runs (`compute_unit`: GPU-hours at scale, GPU-seconds for a CPU run).
Figures are drawn on the Agg canvas directly (no pyplot), so making a report never touches a caller's backend; a
legend is drawn only where something is labelled (`_legend`), so matplotlib has nothing to warn of.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from analysis.law import SigmoidFit, fmt_compute
from analysis.rank import BOTH, MOVES_A, MOVES_B, MOVES_C
from analysis.runs import RunCurve

MARKERS = "osD^v<>ph*"
# a unit of compute and its size in GPU-hours, largest first (compute_unit picks one)
UNITS = (("GPU-hours", 1.0), ("GPU-minutes", 1 / 60), ("GPU-seconds", 1 / 3600), ("GPU-milliseconds", 1 / 3.6e6))
# the verdict's colour (the report's table colours its cells alike); grey: no change, no verdict
VERDICT_COLORS = ((BOTH, "#9a3412"), (MOVES_A, "#9a3412"), (MOVES_B, "#1d4ed8"), (MOVES_C, "#047857"),
                  ("base", "#1f2328"))
NO_CLAIM = "#6e7781"
BASE_GREY = "0.75"  # the base recipe behind each panel of the overview


def color(k: int) -> str:
    return f"C{k % 10}"


def verdict_color(text: str) -> str:
    """The colour of a verdict ("moves C_mid (1.52x compute)" is green), grey for no claim."""
    return next((col for label, col in VERDICT_COLORS if text.startswith(label)), NO_CLAIM)


def compute_unit(top: float) -> tuple[str, float]:
    """The largest unit of UNITS in which `top` (GPU-hours) is at least 1, so that an axis reads 0.4 GPU-seconds
    and not 1e-4 GPU-hours: (its name, its size in GPU-hours)."""
    return next(((name, size) for name, size in UNITS if top >= size), UNITS[-1])


def _unit_of(curves: Sequence[RunCurve]) -> tuple[str, float]:
    """GPU-hours in the unit that shows them (compute_unit); another unit (another trainer's steps) as it is."""
    if curves and curves[0].unit != UNITS[0][0]:
        return curves[0].unit, 1.0
    return compute_unit(max((float(c.compute.max()) for c in curves if c.compute.size), default=1.0))


def _figure(width: float, height: float, ncols: int = 1, margins: dict | None = None, nrows: int = 1, **share):
    """A figure on the Agg canvas; `margins` (subplots_adjust's) fix the layout instead of matplotlib's
    constrained layout, which measures every label at each save (half the time of a figure drawn once per variant)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout=None if margins else "constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=nrows == 1, **share)
    if margins:
        fig.subplots_adjust(**margins)
    return fig, axes


def _legend(ax, **kw) -> None:
    """A legend, where something is labelled: matplotlib warns of an empty one on the terminal."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def fitted(text: str, width: int, lines: int = 2) -> str:
    """`text` in at most `lines` lines of at most `width` characters: broken after a separator where one lies near
    the end of a line, the middle of what still does not fit left out ("..."), so a long run name never widens a
    label or a title past its panel."""
    out, rest = [], text
    while len(rest) > width and len(out) < lines - 1:
        cut = max((rest.rfind(sep, width // 2, width) for sep in "-_/ ,:="), default=-1)
        cut = cut + 1 if cut > 0 else width
        out.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if len(rest) > width:
        keep = width - 3
        rest = rest[:keep // 2] + "..." + rest[len(rest) - (keep - keep // 2):]
    return "\n".join([*out, rest])


def _pass_rate_axes(ax, unit: str) -> None:
    ax.set_xlabel(f"compute ({unit})")
    ax.set_ylabel("validation pass rate")
    ax.grid(True, alpha=0.3)


def _grid(curves: Sequence[RunCurve]) -> np.ndarray:
    top = max((float(c.compute.max()) for c in curves if c.compute.size), default=1.0)
    return np.linspace(0.0, 1.1 * top if top > 0 else 1.0, 400)


def _draw_fit(ax, fit: SigmoidFit, grid: np.ndarray, c_data: float, col: str, label: str | None, lw: float,
              band: bool = False, size: float = 1.0) -> None:
    """The fitted law (grid in GPU-hours, drawn in units of `size` GPU-hours): solid over the data, dotted where it
    extrapolates; optionally its 90% band."""
    inside = grid <= c_data
    ax.plot(grid[inside] / size, fit.predict(grid[inside]), "-", lw=lw, color=col, label=label)
    if not inside.all():
        beyond = grid >= grid[inside][-1]
        ax.plot(grid[beyond] / size, fit.predict(grid[beyond]), ":", lw=lw, color=col)
    if band:
        lo, hi = fit.predict_interval(grid[1:])
        if np.isfinite(lo).all():
            ax.fill_between(grid[1:] / size, lo, hi, color=col, alpha=0.18, lw=0, label="90% band of the law")


def describe(fit: SigmoidFit) -> str:
    if not fit.ok:
        return f"fit failed: {fit.status}"
    (a_lo, a_hi), (b_lo, b_hi) = fit.ci["A"], fit.ci["B"]
    return (f"A={fit.A:.3f} [{a_lo:.3f}, {a_hi:.3f}]  B={fit.B:.2f} [{b_lo:.2f}, {_fmt(b_hi, 2)}] (own fit)  "
            f"C_mid={fmt_compute(fit.C_mid)}")


def _fmt(x: float, digits: int) -> str:
    return "∞" if math.isinf(x) else f"{x:.{digits}f}"


def plot_variant(curves: Sequence[RunCurve], fit: SigmoidFit, path: Path, title: str, extrap=None,
                 forecast: Sequence[Sequence[float]] | None = None, departs: str = "") -> Path:
    """One variant: each seed's points (hollow where left out of the fit), R0 squares, the fit with its band,
    A dashed, c_min dotted; with `extrap` (analysis.extrapolate.Extrapolation) the half-run fit and power law; with
    `forecast` ([compute, low, high] rows: an adaptive sweep's decision) the 90% prediction it had made, to the
    full budget at the rung it stopped; `departs`: how the run departs from the law, where the misfit test says the
    law does not describe it (then the fitted A is no ceiling, and the title says so)."""
    fig, ax = _figure(6.6, 4.4, margins=dict(left=0.11, right=0.97, bottom=0.11, top=0.88))
    unit, size = _unit_of(curves)
    _pass_rate_axes(ax, unit)
    for k, curve in enumerate(curves):
        marker = MARKERS[k % len(MARKERS)]
        start = curve.compute == 0
        used = ~start & ((curve.compute >= fit.c_min) if fit.ok else True)
        seed = f" (seed run {curve.run_id[:7]})" if len(curves) > 1 else ""
        c = curve.compute / size
        ax.plot(c[used], curve.pass_rate[used], marker, ms=3.5, color="C0", alpha=0.8, label=f"validation{seed}")
        ax.plot(c[~used & ~start], curve.pass_rate[~used & ~start], marker, ms=3.5, mfc="none",
                color="0.5", label="not fitted" if k == 0 else None)
        ax.plot(c[start], curve.pass_rate[start], "s", ms=5, color="k", label="R0 (before RL)" if k == 0 else None)
    if fit.ok:
        top = max(float(c.compute.max()) for c in curves)
        _draw_fit(ax, fit, _grid(curves), top, "C1", "fit (Eq. 1)", lw=2, band=True, size=size)
        ax.axhline(fit.A, ls="--", color="C1", lw=1, label=f"A = {fit.A:.3f}")
        ax.axvline(fit.c_min / size, ls=":", color="0.5", lw=1)
    if forecast:
        c, lo, hi = (np.array(col, dtype=float) for col in zip(*forecast))
        ax.fill_between(c / size, lo, hi, color="C4", alpha=0.3, lw=0,
                        label=f"predicted to its budget ({fmt_compute(float(c[-1]) / size)} {unit}) when it "
                              "stopped, 90%")
        ax.set_xlim(right=max(ax.get_xlim()[1], 1.05 * float(c[-1]) / size))
    if extrap is not None and extrap.ok:
        grid = _grid(curves)
        ax.axvline(extrap.c_fit / size, ls="-.", color="0.6", lw=0.8)
        draws = extrap.sigmoid.predict_draws(grid[1:])  # the prediction's median, as the check prints it
        ahead = np.median(draws, axis=0) if len(draws) else extrap.sigmoid.predict(grid[1:])
        ax.plot(grid[1:] / size, ahead, "--", color="C2", lw=1.2,
                label=f"fit on C <= {fmt_compute(extrap.c_fit / size)}: end {extrap.predicted:.3f} "
                      f"[{extrap.predicted_ci[0]:.3f}, {extrap.predicted_ci[1]:.3f}] vs {extrap.observed:.3f}"
                      + ("" if extrap.covered else " (not predicted)"))
        ax.errorbar([extrap.c_end / size], [extrap.predicted],
                    yerr=[[extrap.predicted - extrap.predicted_ci[0]], [extrap.predicted_ci[1] - extrap.predicted]],
                    fmt="none", ecolor="C2", capsize=3, lw=1.2)
        if extrap.power is not None and extrap.power.ok:
            c = grid[grid >= extrap.c_fit * 0.2]
            ceiling = "none below 1" if extrap.power.A >= 1.0 else f"A = {extrap.power.A:.3f}"
            ax.plot(c / size, extrap.power.predict(c), ":", color="C3", lw=1.2,
                    label=f"power law on the same: {ceiling}")
    ax.set_title(f"{title}\n{describe(fit)}" + (f"\nthe law does not describe it: {departs}" if departs else ""),
                 fontsize=9, color="C3" if departs else "black")
    _legend(ax, fontsize=7, loc="lower right")
    fig.savefig(path)
    return path


def plot_overview(items: Sequence[tuple[str, Sequence[RunCurve], SigmoidFit]], path: Path, base: str | None = None,
                  verdicts: dict[str, str] | None = None) -> Path:
    """overview_figure, saved to `path`."""
    overview_figure(items, base, verdicts).savefig(path)
    return path


def overview_figure(items: Sequence[tuple[str, Sequence[RunCurve], SigmoidFit]], base: str | None = None,
                    verdicts: dict[str, str] | None = None):
    """A panel per variant, on shared axes: its points and fitted law (A dashed, extrapolation dotted) in its
    verdict's colour, the base recipe's law in grey behind it. Panels, not one axes: the variants of a sweep differ
    by a few points of pass rate, and nine curves on one axes lie on one line; each panel shows the one difference a
    verdict is about, against the base."""
    verdicts = verdicts or {}
    n = max(len(items), 1)
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig, axes = _figure(3.7 * ncols + 0.4, 2.5 * nrows + 0.6, ncols=ncols, nrows=nrows, sharex=True, sharey=True)
    cells = list(np.ravel(axes))
    all_curves = [c for _, curves, _ in items for c in curves]
    unit, size = _unit_of(all_curves)
    grid = _grid(all_curves)
    base_item = next((item for item in items if item[0] == base), None)
    for ax, (name, curves, fit) in zip(cells, items):
        col = verdict_color(verdicts.get(name, ""))
        if base_item is not None and name != base and base_item[2].ok:
            _, b_curves, b_fit = base_item
            for curve in b_curves:
                ax.plot(curve.compute / size, curve.pass_rate, "o", ms=1.8, alpha=0.5, color=BASE_GREY)
            _draw_fit(ax, b_fit, grid, max(float(c.compute.max()) for c in b_curves), BASE_GREY, None, 1.4,
                      size=size)
        for curve in curves:
            ax.plot(curve.compute / size, curve.pass_rate, "o", ms=2.2, alpha=0.55, color=col)
        if fit.ok:
            _draw_fit(ax, fit, grid, max(float(c.compute.max()) for c in curves), col, None, 1.8, size=size)
            ax.axhline(fit.A, ls="--", lw=0.8, color=col)
        said = verdicts.get(name, "") or ("" if fit.ok else "no fit")
        title = fitted(name, 44, lines=1) + (f"\n{fitted(said, 52, lines=1)}" if said else "")
        ax.set_title(title, fontsize=8.5, color=col if col != NO_CLAIM else "0.2")
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=7.5)
    for ax in cells[len(items):]:
        ax.set_axis_off()
    for j in range(ncols):  # the lowest panel of each column says the compute, above an empty cell too
        low = cells[max(k for k in range(j, max(len(items), 1), ncols))]
        low.tick_params(labelbottom=True)
        low.set_xlabel(f"compute ({unit})", fontsize=8)
    for ax in cells[::ncols]:
        ax.set_ylabel("validation pass rate", fontsize=8)
    against = "" if base_item is None else f" beside {base}'s in grey" if len(base) <= 30 else \
        " beside the base's in grey"
    fig.suptitle(f"each variant's pass rate and fitted law{against} (A dashed, extrapolation dotted)", fontsize=10)
    return fig


def _interval(ax, point: float, lo: float, hi: float, y: float, col, hollow: bool = False) -> None:
    """A point and its interval at height y; an open upper side (inf) is drawn to 3 x the point. Drawn as a segment
    and a marker, not an error bar: an interval need not hold the point estimate (docs/fitting.md#the-intervals),
    and matplotlib refuses negative error bars."""
    hi = hi if math.isfinite(hi) else point * 3
    ax.plot([lo, hi], [y, y], color=col, lw=0.8 if hollow else 1.2)
    ax.plot([lo, lo, math.nan, hi, hi], [y - 0.12, y + 0.12, math.nan, y - 0.12, y + 0.12], color=col, lw=0.8)
    ax.plot([point], [y], "o", color=col, mfc="white" if hollow else col)


def plot_params(items: Sequence[tuple[str, SigmoidFit, SigmoidFit | None]], base: str | None, path: Path,
                a_tie: float = 0.02, verdicts: dict[str, str] | None = None) -> Path:
    """params_figure, saved to `path`."""
    params_figure(items, base, a_tie, verdicts).savefig(path)
    return path


def params_figure(items: Sequence[tuple[str, SigmoidFit, SigmoidFit | None]], base: str | None, a_tie: float = 0.02,
                  verdicts: dict[str, str] | None = None):
    """A and B with their 90% intervals side by side, one row per variant in the order given (the first on top).
    items: (name, fit, B refit at a common A or None). The base recipe's A (with the +-a_tie band) and B are drawn as
    reference lines, its B interval shaded; a hollow marker is B at the common A the variant was compared at. With
    `verdicts` (name -> the verdict's text) each row is coloured by its verdict and says it under its name."""
    verdicts = verdicts or {}
    items = [item for item in items if item[1].ok]
    names = [fitted(name, 30, lines=1) + (f"\n{fitted(verdicts[name], 30, lines=1)}" if verdicts.get(name) else "")
             for name, _, _ in items]
    height, width = 0.42 * max(len(items), 2) + 1.1, 9.0
    # fixed margins: the names' column as wide as its longest line (at most 30 characters of 7.5 pt, 0.23 of the
    # width), the two panels the rest, where matplotlib's constrained layout gives long names the room, the panels none
    longest = max((len(line) for name in names for line in name.split("\n")), default=4)
    left = min(0.24, max(0.08, (longest * 7.5 * 0.6 / 72 + 0.2) / width))
    fig, (ax_a, ax_b) = _figure(width, height, ncols=2, margins=dict(left=left, right=0.98, wspace=0.06,
                                                                     bottom=0.5 / height, top=1 - 0.32 / height))
    ys = np.arange(len(items))[::-1]
    base_fit = next((fit for name, fit, _ in items if name == base), None)
    for y, (k, (name, fit, b_fit)) in zip(ys, enumerate(items)):
        col = verdict_color(verdicts[name]) if name in verdicts else color(k)
        _interval(ax_a, fit.A, *fit.ci["A"], y, col)
        _interval(ax_b, fit.B, *fit.ci["B"], y, col)
        if b_fit is not None and b_fit.ok:
            _interval(ax_b, b_fit.B, *b_fit.ci["B"], y - 0.25, col, hollow=True)
    if base_fit is not None:
        ax_a.axvline(base_fit.A, color="0.3", ls=":", lw=1)
        ax_a.axvspan(base_fit.A - a_tie, base_fit.A + a_tie, color="0.5", alpha=0.12, lw=0)
        ax_b.axvline(base_fit.B, color="0.3", ls=":", lw=1)
        if all(math.isfinite(x) for x in base_fit.ci["B"]):
            ax_b.axvspan(*base_fit.ci["B"], color="0.5", alpha=0.08, lw=0)
    for ax, title in ((ax_a, "A: ceiling (90% interval)"),
                      (ax_b, "B: efficiency (hollow: at its tie group's common A)")):
        ax.set_yticks(ys)
        ax.set_yticklabels(names if ax is ax_a else [""] * len(names), fontsize=7.5)
        ax.set_title(title, fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_ylim(-0.6, len(items) - 0.4)
    for label, (name, _, _) in zip(ax_a.get_yticklabels(), items):  # in the order of set_yticks: the items'
        label.set_color(verdict_color(verdicts[name]) if name in verdicts else "0.1")
    ax_a.set_xlabel("A")
    ax_b.set_xlabel("B")
    if base_fit is not None:
        ax_a.text(0.01, 0.01, f"band: the base's A +- {a_tie}",
                  transform=ax_a.transAxes, fontsize=7, color="0.4")
    return fig


def linearized_points(curves: Sequence[RunCurve], fit: SigmoidFit) -> tuple[np.ndarray, np.ndarray]:
    """(C, F(R)) for the fitted points with R0 < R < A: F(R) = C_mid^B / ((A - R0) / (R - R0) - 1)."""
    cs, fs = [], []
    for curve in curves:
        keep = (curve.compute >= fit.c_min) & (curve.compute > 0)
        r, c = curve.pass_rate[keep], curve.compute[keep]
        ok = (r > fit.R0) & (r < fit.A)
        with np.errstate(divide="ignore", invalid="ignore"):
            f = fit.C_mid ** fit.B / ((fit.A - fit.R0) / (r[ok] - fit.R0) - 1)
        cs.append(c[ok])
        fs.append(f)
    return np.concatenate(cs) if cs else np.zeros(0), np.concatenate(fs) if fs else np.zeros(0)


def plot_linearized(items: Sequence[tuple[str, Sequence[RunCurve], SigmoidFit, str]], path: Path) -> Path:
    """log F(R) against log C with each variant's line of slope B. items: (name, curves, fit, what its B is, e.g.
    "own fit" or "at common A 0.605"), said in the legend.

    F is divided by C_ref^B (C_ref: the smallest c_min) so that every line passes through 1 at C_ref and the
    lines fan out by their slopes: a steeper line is a higher B."""
    fits = [fit for _, _, fit, _ in items if fit.ok]
    fig, ax = _figure(7.4, 5.0)
    unit, size = _unit_of([c for _, curves, _, _ in items for c in curves])
    # the smallest compute a fit used: its c_min, or its first point above it where c_min is 0 (--c-min 0)
    c_ref = min((min(float(cv.compute[cv.compute > 0].min(initial=math.inf)) for cv in curves) if fit.c_min <= 0
                 else fit.c_min for _, curves, fit, _ in items if fit.ok), default=1.0)
    for k, (name, curves, fit, what) in enumerate(items):
        if not fit.ok:
            continue
        col = color(k)
        c, f = linearized_points(curves, fit)
        ax.loglog(c / size, f / c_ref**fit.B, "o", ms=2.5, alpha=0.5, color=col)
        top = max(float(cv.compute.max()) for cv in curves)
        line = np.geomspace(c_ref, top, 50)
        ax.loglog(line / size, (line / c_ref) ** fit.B, "-", color=col, lw=1.6,
                  label=f"{name}: slope B = {fit.B:.2f}, {what} (A = {fit.A:.3f})")
    if not fits:
        ax.text(0.5, 0.5, "no variant was fitted: no line to draw", transform=ax.transAxes, ha="center")
    ax.set_xlabel(f"compute C ({unit}, log)")
    ax.set_ylabel(f"F(R) / C_ref^B,  C_ref = {fmt_compute(c_ref / size)} {unit}   (log)")
    ax.set_title("linearized law: F(R) = C_mid^B / ((A - R0)/(R - R0) - 1) = C^B, lines of slope B", fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    _legend(ax, fontsize=7, loc="upper left")
    fig.savefig(path)
    return path
