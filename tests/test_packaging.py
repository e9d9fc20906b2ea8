"""The config tree ships inside the package: the same commands work from a built wheel as from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, run_cli


@pytest.mark.e2e  # pip builds the wheel, a fresh process runs from it: CI's e2e lane (docs/testing.md#markers)
def test_a_built_wheel_carries_the_config_tree_and_runs_from_it(tmp_path: Path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(ROOT),
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("ablate-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("ablate/conf/")}
    in_repo = {"ablate/conf/" + str(p.relative_to(ROOT / "conf")) for p in (ROOT / "conf").rglob("*.yaml")}
    assert in_repo and in_repo <= shipped
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "ablate").rglob("*.py")}
    assert modules <= names, f"not in the wheel: {sorted(modules - names)}"  # every subpackage ships
    assert "ablate/tasks/data/math_sample.jsonl" in names  # task=math's sample

    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    # before the editable install on sys.path (and before any PYTHONPATH the dependencies are installed on)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]))}
    where = run_cli("-c", "import ablate.conf; print(ablate.conf.__file__)", cwd=tmp_path, env=env)
    assert where.stdout.strip().startswith(str(tmp_path / "site")), where
    out = run_cli("-m", "ablate", "sweep=loo", "sweep.dry_run=true", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert "loo-batch" in out.stdout and "9 variants" in out.stdout


def test_no_module_shares_its_name_with_a_folder_beside_it():
    """One name per thing: no module beside a folder of its name (task=math's reader of records,
    ablate/tasks/records.py, once had the name of the folder beside it that ships its sample)."""
    shared = [str(p.relative_to(ROOT)) for package in ("ablate", "launch", "analysis")
              for p in sorted((ROOT / package).rglob("*.py")) if p.with_suffix("").is_dir()]
    assert shared == [], f"a module and a folder of one name: {shared}"
    assert (ROOT / "ablate" / "tasks" / "data" / "math_sample.jsonl").is_file()


def _toml(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())


def test_the_analysis_alone_pins_what_ablate_pins_and_ships_the_same_data():
    """packaging/analysis builds the package `analysis` on its own (no torch, vLLM or transformers): each of its
    dependencies is written as ablate's own pyproject writes it, and it ships the same data files."""
    ours, alone = _toml(ROOT / "pyproject.toml"), _toml(ROOT / "packaging" / "analysis" / "pyproject.toml")
    pinned = set(ours["project"]["dependencies"])
    assert set(alone["project"]["dependencies"]) <= pinned, set(alone["project"]["dependencies"]) - pinned
    assert alone["project"]["optional-dependencies"]["tensorboard"] == ours["project"]["optional-dependencies"][
        "tensorboard"]
    assert alone["tool"]["setuptools"]["package-data"]["analysis"] == ours["tool"]["setuptools"]["package-data"][
        "analysis"]
    assert alone["tool"]["setuptools"]["package-dir"]["analysis"] == "../../analysis"
    heavy = {"torch", "transformers", "vllm", "trl", "hydra-core", "submitit", "datasets"}
    names = {dep.split("=")[0].split(">")[0].split("<")[0].split("[")[0] for dep in alone["project"]["dependencies"]}
    assert not names & heavy


@pytest.mark.e2e  # pip builds the wheel: CI's e2e lane; .ci/run installs it alone in a venv and reports a file
def test_the_analysis_wheel_carries_every_module_and_its_data(tmp_path: Path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    str(ROOT / "packaging" / "analysis"), "-w", str(tmp_path / "dist")], check=True,
                   capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("ablate_analysis-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "analysis").glob("*.py")}
    data = {str(p.relative_to(ROOT)) for p in (ROOT / "analysis" / "data").rglob("*") if p.is_file()}
    assert modules <= names and data <= names, sorted((modules | data) - names)
    assert not any(n.startswith(("ablate/", "launch/")) for n in names)
