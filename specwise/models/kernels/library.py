"""Loading specwise's native library (built by ``pip install`` beside this file, or ``SPECWISE_NATIVE_LIB``), its
functions declared with ``abi.py``'s signatures once, when it loads. ``SPECWISE_NO_KERNELS=1`` leaves it unloaded."""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
from pathlib import Path

from specwise.models.kernels.abi import declare

__all__ = ["native_library", "kernel_error", "library_path"]

_lib = None
_error: str | None = None
_tried = False


def library_path() -> Path | None:
    """The kernels' shared library built by ``pip install`` (``_native*.so`` in this directory), if it exists;
    ``SPECWISE_NATIVE_LIB`` names another build of the same sources (``make sanitize``'s)."""
    other = os.environ.get("SPECWISE_NATIVE_LIB")
    if other:
        return Path(other) if Path(other).is_file() else None
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_native{suffix}"
        if path.is_file():
            return path
    return None


def _load():
    global _lib, _error, _tried
    if not _tried:
        _tried = True
        path = library_path()
        if os.environ.get("SPECWISE_NO_KERNELS") == "1":
            _error = "disabled by SPECWISE_NO_KERNELS=1"
        elif path is None:
            _error = (
                "the native kernels were not built when specwise was installed (no C compiler?): "
                "install gcc and reinstall specwise (pip install -e .)"
            )
        else:
            try:
                _lib = declare(ctypes.CDLL(str(path)))
            except (OSError, AttributeError) as err:
                _error = f"loading the native kernels failed: {err}"
    return _lib


def native_library() -> ctypes.CDLL | None:
    """The loaded kernels library, or None (see :func:`kernel_error`)."""
    return _load()


def kernel_error() -> str | None:
    """Why the kernel is unavailable (None when it is available or was not tried)."""
    _load()
    return _error
