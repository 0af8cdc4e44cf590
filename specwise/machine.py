"""Facts about the CPU specwise runs on, from ``/proc/cpuinfo``, read once per process.

The kernels' loader asks for the vector flags the float kernels need; benchmarks and the head's model card name
the CPU. Where there is no ``/proc/cpuinfo`` (not Linux) every fact is empty and the callers fall back.
"""

from __future__ import annotations

import functools
import platform

__all__ = [
    "VECTOR_FLAGS",
    "parse_cpuinfo",
    "cpuinfo",
    "cpu_name",
    "cpu_generation",
    "cpu_flags",
    "vector_flags",
    "has_flags",
]

# The flags that decide the kernels' instruction path (every benchmark records which of them the CPU has).
VECTOR_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni")


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The first processor's block of a ``/proc/cpuinfo`` text as ``{key: value}`` (first value of a key kept)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough: the others repeat it
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


@functools.cache
def cpuinfo() -> dict[str, str]:
    """This machine's first processor block of ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return parse_cpuinfo(f.read())
    except OSError:
        return {}


def cpu_name() -> str:
    """The CPU's model name (``AMD EPYC 9R14``), else what :mod:`platform` knows."""
    return cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_generation() -> str | None:
    """The CPU's vendor, family and model numbers (``AuthenticAMD family 26 model 2``), or None where unknown: a
    virtual machine often names only the brand, and the generation decides how the kernels' paths compare."""
    fields = cpuinfo()
    if "cpu family" not in fields:
        return None
    return f"{fields.get('vendor_id', '?')} family {fields['cpu family']} model {fields.get('model', '?')}"


def cpu_flags() -> frozenset[str]:
    """Every feature flag the CPU reports."""
    return frozenset(cpuinfo().get("flags", "").split())


def vector_flags() -> list[str]:
    """The CPU's flags among :data:`VECTOR_FLAGS`, in that order."""
    present = cpu_flags()
    return [flag for flag in VECTOR_FLAGS if flag in present]


def has_flags(*names: str) -> bool:
    """True when the CPU reports every one of ``names`` (False where nothing is known)."""
    return set(names) <= cpu_flags()
