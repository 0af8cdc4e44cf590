"""Where specwise keeps its files, and how it writes them.

The cache directory is ``$SPECWISE_CACHE``, else ``$XDG_CACHE_HOME/specwise``, else ``~/.cache/specwise``. Under it:

- ``converted/``   float32 safetensors copies of GGUF files (the float32 path: ``--impl hf``, CUDA, ...)
- ``tokenizers/``  the tokenizers built from GGUF files' vocabularies
- ``profiles/``    what ``specwise profile`` measured on this machine
- ``distill/``     distillation data generated from a target
- ``gguf/``        GGUF files fetched for benchmarks

Writes are atomic: a reader (or a crash) never sees a half-written file. This module imports nothing of specwise,
so any module can take its paths from here.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "atomic_path",
    "cache_dir",
    "converted_dir",
    "distill_dir",
    "gguf_dir",
    "profiles_dir",
    "safe_name",
    "tokenizers_dir",
    "write_text_atomic",
    "write_json_atomic",
]


def cache_dir() -> Path:
    """specwise's cache directory (see the module's docstring); read from the environment at each call."""
    if os.environ.get("SPECWISE_CACHE"):
        return Path(os.environ["SPECWISE_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "specwise"


def converted_dir() -> Path:
    """Float32 safetensors copies of GGUF files, one folder per file."""
    return cache_dir() / "converted"


def tokenizers_dir() -> Path:
    """Tokenizers built from GGUF files, one folder per file."""
    return cache_dir() / "tokenizers"


def profiles_dir() -> Path:
    """Saved ``specwise profile`` measurements, one JSON file per model, device and machine."""
    return cache_dir() / "profiles"


def distill_dir() -> Path:
    """Distillation data, one folder per target."""
    return cache_dir() / "distill"


def gguf_dir(cache: Path | None = None) -> Path:
    """GGUF files fetched for benchmarks, under ``cache`` (default: :func:`cache_dir`)."""
    return (cache_dir() if cache is None else Path(cache)) / "gguf"


def safe_name(name: str) -> str:
    """``name`` as one file name: characters other than letters, digits and ``-_.`` become ``_``."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write; when the block succeeds it replaces ``path`` in one step,
    when it fails the temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: Path, data) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
