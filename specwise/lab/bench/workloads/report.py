"""The coding workloads' report: ``report.md`` and two PNG plots, rendered from the results object alone (so a
saved ``results.json`` re-renders with ``--report-only``)."""

from __future__ import annotations

from pathlib import Path

from specwise.lab.bench.report import _figure, _fmt, _table

__all__ = ["PLOT_FILES", "check_results", "render_markdown", "write_report"]

PLOT_FILES = {"decode": "workload_decode_tps.png", "vs_llama": "workload_vs_llama_cpp.png"}
_REQUIRED = ("kind", "command", "settings", "configurations", "workloads", "runs", "summary", "paired")


def check_results(results: dict) -> None:
    """Refuse an object that is not a coding-workloads result, naming the missing field."""
    from specwise.lab.bench.workloads.runner import RESULTS_KIND

    if not isinstance(results, dict) or results.get("kind") != RESULTS_KIND:
        raise ValueError(f"not a coding-workloads result (kind {RESULTS_KIND!r}): run `specwise bench --workload`")
    for key in _REQUIRED:
        if key not in results:
            raise ValueError(f"the result has no {key!r} field")


def _labels(results: dict) -> dict[str, str]:
    return {c["id"]: c["label"] for c in results["configurations"]}


def _paired(results: dict, config: str, workload: str, against: str, measure: str) -> dict | None:
    return next(
        (
            p
            for p in results["paired"]
            if p["config"] == config
            and p["workload"] == workload
            and p["against"] == against
            and p["measure"] == measure
        ),
        None,
    )


def _interval(entry: dict | None) -> str:
    if entry is None or entry["geomean"] is None:
        return "–"
    if entry["low"] is None:
        return f"{entry['geomean']:.2f}x (1 question)"
    return f"{entry['geomean']:.2f}x [{entry['low']:.2f}, {entry['high']:.2f}] {entry['verdict']}"


def _header(results: dict) -> list[str]:
    s, m = results["settings"], results.get("machine", {})
    decoding = "greedy (temperature 0)" if s["greedy"] else f"sampling at temperature {s['temperature']}"
    lines = [
        "# specwise coding workloads",
        "",
        f"Command: `{results['command']}`",
        "",
        f"- target: {s['target']}; draft model: {s.get('draft_model') or '–'}",
        f"- machine: {m.get('device_name', '?')}; {m.get('cpu_count', '?')} CPUs; server threads {s['threads']}; "
        f"load {m.get('load_average_start')} → {m.get('load_average_end')}",
        f"- {decoding}; seeds {s['seeds']}; {s['rounds']} round(s); max tokens {s['max_tokens']}",
        "- measured through each server's API, streamed (the `openai` client; llama.cpp's `/infill` for FIM): "
        "decode tokens/s = (completion tokens − 1) ÷ (last output chunk − first output chunk); total = request "
        "sent to last chunk; the server's decode tok/s is its own report (specwise's usage statistics, llama.cpp's "
        "timings), and it is the decode tok/s of a reply the stream cannot time (fewer than 3 output chunks, as a "
        "tool call parsed from the whole output is sent at the end)",
        "",
    ]
    return lines


def _greedy(results: dict) -> list[str]:
    check = results["greedy_check"]
    if not check.get("greedy"):
        return []
    if check["all_identical"] is False:
        rows = [
            f"- {m['config']} on {m['prompt_id']} (seed {m['seed']}, round {m['round']})" for m in check["mismatches"]
        ]
        return ["**GREEDY MISMATCH**: these specwise outputs differ from specwise plain decoding:", "", *rows, ""]
    llama = check.get("llama_cpp_identical")
    peer = (
        f"; llama.cpp's speculative outputs equal its plain ones in {llama['identical']}/{llama['total']}"
        if llama
        else ""
    )
    return [f"Greedy check: every specwise output equals plain decoding ({check['checked_runs']} runs){peer}.", ""]


def _errors(results: dict) -> list[str]:
    failed = [r for r in results["runs"] if "error" in r]
    if not failed:
        return []
    rows = [f"- {r['config']} on {r['prompt_id']}: {r['error']}" for r in failed[:20]]
    return [f"**{len(failed)} requests failed** (left out of every figure):", "", *rows, ""]


def _workload_table(results: dict, workload: str) -> list[str]:
    labels = _labels(results)
    best = results.get("best_llama_cpp", {}).get(workload)
    best_label = f"vs llama.cpp best ({labels.get(best, '–')})"
    header = ["configuration", "runs", "decode tok/s", "server's decode tok/s", "total s", "TTFT s",
              "accepted pred.", "vs own plain", "vs llama.cpp plain", best_label]  # fmt: skip
    rows = []
    for entry in (s for s in results["summary"] if s["workload"] == workload):
        config = entry["config"]
        measure = "decode_tokens_per_second"
        rows.append(
            [
                labels[config],
                f"{entry['runs']}" + (f" ({entry['errors']} failed)" if entry["errors"] else ""),
                _fmt(entry["decode_tokens_per_second_median"], 1),
                _fmt(entry.get("server_decode_tokens_per_second_median"), 1),
                _fmt(entry["seconds_median"], 2),
                _fmt(entry["ttft_seconds_median"], 2),
                "–" if entry["accepted_prediction_tokens"] is None else str(entry["accepted_prediction_tokens"]),
                _interval(_paired(results, config, workload, "own plain", measure)),
                _interval(_paired(results, config, workload, "llama.cpp plain", measure)),
                _interval(_paired(results, config, workload, "llama.cpp best", measure)),
            ]
        )
    title = "all workloads" if workload == "all" else workload
    return [f"## {title}", "", *_table(header, rows), ""]


def _seconds(value) -> str:
    return _fmt(value, 2)


def _traces(results: dict) -> list[str]:
    """Agent traces: per trace and configuration the total time (and against llama.cpp plain), then every turn."""
    entries = results.get("traces")
    if not entries:
        return []
    labels = _labels(results)
    entries = sorted(entries, key=lambda e: e["trace"])  # stable: the configurations' order within a trace
    totals = [
        [
            e["trace"],
            labels.get(e["config"], e["config"]),
            f"{e['measured_turns']}/{len(e['turns'])}",
            _seconds(e["total_seconds"]),
            _seconds(e["turns"][0]["ttft_seconds"]),
            _versus(e),
        ]
        for e in entries
    ]
    header = ["trace", "configuration", "turns measured", "total s", "first turn's TTFT s", "time ÷ llama.cpp plain"]
    failed = any(t.get("error") for e in entries for t in e["turns"])
    turns = [
        [
            e["trace"],
            str(t["turn"]),
            t["route"] or "–",
            labels.get(e["config"], e["config"]),
            _fmt(t["prompt_tokens"], 0),
            _fmt(t["cached_tokens"], 0),
            _seconds(t["ttft_seconds"]),
            _seconds(t["seconds"]),
            _fmt(t["decode_tokens_per_second"], 1),
            _fmt(t["server_decode_tokens_per_second"], 1),
        ]
        + ([f"{t['errors']} failed: {t['error'][:80]}" if t.get("error") else ""] if failed else [])
        for e in entries
        for t in e["turns"]
    ]
    turn_header = ["trace", "turn", "route", "configuration", "prompt tokens", "cached tokens", "TTFT s", "total s",
                   "decode tok/s", "server's decode tok/s", *(["failures"] if failed else [])]  # fmt: skip
    return [
        "## agent-traces: each trace",
        "",
        "A trace's turns are sent in order, as recorded (the next turn is the agent's, not this server's answer), "
        "each server keeping its prompt cache. Total: the turns' times summed (each turn's median over rounds and "
        "seeds); time ÷ llama.cpp plain: over the turns both served.",
        "",
        *_table(header, totals),
        "",
        "### agent-traces: each turn",
        "",
        "Medians over rounds and seeds. Cached tokens: the prompt tokens the server reported finding in its cache "
        "(specwise's usage; llama.cpp's `timings.cache_n`).",
        "",
        *_table(turn_header, turns),
        "",
    ]


def _versus(entry: dict) -> str:
    ratio, shared = entry["vs_llama_cpp_plain"], entry["shared_turns"]
    return "–" if ratio is None else f"{ratio:.2f}x ({shared} turn{'s' if shared != 1 else ''})"


def _servers(results: dict) -> list[str]:
    """Each server's peak resident memory over the whole run (its own process)."""
    servers = results.get("servers")
    if not servers:
        return []
    labels = _labels(results)
    rows = [
        [labels.get(cid, cid), _fmt(s["peak_rss_mib"], 1) if s["peak_rss_mib"] is not None else s["peak_rss_reason"]]
        for cid, s in servers.items()
    ]
    return [
        "## Servers' peak memory",
        "",
        "Each configuration's server process, its peak resident memory from start to the end of the run "
        "(`VmHWM`: weights, caches and the server's own included).",
        "",
        *_table(["configuration", "peak MiB"], rows),
        "",
    ]


def render_markdown(results: dict, plots: list[str]) -> str:
    """The report: header, greedy check, failures, one table per workload (medians; paired speedups on decode
    tokens/s with 95% intervals), agent traces turn by turn, the servers' memory, the plots."""
    lines = _header(results) + _greedy(results) + _errors(results)
    for workload in [*results["workloads"], "all"]:
        lines += _workload_table(results, workload)
    lines += _traces(results) + _servers(results)
    lines += [
        "Speedups are paired (the same request and seed, back to back; geometric mean over requests of each "
        "one's mean over rounds) with 95% Student-t intervals; *llama.cpp best* is, per workload, llama.cpp's "
        "configuration with the highest median decode tokens/s.",
        "",
    ]
    lines += [f"![{name}]({name})" for name in plots]
    return "\n".join(lines) + "\n"


def _plot_decode(results: dict, path: Path) -> None:
    workloads, configs = [*results["workloads"], "all"], results["configurations"]
    entries = {(s["config"], s["workload"]): s for s in results["summary"]}
    fig, ax = _figure(max(8.0, 1.6 * len(workloads) + 3))
    width = 0.8 / max(len(configs), 1)
    for i, c in enumerate(configs):
        values = [(entries.get((c["id"], w)) or {}).get("decode_tokens_per_second_median") or 0.0 for w in workloads]
        ax.bar(
            [x + (i - (len(configs) - 1) / 2) * width for x in range(len(workloads))], values, width, label=c["label"]
        )
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("median decode tokens/s")
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)


def _plot_vs_llama(results: dict, path: Path) -> None:
    workloads = [*results["workloads"], "all"]
    configs = [c for c in results["configurations"] if c["peer"] == "specwise"]
    fig, ax = _figure(max(8.0, 1.6 * len(workloads) + 3))
    width = 0.8 / max(len(configs), 1)
    for i, c in enumerate(configs):
        found = [_paired(results, c["id"], w, "llama.cpp plain", "decode_tokens_per_second") for w in workloads]
        values = [(e or {}).get("geomean") or 0.0 for e in found]
        low = [v - e["low"] if e and e["low"] is not None else 0.0 for v, e in zip(values, found)]
        high = [e["high"] - v if e and e["high"] is not None else 0.0 for v, e in zip(values, found)]
        xs = [x + (i - (len(configs) - 1) / 2) * width for x in range(len(workloads))]
        ax.bar(xs, values, width, yerr=[low, high], capsize=3, label=c["label"])
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("decode speed ÷ llama.cpp plain (paired, 95% interval)")
    if configs:
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)


def write_report(results: dict, out_dir: Path | str) -> list[Path]:
    """Check ``results`` and write ``report.md`` and the plots into ``out_dir``; returns the files written."""
    check_results(results)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = []
    for key, draw in (("decode", _plot_decode), ("vs_llama", _plot_vs_llama)):
        draw(results, out / PLOT_FILES[key])
        plots.append(out / PLOT_FILES[key])
    report = out / "report.md"
    report.write_text(render_markdown(results, [p.name for p in plots]), encoding="utf-8")
    return [report, *plots]
