"""Wheels for a lent GPU machine that has no network: what the project needs there beyond what its image holds.

Owns the list of what the image holds (IMAGE), the set of wheels that completes it for the project (`base`: the
runtime dependencies at the versions .venv has, so the GPU runs test what CI tests) and the check that every wheel's
needs are met. Run it here, on the CPU machine, with the project's venv:

    .venv/bin/python bench/gpu_wheels.py base --out .whl            # then carry .whl in the device call

docs/testing.md ("On a machine with a GPU and no network") says how the device uses them, with the figures. vLLM has
no set here: its plan (vLLM 0.26 in 17 pieces, one device call each) is retired; vLLM 0.32 on CUDA is first checked
by the cluster's first smoke job (docs/testing.md#where-vllm-on-cuda-is-first-checked).
"""

from __future__ import annotations

import argparse
import email
import importlib.metadata as md
import io
import re
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parent.parent

# The image's Python packages: the device tool's KINDS.md, "Python packages already there" (read on the image
# 2026-11-17), the same for nvidia-h100-x1 and nvidia-h200. Versions only where its "pip list" row (2026-11) or
# shared/notes/gpu-facts.md gives them; the others are taken as they come.
IMAGE = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
xarray xxhash yarl zipp""".split()
IMAGE_VERSIONS = {"accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
                  "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "tokenizers": "0.23.2", "torch": "2.11.0",
                  "torchaudio": "2.11.0", "torchvision": "0.26.0", "transformers": "5.17.0", "triton": "3.6.0"}
# Its Python (3.12.3) on x86-64: the markers and wheel tags the wheels are chosen for. The oldest glibc a wheel may
# ask for is tried first (pip prefers the platforms in the order given): torch's own wheel asks for 2.28.
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
          "platform_machine": "x86_64", "os_name": "posix", "extra": ""}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64",
             "manylinux1_x86_64", *[f"manylinux_2_{n}_x86_64" for n in range(5, 40) if n not in (17, 28)]]
PIP_TARGET = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
              *[arg for p in PLATFORMS for arg in ("--platform", p)]]
SDISTS = {"antlr4-python3-runtime"}  # no wheel of 4.9.3 (what hydra-core 1.3 and omegaconf 2.3 pin)
# the test run's --timeout (pyproject's addopts), where the image lacked it; quicktok-v1, the real vocabularies of
# tests/real_models.py, which gpu_check's CUDA-following step collects (test_precision's Llama-3-shaped folder)
EXTRA_ROOTS = ["pytest-timeout", "quicktok-v1"]
CALL_MIB = 64  # what one device call carries: the working tree and the carried folders together


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def needs(requires: list[str] | None, extra: str = "") -> list[Requirement]:
    """The requirements that hold on the GPU machine's Python: the plain ones, or those an extra adds."""
    reqs = [Requirement(r) for r in requires or []]
    if extra:
        reqs = [r for r in reqs if r.marker is not None and "extra" in str(r.marker)]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({**TARGET, "extra": extra})]


def worth_checking(req: Requirement) -> bool:
    """A need that falls to the image and that it may not meet: a version it is known not to have, or a pin or
    upper bound on a version nobody recorded (`python3 -m pip show NAME` there tells)."""
    have = IMAGE_VERSIONS.get(norm(req.name))
    if have:
        return not req.specifier.contains(have, prereleases=True)
    return any(s.operator in ("==", "===", "<", "<=", "~=") for s in req.specifier)


def walk(roots: list[str], pick) -> tuple[dict[str, str], dict[str, set[str]]]:
    """Every package the roots need on the GPU machine, through the needs of each, less the image's: name ->
    version, `pick(name, specifier) -> (version, requires)` choosing each; and the image's packages worth checking,
    each with the needs on it."""
    pins, requires, specs, notes, seen = {}, {}, {}, {}, set()
    todo = [(Requirement(r), "") for r in roots]
    while todo:
        req, wanter = todo.pop(0)
        name = norm(req.name)
        if name in IMAGE:
            if worth_checking(req):
                notes.setdefault(name, set()).add(f"{req.specifier} ({wanter})")
            continue
        specs[name] = specs.get(name, SpecifierSet()) & req.specifier
        if name not in pins:
            pins[name], requires[name] = pick(name, specs[name])
        for extra in sorted({""} | req.extras):
            if (name, extra) not in seen:
                seen.add((name, extra))
                todo += [(r, f"{name} {pins[name]}") for r in needs(requires[name], extra)]
    refused = [f"{n} {v} (wanted: {specs[n]})" for n, v in pins.items() if not specs[n].contains(v, prereleases=True)]
    if refused:
        sys.exit(f"versions that a need refuses: {', '.join(refused)}")
    return pins, notes


def from_venv(name: str, spec: SpecifierSet) -> tuple[str, list[str]]:
    """The version the running venv has (what CI tests), which must meet `spec`."""
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        sys.exit(f"{name}{spec} is needed on Python 3.12 but {sys.prefix} lacks it: run with the project's venv")
    if not spec.contains(dist.version, prereleases=True):
        sys.exit(f"{name}{spec} is needed but {sys.prefix} has {name} {dist.version}")
    return dist.version, dist.requires or []


def base_roots() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"] + EXTRA_ROOTS


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"], check=True)


def download(pins: dict[str, str], out: Path) -> None:
    """Every pin's wheel into `out`, in one pip call; the sdists are built here (pure Python, so any Python 3 takes
    them)."""
    out.mkdir(parents=True, exist_ok=True)
    pip("download", "--no-deps", *PIP_TARGET, "-d", str(out),
        *[f"{n}=={v}" for n, v in sorted(pins.items()) if n not in SDISTS])
    for name in SDISTS & pins.keys():
        pip("wheel", "--no-deps", "-w", str(out), f"{name}=={pins[name]}")


def wheel_metadata(path: Path | io.BytesIO) -> email.message.Message:
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(z.read(name))


def verify(wheels: list[Path]) -> list[str]:
    """What is wrong with a set of wheels: a name twice in the set, or a need that neither the set nor the image
    meets."""
    problems = []
    metas = [wheel_metadata(w) for w in wheels]
    for name, count in {norm(m["Name"]): sum(norm(n["Name"]) == norm(m["Name"]) for n in metas) for m in metas}.items():
        if count > 1:
            problems.append(f"{name} {count} times")
    have = {norm(m["Name"]): m["Version"] for m in metas}
    for meta in metas:
        for req in needs(meta.get_all("Requires-Dist")):
            name = norm(req.name)
            if name in have and not req.specifier.contains(have[name], prereleases=True):
                problems.append(f"{meta['Name']} needs {req}, the set has {have[name]}")
            elif name not in have and name not in IMAGE:
                problems.append(f"{meta['Name']} needs {req}: neither in the set nor in the image")
    return problems


def tree_mb() -> float:
    """What travels with every call besides the carried folders: tracked and untracked-not-ignored files."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    return sum((ROOT / f).stat().st_size for f in files if f and (ROOT / f).is_file()) / 1e6


def ignore(out: Path) -> None:
    """The folder must be ignored by git, or it would travel with every call."""
    exclude = ROOT / ".git" / "info" / "exclude"
    line = f"/{out.resolve().relative_to(ROOT)}/"
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if line not in lines:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        exclude.write_text("\n".join([*lines, line]) + "\n")


def report(problems: list[str], notes: dict[str, set[str]]) -> None:
    """The check's verdict, then what only the image can tell."""
    print("\n".join(problems) or "every wheel's needs (extras aside) are met by the set or the image")
    for name, wanted in sorted(notes.items()):
        print(f"  check on the image: {name} {IMAGE_VERSIONS.get(name, '(version not recorded)')}, wanted "
              + ", ".join(sorted(wanted)))
    if notes:
        print(f"  there: python3 -m pip list 2>/dev/null | grep -iwE '{'|'.join(sorted(notes)).replace('-', '[-_]')}'")


def base(out: Path) -> None:
    started = time.perf_counter()
    pins, notes = walk(base_roots(), from_venv)
    ignore(out)
    download(pins, out)
    wheels = sorted(out.glob("*.whl"))
    mb = sum(w.stat().st_size for w in wheels) / 1e6
    tree = tree_mb()
    fits = (mb + tree) * 1e6 <= CALL_MIB * 2**20
    print(f"{len(wheels)} wheels, {mb:.1f} MB in {out} ({time.perf_counter() - started:.0f} s); with the working tree "
          f"({tree:.1f} MB) {mb + tree:.1f} MB: {'fits' if fits else 'does NOT fit'} one call ({CALL_MIB} MiB)")
    problems = verify(wheels)
    report(problems, notes)
    print(f"on the device (carry {out.name}): python3 -m pip install -q --no-index --no-deps --no-compile --upgrade "
          f"--target /tmp/site {out.name}/*.whl && export PYTHONPATH=/tmp/site")
    if problems:
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("set", choices=["base"], help="the project's runtime dependencies (vLLM's plan is retired)")
    parser.add_argument("--out", type=Path, required=True, help="a folder in the repo, ignored by git")
    args = parser.parse_args()
    base(args.out if args.out.is_absolute() else Path.cwd() / args.out)


if __name__ == "__main__":
    main()
