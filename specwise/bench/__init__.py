"""Benchmarks: Spec-Bench-style runs with baselines and peers (``specwise bench``), reports and plots, and the
theory drawn from toy models (``specwise simulate``). See docs/BENCHMARKS.md.

The names below are imported on first use: importing one part (``specwise.bench.fetch``, which the drafters read)
does not import the runner, which sits above the engine."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specwise.bench.configs import BenchConfig, BenchSettings, make_configs
    from specwise.bench.prompts import BenchPrompt, default_prompts, load_questions, select_prompts
    from specwise.bench.runner import run_bench
    from specwise.bench.schema import validate_results

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
    "BenchConfig": "specwise.bench.configs",
    "BenchSettings": "specwise.bench.configs",
    "make_configs": "specwise.bench.configs",
    "BenchPrompt": "specwise.bench.prompts",
    "default_prompts": "specwise.bench.prompts",
    "load_questions": "specwise.bench.prompts",
    "select_prompts": "specwise.bench.prompts",
    "run_bench": "specwise.bench.runner",
    "validate_results": "specwise.bench.schema",
}


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
