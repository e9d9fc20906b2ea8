"""bench/bench_gpu.py on the CPU: its paper-like learner part (today's plan beside the packed one, in one process,
FSDP-wrapped on a 1-rank gloo group, and compiled) runs at toy shapes, its forms agree, each is labelled by its plan
and by the attention that ran (row by row here: varlen has no CPU kernel), and a packed form that falls back to the
row-by-row path where varlen should run fails; the learner part's settings are labelled by their plans; its memory
estimate counts the layers the learner recomputes. gpu_first's learner rows: the same rows three ways."""

from __future__ import annotations

import re
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT


@pytest.fixture
def bench_gpu(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import bench_gpu

    return bench_gpu


def _run(bench_gpu, monkeypatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_gpu.py", "--small", "--device", "cpu", *argv])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # toy matmuls: a second thread only waits on the first (4x slower on a busy machine)
    try:
        bench_gpu.main()
    finally:
        torch.set_num_threads(threads)


PAPER_CELLS = ["efficiency", "s", "tokens_s", "mfu", "peak", "model", "gap", "mean", "max", "changed", "cosine"]


def test_the_paper_forms_run_agree_and_are_labelled_by_their_plans_and_the_attention_that_ran(bench_gpu, monkeypatch,
                                                                                            capsys):
    """Every form prints its row, the packed plan computes no padding where today's does, and in fp32 the packed
    forms' log-probs equal today's within 1e-5 (the issue's bound), their train/logprob_gap to the generator's as
    small, and one step from the same weights changes every sampled weight alike (update cosine ~1). Each row says
    its plan (packed or padded, passes a rank, the most tokens a pass computes) and what attended: SDPA for today's
    padded passes, the row-by-row fall-back for the packed ones (no varlen on a CPU, as the rule says). The compiled
    FSDP form (dynamo's `eager` backend here: inductor would take a minute) agrees with the eager one and says its
    compile's seconds, graphs, graph breaks (one a layer at the fall-back here) and recompiles."""
    import functools

    from ablate import policy, trainer

    monkeypatch.setattr(trainer, "compile_layers", functools.partial(policy.compile_layers, backend="eager"))
    _run(bench_gpu, monkeypatch, "--parts", "paper")
    out = capsys.readouterr().out
    rows = {}
    for name in ("today", "packed", "today, FSDP 1 rank", "packed, FSDP 1 rank", "packed, FSDP, compiled"):
        (line,) = [line for line in out.splitlines() if re.match(rf"{re.escape(name)}\s+(packed|padded): ", line)]
        plan_label, rest = re.match(rf"{re.escape(name)}\s+((?:packed|padded): .*? tokens(?: x <= \d+ rows)?)\s+(.*)$",
                                    line).groups()
        cells = rest.split(maxsplit=len(PAPER_CELLS))
        rows[name] = {"plan": plan_label, **dict(zip([*PAPER_CELLS, "attention"], cells))}
    for name in ("packed", "packed, FSDP 1 rank", "packed, FSDP, compiled"):
        assert float(rows[name]["efficiency"]) == 1.0 and float(rows[name]["gap"]) <= 1e-5
        assert float(rows[name]["mean"]) <= 1e-6 and float(rows[name]["max"]) <= 1e-5
        assert rows[name]["changed"] == "100.00%" and float(rows[name]["cosine"]) >= 0.9999
        assert rows[name]["plan"] == "packed: 2 passes of <= 137 tokens"
        assert re.fullmatch(r"by row: SDPA x\d+ \(varlen: not available on cpu\)", rows[name]["attention"])
    # 8 rows of the law's toy scale: today's cut pads (3 passes of <= 4 rows), the packed plan does not (2 passes)
    assert float(rows["today"]["efficiency"]) < 0.95
    assert rows["today"]["plan"] == "padded: 3 passes of <= 172 tokens x <= 4 rows"
    assert re.fullmatch(r"padded: SDPA x\d+", rows["today"]["attention"])
    for new, old in (("packed", "today"), ("packed, FSDP 1 rank", "today, FSDP 1 rank"),
                     ("packed, FSDP, compiled", "packed, FSDP 1 rank")):
        summary = re.search(rf"^{re.escape(new)} vs {re.escape(old)}: x[\d.]+ tokens/s; log-probs mean \|diff\| "
                            r"(\S+), max (\S+); logprob gap \S+ vs \S+; weights changed 100.00% vs 100.00%, update "
                            r"cosine (\S+); loss (\S+) vs (\S+)$", out, re.M)
        assert summary, out
        assert float(summary[2]) <= 1e-5 and float(summary[3]) >= 0.9999
        assert float(summary[4]) == pytest.approx(float(summary[5]), rel=1e-5)
    compiled = re.search(r"^packed, FSDP, compiled: the first log-prob pass \S+ s and step \S+ s \(compiling\), then "
                         r"\S+ s a step; (\d+) graphs, (\d+) graph breaks.*, (\d+) recompiles", out, re.M)
    assert compiled and int(compiled[1]) > 0 and int(compiled[2]) >= 2  # the fall-back breaks each of the 2 layers


def test_a_packed_form_that_falls_back_to_the_row_by_row_path_where_varlen_should_run_fails(bench_gpu, monkeypatch,
                                                                                          capsys):
    """A silent fall-back must read as a failure, not a slow packed learner: with the rule saying varlen runs here
    (faked on the CPU), the packed form that attended row by row says so in its row and the bench exits 1; today's
    padded form is not concerned."""
    monkeypatch.setattr(bench_gpu, "varlen_expected", lambda device, dtype: True)
    with pytest.raises(SystemExit, match=r"^paper: packed attended as it should not here \(above\)$"):
        _run(bench_gpu, monkeypatch, "--parts", "paper", "--paper-forms", "today,packed")
    out = capsys.readouterr().out
    assert re.search(r"^packed .*  FELL BACK to by row: SDPA x\d+, no varlen: FAILED$", out, re.M)
    assert re.search(r"^today .*  padded: SDPA x\d+$", out, re.M)


def test_the_learner_parts_settings_are_labelled_by_the_plans_the_learner_made(bench_gpu, monkeypatch, capsys):
    """`train.micro_batch_size=8` is 8 rows a pass only padded: packed (a GPU's default) it is one pass of up to
    paper_8b's 65,536 tokens. So each row names the plan as the learner made it: here, on a CPU, padded passes of 8
    rows (32 rows: 4 passes); the plan's label, by hand, for the packed form of the same setting."""
    from ablate import plan

    _run(bench_gpu, monkeypatch, "--parts", "learner", "--forms", "1", "--learner-steps", "1")
    out = capsys.readouterr().out
    row = re.search(r"^train.micro_batch_size=8\s+(padded: 4 passes of <= \d+ tokens x <= 8 rows)\s+.*  "
                    r"padded: SDPA x\d+$", out, re.M)
    assert row, out
    lengths = torch.tensor([700, 650, 600, 500] * 16)
    packed = plan.packed(lengths, torch.ones(64, dtype=torch.bool), 1, 65536, 0.0)
    assert bench_gpu.plan_label(packed) == "packed: 1 pass of <= 39,200 tokens"  # 16 x (700 + 650 + 600 + 500)
    padded = plan.padded(lengths, torch.ones(64, dtype=torch.bool), 1, 65536, 8, 0.0)
    assert bench_gpu.plan_label(padded) == "padded: 8 passes of <= 5,600 tokens x <= 8 rows"  # 8 x 700


class _Medians:
    """A stand-in for numpy's Generator that draws every lognormal at its median, exp(mean), and every integer at the
    range's low end: the law's lengths then follow from its constants alone."""

    def lognormal(self, mean, sigma, size=None):
        import numpy as np

        return np.broadcast_to(np.exp(mean), size if size is not None else np.shape(mean)).astype(float)

    def integers(self, low, high, size=None):
        import numpy as np

        return np.full(size, low)


def test_the_paper_law_is_the_mid_regime_scaled_to_its_cap(bench_gpu, monkeypatch):
    """The law by hand, every draw at its median: a prompt of 250 tokens, a prompt's median 4,000 x 1, thinking at
    that median (under the interruption's budget, 10,240 at least), an answer of 200; at the cap of 8,192 every
    length x 8,192 / 12,288 = 2/3: prompts round(166.67) = 167, completions (4,000 + 200) x 2/3 = 2,800; a cap of
    4,096 x 1/3: 83 and 1,400. Then the real draw (3 prompts x 16, seed 0): a smaller cap scales the same draw:
    every completion under both caps is the same length to rounding, cut at the cap."""
    import numpy as np

    with monkeypatch.context() as patch:
        patch.setattr(np.random, "default_rng", lambda *_: _Medians())
        for cap, (p, c) in ((8192, (167, 2800)), (4096, (83, 1400))):
            prompt, completion = bench_gpu.paper_lengths(3, 16, cap)
            assert prompt.tolist() == [p] * 48 and completion.tolist() == [c] * 48, cap
    prompt, completion = bench_gpu.paper_lengths(3, 16, 8192)
    assert int(completion.max()) == 8192 and int(completion.min()) >= 1 and (prompt >= 1).all()
    assert 1000 < float(completion.double().median()) < 8192  # the mid regime: thousands of tokens, some cut
    assert (prompt.view(3, 16) == prompt.view(3, 16)[:, :1]).all()  # a prompt's samples share it
    half_prompt, half = bench_gpu.paper_lengths(3, 16, 4096)
    assert int(half.max()) == 4096
    inside = completion < 8192
    assert ((half[inside] - completion[inside] / 2).abs() <= 1).all()


def test_the_memory_estimate_counts_the_layers_the_learner_recomputes(bench_gpu):
    """train.activation_checkpointing as a count recomputes that many layers: each keeps 4 x hidden bytes a token
    instead of its whole set (ablate/memory.py), so the estimate falls by tokens x k x (set - 4h). Before, the
    estimate took bool() of the setting, and a count read as every layer; auto, with no GPU to fit, is none."""
    from ablate import memory
    from ablate.checks import model_shape

    args = SimpleNamespace(small=True, dtype="", device="cpu")
    ro = bench_gpu._rollouts(4, 16, 64, 4096)
    tokens = 4 * (16 + int(ro.lengths.max()))  # one micro-batch: the 4 rows padded to the longest

    def estimate(setting) -> float:
        cfg = bench_gpu._config(args, "train.micro_batch_size=1024", "train.micro_batch_tokens=0",
                                f"train.activation_checkpointing={setting}")
        return bench_gpu.estimate_bytes(cfg, ro)

    cfg = bench_gpu._config(args)
    shape = model_shape(cfg.model)
    per_layer = memory.layer_activation_bytes(shape, 4) - 4 * shape.hidden  # fp32 compute (SMALL)
    none, every = estimate("false"), estimate("true")
    assert shape.layers == 4 and every < none
    for k in (1, 3):
        assert estimate(k) == pytest.approx(none - tokens * k * per_layer, rel=1e-12)
    assert estimate("auto") == none
    with pytest.raises(ValueError, match=r"train.activation_checkpointing=9: true, false, auto or a count of decoder "
                                         r"layers from 0 to the model's 4"):
        estimate(9)


def test_todays_learner_runs_todays_plan(bench_gpu):
    """The `today` forms plan as the learner did before ablate/plan.py: rows dealt round robin by length (rank 0: 50,
    30, 10 tokens; rank 1: 40, 20, 5), each rank's cut at 2 rows and 80 padded tokens (50 + 30 pads to 100: apart;
    30 + 10 to 60; 40 + 20 to 80; then the row cap)."""
    lengths = torch.tensor([50, 40, 30, 20, 10, 5])
    learner = SimpleNamespace(ranks=SimpleNamespace(world=2), micro_tokens=80, micro_batch=2, attention=0.0)
    planned = bench_gpu.TodayLearner.step_plan(learner, lengths, torch.ones(6, dtype=torch.bool))
    assert planned.form == "padded" and planned.passes == [[[0], [2, 4]], [[1, 3], [5]]]


def test_a_form_that_raises_is_a_row_and_the_others_still_run(bench_gpu, monkeypatch, capsys):
    """On a lent GPU one call has to show every form it can: a form that fails (a kernel the image's torch lacks) is
    named in its row, the next form still runs, and the bench exits 1; an unknown form is refused before any model
    is built."""
    class Broken(bench_gpu.Learner):
        def __init__(self, *args, **kwargs):
            raise TypeError("varlen_attn() got an unexpected keyword argument 'enable_gqa'\nmore")

    monkeypatch.setitem(bench_gpu.PAPER_FORMS, "packed", ("packed", Broken, True, False, False))
    monkeypatch.setattr(sys, "argv", ["bench_gpu.py", "--small", "--device", "cpu", "--parts", "paper",
                                      "--paper-forms", "packed,today"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(SystemExit, match=r"^paper: packed raised \(above\)$"):
            bench_gpu.main()
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    said = r"^packed\s+raised TypeError: varlen_attn\(\) got an unexpected keyword argument 'enable_gqa'$"
    assert re.search(said, out, re.M)
    assert re.search(r"^today\s+padded: 3 passes of <= 172 tokens x <= 4 rows\s+0\.885\s", out, re.M)
    monkeypatch.setattr(sys, "argv", ["bench_gpu.py", "--small", "--parts", "paper", "--paper-forms", "today,fast"])
    with pytest.raises(SystemExit, match=r"^--paper-forms: fast: none of today, packed, today-fsdp, packed-fsdp, "
                                         r"packed-fsdp-compiled$"):
        bench_gpu.main()


@pytest.fixture
def gpu_first(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import gpu_first

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield gpu_first
    torch.set_num_threads(threads)


def test_gpu_firsts_learner_rows_are_the_same_rows_three_ways_each_labelled_by_its_plan(gpu_first):
    """Before, "ours and plain transformers on the same micro-batches" compared ours packed with plain transformers
    on padded ones. Now: ours packed (its plan), ours padded, and plain transformers on ours padded's very passes,
    each row naming its plan and the attention that ran (row by row for the packed form on a CPU)."""
    checks = gpu_first.Checks()
    gpu_first.learner_speed(checks, torch.device("cpu"), small=True)
    cases = [(case, figure) for part, case, figure, _ in checks.rows if part == "learner"]
    assert len(cases) == 3, checks.rows
    (packed, packed_said), (padded, padded_said), (plain, plain_said) = cases
    assert re.match(r"ours, packed: \d+ pass(es)? of <= [\d,]+ tokens; 16 rows <= 256", packed)
    passes = int(re.match(r"ours, padded: (\d+) passes of <= [\d,]+ tokens x <= \d+ rows; 16 rows", padded)[1])
    assert plain.startswith(f"plain transformers (sdpa), ours padded's {passes} passes; 16 rows")
    assert packed_said.endswith("by row: SDPA x32 (varlen: not available on cpu)")  # 16 rows x 2 layers
    # a call a pass a layer (autocast's re-dispatch of SDPA counted once)
    assert padded_said.endswith(f"padded: SDPA x{2 * passes}") and plain_said.endswith(f"padded: SDPA x{2 * passes}")
    assert checks.ok


def test_sdpa_is_held_to_one_kernel_only_where_it_runs(gpu_first):
    """A packed pass (bf16 on CUDA) makes no SDPA call: forcing FlashAttention there constrained nothing, so no
    SDPA backend is forced; a padded pass's SDPA is held to FlashAttention (bf16) or the memory-efficient kernel."""
    import contextlib

    cuda = torch.device("cuda")  # a device name only: nothing runs on it
    assert isinstance(gpu_first._kernel(cuda, "bfloat16", packed=True), contextlib.nullcontext)
    assert not isinstance(gpu_first._kernel(cuda, "bfloat16", packed=False), contextlib.nullcontext)
    assert not isinstance(gpu_first._kernel(cuda, "float32", packed=False), contextlib.nullcontext)
    assert isinstance(gpu_first._kernel(torch.device("cpu"), "float32", packed=False), contextlib.nullcontext)
