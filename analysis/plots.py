"""Pass rate vs compute plots in the paper's style: GPU-hours on x, the fitted law as a line, A dashed.

Figures are drawn on the Agg canvas directly (no pyplot), so making a report never touches a caller's backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from analysis.fit import SigmoidFit
from analysis.runs import RunCurve


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_xlabel("compute (GPU-hours)")
    ax.set_ylabel("validation pass rate")
    ax.grid(True, alpha=0.3)
    return fig, ax


def _fit_grid(curves: Sequence[RunCurve]) -> np.ndarray:
    top = max((float(c.compute.max()) for c in curves if c.compute.size), default=1.0)
    return np.linspace(0.0, 1.1 * top if top > 0 else 1.0, 400)


def _draw_fit(ax, fit: SigmoidFit, grid: np.ndarray, c_data: float, color: str, label: str, lw: float) -> None:
    """The fitted law: solid over the run's data, dotted where it extrapolates beyond them."""
    inside = grid <= c_data
    ax.plot(grid[inside], fit.predict(grid[inside]), "-", lw=lw, color=color, label=label)
    if not inside.all():
        beyond = grid >= grid[inside][-1]
        ax.plot(grid[beyond], fit.predict(grid[beyond]), ":", lw=lw, color=color)


def _describe(fit: SigmoidFit) -> str:
    if not fit.ok:
        return f"fit failed: {fit.status}"
    lo, hi = fit.ci["A"]
    return f"A={fit.A:.3f} [{lo:.3f}, {hi:.3f}]  B={fit.B:.2f}  C_mid={fit.C_mid:.4g}"


def plot_run(curve: RunCurve, fit: SigmoidFit, path: Path, title: str) -> Path:
    """One run: fitted points filled, points left out of the fit hollow, the fit, A dashed, c_min dotted."""
    fig, ax = _figure(6.4, 4.2)
    start = curve.compute == 0
    used = ~start & (curve.compute >= fit.c_min if fit.ok else True)
    ax.plot(curve.compute[used], curve.pass_rate[used], "o", ms=4, color="C0", label="validation")
    ax.plot(curve.compute[~used & ~start], curve.pass_rate[~used & ~start], "o", ms=4, mfc="none", color="0.5",
            label="not fitted")
    ax.plot(curve.compute[start], curve.pass_rate[start], "s", ms=5, color="k", label="R0 (before RL)")
    if fit.ok:
        _draw_fit(ax, fit, _fit_grid([curve]), float(curve.compute.max()), "C1", "fit (Eq. 1)", lw=2)
        ax.axhline(fit.A, ls="--", color="C1", lw=1, label=f"A = {fit.A:.3f}")
        ax.axvline(fit.c_min, ls=":", color="0.5", lw=1)
    ax.set_title(f"{title}\n{_describe(fit)}", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.savefig(path)
    return path


def plot_overview(items: Sequence[tuple[str, RunCurve, SigmoidFit]], path: Path) -> Path:
    """All runs on one axes: points, fitted curves, asymptotes dashed in the same colour."""
    fig, ax = _figure(8.0, 5.0)
    grid = _fit_grid([curve for _, curve, _ in items])
    for k, (name, curve, fit) in enumerate(items):
        color = f"C{k % 10}"
        label = f"{name}: A={fit.A:.3f}, B={fit.B:.2f}" if fit.ok else f"{name}: no fit"
        ax.plot(curve.compute, curve.pass_rate, "o", ms=2.5, alpha=0.5, color=color)
        if fit.ok:
            _draw_fit(ax, fit, grid, float(curve.compute.max()), color, label, lw=1.8)
            ax.axhline(fit.A, ls="--", lw=0.8, color=color)
        else:
            ax.plot([], [], "o", color=color, label=label)
    ax.set_title("validation pass rate vs compute, sigmoid fits (A dashed, extrapolation dotted)", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.savefig(path)
    return path
