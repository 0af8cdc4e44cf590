"""`specwise distill`: train a head drafter for a target."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specwise.lab import answers


def register(sub) -> None:
    from specwise.lab.distill import LOSSES

    p = sub.add_parser(
        "distill",
        help="train a head drafter for a target on its own answers (then use --drafter head:DIR)",
        description="Generate the target's answers to instruction prompts (cached, resumable), train a head "
        "drafter on the target's features, and report held-out fidelity and tau. Never use benchmark questions "
        "as prompts.",
    )
    answers.add_arguments(
        p,
        out_help="directory for the head (config.json, model.safetensors)",
        max_new_tokens=192,
        data_dir="cache of generated data: answers and the target's features (default: under the cache)",
        corpus_dir="directory of plain-text *.txt files (paragraphs separated by blank lines) for --passages and "
        "added to the training data (default: none)",
    )
    p.add_argument("--corpus-tokens", type=int, default=100_000, help="tokens of corpus text to use (default: 100000)")
    p.add_argument(
        "--max-self-prompts",
        type=int,
        default=None,
        help="answer only the first batches of the --self-prompts plan covering this many (default: all)",
    )
    p.add_argument("--gen-batch-size", type=int, default=64, help="prompts answered together (default: 64)")
    p.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary size (default: 8192)")
    p.add_argument("--intermediate-size", type=int, default=None, help="head MLP width (default: the target's)")
    p.add_argument("--loss", choices=LOSSES, default="kl", help="token loss (default: kl)")
    p.add_argument("--steps-unrolled", type=int, default=3, help="drafting steps unrolled in training (default: 3)")
    p.add_argument("--feature-weight", type=float, default=0.1, help="weight of the feature loss (default: 0.1)")
    p.add_argument("--epochs", type=float, default=2.0, help="passes over the training data (default: 2)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default: 1e-3)")
    p.add_argument("--batch-tokens", type=int, default=1024, help="tokens per training batch (default: 1024)")
    p.add_argument("--eval-prompts", type=int, default=12, help="held-out prompts for the tau check (default: 12)")
    p.add_argument(
        "--threads", type=int, default=None, help="threads of the target's passes and training (default: every core)"
    )
    p.add_argument("--resume", action="store_true", help="continue the checkpoint in --out")
    p.add_argument(
        "--init",
        type=Path,
        default=None,
        help="start from this trained head's weights and draft vocabulary (same target) instead of a new head",
    )
    p.add_argument(
        "--target-precision",
        choices=("float32", "q8"),
        default="float32",
        help="how the target is evaluated as it answers the prompts and passage tasks: float32 (the Hugging Face "
        "reference; default) or q8 (a GGUF target in the native kernels, as the engine drafts for it: several "
        "times faster on a CPU)",
    )
    p.add_argument("--data-only", action="store_true", help="generate (or complete) the data, then stop")
    p.set_defaults(func=cmd_distill)


def cmd_distill(args: argparse.Namespace) -> int:
    from specwise.extras import require

    require("distill", "specwise distill")  # torch, transformers: checked before anything runs
    import torch  # noqa: F401  (loaded first: set_num_threads sets its thread count too)

    from specwise.lab.distill import DistillOptions, run_distill
    from specwise.lab.distill.train import TrainConfig
    from specwise.models.threads import set_num_threads

    if args.threads:
        set_num_threads(args.threads)
    answers.record_command()
    cfg = TrainConfig(
        loss=args.loss,
        steps_unrolled=args.steps_unrolled,
        feature_weight=args.feature_weight,
        lr=args.lr,
        epochs=args.epochs,
        batch_tokens=args.batch_tokens,
        seed=args.seed,
    )
    opts = DistillOptions(
        **answers.answer_options(args),
        corpus_tokens=args.corpus_tokens,
        max_self_prompts=args.max_self_prompts,
        gen_batch_size=args.gen_batch_size,
        draft_vocab=args.draft_vocab,
        intermediate_size=args.intermediate_size,
        eval_prompts=args.eval_prompts,
        resume=args.resume,
        init=args.init,
        data_only=args.data_only,
        target_precision=args.target_precision,
    )
    report = run_distill(opts, cfg, log=lambda msg: print(msg, file=sys.stderr))
    if args.data_only:
        print(json.dumps(report, indent=2))
        return 0
    before, after, engine = report["before"], report["after"], report["engine"]
    print(json.dumps({"out": str(args.out), "before": before, "after": after, "engine": engine}, indent=2))
    return 0
