"""The adaptive sweep's rule (analysis/adaptive.py) on curves of known truth, and its looks from inside a run
(ablate/rungs.py) against a real MLflow store."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ablate.config import compose
from ablate.rungs import Rungs
from dataclasses import replace

from analysis.adaptive import (FUTILE, FUTILITY, GO, MOVED, OPEN, WITHIN, Curve, Decision, Look, decide,
                               decisions_of, gpu_hours_saved, report_rule, rung_steps)
from analysis.rank import A_NOT_IDENTIFIED, ALPHA, BOTH, CRITICAL, NO_CHANGE
from analysis.runs import END_REASON_TAG, SETTLED_TAG
from analysis.synthetic import Truth, make_curve
from ablate import tracking

BASE = Truth(A=0.61, B=1.92, C_mid=2542.0, R0=0.30)
# 0.16 lower and twice as steep: both claims cross their boundaries by half the budget, where A's information is still
# a tenth of the full budget's (the boundary ~8): a z of 18
FAR = Truth(A=0.45, B=4.0, C_mid=BASE.C_mid, R0=BASE.R0)
STEPS = 80  # a run of 80 steps of 200 GPU-hours: 16k GPU-hours, the mock's budget


def _run(truth: Truth, seed: int) -> Curve:
    c = make_curve(np.random.default_rng(seed), truth, c_max=STEPS * 200.0, every=200.0)
    return Curve(np.arange(c.compute.size), c.compute, c.reward)


def _until_stop(variant: Curve, base: Curve, steps: int = STEPS, rungs=None, **rule) -> list[Decision]:
    """The rule at each rung, as a job takes it (each decision with the ones before it), to the first stop."""
    history: list[Decision] = []
    for k, step in enumerate(rung_steps(steps, *([rungs] if rungs else [])), 1):
        history.append(decide(variant, base, rung=k, step=step, steps=steps, history=history, **rule))
        if history[-1].stop:
            return history
    raise AssertionError("the last rung always stops")


def test_rungs_are_the_fractions_steps_and_bad_ones_are_refused():
    assert rung_steps(50) == [6, 12, 19, 25, 31, 38, 44, 50]  # eighths; round(37.5) is 38 (half to even)
    assert rung_steps(80, [0.5, 1.0]) == [40, 80]
    for bad in ([0.5], [0.5, 0.25, 1.0], [0.0, 1.0], []):
        with pytest.raises(ValueError, match="sweep.rungs"):
            rung_steps(80, bad)


def test_a_variant_far_from_the_base_settles_early_on_both_claims_and_says_why():
    """A 0.16 lower and twice as steep: both claims cross their boundaries well before the full budget, each at a
    boundary above the one-look 2.33 (early looks spend little of the 0.02), and the label is the verdict's with
    those boundaries."""
    looks = _until_stop(_run(FAR, 1), _run(BASE, 2))
    d = looks[-1]
    assert d.stop and d.step < STEPS and d.verdict == BOTH and {"A", "B"} <= set(d.locked)
    a, b = d.look("A"), d.look("B")
    assert a.status == b.status == MOVED and abs(a.z) >= a.c > CRITICAL and abs(b.z) >= b.c > CRITICAL
    assert 0 < a.t < 1 and 0 < b.t < 1 and d.bounds == {"A": a.c, "B": b.c, "compute": d.bounds["compute"]}
    assert d.reason.startswith("moves A and B; A moved (z = -") and "compute not looked at" in d.reason
    assert gpu_hours_saved(d) == pytest.approx((STEPS - d.step) * 200.0)  # 200 GPU-hours a step
    # the band: the variant's law from the rung to its full budget, near the truth at 16k and wider there than at
    # the rung
    c, lo, hi = d.band[-1]
    assert c == pytest.approx(16000.0) and lo - 0.01 < FAR(16000.0) < hi + 0.01
    assert hi - lo > d.band[0][2] - d.band[0][1] > 0
    # the information fractions of a claim rise look by look, and its boundary falls towards the one-look value
    ts = [x.look("A").t for x in looks if x.look("A")]
    assert ts == sorted(ts)


def test_the_boundaries_spend_the_claims_rate_over_the_looks_by_hand():
    """A claim's boundary at a look is the Lan-DeMets O'Brien-Fleming boundary of its information fractions so far:
    at the full budget after one look at t = 0.5, the pair (3.46, 2.33) for 0.02 (a first look at t = 0.5 alone
    spends 4 Phi(-2.5758 / sqrt(0.5)) = 0.00054, so 3.46; what is left makes the last boundary 2.33, a hair above
    the one-look 2.326)."""
    from analysis.sequential import boundaries

    first, last = boundaries([0.5, 1.0], ALPHA)
    assert first == pytest.approx(3.46, abs=0.01) and CRITICAL < last < CRITICAL + 0.01


def test_no_stop_on_A_while_a_curve_has_not_reached_its_C_mid():
    late = Truth(A=0.70, B=1.5, C_mid=8000.0, R0=BASE.R0)  # at rung 2 (4k GPU-h) it has not made half its gain
    d = decide(_run(late, 1), _run(BASE, 2), rung=2, step=20, steps=STEPS)
    assert not d.stop and d.reason.startswith(A_NOT_IDENTIFIED) and d.look("A").status == OPEN


def test_a_null_pair_settles_on_futility_at_no_claim_and_a_margin_settles_it_sooner():
    """Two runs of one law: no claim is made, each claim is settled when the full budget would make it with a
    predictive probability below sweep.futility; a declared margin on A settles A once its change is within it."""
    variant, base = _run(BASE, 3), _run(BASE, 4)
    plain = _until_stop(variant, base)
    assert plain[-1].verdict == NO_CHANGE and not plain[-1].locked
    if plain[-1].step < STEPS:
        assert all(plain[-1].look(n).predictive < FUTILITY for n in ("A", "B") if plain[-1].look(n).status == FUTILE)
    margin = _until_stop(variant, base, margin_A=0.05)
    assert margin[-1].step <= plain[-1].step and margin[-1].look("A").status in (WITHIN, FUTILE)
    assert margin[-1].step < plain[-1].step or plain[-1].step < STEPS


def test_a_margin_settles_A_only_when_the_changes_whole_interval_is_inside_it_by_hand():
    """A change of A of +0.01 with sd 0.01 on both sides: its interval at the claims' level is 0.01 +- 2.326 x 0.01,
    out to 0.0333; inside a margin of 0.04 (settled: within the margin), not inside 0.03 (open: the change alone,
    0.01, would be)."""
    from types import SimpleNamespace

    from analysis.adaptive import _looks
    from analysis.rank import Claim

    v = SimpleNamespace(claims={"A": Claim(d=0.01, sd_down=0.01, sd_up=0.01)}, moved=(), A_identified=True,
                        moves_A=False, moves_B=False)
    t = {"A": 0.5, "B": 0.5, "compute": 0.5}
    assert 0.01 + CRITICAL * 0.01 == pytest.approx(0.03326, abs=1e-5)
    assert _looks(v, t, 0.0, 0.04, last=False)["A"].status == WITHIN
    assert _looks(v, t, 0.0, 0.03, last=False)["A"].status == OPEN


def test_the_base_is_cut_at_the_variants_compute_and_the_last_rung_always_stops():
    base = _run(BASE, 2)
    short = decide(_run(BASE, 1), base, rung=2, step=20, steps=STEPS)
    same = decide(_run(BASE, 1), Curve(base.step[:21], base.compute[:21], base.reward[:21]), rung=2, step=20,
                  steps=STEPS)
    assert short == same  # the base's points past the variant's compute change nothing
    last = decide(_run(BASE, 1), base, rung=8, step=STEPS, steps=STEPS)
    assert last.stop and "at its full budget" in last.reason and gpu_hours_saved(last) == 0.0
    assert all(last.look(n).t == 1.0 for n in ("A", "B"))


def test_a_decision_survives_its_tag_and_an_older_rules_tag_still_reads():
    d = decide(_run(BASE, 1), _run(BASE, 2), rung=3, step=30, steps=STEPS)
    tags = {"ablate.rung.3": d.to_json(), "ablate.variant": "x", "ablate.rung.2": "not json"}
    assert decisions_of(tags) == [d]
    assert decide(_run(BASE, 1), _run(BASE, 2), rung=3, step=30, steps=STEPS) == d
    old = ('{"rung":1,"step":12,"steps":50,"compute":4000.0,"decision":"stop","verdict":"moves A","reason":"x",'
           '"forecast":{"moves A":1.0},"band":[]}')  # the forecast rule's tag, before this one
    assert Decision.from_json(old).verdict == "moves A" and Decision.from_json(old).looks == {}


def test_a_run_held_to_the_rule_where_it_stopped_or_at_its_budget():
    """The report's test for a run of an adaptive sweep: the stopping look's boundaries and claims; a run that went
    to its budget, the final boundary after its interim looks' fractions (above the one-look 2.33)."""
    looks = _until_stop(_run(FAR, 1), _run(BASE, 2))
    stop = looks[-1]
    rule = report_rule(looks, stop.compute)
    assert rule.bounds == stop.bounds and {"A", "B"} <= set(rule.locked) and rule.compute == stop.compute
    went_on = [replace(d, decision=GO) for d in looks]  # the same looks, none of them a stop: to the budget
    rule = report_rule(went_on, 16000.0)
    assert rule.compute == 16000.0 and all(c > CRITICAL for c in rule.bounds.values())
    assert report_rule([], 16000.0) is None


def test_the_recipe_level_is_held_to_its_own_information_fractions_by_hand():
    """A stop at one look where A had t = 0.16 and a standard error of 0.01: at the run level the boundary of that
    t alone; at the recipe level the spread's variance (0.015^2 x 2 = 4.5e-4) does not shrink with compute, so the
    look already holds (4.5e-4 + 0.16 x 1e-4) / (4.5e-4 + 1e-4) = 0.8473 of the final information: it spends
    4 Phi(-2.5758 / sqrt(0.8473)) = 0.01026 and its boundary is 2.567 (the run level's: 6.44)."""
    from scipy.special import ndtr, ndtri

    look = Look(z=-3.0, t=0.16, c=6.44, predictive=0.0, status=MOVED, sd=0.01)
    d = Decision(rung=4, step=40, steps=80, compute=8000.0, decision="stop", verdict="moves A", reason="x",
                 looks={"A": vars(look)}, bounds={"A": 6.44}, locked=["A"])
    rule = report_rule([d], 8000.0)
    spent = 4 * ndtr(-2.5758293 / math.sqrt(0.8473))
    assert rule.recipe_bound("A", 4.5e-4) == pytest.approx(-ndtri(spent / 2), abs=2e-3)
    assert rule.recipe_bound("A", 4.5e-4) == pytest.approx(2.567, abs=2e-3)
    assert rule.recipe_bound("A", 0.0) == pytest.approx(-ndtri(2 * ndtr(-2.5758293 / 0.4)), abs=1e-3)  # 6.44


def _null_pair(seed: int) -> tuple[Curve, Curve]:
    """The power bench's null stream: two runs of one law as generator=mock draws them (its schedule and noise)."""
    from analysis.synthetic import MockNoise, mock_curve

    rng = np.random.default_rng([seed, 7])
    return tuple(Curve(c.step, c.compute, c.reward) for c in (mock_curve(rng, BASE, MockNoise(), run_A=BASE.A)
                                                             for _ in range(2)))


def _ruled(variant: Curve, base: Curve, steps: int, seed: int) -> Decision:
    """The rule at its rungs to its stop; the rule before this one took a seed for its forecasts instead."""
    import inspect

    takes = inspect.signature(decide).parameters
    history: list[Decision] = []
    for k, step in enumerate(rung_steps(steps), 1):
        kw = {"history": history} if "history" in takes else {"seed": seed * 100 + k}
        history.append(decide(variant, base, rung=k, step=step, steps=steps, **kw))
        if history[-1].stop:
            break
    return history[-1]


# The pairs of the null stream (the slow test's below) on which the rule before this one locked a claim of A made at
# an early look (a one-look verdict claims "A moved" at 1/4 or 1/2 of the budget, not at the full budget): all 11 of
# them in its first 500 pairs, found at commit 1b9668b, where it claimed 22 of the 500 against the full sweep's 11.
EARLY_FALSE_CLAIMS = (20, 37, 80, 87, 107, 129, 151, 217, 248, 363, 373)


def test_a_claim_of_A_an_early_look_makes_on_wide_intervals_is_not_locked():
    """Interim looks spend error, on the real fitter, fast: on the 11 null pairs where an early one-look verdict
    claimed "A moved" and the full budget's did not, the rule before this one stopped on the early claim (11 of 11:
    this test fails on commit 1b9668b); the group-sequential rule's early boundaries (8.2 at t = 0.1, 3.5 at
    t = 0.5) let it pass, and it claims A on none (measured: 0 of 11; the bound leaves one for the fitter's
    numerics)."""
    claimed = [seed for seed in EARLY_FALSE_CLAIMS
               if _ruled(*_null_pair(seed), steps=50, seed=seed).verdict in ("moves A", "moves A and B")]
    assert len(claimed) <= 1, claimed


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_looks_at_a_stream_of_null_pairs_keep_the_full_sweeps_false_claim_rate():
    """Interim looks spend error: on 500 pairs of runs of one law (generator=mock's schedule and noise: 50 steps,
    validated at each), the rule at its rungs may claim "A moved" no more often than the full sweep's verdict, plus
    0.01. The rule before this one (20 forecasts at rungs 1/4, 1/2) locked a claim made at an early look on wide
    intervals: this test fails on it (commit 1b9668b: 0.044 against 0.024). The pairs are bench_power.py's null
    stream, the very pairs of its first figure (docs/fitting.md#power-and-false-claims). A pair whose one-look
    verdict claims A at no rung and not at the full budget cannot be claimed by either rule (the old one stopped on
    the one-look verdict; the new one's boundaries are at least the one-look 2.33), so the rule runs only on the
    pairs where it does (about one in six). ~5 min on 2 cores: -m slow."""
    from analysis.fit import fit_sigmoid
    from analysis.rank import verdict

    steps, pairs = 50, 500

    def one_look_claims_A(v: Curve, b: Curve, step: int) -> bool:
        v = v.upto_step(step)
        b = b.upto(v.c_max)
        try:
            return verdict(fit_sigmoid(v.compute, v.reward), fit_sigmoid(b.compute, b.reward)).moves_A
        except ValueError:
            return False

    full = ruled = 0
    for seed in range(pairs):
        v, b = _null_pair(seed)
        claimed = [one_look_claims_A(v, b, step) for step in rung_steps(steps)]
        full += claimed[-1]
        if any(claimed):
            ruled += _ruled(v, b, steps, seed).verdict in ("moves A", "moves A and B")
    assert full / pairs <= 0.035, full  # the one-look test: 0.02, the stream's own luck aside
    assert ruled / pairs <= full / pairs + 0.01, (ruled, full)


@pytest.mark.parametrize("override, key", [("sweep.rungs=[0.5]", "sweep.rungs"),
                                           ("sweep.alpha=0.7", "sweep.alpha"),
                                           ("sweep.futility=0.6", "sweep.futility"),
                                           ("sweep.margin_A=2", "sweep.margin_A")])
def test_bad_adaptive_settings_fail_before_anything_is_submitted(override, key, tmp_path):
    from conftest import run_main

    out = run_main("-m", "ablate", "sweep=loo", "generator=mock", "sweep.adaptive=true", "sweep.dry_run=true",
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
    cfg = compose([f"train.steps={STEPS}", "sweep.adaptive=true", "sweep.rungs=[0.375,0.5,1.0]",
                   "sweep.base_wait_min=1"])
    cfg.sweep.runs = runs
    kwargs = {"clock": clock, "sleep": sleep} if clock else {}
    return Rungs(cfg, run_id, _Logger(client, run_id), poll_s=1.0, **kwargs)


def test_a_variant_waits_for_the_base_to_reach_its_compute_then_decides_once(store, monkeypatch):
    client, runs = store
    low, base = _run(FAR, 1), _run(BASE, 2)
    _log(client, runs["loo-low"], low, 30)
    _log(client, runs["scalerl"], base, 22)  # behind: 22 steps of the variant's 30
    now = [0.0]

    def sleep(s):  # while the variant waits, the base logs 4 more steps
        now[0] += s
        done = max(m.step for m in client.get_metric_history(runs["scalerl"], "compute/gpu_hours"))
        _log(client, runs["scalerl"], base, done + 4, start=done + 1)

    r = _rungs(client, runs, runs["loo-low"], clock=lambda: now[0], sleep=sleep)
    assert r.rungs == [30, 40, 80] and r.due(30) and not r.due(80)
    d = r.look(30)
    assert now[0] == 2.0  # two polls: the base at 26, then at 30 steps
    assert d.stop and d.verdict == BOTH
    tags = client.get_run(runs["loo-low"]).data.tags
    assert Decision.from_json(tags["ablate.rung.1"]) == d and tags[SETTLED_TAG] == "30"
    assert tags[END_REASON_TAG] == d.summary() and "settled at rung 1 (step 30 of 80" in tags[END_REASON_TAG]

    monkeypatch.setattr("ablate.rungs.decide", lambda *a, **k: pytest.fail("decided twice"))
    assert r.look(30) == d  # after a restart: the decision logged, not a new one


def test_a_variant_whose_base_never_comes_goes_on_undecided(store):
    client, runs = store
    _log(client, runs["loo-low"], _run(BASE, 1), 30)
    _log(client, runs["scalerl"], _run(BASE, 2), 5)
    now = [0.0]

    def sleep(s):
        now[0] += s

    d = _rungs(client, runs, runs["loo-low"], clock=lambda: now[0], sleep=sleep).look(30)
    assert not d.stop and "had not reached" in d.reason and now[0] >= 60.0


def test_the_base_goes_on_while_a_variant_is_open_and_stops_once_all_settled(store):
    client, runs = store
    base = _rungs(client, runs, runs["scalerl"])
    _log(client, runs["scalerl"], _run(BASE, 2), 40)
    assert not base.look(30).stop  # loo-low has decided nothing yet
    settled = Decision(rung=1, step=30, steps=STEPS, compute=6000.0, decision="stop", verdict=BOTH, reason="x")
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


@pytest.mark.e2e
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
        [client.get_experiment_by_name("tiny-mock").experiment_id]) if r.data.tags.get("ablate.role") == "variant"}
    variant, base = runs["loo-fp32"], runs["scalerl"]
    settled = int(variant.data.tags[SETTLED_TAG])
    assert variant.info.status == "FINISHED" and settled < 40
    (last,) = [d for d in decisions_of(variant.data.tags) if d.stop]
    assert last.step == settled and last.verdict == "moves A" and variant.data.tags[END_REASON_TAG] == last.summary()
    steps = sorted(m.step for m in client.get_metric_history(variant.info.run_id, "compute/gpu_hours"))
    assert steps == list(range(settled + 1))  # every step to the rung, once, and none after it
    runs_dir = tmp_path / "outputs" / "tiny" / "runs"
    assert (runs_dir / variant.info.run_id / "checkpoint.pt").exists()  # kept: it may be extended
    # the base goes on while its variant is open (at a rung the variant had not reached, it is), and stops at the
    # first rung where the variant has settled at or before it
    looked = decisions_of(base.data.tags)
    assert base.info.status == "FINISHED" and all(d.decision == "go on" for d in looked[:-1])
    if looked[-1].stop:
        assert looked[-1].step >= settled and base.data.tags[SETTLED_TAG] == str(looked[-1].step)
    else:
        assert SETTLED_TAG not in base.data.tags and looked[-1].decision == "go on"
    # the report judges the settled variant where it stopped (not "truncated, no verdict"), by the rule's own test
    assert "loo-fp32" in out.stdout and "| moves A" in out.stdout and "no verdict" not in out.stdout
    # and says where it stopped, what that saved, and the cut of the base it was compared with
    fp32 = " ".join(out.stdout.split("- loo-fp32:")[1].split("\n- ")[0].split("\n\n")[0].split())  # unwrapped
    spent = variant.data.metrics["compute/gpu_hours"]
    saved = f"{(40 - settled) * spent / settled:,.0f}"  # the steps left at its compute a step
    assert f"stopped at step {settled} of 40, {saved} GPU-h saved; vs scalerl cut at {spent:,.0f} GPU-h" in fp32
    md = (tmp_path / "outputs" / "tiny" / "reports").glob("*/report.md")
    assert f"rung {last.rung}, step {settled} of 40" in next(md).read_text()

    again = run_cli(*command, cwd=tmp_path)
    assert again.returncode == 0 and "0 to run, 2 already FINISHED" in again.stdout
    assert client.get_run(variant.info.run_id).data.tags == variant.data.tags  # nothing decided again

    # extended: the settled variant goes on from its checkpoint to its budget, in the same run
    more = run_cli(*command, "sweep.extend=true", cwd=tmp_path)  # the base too, where it had stopped
    todo = "2 to run, 0 already FINISHED" if looked[-1].stop else "1 to run, 1 already FINISHED"
    assert more.returncode == 0 and todo in more.stdout, more.stdout[-2000:]
    run = client.get_run(variant.info.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ablate.extended_from"] == str(settled)
    assert SETTLED_TAG not in run.data.tags and int(run.data.tags["ablate.resumed_from"]) == settled
    steps = sorted(m.step for m in client.get_metric_history(variant.info.run_id, "compute/gpu_hours"))
    assert steps == list(range(41))  # every step once: the first ones from the adaptive sweep, the rest now
    assert not (runs_dir / variant.info.run_id / "checkpoint.pt").exists()  # at its budget: done with
    assert f"(extended from step {settled}; vs scalerl cut at" in more.stdout and "| moves A" in more.stdout


@pytest.mark.e2e
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
    exp = client.get_experiment_by_name("tiny-mock").experiment_id

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
