"""The benchmark's report: a Markdown table (``report.md``) and PNG plots, rendered from a results.json object.

Everything here reads only the results object, so a report can be re-rendered from a saved ``results.json``.
"""

from __future__ import annotations

from pathlib import Path

from specwise.extras import missing_extra
from specwise.lab.bench.configs import HF_GENERATE_ID, LLAMA_CPP_ID, PLAIN_ID
from specwise.lab.bench.paired import FASTER, SLOWER
from specwise.lab.bench.schema import validate_results
from specwise.metrics import expected_tau

__all__ = ["PLOT_FILES", "overall_lines", "paired_lines", "render_markdown", "write_plots", "write_report"]

PLOT_FILES = {
    "speedup": "speedup_by_category.png",
    "tau": "tau_by_category.png",
    "theory": "tau_vs_theory.png",
    "position": "acceptance_by_position.png",
}
_CAPTIONS = {
    "speedup": "Speedup over plain decoding (same engine) per category",
    "tau": "τ (tokens per target pass) per category",
    "theory": "Measured τ against the i.i.d. theory (1 − α^(γ+1)) / (1 − α)",
    "position": "Acceptance by draft position",
}
DASH = "–"


def write_report(results: dict, out_dir: str | Path) -> list[Path]:
    """Validate ``results`` and write ``report.md`` and the plots into ``out_dir``; returns the files written."""
    validate_results(results)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(results, out)
    report = out / "report.md"
    report.write_text(render_markdown(results, [p.name for p in plots]), encoding="utf-8")
    return [report, *plots]


# ---------------------------------------------------------------------------------------------------- helpers


def _fmt(value, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "**NO**"
    return f"{value:.{digits}f}{suffix}"


def _table(header: list[str], rows: list[list[str]], numeric: bool = True) -> list[str]:
    """A Markdown table; with ``numeric`` every column but the first is right-aligned."""
    align = ["---" if i == 0 or not numeric else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _entries(results: dict) -> dict[tuple[str, str], dict]:
    return {(s["config"], s["category"]): s for s in results["summary"]}


def _labels(results: dict) -> dict[str, str]:
    return {c["id"]: c["label"] for c in results["configurations"]}


def _drafting(results: dict) -> list[dict]:
    """Configurations that draft (speculative ones and the HF peers)."""
    return [c for c in results["configurations"] if c["id"] not in (PLAIN_ID, HF_GENERATE_ID, LLAMA_CPP_ID)]


def _has_hf(results: dict) -> bool:
    return any(c["id"] == HF_GENERATE_ID for c in results["configurations"])


# ---------------------------------------------------------------------------------------------------- markdown


def _hf_versions(machine: dict) -> str:
    """``torch X, transformers Y, `` where the hf extra was installed (empty where not)."""
    parts = [f"{name} {machine[name]}" for name in ("torch", "transformers") if machine.get(name)]
    return "".join(part + ", " for part in parts)


def _generation(machine: dict) -> str:
    """`` (AuthenticAMD family 26 model 2; avx512 kernels)``, from what the results recorded (older runs: less)."""
    parts = [machine["cpu_generation"]] if machine.get("cpu_generation") else []
    if machine.get("kernel_isa"):
        parts.append(f"{machine['kernel_isa']} kernels")
    return f" ({'; '.join(parts)})" if parts else ""


def _header(results: dict) -> list[str]:
    s, m = results["settings"], results["machine"]
    decoding = (
        "greedy (temperature 0)"
        if s["greedy"]
        else f"sampling: temperature {s['temperature']}, top-k {s['top_k']}, top-p {s['top_p']}, min-p {s['min_p']}"
    )
    length = (
        f"exactly {s['max_new_tokens']} new tokens per run (EOS is not honoured, so every method does the same work)"
        if s["fixed_length"]
        else f"up to {s['max_new_tokens']} new tokens, stopping at EOS (runs may differ in length)"
    )
    load = f"{m['load_average_start']} → {m['load_average_end']}"
    cpus = f"{m['cpu_count']} CPUs, {m['torch_threads']} threads"
    source = "the project's own prompt set" if s["prompt_source"] == "specwise-default" else f"`{s['prompt_source']}`"
    rows = [
        ["target", f"{s['target_name']} ({s['model_class']}) on {m['device']}"],
        ["machine", f"{m['device_name']}{_generation(m)}; {cpus}; load {load}"],
        [
            "software",
            f"Python {m['python']}, {_hf_versions(m)}specwise {m['specwise']}",
        ],
        ["prompts", f"{s['num_prompts']} in {len(results['categories'])} categories from {source}"],
        ["decoding", f"{decoding}; {length}; seeds {s['seeds']}; {s['rounds']} round(s)"],
    ]
    peer = results["llama_cpp"]
    if peer is not None:
        tg = peer["llama_bench_tg"]
        rows.append(["llama.cpp", f"`{peer['binaries']}`, {peer['threads']} threads; llama-bench {_bench_figure(tg)}"])
    return [
        "# specwise benchmark",
        "",
        f"Generated {results['created']} by:",
        "",
        "```bash",
        results["command"] or "(command not recorded)",
        "```",
        "",
        *_table(["", ""], rows, numeric=False),
        "",
        "tokens/s is the median over runs (prefill included). **Speedup** = median tokens/s of a configuration ÷ "
        "median tokens/s of the baseline over the same prompts: *vs plain* is plain autoregressive decoding on the "
        "same specwise engine; *vs HF* is Hugging Face `generate` on the same weights. Every round runs all "
        "configurations on every prompt back to back in a rotated order, after one warm-up run each. "
        "**Paired** speedups divide each run by its baseline's run of the same prompt and round, take the "
        "geometric mean over rounds per prompt, and give a 95% Student-t interval over the prompts. "
        "α = accepted / drafted; τ = tokens per target pass; τ theory = (1 − α^(γ+1)) / (1 − α) averaged over the "
        "drafts actually made.",
        "",
    ]


def _bench_figure(tg: dict) -> str:
    rate, std = tg.get("tokens_per_s"), tg.get("tokens_per_s_stddev")
    test = tg.get("test", "tg")
    if not isinstance(rate, (int, float)):
        return f"{test}: {DASH}"
    return f"{test}: {rate:.1f} tokens/s" + (f" ± {std:.1f}" if isinstance(std, (int, float)) else "")


def _mismatch_lines(results: dict) -> list[str]:
    check, labels = results["greedy_check"], _labels(results)
    lines = [
        f"> **⚠ GREEDY MISMATCH: {len(check['mismatches'])} of {check['checked_runs']} speculative outputs differ "
        "from plain greedy decoding.** Speculative decoding must reproduce plain greedy output exactly; this is a "
        "bug (or a numerical near-tie broken differently by a batched verification pass) to investigate:",
        ">",
    ]
    lines += [
        f"> - {labels.get(x['config'], x['config'])}, prompt {x['prompt_id']}, seed {x['seed']}: "
        f"first difference at token {x['first_difference']}"
        for x in check["mismatches"]
    ]
    return lines


def _greedy_lines(results: dict) -> list[str]:
    check = results["greedy_check"]
    if not check["greedy"]:
        return [
            "Sampled decoding: outputs are random, so there is no token-for-token check (the exactness of the "
            "rejection rule is tested statistically in the test suite and drawn by `specwise simulate`).",
            "",
        ]
    if check["all_identical"]:
        lines = [
            f"**Greedy check passed:** all {check['checked_runs']} speculative outputs equal plain greedy output "
            "token for token."
        ]
    else:
        lines = _mismatch_lines(results)
    lines.append("")
    names = (
        ("hf_generate_identical", "Hugging Face `generate`"),
        ("hf_assisted_identical", "HF assisted"),
        ("llama_cpp_identical", "llama.cpp"),
    )
    for key, name in names:
        if check[key]:
            lines.append(
                f"{name} matched plain greedy output in {check[key]['identical']} of {check[key]['total']} runs."
            )
    return [*lines, ""]


def _overall(results: dict) -> list[str]:
    entries, hf = _entries(results), _has_hf(results)
    decode = results["llama_cpp"] is not None  # llama.cpp reports decode tokens/s only: show them for all
    header = ["configuration", "tokens/s", *(["decode tokens/s"] if decode else [])]
    header += ["speedup vs plain", *(["speedup vs HF"] if hf else [])]
    header += ["α", "τ", "τ theory", "greedy = plain"]
    memory = results.get("memory")  # results written before peak memory was measured have none
    header += ["peak MiB"] if memory else []
    rows = []
    for c in results["configurations"]:
        e = entries[(c["id"], "all")]
        tps = DASH if c["id"] == LLAMA_CPP_ID else _fmt(e["tokens_per_second_median"], 1)
        row = [c["label"], tps, *([_fmt(e["decode_tokens_per_second_median"], 1)] if decode else [])]
        row.append(_fmt(e["speedup_vs_plain"], 2, "×"))
        row += [_fmt(e["speedup_vs_hf_generate"], 2, "×")] if hf else []
        row += [
            _fmt(e["acceptance_rate"], 3),
            _fmt(e["mean_accepted_length"]),
            _fmt(e["expected_mean_accepted_length"]),
        ]
        row.append("reference" if c["id"] == PLAIN_ID else _fmt(e["greedy_identical"]))
        row += [_fmt(e.get("peak_rss_mib"), 1)] if memory else []
        rows.append(row)
    return ["## Overall (all categories)", "", *_table(header, rows), "", *_memory_note(memory)]


def _memory_note(memory: dict | None) -> list[str]:
    """What the peak memory column means, or why it is empty."""
    if not memory:
        return []
    if not memory["available"]:
        return [f"Peak memory was not measured: {memory['reason']}.", ""]
    return [
        "peak MiB: the benchmark process's peak resident memory while the configuration's runs ran (the target's "
        "weights, every drafter built for the run and the interpreter included; reset before each run); "
        "llama.cpp runs in a process of its own and is not measured.",
        "",
    ]


def overall_lines(results: dict) -> list[str]:
    """The greedy check, the overall table and the paired speedups (what the CLI prints after a run)."""
    return _greedy_lines(results) + _overall(results) + paired_lines(results)


_BASELINE_NAMES = {PLAIN_ID: "plain (same engine)", HF_GENERATE_ID: "HF generate", LLAMA_CPP_ID: "llama.cpp"}
_MARKS = {FASTER: "faster", SLOWER: "**slower**"}


def _interval(entry: dict) -> str:
    if entry["geomean"] is None:
        return DASH
    spread = f" [{entry['low']:.2f}, {entry['high']:.2f}]" if entry["low"] is not None else ""
    return f"{entry['geomean']:.2f}×{spread}"


def paired_lines(results: dict) -> list[str]:
    """The paired speedups over all categories: one row per configuration and baseline, with the verdict."""
    labels = _labels(results)
    rows = [
        [
            labels.get(e["config"], e["config"]),
            _BASELINE_NAMES.get(e["baseline"], e["baseline"]),
            e["measure"].replace("_", " "),
            str(e["questions"]),
            str(e["pairs"]),
            _interval(e),
            _MARKS.get(e["verdict"], e["verdict"]),
        ]
        for e in results["paired"]
        if e["category"] == "all"
    ]
    if not rows:
        return []
    header = ["configuration", "baseline", "measure", "prompts", "pairs", "paired speedup [95%]", "verdict"]
    return ["## Paired speedups (all categories)", "", *_table(header, rows), ""]


def _own_plain(config_id: str) -> str:
    """The plain decoding of a configuration's own engine."""
    return HF_GENERATE_ID if config_id.startswith("hf_assisted") else PLAIN_ID


def _paired_by_category(results: dict) -> list[str]:
    """Paired speedups over plain decoding of the same engine, per category, with the verdict marked: one table
    per measure (end to end first, then decode tokens/s where the runs report it)."""
    labels, categories = _labels(results), [*results["categories"], "all"]
    tables: dict[str, dict[str, dict[str, dict]]] = {}  # measure -> config -> category -> entry
    for e in results["paired"]:
        if e["baseline"] == _own_plain(e["config"]):
            tables.setdefault(e["measure"], {}).setdefault(e["config"], {})[e["category"]] = e

    def cell(entry: dict | None) -> str:
        if entry is None:
            return DASH
        mark = {FASTER: "", SLOWER: " **slower**"}.get(entry["verdict"], " (=)")
        return _interval(entry) + mark

    lines = []
    for measure, cells in tables.items():
        rows = [[labels.get(c, c), *(cell(by_cat.get(cat)) for cat in categories)] for c, by_cat in cells.items()]
        what = "" if measure == "tokens_per_second" else f" ({measure.replace('_', ' ')}: the prompt's pass left out)"
        lines += [
            f"## Paired speedup over plain decoding of the same engine, by category{what}",
            "",
            "(=): no measurable difference (the 95% interval holds 1, or one prompt only: no interval).",
            "",
            *_table(["configuration", *categories], rows),
            "",
        ]
    return lines


def _by_category(results: dict, title: str, field: str, configs: list[dict], digits: int, suffix: str) -> list[str]:
    entries, categories = _entries(results), [*results["categories"], "all"]
    rows = [
        [c["label"], *(_fmt(entries[(c["id"], cat)][field], digits, suffix) for cat in categories)] for c in configs
    ]
    return [f"## {title}", "", *_table(["configuration", *categories], rows), ""]


def _positions(results: dict) -> list[str]:
    entries = _entries(results)
    rows = [
        (c["label"], entries[(c["id"], "all")]["acceptance_by_position"])
        for c in _drafting(results)
        if entries[(c["id"], "all")]["acceptance_by_position"]
    ]
    if not rows:
        return []
    width = max(len(values) for _, values in rows)
    header = ["configuration", *(str(i + 1) for i in range(width))]
    table = [[label, *(_fmt(v, 3) for v in values), *([DASH] * (width - len(values)))] for label, values in rows]
    return [
        "## Acceptance by draft position (all categories)",
        "",
        "Fraction of the steps that drafted position i in which the drafted token at position i was accepted.",
        "",
        *_table(header, table),
        "",
    ]


def _by_drafter(results: dict) -> list[str]:
    """Each drafting configuration's sources (the methods of a draft model of another vocabulary apart) with their
    α, and the vocabulary overlap of a cross-vocabulary pair: where a configuration has several sources or one that
    drafts across vocabularies."""
    entries = _entries(results)
    rows = []
    for c in _drafting(results):
        entry = entries.get((c["id"], "all")) or {}
        cross = c.get("cross_vocabulary")
        sources = entry.get("acceptance_by_drafter") or {}
        if not cross and len(sources) < 2:
            continue
        overlap = DASH
        if cross:
            overlap = f"{cross['overlap']:.1%} ({cross['shared_tokens']:,} of {cross['draft_tokens']:,})"
        for name, counts in sources.items() or [(DASH, {})]:
            drafted = counts.get("drafted")
            rate = counts.get("acceptance_rate")
            rows.append([c["label"], overlap, name, DASH if drafted is None else f"{drafted:,}", _fmt(rate, 3)])
    if not rows:
        return []
    return [
        "## Acceptance by drafter (all categories)",
        "",
        "Each source of a configuration with several, and each method of a draft model of another vocabulary "
        "(`model-tli`, `model-slem`), with the tokens it drafted in verified drafts and α; overlap: the share of the "
        "draft model's vocabulary that the target's has too (the tokens TLI drafts).",
        "",
        *_table(["configuration", "vocabulary overlap", "drafter", "drafted", "α"], rows),
        "",
    ]


def render_markdown(results: dict, plots: list[str] | None = None) -> str:
    """The report as Markdown; ``plots`` are image file names (relative to the report) to embed."""
    configs = results["configurations"]
    speculative = [c for c in configs if c["id"] not in (PLAIN_ID, LLAMA_CPP_ID)]
    lines = _header(results) + _greedy_lines(results) + _overall(results) + paired_lines(results)
    lines += _paired_by_category(results)
    lines += _by_category(results, "Speedup over plain decoding, by category", "speedup_vs_plain", speculative, 2, "×")
    if _has_hf(results):
        title = "Speedup over Hugging Face generate, by category"
        hf_own = [c for c in configs if c["id"] != LLAMA_CPP_ID]
        lines += _by_category(results, title, "speedup_vs_hf_generate", hf_own, 2, "×")
    own = [c for c in configs if c["id"] != LLAMA_CPP_ID]
    lines += _by_category(results, "Median tokens/s, by category", "tokens_per_second_median", own, 1, "")
    if results["llama_cpp"] is not None:
        title = "Median decode tokens/s (prefill excluded, as llama.cpp reports), by category"
        lines += _by_category(results, title, "decode_tokens_per_second_median", configs, 1, "")
    drafting = _drafting(results)
    if drafting:
        lines += _by_category(
            results, "τ (tokens per target pass), by category", "mean_accepted_length", drafting, 2, ""
        )
        with_alpha = [c for c in drafting if _entries(results)[(c["id"], "all")]["acceptance_rate"] is not None]
        if with_alpha:
            lines += _by_category(results, "α (acceptance rate), by category", "acceptance_rate", with_alpha, 3, "")
    lines += _by_drafter(results)
    lines += _positions(results)
    if plots:
        captions = {name: _CAPTIONS[key] for key, name in PLOT_FILES.items()}
        lines += ["## Plots", ""] + [f"![{captions.get(p, p)}]({p})\n" for p in plots]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------------- plots


def _figure(width: float = 8.0, height: float = 4.5):
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError as err:
        raise missing_extra(err, "bench", "specwise's plots") from err

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


def _grouped_bars(ax, results: dict, configs: list[dict], field: str) -> None:
    entries, categories = _entries(results), [*results["categories"], "all"]
    width = 0.8 / max(len(configs), 1)
    for i, c in enumerate(configs):
        values = [entries[(c["id"], cat)][field] or 0.0 for cat in categories]
        xs = [x + (i - (len(configs) - 1) / 2) * width for x in range(len(categories))]
        ax.bar(xs, values, width, label=c["label"])
    ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
    if configs:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no configuration to show", ha="center", transform=ax.transAxes)


def _plot_speedup(results: dict, path: Path) -> None:
    fig, ax = _figure(max(8.0, 0.9 * len(results["categories"]) + 3))
    shown = [c for c in results["configurations"] if c["id"] not in (PLAIN_ID, LLAMA_CPP_ID)]
    _grouped_bars(ax, results, shown, "speedup_vs_plain")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_ylabel("speedup over plain decoding (×)")
    ax.set_title(_CAPTIONS["speedup"])
    fig.savefig(path, dpi=120)


def _plot_tau(results: dict, path: Path) -> None:
    fig, ax = _figure(max(8.0, 0.9 * len(results["categories"]) + 3))
    _grouped_bars(ax, results, _drafting(results), "mean_accepted_length")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_ylabel("τ: tokens per target pass")
    ax.set_title(_CAPTIONS["tau"])
    fig.savefig(path, dpi=120)


def _plot_theory(results: dict, path: Path) -> None:
    fig, ax = _figure(7.0, 5.0)
    entries = _entries(results)
    measured = [c for c in _drafting(results) if c["method"] == "specwise"]
    alphas = [i / 200 for i in range(200)]
    for gamma in sorted({c["gamma"] for c in measured if isinstance(c["gamma"], int)}):  # auto has no one curve
        ax.plot(alphas, [expected_tau(a, gamma) for a in alphas], color="gray", linewidth=1)
        ax.annotate(f"γ={gamma}", (0.99, expected_tau(0.99, gamma)), fontsize="small", ha="right", va="bottom")
    for c in measured:
        points = [entries[(c["id"], cat)] for cat in results["categories"]]
        points = [e for e in points if e["acceptance_rate"] is not None]
        if points:
            alpha = [e["acceptance_rate"] for e in points]
            dots = ax.scatter(alpha, [e["mean_accepted_length"] for e in points], label=c["label"])
            theory = [e["expected_mean_accepted_length"] for e in points]
            ax.scatter(alpha, theory, marker="_", s=200, color=dots.get_facecolor())
    ax.text(
        0.98,
        0.02,
        "dots: measured τ per category\ndashes: theory for the drafts actually made\n"
        "(steps that draft fewer than γ tokens fall below the curve)",
        transform=ax.transAxes,
        ha="right",
        va="bottom",
        fontsize="x-small",
    )
    ax.set_xlim(0, 1)
    ax.set_xlabel("α (acceptance rate)")
    ax.set_ylabel("τ: tokens per target pass")
    ax.set_title(_CAPTIONS["theory"])
    if measured:
        ax.legend(fontsize="small", loc="upper left")
    fig.savefig(path, dpi=120)


def _plot_positions(results: dict, path: Path) -> None:
    fig, ax = _figure(7.0, 4.5)
    entries = _entries(results)
    width = 1
    for c in _drafting(results):
        values = entries[(c["id"], "all")]["acceptance_by_position"]
        if values:
            ax.plot(range(1, len(values) + 1), values, marker="o", label=c["label"])
            width = max(width, len(values))
    ax.set_xticks(range(1, width + 1))
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("draft position")
    ax.set_ylabel("fraction accepted")
    ax.set_title(_CAPTIONS["position"] + " (all categories)")
    if ax.lines:
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)


def write_plots(results: dict, out_dir: Path) -> list[Path]:
    """Write the four PNG plots into ``out_dir``; returns their paths."""
    draw = {"speedup": _plot_speedup, "tau": _plot_tau, "theory": _plot_theory, "position": _plot_positions}
    paths = []
    for key, name in PLOT_FILES.items():
        draw[key](results, out_dir / name)
        paths.append(out_dir / name)
    return paths
