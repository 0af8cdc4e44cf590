"""Command line: `specwise generate | profile | bench | simulate | serve | distill | index`.

Bad input never shows a traceback: ``main`` reports a refused request (a bad flag, a missing or damaged file, a
model specwise cannot run) as one line, ``specwise: error: ...``, and exits with status 2; an unexpected exception
(a bug) gets one line too, saying how to see its traceback: ``--debug`` or ``SPECWISE_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import traceback
from pathlib import Path

from specwise.drafters import DRAFTER_HELP
from specwise.extras import MissingExtraError

DEFAULT_DRAFTER = "auto"
DEFAULT_GAMMA = "auto"
DEBUG_ENV = "SPECWISE_DEBUG"  # set to 1 to see the traceback of any error
DEBUG_FLAG = "--debug"
ERROR_STATUS = 2  # bad input: a flag, a file, a model (argparse's status for usage errors too)
BUG_STATUS = 1  # an unexpected exception
INTERRUPTED_STATUS = 130  # 128 + SIGINT, as shells report it
# What a user can cause and fix: errors that name the problem (GGUFError is a ValueError, FileNotFoundError an
# OSError, MissingExtraError names the extra to install); anything else is a bug.
USER_ERRORS = (ValueError, NotImplementedError, OSError, MissingExtraError, MemoryError)

# Modules that add subcommands: each has register(subparsers), whose parsers set func=handler(args) -> int.
_SUBCOMMAND_MODULES = [
    "specwise.lab.profile",
    "specwise.lab.bench.cli",
    "specwise.server.cli",
    "specwise.lab.distill.cli",
    "specwise.lab.index.cli",
]
_BUILTIN = ("generate",)  # parsed without importing the other subcommands' modules (start-up time)


def parse_gamma(value: str) -> int | str:
    """`auto` or an integer >= 0 (argparse type for --gamma)."""
    if value == "auto":
        return value
    try:
        gamma = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0 or auto, got {value!r}") from None
    if gamma < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {gamma}")
    return gamma


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="default", help="default | a .gguf file | a model directory | a hub id")
    p.add_argument("--drafter", default=DEFAULT_DRAFTER, help=DRAFTER_HELP + f" (default: {DEFAULT_DRAFTER})")
    p.add_argument(
        "--gamma",
        type=parse_gamma,
        default=DEFAULT_GAMMA,
        help=f"tokens drafted per step, or auto: chosen per step to maximise tokens/s (default: {DEFAULT_GAMMA})",
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default: auto)")
    p.add_argument(
        "--impl",
        default="auto",
        choices=["auto", "native", "hf"],
        help="model implementation: native (fast, Llama family; GGUF files in their own block formats on a CPU), "
        "hf (Hugging Face, float32, any causal LM), auto (native when supported; default)",
    )
    p.add_argument(
        "--precision",
        default=None,
        choices=["q8", "exact"],
        help="how the native model evaluates a GGUF file: q8 (8-bit activations, integer dot products, as "
        "llama.cpp; default) or exact (float32 activations: the dequantized float32 model's numbers)",
    )
    p.add_argument(
        "--attention",
        default="float32",
        choices=["float32", "bfloat16"],
        help="the target's attention in q8: float32 (default) or bfloat16 (CPUs with AVX512_BF16: long prompts read "
        "faster, the numbers change a little; docs/QUANTIZED.md)",
    )
    p.add_argument(
        "--kv-cache",
        default="float32",
        choices=["float32", "float16"],
        help="the target's KV cache in q8: float32 (default) or float16 (half the memory and what attention reads, "
        "the numbers change a little, as llama.cpp's default f16 cache; docs/QUANTIZED.md)",
    )


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    p.add_argument("--top-k", type=int, default=0, help="0 disables (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="1 disables (default: 1)")
    p.add_argument("--min-p", type=float, default=0.0, help="0 disables (default: 0)")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling (default: random)")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (``specwise: error: ...``) pointing at ``--help``."""

    def error(self, message: str):
        self.exit(ERROR_STATUS, f"specwise: error: {message} (see `{self.prog} --help`)\n")


def build_parser(builtin_only: bool = False) -> argparse.ArgumentParser:
    """The command line's parser; ``builtin_only``: without the subcommands of the other modules (``bench``,
    ``serve``, ``profile``, ...), whose parsers import more than ``generate`` needs."""
    parser = Parser(prog="specwise", description="Exact speculative decoding for causal LMs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    gen = sub.add_parser("generate", help="generate a reply to a prompt, streaming it, then print statistics")
    gen.add_argument("prompt", help="the prompt (a user message for chat models)")
    add_model_args(gen)
    add_sampling_args(gen)
    gen.add_argument("--max-new-tokens", type=int, default=256, help="(default: 256)")
    gen.add_argument("--stop", nargs="+", default=[], metavar="STR", help="stop strings (not included in the output)")
    gen.add_argument("--no-chat", action="store_true", help="raw completion: do not apply the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of streaming")
    shape = gen.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE", help="the reply is JSON valid against this JSON Schema file")
    shape.add_argument("--grammar", metavar="FILE", help="the reply matches this grammar file (Lark, or GBNF)")
    gen.add_argument(
        "--prediction",
        metavar="FILE",
        help="a text file (- for stdin) the reply is expected to repeat for the most part (a file to edit): its "
        "tokens are drafted, the reply is unchanged; the stats' by_drafter shows what was accepted",
    )
    fim = gen.add_mutually_exclusive_group()
    fim.add_argument(
        "--suffix",
        metavar="TEXT",
        help="fill in the middle: the text after the cursor (the prompt is the text before it); a raw completion, "
        "for a model with FIM tokens",
    )
    fim.add_argument("--suffix-file", metavar="FILE", help="--suffix read from a text file (- for stdin)")
    gen.add_argument(
        "--compare",
        action="store_true",
        help="after the reply, decode the same request plainly (no drafter) on the same model and print both side "
        "by side: tokens/s, tokens per target pass, speed-up, and whether the texts are identical",
    )
    gen.set_defaults(func=cmd_generate)

    for module in [] if builtin_only else _SUBCOMMAND_MODULES:
        try:
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as err:
            if err.name is None or not module.startswith(err.name):  # a missing dependency, not the module
                raise
    _add_debug_flag(parser, sub)
    return parser


def _add_debug_flag(parser: argparse.ArgumentParser, sub) -> None:
    """``--debug`` before or after the subcommand (``main`` reads it from the command line itself)."""
    help_ = f"show the traceback of an error (or set {DEBUG_ENV}=1)"
    parser.add_argument(DEBUG_FLAG, action="store_true", help=help_)
    for subparser in sub.choices.values():
        subparser.add_argument(DEBUG_FLAG, action="store_true", default=argparse.SUPPRESS, help=help_)


def _constraint(args: argparse.Namespace):
    """The constraint that --json-schema or --grammar names (None without either); checked before loading."""
    path = args.json_schema or args.grammar
    if path is None:
        return None
    from specwise.constraints import Grammar, JsonSchema

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read {path}: {err}") from err
    if args.grammar:
        constraint = Grammar(text)
    else:
        try:
            constraint = JsonSchema(json.loads(text))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not JSON: {err}") from err
    constraint.check()
    return constraint


def _prediction_text(path: str | None) -> str | None:
    """The text of --prediction FILE (``-``: stdin), read before the model loads (None without the flag)."""
    if path is None:
        return None
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read --prediction {path}: {err}") from err


def _suffix_text(args: argparse.Namespace) -> str | None:
    """The text of --suffix or --suffix-file (``-``: stdin), read before the model loads (None without either)."""
    if args.suffix_file is None:
        return args.suffix
    try:
        return sys.stdin.read() if args.suffix_file == "-" else Path(args.suffix_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read --suffix-file {args.suffix_file}: {err}") from err


def _fim_request(runtime, prefix: str, suffix: str) -> tuple[list[int], list[int]]:
    """The FIM prompt's token ids and the tokens that end the middle (FimUnsupported for a model without FIM)."""
    from specwise.fim import engine_eos, fim_prompt, fim_stop_ids, require_fim

    fim = require_fim(runtime.target)
    return fim_prompt(runtime.tokenizer, fim, prefix, suffix), sorted(fim_stop_ids(fim, engine_eos(runtime.engine)))


def cmd_generate(args: argparse.Namespace) -> int:
    from specwise.runtime import build_runtime, encode_prompt
    from specwise.sampling import SamplingParams

    params = SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p, args.seed, _constraint(args))
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    predicted = _prediction_text(args.prediction)
    suffix = _suffix_text(args)
    runtime = build_runtime(
        args.target, args.drafter, args.gamma, args.device, args.impl, args.precision, args.attention, args.kv_cache
    )
    engine, target = runtime.engine, runtime.target
    prompt_ids = encode_prompt(target.tokenizer, args.prompt, chat=not args.no_chat) if suffix is None else None
    prediction = None if predicted is None else list(target.tokenizer(predicted, add_special_tokens=False)["input_ids"])
    request = {"stop": args.stop, "prediction": prediction}
    if suffix is not None:  # fill in the middle: the FIM prompt, the middle ending at the FIM stop tokens
        prompt_ids, request["eos_token_ids"] = _fim_request(runtime, args.prompt, suffix)
    if args.json:
        result = engine.generate(prompt_ids, params, args.max_new_tokens, **request)
        out = result.to_dict()
        if args.compare:
            out["plain"] = _plain_result(runtime, prompt_ids, params, args.max_new_tokens, request).to_dict()
        print(json.dumps(out))
        return 0
    ids: list[int] = []
    for event in engine.stream(prompt_ids, params, args.max_new_tokens, **request):
        sys.stdout.write(event.text)
        sys.stdout.flush()
        ids.extend(event.token_ids)
        if event.finish_reason is not None:
            print(
                f"\n\n[finish: {event.finish_reason}; target {target.name}, drafter {runtime.drafter_spec}, "
                f"gamma {args.gamma}]"
            )
            print(event.stats.summary())
            if args.compare:
                plain = _plain_result(runtime, prompt_ids, params, args.max_new_tokens, request)
                print(
                    comparison(
                        runtime.drafter_spec, event.stats, ids, plain.stats, plain.token_ids, params.temperature > 0
                    )
                )
    return 0


def _plain_result(runtime, prompt_ids: list[int], params, max_new_tokens: int, request: dict):
    """The same request decoded plainly (no drafter, no prediction) on the runtime's model: the reference that
    speculative decoding must equal (greedy: token for token). It runs after the speculative reply, on a warm
    model, so any one-off cost of a first run falls on the speculative side."""
    from specwise.engine import Engine

    engine = runtime.engine
    plain = Engine(engine.target, None, gamma=0, tokenizer=engine.tokenizer, eos_token_ids=engine.eos_token_ids)
    return plain.generate(prompt_ids, params, max_new_tokens, **{**request, "prediction": None})


def comparison(drafter: str, spec, spec_ids: list[int], plain, plain_ids: list[int], sampled: bool = False) -> str:
    """Plain and speculative decoding of one request side by side: tokens/s (prefill included), tokens per target
    pass, the speed-up and whether the two replies are the same tokens."""
    rows = [("plain", plain), (f"speculative ({drafter})", spec)]
    width = max(len(name) for name, _ in rows)
    lines = [f"{'':{width}}  {'tokens':>6}  {'passes':>6}  {'tokens/pass':>11}  {'tokens/s':>8}"]
    for name, stats in rows:
        per_pass = stats.new_tokens / stats.target_passes if stats.target_passes else 0.0
        lines.append(
            f"{name:{width}}  {stats.new_tokens:>6}  {stats.target_passes:>6}  {per_pass:>11.2f}  "
            f"{stats.tokens_per_second:>8.1f}"
        )
    speedup = spec.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second > 0 else 0.0
    same = "identical" if spec_ids == plain_ids else "DIFFERENT"
    note = "" if spec_ids == plain_ids or not sampled else " (sampled: equal in distribution, not token for token)"
    lines.append(f"speed-up {speedup:.2f}x; the replies are {same}{note}")
    return "\n".join(lines)


def debug_requested(argv: list[str] | None) -> bool:
    """Whether the command line has ``--debug`` (before any ``--``) or ``SPECWISE_DEBUG`` is set (not 0)."""
    argv = sys.argv[1:] if argv is None else argv
    options = argv[: argv.index("--")] if "--" in argv else argv
    return DEBUG_FLAG in options or os.environ.get(DEBUG_ENV, "0").strip().lower() not in ("", "0", "false", "no")


def one_line(err: BaseException) -> str:
    """The exception's message on one line: its type's name when it has none, further lines joined by "; "."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    return lines[0] + (" " + "; ".join(lines[1:]) if len(lines) > 1 else "")


def report_error(err: BaseException, debug: bool) -> int:
    """Print ``err`` for the user (a traceback only when ``debug``); returns the exit status."""
    if debug:
        traceback.print_exception(err)
    if isinstance(err, USER_ERRORS):
        print(f"specwise: error: {one_line(err)}", file=sys.stderr)
        return ERROR_STATUS
    hint = "" if debug else f"run it again with {DEBUG_ENV}=1 (or {DEBUG_FLAG}) to see the traceback, and "
    print(
        f"specwise: internal error: {type(err).__name__}: {one_line(err)} (a bug in specwise: {hint}report it "
        "with the command to specwise's issue tracker)",
        file=sys.stderr,
    )
    return BUG_STATUS


def run(argv: list[str] | None = None) -> tuple[int, argparse.Namespace | None]:
    """Parse the command line and run its subcommand; returns (exit status, the parsed arguments)."""
    debug = debug_requested(argv)
    args = None
    try:
        words = sys.argv[1:] if argv is None else argv
        builtin = bool(words) and words[0] in _BUILTIN and not {"-h", "--help"} & set(words)
        args = build_parser(builtin_only=builtin).parse_args(argv)
        return args.func(args) or 0, args
    except KeyboardInterrupt as err:
        if debug:
            traceback.print_exception(err)
        return INTERRUPTED_STATUS, args
    except BrokenPipeError:  # whoever read the output stopped (`specwise ... | head`): nothing more to say
        _silence_stdout()
        return BUG_STATUS, args
    except Exception as err:
        return report_error(err, debug), args


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush does not fail on the closed pipe again."""
    with contextlib.suppress(OSError, ValueError):  # stdout is not a file (a test's capture): nothing to do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    """The ``specwise`` program: the exit status of the subcommand (see the module's docstring for errors)."""
    code, args = run(argv)
    if argv is None and code == 0 and args is not None and args.func is cmd_generate:
        # run as the `specwise` program: the answer is out, and tearing down the interpreter (the loaded model, and
        # torch's modules where the hf path loaded them) only adds time to it; nothing is left to write
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)
    return code


if __name__ == "__main__":
    sys.exit(main())
