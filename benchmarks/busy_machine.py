"""Decoding beside one other busy process: plain and the default drafter, with the thread governor (``auto``) and
with every pass on all its threads (``fixed``, ``SPECWISE_THREADS=fixed``), quiet and beside a
``while True: pass`` process, in one run.

Each round runs every cell on the same prompts (Spec-Bench questions, measurement only), greedy, 128 new tokens,
decode tokens/s (the prompt's pass left out); the busy process starts before and stops after its cells. Reports
medians per cell and each cell's ratio busy / quiet. Optionally llama.cpp (``llama-bench -n 128``) in both
conditions.

    python benchmarks/busy_machine.py --rounds 3 --per-category 1 --llama-cpp --out busy.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from specwise.lab.bench.prompts import default_prompts, load_questions, select_prompts
from specwise.lab.bench.runner import emit_json, script_header
from specwise.models.base import Model
from specwise.models.threads import get_num_threads, set_num_threads
from specwise.runtime import build_runtime, encode_prompt
from specwise.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def decode_rate(runtime, ids: list[int], n: int, fixed: bool, threads: int) -> float:
    """Decode tokens/s of one greedy answer, the governor on or off for the target (and a draft model). A fixed run
    sets the native passes' thread count to ``threads`` and puts back the count before it afterwards (the governor
    takes a count set by anyone else as the user's new choice)."""
    before = get_num_threads()
    if fixed:
        set_num_threads(threads)
    try:
        return _rate(runtime, ids, n, fixed)
    finally:
        set_num_threads(before)


def _rate(runtime, ids: list[int], n: int, fixed: bool) -> float:
    runtime.target.model.fix_threads(fixed)
    for drafter in runtime.engine.drafters:
        model = getattr(drafter, "model", None)
        if isinstance(model, Model):
            model.fix_threads(fixed)
    stats = runtime.engine.generate(ids, GREEDY, max_new_tokens=n, eos_token_ids=[]).stats
    return stats.new_tokens / (stats.total_seconds - stats.prefill_seconds)


class Busy:
    """One other process spinning on a core while the block runs (None: nothing)."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.proc = None

    def __enter__(self):
        if self.on:
            self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="default")
    ap.add_argument("--drafters", nargs="+", default=["none", "auto"])
    ap.add_argument(
        "--questions",
        default=os.environ.get("SPECWISE_QUESTIONS"),
        help="Spec-Bench's question.jsonl (default: $SPECWISE_QUESTIONS, else the project's prompts)",
    )
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--categories", nargs="*", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-cpp", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    set_num_threads(args.threads)
    prompts = select_prompts(
        (load_questions(args.questions) if args.questions else default_prompts()), args.categories, args.per_category
    )
    runtimes = {d: build_runtime(args.target, d, "auto", "cpu") for d in args.drafters}
    encoded = [encode_prompt(runtimes[args.drafters[0]].tokenizer, p.text, chat=True) for p in prompts]
    cells: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for busy in (False, True):
            with Busy(busy):
                for drafter, runtime in runtimes.items():
                    for mode in ("fixed", "auto"):
                        key = f"{drafter}/{mode}/{'busy' if busy else 'quiet'}"
                        rates = [
                            decode_rate(runtime, ids, args.new_tokens, mode == "fixed", args.threads) for ids in encoded
                        ]
                        cells.setdefault(key, []).append(statistics.median(rates))
                if args.llama_cpp:
                    from specwise.lab.bench.llamacpp import llama_bench
                    from specwise.models.loader import gguf_source

                    peer = llama_bench(gguf_source(args.target), n_gen=args.new_tokens, threads=args.threads)
                    cells.setdefault(f"llama.cpp/-t {args.threads}/{'busy' if busy else 'quiet'}", []).append(
                        peer["tokens_per_s"]
                    )
    medians = {k: statistics.median(v) for k, v in cells.items()}
    kinds = [k.rsplit("/", 1)[0] for k in medians if k.endswith("/quiet")]
    emit_json(
        {
            **script_header(argv),
            "prompts": [p.id for p in prompts],
            "rounds": cells,
            "median_decode_tokens_per_s": medians,
            "busy_over_quiet": {k: medians[f"{k}/busy"] / medians[f"{k}/quiet"] for k in kinds},
        },
        args.out,
    )


if __name__ == "__main__":
    main()
