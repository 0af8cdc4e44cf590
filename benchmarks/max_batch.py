"""Choosing `--max-batch`: in-process continuous batching (`BatchEngine`, what the server runs) with a closed loop
of concurrent clients (each submits its next request when the last one ends), for several batch limits,
interleaved over rounds: total tokens/s and the median time to first token.

    python benchmarks/max_batch.py --clients 16 --requests 32 --limits 4 8 16 --rounds 2 \\
        --questions question.jsonl --out benchmarks/results/server_load/max_batch.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

from specwise.batch import BatchEngine, Request
from specwise.lab.bench.prompts import default_prompts, interleave_categories, load_questions
from specwise.lab.bench.runner import machine_info
from specwise.models.threads import set_num_threads
from specwise.runtime import build_runtime, encode_chat
from specwise.sampling import SamplingParams


def closed_loop(engine, prompts: list[list[int]], clients: int, limit: int, max_new_tokens: int) -> dict:
    batch = BatchEngine(engine, max_batch=limit)
    queues = [prompts[i::clients] for i in range(clients)]
    owner: dict[int, int] = {}
    submitted: dict[int, float] = {}
    ttft: list[float] = []
    tokens = 0

    def submit(client: int) -> None:
        rid = batch.submit(Request(queues[client].pop(0), SamplingParams(), max_new_tokens))
        owner[rid], submitted[rid] = client, time.perf_counter()

    start = time.perf_counter()
    for c in range(clients):
        submit(c)
    while batch.has_work():
        for rid, event in batch.step().events:
            tokens += len(event.token_ids)
            if event.token_ids and rid in submitted:
                ttft.append(time.perf_counter() - submitted.pop(rid))
            if event.finish_reason is not None and queues[owner[rid]]:
                submit(owner.pop(rid))
    seconds = time.perf_counter() - start
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "ttft_median": statistics.median(ttft),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="default")
    p.add_argument("--drafter", default="auto")
    p.add_argument(
        "--questions",
        default=os.environ.get("SPECWISE_QUESTIONS"),
        help="Spec-Bench's question.jsonl (default: $SPECWISE_QUESTIONS, else the project's prompts)",
    )
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--limits", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    set_num_threads(args.threads)
    runtime = build_runtime(args.target, args.drafter, "auto")
    texts = [
        q.text
        for q in interleave_categories(load_questions(args.questions) if args.questions else default_prompts())[
            : args.requests
        ]
    ]
    prompts = [encode_chat(runtime.tokenizer, [{"role": "user", "content": t}]) for t in texts]
    runs: dict[int, list[dict]] = {limit: [] for limit in args.limits}
    for r in range(args.rounds):
        order = args.limits if r % 2 == 0 else list(reversed(args.limits))
        for limit in order:
            runs[limit].append(closed_loop(runtime.engine, prompts, args.clients, limit, args.max_new_tokens))
            print(
                f"round {r + 1}, max_batch {limit}: {runs[limit][-1]['tokens_per_second']:.1f} tokens/s",
                file=sys.stderr,
            )
    summary = {
        str(limit): {
            "tokens_per_second_median": statistics.median(x["tokens_per_second"] for x in rs),
            "ttft_median_seconds": statistics.median(x["ttft_median"] for x in rs),
        }
        for limit, rs in runs.items()
    }
    report = {
        "command": "python " + shlex.join(["benchmarks/max_batch.py", *(argv or sys.argv[1:])]),
        "machine": machine_info("cpu"),
        "drafter": runtime.drafter_spec,
        "clients": args.clients,
        "summary": summary,
        "runs": {str(k): v for k, v in runs.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
