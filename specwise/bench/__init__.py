"""Benchmarks: Spec-Bench-style runs with baselines and peers (``specwise bench``), reports and plots, and the
theory drawn from toy models (``specwise simulate``). See docs/BENCHMARKS.md."""

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
