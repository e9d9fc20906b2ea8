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
    assert out.stdout.startswith("0 GPU(s) here: 0 of 5 steps fit")
    assert "FSDP over NCCL + vLLM engine processes" in out.stdout and ">= 3" in out.stdout


def test_the_plan_fits_the_devices_and_every_step_names_what_exists():
    check = _module()
    assert [s.gpus for s in check.plan(1)] == [1, 1, 1, 1] and len(check.plan(4)) == 5 and check.plan(0) == []
    for step in check.STEPS:
        paths = [part for part in step.command if part.startswith(("tests/", "bench/"))]
        assert paths and all((ROOT / p).exists() for p in paths), step.name
