"""specwise's native kernels, compiled by ``pip install`` (``setup.py``) into one shared library loaded here.

``small_gemm`` multiplies a few rows by a large float weight (decoding and verification); ``layer_kernel`` runs the
decoder layers of a Llama-family model on a few rows in one call: the one layer kernel of ``qllama.c``, which also
runs the GGUF models, with the float weights as float rows. Every kernel of the library runs on one instruction path,
chosen at run time by the library (AVX-512, AVX2 or portable: the best the CPU supports, or the one
:func:`specwise.models.kernels.quant.set_isa` sets), and every path gives the same bits. ``SPECWISE_NO_KERNELS=1``
disables them all; ``SPECWISE_NATIVE_LIB=path`` loads another build of them (the sanitizer build of
``make sanitize``). The ctypes signatures and structs are ``abi.py``'s.

The loader is ``library.py``, the float calls ``floats.py``, the quantized tensors ``quant.py``, the layers'
calls ``layers.py``, the ctypes signatures and structs ``abi.py``; this package names the loader's and the float
calls' functions on first use (so that it imports none of its modules, and none imports it back).
"""

from __future__ import annotations

import importlib

__all__ = [
    "small_gemm",
    "small_gemm_available",
    "kernel_error",
    "LayerKernel",
    "layer_kernel",
    "native_library",
    "library_path",
]

_WHERE = {
    "native_library": "library",
    "kernel_error": "library",
    "library_path": "library",
    "small_gemm": "floats",
    "small_gemm_available": "floats",
    "LayerKernel": "floats",
    "layer_kernel": "floats",
}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
