"""``specwise bench --workload code-edit fim agent agent-traces``: the coding workloads through specwise's and
llama.cpp's servers. The arguments are added to ``specwise bench`` (:func:`add_arguments`); :func:`cmd_workloads`
runs them."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

__all__ = ["add_arguments", "cmd_workloads", "workload_command"]

RESULTS_FILE = "results.json"
_WORKLOADS = ("code-edit", "fim", "agent", "agent-traces")
TRACES_CONTEXT = 32768  # llama-server's context for agent traces: an agent's prompt is 6-17 k tokens and grows


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of the served coding workloads, in their own group of ``specwise bench``."""
    from specwise.lab.bench.workloads.servers import CONFIG_IDS

    g = p.add_argument_group("coding workloads through servers (docs/BENCHMARKS.md, Coding workloads)")
    g.add_argument(
        "--workload",
        nargs="+",
        choices=_WORKLOADS,
        metavar="NAME",
        help="run code-edit, fim, agent and/or agent-traces (recorded agents' requests: --traces) requests through "
        "specwise's and llama.cpp's servers instead of the prompts through engines; also takes --out, --target, "
        "--rounds, --temperature, --seeds, --threads, --llama-cpp, --max-new-tokens (default: per workload), "
        "--no-warmup, --quiet, --report-only",
    )
    g.add_argument(
        "--traces",
        nargs="+",
        metavar="DIR",
        help="for --workload agent-traces: folders of recorded traces, each a trace (000.json, 001.json, ...: "
        '{"route", "body"} as the agent sent them) or a folder of traces (specwise\'s repository keeps some in '
        "benchmarks/traces)",
    )
    g.add_argument(
        "--configs",
        nargs="+",
        metavar="ID",
        help=f"configurations to compare (default: every one that can run): {' '.join(CONFIG_IDS)}; a specwise "
        "one may add its server's formats: specwise:auto@attention=bfloat16, @kv-cache=float16",
    )
    g.add_argument("--draft-model", metavar="GGUF", help="the draft model of the ngram+model and llama.cpp draft runs")
    g.add_argument("--limit", type=int, default=None, metavar="N", help="the first N items of each workload")


def workload_command(args: argparse.Namespace) -> str:
    """The full command line that reproduces a workload run."""
    parts = ["specwise", "bench", "--out", args.out, "--workload", *args.workload, "--target", args.target]
    if args.configs:
        parts += ["--configs", *args.configs]
    if args.draft_model:
        parts += ["--draft-model", args.draft_model]
    if args.limit is not None:
        parts += ["--limit", str(args.limit)]
    if args.traces:
        parts += ["--traces", *args.traces]
    if args.max_new_tokens is not None:
        parts += ["--max-new-tokens", str(args.max_new_tokens)]
    parts += ["--temperature", str(args.temperature), "--seeds", *map(str, args.seeds), "--rounds", str(args.rounds)]
    if args.threads is not None:
        parts += ["--threads", str(args.threads)]
    if args.llama_cpp is not None:
        parts += ["--llama-cpp", *([args.llama_cpp] if args.llama_cpp else [])]
    parts += ["--no-warmup"] if args.no_warmup else []
    return shlex.join(parts)


def _check(args: argparse.Namespace) -> None:
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.draft_model and not Path(args.draft_model).is_file():
        raise FileNotFoundError(f"--draft-model: {args.draft_model} not found")
    if ("agent-traces" in args.workload) != bool(args.traces):
        raise ValueError(
            "--workload agent-traces replays recorded traces: pass --traces DIR (benchmarks/traces in specwise's "
            "repository)"
            if args.traces is None
            else "--traces goes with --workload agent-traces"
        )
    if args.traces:
        from specwise.lab.bench.workloads.traces import find_traces

        find_traces(args.traces)  # checked before any server starts


def _llama_gguf(args: argparse.Namespace):
    """The target's GGUF file for llama.cpp (None without --llama-cpp); points the lookup at a given folder."""
    if args.llama_cpp is None:
        return None
    from specwise.lab.bench.llamacpp import ENV_VAR, find_llama_cpp
    from specwise.models.loader import gguf_source

    if args.llama_cpp:
        os.environ[ENV_VAR] = str(args.llama_cpp)
    if find_llama_cpp() is None:
        raise FileNotFoundError(f"llama.cpp binaries not found (${ENV_VAR}, --llama-cpp PATH): build them first")
    gguf = gguf_source(args.target)
    if gguf is None:
        raise ValueError(f"llama.cpp needs a GGUF target (default or a .gguf file), got {args.target!r}")
    return gguf


def _finish(results: dict, out: Path) -> int:
    from specwise.lab.bench.workloads.report import write_report

    files = write_report(results, out)
    print("wrote " + ", ".join(str(f) for f in [out / RESULTS_FILE, *files]))
    if results["greedy_check"].get("all_identical") is False:
        print(f"specwise bench: GREEDY MISMATCH: see {out / 'report.md'}", file=sys.stderr)
        return 1
    return 0


def cmd_workloads(args: argparse.Namespace) -> int:
    """Run the workloads (or, with --report-only, re-render their report) and write results, report and plots."""
    from specwise.lab.bench.workloads.runner import WorkloadSettings, run_workloads, summarize

    out = Path(args.out)
    if args.report_only:
        from specwise.lab.bench.workloads.report import check_results

        results = json.loads((out / RESULTS_FILE).read_text(encoding="utf-8"))
        check_results(results)
        results.update(summarize(results))
        return _finish(results, out)
    _check(args)
    from specwise.lab.bench.environment import machine_info
    from specwise.lab.bench.workloads.servers import make_configs, server_records, start_servers

    gguf = _llama_gguf(args)
    configs = make_configs(args.configs, args.draft_model, gguf is not None)
    threads = args.threads or min(os.cpu_count() or 1, 8)
    settings = WorkloadSettings(
        target=args.target,
        workloads=list(args.workload),
        configs=configs,
        temperature=args.temperature,
        seeds=list(args.seeds),
        rounds=args.rounds,
        limit=args.limit,
        max_tokens=args.max_new_tokens,
        threads=threads,
        draft_model=args.draft_model,
        llama_cpp=args.llama_cpp,
        warmup=not args.no_warmup,
        traces=list(args.traces or []),
    )
    machine = machine_info("cpu")
    traces = "agent-traces" in args.workload  # long prompts, and the server's prompt cache kept as a user's
    context = TRACES_CONTEXT if traces else 8192
    servers = start_servers(
        configs, args.target, gguf, args.draft_model, threads, ctx_size=context, prompt_cache=traces
    )
    try:
        urls = {cid: server.url for cid, server in servers.items()}
        command = workload_command(args)
        results = run_workloads(settings, urls, command=command, machine=machine, progress=not args.quiet)
        results["servers"] = server_records(servers)
    finally:
        for server in servers.values():
            server.stop()
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULTS_FILE).write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return _finish(results, out)
