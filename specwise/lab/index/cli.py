"""`specwise index`: build the `suffix` drafter's index from a target's own answers."""

from __future__ import annotations

import argparse
import json
import sys

from specwise.lab import answers


def _temperatures(value: str) -> tuple[float, ...]:
    try:
        temps = tuple(float(t) for t in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers, got {value!r}") from None
    if not temps or any(t < 0 for t in temps):
        raise argparse.ArgumentTypeError(f"temperatures must be >= 0, got {value!r}")
    return temps


def register(sub) -> None:
    p = sub.add_parser(
        "index",
        help="build an index of the target's own answers for the suffix drafter (then use --drafter suffix:DIR)",
        description="Have the target answer human-written prompts, tasks on corpus passages and requests it writes "
        "itself (cached in chunks, resumable), and index the answers for the suffix drafter. Never use benchmark "
        "questions as prompts.",
    )
    answers.add_arguments(p, out_help="directory of the index (written atomically at the end)", max_new_tokens=256)
    p.add_argument("--budget-tokens", type=int, default=None, help="stop once this many tokens are generated")
    p.add_argument(
        "--temperatures",
        type=_temperatures,
        default=(0.0, 0.0, 0.8),
        help="request j is answered at the (j mod n)-th of these (0: greedy; default: 0,0,0.8)",
    )
    p.add_argument("--max-index-mb", type=float, default=16.0, help="size limit of the index (default: 16)")
    p.set_defaults(func=cmd_index)


def cmd_index(args: argparse.Namespace) -> int:
    from specwise.lab.index import IndexOptions, run_index

    answers.record_command()
    opts = IndexOptions(
        **answers.answer_options(args),
        budget_tokens=args.budget_tokens,
        temperatures=args.temperatures,
        max_index_mb=args.max_index_mb,
    )
    report = run_index(opts, log=lambda msg: print(msg, file=sys.stderr))
    print(json.dumps(report, indent=2))
    return 0
