"""`specwise distill`: train a head drafter for a target."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path


def register(sub) -> None:
    from specwise.distill.train import LOSSES

    p = sub.add_parser(
        "distill",
        help="train a head drafter for a target on its own answers (then use --drafter head:DIR)",
        description="Generate the target's answers to instruction prompts (cached, resumable), train a head "
        "drafter on the target's features, and report held-out fidelity and tau. Never use benchmark questions "
        "as prompts.",
    )
    p.add_argument("--target", default="default", help="default | a .gguf file | a model directory | a hub id")
    p.add_argument("--out", required=True, type=Path, help="directory for the head (config.json, model.safetensors)")
    p.add_argument(
        "--prompts-dir",
        type=Path,
        default=os.environ.get("SPECWISE_PROMPTS"),
        help="directory of *.prompts.jsonl files (shared/data/prompts; default: $SPECWISE_PROMPTS)",
    )
    p.add_argument("--data-dir", type=Path, default=None, help="cache of generated data (default: under the cache)")
    p.add_argument("--gsm8k-limit", type=int, default=1000, help="GSM8K prompts to use, sampled (default: 1000)")
    p.add_argument("--max-prompts", type=int, default=None, help="use at most this many prompts (default: all)")
    p.add_argument(
        "--corpus-dir",
        type=Path,
        default=None,
        help="plain-text corpora (*.txt, e.g. shared/data/corpora) added to the training data (default: none)",
    )
    p.add_argument("--corpus-tokens", type=int, default=100_000, help="tokens of corpus text to use (default: 100000)")
    p.add_argument(
        "--passages",
        type=int,
        default=0,
        help="also have the target answer this many tasks on --corpus-dir passages (summarise, extract, ...)",
    )
    p.add_argument(
        "--self-prompts",
        type=int,
        default=0,
        help="also have the target write this many user requests itself and answer them (default: 0)",
    )
    p.add_argument(
        "--max-self-prompts",
        type=int,
        default=None,
        help="answer only the first batches of the --self-prompts plan covering this many (default: all)",
    )
    p.add_argument("--max-new-tokens", type=int, default=192, help="answer length cap (default: 192)")
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
    p.add_argument("--seed", type=int, default=0, help="(default: 0)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="cpu | cuda (default: cpu)")
    p.add_argument("--resume", action="store_true", help="continue the checkpoint in --out")
    p.add_argument(
        "--init",
        type=Path,
        default=None,
        help="start from this trained head's weights and draft vocabulary (same target) instead of a new head",
    )
    p.add_argument("--data-only", action="store_true", help="generate (or complete) the data, then stop")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_distill)


def cmd_distill(args: argparse.Namespace) -> int:
    import torch

    from specwise.distill import DistillOptions, run_distill
    from specwise.distill.train import TrainConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("SPECWISE_COMMAND", "specwise " + shlex.join(sys.argv[1:]))
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
        target=args.target,
        out=args.out,
        data_dir=args.data_dir,
        prompts_dir=args.prompts_dir,
        max_prompts=args.max_prompts,
        corpus_dir=args.corpus_dir,
        corpus_tokens=args.corpus_tokens,
        passages=args.passages,
        self_prompts=args.self_prompts,
        max_self_prompts=args.max_self_prompts,
        max_new_tokens=args.max_new_tokens,
        gen_batch_size=args.gen_batch_size,
        draft_vocab=args.draft_vocab,
        intermediate_size=args.intermediate_size,
        eval_prompts=args.eval_prompts,
        device=args.device,
        seed=args.seed,
        resume=args.resume,
        init=args.init,
        data_only=args.data_only,
        progress=not args.no_progress,
    )
    opts.prompt_limits["gsm8k_train.prompts.jsonl"] = args.gsm8k_limit
    report = run_distill(opts, cfg, log=lambda msg: print(msg, file=sys.stderr))
    if args.data_only:
        print(json.dumps(report, indent=2))
        return 0
    before, after, engine = report["before"], report["after"], report["engine"]
    print(json.dumps({"out": str(args.out), "before": before, "after": after, "engine": engine}, indent=2))
    return 0
