"""bench/gpu_wheels.py's base set for a lent GPU: the needs of a wheel are read for the GPU machine's Python, not this
one's; vLLM's wheel plan (0.26 in 17 pieces, one device call each, each finding the machine warm) is retired."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import ROOT


def _module():
    spec = importlib.util.spec_from_file_location("gpu_wheels", ROOT / "bench" / "gpu_wheels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_needs_are_read_for_python_3_12_on_linux_x86_64():
    wheels = _module()
    requires = ['six>=1.16; python_version > "3.11"', 'tomli; python_version < "3.11"',
                'pywin32; sys_platform == "win32"', 'llguidance; platform_machine == "x86_64"',
                'httpx; extra == "standard"']
    assert [str(r) for r in wheels.needs(requires)] == ['six>=1.16; python_version > "3.11"',
                                                        'llguidance; platform_machine == "x86_64"']
    assert [r.name for r in wheels.needs(requires, "standard")] == ["httpx"]


def test_the_vllm_wheel_plan_is_retired_and_base_is_the_one_set(monkeypatch, capsys):
    """No vLLM set, no pieces, no join: `vllm` is refused as a set before anything is resolved or fetched; `base` is
    what the command makes (docs/testing.md#where-vllm-on-cuda-is-first-checked says where vLLM is checked now)."""
    wheels = _module()
    assert not [name for name in ("VLLM", "vllm", "pieces", "commands", "write_pieces", "JOIN", "resolve_vllm")
                if hasattr(wheels, name)]
    made = []
    monkeypatch.setattr(wheels, "base", made.append)
    monkeypatch.setattr(sys, "argv", ["gpu_wheels.py", "vllm", "--out", ".whl-vllm"])
    with pytest.raises(SystemExit) as refused:
        wheels.main()
    assert refused.value.code == 2 and "invalid choice: 'vllm'" in capsys.readouterr().err and made == []
    monkeypatch.setattr(sys, "argv", ["gpu_wheels.py", "base", "--out", ".whl"])
    wheels.main()
    assert [p.name for p in made] == [".whl"] and made[0].is_absolute()
