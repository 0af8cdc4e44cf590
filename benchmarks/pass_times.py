"""Measured target passes by size, per drafter, on one Spec-Bench question: is a slow cell the machine or the
engine?

Each drafter (``none`` is plain decoding) gets its own engine with gamma auto; the engines answer the question in
turn, ``--repeats`` times. Every target pass's measured time is recorded by its number of tokens, with the plain
steps' reasons and the stats by drafter.

    python benchmarks/pass_times.py stem none ngram --out benchmarks/results/pass_times_stem.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from engine_speed import load_questions

from specwise.drafters import make_drafter
from specwise.engine import Engine
from specwise.models import load_model
from specwise.runtime import encode_prompt
from specwise.sampling import SamplingParams


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("category")
    ap.add_argument("drafters", nargs="+")
    ap.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    loaded = load_model("default", device="cpu")
    question = load_questions(args.questions, 1, [args.category])[0]
    ids = encode_prompt(loaded.tokenizer, question["turns"][0], chat=True)
    engines = {}
    for spec in args.drafters:
        drafter = None if spec == "none" else make_drafter(spec, loaded, device="cpu")
        engine = Engine(loaded.model, drafter, gamma="auto" if drafter else 0)
        record: list[tuple[int, float]] = []
        observe_pass = engine.schedule.observe_pass

        def traced(drafted, accepted, seconds, source=0, observe_pass=observe_pass, record=record):
            record.append((drafted + 1, seconds))
            observe_pass(drafted, accepted, seconds, source=source)

        engine.schedule.observe_pass = traced
        engines[spec] = (engine, record)
    runs = []
    for repeat in range(args.repeats):
        for spec, (engine, record) in engines.items():
            record.clear()
            t0 = time.perf_counter()
            result = engine.generate(ids, SamplingParams(), args.max_new_tokens, eos_token_ids=[])
            seconds = time.perf_counter() - t0
            by_size: dict[int, list[float]] = {}
            for k, s in record:
                by_size.setdefault(k, []).append(s)
            row = {
                "repeat": repeat,
                "drafter": spec,
                "seconds": seconds,
                "target_passes": len(record),
                "plain_step_reasons": result.stats.plain_step_reasons,
                "by_drafter": result.stats.by_drafter,
                "passes_by_size": {str(k): len(v) for k, v in sorted(by_size.items())},
                "median_pass_ms_by_size": {str(k): 1000 * statistics.median(v) for k, v in sorted(by_size.items())},
            }
            runs.append(row)
            sizes = " ".join(f"k{k}:{len(v)}x{1000 * statistics.median(v):.1f}ms" for k, v in sorted(by_size.items()))
            print(f"{spec:>12} {seconds:.2f} s, {len(record)} passes, {sizes}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"command": "python " + " ".join(sys.argv), "category": args.category, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
