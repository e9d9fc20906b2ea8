"""Real validation noise: the project's public RL curves (analysis/data/real_curves/), the residuals of each run
about its own fitted law, their measured figures, and the real-noise layer: those residuals block-resampled onto
known laws, so that curves have a known truth and real noise.

`real_runs` reads the curves (the hold-out apart unless asked for); `donor` fits one run and keeps its residuals;
`measure` gives their figures (sd, autocorrelation, tails, the slow and the fast part); `resampled` maps a donor's
residuals onto n points of another run in blocks; `real_curve` puts them on a known law. What the curves are and
where they come from: analysis/data/real_curves/README.md; how real noise differs from the generated layers':
docs/fitting.md#real-noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from analysis.fit import FitError, fit_sigmoid
from analysis.synthetic import Curve, Truth
from analysis.tables import read_table

DATA = Path(__file__).resolve().parent / "data" / "real_curves"
HOLDOUT = "holdout"  # the subfolder of curves never used to calibrate anything
REWARD = "reward"  # the long form's reward column; a W&B export's reward is its one validation metric
BLOCK = 1 / 3  # the real-noise layer's block: a third of a run's residual series at a time
C_MAX = 16_000.0  # the real-noise layer's runs end here (GPU-hours), as a LOO run's budget


@dataclass(frozen=True)
class RealRun:
    """One public run: its validation pass rate at each step, where it comes from, and its recipe and seed where
    the source says (runs of one recipe that differ only in their seed share `recipe`)."""

    source: str  # the file's stem
    name: str
    step: np.ndarray
    reward: np.ndarray
    recipe: str
    seed: int | None = None
    holdout: bool = False


def real_runs(*, holdout: bool = False, sources: tuple[str, ...] | None = None, folder: Path = DATA) -> list[RealRun]:
    """The data set's runs: the calibration sources' (holdout=False) or the hold-out's (True), optionally only
    `sources` (file stems); in file order. Runs with fewer than 8 points are left out (nothing to measure)."""
    where = folder / HOLDOUT if holdout else folder
    out = []
    for path in sorted(where.glob("*.csv")):
        if sources is not None and path.stem not in sources:
            continue
        for run in read_table(path):
            metric = REWARD if REWARD in run.metrics else _validation_metric(run.metrics)
            if metric is None:
                continue
            series = run.history(metric)
            if series.step.size < 8:
                continue
            seed = None
            if "seed" in run.metrics:
                seed = int(run.history("seed").value[0])
            out.append(RealRun(source=path.stem, name=run.name, step=series.step.astype(float),
                               reward=series.value.astype(float), recipe=run.tags.get("recipe", run.name), seed=seed,
                               holdout=holdout))
    return out


def _validation_metric(metrics) -> str | None:
    """A W&B export's reward: its one validation metric (`val-core/...`, `val/...`)."""
    found = [m for m in metrics if m.startswith("val")]
    return found[0] if len(found) == 1 else None


DONORS_HELP = ("the real layer's noise: calibration (every source but the hold-out), holdout, or file stems of "
               "analysis/data/real_curves/, comma-separated")


def parse_donors(text: str) -> tuple[bool, tuple[str, ...] | None]:
    """A bench's --donors (DONORS_HELP) as `donors`' arguments: (holdout, sources)."""
    if text in ("calibration", "holdout"):
        return text == "holdout", None
    return False, tuple(name.strip() for name in text.split(","))


def source_names(*, holdout: bool = False, folder: Path = DATA) -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in (folder / HOLDOUT if holdout else folder).glob("*.csv")))


# --- residuals about the run's own law ------------------------------------------------------------------------


@dataclass(frozen=True)
class Donor:
    """A run's residuals (observed minus its fitted law) at its fitted points, in order, and what they came from."""

    run: RealRun
    compute: np.ndarray  # the fitted points' steps
    residual: np.ndarray
    r0_sd: float  # the jitter's sd: what a pre-RL point carries in the layer
    fit_A: float

    @property
    def source(self) -> str:
        return self.run.source


def donor(run: RealRun) -> Donor | None:
    """The run fitted on all its points (None where the law cannot be fitted: the reason is the fit's)."""
    try:
        fit = fit_sigmoid(run.step, run.reward)
    except FitError:
        return None
    keep = run.step >= fit.c_min
    residual = run.reward[keep] - fit.predict(run.step[keep])
    fast = _fast(residual)
    return Donor(run=run, compute=run.step[keep], residual=residual, r0_sd=float(np.std(fast)), fit_A=fit.A)


@lru_cache(maxsize=None)
def donors(*, holdout: bool = False, sources: tuple[str, ...] | None = None) -> tuple[Donor, ...]:
    """The donors of the data set's runs (each fitted once a process)."""
    return tuple(d for d in (donor(r) for r in real_runs(holdout=holdout, sources=sources)) if d is not None)


def _window(m: int) -> int:
    """The running mean that splits a residual series into its slow and fast parts: a fifteenth of the run, odd, at
    least 5 points."""
    w = max(5, int(round(m / 15)))
    return w + 1 - w % 2


def _slow(e: np.ndarray) -> np.ndarray:
    """The running mean of e over `_window` points (shorter windows at the ends)."""
    w = _window(e.size)
    half = w // 2
    cum = np.concatenate([[0.0], np.cumsum(e)])
    lo = np.clip(np.arange(e.size) - half, 0, e.size)
    hi = np.clip(np.arange(e.size) + half + 1, 0, e.size)
    return (cum[hi] - cum[lo]) / (hi - lo)


def _fast(e: np.ndarray) -> np.ndarray:
    return e - _slow(e)


def _acf(e: np.ndarray, lag: int) -> float:
    e = e - e.mean()
    if e.size <= lag + 1 or not (e @ e) > 0:
        return math.nan
    return float(e[:-lag] @ e[lag:] / (e @ e))


def measure(e: np.ndarray) -> dict[str, float]:
    """A residual series' figures: its sd, its autocorrelation at lags 1, 2 and 5 (points), its excess kurtosis and
    the share of points beyond 3 robust sd; the slow part (a running mean over a fifteenth of the run) and the fast
    part (the rest): their sds, the fast part's lag-1 autocorrelation."""
    e = np.asarray(e, dtype=float)
    centred = e - e.mean()
    sd = float(centred.std())
    robust = 1.4826 * float(np.median(np.abs(centred - np.median(centred))))
    slow, fast = _slow(e), _fast(e)
    return {
        "points": float(e.size),
        "sd": sd,
        "lag1": _acf(e, 1),
        "lag2": _acf(e, 2),
        "lag5": _acf(e, 5),
        "kurtosis": float((centred**4).mean() / sd**4 - 3) if sd > 0 else math.nan,
        "beyond_3sd": float(np.mean(np.abs(centred) > 3 * robust)) if robust > 0 else 0.0,
        "sd_slow": float(slow.std()),
        "sd_fast": float(fast.std()),
        "fast_lag1": _acf(fast, 1),
    }


# --- the layer: real residuals on known laws ------------------------------------------------------------------


def resampled(rng: np.random.Generator, d: Donor, n: int, block: float = BLOCK) -> np.ndarray:
    """n values of the donor's residual series, mapped by position along the run (the k-th of n points sits at k/n
    of it), in blocks of `block` of the run: each block a window of the donor's series at a random offset, so the
    slow departures within a block are the donor's own and their order, not their place, is drawn (block 1: the
    whole series, in place)."""
    m = d.residual.size
    u = (np.arange(n) + 0.5) / n
    if block >= 1:
        pos = u
    else:
        which = np.minimum((u / block).astype(int), int(math.ceil(1 / block)) - 1)
        offsets = rng.uniform(0.0, 1.0 - block, size=which.max() + 1)
        pos = offsets[which] + (u - which * block)
    return d.residual[np.clip(np.round(pos * m - 0.5).astype(int), 0, m - 1)]


def real_curve(rng: np.random.Generator, truth: Truth, d: Donor, *, block: float = BLOCK, c_max: float = C_MAX,
               compute: np.ndarray | None = None) -> Curve:
    """A run of `truth` with the donor's noise: at `compute` (its first point the pre-RL one, at 0), or by default
    at the donor's fitted points scaled so its last lies at c_max after a pre-RL point at 0. The pre-RL point
    carries the donor's jitter; the others the donor's residuals resampled (`resampled`)."""
    if compute is None:
        compute = np.concatenate([[0.0], d.compute / d.compute.max() * c_max])
    compute = np.asarray(compute, dtype=float)
    noise = np.concatenate([[d.r0_sd * rng.standard_normal()], resampled(rng, d, compute.size - 1, block)])
    return Curve(truth=truth, compute=compute, reward=np.clip(truth(compute) + noise, 0.0, 1.0))


def layer_curves(n: int, seed: int = 0, *, holdout: bool = False, sources: tuple[str, ...] | None = None,
                 block: float = BLOCK) -> list[Curve]:
    """n curves of the real-noise layer for the fitter's benchmark: truths drawn as the held-out-like set draws
    them (analysis/synthetic.py's `heldout_like_truth`), each on the next donor's points with that donor's
    residuals (the donors in turn)."""
    from analysis.synthetic import heldout_like_truth

    pool = donors(holdout=holdout, sources=sources)
    if not pool:
        raise ValueError(f"no real run to take noise from (sources {sources}, hold-out {holdout})")
    rng = np.random.default_rng([seed, 29])
    return [real_curve(rng, heldout_like_truth(rng), pool[k % len(pool)], block=block) for k in range(n)]
