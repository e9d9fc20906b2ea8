"""Does the law describe the run? A lack-of-fit test of a fit against the run's own noise (`misfit`).

The law can be wrong about a run in a few ways that matter: the run peaks and falls (a collapse, or a validation
set overfitted), it is still rising at its end where the law has levelled off, or it steps to another level. Each
is a shape of departure from the law: a change of slope from a point of the run on (a hinge) or a change of level (a
step), at fixed shares of the fitted compute. The run's own noise (white noise and a wobble over at most LONGEST of
the run, analysis/noise.py) is measured under the shape that fits best, so that a departure is not read as noise;
under it, by generalized least squares, the law alone is held against the law with each shape (a likelihood ratio).
The strongest shape is flagged when its |z| reaches CRITICAL (false flags on curves that follow the law: under 5%)
and its size at the run's end reaches SIZE (the paper's margin on A). Why and what was measured:
docs/fitting.md#misfit."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis import noise as noise_model
from analysis import point
from analysis.law import B_BOUNDS, C_MID_SPAN, CI_LEVEL, SigmoidFit, fmt_compute, prepare
from analysis.point import Precision

HINGES = (0.25, 0.5, 0.75, 0.875)  # where a change of slope may start, as a share of the fitted compute
STEPS = (0.25, 0.5, 0.75)  # where a change of level may be
LONGEST = 1 / 16  # the run's own wobble: correlated over at most a sixteenth of it (the mock's: 1,000 of 16,000 GPU-h)
CRITICAL = 3.5  # the largest |z| over the shapes that flags a departure (docs/fitting.md#misfit)
SIZE = 0.02  # ... and its size at the end of the run: the paper's margin on A (a smaller departure does not matter)


@dataclass(frozen=True)
class Misfit:
    """The strongest departure from the law: its shape ("falls", "rises", "steps down", "steps up"), where it
    starts (compute), its size at the end of the run (pass rate), its z against the run's own noise, and whether it
    is flagged (large and clear enough that the law does not describe the run)."""

    shape: str
    start: float
    size: float
    z: float
    flagged: bool

    def text(self, unit: str = "GPU-h") -> str:
        """ "falls below the law from 9,000 GPU-h on, by 0.031 at its end (z = -5.2)" """
        if self.shape.startswith("steps"):
            where = f"{self.shape} by {abs(self.size):.3f} at {fmt_compute(self.start)} {unit}"
        else:
            side = "below" if self.size < 0 else "above"
            verb = "falls" if self.size < 0 else "keeps rising"
            where = (f"{verb} {side} the law from {fmt_compute(self.start)} {unit} on, by {abs(self.size):.3f} at "
                     "its end")
        return f"{where} (z = {self.z:+.1f})"


def misfit(compute, reward, fit: SigmoidFit, *, runs=None, r0=None, critical: float = CRITICAL) -> Misfit | None:
    """The strongest departure of the points (fitted with c_min, R0 and runs as `fit` was) from the law, tested
    against the run's own noise; None for a failed fit or fewer than 12 points."""
    if not fit.ok:
        return None
    data = prepare(compute, reward, r0=r0, c_min=fit.c_min, runs=runs)
    if data.c.size < 12:
        return None
    c, log_c = data.c, np.log(data.c)
    u = (c - c.min()) / max(c.max() - c.min(), 1e-300)
    shapes = [(f"hinge {t}", t, np.maximum(u - t, 0.0) / (1 - t)) for t in HINGES]
    shapes += [(f"step {t}", t, (u >= t).astype(float)) for t in STEPS]
    x0 = np.array([fit.A, math.log(fit.B), math.log(fit.C_mid)])
    lower = np.array([fit.R0, math.log(B_BOUNDS[0]), math.log(fit.c_max / C_MID_SPAN)])
    upper = np.array([1.0, math.log(B_BOUNDS[1]), math.log(fit.c_max * C_MID_SPAN)])

    def fitted(g, precision):
        """The law (with the shape g, when given) by least squares under `precision` (None: ordinary), R0 held:
        (its objective, its parameters, the law)."""
        law = point.Law(log_c, data.r, fit.R0, None, precision=precision, shapes=None if g is None else g[:, None])
        start, lo, hi = (x0, lower, upper) if g is None else (np.append(x0, 0.0), np.append(lower, -1.0),
                                                              np.append(upper, 1.0))
        x = point.solve(law, start, lo, hi)
        return float(law.objective(x[None])[0]), x, law

    # the run's own noise, measured under the shape that fits it best (a departure is not read as noise): white
    # noise and a wobble over at most LONGEST of the run
    _, x, law = min((fitted(g, None) for _, _, g in shapes), key=lambda found: found[0])
    e, jac = law.residuals(x[None])
    own = noise_model.estimate(c, data.runs, e[0], jac[0], CI_LEVEL, slow=False, longest=LONGEST).noise
    precision = Precision(c, data.runs, own)
    # under it, the law alone against the law with each shape: the likelihood ratio, sign(b) sqrt(LR) its z
    base = fitted(None, precision)[0]
    best = None
    for name, t, g in shapes:
        value, x, _ = fitted(g, precision)
        b = float(x[-1])
        z = math.copysign(math.sqrt(2 * max(base - value, 0.0)), b)
        if best is None or abs(z) > abs(best[3]):
            best = (name, float(c.min() + t * (c.max() - c.min())), b, z)
    name, start, b, z = best
    shape = ("falls" if b < 0 else "rises") if name.startswith("hinge") else ("steps down" if b < 0 else "steps up")
    flagged = abs(z) >= critical and abs(b) >= SIZE
    return Misfit(shape=shape, start=start, size=b, z=z, flagged=flagged)
