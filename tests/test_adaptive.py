"""The adaptive sweep's rule (analysis/adaptive.py) on curves of known truth, and its looks from inside a run
(ablate/rungs.py) against a real MLflow store."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ablate.config import compose
from ablate.rungs import Rungs
from analysis.adaptive import Curve, Decision, decide, decisions_of, gpu_hours_saved, rung_steps
from analysis.rank import A_NOT_IDENTIFIED, BOTH
from analysis.runs import END_REASON_TAG, SETTLED_TAG
from analysis.synthetic import Truth, make_curve
from ablate import tracking

BASE = Truth(A=0.61, B=1.92, C_mid=2542.0, R0=0.30)
# 0.16 lower and twice as steep: at a quarter of the budget, past C_mid, every forecast says what the data say now
# (a ceiling alone, or a steepness alone, leaves the other claim open at a quarter: the full budget may see it)
FAR = Truth(A=0.45, B=4.0, C_mid=BASE.C_mid, R0=BASE.R0)
STEPS = 80  # a run of 80 steps of 200 GPU-hours: 16k GPU-hours, the mock's budget


def _run(truth: Truth, seed: int) -> Curve:
    c = make_curve(np.random.default_rng(seed), truth, c_max=STEPS * 200.0, every=200.0)
    return Curve(np.arange(c.compute.size), c.compute, c.reward)


def test_rungs_are_the_fractions_steps_and_bad_ones_are_refused():
    assert rung_steps(50) == [12, 25, 50]  # round(12.5) is 12: Python rounds half to even
    assert rung_steps(80, [0.5, 1.0]) == [40, 80]
    for bad in ([0.5], [0.5, 0.25, 1.0], [0.0, 1.0], []):
        with pytest.raises(ValueError, match="sweep.rungs"):
            rung_steps(80, bad)


def test_a_variant_far_from_the_base_settles_at_the_first_rung_and_says_why():
    d = decide(_run(FAR, 1), _run(BASE, 2), rung=1, step=20, steps=STEPS)
    assert d.stop and d.verdict == BOTH and d.forecast[BOTH] >= 0.95
    assert d.compute == pytest.approx(20 * 200.0)
    assert gpu_hours_saved(d) == pytest.approx(60 * 200.0)  # 60 steps left at 200 GPU-hours a step
    assert "in 2" in d.reason and "forecasts to the full budget" in d.reason
    # the band: the variant's law from the rung to its full budget, 90% of the posterior's values, near the truth at
    # 16k (this run's wobble aside) and wider there, 4x past the data, than at the rung
    c, lo, hi = d.band[-1]
    at_rung = d.band[0]
    assert c == pytest.approx(16000.0) and lo - 0.01 < FAR(16000.0) < hi + 0.01 and at_rung[0] == 4000.0
    assert hi - lo > at_rung[2] - at_rung[1] > 0


def test_no_stop_on_A_while_a_curve_has_not_reached_its_C_mid():
    late = Truth(A=0.70, B=1.5, C_mid=8000.0, R0=BASE.R0)  # at rung 1 (4k GPU-h) it has not made half its gain
    d = decide(_run(late, 1), _run(BASE, 2), rung=1, step=20, steps=STEPS)  # its fit: C_mid 5,807, past 4k
    assert not d.stop and d.reason.startswith(A_NOT_IDENTIFIED) and not d.forecast


def test_the_base_is_cut_at_the_variants_compute_and_the_last_rung_always_stops():
    base = _run(BASE, 2)
    short = decide(_run(BASE, 1), base, rung=1, step=20, steps=STEPS, forecasts=4)
    same = decide(_run(BASE, 1), Curve(base.step[:21], base.compute[:21], base.reward[:21]), rung=1, step=20,
                  steps=STEPS, forecasts=4)
    assert short == same  # the base's points past the variant's compute change nothing
    last = decide(_run(BASE, 1), base, rung=3, step=STEPS, steps=STEPS)
    assert last.stop and last.reason == "its full budget" and gpu_hours_saved(last) == 0.0


def test_a_decision_survives_its_tag():
    d = decide(_run(BASE, 1), _run(BASE, 2), rung=1, step=20, steps=STEPS, forecasts=4, seed=3)
    tags = {"ablate.rung.1": d.to_json(), "ablate.variant": "x", "ablate.rung.2": "not json"}
    assert decisions_of(tags) == [d]
    assert decide(_run(BASE, 1), _run(BASE, 2), rung=1, step=20, steps=STEPS, forecasts=4, seed=3) == d


@pytest.mark.parametrize("override, key", [("sweep.rungs=[0.5]", "sweep.rungs"),
                                           ("sweep.confidence=1.5", "sweep.confidence"),
                                           ("sweep.forecasts=0", "sweep.forecasts")])
def test_bad_adaptive_settings_fail_before_anything_is_submitted(override, key, tmp_path):
    from conftest import run_cli

    out = run_cli("-m", "ablate", "sweep=loo", "generator=mock", "sweep.adaptive=true", "sweep.dry_run=true",
                  override, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith(f"error: {key}"), out.stderr
    assert not (tmp_path / "mlflow.db").exists()  # no run was made


# --- the looks from inside a run --------------------------------------------------------------------------------


class _Logger:
    """What Rungs uses of the trainer's RunLogger, on a real store."""

    def __init__(self, client, run_id):
        self.client, self.run_id = client, run_id

    def flush(self):
        pass

    def set_tags(self, tags):
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, value)


def _log(client, run_id, curve: Curve, upto: int, start: int = 0):
    for s in range(start, upto + 1):
        client.log_metric(run_id, "val/pass_rate", float(curve.reward[s]), step=s)
        client.log_metric(run_id, "compute/gpu_hours", float(curve.compute[s]), step=s)


@pytest.fixture
def store(mlflow_uri):
    client = tracking.client(mlflow_uri)
    exp = tracking.experiment_id(client, "adaptive")
    runs = {name: tracking.create_variant_run(client, exp, name, {"ablate.variant": name})
            for name in ("scalerl", "loo-low")}
    return client, runs


def _rungs(client, runs, run_id, clock=None, sleep=None):
    cfg = compose([f"train.steps={STEPS}", "sweep.adaptive=true", "sweep.forecasts=8", "sweep.base_wait_min=1"])
    cfg.sweep.runs = runs
    kwargs = {"clock": clock, "sleep": sleep} if clock else {}
    return Rungs(cfg, run_id, _Logger(client, run_id), poll_s=1.0, **kwargs)


def test_a_variant_waits_for_the_base_to_reach_its_compute_then_decides_once(store, monkeypatch):
    client, runs = store
    low, base = _run(FAR, 1), _run(BASE, 2)
    _log(client, runs["loo-low"], low, 20)
    _log(client, runs["scalerl"], base, 12)  # behind: 12 steps of the variant's 20
    now = [0.0]

    def sleep(s):  # while the variant waits, the base logs 4 more steps
        now[0] += s
        done = max(m.step for m in client.get_metric_history(runs["scalerl"], "compute/gpu_hours"))
        _log(client, runs["scalerl"], base, done + 4, start=done + 1)

    r = _rungs(client, runs, runs["loo-low"], clock=lambda: now[0], sleep=sleep)
    assert r.rungs == [20, 40, 80] and r.due(20) and not r.due(80)
    d = r.look(20)
    assert now[0] == 2.0  # two polls: the base at 16, then at 20 steps
    assert d.stop and d.verdict == BOTH
    tags = client.get_run(runs["loo-low"]).data.tags
    assert Decision.from_json(tags["ablate.rung.1"]) == d and tags[SETTLED_TAG] == "20"
    assert tags[END_REASON_TAG] == d.summary() and "settled at rung 1 (step 20 of 80" in tags[END_REASON_TAG]

    monkeypatch.setattr("ablate.rungs.decide", lambda *a, **k: pytest.fail("decided twice"))
    assert r.look(20) == d  # after a restart: the decision logged, not a new one


def test_a_variant_whose_base_never_comes_goes_on_undecided(store):
    client, runs = store
    _log(client, runs["loo-low"], _run(BASE, 1), 20)
    _log(client, runs["scalerl"], _run(BASE, 2), 5)
    now = [0.0]

    def sleep(s):
        now[0] += s

    d = _rungs(client, runs, runs["loo-low"], clock=lambda: now[0], sleep=sleep).look(20)
    assert not d.stop and "had not reached" in d.reason and now[0] >= 60.0


def test_the_base_goes_on_while_a_variant_is_open_and_stops_once_all_settled(store):
    client, runs = store
    base = _rungs(client, runs, runs["scalerl"])
    _log(client, runs["scalerl"], _run(BASE, 2), 40)
    assert not base.look(20).stop  # loo-low has decided nothing yet
    settled = Decision(rung=1, step=20, steps=STEPS, compute=4000.0, decision="stop", verdict=BOTH, reason="x")
    client.set_tag(runs["loo-low"], "ablate.rung.1", settled.to_json())
    d = base.look(40)
    assert d.stop and d.rung == 2 and "every variant has settled" in d.reason
    assert json.loads(client.get_run(runs["scalerl"]).data.tags["ablate.rung.2"])["decision"] == "stop"


# --- the adaptive sweep, as a user runs it ---------------------------------------------------------------------

# the recipe and one variant (precision: bf16 for fp32, A 0.09 lower in the mock), with the mock's curves rising
# inside the budget's first quarter (C_mid 1,500 of ~20k GPU-hours) and less noise: the variant settles at rung 1
# or 2 (rungs at steps 10, 20, 40), the recipe runs to the end
ADAPTIVE = ["-m", "ablate", "sweep=loo", "generator=mock", "launcher=local", "sweep.adaptive=true", "axes=one",
            "train.steps=40", "generator.truth.C_mid=1500", "generator.val_prompts=4000", "generator.wobble_sd=0.002",
            "model.num_layers=1", "model.hidden_size=32"]


def test_an_adaptive_sweep_stops_a_settled_variant_reports_it_and_is_not_redone(tmp_path):
    from conftest import run_cli

    (tmp_path / "conf" / "axes").mkdir(parents=True)
    (tmp_path / "conf" / "axes" / "one.yaml").write_text(
        "# @package _global_\naxes:\n  - {path: precision, base: bf16, variant: loo-fp32}\n")
    command = ["-m", "ablate", "--config-dir", str(tmp_path / "conf"), *ADAPTIVE[2:]]
    out = run_cli(*command, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    client = tracking.client(f"sqlite:///{tmp_path}/mlflow.db")
    runs = {r.data.tags["ablate.variant"]: r for r in client.search_runs(
        [client.get_experiment_by_name("tiny-dryrun").experiment_id]) if r.data.tags.get("ablate.role") == "variant"}
    variant, base = runs["loo-fp32"], runs["scalerl"]
    settled = int(variant.data.tags[SETTLED_TAG])
    assert variant.info.status == "FINISHED" and settled in (10, 20)
    (last,) = [d for d in decisions_of(variant.data.tags) if d.stop]
    assert last.step == settled and last.verdict == "moves A" and variant.data.tags[END_REASON_TAG] == last.summary()
    steps = sorted(m.step for m in client.get_metric_history(variant.info.run_id, "compute/gpu_hours"))
    assert steps == list(range(settled + 1))  # every step to the rung, once, and none after it
    runs_dir = tmp_path / "outputs" / "tiny" / "runs"
    assert (runs_dir / variant.info.run_id / "checkpoint.pt").exists()  # kept: it may be extended
    assert base.info.status == "FINISHED" and SETTLED_TAG not in base.data.tags
    assert [d.decision for d in decisions_of(base.data.tags)] == ["go on", "go on"]  # its variant was open
    assert not (runs_dir / base.info.run_id / "checkpoint.pt").exists()
    # the report judges the settled variant where it stopped (not "truncated, no verdict")
    assert "loo-fp32" in out.stdout and "| moves A" in out.stdout and "no verdict" not in out.stdout
    # and says what the sweep did: where each run stopped, why, and the GPU-hours spent and saved
    table = out.stdout[out.stdout.index("Adaptive sweep:"):]
    fp32 = next(line for line in table.splitlines() if line.startswith("| loo-fp32"))
    spent = variant.data.metrics["compute/gpu_hours"]
    assert f"rung {last.rung}, step {settled} of 40" in fp32 and f"{spent:,.0f}" in fp32
    assert f"{(40 - settled) * spent / settled:,.0f}" in fp32  # saved: the steps left at its compute a step
    assert "ran its budget" in next(line for line in table.splitlines() if line.startswith("| scalerl"))

    again = run_cli(*command, cwd=tmp_path)
    assert again.returncode == 0 and "0 to run, 2 already FINISHED" in again.stdout
    assert client.get_run(variant.info.run_id).data.tags == variant.data.tags  # nothing decided again

    # extended: the settled variant goes on from its checkpoint to its budget, in the same run
    more = run_cli(*command, "sweep.extend=true", cwd=tmp_path)
    assert more.returncode == 0 and "1 to run, 1 already FINISHED" in more.stdout, more.stdout[-2000:]
    run = client.get_run(variant.info.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ablate.extended_from"] == str(settled)
    assert SETTLED_TAG not in run.data.tags and int(run.data.tags["ablate.resumed_from"]) == settled
    steps = sorted(m.step for m in client.get_metric_history(variant.info.run_id, "compute/gpu_hours"))
    assert steps == list(range(41))  # every step once: the first ones from the adaptive sweep, the rest now
    assert not (runs_dir / variant.info.run_id / "checkpoint.pt").exists()  # at its budget: done with
    assert f"extended from step {settled}" in more.stdout and "| moves A" in more.stdout


def test_a_sweep_taken_to_a_larger_budget_goes_on_in_the_same_runs(tmp_path):
    """`sweep.keep_checkpoints=true` at 8 steps, then `train.steps=16 sweep.extend=true`: each run goes on from its
    step-8 checkpoint in its own MLflow run, and a third call finds them FINISHED."""
    from conftest import run_cli

    (tmp_path / "conf" / "axes").mkdir(parents=True)
    (tmp_path / "conf" / "axes" / "one.yaml").write_text(
        "# @package _global_\naxes:\n  - {path: precision, base: bf16, variant: loo-fp32}\n")
    command = ["-m", "ablate", "--config-dir", str(tmp_path / "conf"), "sweep=loo", "generator=mock", "axes=one",
               "launcher=local", "model.num_layers=1", "model.hidden_size=32", "sweep.report=false"]
    first = run_cli(*command, "train.steps=8", "sweep.keep_checkpoints=true", cwd=tmp_path)
    assert first.returncode == 0 and "2 to run" in first.stdout, first.stdout[-2000:] + first.stderr[-2000:]
    client = tracking.client(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("tiny-dryrun").experiment_id

    def variants():
        return {r.data.tags["ablate.variant"]: r for r in client.search_runs([exp])
                if r.data.tags.get("ablate.role") == "variant"}

    before = variants()
    runs_dir = tmp_path / "outputs" / "tiny" / "runs"
    assert all((runs_dir / r.info.run_id / "checkpoint.pt").exists() for r in before.values())  # kept

    more = run_cli(*command, "train.steps=16", "sweep.extend=true", cwd=tmp_path)
    assert more.returncode == 0 and "2 to run, 0 already FINISHED" in more.stdout, more.stdout[-2000:]
    after = variants()
    assert {n: r.info.run_id for n, r in after.items()} == {n: r.info.run_id for n, r in before.items()}
    for name, run in after.items():
        assert run.info.status == "FINISHED" and run.data.tags["ablate.extended_from"] == "8"
        assert run.data.tags["ablate.lineage"] == before[name].data.tags["ablate.lineage"]
        assert run.data.tags["ablate.signature"] != before[name].data.tags["ablate.signature"]  # the new budget's
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "compute/gpu_hours"))
        assert steps == list(range(17)), name  # 0-8 from the first budget, 9-16 now: each once
        assert not (runs_dir / run.info.run_id / "checkpoint.pt").exists()  # not kept this time

    again = run_cli(*command, "train.steps=16", "sweep.extend=true", cwd=tmp_path)
    assert again.returncode == 0 and "0 to run, 2 already FINISHED" in again.stdout
