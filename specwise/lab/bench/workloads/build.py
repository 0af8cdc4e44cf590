"""Rebuild the coding workloads' data files from CPython's standard library source.

The selection is fixed here (files, functions, instructions, cuts), so the files are reproducible: run it with the
``Lib`` folder of CPython 3.11.7 (a checkout of the ``v3.11.7`` tag, or that version's installed standard library)
and it writes the same ``code_edit.jsonl``, ``fim.jsonl`` and ``agent.jsonl``::

    python -m specwise.lab.bench.workloads.build --lib /path/to/cpython/Lib --out specwise/lab/bench/workloads

Every item records the file's path under CPython's tree and the SHA-256 of the file it was cut from; the build
refuses a ``Lib`` folder whose files differ from the recorded version's.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
from pathlib import Path

__all__ = ["CPYTHON_VERSION", "build_all", "main"]

CPYTHON_VERSION = "3.11.7"

SYSTEM_EDIT = (
    "You are a coding assistant. Reply with the complete rewritten code in one ```python block and nothing else."
)
SYSTEM_AGENT = (
    "You are a coding agent working in a checkout of CPython's source tree. Use the tools to list folders, read "
    "files and run tests; quote code exactly as the files have it."
)

# (path under Lib, qualified name or None for the whole file, instruction)
CODE_EDITS: list[tuple[str, str | None, str]] = [
    ("textwrap.py", "dedent", "Rename the variable `margin` to `common_indent` everywhere in this function."),
    ("fnmatch.py", "filter", "Replace the two `for` loops that build `result` with list comprehensions."),
    (
        "colorsys.py",
        "rgb_to_hls",
        "Add a docstring: the arguments are floats in [0, 1]; it returns the (hue, lightness, saturation) tuple.",
    ),
    (
        "posixpath.py",
        "commonpath",
        "Add type hints: `paths` is an iterable of str, bytes or os.PathLike; the result is str or bytes.",
    ),
    ("heapq.py", "nsmallest", "Rename the parameter `iterable` to `items` everywhere in this function."),
    ("shlex.py", "quote", "Add type hints: `s` is a str and the function returns a str."),
    ("string.py", "Template.safe_substitute", "Rename the inner function `convert` to `replace_match`."),
    ("glob.py", "_iterdir", "Add a docstring saying what the generator yields and when it yields nothing."),
    ("bisect.py", "bisect_left", "Add type hints to the signature (a list, any value, ints, an optional callable)."),
    ("json/encoder.py", "py_encode_basestring_ascii", "Rename the inner function `replace` to `escape_match`."),
    ("bisect.py", None, "Rename the parameters `lo` and `hi` to `low` and `high` in every function."),
    ("colorsys.py", None, "Add type hints to every function: the arguments and results are floats."),
    ("fnmatch.py", None, "Add a one-line docstring to `_compile_pattern`."),
]

# (path under Lib, qualified name): the middle statement of the function's body is cut out
FIM_CUTS: list[tuple[str, str]] = [
    ("posixpath.py", "relpath"),
    ("posixpath.py", "expanduser"),
    ("glob.py", "_iglob"),
    ("heapq.py", "nsmallest"),
    ("fnmatch.py", "translate"),
    ("colorsys.py", "rgb_to_hsv"),
    ("bisect.py", "bisect_right"),
    ("textwrap.py", "TextWrapper._wrap_chunks"),
    ("string.py", "Formatter._vformat"),
    ("shlex.py", "split"),
]
FIM_CONTEXT_BEFORE = 12  # lines kept above the function's first line
FIM_CONTEXT_AFTER = 12  # lines kept below its last line
FIM_MAX_MIDDLE = 8  # lines cut at most
FIM_MAX_SUFFIX = 30  # lines kept after the cut at most (llama.cpp's /infill keeps a quarter of its batch of them)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "list_dir",
            "description": "List the entries of a folder of the source tree, one name a line.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "folder, relative to the tree's root"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the source tree, or the lines start_line..end_line of it (1-based).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "file, relative to the tree's root"},
                    "start_line": {"type": "integer", "minimum": 1},
                    "end_line": {"type": "integer", "minimum": 1},
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run one test module of the standard library's test suite and report the outcome.",
            "parameters": {
                "type": "object",
                "properties": {"module": {"type": "string", "description": "e.g. test.test_bisect"}},
                "required": ["module"],
            },
        },
    },
]


class _Lib:
    """The ``Lib`` folder being read: file texts and the span of a function by qualified name."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def text(self, path: str) -> str:
        return (self.root / path).read_text(encoding="utf-8")

    def source(self, path: str) -> dict:
        data = (self.root / path).read_bytes()
        return {"cpython": CPYTHON_VERSION, "path": f"Lib/{path}", "sha256": hashlib.sha256(data).hexdigest()}

    def node(self, path: str, qualname: str) -> ast.FunctionDef:
        scope: list[ast.stmt] = ast.parse(self.text(path)).body
        found = None
        for part in qualname.split("."):
            found = next((n for n in scope if getattr(n, "name", None) == part), None)
            if found is None:
                raise LookupError(f"Lib/{path} has no {qualname}")
            scope = found.body
        assert isinstance(found, ast.FunctionDef)
        return found

    def span(self, path: str, qualname: str) -> tuple[int, int]:
        """0-based [start, end) line span of the function, decorators included."""
        node = self.node(path, qualname)
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
        return start, int(node.end_lineno or node.lineno)


def _module(path: str) -> str:
    """``json/encoder.py`` -> ``json.encoder``."""
    return path.removesuffix(".py").replace("/", ".")


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def code_edit_items(lib: _Lib) -> list[dict]:
    """Whole-function and whole-file rewrites with a small change, the original kept for ``prediction``."""
    items = []
    for path, qualname, instruction in CODE_EDITS:
        text = lib.text(path)
        if qualname is None:
            original, lines, kind = text, [1, len(_lines(text))], "file"
        else:
            start, end = lib.span(path, qualname)
            original, lines, kind = "".join(_lines(text)[start:end]), [start + 1, end], "function"
        name = qualname or Path(path).name
        item_id = f"{_module(path)}.{qualname}" if qualname else f"{path}:file"
        user = f"{instruction}\n\n```python\n{original}```"
        items.append(
            {
                "id": item_id,
                "kind": kind,
                "name": name,
                "instruction": instruction,
                "source": {**lib.source(path), "lines": lines},
                "original": original,
                "messages": [{"role": "system", "content": SYSTEM_EDIT}, {"role": "user", "content": user}],
            }
        )
    return items


def _cut(node: ast.FunctionDef) -> tuple[int, int]:
    """0-based [start, end) lines of the middle statement of the body (docstring left out), at most
    FIM_MAX_MIDDLE lines."""
    body = node.body
    if isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) and len(body) > 1:
        body = body[1:]
    middle = body[len(body) // 2]
    start = middle.lineno - 1
    end = min(int(middle.end_lineno or middle.lineno), start + FIM_MAX_MIDDLE)
    return start, end


def fim_items(lib: _Lib) -> list[dict]:
    """Fill-in-the-middle cuts: a statement in the middle of a function removed, the lines around it kept."""
    items = []
    for path, qualname in FIM_CUTS:
        lines = _lines(lib.text(path))
        fn_start, fn_end = lib.span(path, qualname)
        cut_start, cut_end = _cut(lib.node(path, qualname))
        ctx_start = max(0, fn_start - FIM_CONTEXT_BEFORE)
        ctx_end = min(len(lines), fn_end + FIM_CONTEXT_AFTER, cut_end + FIM_MAX_SUFFIX)
        prefix, middle = "".join(lines[ctx_start:cut_start]), "".join(lines[cut_start:cut_end])
        suffix = "".join(lines[cut_end:ctx_end])
        items.append(
            {
                "id": f"{_module(path)}.{qualname}",
                "name": qualname,
                "source": {
                    **lib.source(path),
                    "lines": [ctx_start + 1, ctx_end],
                    "middle_lines": [cut_start + 1, cut_end],
                },
                "span_sha256": hashlib.sha256((prefix + middle + suffix).encode()).hexdigest(),
                "prefix": prefix,
                "middle": middle,
                "suffix": suffix,
            }
        )
    return items


def _call(call_id: str, name: str, **arguments) -> dict:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def _result(call_id: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _read(lib: _Lib, path: str, start: int | None = None, end: int | None = None) -> str:
    lines = _lines(lib.text(path))
    return "".join(lines[(start or 1) - 1 : end or len(lines)])


def _tests_outcome(lib: _Lib, module: str) -> str:
    """What run_tests reports: the test methods of the module's real file, all passed."""
    tree = ast.parse(lib.text(module.replace(".", "/") + ".py"))
    count = sum(isinstance(n, ast.FunctionDef) and n.name.startswith("test") for n in ast.walk(tree))
    return f"{module}: {count} tests run, {count} passed, 0 failed"


def _function(lib: _Lib, path: str, qualname: str) -> str:
    start, end = lib.span(path, qualname)
    return "".join(_lines(lib.text(path))[start:end])


def _bisect_trace(lib: _Lib) -> dict:
    code, outcome = _function(lib, "bisect.py", "insort_left"), _tests_outcome(lib, "test.test_bisect")
    messages = [
        {"role": "system", "content": SYSTEM_AGENT},
        {"role": "user", "content": "How does insort_left in Lib/bisect.py use its key argument? Show me the code."},
        _call("call_1", "read_file", path="Lib/bisect.py"),
        _result("call_1", _read(lib, "bisect.py")),
        {
            "role": "assistant",
            "content": "`insort_left` applies `key` to the new item before searching, so the list must already be "
            f"ordered by that key:\n\n```python\n{code}```",
        },
        {"role": "user", "content": "Good. Run its tests."},
        _call("call_2", "run_tests", module="test.test_bisect"),
        _result("call_2", outcome),
        {"role": "assistant", "content": f"The tests pass: {outcome}."},
    ]
    return {
        "id": "agent.bisect",
        "sources": [lib.source("bisect.py"), lib.source("test/test_bisect.py")],
        "messages": messages,
    }


def _json_trace(lib: _Lib) -> dict:
    start, end = lib.span("json/encoder.py", "py_encode_basestring_ascii")
    listing = "\n".join(sorted(p.name for p in (lib.root / "json").iterdir() if p.suffix == ".py"))
    messages = [
        {"role": "system", "content": SYSTEM_AGENT},
        {
            "role": "user",
            "content": "Which file of the json package escapes strings for ASCII output? Quote that function.",
        },
        _call("call_1", "list_dir", path="Lib/json"),
        _result("call_1", listing),
        _call("call_2", "read_file", path="Lib/json/encoder.py", start_line=1, end_line=end),
        _result("call_2", _read(lib, "json/encoder.py", 1, end)),
        {
            "role": "assistant",
            "content": "Lib/json/encoder.py: `py_encode_basestring_ascii` (the pure-Python fallback of the C "
            f"version):\n\n```python\n{_read(lib, 'json/encoder.py', start + 1, end)}```",
        },
    ]
    sources = [lib.source(f"json/{name}") for name in listing.splitlines()]
    return {"id": "agent.json", "sources": sources, "messages": messages}


def _colorsys_trace(lib: _Lib) -> dict:
    start, end = lib.span("colorsys.py", "rgb_to_hsv")
    code = _read(lib, "colorsys.py", start + 1, end)
    hinted = code.replace(
        "def rgb_to_hsv(r, g, b):", "def rgb_to_hsv(r: float, g: float, b: float) -> tuple[float, float, float]:"
    )
    outcome = _tests_outcome(lib, "test.test_colorsys")
    messages = [
        {"role": "system", "content": SYSTEM_AGENT},
        {"role": "user", "content": "Add type hints to rgb_to_hsv in Lib/colorsys.py."},
        _call("call_1", "read_file", path="Lib/colorsys.py", start_line=start + 1, end_line=end),
        _result("call_1", code),
        {"role": "assistant", "content": f"Here is `rgb_to_hsv` with type hints:\n\n```python\n{hinted}```"},
        {"role": "user", "content": "Now run the colorsys tests."},
        _call("call_2", "run_tests", module="test.test_colorsys"),
        _result("call_2", outcome),
        {"role": "assistant", "content": f"The tests pass: {outcome}."},
    ]
    return {
        "id": "agent.colorsys",
        "sources": [lib.source("colorsys.py"), lib.source("test/test_colorsys.py")],
        "messages": messages,
    }


def agent_traces(lib: _Lib) -> list[dict]:
    """Scripted agent conversations: tool calls, the real files and listings they return, answers quoting them."""
    return [{**trace, "tools": TOOLS} for trace in (_bisect_trace(lib), _json_trace(lib), _colorsys_trace(lib))]


def build_all(lib_dir: Path | str) -> dict[str, list[dict]]:
    """The three workloads' items from CPython's ``Lib`` folder ``lib_dir``, by file name."""
    lib = _Lib(Path(lib_dir))
    return {"code_edit.jsonl": code_edit_items(lib), "fim.jsonl": fim_items(lib), "agent.jsonl": agent_traces(lib)}


def write_all(files: dict[str, list[dict]], out: Path) -> None:
    for name, items in files.items():
        text = "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items)
        (out / name).write_text(text, encoding="utf-8")


def _check_version(files: dict[str, list[dict]], out: Path) -> None:
    """Refuse a Lib folder whose files differ from the ones the shipped data was cut from."""
    shipped = out / "code_edit.jsonl"
    if not shipped.is_file():
        return
    recorded = {}
    for line in shipped.read_text(encoding="utf-8").splitlines():
        source = json.loads(line)["source"]
        recorded[source["path"]] = source["sha256"]
    for item in files["code_edit.jsonl"]:
        path, digest = item["source"]["path"], item["source"]["sha256"]
        if recorded.get(path, digest) != digest:
            raise SystemExit(
                f"{path} differs from CPython {CPYTHON_VERSION}'s: pass the Lib folder of v{CPYTHON_VERSION}"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True, help=f"the Lib folder of CPython {CPYTHON_VERSION}")
    ap.add_argument("--out", default=str(Path(__file__).parent), help="where the .jsonl files go")
    args = ap.parse_args(argv)
    files = build_all(args.lib)
    _check_version(files, Path(args.out))
    write_all(files, Path(args.out))
    print("wrote " + ", ".join(f"{name} ({len(items)})" for name, items in files.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
