"""The optional parts of specwise and the extras that install them (``[project.optional-dependencies]``).

Decoding a GGUF file on a CPU (the library, ``specwise generate``, ``profile``, ``simulate``, ``index``) needs only
the core dependencies (numpy, gguf, tokenizers, jinja2). The other parts need more: Hugging Face
checkpoints and the float32 models ``pip install 'specwise[hf]'``, GPUs ``specwise[cuda]``, training heads
``specwise[distill]``, the server ``specwise[server]``, the benchmarks' plots ``specwise[bench]``, constrained output
``specwise[constrained]``. Where one
of them is missing, :func:`require` (checked up front) and :func:`missing_extra` (at the import) say so in one line,
with the command that installs it.
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRAS", "MissingExtraError", "missing_extra", "require"]

# extra -> the modules it installs that specwise imports (pyproject.toml lists the distributions)
EXTRAS: dict[str, tuple[str, ...]] = {
    "hf": ("torch", "transformers"),
    "cuda": ("torch",),
    "server": ("fastapi", "uvicorn", "prometheus_client"),
    "bench": ("matplotlib", "tqdm"),
    "distill": ("torch", "transformers", "tqdm"),
    "constrained": ("llguidance",),
}


class MissingExtraError(ModuleNotFoundError):
    """A module of an optional part of specwise is not installed; the message names the extra that installs it."""


def _message(what: str, missing: list[str], extra: str) -> str:
    names = missing[0] if len(missing) == 1 else f"{', '.join(missing[:-1])} and {missing[-1]}"
    verb = "is" if len(missing) == 1 else "are"
    return f"{what} needs {names}, which {verb} not installed: pip install 'specwise[{extra}]'"


def require(extra: str, what: str) -> None:
    """Raise :class:`MissingExtraError` unless every module of ``extra`` can be imported; ``what`` names the part
    that needs them (``specwise serve``)."""
    missing = [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtraError(_message(what, missing, extra), name=missing[0])


def missing_extra(err: ModuleNotFoundError, extra: str, what: str) -> ModuleNotFoundError:
    """The error to raise for ``err``, met importing a part of ``extra``: a :class:`MissingExtraError` saying what
    to install when the missing module belongs to the extra (or is one of its dependencies), else ``err`` itself."""
    top = (err.name or "").split(".")[0]
    if not top or top == "specwise":
        return err
    return MissingExtraError(_message(what, [top], extra), name=err.name)
