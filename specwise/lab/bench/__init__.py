"""Benchmarks: Spec-Bench-style runs with baselines and peers (``specwise bench``), reports and plots, and the
theory drawn from toy models (``specwise simulate``). See docs/BENCHMARKS.md.

The names below are imported on first use: importing one part (``specwise.lab.bench.fetch``, a program of its own)
does not import the runner, which sits above the engine."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specwise.lab.bench.configs import BenchConfig, BenchSettings, make_configs
    from specwise.lab.bench.prompts import BenchPrompt, default_prompts, load_questions, select_prompts
    from specwise.lab.bench.runner import run_bench
    from specwise.lab.bench.schema import validate_results

__all__ = [
    "BenchConfig",
    "BenchPrompt",
    "BenchSettings",
    "default_prompts",
    "load_questions",
    "make_configs",
    "run_bench",
    "select_prompts",
    "validate_results",
]

_HOMES = {
    "BenchConfig": "specwise.lab.bench.configs",
    "BenchSettings": "specwise.lab.bench.configs",
    "make_configs": "specwise.lab.bench.configs",
    "BenchPrompt": "specwise.lab.bench.prompts",
    "default_prompts": "specwise.lab.bench.prompts",
    "load_questions": "specwise.lab.bench.prompts",
    "select_prompts": "specwise.lab.bench.prompts",
    "run_bench": "specwise.lab.bench.runner",
    "validate_results": "specwise.lab.bench.schema",
}


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
