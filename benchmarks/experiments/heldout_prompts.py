"""Prompts unlike any the shipped suffix index was built from, and not Spec-Bench: for choosing a default drafter.

Question: which drafter should ``auto`` pick for the default model, judged on prompts none of them was built from?
Answer: ``suffix`` (the shipped index of the model's answers), 1.19× [1.13, 1.26] plain on them. This script wrote
the 30 prompts of benchmarks/results/default_drafter_choice_heldout/prompts.jsonl; report.md beside them has the
bench run.

Three groups of 10 in Spec-Bench's question format: GSM8K training questions that the index's request plan did not
sample (`specwise index` takes 1,000 of them with --seed 0), OASST prompts from the end of the plan's shuffled
order (the build's token budget stopped long before them), and tasks on corpus passages drawn with another seed.
The prompt and corpus directories are those the index was built from.

    python benchmarks/experiments/heldout_prompts.py --prompts-dir $SPECWISE_PROMPTS --corpus-dir CORPORA \\
        --self-prompts ~/.cache/specwise/index/SmolLM2-135M-Instruct/self_prompts.json \\
        --out benchmarks/results/default_drafter_choice_heldout/prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from specwise.lab.answers import corpus_files, gather_prompts, passage_prompts
from specwise.lab.index import IndexOptions


def _rows(path: Path) -> list[str]:
    return [json.loads(line)["prompt"] for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts-dir", type=Path, required=True)
    ap.add_argument("--corpus-dir", type=Path, required=True)
    ap.add_argument("--self-prompts", type=Path, required=True, help="self_prompts.json of the index build")
    ap.add_argument("--passages", type=int, default=400, help="--passages of the index build")
    ap.add_argument("--seed", type=int, default=0, help="--seed of the index build")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    build = IndexOptions(
        prompts_dir=args.prompts_dir, corpus_dir=args.corpus_dir, passages=args.passages, seed=args.seed
    )
    texts, tasks = gather_prompts(build)  # what the index build gathered
    used = set(texts)
    written = json.loads(args.self_prompts.read_text())
    plan = texts + tasks + list(written if isinstance(written, list) else written["prompts"])
    random.Random(args.seed).shuffle(plan)  # the order in which the build answers
    oasst = set(_rows(args.prompts_dir / "oasst_en.prompts.jsonl"))
    groups = {
        "gsm8k_train_unused": random.Random(7).sample(
            [g for g in _rows(args.prompts_dir / "gsm8k_train.prompts.jsonl") if g not in used], 10
        ),
        "oasst_unanswered": [t for t in plan[-600:] if t in oasst and 20 < len(t) < 400][:10],
        "passages_new": [t for t in passage_prompts(corpus_files(args.corpus_dir), 10, 123) if t not in set(tasks)],
    }
    rows = [
        {"question_id": f"{cat}-{i}", "category": cat, "turns": [t]}
        for cat, items in groups.items()
        for i, t in enumerate(items)
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
