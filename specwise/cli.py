"""Command line: `specwise generate ...`."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from specwise.drafters import DRAFTER_HELP

DEFAULT_DRAFTER = "ngram"

# Modules that add subcommands: each has register(subparsers), whose parsers set func=handler(args) -> int.
_SUBCOMMAND_MODULES = ["specwise.bench.cli", "specwise.server.cli"]


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="default", help="default | a .gguf file | a model directory | a hub id")
    p.add_argument("--drafter", default=DEFAULT_DRAFTER, help=DRAFTER_HELP + f" (default: {DEFAULT_DRAFTER})")
    p.add_argument("--gamma", type=int, default=4, help="tokens drafted per step (default: 4)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default: auto)")
    p.add_argument(
        "--impl",
        default="auto",
        choices=["auto", "native", "hf"],
        help="model implementation: native (fast, Llama family), hf (Hugging Face, any causal LM), "
        "auto (native when supported; default)",
    )


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    p.add_argument("--top-k", type=int, default=0, help="0 disables (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="1 disables (default: 1)")
    p.add_argument("--min-p", type=float, default=0.0, help="0 disables (default: 0)")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling (default: random)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specwise", description="Exact speculative decoding for causal LMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a reply to a prompt, streaming it, then print statistics")
    gen.add_argument("prompt", help="the prompt (a user message for chat models)")
    _add_model_args(gen)
    _add_sampling_args(gen)
    gen.add_argument("--max-new-tokens", type=int, default=256, help="(default: 256)")
    gen.add_argument("--stop", nargs="+", default=[], metavar="STR", help="stop strings (not included in the output)")
    gen.add_argument("--no-chat", action="store_true", help="raw completion: do not apply the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of streaming")
    gen.set_defaults(func=cmd_generate)
    for module in _SUBCOMMAND_MODULES:
        try:
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as err:
            if err.name is None or not module.startswith(err.name):  # a missing dependency, not the module
                raise
    return parser


def cmd_generate(args: argparse.Namespace) -> int:
    from specwise.runtime import build_runtime, encode_prompt
    from specwise.sampling import SamplingParams

    params = SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p, args.seed)
    if args.gamma < 0:
        raise ValueError(f"--gamma must be >= 0, got {args.gamma}")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    runtime = build_runtime(args.target, args.drafter, args.gamma, args.device, args.impl)
    engine, target = runtime.engine, runtime.target
    prompt_ids = encode_prompt(target.tokenizer, args.prompt, chat=not args.no_chat)
    if args.json:
        result = engine.generate(prompt_ids, params, args.max_new_tokens, stop=args.stop)
        print(json.dumps(result.to_dict()))
        return 0
    for event in engine.stream(prompt_ids, params, args.max_new_tokens, stop=args.stop):
        sys.stdout.write(event.text)
        sys.stdout.flush()
        if event.finish_reason is not None:
            print(
                f"\n\n[finish: {event.finish_reason}; target {target.name}, drafter {args.drafter}, gamma {args.gamma}]"
            )
            print(event.stats.summary())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, NotImplementedError) as err:
        print(f"specwise: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nspecwise: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
