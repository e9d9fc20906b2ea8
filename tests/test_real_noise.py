"""The real curves (analysis/data/real_curves/) and the real-noise layer (analysis/real_noise.py): where every file
comes from, the hold-out kept apart, residuals resampled by hand, and, over every real run, the extrapolation
check's printed prediction inside its own interval."""

import re

import numpy as np
import pytest

from analysis.extrapolate import extrapolation_check
from analysis.real_noise import (DATA, HOLDOUT, Donor, RealRun, layer_curves, measure, real_curve, real_runs,
                                 resampled, source_names)
from analysis.synthetic import Truth


def test_every_file_says_its_source_commit_and_licence():
    """Each file of the data set has its row in the README: a repository, a 40-hex commit and a licence (or "none
    stated"); the whole set stays a few MB."""
    readme = (DATA / "README.md").read_text()
    files = sorted(DATA.glob("*.csv")) + sorted((DATA / HOLDOUT).glob("*.csv"))
    assert len(files) >= 7
    rows = {line.split("|")[1].strip(): line for line in readme.splitlines() if line.startswith("| `")}
    for path in files:
        key = f"`{path.name}`" if path.parent == DATA else "`holdout/deep_grpo_*.csv`"
        assert key in rows, path.name
        assert re.search(r"`[0-9a-f]{40}`", rows[key]), path.name
        assert re.search(r"Apache-2.0|MIT|none stated", rows[key]), path.name
    assert sum(p.stat().st_size for p in files) < 3e6


def test_the_hold_out_is_apart_and_the_calibration_has_enough():
    """At least 15 calibration runs from at least two sources, none of them a hold-out run; the hold-out: the 17
    W&B-exported GSM8K runs, read through the W&B reader, each once."""
    calibration, holdout = real_runs(), real_runs(holdout=True)
    assert len(calibration) >= 15 and len({r.source for r in calibration}) >= 2
    assert not {r.name for r in calibration} & {r.name for r in holdout}
    assert len(holdout) == 17 == len({r.name for r in holdout}) and all(r.holdout for r in holdout)
    assert all(r.step[0] == 0 and r.step.size >= 186 for r in holdout)
    assert set(source_names(holdout=True)) == {r.source for r in holdout}


def _donor(residual) -> Donor:
    run = RealRun(source="x", name="x", step=np.arange(len(residual)) + 1.0, reward=np.zeros(len(residual)),
                  recipe="x")
    return Donor(run=run, compute=run.step, residual=np.asarray(residual, dtype=float), r0_sd=0.0, fit_A=0.5)


def test_residuals_are_mapped_by_position_in_blocks_by_hand():
    """A donor of 12 residuals 0..11 onto 6 points, whole: the k-th point at (k + 0.5)/6 of the run, the donor's
    index round(12 u - 0.5) = 0, 2, 4, 6, 8, 10. In blocks of a third: each block's two points are two consecutive
    picks of one window of a third of the donor (4 residuals), at an offset in [0, 2/3]."""
    d = _donor(np.arange(12))
    assert resampled(np.random.default_rng(0), d, 6, block=1.0).tolist() == [0, 2, 4, 6, 8, 10]
    for seed in range(20):
        got = resampled(np.random.default_rng(seed), d, 6, block=1 / 3)
        for first, second in got.reshape(3, 2):
            assert second - first == 2 and 0 <= first <= 12 * 2 / 3


def test_a_real_curve_is_the_law_plus_the_donors_residuals():
    d = _donor([0.01, -0.02, 0.03, 0.0])
    truth = Truth(A=0.6, B=2.0, C_mid=4000.0, R0=0.3)
    c = real_curve(np.random.default_rng(1), truth, d, block=1.0)
    assert c.compute.tolist() == [0.0, 4000.0, 8000.0, 12000.0, 16000.0]
    assert c.reward[0] == pytest.approx(0.3)  # the donor's jitter is 0
    assert c.reward[1:] - truth(c.compute[1:]) == pytest.approx([0.01, -0.02, 0.03, 0.0])


def test_measure_by_hand():
    """An alternating series: sd 1, lag-1 autocorrelation -(n - 1)/n, lag 2 +(n - 2)/n; a running mean over 5 points
    of it is +-0.2 inside (its slow part), the rest, +-0.8, its fast part."""
    e = np.array([1.0, -1.0] * 20)
    m = measure(e)
    assert m["sd"] == pytest.approx(1.0) and m["lag1"] == pytest.approx(-39 / 40) and m["lag2"] == pytest.approx(38 / 40)
    assert m["beyond_3sd"] == 0.0 and m["points"] == 40
    assert m["sd_slow"] == pytest.approx(0.2, abs=0.01) and m["sd_fast"] == pytest.approx(0.8, abs=0.01)


def test_the_layer_is_seeded_and_carries_each_donors_noise():
    a, b = layer_curves(3, seed=5), layer_curves(3, seed=5)
    assert all((x.reward == y.reward).all() and x.truth == y.truth for x, y in zip(a, b))
    assert not (layer_curves(3, seed=6)[0].reward == a[0].reward).all()
    with pytest.raises(ValueError, match="no real run"):
        layer_curves(1, sources=("no such source",))


@pytest.mark.parametrize("holdout", [False, True])
def test_every_printed_prediction_lies_inside_its_interval_over_the_real_runs(holdout):
    """The extrapolation check on every real run, fitted on its first half: its printed prediction (the median of
    what will be observed) inside its own 90% interval, an interval that is a real interval (lo < hi); the old
    check printed the law at the point estimate beside the band of the law's mean, and 5 of the hold-out's 17
    predictions lay outside their own band."""
    checked = 0
    for run in real_runs(holdout=holdout):
        ex = extrapolation_check(run.step, run.reward, fraction=0.5)
        if not ex.ok:
            continue
        lo, hi = ex.predicted_ci
        assert lo < ex.predicted < hi, (run.source, run.name, ex.predicted, ex.predicted_ci)
        checked += 1
    assert checked >= (17 if holdout else 120)


def test_the_report_says_a_declining_real_run_is_not_described_and_how_the_ends_were_predicted(tmp_path, capsys):
    """Two hold-out runs as a long table through `python -m analysis report --csv`: GRPO-n32 (the base) and TreeRL,
    which peaks and falls. TreeRL's verdict is that the law does not describe it, with where it departs, in place of
    a ceiling; the headline says how many ends the half-run check predicted, and names any that it did not."""
    from analysis.__main__ import main

    runs = {r.name: r for r in real_runs(holdout=True)}
    base = runs["Qwen2.5-0.5B-Instruct-GSM8K-GRPO-n32-01131200"]
    tree = runs["Qwen2.5-0.5B-Instruct-TreeRL"]
    lines = ["run,step,reward"] + [f"{name},{int(s)},{v}" for name, run in (("grpo-n32", base), ("treerl", tree))
                                   for s, v in zip(run.step, run.reward)]
    path = tmp_path / "runs.csv"
    path.write_text("\n".join(lines) + "\n")
    assert main(["report", "--csv", str(path), "--base", "grpo-n32", "--out", str(tmp_path / "out")]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert "The law does not describe treerl, beyond its own noise: treerl falls below the law from" in flat
    # GRPO-n32's end (0.644) inside its prediction; TreeRL's fall after its first half not predicted, and named
    assert ("Extrapolation check: 1 of 2 ends fell inside their 90% prediction from the first 50% of the compute; not "
            "predicted: treerl's (observed 0.604, predicted 0.6") in flat
    page = (tmp_path / "out" / "report.md").read_text()
    assert "| treerl |" in page and "the law does not describe it" in page
    rows = {row["variant"]: row for row in __import__("csv").DictReader(open(tmp_path / "out" / "variants.csv"))}
    assert rows["treerl"]["verdict"] == "the law does not describe it" and rows["grpo-n32"]["verdict"] == "base"
