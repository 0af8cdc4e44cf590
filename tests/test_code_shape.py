"""The code's shape, as docs/DESIGN.md promises it: no Python function over ~80 lines, and no source file (Python
or C) over ~600 lines unless it says at its top why it is one file ("One file because ...")."""

from __future__ import annotations

import ast
from pathlib import Path

import specwise

PACKAGE = Path(specwise.__file__).parent
MAX_FUNCTION = 80
MAX_FILE = 600
REASON = "one file because"


def long_functions(source: str, name: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION:
                out.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    return out


def unexplained_long_file(text: str) -> bool:
    """Over MAX_FILE lines without the reason among its first 40 lines."""
    lines = text.splitlines()
    return len(lines) > MAX_FILE and REASON not in " ".join(lines[:40]).lower()


def test_no_python_function_is_over_80_lines():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))
    assert not found, found


def test_long_files_say_why_they_are_one_file():
    paths = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.c"), *PACKAGE.rglob("*.h")]
    found = [str(p.relative_to(PACKAGE)) for p in sorted(paths) if unexplained_long_file(p.read_text(encoding="utf-8"))]
    assert not found, found


def test_the_checks_can_fail():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION + 1))
    assert long_functions(f"def f():\n{body}\n", "m.py") == [f"m.py:1 f ({MAX_FUNCTION + 2} lines)"]
    assert not long_functions("def f():\n    return 1\n", "m.py")
    long_text = "\n".join(["x = 1"] * (MAX_FILE + 1))
    assert unexplained_long_file(long_text)
    assert not unexplained_long_file("# One file because its parts share one cache.\n" + long_text)
    assert not unexplained_long_file("x = 1\n")
