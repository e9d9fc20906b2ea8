"""A pytest mark on a function pytest does not collect (a helper) marks nothing: the test that calls the helper runs
without its skip or timeout. Read from the test files' source, so that it holds for modules this run skips too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def _misplaced_marks(source: str) -> list[str]:
    """`name: mark` for each function not named test_* that carries a pytest.mark decorator (fixtures aside)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("test"):
            continue
        for decorator in node.decorator_list:
            text = ast.unparse(decorator)
            if text.startswith("pytest.mark.") or text.startswith("mark."):
                found.append(f"{node.name}: {text.split('(')[0]}")
    return found


def test_the_check_finds_a_mark_on_a_helper():
    source = "import pytest\n@pytest.mark.timeout(5)\ndef _helper():\n    pass\n@pytest.mark.slow\ndef test_x():\n    pass\n"
    assert _misplaced_marks(source) == ["_helper: pytest.mark.timeout"]


@pytest.mark.parametrize("path", sorted(TESTS.glob("test_*.py")), ids=lambda p: p.name)
def test_marks_sit_on_tests(path):
    assert _misplaced_marks(path.read_text()) == []
