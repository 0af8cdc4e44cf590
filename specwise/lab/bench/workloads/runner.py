"""Run coding workloads through every configuration's server, interleaved, and gather the results object.

Every server is started first (one per configuration) and kept to the end. For each round, request and seed,
every configuration sends the request back to back, the order rotated from one job to the next (job j of round r
starts at configuration r + j), so that the machine's drifts fall on all of them alike. An agent trace's turns run
in order, so each server's prompt cache holds the conversation so far, as it would for a client; so do a recorded
trace's (``agent-traces``), whose per-trace figures are :func:`specwise.lab.bench.workloads.traces.trace_summary`'s.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from specwise.lab.bench.paired import paired_speedups
from specwise.lab.bench.workloads import TRACES, Request, workload_requests
from specwise.lab.bench.workloads.client import Sampling, send
from specwise.lab.bench.workloads.servers import LLAMA_CPP, PLAIN, SPECWISE, ServeConfig
from specwise.lab.bench.workloads.traces import trace_requests, trace_summary, warmup_request

__all__ = ["DEFAULT_MAX_TOKENS", "RESULTS_KIND", "WorkloadSettings", "run_workloads", "summarize"]

RESULTS_KIND = "specwise-coding-workloads"
SCHEMA_VERSION = 1
# tokens per answer: a rewrite is as long as its original; a FIM middle a few lines; an agent turn a call or a quote
DEFAULT_MAX_TOKENS = {"code-edit": 1536, "fim": 128, "agent": 512, TRACES: 256}
MEASURES = ("decode_tokens_per_second", "tokens_per_second")
WARMUP_TOKENS = 8


@dataclass
class WorkloadSettings:
    """What a workload run does: the workloads and configurations, the target (and its GGUF file for llama.cpp),
    the draft model, sampling, rounds, seeds, the first ``limit`` items of each workload, the folders of recorded
    ``traces`` (for ``agent-traces``)."""

    target: str
    workloads: list[str]
    configs: list[ServeConfig]
    temperature: float = 0.0
    seeds: list[int] = field(default_factory=lambda: [0])
    rounds: int = 1
    limit: int | None = None
    max_tokens: int | None = None
    threads: int = 2
    draft_model: str | None = None
    llama_cpp: str | None = None
    warmup: bool = True
    traces: list[str] = field(default_factory=list)

    def tokens_for(self, workload: str) -> int:
        return self.max_tokens if self.max_tokens is not None else DEFAULT_MAX_TOKENS[workload]


def _rotate(items: list, shift: int) -> list:
    shift %= len(items)
    return items[shift:] + items[:shift]


def workload_items(settings: WorkloadSettings) -> list[Request]:
    """Every workload's requests, in the order of ``settings.workloads``."""
    requests = []
    for workload in settings.workloads:
        if workload == TRACES:
            requests += trace_requests(settings.traces, settings.limit)
        else:
            requests += workload_requests(workload, settings.limit)
    return requests


def _jobs(settings: WorkloadSettings, requests: list[Request]) -> list[tuple[int, Request, int]]:
    """(round, request, seed) in run order: rounds, then requests in their workload's order, then seeds."""
    return [(r, req, seed) for r in range(settings.rounds) for req in requests for seed in settings.seeds]


Sender = Callable[..., dict]


def _run_one(sender: Sender, config: ServeConfig, url: str, request: Request, sampling: Sampling) -> dict:
    """One measured request; a failure is recorded (``error``) rather than ending the run."""
    try:
        return sender(config.peer, url, request, sampling, prediction=config.prediction)
    except Exception as err:  # the server's answer (a 400, a dropped connection) is a result to report
        return {"error": f"{type(err).__name__}: {err}"[:500]}


def _warmup(sender: Sender, configs: list[ServeConfig], urls: dict[str, str], requests: list[Request]) -> None:
    """The first request of each workload once per configuration, a few tokens, not recorded (for agent traces a short
    chat instead: a trace's first turn would leave its prompt in the server's cache)."""
    firsts = {r.workload: warmup_request() if r.workload == TRACES else r for r in reversed(requests)}
    for config in configs:
        for request in firsts.values():
            _run_one(sender, config, urls[config.id], request, Sampling(0.0, WARMUP_TOKENS, 0))


def run_workloads(
    settings: WorkloadSettings,
    urls: dict[str, str],
    *,
    command: str,
    machine: dict,
    sender: Sender = send,
    progress: bool = True,
) -> dict:
    """Every job through every configuration (its server at ``urls[config.id]``); the results object."""
    requests = workload_items(settings)
    if settings.warmup:
        _warmup(sender, settings.configs, urls, requests)
    runs = []
    jobs = _jobs(settings, requests)
    for j, (round_, request, seed) in enumerate(jobs):
        sampling = Sampling(settings.temperature, settings.tokens_for(request.workload), seed)
        for order, config in enumerate(_rotate(settings.configs, round_ + j)):
            figures = _run_one(sender, config, urls[config.id], request, sampling)
            runs.append(_record(config, request, seed, round_, order, figures))
        if progress:
            print(f"\r{j + 1}/{len(jobs)} requests", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    machine = {**machine, "load_average_end": _load()}
    return assemble(settings, requests, runs, command=command, machine=machine)


def _load():
    from specwise.lab.bench.environment import load_average

    return load_average()


def _record(config: ServeConfig, request: Request, seed: int, round_: int, order: int, figures: dict) -> dict:
    return {
        "config": config.id,
        "peer": config.peer,
        "workload": request.workload,
        "category": request.workload,
        "prompt_id": request.id,
        "item_id": request.item_id,
        "turn": request.turn,
        **({"route": request.route} if request.route else {}),
        "seed": seed,
        "round": round_,
        "order": order,
        **figures,
    }


def assemble(settings: WorkloadSettings, requests: list[Request], runs: list[dict], *, command: str, machine: dict):
    """The results object from the runs: settings, requests, runs, greedy check, summary, paired speedups."""
    greedy = settings.temperature == 0
    check = greedy_check(runs) if greedy else {"greedy": False, "all_identical": None, "mismatches": []}
    configs = [asdict(c) for c in settings.configs]
    results = {
        "kind": RESULTS_KIND,
        "schema_version": SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command,
        "machine": machine,
        "settings": {
            **{k: v for k, v in asdict(settings).items() if k != "configs"},
            "max_tokens": {w: settings.tokens_for(w) for w in settings.workloads},
            "greedy": greedy,
        },
        "configurations": configs,
        "workloads": list(settings.workloads),
        "requests": [_request_entry(r) for r in requests],
        "runs": runs,
        "greedy_check": check,
    }
    results.update(summarize(results))
    return results


def _request_entry(request: Request) -> dict:
    entry = {"id": request.id, "workload": request.workload, "item_id": request.item_id, "turn": request.turn}
    return entry | ({"route": request.route} if request.route else {})


def greedy_check(runs: list[dict]) -> dict:
    """Greedy only: each speculative run's text against its own peer's plain run of the same request, seed and
    round (specwise: must be identical; llama.cpp: reported). Marks each run's ``identical_to_plain``."""
    plain = {(r["config"], r["prompt_id"], r["seed"], r["round"]): r.get("text") for r in runs}
    mismatches, llama = [], {"identical": 0, "total": 0}
    for run in runs:
        base = PLAIN[run["peer"]]
        reference = plain.get((base, run["prompt_id"], run["seed"], run["round"]))
        if run["config"] == base or reference is None or "error" in run:
            run["identical_to_plain"] = None
            continue
        same = run.get("text") == reference
        run["identical_to_plain"] = same
        if run["peer"] == SPECWISE and not same:
            mismatches.append({k: run[k] for k in ("config", "prompt_id", "seed", "round")})
        if run["peer"] == LLAMA_CPP:
            llama["identical"] += same
            llama["total"] += 1
    checked = [r for r in runs if r["peer"] == SPECWISE and r["identical_to_plain"] is not None]
    return {
        "greedy": True,
        "checked_runs": len(checked),
        "all_identical": not mismatches if checked else None,
        "mismatches": mismatches,
        "llama_cpp_identical": llama if llama["total"] else None,
    }


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _summary_entry(config: str, workload: str, runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    accepted = [r.get("accepted_prediction_tokens") for r in ok]
    return {
        "config": config,
        "workload": workload,
        "runs": len(runs),
        "errors": len(runs) - len(ok),
        "completion_tokens": sum(r["completion_tokens"] for r in ok),
        "decode_tokens_per_second_median": _median([r["decode_tokens_per_second"] for r in ok]),
        "tokens_per_second_median": _median([r["tokens_per_second"] for r in ok]),
        "server_decode_tokens_per_second_median": _median([r.get("server_decode_tokens_per_second") for r in ok]),
        "seconds_median": _median([r["seconds"] for r in ok]),
        "ttft_seconds_median": _median([r["ttft_seconds"] for r in ok]),
        "accepted_prediction_tokens": sum(a for a in accepted if a) if any(a is not None for a in accepted) else None,
        "cached_tokens": sum(r.get("cached_tokens") or 0 for r in ok),
    }


def _best_llama(summary: list[dict], workloads: list[str]) -> dict[str, str]:
    """Per workload (and ``all``), the llama.cpp configuration with the highest median decode tokens/s."""
    best = {}
    for workload in [*workloads, "all"]:
        entries = [
            s
            for s in summary
            if s["workload"] == workload
            and s["config"].startswith(LLAMA_CPP)
            and s["decode_tokens_per_second_median"] is not None
        ]
        if entries:
            best[workload] = max(entries, key=lambda s: s["decode_tokens_per_second_median"])["config"]
    return best


def _pairs(runs: list[dict], config: str, baseline: str, workloads: list[str], against: str) -> list[dict]:
    out = []
    for measure in MEASURES:
        for entry in paired_speedups(runs, config, baseline, workloads, field=measure):
            out.append({**entry, "workload": entry["category"], "against": against})
    return out


def summarize(results: dict) -> dict:
    """``summary`` (per configuration and workload, and ``all``), ``best_llama_cpp`` and ``paired``: each
    configuration against its own peer's plain decoding, and each specwise configuration against llama.cpp's plain
    decoding and against llama.cpp's best configuration of each workload; on decode tokens/s and end to end; with
    agent traces, ``traces``: per configuration and trace, each turn's figures and the trace's total time."""
    runs, workloads = results["runs"], results["workloads"]
    ids = [c["id"] for c in results["configurations"]]
    summary = []
    for config in ids:
        for workload in [*workloads, "all"]:
            chosen = [r for r in runs if r["config"] == config and workload in ("all", r["workload"])]
            if chosen:
                summary.append(_summary_entry(config, workload, chosen))
    best = _best_llama(summary, workloads)
    ok = [r for r in runs if "error" not in r]
    paired = []
    for config in ids:
        own = PLAIN[LLAMA_CPP if config.startswith(LLAMA_CPP) else SPECWISE]
        if config != own and own in ids:
            paired += _pairs(ok, config, own, workloads, "own plain")
        if config.startswith(SPECWISE) and PLAIN[LLAMA_CPP] in ids:
            paired += _pairs(ok, config, PLAIN[LLAMA_CPP], workloads, "llama.cpp plain")
        if config.startswith(SPECWISE):
            for workload, baseline in best.items():
                if workload == "all":
                    continue
                entries = _pairs(ok, config, baseline, [workload], "llama.cpp best")
                paired += [e for e in entries if e["workload"] == workload]
    out = {"summary": summary, "best_llama_cpp": best, "paired": paired}
    if TRACES in workloads:
        out["traces"] = trace_summary(runs, ids, PLAIN[LLAMA_CPP] if PLAIN[LLAMA_CPP] in ids else None)
    return out
