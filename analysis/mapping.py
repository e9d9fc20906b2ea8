"""Another trainer's runs onto the report's curves: which metric is the reward, what compute is, which runs are which
variant, which variant is the base.

A `Mapping` holds what the user said (flags, or a small YAML file); `resolve` fills in what they left unsaid where
the runs make it unambiguous, and says so in a line each (`Resolved.said`), or refuses in one line naming the
choice (`MappingError`). `curves` turns the runs into `RunCurve`s for the report. The choices and why:
docs/bring-your-own-runs.md.
"""

from __future__ import annotations

import difflib
from collections import Counter
import fnmatch
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from analysis.labels import pattern_part, short_labels
from analysis.law import fmt_compute
from analysis.runs import AnalysisError, RunCurve
from analysis.sources import Series, SourceRun

GPU_HOURS = "GPU-hours"
STEPS = "steps"
MIN_REWARD_POINTS = 2  # a variant whose runs have fewer points of the reward has no curve: a final-only metric?

# Validation rewards by the trainers that log them, tried in this order where --reward is not given: the first
# family that matches exactly one metric logged by every run is taken (docs/bring-your-own-runs.md#the-reward).
REWARD_FAMILIES = (
    ("ablate's validation pass rate", ("val/pass_rate",)),
    ("TRL's eval reward", ("eval_reward",)),
    ("verl's validation reward", ("val-core/*/reward/mean@*", "val-core/*/reward/mean_at_*", "val-core/*/acc/mean@*",
                                  "val-core/*/acc/mean_at_*")),
    ("a validation reward", ("val/*reward*", "eval/*reward*", "eval_*reward*", "val-*/*reward*", "test/*reward*",
                             "val_*reward*", "validation/*reward*")),
)
FILE_REWARD = ("the file's reward column", ("reward",))  # a file's long form; in MLflow, TRL's `reward` is training's
TRAINING_REWARDS = ("reward", "train/reward", "critic/score/mean", "critic/rewards/mean")
COMPUTE_METRICS = ("compute/gpu_hours",)  # a cumulative GPU-hours metric (ablate's), taken where every run logs it
FILE_COMPUTE = ("compute",)  # a file's long form: its column `compute`, GPU-hours
BASE_NAMES = ("scalerl", "base", "baseline", "control", "reference", "default")
SEED_SUFFIX = re.compile(r"(?i)(?:[-_. ](?:seed|s)|seed)[-_=]?\d+$")  # "-seed1", "_s2", "seed3": not "steps100"
# A validation reward named by its meaning, where no family above matched: a validation prefix, then a name like
# accuracy, acc, score or pass rate; taken where exactly one metric every run logged is such (and said).
VALIDATION_PREFIXES = ("eval/", "eval_", "val/", "val-core/", "val-aux/", "val_", "test/", "test_", "validation/")
REWARD_MEANINGS = re.compile(r"(?i)(^|[/_\-])(accuracy|acc|score|pass_?rate|pass@\d+|pass_at_\d+)([/_@\-]|$)")
# Params whose difference between variants makes one step cost another amount, as each trainer logs them (a name
# matches a param whose key is it, or ends with "/" or "." and it: verl's flattened config, ablate's dotted one).
STEP_COST_PARAMS = (
    ("TRL", ("num_generations", "max_completion_length", "max_prompt_length", "per_device_train_batch_size",
             "gradient_accumulation_steps", "generation_batch_size", "steps_per_generation", "num_iterations")),
    ("HF Trainer", ("train_batch_size",)),  # trainer_state.json's (analysis/trainer_state.py)
    ("verl", ("actor_rollout_ref/rollout/n", "data/train_batch_size", "data/max_response_length",
              "data/max_prompt_length", "actor_rollout_ref/actor/ppo_epochs")),
    ("OpenRLHF", ("n_samples_per_prompt", "rollout_batch_size", "generate_max_len", "prompt_max_len")),
    ("ablate", ("batch.prompts_per_step", "batch.samples_per_prompt", "generation.max_prompt_tokens",
                "generation.max_think_tokens", "generation.max_answer_tokens")),
)
# What each trainer logs that fixes a compute axis in steps: a per-step time or a cumulative count (the --compute
# the warning suggests, where every run logged it).
PER_STEP_SECONDS = ("timing_s/step", "perf/time_per_step", "train/step_time")
CUMULATIVE_COUNTS = ("compute/gpu_hours", "num_tokens", "train/num_tokens")
CUMSUM = "cumsum:"


class MappingError(AnalysisError):
    """A mapping that names what the runs do not have, or a choice the runs leave open: one line, naming it."""


@dataclass(frozen=True)
class Mapping:
    """What the user said: each field None where left to `resolve`.

    reward: a metric's name, or a pattern (`val-core/*/reward/mean@*`). compute: `step` (the step count), `step*X`
    (X GPU-hours a step), `wall*G` (hours since the run started, from the metrics' own times, times G GPUs),
    `METRIC` (a cumulative metric the runs logged, counted from each run's first point where it does not start at 0),
    `METRIC*X` (X GPU-hours a unit of it) or `cumsum:METRIC*X` (the running sum of a per-step metric, such as
    verl's timing_s/step, X GPU-hours a unit). variant: `tag:NAME`,
    `param:NAME`, or `name:REGEX` (the run name's first group, else its whole match; runs of one variant are its
    seeds). base: the variant every verdict compares with. r0: the reward before training (the law's R0), given to
    each run with no point at compute 0."""

    reward: str | None = None
    compute: str | None = None
    variant: str | None = None
    base: str | None = None
    r0: float | None = None

    @classmethod
    def from_file(cls, path) -> Mapping:
        """A mapping from a YAML (or JSON) file of the same four keys."""
        import yaml

        where = Path(path)
        if not where.is_file():
            raise MappingError(f"--mapping {path}: no such file")
        try:
            said = yaml.safe_load(where.read_text()) or {}
        except yaml.YAMLError as err:
            raise MappingError(f"--mapping {path}: not YAML ({str(err).splitlines()[0]})") from None
        keys = [f.name for f in fields(cls)]
        if not isinstance(said, dict) or any(k not in keys for k in said):
            unknown = [k for k in said if k not in keys] if isinstance(said, dict) else [type(said).__name__]
            raise MappingError(f"--mapping {path}: unknown key {', '.join(map(str, unknown))} (keys: "
                               f"{', '.join(keys)})")
        said = {k: None if v is None else str(v) for k, v in said.items()}
        if said.get("r0") is not None:
            try:
                said["r0"] = float(said["r0"])
            except ValueError:
                raise MappingError(f"--mapping {path}: r0 must be a number, got {said['r0']!r}") from None
        return cls(**said)

    def over(self, other: Mapping) -> Mapping:
        """This mapping, its unsaid fields taken from `other` (flags over a file)."""
        return Mapping(**{f.name: getattr(self, f.name) if getattr(self, f.name) is not None
                          else getattr(other, f.name) for f in fields(self)})


@dataclass(frozen=True)
class Compute:
    """How a run's compute is read: kind `step`, `wall`, `metric` (a cumulative metric, its `name`) or `cumsum` (the
    running sum of a per-step metric), times `scale`; in `unit`."""

    kind: str
    name: str = ""
    scale: float = 1.0
    unit: str = STEPS

    @property
    def text(self) -> str:
        times = f" x {self.scale:g}" if self.scale != 1.0 else ""
        what = {"step": "the step", "wall": "the wall-clock hours since the run started",
                "cumsum": f"the running sum of {self.name}"}.get(self.kind, self.name)
        return f"{what}{times} ({self.unit})"


@dataclass
class Resolved:
    """The mapping the report uses: every field chosen, with a line for each choice that was inferred (`said`)
    and the warnings (`warned`), both printed before the report."""

    reward: dict[str, str]  # run id -> the reward metric's name in that run
    compute: Compute
    variants: dict[str, str]  # run id -> its variant
    base: str | None
    said: list[str] = field(default_factory=list)
    warned: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # runs without the reward, named
    r0: float | None = None  # the reward at step 0 of the runs that logged none there (--r0)


def resolve(runs: list[SourceRun], mapping: Mapping = Mapping(), source: str = "the runs", *,
            from_file: bool = False) -> Resolved:
    """Every choice of `mapping` made for `runs`: the user's where said, else inferred where unambiguous (a line in
    `said` each), else a MappingError naming the choice and the flag that makes it. `from_file`: the runs are a
    file's, whose column `reward` is the reward (in MLflow, a metric `reward` is TRL's training reward)."""
    if not runs:
        raise MappingError(f"{source}: no runs")
    said: list[str] = []
    families = (*REWARD_FAMILIES, FILE_REWARD) if from_file else REWARD_FAMILIES
    reward, left_out = _reward(runs, mapping.reward, source, said, families)
    kept = [run for run in runs if run.id in reward]
    compute = _compute(kept, mapping.compute, source, said, (*COMPUTE_METRICS, *FILE_COMPUTE) if from_file
                       else COMPUTE_METRICS)
    variants = _variants(kept, mapping.variant, said)
    base = _base(variants, mapping.base, said)
    warned = _step_cost_warning(kept, variants) if compute.kind == "step" else []
    if compute.kind == "step" and not any(run.params for run in kept):
        said.append("a step is taken to cost the same in every variant (the runs carry no params to check it by)")
    if mapping.r0 is not None and not 0.0 <= mapping.r0 < 1.0:
        raise MappingError(f"--r0 {mapping.r0:g}: the reward before training must lie in [0, 1)")
    return Resolved(reward=reward, compute=compute, variants=variants, base=base, said=said, warned=warned,
                    left_out=left_out, r0=mapping.r0)


def curves(runs: list[SourceRun], resolved: Resolved) -> list[RunCurve]:
    """The runs the mapping kept as the report's curves: the reward at its steps, compute at the same steps."""
    out, origins = [], []
    for run in runs:
        if run.id not in resolved.reward:
            continue
        reward = run.history(resolved.reward[run.id])
        compute, origin = _compute_at(run, reward, resolved.compute)
        if origin > 0:
            origins.append(origin)
        out.append(RunCurve(run_id=run.id, run_name=run.name, variant=resolved.variants[run.id], axis="",
                            choice="", signature="", status=run.status, sweep="none", parent_run_id=None,
                            step=reward.step, compute=compute, pass_rate=reward.value,
                            last_step=int(reward.step.max(initial=0)), unit=resolved.compute.unit))
    _check_points(out, resolved)
    if origins:
        resolved.said.append(_origins_line(origins, resolved.compute))
    return _with_r0(out, resolved)


# --- the reward --------------------------------------------------------------------------------------------------


def _reward(runs: list[SourceRun], said_reward: str | None, source: str, said: list[str], families=REWARD_FAMILIES):
    """(run id -> the reward's name, runs left out for want of it)."""
    if said_reward is not None:
        matched = {run.id: _matching(run.metrics, said_reward) for run in runs}
        several = [(run, matched[run.id]) for run in runs if len(matched[run.id]) > 1]
        if several:
            run, names = several[0]
            raise MappingError(f"--reward {said_reward} matches {len(names)} metrics of run {run.name}: "
                               f"{_listed(names)}; name one")
        found = {rid: names[0] for rid, names in matched.items() if names}
        if not found:
            every = sorted({m for run in runs for m in run.metrics})
            close = difflib.get_close_matches(said_reward, every, n=1, cutoff=0.6)
            said_which = f"did you mean {close[0]}?" if close else f"(metrics: {_listed(every)})"
            raise MappingError(f"--reward {said_reward}: no such metric in {source}; {said_which}")
        return found, _without(runs, found, said_reward, said)
    every = [set(run.metrics) for run in runs]
    common = set.intersection(*every)
    for family, patterns in families:
        names = sorted({m for m in common for p in patterns if fnmatch.fnmatchcase(m, p)})
        if len(names) > 1:
            raise MappingError(f"which metric is the reward? {len(names)} are {family}: {_listed(names)}; "
                               "--reward NAME says")
        if len(names) == 1:
            said.append(f"reward: {names[0]} ({family}, logged by every run; --reward NAME says otherwise)")
            return {run.id: names[0] for run in runs}, []
    meant = sorted(m for m in common if _validation_reward_by_meaning(m))
    if len(meant) > 1:
        raise MappingError(f"which metric is the reward? {len(meant)} validation metrics are named like one: "
                           f"{_listed(meant)}; --reward NAME says")
    if len(meant) == 1:
        said.append(f"reward: {meant[0]} (the only validation metric named like an accuracy, score or pass rate, "
                    "logged by every run; --reward NAME says otherwise)")
        return {run.id: meant[0] for run in runs}, []
    trained = [m for m in TRAINING_REWARDS if m in common]
    if trained:
        raise MappingError(f"no validation reward among the metrics of {source}, only the training reward "
                           f"{trained[0]} (the law is fitted to a held-out reward; --reward {trained[0]} fits it "
                           "anyway)")
    raise MappingError(f"which metric is the reward? none is named like a validation reward in {source}: "
                       f"--reward NAME (metrics every run logged: {_listed(sorted(common))})")


def _validation_reward_by_meaning(name: str) -> bool:
    """`eval/accuracy`, `val/acc`, `test/pass@1`, `eval_score`: a validation prefix, then a reward's meaning."""
    prefix = next((p for p in VALIDATION_PREFIXES if name.startswith(p)), None)
    return prefix is not None and REWARD_MEANINGS.search(name[len(prefix):]) is not None


def _matching(metrics: tuple[str, ...], said: str) -> list[str]:
    if any(ch in said for ch in "*?["):
        return [m for m in metrics if fnmatch.fnmatchcase(m, said)]
    return [said] if said in metrics else []


def _without(runs: list[SourceRun], found: dict, reward: str, said: list[str]) -> list[str]:
    missing = [run.name for run in runs if run.id not in found]
    if missing:
        said.append(f"left out, no {reward}: {_listed(missing)}")
    return missing


# --- compute -----------------------------------------------------------------------------------------------------


def _compute(runs: list[SourceRun], said_compute: str | None, source: str, said: list[str],
             known: tuple[str, ...] = COMPUTE_METRICS) -> Compute:
    if said_compute is None:
        common = set.intersection(*(set(run.metrics) for run in runs))
        metric = next((m for m in known if m in common), None)
        if metric is not None:
            said.append(f"compute: {metric} ({GPU_HOURS}, logged by every run)")
            return Compute("metric", metric, 1.0, GPU_HOURS)
        seconds = next((m for m in PER_STEP_SECONDS if m in common), None)
        summed = f", cumsum:{seconds}*GPUS/3600 (GPU-hours from the seconds each step took)" if seconds else ""
        said.append(f"compute: the step (no compute metric logged; --compute step*GPU_HOURS_PER_STEP, "
                    f"wall*GPUS{summed} or a metric's name says otherwise)")
        return Compute("step")
    what, _, times = said_compute.partition("*")
    what = what.strip()
    scale = 1.0
    if times:
        try:
            scale = float(times)
        except ValueError:
            raise MappingError(f"--compute {said_compute}: {times!r} after '*' is not a number (GPU-hours a step, "
                               "GPUs, or GPU-hours a unit of the metric)") from None
        if not scale > 0:
            raise MappingError(f"--compute {said_compute}: the factor must be > 0, got {times}")
    if what == "step":
        return Compute("step", "", scale, GPU_HOURS if times else STEPS)
    if what.startswith(CUMSUM):
        return _cumsum(runs, said_compute, what[len(CUMSUM):].strip(), scale, bool(times), source)
    if what == "wall":
        if not times:
            raise MappingError("--compute wall needs the GPU count the runs used: --compute wall*GPUS (GPU-hours "
                               "= wall-clock hours x GPUs)")
        return Compute("wall", "", scale, GPU_HOURS)
    _logged_by_all(runs, what, said_compute, source)
    unit = GPU_HOURS if times or what in (*COMPUTE_METRICS, *FILE_COMPUTE) else what
    return Compute("metric", what, scale, unit)


def _logged_by_all(runs: list[SourceRun], metric: str, said_compute: str, source: str) -> None:
    lacking = [run.name for run in runs if metric not in run.metrics]
    if lacking:
        every = sorted({m for run in runs for m in run.metrics})
        close = difflib.get_close_matches(metric, every, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        where = "no such metric in " + source if len(lacking) == len(runs) else f"not logged by {_listed(lacking)}"
        raise MappingError(f"--compute {said_compute}: {where}; {hint}(step, step*X, wall*GPUS, a metric or "
                           f"cumsum:METRIC: {_listed(every)})")


def _cumsum(runs: list[SourceRun], said_compute: str, metric: str, scale: float, scaled: bool,
            source: str) -> Compute:
    """`cumsum:METRIC[*X]`: a per-step metric (verl's timing_s/step) summed over the steps; refused where the metric
    already grows (it is cumulative: name it alone) or skips steps (a sum over the steps logged is not the total)."""
    if not metric:
        raise MappingError(f"--compute {said_compute}: name the per-step metric to sum (cumsum:timing_s/step*X)")
    _logged_by_all(runs, metric, said_compute, source)
    for run in runs:
        logged = run.history(metric)
        positive = logged.step[logged.step > 0]
        gaps = np.flatnonzero(np.diff(positive) > 1)
        if positive.size and positive[0] > 1:
            raise MappingError(f"--compute {said_compute}: run {run.name} logs {metric} from step {int(positive[0])}"
                               f", not step 1: a running sum needs the metric at every step")
        if gaps.size:
            i = int(gaps[0])
            raise MappingError(f"--compute {said_compute}: run {run.name} has no {metric} between steps "
                               f"{int(positive[i])} and {int(positive[i + 1])}: a running sum needs the metric at "
                               "every step (log it each step, or use a cumulative metric)")
        if _looks_cumulative(positive, logged.value[logged.step > 0]):
            values = logged.value
            raise MappingError(f"--compute {said_compute}: {metric} of run {run.name} already grows (from "
                               f"{fmt_compute(float(values[0]))} to {fmt_compute(float(values[-1]))} at every step, "
                               f"as fast as the steps): it is cumulative, not per step; --compute {metric} takes it "
                               "as it is")
    return Compute("cumsum", metric, scale, GPU_HOURS if scaled else f"sum of {metric}")


def _looks_cumulative(steps: np.ndarray, values: np.ndarray) -> bool:
    """A running total, not a figure per step: it never falls, and over a span of at least 3x in steps it grows at
    least half as fast as the step (a per-step figure that drifts up, as steps lengthen, grows far slower)."""
    if values.size < 3 or not values[0] > 0 or np.any(np.diff(values) < 0) or steps[-1] < 3 * steps[0]:
        return False
    return values[-1] / values[0] >= 0.5 * steps[-1] / steps[0]


def _compute_at(run: SourceRun, reward: Series, compute: Compute) -> tuple[np.ndarray, float]:
    """The compute at each of the reward's steps (step 0 is compute 0), and the origin taken off a metric axis that
    does not start at 0 (0.0 where none was); a MappingError where it goes backwards."""
    steps = reward.step
    if compute.kind == "step":
        return steps.astype(float) * compute.scale, 0.0
    if compute.kind == "wall":
        if reward.time is None:
            raise MappingError(f"--compute wall*GPUS: run {run.name}'s points carry no times (a file needs a time "
                               "column); --compute step*GPU_HOURS_PER_STEP instead")
        start = run.start_time if run.start_time is not None else float(reward.time.min())
        hours = np.maximum(reward.time - start, 0.0) / 3600.0
        hours = np.where(steps == 0, 0.0, hours)
        _forward(run, steps, hours, "the wall clock")
        return hours * compute.scale, 0.0
    logged = run.history(compute.name)
    if compute.kind == "cumsum":  # steps 1..s cost the sum of their figures; step 0 (before training) none
        trained = logged.step > 0
        known_steps = np.append(0, logged.step[trained])
        known = np.append(0.0, np.cumsum(logged.value[trained]) * compute.scale)
        _covers(run, compute, known_steps, steps)
        return np.interp(steps, known_steps, known), 0.0
    _forward(run, logged.step, logged.value, compute.name)
    if logged.value.size > 2 and not logged.value[-1] > logged.value[0]:
        raise MappingError(f"run {run.name}: {compute.name} does not grow ({fmt_compute(float(logged.value[0]))} at "
                           f"step {int(logged.step[0])}, {fmt_compute(float(logged.value[-1]))} at step "
                           f"{int(logged.step[-1])}): a figure per step? compute must be cumulative (--compute "
                           f"cumsum:{compute.name}*X sums it, X GPU-hours a unit; or wall*GPUS)")
    known_steps, known = logged.step, logged.value * compute.scale
    if 0 not in known_steps:
        known_steps, known = np.append(0, known_steps), np.append(0.0, known)
    _covers(run, compute, known_steps, steps)
    at = np.interp(steps, known_steps, known)
    if steps.size and logged.step.size and logged.step[0] <= steps[0] and at[0] > 0:
        return at - at[0], float(at[0])  # an axis not starting at 0 (a clock, a counter): from the first point
    return at, 0.0


def _covers(run: SourceRun, compute: Compute, known_steps: np.ndarray, steps: np.ndarray) -> None:
    outside = steps[(steps > known_steps.max()) | (steps < 0)]
    if outside.size:
        raise MappingError(f"run {run.name}: {compute.name} stops at step {int(known_steps.max())}, the reward goes "
                           f"on to step {int(outside.max())}; compute must cover every reward point")


def _origins_line(moved: list[float], compute: Compute) -> str:
    """The line saying a metric axis was counted from each run's first point, and by how much (`moved`: each such
    run's origin)."""
    span = fmt_compute(min(moved)) if min(moved) == max(moved) else \
        f"{fmt_compute(min(moved))} to {fmt_compute(max(moved))}"
    return (f"compute: {compute.name} does not start at 0 ({span} {compute.unit} at the first point of {len(moved)} "
            f"run{'s' if len(moved) > 1 else ''}): counted from each run's first point, whose reward is R0")


def _forward(run: SourceRun, steps: np.ndarray, values: np.ndarray, name: str) -> None:
    back = np.flatnonzero(np.diff(values) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise MappingError(f"run {run.name}: compute ({name}) goes backwards at step {int(steps[i])}: "
                           f"{fmt_compute(float(values[i]))} after {fmt_compute(float(values[i - 1]))} at step "
                           f"{int(steps[i - 1])} (compute must be cumulative)")


# --- variants and the base ---------------------------------------------------------------------------------------


def _variants(runs: list[SourceRun], said_variant: str | None, said: list[str]) -> dict[str, str]:
    if said_variant is not None:
        kind, _, key = said_variant.partition(":")
        if kind not in ("tag", "param", "name") or not key:
            raise MappingError(f"--variant {said_variant}: say tag:NAME, param:NAME or name:REGEX")
        if kind == "name":
            try:
                pattern = re.compile(key)
            except re.error as err:
                raise MappingError(f"--variant {said_variant}: not a regular expression ({err})") from None
            found = {}
            for run in runs:
                part = pattern_part(pattern, run.name)
                if part is None:
                    raise MappingError(f"--variant {said_variant}: run {run.name} does not match")
                found[run.id] = part
            return found
        held = {run.id: (run.tags if kind == "tag" else run.params).get(key) for run in runs}
        lacking = [run.name for run in runs if held[run.id] is None]
        if lacking:
            raise MappingError(f"--variant {said_variant}: no {kind} {key} on run{'s' if len(lacking) > 1 else ''} "
                               f"{_listed(lacking)}")
        return {rid: str(v) for rid, v in held.items()}
    for tag in ("ablate.variant", "variant"):
        if all(tag in run.tags for run in runs):
            said.append(f"variants: the tag {tag} (--variant says otherwise)")
            return {run.id: run.tags[tag] for run in runs}
    stripped = {run.id: SEED_SUFFIX.sub("", run.name) or run.name for run in runs}
    groups = list(Counter(stripped.values()).items())
    seeded = any(stripped[run.id] != run.name for run in runs) or any(n > 1 for _, n in groups)
    if seeded:
        said.append(f"variants: the run names without a seed suffix ({_groups(groups)}; --variant name:REGEX "
                    "says otherwise)")
    else:
        said.append("variants: one run each, by run name (no seed suffix such as -seed1; --variant says otherwise)")
    return stripped


def _base(variants: dict[str, str], said_base: str | None, said: list[str]) -> str | None:
    names = list(Counter(variants.values()))
    if said_base is not None:
        shown = {label: name for name, label in short_labels(names).items()}
        if said_base not in names and said_base in shown:  # the name the report shows (analysis/labels.py)
            said.append(f"base: {shown[said_base]}, shown as {said_base}")
            return shown[said_base]
        if said_base not in names:
            close = difflib.get_close_matches(said_base, names, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}? " if close else ""
            raise MappingError(f"--base {said_base} matches no variant; {hint}variants: {_listed(names)}")
        return said_base
    if len(names) == 1:
        said.append(f"base: {names[0]}, the only variant (nothing to compare with it)")
        return names[0]
    known = [name for name in names if name.lower() in BASE_NAMES]
    if len(known) == 1:
        said.append(f"base: {known[0]} (by its name; --base says otherwise)")
        return known[0]
    raise MappingError(f"which variant is the base every verdict compares with? --base NAME (variants: "
                       f"{_groups(list(Counter(variants.values()).items()))})")


def _step_cost_warning(runs: list[SourceRun], variants: dict[str, str]) -> list[str]:
    """Params that set a step's cost (STEP_COST_PARAMS) and differ between variants: a compute axis in steps compares
    unlike steps. The warning names them and the --compute that fixes it, from what the runs logged."""
    differ = []
    for key in sorted({k for run in runs for k in run.params if step_cost_trainer(k) is not None}):
        values: dict[str, set] = {}
        for run in runs:
            values.setdefault(str(run.params.get(key, "(not set)")), set()).add(variants[run.id])
        if len(values) > 1:
            differ.append(f"{key} " + " vs ".join(f"{v} ({', '.join(sorted(vs))})" for v, vs in sorted(values.items())))
    if not differ:
        return []
    return [f"compute is the step, but a step costs another amount in different variants ({'; '.join(differ[:3])}): "
            f"the law's C is compute, not steps; {_compute_that_fixes(runs)}"]


def step_cost_trainer(key: str) -> str | None:
    """The trainer whose step-cost param `key` is (STEP_COST_PARAMS), None where it sets no step's cost."""
    for trainer, names in STEP_COST_PARAMS:
        if any(key == name or key.endswith(("/" + name, "." + name)) for name in names):
            return trainer
    return None


def _compute_that_fixes(runs: list[SourceRun]) -> str:
    """The --compute that puts these runs on compute: a per-step time summed (with verl's GPU count where its params
    give it), a cumulative count they logged, or the wall clock."""
    common = set.intersection(*(set(run.metrics) for run in runs))
    seconds = next((m for m in PER_STEP_SECONDS if m in common), None)
    if seconds is not None:
        gpus = {_gpus(run) for run in runs}
        factor = f"{next(iter(gpus)) / 3600:.3g}" if len(gpus) == 1 and None not in gpus else "GPUS/3600"
        said = f" ({next(iter(gpus))} GPUs, from trainer/n_gpus_per_node x trainer/nnodes)" if factor[0] != "G" else ""
        return f"--compute cumsum:{seconds}*{factor} puts them on GPU-hours{said}"
    counted = next((m for m in CUMULATIVE_COUNTS if m in common), None)
    if counted is not None:
        return f"--compute {counted} compares them by what they logged"
    if all(run.start_time is not None for run in runs):
        return "--compute wall*GPUS compares them by GPU-hours"
    return "log compute (GPU-hours, or a per-step time for --compute cumsum:METRIC*X) to compare them fairly"


def _gpus(run: SourceRun) -> int | None:
    """verl's GPU count, from its flattened config (trainer/n_gpus_per_node x trainer/nnodes), None where unknown."""
    try:
        return int(run.params["trainer/n_gpus_per_node"]) * int(run.params.get("trainer/nnodes", 1))
    except (KeyError, ValueError):
        return None


def _check_points(out: list[RunCurve], resolved: Resolved) -> None:
    """Refuse a variant whose runs have fewer than MIN_REWARD_POINTS points: the reward is not a curve there."""
    by_variant: dict[str, list[RunCurve]] = {}
    for curve in out:
        by_variant.setdefault(curve.variant, []).append(curve)
    for variant, group in by_variant.items():
        most = max(curve.step.size for curve in group)
        if most < MIN_REWARD_POINTS:
            metric = resolved.reward[group[0].run_id]
            at = f" (at step {int(group[0].step[0])})" if group[0].step.size else ""
            raise MappingError(f"variant {variant}: {metric} has {most} point{'' if most == 1 else 's'}{at} in "
                               f"{'its run' if len(group) == 1 else f'each of its {len(group)} runs'}: a final-only "
                               "metric? The law is fitted to a curve (--reward names another)")


def _with_r0(out: list[RunCurve], resolved: Resolved) -> list[RunCurve]:
    """Each run with no reward at compute 0 gets (step 0, compute 0, --r0); without --r0, a variant none of whose
    runs has one is refused: the law starts from R0, the reward before training."""
    def starts(curve: RunCurve) -> bool:
        return bool(curve.compute.size) and curve.compute.min() == 0.0

    lacking = [curve for curve in out if not starts(curve)]
    if not lacking:
        return out
    if resolved.r0 is None:
        variants = sorted({c.variant for c in out} - {c.variant for c in out if starts(c)})
        if not variants:
            return out  # each variant has a seed with its R0 point: the pooled fit takes R0 from those
        metric = resolved.reward[lacking[0].run_id]
        raise MappingError(f"no {metric} at step 0 (compute 0) in the runs of {_listed(variants)}: the law starts "
                           "from the reward "
                           "before training (R0); evaluate before training (TRL: trainer.evaluate() before "
                           "trainer.train(); verl: trainer.val_before_train=True), or --r0 VALUE gives it")
    resolved.said.append(f"R0: {resolved.r0:g} at step 0 given to {len(lacking)} run{'s' if len(lacking) > 1 else ''}"
                         " that logged none there (--r0)")
    # a run with no point at compute 0 has none at step 0 either (every axis puts step 0 at compute 0)
    return [c if starts(c) else replace(c, step=np.append(0, c.step), compute=np.append(0.0, c.compute),
                                        pass_rate=np.append(resolved.r0, c.pass_rate)) for c in out]


def _groups(groups: list[tuple[str, int]]) -> str:
    return _listed([f"{name} ({n} run{'s' if n > 1 else ''})" for name, n in groups])


def _listed(names, most: int = 12) -> str:
    names = list(names)
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more
