"""A run's early alarms: after its first step and its first validation, what would make it learn nothing (almost
every row cut at the length limit, no answer ever right), and on SLURM whether the time limit's warning leaves room
for a step, a validation and a checkpoint. Each is said once, loudly (stderr, and an `ablate.alarm.*` tag on the
run), with its likely causes; none stops the run. Why these: docs/training.md#early-alarms.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

TRUNCATED = 0.95  # the share of a step's rows at the length limit that is "almost every row"


class Alarms:
    """Fed by the trainer's loop (`step`, `validated`, `saved`); `say` gets each alarm's tag name and text."""

    def __init__(self, cfg, say: Callable[[str, str], None], simulated: bool = False):
        self.cfg, self.say = cfg, say
        self.simulated = simulated  # a simulator (the mock) samples nothing: its rows say nothing of the setup
        self.said: set[str] = set()
        self.right = 0.0  # the best pass rate seen, training rows or validation
        self.looked = {"step": False, "validation": False}
        self.slowest = {"learner step": 0.0, "validation": 0.0, "checkpoint": 0.0}  # seconds, the longest seen

    def step(self, step: int, metrics: dict, seconds: float) -> None:
        """After an optimizer step: its rows' truncation and pass rate, and the seconds a warning may have to wait
        in it (the learner's update and the weights' publishing: a warning in the wait for rollouts drops them)."""
        self.slowest["learner step"] = max(self.slowest["learner step"], seconds)
        if self.simulated:
            return
        self.right = max(self.right, metrics.get("train/pass_rate", 0.0))
        truncated = metrics.get("train/truncation_rate", 0.0)
        if not self.looked["step"] and truncated >= TRUNCATED:
            gen = self.cfg.generation
            self._once("truncated", f"{truncated:.0%} of step {step}'s rows ran to the length limit "
                                    f"({gen.max_think_tokens} thinking + {gen.max_answer_tokens} answer tokens) and "
                                    f"score 0. Likely: the model never emits a stop token (generation.stop_token_ids; "
                                    f"the pre-flight printed them), its prompt is not in its own format "
                                    f"(task.chat_template), or the limits are too short for it")
        self.looked["step"] = True
        self._no_right()
        self._margin()

    def validated(self, pass_rate: float, seconds: float) -> None:
        self.slowest["validation"] = max(self.slowest["validation"], seconds)
        if not self.simulated:
            self.right = max(self.right, pass_rate)
            self.looked["validation"] = True
            self._no_right()
        self._margin()

    def saved(self, seconds: float) -> None:
        self.slowest["checkpoint"] = max(self.slowest["checkpoint"], seconds)
        self._margin()

    def _no_right(self) -> None:
        if all(self.looked.values()) and self.right == 0.0:
            self._once("no_reward", "no answer has been right yet, in the first step's rows nor in the first "
                                    "validation: every reward is the wrong answer's and nothing can be learned. "
                                    "Likely: the answer is not where the task looks for it (task=math: the last "
                                    "\\boxed{}, after </think>), the rows are cut before the answer (the stop tokens, "
                                    "the lengths), or the model is too weak for the data")

    def _margin(self) -> None:
        """SLURM's warning comes launcher.signal_delay_s before the time limit; the job then ends the learner's
        update in flight (and its validation, when one is due), checkpoints and requeues: all of it must fit."""
        delay = self.cfg.launcher.get("signal_delay_s")  # unset: a run not submitted by `ablate` (sizes it)
        if "SLURM_JOB_ID" not in os.environ or not self.slowest["learner step"] or delay is None:
            return
        needed, delay = sum(self.slowest.values()), int(delay)
        if needed > delay:
            parts = ", ".join(f"{what} {seconds:.0f} s" for what, seconds in self.slowest.items() if seconds)
            self._once("signal_delay", f"launcher.signal_delay_s={delay} is less than a learner step, a validation and "
                                       f"a checkpoint take here ({parts}; {needed:.0f} s): at the time limit SLURM "
                                       f"may kill the job before its checkpoint is written, losing every step since "
                                       f"the last. Set launcher.signal_delay_s={int(needed * 1.5) + 1} or more")

    def _once(self, name: str, text: str) -> None:
        if name in self.said:
            return
        self.said.add(name)
        print(f"\nWARNING ({name}): {text}\n", file=sys.stderr, flush=True)
        self.say(f"ablate.alarm.{name}", text)
