"""SLURM submission on a real single-node cluster (started here, as the tests do; needs root and the packages):
time from `python -m ablate sweep=loo launcher=slurm` to all 9 jobs RUNNING, and the harness's own overhead per job
(composing and signing each variant, pickling it, submitting the array).

    python bench/bench_slurm.py
The jobs are mock runs long enough to be seen RUNNING together (the test cluster oversubscribes its 2 cores).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import slurm_cluster  # noqa: E402


def main() -> None:
    started = time.monotonic()
    cluster = slurm_cluster.start(Path(tempfile.mkdtemp(prefix="slurm-")))
    print(f"cluster up in {time.monotonic() - started:.1f} s")
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, **cluster.env}
    try:
        work = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
        command = [sys.executable, "-m", "ablate", "sweep=loo", "launcher=slurm", "launcher.cpus_per_task=1",
                   "launcher.gpus_per_node=0", "launcher.mem_gb=1", "train.steps=2000"]
        t0 = time.monotonic()
        out = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
        returned = time.monotonic() - t0
        if out.returncode != 0:
            sys.exit(out.stdout + out.stderr)
        all_running = None
        while time.monotonic() - t0 < 120:
            states = cluster.run("squeue", "-h", "-r", "-o", "%T").stdout.split()
            if len(states) == 9 and all(s == "RUNNING" for s in states):
                all_running = time.monotonic() - t0
                break
            time.sleep(0.2)
        timing = re.search(r"harness time: ([\d.]+) s composing and signing (\d+) variants, ([\d.]+) s submitting",
                           out.stdout)
        compose_s, n, submit_s = float(timing.group(1)), int(timing.group(2)), float(timing.group(3))
        pickles = list(work.glob("outputs/tiny/jobs/*/*_submitted.pkl"))
        size = sum(p.stat().st_size for p in pickles) / max(len(pickles), 1)
        print(f"command returned after        {returned:6.2f} s (python start, compose, MLflow runs, sbatch)")
        print(f"all 9 jobs RUNNING after      {all_running:6.2f} s" if all_running else "not all 9 RUNNING in 120 s")
        print(f"per job: compose + sign {compose_s / n * 1e3:6.0f} ms, submit (pickle + sbatch share) "
              f"{submit_s / n * 1e3:5.0f} ms, pickle {size / 1024:.1f} KiB")
    finally:
        cluster.run("scancel", "-u", "root", check=False)
        cluster.stop()


if __name__ == "__main__":
    main()
