"""What the paper reports of its leave-one-out variants (arXiv 2510.13786: Table 1 and the text of its LOO section),
to print beside a sweep's own fits (`beside_cells`), and what of it can be compared (`CAPTION`).

The paper gives numbers in text for ScaleRL (A 0.610, C_mid 2,542 GPU-hours; B 1.92 in Table 1, 2.01 in the LOO
figure) and for one variant's B (DAPO: 1.77); of every other variant it says only that A is within +-0.02 of
ScaleRL's, its Bs being in a figure. Where it says nothing, the table says so rather than read a figure.
"""

from __future__ import annotations

from dataclasses import dataclass

A_SCALERL, B_SCALERL_LOO = 0.610, 2.01  # the LOO's own ScaleRL (its figure's text); Table 1's B is 1.92
WITHIN = "within ±0.02"
FIGURE_ONLY = "a figure only"


@dataclass(frozen=True)
class Published:
    """One variant's A and B as the paper gives them, and their differences from ScaleRL's, in words."""

    A: str
    dA: str
    B: str
    dB: str


PAPER = {
    "scalerl": Published("0.610", "base", "2.01 (Table 1: 1.92)", "base"),
    "loo-dapo": Published("0.59-0.63", WITHIN, "1.77", f"{1.77 - B_SCALERL_LOO:+.2f}"),
    **{name: Published("0.59-0.63", WITHIN, FIGURE_ONLY, FIGURE_ONLY)
       for name in ("loo-savg", "loo-plan", "loo-fp32", "loo-lp", "loo-8op", "loo-batch")},
}
NOT_IN_PAPER = Published("not in the paper", "", "", "")

CAPTION = ("The paper's figures come from another experiment: an 8B dense model on Polaris-53K math, 80 GB200 GPUs a "
           "run (64 generating, 16 training), 16,000 GPU-hours a variant, validated by mean@16 over 1,000 held-out "
           "prompts. Comparable: the direction and rough size of each change against its own base (does reverting "
           "the axis lower A, or only B), and B itself as a shape (rescaling C moves C_mid, not B). Not comparable: "
           "A's value (a pass rate on another model, data and validation set) and C_mid (other hardware and "
           "units). This setup: {setup}.")


def published(label: str) -> Published | None:
    """The paper's numbers for a variant of that name; None for a name that is no LOO variant (not a LOO sweep)."""
    if label in PAPER:
        return PAPER[label]
    return NOT_IN_PAPER if label.startswith("loo-") else None


def setup_of(params: dict) -> str:
    """'model /models/Qwen3-1.7B, task math (/data/polaris.jsonl), generator vllm': a run's setup in words."""
    if not params:
        return "not logged with its runs"
    def given(key: str) -> str:  # MLflow keeps a null as "None"
        value = params.get(key)
        return "" if value in (None, "", "None") else str(value)

    model = given("model.path") or f"the {given('model.name') or '?'} model made in code"
    task = (given("task.name") or "?") + (f" ({given('task.data_path')})" if given("task.data_path") else "")
    return f"model {model}, task {task}, generator {given('generator.name') or '?'}"
