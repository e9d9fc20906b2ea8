"""Named mutations of the riskiest code, each run against the tests that should catch it (issue 55).

Each mutation is a file, an exact text found in it exactly once (else the line says `stale`), its replacement and
the pytest node ids that should fail on it. The working tree (tracked and untracked files git does not ignore) is
copied once into a scratch folder under the temp dir, never touched here; each mutation is applied there alone, its
tests run in that folder with it first on sys.path (PYTHONPATH: the editable install of ablate would otherwise import
the checkout's own code) by this Python (the same venv), and the file restored. One line a mutation:

    NAME  TESTS  caught | survived | stale | error (rc N)  SECONDS

Exit status 1 when any did not end `caught`. `--list` names them; `--only NAME` (repeatable) runs those;
`--root DIR` copies DIR instead of this checkout; `--before` runs each mutation's form for the code and tests before
issue 55's changes (`before`: another text where the code differed, and the tests that named the behaviour then),
e.g. `git worktree add /tmp/wt_old HEAD; python bench/mutations.py --root /tmp/wt_old --before`: there the issue's
mutations are expected to end `survived`. `--baseline` first runs every listed test unmutated (all must pass).

    python bench/mutations.py            # the whole list (~25 min on 2 busy cores, most of it one trainer test)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str = ""
    # before issue 55's test changes: the text to mutate where the code differed, and the tests that named it then
    before: tuple[str, str, str] | None = None  # (file, old, new)
    before_tests: tuple[str, ...] = ()


T_PLAN, T_RANK, T_SPREAD = "tests/test_plan.py", "tests/test_analysis_rank.py", "tests/test_spread.py"
T_SEQ, T_ADAPT, T_MAP = "tests/test_sequential.py", "tests/test_adaptive.py", "tests/test_analysis_mapping.py"

MUTATIONS = [
    # ---- issue 55's: each survived the test that named the behaviour ------------------------------------------------
    Mutation("step-cost: verl's rollout.n dropped", "analysis/mapping.py",
             '("verl", ("actor_rollout_ref/rollout/n", "data/train_batch_size",', '("verl", ("data/train_batch_size",',
             (f"{T_MAP}::test_each_trainers_step_cost_param_is_warned_about_where_it_differs",),
             why="fixed before issue 55's other changes (STEP_COST_PARAMS): caught at HEAD already",
             before_tests=(f"{T_MAP}::test_each_trainers_step_cost_param_is_warned_about_where_it_differs",)),
    Mutation("learner imbalance hard-coded 0", "ablate/trainer.py",
             '"perf/learner_imbalance": planned.imbalance}', '"perf/learner_imbalance": 0.0}',
             (f"{T_PLAN}::test_the_learners_imbalance_at_two_ranks_by_hand",),
             before_tests=(f"{T_PLAN}::test_the_learner_steps_on_the_plan_and_logs_its_figures",
                           f"{T_PLAN}::test_the_learner_packs_its_rows_up_to_the_padded_forms_largest_pass")),
    Mutation("learner attention 155,200x too heavy", "ablate/trainer.py",
             "shape.hidden_size * shape.num_hidden_layers / sum(p.numel() for p in self.policy.parameters())",
             "shape.hidden_size * shape.num_hidden_layers / 1",
             (f"{T_PLAN}::test_the_learners_attention_weight_is_its_models_shape_counted_by_hand",
              f"{T_PLAN}::test_the_learners_imbalance_at_two_ranks_by_hand"),
             before_tests=(f"{T_PLAN}::test_the_learner_steps_on_the_plan_and_logs_its_figures",
                           f"{T_PLAN}::test_the_learner_packs_its_rows_up_to_the_padded_forms_largest_pass")),
    Mutation("vLLM tests' CUDA graphs forced off", "tests/conftest.py",
             'return env.get(GRAPHS) != "1" or device_type != "cuda"', "return True",
             ("tests/test_gpu_check.py::test_the_graph_step_runs_vllm_with_cuda_graphs_and_passes_its_environment",),
             why="test_vllm.py's own use of it: test_the_engines_capture_cuda_graphs_where_the_graph_step_asks, "
                 "in bench/gpu_check.py's graph step (vLLM on CUDA)",
             before=("tests/test_vllm.py", 'EAGER = os.environ.get("ABLATE_VLLM_GRAPHS") != "1" or DEVICE.type != '
                     '"cuda"\n', 'EAGER = os.environ.get("ABLATE_VLLM_GRAPHS") != "1" or DEVICE.type != "cuda"\n'
                     'EAGER = True\n'),
             before_tests=("tests/test_gpu_check.py::"
                           "test_the_graph_step_runs_vllm_with_cuda_graphs_and_passes_its_environment",)),
    Mutation("validation's packed mask None", "ablate/policy.py",
             "    if attention_mask is None and q_length == kv_length and not q_offset and not kv_offset:\n"
             "        return None\n", "    return None\n",
             ("tests/test_trainer.py::"
              "test_packed_rows_train_two_steps_and_validate_through_the_models_own_attention",),
             before_tests=("tests/test_trainer.py::"
                           "test_packed_rows_train_two_steps_and_validate_through_the_models_own_attention",)),
    Mutation("zone-less time read as local", "analysis/tables.py",
             "        moment = moment.replace(tzinfo=timezone.utc)\n", "        pass\n",
             ("tests/test_analysis_tables.py::test_a_time_column_is_the_clock",),
             before_tests=("tests/test_analysis_tables.py::test_a_time_column_is_the_clock",)),
    Mutation("a 3-D batch's log-probs permuted", "ablate/rl/precision.py",
             "    return logp.reshape(shape)\n",
             "    return logp.reshape(shape) if len(shape) != 2 else logp.reshape(shape[::-1]).transpose(0, 1)\n",
             ("tests/test_precision.py::test_a_3d_batch_keeps_its_shape_and_an_empty_one_works",),
             before_tests=("tests/test_precision.py::test_a_3d_batch_keeps_its_shape_and_an_empty_one_works",)),
    # ---- the weak-by-reading ones, mended ---------------------------------------------------------------------------
    Mutation("plan ties broken by a string hash", "ablate/plan.py",
             "b = min(fits, key=lambda b: (work[b], b))", "b = min(fits, key=lambda b: (work[b], hash(str(b)) % 97))",
             (f"{T_PLAN}::test_every_rank_plans_the_same_from_what_it_is_sent",),
             why="in one process the plan equals itself; another process (another hash seed) plans otherwise",
             before_tests=(f"{T_PLAN}::test_every_row_once_the_same_passes_on_every_rank_the_budget_kept",)),
    Mutation("a batch given up one look late", "ablate/generators/pipeline.py",
             "                if stop is not None and stop():\n                    raise Interrupted(",
             "                if stop is not None and stop():\n                    if self.thread is None:\n"
             "                        self._advance()\n                    raise Interrupted(",
             ("tests/test_pipeline.py::test_a_batch_given_up_at_a_warning_is_started_again_on_resume",),
             before_tests=("tests/test_pipeline.py::test_a_batch_given_up_at_a_warning_is_started_again_on_resume",)),
    Mutation("the fixture's verl law biased by -0.02", "tests/foreign_runs.py",
             "rate = np.clip(spec.law(compute) + wobble(", "rate = np.clip(spec.law(compute) - 0.02 + wobble(",
             ("tests/test_foreign_runs.py::test_verl_runs_carry_verls_names_and_follow_their_law",),
             before_tests=("tests/test_foreign_runs.py::test_verl_runs_carry_verls_names_and_follow_their_law",)),
    Mutation("the paper law's answer median halved", "bench/bench_gpu.py",
             "answer = np.clip(rng.lognormal(np.log(200), 0.8, rows), 1, 2048)",
             "answer = np.clip(rng.lognormal(np.log(100), 0.8, rows), 1, 2048)",
             ("tests/test_bench_gpu.py::test_the_paper_law_is_the_mid_regime_scaled_to_its_cap",)),
    # ---- the verdicts ------------------------------------------------------------------------------------------------
    Mutation("a claim needs |z| > c + 0.5", "analysis/rank.py",
             "return math.isfinite(self.sd) and abs(self.z) >= self.c",
             "return math.isfinite(self.sd) and abs(self.z) > self.c + 0.5", (T_RANK,)),
    Mutation("a claim's sd taken from the wrong side", "analysis/rank.py",
             "return self.sd_down if self.d < 0 else self.sd_up", "return self.sd_up if self.d < 0 else self.sd_down",
             (T_RANK,)),
    Mutation("the critical value one-sided", "analysis/rank.py",
             "return float(ndtri(1 - alpha / 2))", "return float(ndtri(1 - alpha))", (T_RANK,)),
    Mutation("recipe claim's sides swapped", "analysis/spread.py",
             "sd_down=math.hypot(above, below_base), sd_up=math.hypot(below, above_base)",
             "sd_down=math.hypot(below, above_base), sd_up=math.hypot(above, below_base)",
             (f"{T_SPREAD}::test_each_sides_seeds_combined_with_the_spread_by_hand",)),
    Mutation("t factor over a one-sided z", "analysis/spread.py",
             "return float(stdtrit(dof_eff, 1 - alpha / 2) / ndtri(1 - alpha / 2))",
             "return float(stdtrit(dof_eff, 1 - alpha / 2) / ndtri(1 - alpha))", (T_SPREAD,)),
    # ---- the adaptive rule -------------------------------------------------------------------------------------------
    Mutation("alpha spent by t, not sqrt(t)", "analysis/sequential.py",
             "return float(4.0 * ndtr(-z / math.sqrt(t)))", "return float(4.0 * ndtr(-z / t))",
             (f"{T_SEQ}::test_published_lan_demets_obrien_fleming_boundaries",)),
    Mutation("first look's boundary one-sided", "analysis/sequential.py",
             "c = -float(ndtri(inc / 2))", "c = -float(ndtri(inc))",
             (f"{T_SEQ}::test_one_look_is_the_fixed_sample_test",
              f"{T_SEQ}::test_published_lan_demets_obrien_fleming_boundaries")),
    Mutation("the margin ignores the interval", "analysis/adaptive.py",
             "and abs(claim.d) + CRITICAL * max(claim.sd_down, claim.sd_up) <= margin_A:",
             "and abs(claim.d) <= margin_A:",
             (f"{T_ADAPT}::test_a_margin_settles_A_only_when_the_changes_whole_interval_is_inside_it_by_hand",)),
    Mutation("futility never stops", "analysis/adaptive.py",
             "        elif p < futility:", "        elif p < futility and False:",
             (f"{T_ADAPT}::test_a_null_pair_settles_on_futility_at_no_claim_and_a_margin_settles_it_sooner",)),
    # ---- the requeue ---------------------------------------------------------------------------------------------
    Mutation("validation's time counted in the next step", "ablate/trainer.py",
             "                tick = time.perf_counter()  # validation's time is not the next step's "
             "(docs/training.md)\n",
             "                pass\n",
             ("tests/test_trainer.py::test_validation_is_counted_apart_from_the_laws_compute",),
             why="the trainer's clock moved 1,000 s on by each validation: the step after one would hold them"),
    Mutation("a second stop at one step requeues again", "ablate/trainer.py",
             "again = state.requeued_at == state.step", "again = False",
             ("tests/test_resume.py::test_a_run_stopped_twice_at_the_same_step_fails_instead_of_requeueing_for_ever",)),
    # ---- the plan --------------------------------------------------------------------------------------------------
    Mutation("passes rounded down to the ranks", "ablate/plan.py",
             "return -(-count // world) * world", "return max(count // world, 1) * world",
             (f"{T_PLAN}::test_padded_runs_six_rows_on_two_ranks_by_hand",
              f"{T_PLAN}::test_every_row_once_the_same_passes_on_every_rank_the_budget_kept")),
    Mutation("a round's heaviest bin to the busiest rank", "ablate/plan.py",
             "sorted(range(world), key=lambda r: (totals[r], r))",
             "sorted(range(world), key=lambda r: (-totals[r], r))",
             (f"{T_PLAN}::test_packed_bins_six_rows_on_two_ranks_by_hand",
              f"{T_PLAN}::test_padded_runs_six_rows_on_two_ranks_by_hand")),
    Mutation("packed budget: a row over it shares a pass", "ablate/plan.py",
             "fits = [b for b in range(count) if not bins[b] or not budget or tokens[b] + n <= budget]",
             "fits = [b for b in range(count) if not bins[b] or not budget or tokens[b] + n <= 2 * budget]",
             (f"{T_PLAN}::test_a_row_longer_than_the_budget_goes_alone_and_is_said",
              f"{T_PLAN}::test_every_row_once_the_same_passes_on_every_rank_the_budget_kept")),
    # ---- the mapping ----------------------------------------------------------------------------------------------
    Mutation("step-cost names matched by key alone", "analysis/mapping.py",
             'if any(key == name or key.endswith(("/" + name, "." + name)) for name in names):',
             "if any(key == name for name in names):",
             (f"{T_MAP}::test_a_step_cost_param_is_known_under_a_prefix_of_its_config_and_by_its_whole_name_only",)),
    Mutation("a late-starting axis not counted from its first point", "analysis/mapping.py",
             "return at - at[0], float(at[0])", "return at, 0.0",
             (f"{T_MAP}::test_a_clock_axis_that_starts_late_is_counted_from_each_runs_first_point",
              "tests/test_analysis_forms.py")),
    Mutation("a per-step metric's missing steps summed over", "analysis/mapping.py",
             "        if gaps.size:\n", "        if False:\n",
             (f"{T_MAP}::test_a_running_sum_of_a_per_step_metric_by_hand_and_its_refusals",)),
    Mutation("the A/B plot on matplotlib's constrained layout", "analysis/plots.py",
             "margins=dict(left=left, right=0.98, wspace=0.06,", "margins=None and dict(left=left, right=0.98, "
             "wspace=0.06,",
             ("tests/test_analysis_labels.py::"
              "test_the_ab_plot_keeps_its_panels_and_the_overview_its_titles_apart_whatever_the_names",)),
    Mutation("an epoch-seconds time column read as ms", "analysis/tables.py",
             "    elif _is_number(cell):\n        return float(cell)\n",
             "    elif _is_number(cell):\n        return float(cell) / 1000\n",
             ("tests/test_analysis_tables.py::test_a_time_column_is_the_clock",)),
    # issue 54: the packed learner on every torch
    Mutation("varlen taken to run on a torch without the signature the pass calls", "ablate/policy.py",
             "    return _kernels_run(device, compute) and bool(_varlen_form())\n",
             "    return _kernels_run(device, compute)\n",
             ("tests/test_packing.py::test_varlen_runs_where_torch_has_the_signature_the_packed_pass_calls",)),
    Mutation("varlen's backward scratch without FlashAttention's 128 rows of padding a row", "ablate/memory.py",
             "    padded = tokens + 128 * rows\n", "    padded = tokens\n",
             ("tests/test_memory.py::test_flashattentions_varlen_backward_by_hand",)),
    Mutation("a packed pass counted as the padded form's micro-batch", "ablate/memory.py",
             "    return max(cap, longest) if cap else rows * longest\n",
             "    return largest_micro_batch(rows, cap, longest)\n",
             ("tests/test_memory.py::test_a_packed_pass_fits_the_memory_models_micro_batch",)),
    # issue 56: the cheapest sweep that answers a question about recipes
    Mutation("a design's power about the recipes without the spread between runs", "analysis/design.py",
             "    sd_dA = math.sqrt((sds[0] ** 2 + (q.spread_A**2 if recipes else 0.0)) * per_side)\n",
             "    sd_dA = math.sqrt((sds[0] ** 2) * per_side)\n",
             ("tests/test_design_question.py::test_a_designs_power_at_the_recipe_level_is_the_spreads_arithmetic_by_hand",)),
    Mutation("the first design that reaches the power taken for the cheapest", "analysis/design.py",
             "            if d.reaches(q.power) and (best is None or d.gpu_hours < best.gpu_hours):\n",
             "            if d.reaches(q.power) and best is None:\n", ("tests/test_bench_seeds.py",),
             why="rounding the base's seeds down is no mutant: cheapest tries b + 1 where b falls short"),
    Mutation("a design's resolution between these runs with the spread between runs added", "analysis/design.py",
             "resolution=(nine_in_ten * sds[0], ", "resolution=(nine_in_ten * math.sqrt(sds[0] ** 2 + q.spread_A**2), ",
             ("tests/test_design_question.py::test_a_designs_power_at_the_recipe_level_is_the_spreads_arithmetic_by_hand",
              "tests/test_sweeps.py::test_the_dry_run_prints_what_each_design_resolves_from_the_model_its_power_comes_from")),
    Mutation("a new seed's precision without the spread between runs", "analysis/spread.py",
             "    w_v, w_b = 1 / (s_v**2 + spread.sd_A**2), 1 / (s_b**2 + spread.sd_A**2)\n",
             "    w_v, w_b = 1 / s_v**2, 1 / s_b**2\n",
             ("tests/test_close_verdicts.py::test_the_seeds_that_settle_an_open_verdict_at_the_margin_by_hand",)),
    Mutation("extend: the base's more seeds summed over the verdicts, not the most one asks", "ablate/run.py",
             '    base = max((int(r["more_seeds_base"]) for r in rows if r.get("more_seeds_base")), default=0)\n',
             '    base = sum((int(r["more_seeds_base"]) for r in rows if r.get("more_seeds_base")))\n',
             ("tests/test_extend_seeds.py::test_the_seeds_a_report_asks_for_are_planned_as_new_seeds_of_the_same_sweep",)),
    Mutation("the seeds a sweep holds counted as its runs, a forced re-run twice", "ablate/run.py",
             '        signatures.setdefault(tags.get("ablate.variant", ""), set()).add(tags.get("ablate.signature"))\n',
             '        signatures.setdefault(tags.get("ablate.variant", ""), set()).add(run.info.run_id)\n',
             ("tests/test_extend_seeds.py::test_a_re_sweep_without_extend_keeps_the_seeds_the_sweep_holds",)),
    Mutation("a seed of the base counted for one open variant, not every one short", "analysis/seeded.py",
             "        gain_b = float((information(p_v, p_b + w_b) - info)[short].sum()) / hours[1]\n",
             "        gain_b = float((information(p_v, p_b + w_b) - info)[short].max()) / hours[1]\n",
             ("tests/test_seeded.py::test_the_next_seeds_go_where_they_buy_the_most_information_per_gpu_hour_by_hand",)),
    Mutation("the last look leaves an unclaimed verdict open", "analysis/seeded.py",
             "    return SeededLook(0, futile or last, c, times)\n", "    return SeededLook(0, futile, c, times)\n",
             ("tests/test_seeded.py::test_a_look_holds_z_to_the_obrien_fleming_boundary_and_settles_the_futile_by_hand",)),
    Mutation("the report's claims of a seeded variant held to the one-look critical value", "analysis/report.py",
             "else seeded_bound([c.tags for c in variant.curves])", "else None",
             ("tests/test_seeded.py::test_the_report_holds_a_seeded_variants_claims_to_its_last_looks_boundary",)),
    Mutation("a look taken before its share of the information is in", "ablate/seeding.py",
             "        if more:\n            plan = ", "        if False:\n            plan = ",
             ("tests/test_seeding.py::test_the_looks_decide_at_their_boundaries_and_add_the_seeds_the_next_needs_by_hand",)),
    Mutation("the in-run rungs left on in an adaptive sweep with seeds", "ablate/rungs.py",
             'and not sweep.get("extend") and seeds == 1\n', 'and not sweep.get("extend")\n',
             ("tests/test_seeding.py::test_with_several_seeds_no_run_looks_at_its_rungs",)),
    Mutation("the adaptive sweep's looks with seeds held to the one-look critical value", "analysis/seeded.py",
             "    c = boundary(times, alpha) if spend else CRITICAL\n", "    c = CRITICAL\n",
             ("tests/test_bench_seeds.py", "tests/test_seeded.py")),
    Mutation("bench_seeds' real layer fits the mock's noise", "bench/bench_seeds.py",
             "real_noise.real_curve(rng, truth, donors[k % len(donors)], compute=c.compute).reward if real",
             "c.reward if real",
             ("tests/test_bench_seeds.py::test_the_real_layer_gives_each_seed_a_real_runs_noise_not_the_mocks",)),
    Mutation("a SLURM sweep run again with every job in makes no report", "ablate/run.py",
             "        if not new and not alive and cfg.sweep.report and not reported:",
             "        if False:",
             ("tests/test_slurm.py::test_extend_on_slurm_adds_exactly_the_seeds_the_sweeps_report_asks_for",),
             why="a real SLURM cluster (root, Debian's slurm packages): skipped, so not caught, elsewhere"),
]


def scratch_copy(root: Path) -> Path:
    """root's tracked files and the untracked ones git does not ignore, copied into a new temp folder."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode().split("\0")
    dest = Path(tempfile.mkdtemp(prefix="ablate-mutations-"))
    for rel in filter(None, listed):
        src = root / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def run_tests(copy: Path, tests: tuple[str, ...], timeout: int) -> int:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(copy), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", "--no-header", "-rN",
           "--timeout", str(timeout), *tests]
    try:
        return subprocess.run(cmd, cwd=copy, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout + 60).returncode
    except subprocess.TimeoutExpired:
        return 124


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="name the mutations and their tests, run nothing")
    ap.add_argument("--only", action="append", default=[], metavar="NAME", help="run this one (repeatable)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the tree to copy (default: this checkout)")
    ap.add_argument("--before", action="store_true", help="the form before issue 55's tests (see the docstring)")
    ap.add_argument("--baseline", action="store_true", help="first run each mutation's tests unmutated")
    ap.add_argument("--timeout", type=int, default=600, help="seconds a mutation's tests may take")
    a = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if not a.only or m.name in a.only]
    unknown = set(a.only) - {m.name for m in MUTATIONS}
    if unknown:
        ap.error(f"no mutation named {', '.join(sorted(unknown))}: --list names them")
    if a.before:
        chosen = [m for m in chosen if m.before_tests]
    width = max(len(m.name) for m in chosen)
    if a.list:
        for m in chosen:
            print(f"{m.name:<{width}}  {m.file}  {' '.join(m.before_tests if a.before else m.tests)}")
        return 0
    copy = scratch_copy(a.root.resolve())
    failed, started = 0, time.perf_counter()
    try:
        if a.baseline:
            tests = tuple(dict.fromkeys(t for m in chosen for t in (m.before_tests if a.before else m.tests)))
            rc = run_tests(copy, tests, a.timeout * 3)
            said = "pass" if rc == 0 else f"FAIL rc {rc}"
            print(f"{'baseline (no mutation)':<{width}}  {len(tests)} test ids  {said}",
                  flush=True)
            if rc:
                return 1
        for m in chosen:
            file, old, new = (m.before or (m.file, m.old, m.new)) if a.before else (m.file, m.old, m.new)
            tests = m.before_tests if a.before else m.tests
            path = copy / file
            t0 = time.perf_counter()
            text = path.read_text() if path.exists() else ""
            if text.count(old) != 1:
                status = "stale"
            else:
                path.write_text(text.replace(old, new))
                try:
                    rc = run_tests(copy, tests, a.timeout)
                finally:
                    path.write_text(text)
                status = {0: "survived", 1: "caught"}.get(rc, f"error (rc {rc})")
            failed += status != "caught"
            print(f"{m.name:<{width}}  {' '.join(t.removeprefix('tests/') for t in tests)}  {status}  "
                  f"{time.perf_counter() - t0:.0f}s", flush=True)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    print(f"{len(chosen) - failed} of {len(chosen)} caught in {time.perf_counter() - started:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
