"""The head's training losses (KL, TV, JSD) on the same data and budget; held-out fidelity per drafting step.

Question: which token loss should `specwise distill` train the head with? Answer: forward KL, the default: held-out
top-1 agreement 0.305 at the first drafting step against 0.167 for TV and 0.196 for JSD (docs/DISTILL.md, "Losses";
the run's JSON is in git history).

Uses the data cached by `specwise distill` (or `--data-dir`):

    python benchmarks/experiments/distill_losses.py --train-shards 4 --epochs 1 --out distill_losses.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from specwise.drafters.head import new_head
from specwise.lab.distill import default_data_dir, held_out_split
from specwise.lab.distill.data import load_shards
from specwise.lab.distill.train import LOSSES, TrainConfig, draft_vocabulary, make_batches, train_head
from specwise.models.loader import load_model
from specwise.runtime import eos_ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="default")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--train-shards", type=int, default=6, help="training shards used (default: 6)")
    ap.add_argument("--held-out-shards", type=int, default=1)
    ap.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--steps-unrolled", type=int, default=3)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    loaded = load_model(args.target, device="cpu", dtype=torch.float32, impl="hf")
    data_dir = args.data_dir or default_data_dir(args.target)
    paths = sorted((data_dir / "answers").glob("shard_*.safetensors"))
    train_paths, held_paths = held_out_split(paths)
    train = load_shards(train_paths[: args.train_shards])
    held = load_shards(held_paths[: args.held_out_shards])
    vocab = draft_vocabulary(train, args.draft_vocab, eos_ids(loaded) or set(), loaded.model.vocab_size)
    full = loaded.hf_model.get_output_embeddings().weight.detach()
    results = {}
    for loss in args.losses:
        cfg = TrainConfig(
            loss=loss,
            epochs=args.epochs,
            steps_unrolled=args.steps_unrolled,
            batch_tokens=args.batch_tokens,
            warmup=args.warmup,
            eval_every=10**9,
        )
        head = new_head(loaded.hf_model, loaded.name, vocab, seed=cfg.seed)
        batches = make_batches(train, cfg.batch_tokens, cfg.max_seq_len, cfg.seed)
        held_batches = make_batches(held, cfg.batch_tokens, cfg.max_seq_len, cfg.seed)
        t0 = time.time()
        state = Path(f"/tmp/specwise-loss-{loss}.pt")
        state.unlink(missing_ok=True)
        report = train_head(head, batches, held_batches, full, cfg, state, log=lambda m: print(m, file=sys.stderr))
        state.unlink(missing_ok=True)
        results[loss] = {"seconds": round(time.time() - t0, 1), "steps": report["steps"], "after": report["after"]}
        print(loss, json.dumps(results[loss]["after"]), file=sys.stderr)
    data = {
        "command": "python " + " ".join(sys.argv),
        "target": loaded.name,
        "train_tokens": sum(len(s.tokens) for s in train),
        "held_out_tokens": sum(len(s.tokens) for s in held),
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
        "torch": torch.__version__,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    for loss, r in results.items():
        print(f"{loss:4s} top-1 by step {r['after']['top1_agreement']}  alpha by step {r['after']['alpha']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
