"""bench/gpu_check.py, the one command for a lent GPU: without one it prints its plan and exits 0 (so CI runs it);
the plan fits the devices it sees."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from conftest import ROOT


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_without_a_gpu_it_prints_its_plan_and_exits_0():
    out = subprocess.run([sys.executable, "bench/gpu_check.py"], cwd=ROOT, capture_output=True, text=True,
                         env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("0 GPU(s) here: 0 of 8 steps fit")
    assert "FSDP over NCCL + vLLM engine processes" in out.stdout and ">= 3" in out.stdout


def test_the_plan_fits_the_devices_and_every_step_names_what_exists():
    check = _module()
    assert [s.gpus for s in check.plan(1, everything=True)] == [1] * 7 and len(check.plan(4, everything=True)) == 8
    assert check.plan(0) == [] and check.plan(4) == check.plan(1) == [s for s in check.STEPS if not s.more]
    for step in check.STEPS:
        paths = [part for part in step.command if part.startswith(("tests/", "bench/"))]
        assert paths and all((ROOT / p).exists() for p in paths), step.name


def test_the_default_plan_and_one_rerun_fit_a_leases_15_minutes():
    """A lent GPU is 15 minutes of device time, the machine's start (1-2 minutes, measured) included: the default
    plan's step limits add up to its budget, the first step (what only a GPU can show) takes at most 3 minutes, and
    the plan run twice, each on a fresh start, fits (before, its limits added up to 990 s against a 540-s budget)."""
    check = _module()
    core = check.plan(1)
    assert core[0].command[1] == "bench/gpu_first.py" and core[0].budget_s <= 180
    assert sum(s.budget_s for s in core) <= check.CORE_S and 2 * (check.CORE_S + 120) <= 15 * 60


def test_each_step_leaves_its_whole_output_in_the_logs_folder_even_when_it_runs_out_of_time(tmp_path):
    check = _module()
    talks = check.Step("talks", 1, 60, (sys.executable, "-c", "print('first'); print('last')"))
    sleeps = check.Step("sleeps", 1, 1, (sys.executable, "-c", "print('before', flush=True); import time; "
                                                                "time.sleep(30)"))
    results = check.run([talks, sleeps], budget_s=60, logs=tmp_path / "logs")
    assert [(r[1], r[3]) for r in results] == [("passed", "last"), ("timed out", "")]
    assert (tmp_path / "logs" / "step-1.log").read_text().endswith("first\nlast\n")
    assert "before" in (tmp_path / "logs" / "step-2.log").read_text()


def test_the_cuda_step_collects_every_file_that_holds_a_test_marked_gpu():
    """Collecting all of tests/ there would need every test extra; so the step names its files, and none is left out."""
    check = _module()
    named = {part for step in check.STEPS if "gpu and not vllm" in step.command for part in step.command
             if part.startswith("tests/")}
    marked = {f"tests/{path.name}" for path in (ROOT / "tests").glob("test_*.py")
              if "mark.gpu" in path.read_text() and path.name not in ("test_vllm.py", "test_gpu_check.py")}
    assert marked and marked <= named, marked - named


def test_a_step_whose_module_is_missing_is_skipped_not_failed():
    check = _module()
    missing = check.Step("needs nothing real", 1, 60, (sys.executable, "-c", "raise SystemExit(5)"),
                         needs="no_such_module_anywhere")
    assert check.run([missing], budget_s=60) == [(missing, "skipped: no no_such_module_anywhere", 0.0, "")]


def test_the_graph_step_runs_vllm_with_cuda_graphs_and_passes_its_environment(tmp_path):
    """Before, the "graphs on" step ran tests that all set enforce_eager=True: no graph was captured. tests/test_vllm.py
    now takes every engine's enforce_eager from conftest.vllm_eager: graphs on CUDA where ABLATE_VLLM_GRAPHS=1, which
    that step alone sets (its engines' own setting: test_vllm.py's
    test_the_engines_capture_cuda_graphs_where_the_graph_step_asks); a step's env and threads reach its process."""
    from conftest import GRAPHS, vllm_eager

    check = _module()
    (graphs,) = [step for step in check.STEPS if "graphs on" in step.name]
    assert dict(graphs.env) == {GRAPHS: "1"} and any("test_vllm.py" in part for part in graphs.command)
    assert vllm_eager("cuda", dict(graphs.env)) is False  # the step's env: graphs captured
    assert vllm_eager("cuda", {}) and vllm_eager("cuda", {GRAPHS: "0"}) and vllm_eager("cpu", {GRAPHS: "1"})
    says = check.Step("says", 1, 60, (sys.executable, "-c", "import os; print(os.environ['ABLATE_VLLM_GRAPHS'], "
                                                            "os.environ['OMP_NUM_THREADS'])"),
                      threads=2, env=(("ABLATE_VLLM_GRAPHS", "1"),))
    assert check.run([says], budget_s=60)[0][3] == "1 2"
