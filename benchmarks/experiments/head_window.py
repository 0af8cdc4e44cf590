"""Does the head need the whole prompt? Greedy acceptance and first-ask time of the shipped head with its catch-up
limited to a window of recent positions (plus sinks).

Question: how much of the prompt must the head's catch-up read? Answer: the first 4 positions and the last 128 (the
default): greedy acceptance of one-token drafts 0.386 against 0.379 with the whole prompt, first ask a median 12 ms
instead of 65 ms (benchmarks/results/head_window.json; docs/DISTILL.md).

The prompts are long passages from plain-text corpora (``--corpus-dir``, ``*.txt``; never Spec-Bench questions).

    python benchmarks/experiments/head_window.py --corpus-dir CORPORA --out benchmarks/results/head_window.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from specwise.artifacts import shipped_head_dir
from specwise.drafters import quantized_head
from specwise.drafters.head import HeadDrafter, check_target, read_head
from specwise.engine import Engine
from specwise.lab.answers import corpus_files, passage_prompts
from specwise.models import load_model
from specwise.runtime import encode_prompt
from specwise.sampling import SamplingParams


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus-dir", required=True, help="a directory of plain-text corpora (*.txt)")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--words", type=int, default=450, help="passage length in words")
    ap.add_argument("--seed", type=int, default=4242)
    ap.add_argument("--gamma", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument(
        "--windows",
        nargs="+",
        default=["none/4", "256/4", "128/4", "64/4", "64/0", "32/4"],
        help="WINDOW/SINKS pairs (none: the whole context)",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    loaded = load_model("default", device="cpu")
    head = read_head(shipped_head_dir(loaded.name))  # the shipped head, attached as `--drafter head` attaches it
    check_target(head.config, loaded.hf_model, loaded.name)
    head.attach_target(loaded.hf_model)
    prompts = passage_prompts(corpus_files(Path(args.corpus_dir)), args.prompts, seed=args.seed, words=args.words)
    configs = []
    for spec in args.windows:
        w, s = spec.split("/")
        configs.append((spec, None if w == "none" else int(w), int(s)))
    rows = []
    for i, prompt in enumerate(prompts):
        ids = encode_prompt(loaded.tokenizer, prompt, chat=True)
        for spec, window, sinks in configs:
            drafter = HeadDrafter(
                head, loaded.model, window=window, sinks=sinks, quantized=quantized_head(loaded.model)
            )
            asks: list[float] = []
            propose = drafter.propose

            def timed(*a, propose=propose, asks=asks, **k):
                t0 = time.perf_counter()
                out = propose(*a, **k)
                asks.append(time.perf_counter() - t0)
                return out

            drafter.propose = timed
            result = Engine(loaded.model, drafter, gamma=args.gamma).generate(
                ids, SamplingParams(), args.max_new_tokens, eos_token_ids=[]
            )
            st = result.stats
            rows.append(
                {
                    "prompt": i,
                    "prompt_tokens": len(ids),
                    "window": spec,
                    "drafted": st.drafted,
                    "accepted": st.accepted,
                    "first_ask_ms": 1000 * asks[0],
                    "later_ask_ms_median": 1000 * statistics.median(asks[1:]),
                }
            )
        print(
            f"prompt {i} ({len(ids)} tokens): "
            + " ".join(f"{r['window']} {r['accepted']}/{r['drafted']}" for r in rows[-len(configs) :]),
            flush=True,
        )
    summary = {}
    for spec, _, _ in configs:
        mine = [r for r in rows if r["window"] == spec]
        acc, dr = sum(r["accepted"] for r in mine), sum(r["drafted"] for r in mine)
        summary[spec] = {
            "accepted": acc,
            "drafted": dr,
            "acceptance": acc / dr,
            "first_ask_ms_median": statistics.median(r["first_ask_ms"] for r in mine),
        }
        print(
            f"{spec:>8}: acceptance {acc}/{dr} = {acc / dr:.3f}, first ask "
            f"{summary[spec]['first_ask_ms_median']:.1f} ms (median)"
        )
    with open(args.out, "w") as f:
        json.dump(
            {"command": "python " + " ".join(sys.argv), "gamma": args.gamma, "summary": summary, "rows": rows},
            f,
            indent=1,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
