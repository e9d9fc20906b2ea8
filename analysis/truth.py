"""The known truth of mock runs (generator=mock), and what it says a verdict should be at a sweep's resolution.

`run_truth`: the law the pooled seeds of a variant follow, from the params the mock logs (`mock.truth.A`, `.B`,
`.C_mid`, `.R0`, and `mock.run.A`, this run's A; ablate/generators/mock.py); `recipe_truth`: the variant's own law,
what a recipe-level verdict is judged by. `expected`: per parameter, "moved" (at
or above the verdict's resolution: must be found), "unmoved" (must not be claimed) or "either" (below it);
`Expected.judge` says why a verdict is wrong, or "". The rules: docs/fitting.md#the-mocks-truth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from analysis.rank import Efficiency, law_compute
from analysis.synthetic import Truth

PARAMS = ("mock.truth.A", "mock.truth.B", "mock.truth.C_mid", "mock.truth.R0", "mock.run.A")


def run_truth(params_of_seeds: Sequence[dict]) -> Truth | None:
    """The law the pooled curves of one variant follow (A: the mean of the runs' A); None unless every seed is a
    mock run with its truth logged."""
    return _truth(params_of_seeds, recipe=False)


def recipe_truth(params_of_seeds: Sequence[dict]) -> Truth | None:
    """The law of the variant's recipe (mock.truth.*: before any run's own draw of A); None unless every seed is a
    mock run with its truth logged."""
    return _truth(params_of_seeds, recipe=True)


def _truth(params_of_seeds: Sequence[dict], recipe: bool) -> Truth | None:
    if not params_of_seeds or not all(all(k in p for k in PARAMS) for p in params_of_seeds):
        return None
    first = params_of_seeds[0]
    try:
        run_A = [float(p["mock.run.A"]) for p in params_of_seeds]
        return Truth(A=float(first["mock.truth.A"]) if recipe else sum(run_A) / len(run_A),
                     B=float(first["mock.truth.B"]), C_mid=float(first["mock.truth.C_mid"]),
                     R0=float(first["mock.truth.R0"]))
    except ValueError:
        return None


@dataclass(frozen=True)
class Expected:
    """What the truth says a verdict should be: per parameter, "moved" (at or above the resolution: must be
    found), "unmoved" (exactly no change: must not be claimed) or "either" (below the resolution)."""

    dA: float
    dB: float
    A: str
    B: str
    dlnC: float | None = None  # ln(C* / C*_base) at the verdict's R* (None: no compute comparison)
    C: str = ""

    def judge(self, moves_A: bool, dA: float | None, moves_B: bool, dB: float | None,
              moves_C: bool = False, dlnC: float | None = None) -> str:
        """"" when a verdict with these claims is right, else why it is wrong."""
        wrong = []
        if moves_C and (self.C in ("", "unmoved") or (not math.isnan(self.dlnC) and _sign(dlnC) != _sign(self.dlnC))):
            true = f"{math.exp(self.dlnC):.2f}x" if self.dlnC is not None else "not compared"
            wrong.append(f"compute {math.exp(dlnC or 0):.2f}x, truth {true}")
        if not (moves_A or moves_B or moves_C) and self.C == "moved":
            wrong.append(f"missed compute {math.exp(self.dlnC):.2f}x")
        if moves_A and (self.A == "unmoved" or _sign(dA) != _sign(self.dA)):
            wrong.append(f"A moved {'up' if (dA or 0) > 0 else 'down'}, truth {self.dA:+.3f}")
        if not moves_A and self.A == "moved":
            wrong.append(f"missed A {self.dA:+.3f}")
        if moves_B and (self.B == "unmoved" or _sign(dB) != _sign(self.dB)):
            wrong.append(f"B moved {'up' if (dB or 0) > 0 else 'down'}, truth {self.dB:+.2f}")
        if not moves_B and self.B == "moved":
            wrong.append(f"missed B {self.dB:+.2f}")
        return "; ".join(wrong)

    @property
    def text(self) -> str:
        """What must be found ("moved") or not claimed ("unmoved"), "compute" for the compute to reach R*; parts
        below the resolution ("either") are left out: "A moved, B unmoved", or "any verdict"."""
        parts = [f"{name} {said}" for name, said in (("A", self.A), ("B", self.B), ("compute", self.C))
                 if said and said != "either"]
        return ", ".join(parts) or "any verdict"


def expected(truth: Truth, base: Truth, resolution: tuple[float, float], compute: Efficiency | None = None) -> Expected:
    """The truth's verdict at a comparison's resolution (|dA|, |dB| detected 9 times in 10; the compute ratio's
    from `compute`, with the R* it was measured at)."""
    dA, dB = truth.A - base.A, truth.B - base.B
    out = Expected(dA=dA, dB=dB, A=_moved(dA, resolution[0]), B=_moved(dB, resolution[1]))
    if compute is None:
        return out
    c, c_base = (float(law_compute(compute.R_star, t.A, t.B, t.C_mid, t.R0)) for t in (truth, base))
    # A truth that never reaches R* needs infinite compute: +inf against a finite base (more compute, whatever the
    # factor), nan where neither reaches it (no direction to hold a claim to)
    same = (truth.A, truth.B, truth.C_mid, truth.R0) == (base.A, base.B, base.C_mid, base.R0)
    dlnC = 0.0 if same else _ln(c) - _ln(c_base)
    return replace(out, dlnC=dlnC, C="either" if math.isnan(dlnC) else _moved(dlnC, compute.resolution))


def _moved(d: float, resolution: float) -> str:
    if d == 0:
        return "unmoved"
    return "moved" if math.isfinite(resolution) and abs(d) >= resolution else "either"


def _ln(c: float) -> float:
    return -math.inf if c == 0 else math.log(c)


def _sign(x: float | None) -> int:
    return 0 if not x else (1 if x > 0 else -1)
