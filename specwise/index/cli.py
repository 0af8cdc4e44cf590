"""`specwise index`: build the `suffix` drafter's index from a target's own answers."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path


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
    p.add_argument("--target", default="default", help="default | a .gguf file | a model directory | a hub id")
    p.add_argument("--out", required=True, type=Path, help="directory of the index (written atomically at the end)")
    p.add_argument(
        "--prompts-dir",
        type=Path,
        default=os.environ.get("SPECWISE_PROMPTS"),
        help="directory of *.prompts.jsonl files (shared/data/prompts; default: $SPECWISE_PROMPTS)",
    )
    p.add_argument("--data-dir", type=Path, default=None, help="cache of the answers (default: under the cache)")
    p.add_argument("--gsm8k-limit", type=int, default=1000, help="GSM8K prompts to use, sampled (default: 1000)")
    p.add_argument("--corpus-dir", type=Path, default=None, help="plain-text corpora (*.txt) for --passages")
    p.add_argument("--passages", type=int, default=0, help="tasks on --corpus-dir passages to answer (default: 0)")
    p.add_argument("--self-prompts", type=int, default=0, help="requests the target writes itself (default: 0)")
    p.add_argument("--max-prompts", type=int, default=None, help="answer at most this many requests (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="answer length cap (default: 256)")
    p.add_argument("--budget-tokens", type=int, default=None, help="stop once this many tokens are generated")
    p.add_argument(
        "--temperatures",
        type=_temperatures,
        default=(0.0, 0.0, 0.8),
        help="request j is answered at the (j mod n)-th of these (0: greedy; default: 0,0,0.8)",
    )
    p.add_argument("--max-index-mb", type=float, default=16.0, help="size limit of the index (default: 16)")
    p.add_argument("--seed", type=int, default=0, help="(default: 0)")
    p.add_argument("--device", default="cpu", help="cpu | cuda (default: cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_index)


def cmd_index(args: argparse.Namespace) -> int:
    from specwise.index import IndexOptions, run_index

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    os.environ.setdefault("SPECWISE_COMMAND", "specwise " + shlex.join(sys.argv[1:]))
    opts = IndexOptions(
        target=args.target,
        out=args.out,
        data_dir=args.data_dir,
        prompts_dir=args.prompts_dir,
        corpus_dir=args.corpus_dir,
        passages=args.passages,
        self_prompts=args.self_prompts,
        max_prompts=args.max_prompts,
        max_new_tokens=args.max_new_tokens,
        budget_tokens=args.budget_tokens,
        temperatures=args.temperatures,
        max_index_mb=args.max_index_mb,
        seed=args.seed,
        device=args.device,
        progress=not args.no_progress,
    )
    opts.prompt_limits["gsm8k_train.prompts.jsonl"] = args.gsm8k_limit
    report = run_index(opts, log=lambda msg: print(msg, file=sys.stderr))
    print(json.dumps(report, indent=2))
    return 0
