"""docs/layout.md names every Python file of the repository (its modules, benches, tests and their helpers; the
fixtures under tests/data/ aside) in the folder that holds it, and nothing that is not there: a module added without
its line, or a line left behind by a module removed, fails here."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import ROOT

LAYOUT = ROOT / "docs" / "layout.md"
GAP = re.compile(r"\s{2,}")  # between a line's cells: a name and its description, or one entry and the next


def entries(line: str) -> list[str]:
    """The names a line of the tree lists. Its cells, split at gaps of 2+ spaces, alternate name and description; a
    name too long for its column is followed by one space and its description in the same cell."""
    cells, names, at = GAP.split(line.strip()), [], 0
    while at < len(cells):
        words = cells[at].split()
        names.append(words[0])
        at += 1 if len(words) > 1 else 2  # past the description: in this cell, or the next
    return names


def named_in(text: str) -> set[str]:
    """The paths of the .py files the layout's tree names. The tree is the lines indented 4 spaces or more; a line
    whose first entry is a folder (`name/`) opens it, and every line indented deeper is inside it until one as
    indented or less; a file's path is the folder of its line (a second column's file included) and its name."""
    named: set[str] = set()
    folders: list[tuple[int, str]] = [(-1, "")]  # (indent, path) of the open folders, outermost first
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if indent < 4 or not line.strip():
            continue
        while folders[-1][0] >= indent:
            folders.pop()
        folder, names = folders[-1][1], entries(line)
        named |= {folder + name for name in names if name.endswith(".py")}
        if names[0].endswith("/"):
            folders.append((indent, folder + names[0]))
    return named


def python_files() -> set[str]:
    """Every .py file git tracks or would (untracked, not ignored), less tests/data/'s fixtures."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    return {path for path in listed.stdout.split() if not path.startswith("tests/data/") and (ROOT / path).exists()}


def test_the_layout_names_each_file_in_its_folder_and_not_one_a_description_mentions():
    """By hand: pkg/ opens at indent 4; its files at 6, two on a line; sub/ opens at 6 and holds the line at 8; the
    line back at 6 is pkg/'s again; `b.py` inside a description and `f.py` beginning one are descriptions'; a name
    too long for its column (`long_name.py`) is followed by one space; the unindented line is prose."""
    text = "\n".join([
        "Prose naming prose.py.",
        "    top.py       a file at the top",
        "    pkg/         a package",
        "      a.py       uses b.py here           c.py   the second column",
        "      sub/       a folder in it",
        "        d.py     inside sub/              e.py   f.py on the CPU",
        "      long_name.py its description        g.py   pkg's again",
        "    other/       back at the top",
        "      a.py       another a.py",
    ])
    assert named_in(text) == {"top.py", "pkg/a.py", "pkg/c.py", "pkg/sub/d.py", "pkg/sub/e.py", "pkg/long_name.py",
                              "pkg/g.py", "other/a.py"}


def test_every_python_file_is_named_in_docs_layout_md():
    missing = sorted(python_files() - named_in(LAYOUT.read_text()))
    assert not missing, f"docs/layout.md names no line for: {', '.join(missing)}"


def test_docs_layout_md_names_no_file_that_is_not_there():
    stale = sorted(named_in(LAYOUT.read_text()) - python_files())
    assert not stale, f"docs/layout.md names files that are not there: {', '.join(stale)}"
