"""A run's early alarms (ablate/alarms.py): said once, after the first step and validation, only when true."""

from __future__ import annotations

from omegaconf import OmegaConf

from ablate.alarms import Alarms

CFG = OmegaConf.create({"generation": {"max_think_tokens": 12, "max_answer_tokens": 8},
                        "launcher": {"signal_delay_s": 120}})


def _alarms(simulated=False):
    said = []
    return Alarms(CFG, lambda tag, text: said.append((tag, text)), simulated=simulated), said


def test_rows_cut_at_the_limit_in_the_first_step_are_said_once_with_their_likely_causes():
    alarms, said = _alarms()
    alarms.step(1, {"train/truncation_rate": 0.97, "train/pass_rate": 0.1}, 1.0)
    alarms.step(2, {"train/truncation_rate": 1.0, "train/pass_rate": 0.1}, 1.0)
    assert [tag for tag, _ in said] == ["ablate.alarm.truncated"]
    assert said[0][1].startswith("97% of step 1's rows ran to the length limit (12 thinking + 8 answer tokens)")
    assert "generation.stop_token_ids" in said[0][1] and "task.chat_template" in said[0][1]
    quiet, none = _alarms()
    quiet.step(1, {"train/truncation_rate": 0.94, "train/pass_rate": 0.1}, 1.0)  # under 95%
    quiet.step(2, {"train/truncation_rate": 1.0, "train/pass_rate": 0.1}, 1.0)  # later steps are not its business
    assert none == []


def test_no_right_answer_in_the_first_step_and_validation_is_said_once_both_are_seen():
    alarms, said = _alarms()
    alarms.validated(0.0, 1.0)  # step 0's validation
    assert said == []  # the first step is not in yet
    alarms.step(1, {"train/truncation_rate": 0.0, "train/pass_rate": 0.0}, 1.0)
    alarms.step(2, {"train/truncation_rate": 0.0, "train/pass_rate": 0.0}, 1.0)
    assert [tag for tag, _ in said] == ["ablate.alarm.no_reward"] and "\\boxed{}" in said[0][1]
    for right_where in ("validation", "step"):
        quiet, none = _alarms()
        quiet.validated(0.05 if right_where == "validation" else 0.0, 1.0)
        quiet.step(1, {"train/pass_rate": 0.02 if right_where == "step" else 0.0}, 1.0)
        assert none == []


def test_a_simulator_raises_no_alarm_about_its_rows():
    alarms, said = _alarms(simulated=True)
    alarms.validated(0.0, 1.0)
    alarms.step(1, {"train/truncation_rate": 1.0, "train/pass_rate": 0.0}, 1.0)
    assert said == []


def test_on_slurm_a_warning_too_short_for_a_step_a_validation_and_a_checkpoint_is_said(monkeypatch):
    """50 s + 60 s + 30 s = 140 s > the warning's 120 s: raise it to 1.5 x 140 + 1 = 211."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    alarms, said = _alarms(simulated=True)  # the margin is about time: simulators too
    alarms.step(1, {}, 50.0)
    alarms.validated(0.3, 60.0)
    alarms.saved(30.0)
    assert said == []  # not in a SLURM job
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    alarms, said = _alarms(simulated=True)
    alarms.step(1, {}, 50.0)
    alarms.validated(0.3, 60.0)
    assert said == []  # 110 s: fits
    alarms.saved(30.0)
    alarms.saved(31.0)
    assert [tag for tag, _ in said] == ["ablate.alarm.signal_delay"]
    assert ("launcher.signal_delay_s=120 is less than a learner step, a validation and a checkpoint take here "
            "(learner step 50 s, "
            "validation 60 s, checkpoint 30 s; 140 s)") in said[0][1]
    assert said[0][1].endswith("Set launcher.signal_delay_s=211 or more")
