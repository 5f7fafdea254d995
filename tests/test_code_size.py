"""Issue 38's size rules, held on the real source: the command line is a thin layer (no function of
``pipesched.cli`` over 60 lines: a command parses, then hands over to the application), and every
module of ``pipesched`` is small enough to read whole (at most 300 lines: split by job)."""

from __future__ import annotations

import ast

from conftest import SRC

PACKAGE = SRC / "pipesched"
MOST_CLI_FUNCTION_LINES = 60
MOST_MODULE_LINES = 300


def _lines(node: ast.AST) -> int:
    """A function's lines, from its first decorator (or ``def``) to its last line."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return node.end_lineno - first + 1


def test_no_function_of_the_command_line_is_over_60_lines():
    long = [f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({_lines(node)} lines)"
            for path in sorted((PACKAGE / "cli").rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _lines(node) > MOST_CLI_FUNCTION_LINES]
    assert long == []


def test_no_module_is_over_300_lines():
    long = [f"{path.relative_to(PACKAGE)} ({count} lines)" for path in sorted(PACKAGE.rglob("*.py"))
            if (count := len(path.read_text().splitlines())) > MOST_MODULE_LINES]
    assert long == []
