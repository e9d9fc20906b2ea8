"""One pair of known laws, written in each form users keep curves in, by the tool that writes it where it installs
here (torch's SummaryWriter, transformers' TrainerState, verl's own Tracking), then read by one command each: every
form gets the same mapping flags and the same report, and the verdict the laws say (the variant's ceiling A is 0.15
higher). The W&B export is drawn on its time axis, whose first point (the validation before training) lies at
100-150 s, not 0; verl's log is put on GPU-hours by the running sum of its seconds a step."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest

from analysis.__main__ import main

LAWS = {"base": 0.60, "high": 0.75}  # A of each variant; B 1.5, C_mid 30 steps, R0 0.1
STEPS = np.arange(0, 101, 5)
SECONDS_PER_STEP = 60.0


def reward(variant: str, steps=STEPS) -> np.ndarray:
    A = LAWS[variant]
    c = np.asarray(steps, dtype=float)
    wobble = 0.004 * np.sin(0.7 * c + len(variant))  # the same small departures in every form
    return np.round(0.1 + (A - 0.1) / (1 + (30.0 / np.maximum(c, 1e-12)) ** 1.5) + wobble * (c > 0), 5)


def wide_csv(tmp_path, _):
    path = tmp_path / "wide.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["Step", *LAWS])
        writer.writerows([[int(s), *(reward(v)[i] for v in LAWS)] for i, s in enumerate(STEPS)])
    return ["--csv", str(path)]


def wandb_time_axis(tmp_path, _):
    """W&B's chart export against "Relative Time (Process)": each run's points at its own seconds, the first at
    120 s and 150 s (the validation before training), an empty cell where a run has no point at that x."""
    path = tmp_path / "wandb.csv"
    axis = "Relative Time (Process)"
    starts = {"base": 120.0, "high": 150.0}
    header = [axis] + [f"{v} - eval/reward{suffix}" for v in LAWS for suffix in ("", "__MIN", "__MAX")]
    rows = []
    for v in LAWS:
        for s, r in zip(STEPS, reward(v)):
            rows.append({axis: starts[v] + s * SECONDS_PER_STEP}
                        | {f"{v} - eval/reward{x}": r for x in ("", "__MIN", "__MAX")})
    rows.sort(key=lambda row: row[axis])
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh, quoting=csv.QUOTE_ALL)
        writer.writerow(header)
        writer.writerows([[row.get(name, "") for name in header] for row in rows])
    return ["--csv", str(path), "--compute", f"{axis}*{8 / 3600}"]


def tensorboard(tmp_path, _):
    from torch.utils.tensorboard import SummaryWriter

    for v in LAWS:
        writer = SummaryWriter(str(tmp_path / "runs" / v))
        for s, r in zip(STEPS, reward(v)):
            writer.add_scalar("eval/reward", float(r), int(s), walltime=1.7e9 + s * SECONDS_PER_STEP)
            writer.add_scalar("train/loss", 1.0 / (1 + s), int(s), walltime=1.7e9 + s * SECONDS_PER_STEP)
        writer.close()
    return ["--tensorboard", str(tmp_path / "runs")]


def hf_state(tmp_path, _):
    from transformers import TrainerState

    for v in LAWS:
        history = [{"eval_reward": float(r), "eval_loss": 1.0, "epoch": s / 100, "step": int(s)}
                   for s, r in zip(STEPS, reward(v))]
        folder = tmp_path / "runs" / v / "checkpoint-100"
        folder.mkdir(parents=True)
        state = TrainerState(log_history=history, global_step=100, max_steps=100)
        state.save_to_json(str(folder / "trainer_state.json"))
    return ["--hf-state", str(tmp_path / "runs")]


def verl_log(tmp_path, capsys):
    """verl's own console logger (tests/data/verl: verl 0.9.1's Tracking), its stdout kept as each run's log."""


    from test_analysis_verl_logs import VERL, _load

    paths = []
    with pytest.MonkeyPatch.context() as patch:
        _load(patch, "verl.utils.logger", VERL / "aggregate_logger.py")
        tracking = _load(patch, "verl_tracking_for_forms", VERL / "tracking.py").Tracking
        for v in LAWS:
            capsys.readouterr()
            run = tracking("forms", v, default_backend=["console"])
            validation = dict(zip(STEPS.tolist(), reward(v).tolist()))
            for s in range(int(STEPS[-1]) + 1):  # training from step 1, validation before it and every 5 steps
                data = {"timing_s/step": SECONDS_PER_STEP + (s % 3)} if s > 0 else {}
                if s in validation:
                    data["val-core/openai/gsm8k/reward/mean@4"] = validation[s]
                run.log(data=data, step=s)
            run.finish()
            paths.append(tmp_path / f"{v}.log")
            paths[-1].write_text(capsys.readouterr().out)
    return ["--verl-log", *map(str, paths), "--compute", f"cumsum:timing_s/step*{8 / 3600}"]


FORMS = {"wide CSV": wide_csv, "W&B time axis": wandb_time_axis, "TensorBoard": tensorboard,
         "trainer_state.json": hf_state, "verl log": verl_log}
REWARDS = {"wide CSV": "reward", "W&B time axis": "eval/reward", "TensorBoard": "eval/reward",
           "trainer_state.json": "eval_reward", "verl log": "val-core/openai/gsm8k/reward/mean@4"}


@pytest.mark.parametrize("form", FORMS)
def test_each_form_is_read_by_one_command_and_judged_as_its_laws_say(form, tmp_path, capsys):
    args = FORMS[form](tmp_path, capsys)
    capsys.readouterr()
    assert main(["report", *args, "--base", "base", "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    said = out[:out.index("\n\n")]
    assert f"  reward: {REWARDS[form]} (" in said, said
    flat = " ".join(out.split())
    moved = re.search(r"Against base, high raises the ceiling A by (0\.\d+)", flat)
    assert moved and abs(float(moved.group(1)) - 0.15) < 0.03, flat
    if form == "W&B time axis":
        assert ("compute: Relative Time (Process) does not start at 0 (0.267 to 0.333 GPU-hours at the first point "
                "of 2 runs)") in said
    if form in ("W&B time axis", "verl log"):
        assert "C_mid GPU-h [90% CI]" in (tmp_path / "report" / "report.md").read_text()
