"""A run's compute: the device-hours each step adds to `compute/gpu_hours`, the x axis of the law.

`ReferenceClock`: the device-hours a run's steps would take on devices of a fixed throughput (train.reference_tflops),
reproducible on a shared machine where wall time measures the neighbours as much as the run. A step's work is its
FLOPs (Kaplan et al. 2020: 2N per generated token, 6N per trained token), on one device (colocated) or on
train.reference_layout's [generator devices, trainer devices], which overlap as the off-policy rule allows, every
device counted while it waits (the paper's GPU-hours). The recurrence, how a round is extrapolated until its last
batch is seen, and the one deviation: docs/design.md#reference-compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


class Clock(Protocol):
    """A run's device-hours, one step at a time (`compute/gpu_hours` adds them up, across restarts); `devices`, those
    a validation's wall-clock seconds are counted on (`compute/val_gpu_hours`, apart from the law's C)."""

    devices: int

    def gpu_hours(self, step: int, rollouts, wall_seconds: float, flops: StepFlops) -> float:
        """The device-hours of optimizer step `step`, which took `wall_seconds` and did `flops` on `rollouts`."""
        ...

    def dropped(self, wall_seconds: float) -> float:
        """The device-hours of a step dropped at SLURM's warning after `wall_seconds` of waiting on its rollouts (no
        batch came of it): every device the job holds was held that long (docs/training.md#compute-accounting)."""
        return self.devices * wall_seconds / 3600.0

    def perf(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass(frozen=True)
class StepFlops:
    generate: float  # 2N per generated token
    train: float  # 6N per trained token

    @property
    def total(self) -> float:
        return self.generate + self.train


def check_layout(layout: Sequence[int] | None) -> None:
    """None, or [generator devices, trainer devices], each >= 1; else a ValueError naming the key."""
    if layout is not None and (len(layout) != 2 or any(int(n) < 1 for n in layout)):
        raise ValueError(f"train.reference_layout must be [generator devices, trainer devices], each >= 1, "
                         f"got {list(layout)}")


class WallClock(Clock):
    """Every device the job holds is busy for a step's whole wall-clock time (generation and training share them)."""

    def __init__(self, devices: int):
        self.devices = devices

    def gpu_hours(self, step: int, rollouts, wall_seconds: float, flops: StepFlops) -> float:
        return self.devices * wall_seconds / 3600.0


def clock_for(train, devices: int, off_policy) -> Clock:
    """The clock `train` (the config's train node) asks for: its FLOPs at train.reference_tflops on
    train.reference_layout when that is set (the same on every run of the same tokens), else wall-clock time on the
    `devices` the job holds."""
    if not train.reference_tflops:
        return WallClock(devices)
    layout = train.reference_layout
    return ReferenceClock(float(train.reference_tflops), None if layout is None else list(layout), off_policy)


class ReferenceClock(Clock):
    """Device-hours per step at `tflops` TFLOP/s per device, on `layout` (None: colocated on one device, else
    [generator devices, trainer devices]), under `off_policy`'s rule for which weights a batch starts on."""

    def __init__(self, tflops: float, layout: Sequence[int] | None, off_policy):
        if tflops <= 0:
            raise ValueError(f"train.reference_tflops must be > 0 for a reference clock, got {tflops}")
        check_layout(layout)
        self.flops_per_s = tflops * 1e12
        self.layout = None if layout is None else (int(layout[0]), int(layout[1]))
        self.devices = 1 if self.layout is None else sum(self.layout)
        self.off_policy = off_policy
        self.train_done = {0: 0.0}  # version -> seconds from the run's start to when the trainer had made it
        self.round = {"version": -1, "start": 0.0, "end": 0.0, "size": 0, "seen": 0, "generate_s": 0.0,
                      "trainer_free": 0.0, "train_s": 0.0}
        self.elapsed = 0.0  # seconds counted so far (never less than any step's time found so far)
        self.gen_busy = 0.0  # seconds the generator devices decoded

    def step(self, step: int, flops: StepFlops) -> float:
        """Step `step`'s device-hours; steps come in order, once each (a resumed run goes on from its checkpoint)."""
        if self.layout is None:
            return flops.total / self.flops_per_s / 3600.0
        gen_devices, train_devices = self.layout
        version = self.off_policy.oldest_version(step - 1)
        if version != self.round["version"]:  # a new round: it starts on weights `version`
            start = max(self.round["end"], self.train_done[version])
            self.round = {"version": version, "start": start, "end": start, "size": self._round_size(step),
                          "seen": 0, "generate_s": 0.0, "trainer_free": self.train_done[step - 1], "train_s": 0.0}
        r = self.round
        generate_s = flops.generate / (gen_devices * self.flops_per_s)
        r["seen"], r["generate_s"] = r["seen"] + 1, r["generate_s"] + generate_s
        r["end"] = r["start"] + r["generate_s"] * max(r["size"], r["seen"]) / r["seen"]
        r["train_s"] += flops.train / (train_devices * self.flops_per_s)
        self.gen_busy += generate_s
        self.train_done[step] = max(r["trainer_free"], r["end"]) + r["train_s"]  # the round's steps back to back
        oldest_needed = self.off_policy.oldest_version(step)  # the next batch starts on this version or a newer one
        self.train_done = {v: t for v, t in self.train_done.items() if v >= min(oldest_needed, step)}
        before, self.elapsed = self.elapsed, max(self.elapsed, self.train_done[step])
        return (gen_devices + train_devices) * (self.elapsed - before) / 3600.0

    def gpu_hours(self, step: int, rollouts, wall_seconds: float, flops: StepFlops) -> float:
        return self.step(step, flops)

    def dropped(self, wall_seconds: float) -> float:
        """None: this clock counts the work of the batches trained, at a fixed throughput, never the wall clock (the
        dropped batch's prompts are decoded again after the resume, and counted then, once)."""
        return 0.0

    def perf(self) -> dict:
        """The reference layout's generator idle share (a layout of its own only)."""
        return {} if self.layout is None else {"compute/generator_idle_frac": self.generator_idle_frac()}

    def _round_size(self, step: int, most: int = 100_000) -> int:
        """How many batches from `step` on start on the same weights as batch `step`."""
        version, size = self.off_policy.oldest_version(step - 1), 1
        while size < most and self.off_policy.oldest_version(step + size - 1) == version:
            size += 1
        return size

    def generator_idle_frac(self) -> float:
        """The share of the run so far the generator devices had nothing they were allowed to decode."""
        return 0.0 if self.layout is None or self.elapsed <= 0 else max(1.0 - self.gen_busy / self.elapsed, 0.0)

    def state_dict(self) -> dict:
        return {"train_done": dict(self.train_done), "round": dict(self.round), "elapsed": self.elapsed,
                "gen_busy": self.gen_busy}

    def load_state_dict(self, state: dict) -> None:
        self.train_done = {int(v): t for v, t in state["train_done"].items()}
        self.round, self.elapsed, self.gen_busy = dict(state["round"]), state["elapsed"], state["gen_busy"]
