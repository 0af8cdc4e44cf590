"""The results of ``specwise bench``: a run's outcome and record, the summaries and paired speedups over them, the
``results.json`` object (:func:`assemble_results`) and its schema (:data:`SCHEMA`, :func:`validate_results`; the
fields are described in docs/BENCHMARKS.md)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime, timezone

from specwise.lab.bench.configs import (
    HF_ASSISTED,
    HF_GENERATE,
    HF_GENERATE_ID,
    LLAMA_CPP,
    LLAMA_CPP_ID,
    PLAIN_ID,
    SPECWISE,
    BenchConfig,
    BenchSettings,
)
from specwise.lab.bench.paired import paired_speedups
from specwise.lab.bench.prompts import BenchPrompt
from specwise.metrics import SpecStats

__all__ = [
    "SCHEMA_VERSION",
    "SCHEMA",
    "OPTIONAL",
    "Outcome",
    "RunRecord",
    "assemble_results",
    "greedy_check",
    "paired_summary",
    "summarize",
    "validate_results",
]

SCHEMA_VERSION = 2


@dataclass
class Outcome:
    """What one run produced: the new tokens, wall seconds (prefill included) and, for specwise, its SpecStats.

    ``decode_seconds``: the seconds after the prompt's pass, where the method reports them (llama.cpp's own
    ``eval time``); specwise's come from its stats. ``new_tokens``: the count, where ``token_ids`` are not known
    while the run is timed (llama.cpp: they are filled in afterwards). ``peak_rss_mib``: this process's peak resident
    memory while the run ran (:mod:`specwise.lab.bench.memory`), or None (not measured, or another process ran it).
    """

    token_ids: list[int]
    seconds: float
    finish_reason: str
    target_passes: int
    stats: SpecStats | None = None
    decode_seconds: float | None = None
    new_tokens: int | None = None
    peak_rss_mib: float | None = None

    @property
    def count(self) -> int:
        """The number of new tokens."""
        return self.new_tokens if self.new_tokens is not None else len(self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        if self.stats is not None:
            return self.stats.tokens_per_second
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float | None:
        """New tokens per second after the prompt's pass (prefill excluded, as llama.cpp counts), where known."""
        decode = self.decode_seconds
        if decode is None and self.stats is not None:
            decode = self.stats.total_seconds - self.stats.prefill_seconds
        return self.count / decode if decode else None


@dataclass
class RunRecord:
    """One measured run of one configuration on one prompt and seed."""

    config: BenchConfig
    prompt: BenchPrompt
    seed: int
    order: int  # position of this configuration in the prompt's rotated order
    outcome: Outcome
    round: int = 0
    identical_to_plain: bool | None = None  # greedy only: token ids equal the plain engine's for this prompt
    first_difference: int | None = None  # index of the first differing token, when not identical

    def to_dict(self) -> dict:
        out = self.outcome
        return {
            "config": self.config.id,
            "method": self.config.method,
            "prompt_id": self.prompt.id,
            "category": self.prompt.category,
            "seed": self.seed,
            "round": self.round,
            "order": self.order,
            "new_tokens": out.count,
            "seconds": out.seconds,
            "tokens_per_second": out.tokens_per_second,
            "decode_tokens_per_second": out.decode_tokens_per_second,
            "target_passes": out.target_passes,
            "finish_reason": out.finish_reason,
            "identical_to_plain": self.identical_to_plain,
            "first_difference": self.first_difference,
            "stats": out.stats.to_dict() if out.stats is not None else None,
            "peak_rss_mib": out.peak_rss_mib,
        }


# ---------------------------------------------------------------------------------------------------- results


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _summary_entry(config: BenchConfig, category: str, runs: list[RunRecord], medians: dict) -> dict:
    """Statistics of one configuration over one category's runs (``all``: every run)."""
    tps = medians[config.id]
    peer = config.method == LLAMA_CPP  # decode tokens/s only: paired against specwise in "paired" instead
    decode = [r.outcome.decode_tokens_per_second for r in runs]
    new = sum(r.outcome.count for r in runs)
    passes = sum(r.outcome.target_passes for r in runs)
    checked = [r.identical_to_plain for r in runs if r.identical_to_plain is not None]
    peaks = [r.outcome.peak_rss_mib for r in runs if r.outcome.peak_rss_mib is not None]
    entry = {
        "config": config.id,
        "category": category,
        "runs": len(runs),
        "new_tokens": new,
        "target_passes": passes,
        "tokens_per_second_median": tps,
        "decode_tokens_per_second_median": _median([d for d in decode if d is not None]),
        "speedup_vs_plain": None if peer else _ratio(tps, medians.get(PLAIN_ID)),
        "speedup_vs_hf_generate": None if peer else _ratio(tps, medians.get(HF_GENERATE_ID)),
        "acceptance_rate": None,
        "mean_accepted_length": new / passes if passes else None,
        "expected_mean_accepted_length": None,
        "acceptance_by_position": None,
        "greedy_identical": all(checked) if checked else None,
        "greedy_mismatches": checked.count(False),
        "stats": None,
        "acceptance_by_drafter": None,
        "peak_rss_mib": max(peaks) if peaks else None,
    }
    stats = [r.outcome.stats for r in runs if r.outcome.stats is not None]
    if stats:
        merged = SpecStats()
        for s in stats:
            merged.merge(s)
        entry["mean_accepted_length"] = merged.mean_accepted_length
        entry["stats"] = merged.to_dict()
        entry["acceptance_by_drafter"] = _by_drafter(merged)
        if merged.drafted:
            entry["acceptance_rate"] = merged.acceptance_rate
            entry["expected_mean_accepted_length"] = merged.expected_mean_accepted_length
            entry["acceptance_by_position"] = merged.acceptance_by_position
    return entry


def _by_drafter(stats: SpecStats) -> dict | None:
    """Each drafter's (each method's: ``model-tli``, ``model-slem``) steps, drafted and accepted tokens and α."""
    out = {}
    for name, counts in sorted(stats.by_drafter.items()):
        drafted = counts.get("drafted", 0)
        rate = counts.get("accepted", 0) / drafted if drafted else None
        out[name] = {**counts, "acceptance_rate": rate}
    return out or None


def summarize(configs: list[BenchConfig], records: list[RunRecord], categories: list[str]) -> list[dict]:
    """One entry per configuration and category, then per configuration over ``all`` categories."""
    entries = []
    for category in [*categories, "all"]:
        chosen = [r for r in records if category == "all" or r.prompt.category == category]
        by_config = {c.id: [r for r in chosen if r.config.id == c.id] for c in configs}
        medians = {cid: _median([r.outcome.tokens_per_second for r in runs]) for cid, runs in by_config.items()}
        entries += [_summary_entry(c, category, by_config[c.id], medians) for c in configs]
    return entries


def _baselines(config: BenchConfig, ids: set[str]) -> list[tuple[str, str]]:
    """(baseline, measure) pairs a configuration is compared with: the plain decoding of its own engine (end to
    end, and on decode tokens/s: the prompt's pass, which speculation does not change, left out), then the peers'
    plain decoding (Hugging Face generate; llama.cpp on decode tokens/s, as it reports them)."""
    if config.method == HF_ASSISTED:
        return [(HF_GENERATE_ID, "tokens_per_second")]
    if config.method != SPECWISE:
        return []
    pairs = [] if config.id == PLAIN_ID else [(PLAIN_ID, "tokens_per_second"), (PLAIN_ID, "decode_tokens_per_second")]
    if HF_GENERATE_ID in ids:
        pairs.append((HF_GENERATE_ID, "tokens_per_second"))
    if LLAMA_CPP_ID in ids:
        pairs.append((LLAMA_CPP_ID, "decode_tokens_per_second"))
    return pairs


def paired_summary(configurations: list[dict], runs: list[dict], categories: list[str]) -> list[dict]:
    """Paired speedups (95% intervals, verdicts) of every configuration over its baselines, per category and over
    ``all``, from the results' configurations and run records (see :mod:`specwise.lab.bench.paired`)."""
    configs = [BenchConfig(c["method"], c["drafter"], c["gamma"]) for c in configurations]
    ids = {c.id for c in configs}
    entries = []
    for config in configs:
        for baseline, measure in _baselines(config, ids):
            entries += paired_speedups(runs, config.id, baseline, categories, measure)
    return entries


def greedy_check(records: list[RunRecord], greedy: bool) -> dict:
    """Whether every greedy speculative output equals plain greedy output, and how often the HF runs agree."""

    def agreement(method: str) -> dict | None:
        runs = [r for r in records if r.config.method == method and r.identical_to_plain is not None]
        return {"identical": sum(r.identical_to_plain for r in runs), "total": len(runs)} if runs else None

    checked = [r for r in records if r.config.method == SPECWISE and r.identical_to_plain is not None]
    mismatches = [
        {"config": r.config.id, "prompt_id": r.prompt.id, "seed": r.seed, "first_difference": r.first_difference}
        for r in checked
        if not r.identical_to_plain
    ]
    return {
        "greedy": greedy,
        "checked_runs": len(checked),
        "all_identical": not mismatches if greedy else None,
        "mismatches": mismatches,
        "hf_generate_identical": agreement(HF_GENERATE),
        "hf_assisted_identical": agreement(HF_ASSISTED),
        "llama_cpp_identical": agreement(LLAMA_CPP),
    }


def _prompt_entries(prompts: list[BenchPrompt], encoded: dict, records: list[RunRecord], tokenizer) -> list[dict]:
    plain = {}
    for r in records:
        if r.config.id == PLAIN_ID and r.prompt.id not in plain:
            plain[r.prompt.id] = r.outcome.token_ids
    return [
        {
            "id": p.id,
            "category": p.category,
            "prompt_tokens": len(encoded[p.id]),
            "plain_text": tokenizer.decode(plain.get(p.id, []), skip_special_tokens=True),
        }
        for p in prompts
    ]


def assemble_results(
    settings: BenchSettings,
    loaded,
    configs: list[BenchConfig],
    prompts: list[BenchPrompt],
    encoded: dict,
    records: list[RunRecord],
    machine: dict,
    command: str,
    memory: dict | None = None,
) -> dict:
    """The ``results.json`` object; ``memory``: how the runs' peak memory was measured (``PeakMemory.record``)."""
    categories = list(dict.fromkeys(p.category for p in prompts))
    runs = [r.to_dict() for r in records]
    configurations = [c.to_dict() for c in configs]
    return {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine,
        "settings": {
            **settings.to_dict(),
            "target_name": loaded.name,
            "model_class": type(loaded.model).__name__,
            "num_prompts": len(prompts),
        },
        "configurations": configurations,
        "categories": categories,
        "prompts": _prompt_entries(prompts, encoded, records, loaded.tokenizer),
        "runs": runs,
        "summary": summarize(configs, records, categories),
        "paired": paired_summary(configurations, runs, categories),
        "greedy_check": greedy_check(records, settings.temperature == 0.0),
        "llama_cpp": None,
        "memory": memory,
    }


# ---------------------------------------------------------------------------------------------------- schema

_NONE = type(None)
_NUM = (int, float)
_OPT_NUM = (int, float, _NONE)

SCHEMA: dict[str, dict[str, tuple]] = {
    "results": {
        "schema_version": (int,),
        "created": (str,),
        "command": (str,),
        "machine": (dict,),
        "settings": (dict,),
        "configurations": (list,),
        "categories": (list,),
        "prompts": (list,),
        "runs": (list,),
        "summary": (list,),
        "paired": (list,),
        "greedy_check": (dict,),
        "llama_cpp": (dict, _NONE),
    },
    "machine": {
        "platform": (str,),
        "cpu": (str,),
        "cpu_count": (int,),
        "python": (str,),
        "torch": (str, _NONE),  # None: the hf extra is not installed
        "transformers": (str, _NONE),
        "specwise": (str,),
        "device": (str,),
        "device_name": (str,),
        "torch_threads": (int,),  # the threads of the model's passes (the name is the schema's since version 1)
        "load_average_start": (list, _NONE),
        "load_average_end": (list, _NONE),
    },
    "settings": {
        "target": (str,),
        "target_name": (str,),
        "model_class": (str,),
        "device": (str,),
        "drafters": (list,),
        "gammas": (list,),
        "max_new_tokens": (int,),
        "temperature": _NUM,
        "top_k": (int,),
        "top_p": _NUM,
        "min_p": _NUM,
        "seeds": (list,),
        "greedy": (bool,),
        "hf_baselines": (bool,),
        "stop_at_eos": (bool,),
        "fixed_length": (bool,),
        "chat": (bool,),
        "warmup": (bool,),
        "prompt_source": (str,),
        "categories": (list,),
        "limit_per_category": (int, _NONE),
        "rounds": (int,),
        "llama_cpp": (str, _NONE),
        "precision": (str, _NONE),
        "num_prompts": (int,),
    },
    "configuration": {"id": (str,), "label": (str,), "method": (str,), "drafter": (str,), "gamma": (int, str)},
    "prompt": {"id": (str,), "category": (str,), "prompt_tokens": (int,), "plain_text": (str,)},
    "run": {
        "config": (str,),
        "method": (str,),
        "prompt_id": (str,),
        "category": (str,),
        "seed": (int,),
        "round": (int,),
        "order": (int,),
        "new_tokens": (int,),
        "seconds": _NUM,
        "tokens_per_second": _NUM,
        "decode_tokens_per_second": _OPT_NUM,
        "target_passes": (int,),
        "finish_reason": (str,),
        "identical_to_plain": (bool, _NONE),
        "first_difference": (int, _NONE),
        "stats": (dict, _NONE),
    },
    "summary": {
        "config": (str,),
        "category": (str,),
        "runs": (int,),
        "new_tokens": (int,),
        "target_passes": (int,),
        "tokens_per_second_median": _OPT_NUM,
        "decode_tokens_per_second_median": _OPT_NUM,
        "speedup_vs_plain": _OPT_NUM,
        "speedup_vs_hf_generate": _OPT_NUM,
        "acceptance_rate": _OPT_NUM,
        "mean_accepted_length": _OPT_NUM,
        "expected_mean_accepted_length": _OPT_NUM,
        "acceptance_by_position": (list, _NONE),
        "greedy_identical": (bool, _NONE),
        "greedy_mismatches": (int,),
        "stats": (dict, _NONE),
    },
    "greedy_check": {
        "greedy": (bool,),
        "checked_runs": (int,),
        "all_identical": (bool, _NONE),
        "mismatches": (list,),
        "hf_generate_identical": (dict, _NONE),
        "hf_assisted_identical": (dict, _NONE),
        "llama_cpp_identical": (dict, _NONE),
    },
    "paired": {
        "config": (str,),
        "baseline": (str,),
        "category": (str,),
        "measure": (str,),
        "questions": (int,),
        "pairs": (int,),
        "geomean": _OPT_NUM,
        "low": _OPT_NUM,
        "high": _OPT_NUM,
        "verdict": (str,),
    },
    "llama_cpp": {"binaries": (str,), "gguf": (str,), "threads": (int,), "llama_bench_tg": (dict,)},
    "memory": {"measure": (str,), "available": (bool,), "reason": (str, _NONE)},
}
# Fields added within a version: checked where present, so that results written before them still validate.
OPTIONAL: dict[str, dict[str, tuple]] = {
    "results": {"memory": (dict, _NONE)},
    "run": {"peak_rss_mib": _OPT_NUM},
    "summary": {"peak_rss_mib": _OPT_NUM, "acceptance_by_drafter": (dict, _NONE)},
    "configuration": {"cross_vocabulary": (dict, _NONE)},
}


def _type_ok(value, allowed: tuple) -> bool:
    if isinstance(value, bool):
        return bool in allowed
    return isinstance(value, allowed)


def _check_fields(obj, kind: str, where: str, errors: list[str]) -> None:
    if not isinstance(obj, dict):
        errors.append(f"{where}: expected an object, got {type(obj).__name__}")
        return
    optional = OPTIONAL.get(kind, {})
    for name, allowed in [*SCHEMA[kind].items(), *optional.items()]:
        if name not in obj:
            if name not in optional:
                errors.append(f"{where}: missing field {name!r}")
        elif not _type_ok(obj[name], allowed):
            names = " or ".join("null" if t is _NONE else t.__name__ for t in allowed)
            errors.append(f"{where}.{name}: expected {names}, got {type(obj[name]).__name__}")


def _check_references(data: dict, errors: list[str]) -> None:
    ids = {c.get("id") for c in data["configurations"] if isinstance(c, dict)}
    if PLAIN_ID not in ids:
        errors.append(f"configurations: the plain baseline {PLAIN_ID!r} is missing")
    prompt_ids = {p.get("id") for p in data["prompts"] if isinstance(p, dict)}
    for i, run in enumerate(data["runs"]):
        if isinstance(run, dict) and (run.get("config") not in ids or run.get("prompt_id") not in prompt_ids):
            errors.append(f"runs[{i}]: unknown configuration {run.get('config')!r} or prompt {run.get('prompt_id')!r}")
    have = {(s.get("config"), s.get("category")) for s in data["summary"] if isinstance(s, dict)}
    for category in [*data["categories"], "all"]:
        errors += [f"summary: no entry for {c!r} in category {category!r}" for c in ids if (c, category) not in have]


def validate_results(data) -> None:
    """Raise ValueError listing every way ``data`` departs from the results.json schema (docs/BENCHMARKS.md)."""
    errors: list[str] = []
    _check_fields(data, "results", "results", errors)
    if not errors:
        if data["schema_version"] != SCHEMA_VERSION:
            errors.append(f"schema_version is {data['schema_version']}, this specwise reads {SCHEMA_VERSION}")
        for kind in ("machine", "settings", "greedy_check"):
            _check_fields(data[kind], kind, kind, errors)
        for kind, key in (("configuration", "configurations"), ("prompt", "prompts"), ("run", "runs")):
            for i, item in enumerate(data[key]):
                _check_fields(item, kind, f"{key}[{i}]", errors)
        for kind, key in (("summary", "summary"), ("paired", "paired")):
            for i, item in enumerate(data[key]):
                _check_fields(item, kind, f"{key}[{i}]", errors)
        if data["llama_cpp"] is not None:
            _check_fields(data["llama_cpp"], "llama_cpp", "llama_cpp", errors)
        if data.get("memory") is not None:
            _check_fields(data["memory"], "memory", "memory", errors)
        _check_references(data, errors)
    if errors:
        raise ValueError("results do not match the schema:\n  " + "\n  ".join(errors))
