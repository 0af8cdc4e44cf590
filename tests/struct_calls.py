"""Calling the native entry points that take structs, with fields changed, for the refusal tests
(test_fuzz_layer_calls.py, test_fuzz_float_layer_calls.py): copies of a call's structs with ``struct__field`` =
value set (or ``struct`` = None for a NULL pointer), their pointers in argument order, and a byte comparison of the
buffers a refused call must leave alone."""

from __future__ import annotations

import ctypes

import numpy as np

from specwise.models.kernels.layers import addr


def copy_struct(s: ctypes.Structure) -> ctypes.Structure:
    """A copy of a struct of value fields and pointers (the pointers still point where the original's do)."""
    out = type(s)()
    ctypes.memmove(ctypes.addressof(out), ctypes.addressof(s), ctypes.sizeof(s))
    return out


def edited(structs: dict[str, ctypes.Structure], fields: dict) -> dict[str, ctypes.Structure | None]:
    """Copies of ``structs`` with ``fields`` set: ``name__field`` = value, or ``name`` = None for a NULL pointer."""
    out: dict[str, ctypes.Structure | None] = {name: copy_struct(s) for name, s in structs.items()}
    for key, value in fields.items():
        name, _, field = key.partition("__")
        if field:
            setattr(out[name], field, value)
        else:
            out[name] = None
    return out


def pointers(structs: dict[str, ctypes.Structure | None], order) -> list:
    """The structs named in ``order`` as pointer arguments (None for NULL)."""
    return [None if structs[name] is None else addr(structs[name]) for name in order]


def _raw(buffer) -> bytes:
    """A buffer's bytes: a numpy array, or a CPU tensor of the float32 model (torch)."""
    return (buffer.numpy() if hasattr(buffer, "numpy") else np.asarray(buffer)).tobytes()


def same_bytes(before: list, after: list) -> bool:
    """Whether the buffers (numpy arrays or CPU tensors) hold the same bytes (a cache's unwritten positions may
    hold NaN bits)."""
    return all(_raw(a) == _raw(b) for a, b in zip(before, after))


def assert_refused_unwritten(call, expected: int, *args, **fields) -> None:
    """``call.status(*args, **fields)`` returns ``expected`` and leaves every buffer of ``call.snapshot()`` as it
    was (a refused call writes nothing)."""
    before = call.snapshot()
    assert call.status(*args, **fields) == expected
    assert same_bytes(before, call.snapshot()), "a refused call wrote"
