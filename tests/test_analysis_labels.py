"""The names a report shows (analysis/labels.py, analysis/plots.py): each variant by the part of its name that
differs, derived by hand on real-looking run names; `--label` full and by pattern; the A/B plot's panels and the
overview's titles measured on the figures themselves with 70-character names; a report of such runs made with no
library warning."""

from __future__ import annotations

import csv
import warnings

import numpy as np
import pytest

from analysis.__main__ import main
from analysis.fit import fit_sigmoid
from analysis.labels import LabelError, labels_for, labels_line, short_labels
from analysis.plots import fitted, overview_figure, params_figure
from analysis.runs import RunCurve

# as a run is named in the wild (the example), each 70 characters: method, lambda, the launch's stamp
NAMES = [f"Qwen2.5-0.5B-Instruct-GSM8K-{method}-sp-p1-b8-gamma2.0-lam{lam}-0116{1659 + i}-end"
         for i, (method, lam) in enumerate([("GRPO", "0.1"), ("CRPO", "0.1"), ("CRPO", "0.3"), ("DAPO", "0.1"),
                                            ("GSPO", "0.1"), ("CISP", "0.1")])]


def test_the_part_of_each_name_that_differs_by_hand():
    assert {len(name) for name in NAMES} == {70}
    # dropped: the shared first words (Qwen2.5 0.5B Instruct GSM8K) and last (end), the words all hold (sp p1 b8
    # gamma2.0), the launch stamps (01161659...); kept: the method and lambda, which tell the variants apart
    assert list(short_labels(NAMES).values()) == ["GRPO-lam0.1", "CRPO-lam0.1", "CRPO-lam0.3", "DAPO-lam0.1",
                                                  "GSPO-lam0.1", "CISP-lam0.1"]
    # a stamp is the only difference between two seeds' names: kept, or the two would be one label
    assert short_labels(["a-very-long-run-name-of-ours-0116", "a-very-long-run-name-of-ours-0117"]) == {
        "a-very-long-run-name-of-ours-0116": "0116", "a-very-long-run-name-of-ours-0117": "0117"}
    # one name is the others' prefix: its last word stays, so no label is empty
    assert short_labels(["my-long-experiment-name-base", "my-long-experiment-name-base-lr2"]) == {
        "my-long-experiment-name-base": "base", "my-long-experiment-name-base-lr2": "base-lr2"}
    # the words that differ may come first, and a name's own first separator never shows
    assert list(short_labels(["GRPO-experiment-number-one-shared", "DAPO-experiment-number-one-shared"]).values()) \
        == ["GRPO", "DAPO"]
    # where dropping every shared word would leave a label empty, the shared start and end go, as many words as keep
    # each label its own: 3 of the start and 2 of the end (or 4 and 1, as many: the end's go first)
    assert list(short_labels(["shared-prefix-words-base-tail-end", "shared-prefix-words-base-lr2-tail-end"]).values()) \
        == ["base", "base-lr2"]
    # a difference in the second word only, the words around it shared: not skipped over
    assert list(short_labels(["x-alpha-y-long-shared-tail", "x-beta-y-long-shared-tail"]).values()) == ["alpha", "beta"]
    # the negative control: short names (ablate's own, a learning rate's, names of exactly 24 characters, one name)
    # are shown as they are, shared words and all
    for names in (["lr-1e-3", "lr-3e-3"], ["abcdefghij-klmnopqrst-01", "abcdefghij-klmnopqrst-02"], [NAMES[0]]):
        assert short_labels(names) == {name: name for name in names}
    assert short_labels(["scalerl", "loss=dapo", "agg=sample"]) == {
        "scalerl": "scalerl", "loss=dapo": "loss=dapo", "agg=sample": "agg=sample"}


def test_label_full_a_pattern_and_the_line_that_gives_the_full_names():
    assert labels_for(NAMES, "full") == {name: name for name in NAMES}
    assert list(labels_for(NAMES, r"lam[\d.]+-(\d+)").values())[:2] == ["01161659", "01161660"]
    with pytest.raises(LabelError, match=r"^--label GSM8K-\(\\w\+\)-: .*CRPO-sp.* and .*CRPO-sp.* would both be "
                                         r"shown as CRPO$"):
        labels_for(NAMES, r"GSM8K-(\w+)-")
    with pytest.raises(LabelError, match=r"^--label nope: variant Qwen2.5.* does not match$"):
        labels_for(NAMES, "nope")
    with pytest.raises(LabelError, match=r"^--label \(: not full, short or a regular expression \(missing \), "):
        labels_for(NAMES, "(")
    assert list(labels_for(NAMES[1:3], r"lam0\.[13]").values()) == ["lam0.1", "lam0.3"]  # no group: the match
    with pytest.raises(LabelError) as clash:
        labels_for(NAMES, r"GSM8K-(\w+)-")
    assert str(clash.value).index(NAMES[1]) < str(clash.value).index(NAMES[2])  # the two that clash, each named
    line = labels_line(short_labels(NAMES))
    assert line.startswith("names: each variant is shown by the part of its name that differs (--label full")
    assert f"GRPO-lam0.1 = {NAMES[0]}; CRPO-lam0.1 = {NAMES[1]}" in line and "\n" not in line
    assert labels_line({"a": "a", "b": "b"}) is None


def test_a_long_text_is_fitted_to_its_width_in_lines():
    assert fitted("short", 10) == "short"
    assert fitted("Qwen2.5-0.5B-Instruct-GSM8K", 16) == "Qwen2.5-0.5B-\nInstruct-GSM8K"
    one = fitted(NAMES[0], 30, lines=1)
    assert len(one) == 30 and one.startswith("Qwen2.5-0.5B-") and one.endswith("1659-end") and "..." in one


def _law(c, A):
    return 0.1 + (A - 0.1) / (1 + (60 / np.maximum(c, 1e-12)) ** 1.5)


def _fits(names):
    c = np.arange(0, 201, 10.0)
    return [(name, fit_sigmoid(c, _law(c, 0.5 + 0.02 * k), r0=0.1), None) for k, name in enumerate(names)]


def _curves(name, A):
    c = np.arange(0, 201, 10.0)
    return [RunCurve(run_id=name, run_name=name, variant=name, axis="", choice="", signature="", status="FINISHED",
                     sweep="none", parent_run_id=None, step=np.arange(c.size), compute=c, pass_rate=_law(c, A),
                     last_step=c.size - 1, unit="steps")]


def _boxes(fig, texts):
    renderer = fig.canvas.get_renderer()
    return [t.get_window_extent(renderer) for t in texts if t.get_text()]


@pytest.mark.parametrize("names", [NAMES, list(short_labels(NAMES).values())], ids=["full", "short"])
def test_the_ab_plot_keeps_its_panels_and_the_overview_its_titles_apart_whatever_the_names(names):
    items = _fits(names)
    verdicts = {name: "moves C_mid (1.52x compute)" for name in names[1:]} | {names[0]: "base"}
    fig = params_figure(items, names[0], verdicts=verdicts)
    ax_a, ax_b = fig.axes
    widths = ax_a.get_position().width + ax_b.get_position().width
    assert widths >= 0.5, widths  # the panels hold at least half the figure, whatever the names
    labels = _boxes(fig, ax_a.get_yticklabels())
    assert len(labels) == len(names)
    panel = ax_a.get_window_extent(fig.canvas.get_renderer())
    assert all(box.x0 >= 0 and box.x1 <= panel.x0 for box in labels)  # each name inside the figure, left of A

    items = [(name, _curves(name, 0.5 + 0.02 * k), fit) for k, (name, fit, _) in enumerate(_fits(names))]
    fig = overview_figure(items, base=names[0], verdicts=verdicts)
    titles = _boxes(fig, [ax.title for ax in fig.axes])
    assert len(titles) == len(names)
    for i, a in enumerate(titles):
        assert a.x0 >= 0 and a.x1 <= fig.bbox.x1
        for b in titles[i + 1:]:
            assert not a.overlaps(b), (a, b)
    suptitle = fig.get_suptitle()
    assert len(suptitle) < 110  # one line: the base's long name is not written into it


def test_a_report_of_long_named_runs_prints_short_names_and_no_library_warning(tmp_path, capsys):
    path = tmp_path / "wide.csv"
    steps = np.arange(0, 201, 10)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["Step", *NAMES])
        for s in steps:
            writer.writerow([int(s), *(round(float(_law(np.array([s * 1.0]), 0.5 + 0.02 * k)[0]), 4)
                                       for k in range(len(NAMES)))])
    for label in ("short", "full"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert main(["report", "--csv", str(path), "--out", str(tmp_path / label), "--base", NAMES[0],
                         "--label", label]) == 0
        assert [str(w.message) for w in caught] == []
        out, err = capsys.readouterr()
        assert err == ""
        table = out[out.index("| # |"):]
        if label == "short":  # the base may be named as the report shows it
            assert main(["report", "--csv", str(path), "--out", str(tmp_path / "again"), "--base", "GRPO-lam0.1"]) == 0
            assert f"base: {NAMES[0]}, shown as GRPO-lam0.1" in capsys.readouterr().out
            assert "| GRPO-lam0.1 |" in table and "Qwen2.5" not in table
            assert "names: each variant is shown by the part of its name that differs" in out
        else:
            assert f"| {NAMES[0]} |" in table
