"""A stated question (sweep.margin_A, margin_B, level, budget_gpu_hours): the designs' power at the margins by the
fast model (analysis/design.py) and the dry run's table, with its cheapest design marked or a plain line that none
fits the budget. docs/fitting.md#a-stated-question."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_a_designs_power_at_the_recipe_level_is_the_spreads_arithmetic_by_hand():
    """Runs with no noise of their own (sds 0) and the prior spread 0.015: sd of dA = 0.015 sqrt(1/n + 1/b), power
    Phi(0.02 / sd - 2.326). By hand: 12 seeds each, sd 0.006124, Phi(0.9396) = 0.826; 11 each, sd 0.006396,
    Phi(0.8006) = 0.788 (the issue's "about 12 a variant"). GPU-hours: 12 x 8 + 12 x 1 = 108 for variants costing
    8 a seed together and a base of 1; a half-length design costs half."""
    from analysis.design import Design, Question, answer

    q = Question(margin_A=0.02)
    twelve = answer(Design("12", 12, 12), q, sds=(0.0, 0.0), hours=(8.0, 1.0))
    eleven = answer(Design("11", 11, 11), q, sds=(0.0, 0.0), hours=(8.0, 1.0))
    assert twelve.sd_dA == pytest.approx(0.006124, abs=1e-6) and twelve.power_A == pytest.approx(0.826, abs=1e-3)
    assert eleven.power_A == pytest.approx(0.788, abs=1e-3)
    assert twelve.reaches() and not eleven.reaches()
    # resolved 9 times in 10: (2.3263 + 1.2816) x 0.015 x sqrt(2 / 12) = 0.022094 between the recipes, 0 between
    # runs with no noise of their own
    assert twelve.resolution == pytest.approx((0.0, 0.022094), abs=2e-6)
    assert twelve.gpu_hours == 108.0
    assert answer(Design("half", 12, 12, 0.5), q, sds=(0.0, 0.0), hours=(8.0, 1.0)).gpu_hours == 54.0
    # negative control: between these runs the spread is not added: sd 0.005 sqrt(2) = 0.00707, Phi(0.5021) = 0.692
    runs = answer(Design("1", 1, 1), Question(margin_A=0.02, level="runs"), sds=(0.005, 0.0), hours=(8.0, 1.0))
    assert runs.power_A == pytest.approx(0.692, abs=1e-3)
    # B about the recipes with no spread of B known: no claim, so not asked of the design (nan), not a power of 0
    b = answer(Design("1", 1, 1), Question(margin_A=0.02, margin_B=0.25), sds=(0.0, 0.1), hours=(8.0, 1.0))
    assert b.power_B != b.power_B


def _rows(stdout: str) -> dict[str, str]:
    """The question's table: design name -> its line."""
    lines = stdout.split("the question:", 1)[1].splitlines()
    return {line.split("  ")[1].strip(): line for line in lines if line.startswith("  ") and "of the budget" in line}


def test_the_dry_run_says_plainly_that_no_design_fits_the_budget_and_what_budget_would(tmp_path: Path):
    """The mock (8 variants of 16,000 GPU-hours a run, the base 16,000): nothing reaches 80% at |dA| >= 0.02 about
    the recipes within 500,000 GPU-hours; the cheapest that does is priced as by hand: half-length runs, 14 a
    variant and 41 of the base, 0.5 x (14 x 128,000 + 41 x 16,000) = 1,224,000 GPU-hours. Between these runs
    (sweep.level=runs) one run of each variant and four of the base do: 1 x 128,000 + 4 x 16,000 = 192,000, marked."""
    from conftest import run_main

    out = run_main("-m", "ablate", "sweep=loo", "generator=mock", "sweep.dry_run=true",
                   "sweep.budget_gpu_hours=500000", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert ("none reaches 80% power within 500,000 GPU-hours: the cheapest that does needs 1,224,000 (14 a variant, "
            "41 of the base, each 0.5 of the budget)") in out.stdout
    assert "<- the cheapest" not in out.stdout
    rows = _rows(out.stdout)
    assert rows["this sweep"].split()[-1] == "144,000"
    runs = run_main("-m", "ablate", "sweep=loo", "generator=mock", "sweep.dry_run=true", "sweep.level=runs",
                    cwd=tmp_path)
    marked = [line for line in _rows(runs.stdout).values() if "<- the cheapest at 80%" in line]
    assert len(marked) == 1 and marked[0].split()[:10] == ["1", "a", "variant,", "4", "of", "the", "base", "1", "4",
                                                           "1"]
    assert "192,000" in marked[0]


def test_a_question_the_sweep_cannot_ask_is_refused_naming_its_key(tmp_path: Path):
    from conftest import run_main

    out = run_main("-m", "ablate", "sweep=loo", "generator=mock", "sweep.dry_run=true", "sweep.level=seeds",
                   cwd=tmp_path)
    assert out.returncode != 0 and "sweep.level=seeds: runs or recipes" in out.stdout + out.stderr
