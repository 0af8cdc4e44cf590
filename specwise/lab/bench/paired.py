"""Paired speedups with 95% Student-t intervals, and the verdict each interval supports.

A speedup is measured in pairs: a method's run and its baseline's run of the same question (prompt and seed) in
the same round, back to back on the same machine, so that slow drifts of the machine fall on both. A question's
speedup is the geometric mean over its rounds of the pair ratios (rounds of one greedy answer differ by timing
noise only, so averaging them first keeps the noise out of the spread between questions). The interval is a
Student-t interval on the questions' log speedups, so it states what another set of questions like these would
show, not just another round of the same ones:

    faster                     the whole interval is above 1
    slower                     the whole interval is below 1
    no measurable difference   the interval holds 1 (or there is only one question: no spread to measure)

Everything here is plain Python on numbers and run records, so it is tested on fixed inputs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from functools import lru_cache

__all__ = [
    "FASTER",
    "NO_DIFFERENCE",
    "SLOWER",
    "geometric_interval",
    "paired_speedups",
    "t_quantile",
    "verdict",
]

FASTER = "faster"
SLOWER = "slower"
NO_DIFFERENCE = "no measurable difference"
CONFIDENCE = 0.95


def _t_density(x: float, dof: int) -> float:
    log_c = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    return math.exp(log_c - (dof + 1) / 2 * math.log1p(x * x / dof))


def _t_cdf_above_half(x: float, dof: int, steps: int = 2000) -> float:
    """P(T <= x) for x >= 0: 1/2 plus the density integrated from 0 to x (Simpson's rule, smooth integrand)."""
    h = x / steps
    total = _t_density(0.0, dof) + _t_density(x, dof)
    total += sum((4 if i % 2 else 2) * _t_density(i * h, dof) for i in range(1, steps))
    return 0.5 + total * h / 3


@lru_cache(maxsize=256)
def t_quantile(p: float, dof: int) -> float:
    """The p-quantile (p in [0.5, 1)) of Student's t distribution with ``dof`` degrees of freedom, to ~1e-6."""
    if not 0.5 <= p < 1:
        raise ValueError(f"p must be in [0.5, 1), got {p}")
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    low, high = 0.0, 1.0
    while _t_cdf_above_half(high, dof) < p:
        high *= 2
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_cdf_above_half(mid, dof) < p else (low, mid)
    return (low + high) / 2


def verdict(low: float | None, high: float | None) -> str:
    """``faster`` when the interval lies above 1, ``slower`` below 1, else ``no measurable difference``."""
    if low is not None and low > 1:
        return FASTER
    if high is not None and high < 1:
        return SLOWER
    return NO_DIFFERENCE


def geometric_interval(ratios: Sequence[float]) -> dict:
    """Geometric mean of positive ratios with a 95% Student-t interval on their logs and its verdict.

    ``low``/``high`` are null with a single ratio (no spread to measure); ``n`` counts the ratios.
    """
    logs = [math.log(r) for r in ratios if r > 0 and math.isfinite(r)]
    if not logs:
        return {"n": 0, "geomean": None, "low": None, "high": None, "verdict": NO_DIFFERENCE}
    mean = statistics.fmean(logs)
    low = high = None
    if len(logs) > 1:
        half = t_quantile(0.5 + CONFIDENCE / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        low, high = math.exp(mean - half), math.exp(mean + half)
    return {"n": len(logs), "geomean": math.exp(mean), "low": low, "high": high, "verdict": verdict(low, high)}


def _question_speedups(runs: Iterable[dict], config: str, baseline: str, field: str) -> dict[tuple, dict]:
    """{(category, prompt id, seed): {"ratio", "rounds"}}: per question, the geometric mean over rounds of
    config / baseline (``field`` of each run: tokens per second, higher is faster)."""
    by_key: dict[tuple, dict[str, float]] = {}
    for run in runs:
        if run["config"] in (config, baseline) and run.get(field):
            key = (run["category"], run["prompt_id"], run["seed"], run.get("round", 0))
            by_key.setdefault(key, {})[run["config"]] = run[field]
    logs: dict[tuple, list[float]] = {}
    for (category, prompt_id, seed, _round), pair in by_key.items():
        if config in pair and baseline in pair:
            logs.setdefault((category, prompt_id, seed), []).append(math.log(pair[config] / pair[baseline]))
    return {key: {"ratio": math.exp(statistics.fmean(v)), "rounds": len(v)} for key, v in logs.items()}


def paired_speedups(
    runs: Sequence[dict], config: str, baseline: str, categories: Sequence[str], field: str = "tokens_per_second"
) -> list[dict]:
    """Paired speedup of ``config`` over ``baseline`` per category and over ``all``, from run records
    (``config``, ``category``, ``prompt_id``, ``seed``, ``round`` and ``field`` of each run).

    One entry per category with at least one pair: ``config``, ``baseline``, ``category``, ``measure`` (the
    field), ``questions``, ``pairs`` (question-round pairs), then :func:`geometric_interval`'s ``geomean``,
    ``low``, ``high`` and ``verdict`` over the questions' speedups.
    """
    questions = _question_speedups(runs, config, baseline, field)
    entries = []
    for category in [*categories, "all"]:
        chosen = [q for key, q in questions.items() if category == "all" or key[0] == category]
        if not chosen:
            continue
        interval = geometric_interval([q["ratio"] for q in chosen])
        entries.append(
            {
                "config": config,
                "baseline": baseline,
                "category": category,
                "measure": field,
                "questions": len(chosen),
                "pairs": sum(q["rounds"] for q in chosen),
                **{name: interval[name] for name in ("geomean", "low", "high", "verdict")},
            }
        )
    return entries
