"""docs/first-run.md runs what it shows: its task file and its `RUN` variable, with the page's paths pointed at a
Qwen3-1.7B-shaped folder (the real Qwen3 vocabulary and chat template, no weights) and a Polaris-shaped file of
1,500 problems made here, as the page's output was made; step 3's command prints the page's lines for the prompt,
the data, the stop tokens and the passes warning; step 4's smoke run trains. The e2e lane: the page's commands end to
end (docs/testing.md#markers)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from conftest import run_main
from real_models import save_model

pytestmark = pytest.mark.e2e
PAGE = Path(__file__).resolve().parents[1] / "docs" / "first-run.md"
MODEL, DATA = "/models/Qwen3-1.7B", "/data/polaris.jsonl"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", PAGE.read_text(), re.S)


def _command(text: str, after: str) -> list[str]:
    """The page's indented `python -m ablate $RUN ...` line that starts with `after`, $RUN expanded, as argv."""
    run = re.search(r'^    RUN="(.*)"$', text, re.M).group(1)
    line = next(line.strip() for line in text.splitlines() if line.strip().startswith(after))
    return shlex.split(line.replace("$RUN", run))[3:]  # less `python -m ablate`


@pytest.fixture(scope="module")
def here(tmp_path_factory):
    """A working folder as the page's reader has it: conf/task/polaris.yaml from the page, the model and the file."""
    root = tmp_path_factory.mktemp("first-run")
    model = save_model("qwen3", root / "Qwen3-1.7B", layers=28, hidden=2048, heads=16, kv_heads=8, weights=False)
    config = json.loads((model / "config.json").read_text())  # Qwen3-1.7B's MLP and head width
    (model / "config.json").write_text(json.dumps({**config, "intermediate_size": 6144, "head_dim": 128}))
    lines = [json.dumps({"problem": f"Compute {a} + {a + 7}.", "answer": str(2 * a + 7)}) for a in range(1500)]
    (root / "polaris.jsonl").write_text("\n".join(lines) + "\n")
    (task,) = [b for b in _blocks("yaml") if "prompt_template" in b]
    (root / "conf" / "task").mkdir(parents=True)
    (root / "conf" / "task" / "polaris.yaml").write_text(task.replace(DATA, str(root / "polaris.jsonl")))
    return root


def _paths(argv: list[str], root: Path) -> list[str]:
    return [a.replace(MODEL, str(root / "Qwen3-1.7B")) for a in argv]


def test_step_3_prints_the_pages_prompt_data_stop_tokens_and_passes_warning(here):
    argv = _command(PAGE.read_text(), "python -m ablate $RUN experiment=paper_8b sweep=loo sweep.dry_run")
    assert argv[-3:] == ["experiment=paper_8b", "sweep=loo", "sweep.dry_run=true"]
    out = run_main("-m", "ablate", *_paths(argv, here), cwd=here)
    assert out.returncode == 0, out.stderr
    printed = (out.stdout + out.stderr).replace(str(here / "Qwen3-1.7B"), MODEL).replace(str(here / "polaris.jsonl"),
                                                                                         DATA)
    page = _blocks("text")[0]
    for start in ("stop tokens (", "data (", "model ("):
        shown = next(line for line in page.splitlines() if line.startswith(start)).removesuffix(" ...")
        assert shown in printed, (start, printed)
    # the prompt as the page shows it, less the problem (ours is another): the chat template's turns, no <think>
    shown = next(line for line in page.splitlines() if line.startswith("prompt ("))
    said = next(line for line in printed.splitlines() if line.startswith("prompt ("))
    problem = re.compile(r"Problem: [^<]*<\|im_end\|>|\d+ tokens")
    assert problem.sub("", shown) == problem.sub("", said)
    assert "<think>" not in said
    warned = next(line for line in page.splitlines() if line.startswith("WARNING: each training prompt"))
    assert warned.removesuffix(" ...") in printed


def test_step_4_the_smoke_run_trains_two_steps_into_its_own_experiment(here):
    """The page's smoke run on a 2-layer Qwen3-shaped folder with random weights (the page's folder is cut to 2 layers
    by its command; this one has 2): two steps, a validation, a run in MLflow's 'smoke' experiment."""
    small = save_model("qwen3", here / "Qwen3-small", layers=2, hidden=64, heads=4, kv_heads=2)
    argv = _command(PAGE.read_text(), "python -m ablate $RUN experiment=smoke")
    argv = [a.replace(MODEL, str(small)) for a in argv]
    out = run_main("-m", "ablate", *argv, cwd=here)
    assert out.returncode == 0, out.stderr
    assert "done: 2 steps" in out.stdout and "in experiment 'smoke'" in out.stdout
