"""The report's figures, in the paper's style: pass rate against GPU-hours, fitted laws as lines, asymptotes dashed.

- overview: every variant's points and fitted law on one axes (extrapolation beyond a run's data dotted).
- variant: one variant, its seeds, the fit with its 90% band, A dashed, the half-run extrapolation and a power law.
- params: A and B with their 90% intervals side by side, the base recipe's values as reference lines.
- linearized: log F(R) against log C, F(R) = C_mid^B / ((A - R0) / (R - R0) - 1) = C^B, so each variant is a line
  of slope B (the paper's plot for comparing B at a common A).
Figures are drawn on the Agg canvas directly (no pyplot), so making a report never touches a caller's backend.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from analysis.law import SigmoidFit, fmt_compute
from analysis.runs import RunCurve

MARKERS = "osD^v<>ph*"


def color(k: int) -> str:
    return f"C{k % 10}"


def _figure(width: float, height: float, ncols: int = 1, margins: dict | None = None):
    """A figure on the Agg canvas; `margins` (subplots_adjust's) fix the layout instead of matplotlib's
    constrained layout, which measures every label at each save (half the time of a figure drawn once per variant)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout=None if margins else "constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols)
    if margins:
        fig.subplots_adjust(**margins)
    return fig, axes


def _pass_rate_axes(ax) -> None:
    ax.set_xlabel("compute (GPU-hours)")
    ax.set_ylabel("validation pass rate")
    ax.grid(True, alpha=0.3)


def _grid(curves: Sequence[RunCurve]) -> np.ndarray:
    top = max((float(c.compute.max()) for c in curves if c.compute.size), default=1.0)
    return np.linspace(0.0, 1.1 * top if top > 0 else 1.0, 400)


def _draw_fit(ax, fit: SigmoidFit, grid: np.ndarray, c_data: float, col: str, label: str | None, lw: float,
              band: bool = False) -> None:
    """The fitted law: solid over the data, dotted where it extrapolates; optionally its 90% band."""
    inside = grid <= c_data
    ax.plot(grid[inside], fit.predict(grid[inside]), "-", lw=lw, color=col, label=label)
    if not inside.all():
        beyond = grid >= grid[inside][-1]
        ax.plot(grid[beyond], fit.predict(grid[beyond]), ":", lw=lw, color=col)
    if band:
        lo, hi = fit.predict_interval(grid[1:])
        if np.isfinite(lo).all():
            ax.fill_between(grid[1:], lo, hi, color=col, alpha=0.18, lw=0, label="90% band of the law")


def describe(fit: SigmoidFit) -> str:
    if not fit.ok:
        return f"fit failed: {fit.status}"
    (a_lo, a_hi), (b_lo, b_hi) = fit.ci["A"], fit.ci["B"]
    return (f"A={fit.A:.3f} [{a_lo:.3f}, {a_hi:.3f}]  B={fit.B:.2f} [{b_lo:.2f}, {_fmt(b_hi, 2)}] (own fit)  "
            f"C_mid={fmt_compute(fit.C_mid)}")


def _fmt(x: float, digits: int) -> str:
    return "∞" if math.isinf(x) else f"{x:.{digits}f}"


def plot_variant(curves: Sequence[RunCurve], fit: SigmoidFit, path: Path, title: str, extrap=None,
                 forecast: Sequence[Sequence[float]] | None = None) -> Path:
    """One variant: each seed's points (hollow where left out of the fit), R0 squares, the fit with its band,
    A dashed, c_min dotted; with `extrap` (analysis.extrapolate.Extrapolation) the half-run fit and power law; with
    `forecast` ([compute, low, high] rows: an adaptive sweep's decision) the 90% band of the law it had fitted, to the
    full budget at the rung it stopped."""
    fig, ax = _figure(6.6, 4.4, margins=dict(left=0.11, right=0.97, bottom=0.11, top=0.88))
    _pass_rate_axes(ax)
    for k, curve in enumerate(curves):
        marker = MARKERS[k % len(MARKERS)]
        start = curve.compute == 0
        used = ~start & ((curve.compute >= fit.c_min) if fit.ok else True)
        seed = f" (seed run {curve.run_id[:7]})" if len(curves) > 1 else ""
        ax.plot(curve.compute[used], curve.pass_rate[used], marker, ms=3.5, color="C0", alpha=0.8,
                label=f"validation{seed}")
        ax.plot(curve.compute[~used & ~start], curve.pass_rate[~used & ~start], marker, ms=3.5, mfc="none",
                color="0.5", label="not fitted" if k == 0 else None)
        ax.plot(curve.compute[start], curve.pass_rate[start], "s", ms=5, color="k",
                label="R0 (before RL)" if k == 0 else None)
    if fit.ok:
        top = max(float(c.compute.max()) for c in curves)
        _draw_fit(ax, fit, _grid(curves), top, "C1", "fit (Eq. 1)", lw=2, band=True)
        ax.axhline(fit.A, ls="--", color="C1", lw=1, label=f"A = {fit.A:.3f}")
        ax.axvline(fit.c_min, ls=":", color="0.5", lw=1)
    if forecast:
        c, lo, hi = (np.array(col, dtype=float) for col in zip(*forecast))
        ax.fill_between(c, lo, hi, color="C4", alpha=0.3, lw=0,
                        label=f"the law to its budget ({fmt_compute(float(c[-1]))} GPU-h) when it stopped, 90%")
        ax.set_xlim(right=max(ax.get_xlim()[1], 1.05 * float(c[-1])))
    if extrap is not None and extrap.ok:
        grid = _grid(curves)
        ax.axvline(extrap.c_fit, ls="-.", color="0.6", lw=0.8)
        ax.plot(grid[1:], extrap.sigmoid.predict(grid[1:]), "--", color="C2", lw=1.2,
                label=f"fit on C <= {fmt_compute(extrap.c_fit)}: end {extrap.predicted:.3f} vs {extrap.observed:.3f}")
        if extrap.power is not None and extrap.power.ok:
            c = grid[grid >= extrap.c_fit * 0.2]
            ax.plot(c, extrap.power.predict(c), ":", color="C3", lw=1.2,
                    label=f"power law on the same: A = {extrap.power.A:.3f}")
    ax.set_title(f"{title}\n{describe(fit)}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.savefig(path)
    return path


def plot_overview(items: Sequence[tuple[str, Sequence[RunCurve], SigmoidFit]], path: Path) -> Path:
    """All variants on one axes: points, fitted curves, asymptotes dashed in the same colour."""
    fig, ax = _figure(8.4, 5.2)
    _pass_rate_axes(ax)
    grid = _grid([c for _, curves, _ in items for c in curves])
    for k, (name, curves, fit) in enumerate(items):
        col = color(k)
        label = f"{name}: A={fit.A:.3f}, B={fit.B:.2f} (own fit)" if fit.ok else f"{name}: no fit"
        for curve in curves:
            ax.plot(curve.compute, curve.pass_rate, "o", ms=2.5, alpha=0.45, color=col)
        if fit.ok:
            top = max(float(c.compute.max()) for c in curves)
            _draw_fit(ax, fit, grid, top, col, label, lw=1.8)
            ax.axhline(fit.A, ls="--", lw=0.8, color=col)
        else:
            ax.plot([], [], "o", color=col, label=label)
    ax.set_title("validation pass rate vs compute, sigmoid fits (A dashed, extrapolation dotted)", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.savefig(path)
    return path


def _interval(ax, point: float, lo: float, hi: float, y: float, col, hollow: bool = False) -> None:
    """A point and its interval at height y; an open upper side (inf) is drawn to 3 x the point. Drawn as a segment
    and a marker, not an error bar: an interval need not hold the point estimate (docs/fitting.md#the-intervals),
    and matplotlib refuses negative error bars."""
    hi = hi if math.isfinite(hi) else point * 3
    ax.plot([lo, hi], [y, y], color=col, lw=0.8 if hollow else 1.2)
    ax.plot([lo, lo, math.nan, hi, hi], [y - 0.12, y + 0.12, math.nan, y - 0.12, y + 0.12], color=col, lw=0.8)
    ax.plot([point], [y], "o", color=col, mfc="white" if hollow else col)


def plot_params(items: Sequence[tuple[str, SigmoidFit, SigmoidFit | None]], base: str | None, path: Path,
                a_tie: float = 0.02) -> Path:
    """A and B with their 90% intervals side by side, one row per variant (best first, top). items:
    (name, fit, B refit at a common A or None). The base recipe's A (with the +-a_tie band) and B are drawn as
    reference lines; a hollow marker is B at the common A the variant was compared at."""
    items = [item for item in items if item[1].ok]
    fig, (ax_a, ax_b) = _figure(9.0, 0.45 * max(len(items), 2) + 1.4, ncols=2)
    ys = np.arange(len(items))[::-1]
    base_fit = next((fit for name, fit, _ in items if name == base), None)
    for y, (k, (name, fit, b_fit)) in zip(ys, enumerate(items)):
        col = color(k)
        _interval(ax_a, fit.A, *fit.ci["A"], y, col)
        _interval(ax_b, fit.B, *fit.ci["B"], y, col)
        if b_fit is not None and b_fit.ok:
            _interval(ax_b, b_fit.B, *b_fit.ci["B"], y - 0.25, col, hollow=True)
    if base_fit is not None:
        ax_a.axvline(base_fit.A, color="0.3", ls=":", lw=1)
        ax_a.axvspan(base_fit.A - a_tie, base_fit.A + a_tie, color="0.5", alpha=0.12, lw=0)
        ax_b.axvline(base_fit.B, color="0.3", ls=":", lw=1)
    names = [name for name, _, _ in items]
    for ax, title in ((ax_a, "A: ceiling (90% interval)"),
                      (ax_b, "B: efficiency (filled: own fit; hollow: at its tie group's common A)")):
        ax.set_yticks(ys)
        ax.set_yticklabels(names if ax is ax_a else [""] * len(names), fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
    ax_a.set_xlabel("A")
    ax_b.set_xlabel("B")
    if base_fit is not None:
        ax_a.text(0.01, 0.01, f"band: {base} A +- {a_tie} (the paper's margin: a move inside it is small)",
                  transform=ax_a.transAxes, fontsize=7, color="0.4")
    fig.savefig(path)
    return path


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
    c_ref = min((fit.c_min for fit in fits), default=1.0)
    for k, (name, curves, fit, what) in enumerate(items):
        if not fit.ok:
            continue
        col = color(k)
        c, f = linearized_points(curves, fit)
        ax.loglog(c, f / c_ref**fit.B, "o", ms=2.5, alpha=0.5, color=col)
        top = max(float(cv.compute.max()) for cv in curves)
        line = np.geomspace(c_ref, top, 50)
        ax.loglog(line, (line / c_ref) ** fit.B, "-", color=col, lw=1.6,
                  label=f"{name}: slope B = {fit.B:.2f}, {what} (A = {fit.A:.3f})")
    ax.set_xlabel("compute C (GPU-hours, log)")
    ax.set_ylabel(f"F(R) / C_ref^B,  C_ref = {fmt_compute(c_ref)} GPU-hours   (log)")
    ax.set_title("linearized law: F(R) = C_mid^B / ((A - R0)/(R - R0) - 1) = C^B, lines of slope B", fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left")
    fig.savefig(path)
    return path
