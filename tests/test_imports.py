"""Imports: every module imports on its own, the layers import downward only, and decoding leaves the optional
parts (torch and transformers, the server, plots) alone; where one is missing, the command that needs it says what
to install."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import specwise
from specwise.cli import main
from specwise.extras import EXTRAS, MissingExtraError, missing_extra, require

PACKAGE = Path(specwise.__file__).parent
OPTIONAL = ["fastapi", "uvicorn", "prometheus_client", "matplotlib", "starlette"]
HEAVY = ["torch", "transformers", "accelerate", "scipy"]  # the hf extra's: nothing on a GGUF file's path loads them
# the modules that are torch code (the hf and distill extras): on the core install they raise MissingExtraError
TORCH_MODULES = {
    "specwise.models.hf",
    "specwise.models.native",
    "specwise.models.layer",
    "specwise.drafters.head.module",
    "specwise.lab.distill.train",
    "specwise.lab.distill.data",
}
HAS_TORCH = importlib.util.find_spec("torch") is not None


def all_modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__main__":  # running it is the command line
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


# Each module is imported in a child of one fresh interpreter that has imported nothing of specwise (and torch, where
# asked): the child starts with no specwise module loaded, as a fresh interpreter does, without paying for torch again.
_IMPORT_ALONE = textwrap.dedent(
    """
    import importlib, json, os, sys, traceback
    modules, forbidden, preload = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
    for name in preload:
        importlib.import_module(name)
    assert not [m for m in sys.modules if m.split(".")[0] == "specwise"]
    errors = {}
    for name in modules:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                importlib.import_module(name)
                loaded = sorted(m for m in forbidden if m in sys.modules)
                message = f"imports {', '.join(loaded)}" if loaded else ""
            except BaseException:
                message = traceback.format_exc()
            os.write(write, message.encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            message = pipe.read().decode()
        os.waitpid(pid, 0)
        if message:
            errors[name] = message
    print(json.dumps(errors))
    """
)


def import_alone(modules: list[str], forbidden: list[str] = (), preload: list[str] = ()) -> dict[str, str]:
    """Import each module in a process of its own (forked from one that imported ``preload``); returns module ->
    what went wrong (an error, or the ``forbidden`` modules it loaded), for the modules where something did."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _IMPORT_ALONE,
            json.dumps(modules),
            json.dumps(list(forbidden)),
            json.dumps(list(preload)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def names_a_missing_extra(error: str) -> bool:
    """Whether an import error is that of an optional part whose extra is not installed: a MissingExtraError naming
    the extra, or a module of an extra that is missing here (the server's modules import FastAPI directly)."""
    if "MissingExtraError" in error and "pip install 'specwise[" in error:
        return True
    missing = re.search(r"No module named '([\w.]+)'", error)
    if not missing:
        return False
    top = missing.group(1).split(".")[0]
    optional = {m for modules in EXTRAS.values() for m in modules} | {"pydantic", "starlette", "ray"}
    return top in optional and importlib.util.find_spec(top) is None


def _module_file(name: str) -> Path:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _not_on_import(test: ast.expr) -> bool:
    """Whether an ``if``'s test keeps its body from running on import: ``TYPE_CHECKING``, or ``__name__ ==
    "__main__"`` (the module run as a program)."""
    text = ast.unparse(test)
    return "TYPE_CHECKING" in text or text == "__name__ == '__main__'"


def _run_at_import(body: list[ast.stmt]):
    """The statements of ``body`` that run when the module is imported: not inside functions, nor under
    ``if TYPE_CHECKING:`` or ``if __name__ == "__main__":``."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and _not_on_import(node.test):
            yield from _run_at_import(node.orelse)
            continue
        yield node
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, name, None)
            if isinstance(inner, list):
                yield from _run_at_import(inner)


def imported_at_import_time(name: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports when it is imported (``from P import X`` counts P,
    and P.X where X is a module)."""
    path = _module_file(name)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _run_at_import(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 packages
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m in modules and m != name}


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` (module -> the modules it imports) as ``[a, b, ..., a]``, or None when it has none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in done:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if node not in done:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_modules_import_no_cycle():
    """No module imports, when imported, one that imports it back (through any chain): the graph of the imports
    that run at import time (not those inside functions) is acyclic."""
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    modules = set(all_modules())
    graph = {name: imported_at_import_time(name, modules) for name in modules}
    assert {"specwise.planner", "specwise.drafters.base"} <= graph["specwise.engine"]  # the graph finds imports
    assert "specwise.drafters.suffix.index" in graph["specwise.drafters.suffix.load"]
    cycle = import_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _runs_ever(body: list[ast.stmt], typing: bool = False):
    """The statements of ``body`` that may run when the module is imported, at once or later: everything, functions'
    bodies included, but what is under ``if TYPE_CHECKING:`` (read by type checkers only; kept with ``typing``) or
    ``if __name__ == "__main__":`` (run when the module is the program, ``python -m``, not when it is imported)."""
    for node in body:
        if isinstance(node, ast.If) and _not_on_import(node.test):
            if typing and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from _runs_ever(node.body, typing)
            yield from _runs_ever(node.orelse, typing)
            continue
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                yield from _runs_ever([child], typing)
            else:  # an expression or a handler: the statements within it
                for name in ("body", "orelse", "finalbody", "handlers", "cases"):
                    inner = getattr(child, name, None)
                    if isinstance(inner, list):
                        yield from _runs_ever(inner, typing)


def _with_packages(module: str) -> list[str]:
    """Importing ``a.b.c`` runs ``a``, ``a.b`` and ``a.b.c``: the module and the packages above it."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def imported_ever(name: str, modules: set[str], typing: bool = False) -> set[str]:
    """The modules of ``modules`` that module ``name`` may import, when it is imported or later (imports inside
    functions too; with ``typing``, those under ``if TYPE_CHECKING:`` too), each with the packages whose ``__init__``
    importing it runs. A package that holds ``name`` is left out (Python imports it before ``name``), unless ``name``
    takes a name defined in its ``__init__`` (``from specwise.drafters import NgramDrafter``), which needs that
    ``__init__`` to have run."""
    path = _module_file(name)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    ancestors = set(_with_packages(package)) if package else set()
    found: set[str] = set()
    for node in _runs_ever(ast.parse(path.read_text(encoding="utf-8")).body, typing):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.update(m for m in _with_packages(alias.name) if m not in ancestors)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 packages
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.update(m for m in _with_packages(base) if m not in ancestors)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.add(f"{base}.{alias.name}")
                else:  # a name the module (or package's __init__) defines: it must have run
                    found.add(base)
    return {m for m in found if m in modules and m != name}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other through some chain (the strongly connected components of
    ``graph`` with more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# Cycles known and not yet broken (none).
KNOWN_CYCLES: list[list[str]] = []


def test_no_import_cycle_even_through_lazy_imports():
    """No module imports, at import time or later (inside a function), one that imports it back through any chain;
    importing ``a.b.c`` counts as importing the packages ``a`` and ``a.b`` too (their ``__init__`` runs). Names that
    a package's ``__getattr__`` imports by name on first use (``importlib``) are not followed."""
    assert _with_packages("specwise.models.kernels") == ["specwise", "specwise.models", "specwise.models.kernels"]
    assert import_cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a"}}) == [["c", "d"], ["a", "b"]]
    modules = set(all_modules())
    graph = {name: imported_ever(name, modules) for name in modules}
    # the graph finds imports inside functions, the packages they pass through, and none under TYPE_CHECKING
    assert "specwise.models.loader" in graph["specwise.runtime"]  # inside build_runtime
    assert "specwise.models" in graph["specwise.drafters.sibling"]  # importing models.gguf_file runs its __init__
    assert "specwise.models.loader" not in graph["specwise.models"]  # TYPE_CHECKING only (and importlib)
    cycles = [c for c in import_cycles(graph) if c not in KNOWN_CYCLES]
    assert not cycles, "import cycles (lazy imports included):\n" + "\n".join(
        " -> ".join(c + c[:1]) + "\n    " + "\n    ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c)
        for c in cycles
    )


def test_no_import_cycle_even_for_type_checkers():
    """No modules import each other through any chain, counting the imports under ``if TYPE_CHECKING:`` too (what a
    type checker reads): a name one module needs of another's for its annotations lives below both (the server's
    routes share ``server/state.py``; the head's file format does not name its training module)."""
    modules = set(all_modules())
    graph = {name: imported_ever(name, modules, typing=True) for name in modules}
    assert "specwise.server.state" in graph["specwise.server.parsing"]  # TYPE_CHECKING only: the graph sees it
    cycles = import_cycles(graph)
    assert not cycles, "import cycles (type checkers' imports included):\n" + "\n".join(
        " -> ".join(c + c[:1]) + "\n    " + "\n    ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c)
        for c in cycles
    )


# A model's abilities are asked for by type (the protocols of specwise/models/base.py: isinstance(model, OutputRows)),
# never probed with getattr or hasattr outside specwise/models/. A probe is a getattr or hasattr whose object is named
# like a model (model, target, hf_model, drafter, draft_model, loaded, weights, embed ...) or whose attribute is one
# of the optional abilities the protocols declare or a loaded model's fields.
MODEL_LIKE = re.compile(r"(?:^|_)(?:model|target|drafter|draft|loaded|weights?|embed|lm_head)(?:$|_)")
ABILITIES = {
    "k_cache",
    "v_cache",
    "lm_head",
    "weight_bytes",
    "read_output_rows",
    "restrict_output",
    "output_rows",
    "forward_last",
    "reusable",
    "fingerprint",
    "precision",
    "hf_model",
    "fim_token_ids",
}
PROBES_ALLOWED: set[tuple[str, str]] = set()  # (module path under specwise/, the call as written): none


def _probed(node: ast.expr) -> str:
    """The name a getattr or hasattr probes: a variable's, or an attribute's last part (``self.target``)."""
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else ""


def model_probes(source: str) -> list[str]:
    """The getattr and hasattr calls of ``source`` that probe a model's abilities (see ABILITIES, MODEL_LIKE)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        if node.func.id not in ("getattr", "hasattr"):
            continue
        what = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
        if MODEL_LIKE.search(_probed(node.args[0]).lower()) or what in ABILITIES:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_the_models_probes_a_models_abilities():
    """Outside ``specwise/models/`` no getattr or hasattr asks a model (or a loaded model, a drafter's model, a
    target's weights) what it can do: its optional abilities are protocols of ``models/base.py``, asked for with
    isinstance, and the rest are declared members of its contract."""
    from specwise.models import base
    from specwise.models.loader import LoadedModel

    protocols = (base.OutputRows, base.ReusableRows, base.CacheArrays, base.TargetLayers, base.QuantizedWeights)
    declared = {name for proto in protocols for name in (*proto.__annotations__, *vars(proto))}
    assert not ABILITIES - declared - set(LoadedModel.__dataclass_fields__)  # the list names declared abilities only
    assert model_probes("getattr(model, 'lm_head', None)\nhasattr(self.target, 'x')\ngetattr(src, 'k_cache')") == [
        "1: getattr(model, 'lm_head', None)",
        "2: hasattr(self.target, 'x')",
        "3: getattr(src, 'k_cache')",
    ]
    assert model_probes("getattr(tokenizer, 'chat_template', None)\ngetattr(head, name)\ngetattr(args, 'path')") == []
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("models/"):
            continue
        for probe in model_probes(path.read_text(encoding="utf-8")):
            if (relative, probe.split(": ", 1)[1]) not in PROBES_ALLOWED:
                found.append(f"{relative}:{probe}")
    assert not found, "probes of a model's abilities (ask for a protocol of models/base.py instead):\n" + "\n".join(
        found
    )


# The lab: what measures and trains (specwise/lab/), and the former paths kept for the commands written with them.
LAB = "specwise.lab"
LAB_FORWARDS = {"specwise.bench", "specwise.bench.fetch"}  # python -m specwise.bench.fetch


def in_lab(module: str) -> bool:
    return module == LAB or module.startswith(LAB + ".") or module in LAB_FORWARDS


def arrows_into_the_lab(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports of ``graph`` from a module outside the lab to one inside it."""
    return sorted((a, b) for a, bs in graph.items() if not in_lab(a) for b in bs if in_lab(b))


def test_the_runtime_never_imports_the_lab():
    """No module outside the lab imports one of the lab's, at import time, later (inside a function) or for type
    checkers (under ``if TYPE_CHECKING:``): what the lab writes and the runtime reads is read and written through
    ``specwise.artifacts``, and the command line names the lab's subcommands' modules only (by string, as the
    server's). Running ``python -m specwise.drafters.vocab`` as a program forwards to the lab's builder, which is
    no import."""
    toy = {"specwise.runtime": {"specwise.lab.bench", "specwise.files"}, "specwise.lab.profile": {"specwise.runtime"}}
    assert arrows_into_the_lab(toy) == [("specwise.runtime", "specwise.lab.bench")]
    modules = set(all_modules())
    assert modules > LAB_FORWARDS and LAB in modules
    graph = {name: imported_ever(name, modules, typing=True) for name in modules}
    assert "specwise.lab.bench.fetch" in graph["specwise.bench.fetch"]  # the graph sees imports into the lab
    assert "specwise.lab.bench.configs" in graph["specwise.lab.bench"]  # and those under TYPE_CHECKING
    assert "specwise.artifacts" in graph["specwise.models.loader"]  # the profile, read through the formats' module
    arrows = arrows_into_the_lab(graph)
    assert not arrows, "the runtime imports the lab: " + ", ".join(f"{a} -> {b}" for a, b in arrows)


def test_the_formats_module_sits_below_the_runtime_and_the_lab():
    """``specwise.artifacts`` (every format the lab writes and the runtime reads) imports nothing of specwise but the
    cache's paths, so that any module may read its files through it."""
    modules = set(all_modules())
    assert imported_ever("specwise.artifacts", modules, typing=True) == {"specwise.files"}


needs_fork = pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="the import check forks")


@needs_fork
def test_every_module_imports_on_its_own():
    modules = all_modules()
    assert "specwise.models.kernels.quant" in modules and "specwise.files" in modules
    assert set(modules) >= TORCH_MODULES
    if HAS_TORCH:
        assert import_alone(modules, preload=["torch"]) == {}
        return
    errors = import_alone(modules)
    assert set(errors) >= TORCH_MODULES, "these import without torch: " + ", ".join(sorted(TORCH_MODULES - set(errors)))
    for name, error in errors.items():  # each module that cannot import belongs to an extra not installed
        assert names_a_missing_extra(error), (name, error)


@needs_fork
def test_no_module_on_a_gguf_files_path_loads_torch():
    """Everything but the torch code itself imports without loading torch, transformers or scipy."""
    modules = [
        m
        for m in all_modules()
        if m not in TORCH_MODULES and not m.startswith(("specwise.lab.distill", "specwise.server.ray"))
    ]
    errors = import_alone(modules, forbidden=HEAVY)
    # where an extra is missing (the core install), its modules may only fail naming it
    assert {n: e for n, e in errors.items() if not names_a_missing_extra(e)} == {}


def test_importing_specwise_loads_no_torch():
    code = "import sys, specwise; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@needs_fork
def test_lower_layers_do_not_import_the_loader():
    """The kernels sit below the models and the loader above them; profiles and paths need no loader either."""
    lower = [
        "specwise.files",
        "specwise.models",
        "specwise.models.kernels",
        "specwise.models.kernels.quant",
        "specwise.models.quantized",
        "specwise.artifacts",
    ] + (["specwise.models.native"] if HAS_TORCH else [])
    assert import_alone(lower, forbidden=["specwise.models.loader"]) == {}


@needs_fork
def test_decoding_imports_none_of_the_optional_parts():
    decoding = ["specwise", "specwise.engine", "specwise.cli", "specwise.runtime", "specwise.models.loader"]
    assert import_alone(decoding, forbidden=OPTIONAL + HEAVY) == {}


def _generate_alone(target: str, forbidden: list[str] = OPTIONAL) -> dict:
    """Run ``specwise generate`` in a fresh interpreter; returns its exit code and the ``forbidden`` modules it
    loaded."""
    code = textwrap.dedent(
        f"""
        import json, sys
        from specwise.cli import main
        code = main(["generate", "Hi", "--target", {target!r}, "--max-new-tokens", "3", "--json"])
        print(json.dumps({{"code": code, "loaded": sorted(m for m in {list(forbidden)!r} if m in sys.modules)}}))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_generate_imports_none_of_the_optional_parts(tiny_dir):
    assert _generate_alone(tiny_dir) == {"code": 0, "loaded": []}


@pytest.mark.slow
def test_generate_with_the_default_model_imports_none_of_the_optional_parts():
    """A GGUF file on a CPU: no server, no plots, and no torch or transformers (the tokenizer too is built from the
    file without them)."""
    assert _generate_alone("default", OPTIONAL + HEAVY) == {"code": 0, "loaded": []}


@pytest.mark.parametrize(
    ("argv", "blocked", "extra"),
    [
        (["serve", "--target", "default"], "fastapi", "server"),
        (["serve", "--target", "default"], "prometheus_client", "server"),
        (["bench", "--out", "unused"], "matplotlib", "bench"),
        (["simulate", "--out", "unused"], "matplotlib", "bench"),
    ],
)
def test_a_missing_extra_is_one_line_naming_the_command_to_fix_it(monkeypatch, capsys, argv, blocked, extra):
    monkeypatch.setitem(sys.modules, blocked, None)  # None in sys.modules: the import fails as if not installed
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert blocked in err and f"pip install 'specwise[{extra}]'" in err


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("specwise.server.app", "fastapi", "server"),
        ("specwise.server.metrics", "prometheus_client", "server"),
        ("specwise.server.protocol", "pydantic", "server"),
    ],
)
def test_importing_a_part_without_its_extra_names_the_extra(monkeypatch, module, blocked, extra):
    import importlib

    monkeypatch.setitem(sys.modules, blocked, None)
    monkeypatch.delitem(sys.modules, module, raising=False)  # imported afresh below; monkeypatch puts it back
    with pytest.raises(MissingExtraError, match=rf"{blocked}.*pip install 'specwise\[{extra}\]'"):
        importlib.import_module(module)


def test_plots_without_matplotlib_name_the_bench_extra(monkeypatch):
    from specwise.lab.bench import report, simulate

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    for figure in (report._figure, simulate._figure):
        with pytest.raises(MissingExtraError, match=r"pip install 'specwise\[bench\]'"):
            figure(4.0, 3.0)


def test_require_and_missing_extra():
    if all(importlib.util.find_spec(m) for m in EXTRAS["server"]):
        require("server", "specwise serve")  # installed: nothing raised
    else:
        with pytest.raises(MissingExtraError, match=r"pip install 'specwise\[server\]'"):
            require("server", "specwise serve")
    err = ModuleNotFoundError("No module named 'specwise.nothing'", name="specwise.nothing")
    assert missing_extra(err, "server", "x") is err  # a module of specwise itself is a bug, not an extra
    wrapped = missing_extra(ModuleNotFoundError("no", name="uvicorn.config"), "server", "specwise serve")
    assert str(wrapped) == "specwise serve needs uvicorn, which is not installed: pip install 'specwise[server]'"


def test_extras_match_pyproject():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    optional = project["optional-dependencies"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[\[<>=!~ ;]", r)[0].replace("-", "_").lower() for r in requirements}

    core = names(project["dependencies"])

    def closure(extra: str) -> set[str]:
        """The distributions of an extra, with those of the extras it names (``specwise[hf]``)."""
        found = set()
        for requirement in optional[extra]:
            if requirement.startswith("specwise["):
                for inner in requirement[len("specwise[") : requirement.index("]")].split(","):
                    found |= closure(inner)
            else:
                found |= names([requirement])
        return found

    for extra, modules in EXTRAS.items():
        assert set(modules) <= closure(extra), extra  # the distributions here share the modules' names
        assert not set(modules) & core, f"{extra}'s modules are in the core dependencies"
    # `pip install -e .[dev]` sets up every extra (cuda is hf's torch on a machine with a GPU)
    named = {e for r in optional["dev"] if r.startswith("specwise[") for e in r[9 : r.index("]")].split(",")}
    assert set(EXTRAS) - {"cuda"} <= named
