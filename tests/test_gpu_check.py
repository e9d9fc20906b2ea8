"""bench/gpu_check.py, the one command for a lent GPU: without one it prints its plan and exits 0 (so CI runs it);
the plan fits the devices it sees, the default plan fits one device call and a lease with a rerun, `--all` cuts
every step into device calls, `--steps` runs those named. Its first steps' code (bench/gpu_first.py's `varlen` and
`compiled` parts) on the CPU: varlen absent, the row-by-row path is what ran and is counted; torch's varlen run here
through its own op on CPU kernels (tests/varlen_cpu.py), called with 2.10's, 2.11's and 2.13's signatures."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from varlen_cpu import cpu_varlen, varlen_2_10, varlen_2_11  # noqa: F401 - cpu_varlen: a fixture (usefixtures)


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
    assert out.stdout.startswith("0 GPU(s) here: 0 of the 5 steps of the default plan fit")
    assert "FSDP over NCCL + vLLM engine processes" in out.stdout and ">= 3" in out.stdout
    assert "--all on 1 GPU: 1260 s in 3 calls of at most 540 s" in out.stdout


def test_the_plan_fits_the_devices_and_every_step_names_what_exists():
    check = _module()
    assert [s.gpus for s in check.plan(1, everything=True)] == [1] * 10 and len(check.plan(4, everything=True)) == 11
    assert check.plan(0) == [] and check.plan(4) == check.plan(1) == [s for s in check.STEPS if not s.more]
    for step in check.STEPS:
        paths = [part for part in step.command if part.startswith(("tests/", "bench/"))]
        assert paths and all((ROOT / p).exists() for p in paths), step.name


def test_the_default_plan_runs_the_new_code_first_in_one_call_that_a_lease_holds_with_a_rerun():
    """One device call stops at 600 s, of which 540 for the steps; a lease is 15 minutes of device time, the
    machine's start (1-2 minutes) included. The default plan is one call, and its start, itself and a rerun of its
    longest step fit the lease. It runs the packed learner first: the varlen check, the paper-like step's packed,
    per-row, FSDP-packed and FSDP-packed-compiled forms, the compiled packed step. Before, the default plan began
    with the padded learner's checks and ran nothing of `bench_gpu.py --parts paper` nor of run.compile_layers."""
    check = _module()
    core = check.plan(1)
    total = sum(s.budget_s for s in core)
    assert check.CALL_S == 540 and total <= check.CALL_S
    assert check.START_S >= 120 and check.START_S + total + max(s.budget_s for s in core) <= 15 * 60
    varlen, paper, compiled = (" ".join(s.command[1:]) for s in core[:3])
    assert varlen == "bench/gpu_first.py --parts varlen" and compiled == "bench/gpu_first.py --parts compiled"
    assert paper.startswith("bench/bench_gpu.py --parts paper --paper-forms packed,today,packed-fsdp,"
                            "packed-fsdp-compiled ")


def test_all_cuts_every_step_into_device_calls_of_at_most_540_s():
    """Before, --all ran every step under the default plan's 330-s budget (the learner bench killed at 18 s, the
    rest skipped) and its one-GPU limits added up to 960 s against a call's 600: now it cuts them into calls, in
    order, each within 540 s, each printed as the --steps command that runs it."""
    check = _module()
    for gpus in (1, 3):
        steps = check.plan(gpus, everything=True)
        cut = check.calls(steps)
        assert [s for call in cut for s in call] == steps and len(cut) >= 3
        assert all(sum(s.budget_s for s in call) <= 540 for call in cut)
        assert cut[0] == check.plan(gpus)  # the first call is the default plan
        for call, line in zip(cut, check.call_lines(steps)):
            named = re.search(r"python bench/gpu_check.py --steps ([\d,]+)$", line)[1]
            assert check.chosen(named) == call, line
    # by hand, limits of 300, 200, 100, 500, 60 s in order: 300 + 200 = 500, + 100 would pass 540; 100 + 500 would
    # too; 500 + 60 = 560 would: four calls
    steps = [check.Step(f"s{t}", 1, t, ("x",)) for t in (300, 200, 100, 500, 60)]
    assert [[s.budget_s for s in call] for call in check.calls(steps)] == [[300, 200], [100], [500], [60]]


def test_steps_runs_the_steps_named_with_their_own_limits_and_all_prints_the_calls(monkeypatch, capsys):
    """On a (faked) one-GPU machine: --steps 6-8 runs steps 6, 7 and 8 with a budget of their limits added up (485 s,
    not the default plan's); --steps 11 (3 GPUs) is skipped, said so; --all runs nothing and prints its calls,
    leaving out the steps whose module is missing here; an unknown step is refused."""
    check = _module()
    ran = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(check, "run", lambda steps, budget, logs=None: ran.append((steps, budget)) or
                        [(s, "passed", 1.0, "ok") for s in steps])
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--steps", "6-8,11"])
    assert check.main() == 0
    assert ran == [(list(check.STEPS[5:8]), 95 + 150 + 240)]
    out = capsys.readouterr().out
    assert re.search(r"^11\s+FSDP over NCCL.*skipped: needs 3 GPUs", out, re.M)
    ran.clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else object())
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--all"])
    assert check.main() == 0 and ran == []
    out = capsys.readouterr().out
    assert "left out, their module missing here: steps 9 (no vllm), 10 (no vllm)" in out
    assert re.findall(r"--steps (\S+)$", out, re.M) == ["1,2,3,4,5", "6,7,8"]
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--steps", "4,12"])
    with pytest.raises(SystemExit, match=r"no step 12 \(1 to 11\)"):
        check.main()


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


# ---------------------------------------------------------------- the default plan's first steps, on the CPU
@pytest.fixture
def first(monkeypatch):
    """bench/gpu_first.py, imported as gpu_check's steps run it (bench/ on the path)."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import gpu_first

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # toy shapes: a second thread only waits on the first
    yield gpu_first
    torch.set_num_threads(threads)


def _rows(checks) -> dict[str, tuple[str, str]]:
    return {f"{part}: {case}": (figure, verdict) for part, case, figure, verdict in checks.rows}


def test_the_varlen_check_on_a_cpu_says_varlen_is_not_available_and_counts_the_by_row_path(first):
    """No varlen kernel on a CPU: the check says so, times SDPA row by row against fp32 (one SDPA call a row, 4),
    and the learner's packed attention (2 layers, 3 rows) is counted as what ran: row by row, 6 SDPA calls, no
    varlen, as the project's rule says for a CPU: passed."""
    checks = first.Checks()
    first.varlen_kernels(checks, torch.device("cpu"), small=True)
    rows = _rows(checks)
    case = "4 rows, 120 tokens (<= 60), 4/2 heads x 16, float32"
    assert rows[f"varlen: {case}"] == ("varlen: not available on cpu", "-")
    figure, verdict = rows[f"varlen: by row: {case}"]
    assert verdict == "ok" and figure.endswith("varlen x0 (backward x0), SDPA x4")
    assert rows["varlen: the learner's packed attention, float32, 3 rows, 2 layers"] == (
        "by row: SDPA x6 (varlen: not available on cpu)", "ok")
    assert checks.ok


@pytest.mark.parametrize("version", ["2.10", "2.11", "2.13"])
@pytest.mark.usefixtures("cpu_varlen")
def test_the_varlen_check_calls_each_torchs_varlen_as_its_signature_takes_it(first, monkeypatch, version):
    """torch's varlen run on the CPU through its own op (tests/varlen_cpu.py), the kernel made available: 2.10's
    `is_causal=True`; 2.11's `window_size=(-1, 0)` as a tuple and no scale; 2.13's (this torch's own function)
    `enable_gqa=True` for grouped K/V alone. Grouped, repeated and by row agree with fp32 (here fp32 themselves),
    and each varlen form's op is counted once forward, once backward."""
    import functools

    calls = []
    real = first._varlen_attn()

    @functools.wraps(real)  # its signature, which the check reads
    def varlen_2_13(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    stand_in = {"2.10": varlen_2_10(calls), "2.11": varlen_2_11(calls), "2.13": varlen_2_13}[version]
    monkeypatch.setattr(first, "varlen_here", lambda device: True)
    monkeypatch.setattr(first, "_varlen_attn", lambda: stand_in)
    checks = first.Checks()
    first.varlen_kernels(checks, torch.device("cpu"), small=True)
    rows = _rows(checks)
    for form in ("grouped", "repeated"):
        figure, verdict = rows[f"varlen: {form}: 4 rows, 120 tokens (<= 60), 4/2 heads x 16, float32"]
        assert verdict == "ok" and figure.endswith("varlen x1 (backward x1), SDPA x0"), figure
        assert float(re.search(r"error vs fp32 (\S+)", figure)[1]) < 1e-5
    want = {"2.10": ({"is_causal": True},) * 2,
            "2.11": ({"window_size": (-1, 0), "scale": None},) * 2,
            "2.13": ({"window_size": (-1, 0), "enable_gqa": True}, {"window_size": (-1, 0)})}[version]
    assert (calls[0], calls[5]) == want  # grouped, then repeated: 5 calls a form (warm-up, 3 timed, 1 profiled)
    assert all(type(c.get("window_size", ())) is tuple for c in calls)


@pytest.mark.usefixtures("cpu_varlen")
def test_a_varlen_that_loses_causality_fails_the_check(first, monkeypatch):
    """Negative control: 2.11's wrapper given its window as a list (causality silently off) attends to later tokens:
    the varlen forms' error against the causal fp32 reference is far past SDPA by row's, and the check fails."""
    monkeypatch.setattr(first, "varlen_here", lambda device: True)
    monkeypatch.setattr(first, "_varlen_attn", lambda: varlen_2_11([], as_list=True))
    checks = first.Checks()
    first.varlen_kernels(checks, torch.device("cpu"), small=True)
    verdicts = {case.split(":")[1].strip(): verdict for case, (_, verdict) in _rows(checks).items()}
    assert verdicts["grouped"] == verdicts["repeated"] == "FAILED" and not checks.ok


@pytest.mark.usefixtures("cpu_varlen")
def test_a_packed_pass_that_falls_back_to_the_row_by_row_path_where_varlen_should_run_fails(first, monkeypatch):
    """Where the project's rule says varlen runs (faked here: the rule made true on the CPU), the learner's packed
    attention that ran row by row is a failure, not a slow result; routed to torch's varlen (the fall-back replaced
    by `_varlen`, the op on CPU kernels), it is counted, forward and backward, a call a layer: passed."""
    import bench_gpu

    from ablate import policy

    monkeypatch.setattr(bench_gpu, "varlen_expected", lambda device, dtype: True)
    checks = first.Checks()
    first.packed_attention(checks, torch.device("cpu"), small=True)
    assert checks.rows[-1][2:] == ("FELL BACK to by row: SDPA x6, no varlen", "FAILED") and not checks.ok
    monkeypatch.setattr(policy, "_by_row", policy._varlen)
    checks = first.Checks()
    first.packed_attention(checks, torch.device("cpu"), small=True)
    assert checks.rows[-1][2:] == ("varlen x2 (backward x2)", "ok") and checks.ok


@pytest.mark.usefixtures("cpu_varlen")
def test_the_compiled_packed_step_counts_its_graphs_breaks_recompiles_loss_and_varlen(first, monkeypatch):
    """The compiled packed learner beside the eager one on the CPU (dynamo's `eager` backend for the compiler, the
    packed attention routed to torch's varlen op on CPU kernels, as on a GPU): the same losses, one graph for the
    two layers (they share their code), no graph break and no recompile over 4 steps of new lengths, varlen counted
    in a compiled step."""
    import functools

    import bench_gpu

    from ablate import policy, trainer

    monkeypatch.setattr(trainer, "compile_layers", functools.partial(policy.compile_layers, backend="eager"))
    monkeypatch.setattr(policy, "_by_row", policy._varlen)
    monkeypatch.setattr(bench_gpu, "varlen_expected", lambda device, dtype: True)
    monkeypatch.setattr(first, "varlen_expected", lambda device, dtype: True)
    checks = first.Checks()
    first.compiled_step(checks, torch.device("cpu"), small=True)
    rows = _rows(checks)
    assert rows["compiled: dynamo"] == ("1 graphs, 0 graph breaks, 0 recompiles", "ok")
    figure, verdict = rows["compiled: loss against eager, 4 steps"]
    assert verdict == "ok" and figure.startswith("largest |difference| 0.00e+00")
    assert rows["compiled: attention in a compiled step"] == ("varlen x2 (backward x2)", "ok")
    assert re.match(r"compile \S+ s \(first step \S+ s\), steady \S+ s against eager \S+ s$",
                    rows["compiled: packed, 2 layers, 6 rows <= 96 a step, float32"][0])
