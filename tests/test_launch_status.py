"""`python -m launch status`'s table: the numbers it prints (the jobs' states are tests/test_launch_local.py's and
tests/test_slurm.py's)."""

from pathlib import Path

from launch.status import Row, number, render


def test_numbers_keep_three_significant_digits_so_tiny_gpu_hours_show():
    # a tiny run's compute is a few ten-thousandths of a GPU-hour (1.4 s of one CPU: 0.0004): ",.3f" printed 0.000
    assert [number(x) for x in (0.0000685, 0.000116, 0.0004, 0.00512, 0.5, 0.95, 1.0, 12.34, 99.96, 2542.4, 0.0)] == \
        ["0.0000685", "0.000116", "0.000400", "0.00512", "0.500", "0.950", "1.00", "12.3", "100", "2,542", "0"]


def test_the_status_table_shows_a_tiny_runs_gpu_hours():
    manifest = {"cluster": "local", "metrics": ["val/pass_rate", "compute/gpu_hours"]}
    table = [Row("scalerl", "123", "completed", "FINISHED", 8, {"val/pass_rate": 0.75, "compute/gpu_hours": 0.000731}),
             Row("loo-dapo", "124", "running", "RUNNING", 3, {"compute/gpu_hours": 0.0000685})]
    lines = render(Path("outputs/tiny/jobs/loo-807177/manifest.json"), manifest, table).splitlines()
    assert lines[0] == "sweep loo-807177 (local), manifest outputs/tiny/jobs/loo-807177/manifest.json"
    assert lines[1].split() == ["variant", "job", "state", "run", "step", "val/pass_rate", "compute/gpu_hours"]
    assert lines[2].split() == ["scalerl", "123", "completed", "FINISHED", "8", "0.750", "0.000731"]
    assert lines[3].split() == ["loo-dapo", "124", "running", "RUNNING", "3", "0.0000685"]  # not 6.85e-05
