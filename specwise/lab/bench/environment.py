"""Where a benchmark ran (:func:`machine_info`: the CPU's facts from :mod:`specwise.machine`, the kernels' path,
versions, threads, load) and what every benchmark script's JSON starts with and how it is written
(:func:`script_header`, :func:`emit_json`)."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

from specwise.machine import cpu_generation, cpu_name, vector_flags

__all__ = ["emit_json", "load_average", "machine_info", "script_header"]


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _kernel_isa() -> str | None:
    from specwise.models.kernels.quant import isa, quantized_available

    return isa() if quantized_available() else None


def script_header(argv: list[str] | None, device: str = "cpu") -> dict:
    """What every benchmark script's JSON starts with: the command that made it, the date and the machine."""
    args = argv if argv is not None else sys.argv[1:]
    return {
        "command": " ".join(["python", Path(sys.argv[0]).name, *args]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine_info(device),
    }


def emit_json(result: dict, out: str | None) -> None:
    """A benchmark script's result: written to ``out`` as indented JSON, or printed when no file is named."""
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=1)
    else:
        print(json.dumps(result, indent=1))


def _version(distribution: str) -> str | None:
    """An installed distribution's version (None where it is not installed), read without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _device_name(device: str) -> str:
    """The GPU's name on a CUDA device (torch is installed there), else the CPU's."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    return cpu_name()


def machine_info(device: str) -> dict:
    """Where the benchmark ran: hardware, software versions, threads and load.

    ``torch`` and ``transformers`` are None where the hf extra is not installed; ``torch_threads`` (its name kept
    for the records' schema) is the thread count of the model's passes
    (:func:`specwise.models.threads.get_num_threads`).
    """
    import specwise
    from specwise.models.threads import get_num_threads

    return {
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_generation": cpu_generation(),
        "cpu_flags": vector_flags(),
        "kernel_isa": _kernel_isa(),
        "cpu_count": os.cpu_count() or 0,
        "python": platform.python_version(),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "specwise": specwise.__version__,
        "device": str(device),
        "device_name": _device_name(device),
        "torch_threads": get_num_threads(),
        "load_average_start": load_average(),
        "load_average_end": None,
    }
