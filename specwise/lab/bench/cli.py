"""The ``specwise bench`` and ``specwise simulate`` subcommands."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from specwise.drafters import DRAFTER_HELP
from specwise.extras import require
from specwise.lab.bench.workloads.cli import add_arguments as add_workload_arguments

__all__ = ["register", "cmd_bench", "cmd_simulate"]

RESULTS_FILE = "results.json"
DEFAULT_MAX_NEW_TOKENS = 128


def register(subparsers) -> None:
    """Add the ``bench`` and ``simulate`` subcommands to the main parser's subparsers."""
    _add_bench(subparsers)
    _add_simulate(subparsers)


def _add_bench(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark drafters against plain decoding, Hugging Face and llama.cpp (JSON, Markdown report, plots)",
        description="Run prompts through every configuration, interleaved, for --rounds rounds, and write "
        "results.json, report.md and PNG plots into --out. See docs/BENCHMARKS.md.",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="directory for results.json, report.md and plots")
    p.add_argument("--report-only", action="store_true", help="re-render report.md and plots from DIR/results.json")
    p.add_argument("--questions", metavar="PATH", help="a Spec-Bench question.jsonl (default: the project's prompts)")
    p.add_argument("--categories", nargs="+", metavar="NAME", help="categories to run (default: all)")
    p.add_argument("--limit-per-category", type=int, default=None, metavar="N", help="first N prompts per category")
    p.add_argument("--target", default="default", help="default | a .gguf file | a model directory | a hub id")
    p.add_argument("--drafter", nargs="+", default=["ngram"], metavar="SPEC", help=DRAFTER_HELP + " (default: ngram)")
    p.add_argument(
        "--gamma",
        nargs="+",
        type=_gamma,
        default=[4],
        metavar="N",
        help="tokens drafted per step: integers >= 1 and/or auto (the planner's choice per step; default: 4)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="run every configuration on every prompt N times, the order rotating per round (default: 1)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"new tokens per run (default: {DEFAULT_MAX_NEW_TOKENS}; with --workload: per workload)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    p.add_argument("--top-k", type=int, default=0, help="0 disables (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="1 disables (default: 1)")
    p.add_argument("--min-p", type=float, default=0.0, help="0 disables (default: 0)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0], metavar="S", help="one run per prompt and seed")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default: auto)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of the model's passes (default: all)")
    p.add_argument("--precision", choices=["q8", "exact"], default=None, help="a GGUF target's numerics (default: q8)")
    p.add_argument("--no-hf", action="store_true", help="skip the Hugging Face generate and assisted baselines")
    p.add_argument(
        "--llama-cpp",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="add llama.cpp on the target's GGUF file as a peer (greedy; binaries in PATH, else $SPECWISE_LLAMA_CPP "
        "or ~/.cache/specwise-peers/llama.cpp/bin)",
    )
    p.add_argument("--stop-at-eos", action="store_true", help="stop at EOS (default: exactly --max-new-tokens)")
    p.add_argument("--no-chat", action="store_true", help="raw completion: do not apply the chat template")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up run of each configuration")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_workload_arguments(p)
    p.set_defaults(func=cmd_bench)


def _add_simulate(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="draw the theory: E[tau] vs alpha, speedup vs drafter cost, exactness on toy models",
        description="Write tau_vs_alpha.png, speedup_vs_cost.png, exactness.png and simulate.json into --out.",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the plots and simulate.json")
    p.add_argument("--gammas", nargs="+", type=int, default=[1, 2, 3, 4, 6, 8], help="curves of E[tau] vs alpha")
    p.add_argument("--gamma", type=int, default=4, help="gamma of the speedup curves and the toy run (default: 4)")
    p.add_argument("--alphas", nargs="+", type=float, default=[0.5, 0.7, 0.8, 0.9], help="curves of speedup vs cost")
    p.add_argument("--samples", type=int, default=10000, help="runs of the toy exactness experiment (default: 10000)")
    p.add_argument("--vocab", type=int, default=3, help="toy vocabulary size (default: 3)")
    p.add_argument("--length", type=int, default=3, help="tokens per toy continuation (default: 3)")
    p.add_argument("--temperature", type=float, default=1.0, help="toy sampling temperature (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the toy models and runs (default: 0)")
    p.set_defaults(func=cmd_simulate)


def _gamma(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or auto, got {text!r}") from None


def _max_new_tokens(args: argparse.Namespace) -> int:
    return DEFAULT_MAX_NEW_TOKENS if args.max_new_tokens is None else args.max_new_tokens


def bench_command(args: argparse.Namespace) -> str:
    """The full command line that reproduces a run, defaults spelled out."""
    parts = ["specwise", "bench", "--out", args.out]
    if args.questions:
        parts += ["--questions", args.questions]
    if args.categories:
        parts += ["--categories", *args.categories]
    if args.limit_per_category is not None:
        parts += ["--limit-per-category", str(args.limit_per_category)]
    parts += ["--target", args.target, "--drafter", *args.drafter, "--gamma", *map(str, args.gamma)]
    parts += ["--max-new-tokens", str(_max_new_tokens(args)), "--temperature", str(args.temperature)]
    if args.temperature > 0:
        parts += ["--top-k", str(args.top_k), "--top-p", str(args.top_p), "--min-p", str(args.min_p)]
    parts += ["--seeds", *map(str, args.seeds), "--rounds", str(args.rounds), "--device", args.device]
    if args.threads is not None:
        parts += ["--threads", str(args.threads)]
    if args.precision is not None:
        parts += ["--precision", args.precision]
    if args.llama_cpp is not None:
        parts += ["--llama-cpp", *([args.llama_cpp] if args.llama_cpp else [])]
    flags = ("no_hf", "stop_at_eos", "no_chat", "no_warmup")
    parts += [f"--{name.replace('_', '-')}" for name in flags if getattr(args, name)]
    return shlex.join(parts)


def _settings(args: argparse.Namespace, device: str):
    from specwise.lab.bench.configs import BenchSettings

    if _max_new_tokens(args) < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if any(g != "auto" and g < 1 for g in args.gamma):
        raise ValueError(f"--gamma values must be >= 1 or auto (the plain baseline always runs), got {args.gamma}")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    return BenchSettings(
        target=args.target,
        device=device,
        drafters=list(args.drafter),
        gammas=list(args.gamma),
        max_new_tokens=_max_new_tokens(args),
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seeds=list(args.seeds),
        hf_baselines=not args.no_hf,
        stop_at_eos=args.stop_at_eos,
        chat=not args.no_chat,
        warmup=not args.no_warmup,
        prompt_source=args.questions or "specwise-default",
        categories=list(args.categories or []),
        limit_per_category=args.limit_per_category,
        rounds=args.rounds,
        llama_cpp=args.llama_cpp,
        precision=args.precision,
    )


def _prompts(args: argparse.Namespace):
    from specwise.lab.bench.prompts import default_prompts, load_questions, select_prompts

    prompts = load_questions(args.questions) if args.questions else default_prompts()
    return select_prompts(prompts, args.categories, args.limit_per_category)


def _finish(results: dict, out: Path) -> int:
    """Write the report, print where everything is and the overall table; 1 when a greedy check failed."""
    from specwise.lab.bench.report import overall_lines, write_report

    files = write_report(results, out)
    print("\n".join(overall_lines(results)))
    print("wrote " + ", ".join(str(f) for f in [out / RESULTS_FILE, *files]))
    if results["greedy_check"]["all_identical"] is False:
        count = len(results["greedy_check"]["mismatches"])
        print(f"specwise bench: GREEDY MISMATCH in {count} runs: see {out / 'report.md'}", file=sys.stderr)
        return 1
    return 0


def _read_results(path: Path, out: str) -> dict:
    """A results.json checked against the schema; the errors name the file."""
    from specwise.lab.bench.schema import validate_results

    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run `specwise bench --out {out}` first")
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
        validate_results(results)
    except ValueError as err:  # not JSON, not UTF-8, or not the schema
        raise ValueError(f"{path}: {err}") from err
    return results


def cmd_bench(args: argparse.Namespace) -> int:
    """``specwise bench``: run (or, with --report-only, re-render) and write results, report and plots."""
    require("bench", "specwise bench")  # the plots: checked before anything runs
    if getattr(args, "workload", None):
        from specwise.lab.bench.workloads.cli import cmd_workloads

        return cmd_workloads(args)
    from specwise.lab.bench.runner import run_bench
    from specwise.lab.bench.schema import paired_summary

    out = Path(args.out)
    if args.report_only:
        results = _read_results(out / RESULTS_FILE, args.out)
        # the paired speedups are derived from the runs: the report shows every measure the current code pairs
        results["paired"] = paired_summary(results["configurations"], results["runs"], results["categories"])
        return _finish(results, out)

    from specwise.models.threads import set_num_threads
    from specwise.runtime import resolve_device

    if not args.no_hf:  # checked before anything loads
        require("hf", "specwise bench's Hugging Face baselines (--no-hf skips them)")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        set_num_threads(args.threads)
    settings = _settings(args, resolve_device(args.device))
    prompts = _prompts(args)
    results = run_bench(settings, prompts, progress=not args.quiet, command=bench_command(args))
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULTS_FILE).write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return _finish(results, out)


def cmd_simulate(args: argparse.Namespace) -> int:
    """``specwise simulate``: write the theory plots and the toy exactness experiment."""
    require("bench", "specwise simulate")
    from specwise.lab.bench.simulate import SIMULATE_FILES, SimulateSettings, run_simulate, summary_lines

    settings = SimulateSettings(
        gammas=tuple(args.gammas),
        gamma=args.gamma,
        alphas=tuple(args.alphas),
        samples=args.samples,
        vocab=args.vocab,
        length=args.length,
        temperature=args.temperature,
        seed=args.seed,
    )
    data = run_simulate(settings, args.out)
    print("\n".join(summary_lines(data)))
    print("wrote " + ", ".join(str(Path(args.out) / name) for name in SIMULATE_FILES.values()))
    return 0
