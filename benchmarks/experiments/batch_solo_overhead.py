"""One request at a time: `Engine.generate` against the same request through `BatchEngine` (what the server runs).

Question: does a lone request pay for going through the batching code? Answer: no measurable difference, 1.02×
(0.99–1.04) the plain engine's decode speed over 26 questions × 2 rounds (benchmarks/results/server_load/
batch_solo_overhead.json).

Both run on the same engine, interleaved per prompt, with a paired interval of the ratio of decode speeds.
engine_code_edit.py asks the same of the code-edit workload.

    python benchmarks/experiments/batch_solo_overhead.py --questions question.jsonl --per-category 2 --rounds 2 \\
        --out benchmarks/results/server_load/batch_solo_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from specwise.batch import BatchEngine, Request
from specwise.lab.bench.paired import geometric_interval
from specwise.lab.bench.prompts import default_prompts, load_questions, select_prompts
from specwise.lab.bench.runner import machine_info
from specwise.models.threads import set_num_threads
from specwise.runtime import build_runtime, encode_chat
from specwise.sampling import SamplingParams


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="default")
    p.add_argument("--drafter", default="auto")
    p.add_argument(
        "--questions",
        default=os.environ.get("SPECWISE_QUESTIONS"),
        help="Spec-Bench's question.jsonl (default: $SPECWISE_QUESTIONS, else the project's prompts)",
    )
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    set_num_threads(args.threads)
    runtime = build_runtime(args.target, args.drafter, "auto")
    engine = runtime.engine
    prompts = select_prompts(
        load_questions(args.questions) if args.questions else default_prompts(), None, args.per_category
    )
    ids = [encode_chat(runtime.tokenizer, [{"role": "user", "content": q.text}]) for q in prompts]
    greedy = SamplingParams()

    def solo(prompt: list[int]) -> tuple[int, float]:
        t0 = time.perf_counter()
        result = engine.generate(prompt, greedy, args.max_new_tokens)
        return len(result.token_ids), time.perf_counter() - t0

    def batched(prompt: list[int]) -> tuple[int, float]:
        t0 = time.perf_counter()
        events = BatchEngine(engine, max_batch=8).run_all([Request(prompt, greedy, args.max_new_tokens)])[0]
        return sum(len(e.token_ids) for e in events), time.perf_counter() - t0

    solo(ids[0])
    batched(ids[0])  # warm-up
    rows = []
    for r in range(args.rounds):
        for i, prompt in enumerate(ids):
            order = [("solo", solo), ("batch", batched)] if (i + r) % 2 == 0 else [("batch", batched), ("solo", solo)]
            cell = {"prompt": prompts[i].id, "category": prompts[i].category, "round": r}
            for name, fn in order:
                n, seconds = fn(prompt)
                cell[name] = {"tokens": n, "seconds": seconds, "tokens_per_second": n / seconds}
            rows.append(cell)
    ratio = geometric_interval([c["batch"]["tokens_per_second"] / c["solo"]["tokens_per_second"] for c in rows])
    report = {
        "command": "python " + shlex.join(["benchmarks/experiments/batch_solo_overhead.py", *(argv or sys.argv[1:])]),
        "machine": machine_info("cpu"),
        "drafter": runtime.drafter_spec,
        "batch_over_solo": ratio,
        "cells": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(ratio))
    return 0


if __name__ == "__main__":
    sys.exit(main())
