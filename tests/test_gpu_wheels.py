"""bench/gpu_wheels.py's pieces for a lent GPU: every piece under the limit, and the device's join command gives back
each wheel byte for byte; the needs of a wheel are read for the GPU machine's Python, not this one's."""

from __future__ import annotations

import importlib.util
import os
import subprocess

from conftest import ROOT


def _module():
    spec = importlib.util.spec_from_file_location("gpu_wheels", ROOT / "bench" / "gpu_wheels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pieces_stay_under_the_limit_and_join_back_byte_for_byte(tmp_path):
    wheels = _module()
    sizes = {"a.whl": 2500, "b.whl": 999, "c.whl": 1000, "d.whl": 10}
    src, out, device = tmp_path / "src", tmp_path / "out", tmp_path / "device"
    src.mkdir()
    for name, size in sizes.items():
        (src / name).write_bytes(os.urandom(size))
    plan = wheels.pieces(sizes, limit=1000)
    # by hand, largest first: a as 1000 + 1000 + 500, c alone, b (999) finds no room left, d (10) fills a's tail
    assert [[(name, length) for name, _, length in piece] for piece in plan] == [
        [("a.whl", 1000)], [("a.whl", 1000)], [("a.whl", 500), ("d.whl", 10)], [("c.whl", 1000)], [("b.whl", 999)]]
    wheels.write_pieces(plan, sizes, src, out, limit=1000)
    assert sorted(p.name for p in out.iterdir()) == ["01", "02", "03", "04", "05"]
    assert all(sum(f.stat().st_size for f in folder.iterdir()) <= 1000 for folder in out.iterdir())
    device.mkdir()
    for folder in sorted(out.iterdir()):  # one call each, into the same folder on the device
        for f in folder.iterdir():
            (device / f.name).write_bytes(f.read_bytes())
    subprocess.run(["bash", "-c", wheels.JOIN], cwd=device, check=True)
    assert sorted(p.name for p in device.iterdir()) == sorted(sizes)
    assert all((device / name).read_bytes() == (src / name).read_bytes() for name in sizes)


def test_the_last_call_joins_installs_and_drops_the_replaced_metadata():
    wheels = _module()
    commands = wheels.commands([[("v.whl", 0, 5)], [("v.whl", 5, 3)]], ".whl-vllm", {"fastapi": "0.165.0"})
    assert commands[0] == "mkdir -p /tmp/vllm-parts && cp .whl-vllm/01/* /tmp/vllm-parts/ && ls /tmp/vllm-parts | wc -l"
    assert commands[1].startswith("mkdir -p /tmp/vllm-parts && cp .whl-vllm/02/* /tmp/vllm-parts/")
    assert wheels.JOIN in commands[1] and "--target /tmp/site *.whl" in commands[1]
    assert commands[1].endswith("&& rm -rf /tmp/site/fastapi-0.165.0.dist-info")
    assert all(len(c) <= 2000 for c in commands)  # the device tool's limit on a command


def test_needs_are_read_for_python_3_12_on_linux_x86_64():
    wheels = _module()
    requires = ['six>=1.16; python_version > "3.11"', 'tomli; python_version < "3.11"',
                'pywin32; sys_platform == "win32"', 'llguidance; platform_machine == "x86_64"',
                'httpx; extra == "standard"']
    assert [str(r) for r in wheels.needs(requires)] == ['six>=1.16; python_version > "3.11"',
                                                        'llguidance; platform_machine == "x86_64"']
    assert [r.name for r in wheels.needs(requires, "standard")] == ["httpx"]
