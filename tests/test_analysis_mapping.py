"""Another trainer's runs read by a mapping (analysis/mapping.py): what is inferred and said, what is refused in one
line, compute by step, by wall clock and by a metric (numbers by hand), and the report of an MLflow experiment that
ablate did not log, attached to a new run while the runs read stay as they were."""

from __future__ import annotations

import re

import numpy as np
import pytest

from analysis.mapping import GPU_HOURS, STEPS, Mapping, MappingError, curves, resolve
from analysis.sources import Series, SourceRun


def _run(name, metrics: dict, *, tags=None, params=None, start=None, times=None, rid=None) -> SourceRun:
    """A run whose metrics are {name: (steps, values)}; `times` (seconds) go with every metric's steps."""
    def load(key):
        steps, values = metrics[key]
        return Series(np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=float),
                      None if times is None else np.asarray(times[: len(steps)], dtype=float))
    return SourceRun(id=rid or name, name=name, metrics=tuple(metrics), load=load, tags=tags or {},
                     params=params or {}, start_time=start)


STEPS_6 = [0, 10, 20, 30, 40, 50]
RISING = [0.1, 0.2, 0.35, 0.5, 0.55, 0.58]


def _trl(name, **kw):
    return _run(name, {"eval_reward": (STEPS_6, RISING), "reward": (STEPS_6, RISING), "loss": (STEPS_6, RISING)},
                **kw)


def test_a_trl_experiment_is_read_with_nothing_said_and_each_choice_is_printed():
    runs = [_trl("baseline-seed1"), _trl("baseline-seed2"), _trl("beta0.1-seed1"), _trl("beta0.1-seed2")]
    resolved = resolve(runs)
    assert set(resolved.reward.values()) == {"eval_reward"}
    assert resolved.variants == {"baseline-seed1": "baseline", "baseline-seed2": "baseline",
                                 "beta0.1-seed1": "beta0.1", "beta0.1-seed2": "beta0.1"}
    assert resolved.base == "baseline"
    assert resolved.compute.kind == "step" and resolved.compute.unit == STEPS
    said = "\n".join(resolved.said)
    assert "reward: eval_reward (TRL's eval reward" in said
    assert "compute: the step" in said and "variants: the run names without a seed suffix" in said
    assert "base: baseline (by its name" in said
    out = curves(runs, resolved)
    assert [c.variant for c in out] == ["baseline", "baseline", "beta0.1", "beta0.1"]
    assert out[0].unit == STEPS and list(out[0].compute) == STEPS_6


def test_verl_names_and_an_ambiguous_reward_is_refused_naming_the_choices():
    one = {"val-core/gsm8k/reward/mean@1": (STEPS_6, RISING), "training/global_step": (STEPS_6, STEPS_6)}
    runs = [_run("a", one, rid="1"), _run("b", one, rid="2")]
    resolved = resolve(runs, Mapping(base="a"))
    assert set(resolved.reward.values()) == {"val-core/gsm8k/reward/mean@1"}
    two = dict(one) | {"val-core/math/reward/mean@1": (STEPS_6, RISING)}
    with pytest.raises(MappingError, match=r"which metric is the reward\? 2 are verl's validation reward: "
                                           r"val-core/gsm8k/reward/mean@1, val-core/math/reward/mean@1; --reward"):
        resolve([_run("a", two, rid="1"), _run("b", two, rid="2")], Mapping(base="a"))
    chosen = resolve([_run("a", two, rid="1"), _run("b", two, rid="2")],
                     Mapping(reward="val-core/math/*", base="a"))
    assert set(chosen.reward.values()) == {"val-core/math/reward/mean@1"}


def test_only_a_training_reward_is_refused_saying_how_to_fit_it_anyway():
    runs = [_run("a", {"reward": (STEPS_6, RISING)}), _run("b", {"reward": (STEPS_6, RISING)})]
    with pytest.raises(MappingError, match=r"no validation reward .* only the training reward reward .*--reward reward"):
        resolve(runs, Mapping(base="a"))


def test_a_base_left_unsaid_among_unnamed_variants_is_refused_naming_the_flag():
    runs = [_trl("lr1e-3-seed1"), _trl("lr3e-3-seed1")]
    with pytest.raises(MappingError, match=r"which variant is the base .*--base NAME \(variants: lr1e-3 \(1 run\), "
                                           r"lr3e-3 \(1 run\)\)"):
        resolve(runs)


def test_the_bad_mappings_each_get_one_line_naming_what_is_wrong():
    runs = [_trl("base-seed1"), _trl("other-seed1")]
    with pytest.raises(MappingError) as err:
        resolve(runs, Mapping(reward="eval_rewrd"))
    assert str(err.value).startswith("--reward eval_rewrd: no such metric in the runs; did you mean eval_reward?")
    with pytest.raises(MappingError, match=r"^--base scalerl matches no variant; variants: base, other$"):
        resolve(runs, Mapping(base="scalerl"))
    with pytest.raises(MappingError, match=r"^--compute flops: no such metric"):
        resolve(runs, Mapping(compute="flops"))
    with pytest.raises(MappingError, match=r"--compute wall needs the GPU count"):
        resolve(runs, Mapping(compute="wall"))
    with pytest.raises(MappingError, match=r"--variant color:x: say tag:NAME, param:NAME or name:REGEX"):
        resolve(runs, Mapping(variant="color:x"))
    final_only = [_run("base", {"eval_reward": ([100], [0.5])}), _run("other", {"eval_reward": ([100], [0.4])})]
    with pytest.raises(MappingError, match=r"^variant base: eval_reward has 1 point \(at step 100\) in its run: a "
                                           r"final-only metric\?"):
        curves(final_only, resolve(final_only))


def test_compute_by_the_step_times_a_cost_by_hand():
    runs = [_trl("base"), _trl("other")]
    resolved = resolve(runs, Mapping(compute="step*0.5"))
    assert resolved.compute.unit == GPU_HOURS
    assert list(curves(runs, resolved)[0].compute) == [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]


def test_compute_by_the_wall_clock_times_the_gpus_by_hand():
    t0 = 1.7e9
    times = [t0 + 60, t0 + 1800, t0 + 3600, t0 + 5400, t0 + 7200, t0 + 9000]  # step 0 logged a minute in
    runs = [_trl("base", start=t0, times=times), _trl("other", start=t0, times=times)]
    out = curves(runs, resolve(runs, Mapping(compute="wall*8")))
    # hours since the start x 8 GPUs; step 0 is compute 0 by definition (the reward before training)
    assert np.allclose(out[0].compute, [0.0, 4.0, 8.0, 12.0, 16.0, 20.0])
    no_clock = [_trl("base"), _trl("other")]
    with pytest.raises(MappingError, match=r"run base's points carry no times"):
        curves(no_clock, resolve(no_clock, Mapping(compute="wall*8")))


def test_compute_from_a_metric_is_joined_on_step_and_going_backwards_is_refused():
    reward = ([0, 5, 10, 20], [0.1, 0.2, 0.3, 0.4])
    good = {"eval_reward": reward, "num_tokens": ([10, 20], [1000.0, 3000.0])}
    runs = [_run("base", good), _run("other", good)]
    resolved = resolve(runs, Mapping(compute="num_tokens"))
    assert resolved.compute.unit == "num_tokens"
    # step 0 is 0 tokens; step 5 halfway to step 10's 1,000
    assert list(curves(runs, resolved)[0].compute) == [0.0, 500.0, 1000.0, 3000.0]
    bad = {"eval_reward": reward, "num_tokens": ([0, 10, 20], [0.0, 2000.0, 1500.0])}
    runs = [_run("base", bad), _run("other", good)]
    with pytest.raises(MappingError, match=r"^run base: compute \(num_tokens\) goes backwards at step 20: 1,500 after "
                                           r"2,000 at step 10 \(compute must be cumulative\)$"):
        curves(runs, resolve(runs, Mapping(compute="num_tokens")))


def test_steps_that_cost_differently_between_variants_are_warned_about():
    runs = [_trl("base-s1", params={"per_device_train_batch_size": "8", "seed": "1"}),
            _trl("base-s2", params={"per_device_train_batch_size": "8", "seed": "2"}),
            _trl("big-s1", params={"per_device_train_batch_size": "32", "seed": "1"})]
    resolved = resolve(runs)
    assert len(resolved.warned) == 1
    assert "per_device_train_batch_size 32 (big) vs 8 (base)" in resolved.warned[0]
    assert "the law's C is compute, not steps" in resolved.warned[0]
    assert resolve(runs, Mapping(compute="wall*1")).warned == []  # compute that is compute: nothing to warn of
    same = [_trl("base-s1", params={"per_device_train_batch_size": "8"}),
            _trl("big-s1", params={"per_device_train_batch_size": "8"})]
    assert resolve(same, Mapping(base="base")).warned == []


# each trainer's step-cost params as that trainer logs them (TRL's flat TrainingArguments, verl's config flattened
# with "/", OpenRLHF's args, ablate's config flattened with "."), written out here rather than read from the module
STEP_COST_NAMES = [
    "num_generations", "max_completion_length", "max_prompt_length", "per_device_train_batch_size",
    "gradient_accumulation_steps", "generation_batch_size", "steps_per_generation", "num_iterations",
    "train_batch_size",
    "actor_rollout_ref/rollout/n", "data/train_batch_size", "data/max_response_length", "data/max_prompt_length",
    "actor_rollout_ref/actor/ppo_epochs",
    "n_samples_per_prompt", "rollout_batch_size", "generate_max_len", "prompt_max_len",
    "batch.prompts_per_step", "batch.samples_per_prompt", "generation.max_prompt_tokens",
    "generation.max_think_tokens", "generation.max_answer_tokens",
]


@pytest.mark.parametrize("key", STEP_COST_NAMES)
def test_each_trainers_step_cost_param_is_warned_about_where_it_differs(key):
    runs = [_trl("base-s1", params={key: "8", "learning_rate": "1e-6"}),
            _trl("big-s1", params={key: "16", "learning_rate": "1e-6"})]
    warned = resolve(runs, Mapping(base="base")).warned
    assert len(warned) == 1 and f"{key} 16 (big) vs 8 (base)" in warned[0]


def test_a_step_cost_param_is_known_under_a_prefix_of_its_config_and_by_its_whole_name_only():
    """A name matches its key, or a key that ends with "/" or "." and it (a config flattened under a prefix of its
    own: a TRL config nested in another, verl's `config/...`, ablate's dotted one); not a name that only ends so."""
    from analysis.mapping import step_cost_trainer

    assert step_cost_trainer("args/num_generations") == step_cost_trainer("num_generations") == "TRL"
    assert step_cost_trainer("config/actor_rollout_ref/rollout/n") == "verl"
    assert step_cost_trainer("sweep.base.batch.samples_per_prompt") == "ablate"
    assert step_cost_trainer("max_num_generations") is None and step_cost_trainer("rollout/n") is None
    runs = [_trl("base-s1", params={"args/num_generations": "8"}),
            _trl("big-s1", params={"args/num_generations": "16"})]
    assert "args/num_generations 16 (big) vs 8 (base)" in resolve(runs, Mapping(base="base")).warned[0]


def test_a_param_that_sets_no_steps_cost_is_not_warned_about():
    # the negative control of the test above: a learning rate differs, a step costs the same
    runs = [_trl("base-s1", params={"learning_rate": "1e-6", "actor_rollout_ref/actor/optim/lr": "1e-6"}),
            _trl("big-s1", params={"learning_rate": "3e-6", "actor_rollout_ref/actor/optim/lr": "3e-6"})]
    assert resolve(runs, Mapping(base="base")).warned == []


def test_verl_runs_that_differ_in_samples_per_prompt_are_told_the_compute_that_fixes_it():
    per_step = {"val-core/gsm8k/reward/mean@1": (STEPS_6, RISING), "timing_s/step": (list(range(1, 51)), [30.0] * 50)}
    params = {"trainer/n_gpus_per_node": "8", "trainer/nnodes": "1"}
    runs = [_run("base", per_step, params=params | {"actor_rollout_ref/rollout/n": "8"}),
            _run("n16", per_step, params=params | {"actor_rollout_ref/rollout/n": "16"})]
    warned = resolve(runs, Mapping(base="base")).warned
    assert len(warned) == 1
    assert "actor_rollout_ref/rollout/n 16 (n16) vs 8 (base)" in warned[0]
    assert "--compute cumsum:timing_s/step*0.00222 puts them on GPU-hours (8 GPUs" in warned[0]
    no_gpus = [_run(r.name, per_step, params={"actor_rollout_ref/rollout/n": r.params["actor_rollout_ref/rollout/n"]})
               for r in runs]
    assert "--compute cumsum:timing_s/step*GPUS/3600" in resolve(no_gpus, Mapping(base="base")).warned[0]


def test_a_running_sum_of_a_per_step_metric_by_hand_and_its_refusals():
    reward = ([0, 2, 4], [0.1, 0.3, 0.4])
    good = {"eval_reward": reward, "timing_s/step": ([1, 2, 3, 4], [10.0, 20.0, 15.0, 25.0])}
    runs = [_run("base", good), _run("other", good)]
    resolved = resolve(runs, Mapping(compute="cumsum:timing_s/step*0.5"))
    assert resolved.compute.unit == GPU_HOURS and "running sum of timing_s/step" in resolved.compute.text
    # step 2: (10 + 20) x 0.5; step 4: (10 + 20 + 15 + 25) x 0.5
    assert list(curves(runs, resolved)[0].compute) == [0.0, 15.0, 35.0]
    rising = {"eval_reward": reward, "timing_s/step": ([1, 2, 3, 4], [10.0, 11.0, 12.0, 13.0])}
    assert resolve([_run("base", rising), _run("other", rising)], Mapping(compute="cumsum:timing_s/step")) \
        .compute.unit == "sum of timing_s/step"  # slowly longer steps are still steps, not a running total
    refused = {
        "already grows": {"timing_s/step": ([1, 2, 3, 4], [10.0, 20.0, 30.0, 40.0])},
        "between steps 2 and 4": {"timing_s/step": ([1, 2, 4], [10.0, 20.0, 40.0])},
        "from step 3, not step 1": {"timing_s/step": ([3, 4], [10.0, 20.0])},
    }
    for words, metric in refused.items():
        bad = {"eval_reward": reward} | metric
        with pytest.raises(MappingError, match=re.escape(words)):
            resolve([_run("base", bad), _run("other", good)], Mapping(compute="cumsum:timing_s/step*0.5"))


def test_a_clock_axis_that_starts_late_is_counted_from_each_runs_first_point():
    # W&B's export against "Relative Time (Process)": the validation before training is at 120 s (150 s), not 0
    axis = "Relative Time (Process)"
    late = [_run("base", {"eval/reward": ([0, 1, 2], [0.1, 0.3, 0.4]), axis: ([0, 1, 2], [120.0, 3720.0, 7320.0])}),
            _run("other", {"eval/reward": ([1, 3, 5], [0.1, 0.2, 0.3]), axis: ([1, 3, 5], [150.0, 3750.0, 7350.0])})]
    # (the second run's points are rows 1, 3, 5 of the export: its first point is its row, not step 0)
    resolved = resolve(late, Mapping(compute=f"{axis}*{8 / 3600}"))
    out = curves(late, resolved)
    assert np.allclose(out[0].compute, [0.0, 8.0, 16.0]) and np.allclose(out[1].compute, [0.0, 8.0, 16.0])
    assert any("Relative Time (Process) does not start at 0 (0.267 to 0.333 GPU-hours at the first point of 2 runs)"
               in line for line in resolved.said), resolved.said
    from_zero = [_run(r.name, {"eval/reward": ([0, 1, 2], [0.1, 0.3, 0.4]), axis: ([0, 1, 2], [0.0, 3600.0, 7200.0])})
                 for r in late]
    resolved = resolve(from_zero, Mapping(compute=axis))
    assert np.allclose(curves(from_zero, resolved)[0].compute, [0.0, 3600.0, 7200.0])
    assert not any("does not start at 0" in line for line in resolved.said)


def test_r0_also_serves_a_run_with_no_point_at_compute_0():
    # the reward's first point is at step 5, after 5 steps' compute: no R0 there, and --r0 gives it at compute 0
    first_late = {"eval_reward": ([5, 10, 20], [0.3, 0.4, 0.5]), "timing_s/step": (list(range(1, 21)), [3600.0] * 20)}
    runs = [_run("base", first_late), _run("other", first_late)]
    with pytest.raises(MappingError, match=r"no eval_reward at step 0 \(compute 0\) in the runs of base, other"):
        curves(runs, resolve(runs, Mapping(compute="cumsum:timing_s/step*0.000277777777778")))
    resolved = resolve(runs, Mapping(compute="cumsum:timing_s/step*0.000277777777778", r0=0.05))
    out = curves(runs, resolved)
    assert list(out[0].step) == [0, 5, 10, 20] and np.allclose(out[0].compute, [0.0, 5.0, 10.0, 20.0])
    assert out[0].pass_rate[0] == 0.05


@pytest.mark.parametrize("names, taken", [
    (["eval/accuracy", "eval/loss"], "eval/accuracy"),
    (["val/acc", "val/loss"], "val/acc"),
    (["test/pass@1"], "test/pass@1"),
    (["val-core/math/score"], "val-core/math/score"),
    (["eval/loss", "train/accuracy"], None),  # a training accuracy is not a validation one
    (["eval/accuracy", "val/score"], "2 validation metrics are named like one"),
])
def test_a_validation_reward_is_taken_by_its_meaning_where_it_is_the_only_one(names, taken):
    runs = [_run(run, {name: (STEPS_6, RISING) for name in names}) for run in ("base", "other")]
    if taken is None or " " in taken:
        with pytest.raises(MappingError, match=re.escape(taken or "none is named like a validation reward")):
            resolve(runs)
        return
    resolved = resolve(runs)
    assert set(resolved.reward.values()) == {taken}
    assert any(line.startswith(f"reward: {taken} (the only validation metric named like") for line in resolved.said)


def test_variants_by_tag_param_and_name_pattern():
    runs = [_trl("x1", tags={"arm": "a"}, params={"lr": "1"}), _trl("x2", tags={"arm": "b"}, params={"lr": "2"})]
    assert resolve(runs, Mapping(variant="tag:arm", base="a")).variants == {"x1": "a", "x2": "b"}
    assert resolve(runs, Mapping(variant="param:lr", base="1")).variants == {"x1": "1", "x2": "2"}
    assert resolve(runs, Mapping(variant=r"name:^(x)\d", base="x")).variants == {"x1": "x", "x2": "x"}
    with pytest.raises(MappingError, match=r"--variant tag:missing: no tag missing on runs x1, x2"):
        resolve(runs, Mapping(variant="tag:missing"))


def test_a_run_without_a_step_0_reward_needs_r0_and_gets_it_from_the_flag():
    late = {"eval_reward": ([10, 20, 30, 40, 50], RISING[1:])}
    runs = [_run("base", late), _run("other", late)]
    with pytest.raises(MappingError,
                       match=r"no eval_reward at step 0 \(compute 0\) in the runs of base, other: .*--r0 VALUE"):
        curves(runs, resolve(runs, Mapping(base="base")))
    resolved = resolve(runs, Mapping(base="base", r0=0.1))
    out = curves(runs, resolved)
    assert list(out[0].step) == [0, 10, 20, 30, 40, 50] and out[0].pass_rate[0] == 0.1 and out[0].compute[0] == 0.0
    assert any("R0: 0.1 at step 0 given to 2 runs" in line for line in resolved.said)


def test_a_mapping_file_gives_what_flags_leave_unsaid(tmp_path):
    path = tmp_path / "map.yaml"
    path.write_text("reward: eval_reward\ncompute: step*2\nbase: base\n")
    merged = Mapping(compute="wall*4").over(Mapping.from_file(path))
    assert merged == Mapping(reward="eval_reward", compute="wall*4", base="base")
    path.write_text("reward: eval_reward\nbasis: base\n")
    with pytest.raises(MappingError, match=r"unknown key basis \(keys: reward, compute, variant, base, r0\)"):
        Mapping.from_file(path)


# --- an MLflow experiment that ablate did not log, through the CLI ---------------------------------------------------


def _law(c, A, B=1.5, C_mid=30.0, R0=0.1):
    return R0 + (A - R0) / (1 + (C_mid / np.maximum(c, 1e-12)) ** B)


@pytest.fixture
def foreign_store(mlflow_uri):
    """Four TRL-named runs (eval_reward at steps 0..100, two variants by run name, two seeds each): the lower ceiling
    of `lr-hi` is 0.1 below `baseline`'s."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    uri = mlflow_uri
    client = MlflowClient(uri)
    exp = client.create_experiment("grpo")
    rng = np.random.default_rng(3)
    for name, A in (("baseline", 0.7), ("lr-hi", 0.6)):
        for seed in (1, 2):
            run = client.create_run(exp, run_name=f"{name}-seed{seed}")
            client.log_param(run.info.run_id, "seed", seed)
            steps = np.arange(0, 101, 5)
            values = _law(steps.astype(float), A) + rng.normal(0, 0.008, steps.size)
            values[0] = 0.1
            client.log_batch(run.info.run_id, metrics=[Metric("eval_reward", float(v), 1_700_000_000_000 + int(s),
                                                              int(s)) for s, v in zip(steps, values)])
            # as TRL logs them: train_runtime once, at the end; the loss, up and down
            client.log_batch(run.info.run_id, metrics=[
                Metric("train_runtime", 61.5, 1_700_000_000_100, 100),
                *(Metric("loss", float(0.5 + 0.1 * (-1) ** s), 1_700_000_000_000 + int(s), int(s)) for s in steps)])
            client.set_terminated(run.info.run_id)
    return uri, client, exp


def test_the_report_of_another_trainers_experiment_prints_its_mapping_and_leaves_the_runs_alone(
        foreign_store, tmp_path, capsys):
    from analysis.__main__ import main

    uri, client, exp = foreign_store
    before = {r.info.run_id: (r.data.tags, r.data.params, r.info.status)
              for r in client.search_runs([exp])}
    assert main(["report", "--experiment", "grpo", "--tracking-uri", uri, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Read MLflow experiment grpo at {uri}:\n  reward: eval_reward (TRL's eval reward")
    assert "  base: baseline (by its name; --base says otherwise)" in out
    moved = re.search(r"Against baseline, lr-hi lowers the ceiling A by (0\.\d+)\.", out)
    assert moved and abs(float(moved.group(1)) - 0.1) < 0.03, out  # the truth: 0.1
    assert "| lr-hi |" in out and "moves A" in out
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## How these runs were read" in report and "C_mid steps [90% CI]" in report
    runs = client.search_runs([exp])
    made = [r for r in runs if r.info.run_id not in before]
    assert len(made) == 1 and made[0].data.tags["analysis.role"] == "report"
    assert made[0].data.params["mapping.reward"] == "eval_reward"
    names = {a.path for a in client.list_artifacts(made[0].info.run_id, "report")}
    assert {"report/report.md", "report/report.html", "report/variants.csv"} <= names
    after = {r.info.run_id: (r.data.tags, r.data.params, r.info.status) for r in runs if r.info.run_id in before}
    assert after == before
    # a second report reads the same four runs, not the run holding the first report
    assert main(["report", "--experiment", "grpo", "--tracking-uri", uri, "--out", str(tmp_path / "again")]) == 0
    assert "2 variants from 4 runs" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("flags, line", [
    (["--reward", "eval_rewrd"], "error: --reward eval_rewrd: no such metric in MLflow experiment grpo at"),
    (["--base", "scalerl"], "error: --base scalerl matches no variant; variants: baseline, lr-hi"),
    (["--compute", "steps*2"], "error: --compute steps*2: no such metric in MLflow experiment grpo"),
    (["--sweep", "x", "--reward", "eval_reward"], "error: --sweep picks among ablate's sweeps"),
    (["--reward", "train_runtime", "--base", "baseline"], "error: variant baseline: train_runtime has 1 point (at step "
                                                          "100) in each of its 2 runs: a final-only metric?"),
    (["--compute", "loss"], "error: run baseline-seed1: compute (loss) goes backwards at step 5: 0.4 after 0.6 at step "
                            "0 (compute must be cumulative)"),
])
def test_a_bad_mapping_on_the_command_line_is_one_line_and_exit_2(foreign_store, tmp_path, capsys, flags, line):
    from analysis.__main__ import main

    uri, _, _ = foreign_store
    assert main(["report", "--experiment", "grpo", "--tracking-uri", uri, "--out", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(line) and "\n" not in err


def _wandb_export(path, curves_by_run: dict, metric: str = "eval/reward") -> None:
    """A W&B line chart's "Export CSV" as W&B writes it (analysis/tables.py cites the shape): `Step`, then per run
    `<run> - <metric>` with its __MIN and __MAX companions, every cell quoted, an empty cell where a run has no
    point at that step."""
    steps = sorted({s for steps, _ in curves_by_run.values() for s in steps})
    header = ["Step"] + [f"{run} - {metric}{suffix}" for run in curves_by_run for suffix in ("", "__MIN", "__MAX")]
    lines = [",".join(f'"{h}"' for h in header)]
    for step in steps:
        cells = [str(step)]
        for steps_of, values in curves_by_run.values():
            value = dict(zip(steps_of, values)).get(step)
            cells += [""] * 3 if value is None else [repr(float(value))] * 3
        lines.append(",".join(f'"{c}"' for c in cells))
    path.write_text("\n".join(lines) + "\n")


def test_a_wandb_chart_export_is_reported_from_one_command(tmp_path, capsys):
    """Three variants x two seeds drawn from known laws: `no-kl` needs 2x the base's compute (C_mid 60 vs 30 steps,
    the same A and B), `short` has a ceiling 0.15 lower; one command, --base named (nothing else)."""
    from analysis.__main__ import main

    rng = np.random.default_rng(11)
    steps = list(range(0, 201, 5))
    laws = {"base": dict(A=0.7), "no-kl": dict(A=0.7, C_mid=60.0), "short": dict(A=0.55)}
    runs = {}
    for variant, law in laws.items():
        for seed in (1, 2):
            values = _law(np.array(steps, dtype=float), **law) + rng.normal(0, 0.006, len(steps))
            values[0] = 0.1
            runs[f"{variant}-seed{seed}"] = (steps if seed == 1 else steps[::2], values if seed == 1 else values[::2])
    path = tmp_path / "wandb_export_2026-11-28T00_00_00.csv"
    _wandb_export(path, runs)
    assert main(["report", "--csv", str(path), "--base", "base", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "  reward: eval/reward (a validation reward, logged by every run" in out
    assert "variants: the run names without a seed suffix (base (2 runs), no-kl (2 runs), short (2 runs)" in out
    flat = " ".join(out.split())
    assert "short lowers the ceiling A by" in flat
    need = re.search(r"no-kl needs? ([\d.]+)x base's compute", flat)
    assert need and 1.6 < float(need.group(1)) < 2.5, flat  # the truth: 2x
    assert (tmp_path / "out" / "report.html").exists()


# --- verl's names (MLflow runs written with them: no verl run is possible here, tests/foreign_runs.py) -------------


def test_runs_with_verls_names_are_judged_right_by_their_known_laws(mlflow_uri, tmp_path, capsys):
    """verl's validation reward (val-core/<source>/reward/mean_at_4) inferred, compute from the wall clock x 8 GPUs
    (verl logs no cumulative compute), and the verdict the laws say: lr-2e-6's ceiling is 0.1 higher."""
    from analysis.__main__ import main
    from analysis.synthetic import Truth
    from foreign_runs import VerlVariant, make_verl_experiment

    make_verl_experiment(mlflow_uri, "verl-gsm8k", steps=60, test_freq=5, variants={
        "base": Truth(A=0.7, B=2.0, C_mid=6.0, R0=0.3),
        "lr-2e-6": VerlVariant(law=Truth(A=0.8, B=2.0, C_mid=6.0, R0=0.3),
                               config={"actor_rollout_ref/actor/optim/lr": 2e-6})})
    args = ["report", "--experiment", "verl-gsm8k", "--tracking-uri", mlflow_uri, "--out", str(tmp_path)]
    assert main([*args, "--compute", "wall*8"]) == 0
    out = capsys.readouterr().out
    assert "  reward: val-core/openai/gsm8k/reward/mean_at_4 (verl's validation reward" in out
    assert "  base: base (by its name" in out
    flat = " ".join(out.split())
    moved = re.search(r"Against base, lr-2e-6 raises the ceiling A by (0\.\d+)", flat)
    assert moved and abs(float(moved.group(1)) - 0.1) < 0.03, flat
    assert "C_mid GPU-h [90% CI]" in (tmp_path / "report.md").read_text()  # wall x GPUs: GPU-hours
    # verl's per-step figures are not compute: one line says so
    assert main([*args, "--compute", "timing_s/step"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: run base-seed1: timing_s/step does not grow (90 at step 1, 90 at step 60): a figure "
                          "per step?") and "\n" not in err


def test_a_verl_sweep_over_samples_per_prompt_is_put_on_gpu_hours_and_its_verdict_changes(mlflow_uri, tmp_path,
                                                                                          capsys):
    """verl runs that differ only in actor_rollout_ref/rollout/n, 16 samples a prompt costing each step twice the
    seconds of 8, on one law in GPU-hours: by the step, n16 looks to need half the compute, and the report warns,
    naming the param and the --compute that fixes it; on GPU-hours summed from timing_s/step (8 GPUs: x 8/3600),
    the verdict is the laws' own, no change."""
    from analysis.__main__ import main
    from analysis.synthetic import Truth
    from foreign_runs import VerlVariant, make_verl_experiment

    law = Truth(A=0.7, B=2.0, C_mid=6.0, R0=0.3)
    make_verl_experiment(mlflow_uri, "verl-n", steps=60, test_freq=5, variants={
        "base": VerlVariant(law=law, seconds_per_step=90.0),
        "n16": VerlVariant(law=law, seconds_per_step=180.0, config={"actor_rollout_ref/rollout/n": 16})})
    args = ["report", "--experiment", "verl-n", "--tracking-uri", mlflow_uri]
    assert main([*args, "--out", str(tmp_path / "steps")]) == 0
    by_step = " ".join(capsys.readouterr().out.split())
    assert ("warning: compute is the step, but a step costs another amount in different variants "
            "(actor_rollout_ref/rollout/n 16 (n16) vs 8 (base))") in by_step
    assert "--compute cumsum:timing_s/step*0.00222 puts them on GPU-hours (8 GPUs" in by_step
    moved = re.search(r"Against base, n16 needs (0\.\d+)x base's compute", by_step)
    assert moved and abs(float(moved.group(1)) - 0.5) < 0.15, by_step
    assert main([*args, "--out", str(tmp_path / "gpu_hours"), "--compute", "cumsum:timing_s/step*0.00222"]) == 0
    by_hours = " ".join(capsys.readouterr().out.split())
    assert "warning" not in by_hours and "no variant moved" in by_hours, by_hours


def test_a_mapping_flag_on_runs_ablate_logged_is_refused(mlflow_uri, tmp_path, capsys):
    """ablate's runs are read by their tags, sweep by sweep; a mapping would pool its sweeps by variant name."""
    from mlflow.tracking import MlflowClient

    from analysis.__main__ import main

    client = MlflowClient(mlflow_uri)
    exp = client.create_experiment("tiny")
    run = client.create_run(exp, tags={"ablate.role": "variant", "ablate.variant": "scalerl", "ablate.sweep": "s1"})
    client.log_metric(run.info.run_id, "val/pass_rate", 0.1, step=0)
    assert main(["report", "--experiment", "tiny", "--tracking-uri", mlflow_uri, "--out", str(tmp_path),
                 "--base", "loo-fp32"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: experiment tiny holds runs ablate logged, read by their tags (--sweep picks a sweep); "
                   "--reward, --compute, --variant, --base, --r0, --label and --mapping are for another trainer's runs")
