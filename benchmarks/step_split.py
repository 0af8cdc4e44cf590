"""Where a decoding step's time goes in the engine, per target pass: the target's forward (decoding passes only),
the planner with the drafter (``Planner.draft``), the verification and bookkeeping (``Engine.finish_step``) and the
planner's update (``Planner.observe``), for plain decoding and a drafter, greedy (or sampled with ``--temperature``
and ``--top-p``, seed 0), on the project's prompts or every 40th question of a Spec-Bench file (128 new tokens,
2 rounds).

    python benchmarks/step_split.py --drafters none suffix --out benchmarks/results/step_split_default.json
    python benchmarks/step_split.py --drafters none suffix suffix+head --temperature 1
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

from specwise.drafters import make_drafter
from specwise.engine import Engine
from specwise.lab.bench.prompts import default_prompts, load_questions
from specwise.lab.bench.runner import emit_json, machine_info
from specwise.models.loader import load_model
from specwise.runtime import encode_prompt, saved_cost_prior
from specwise.sampling import SamplingParams


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="default")
    ap.add_argument("--drafters", nargs="+", default=["none", "suffix"])
    ap.add_argument(
        "--questions",
        default=os.environ.get("SPECWISE_QUESTIONS"),
        help="Spec-Bench's question.jsonl (default: $SPECWISE_QUESTIONS, else the project's prompts): every 40th",
    )
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else sampled with seed 0")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    loaded = load_model(args.target)
    model, tok = loaded.model, loaded.tokenizer
    texts = (
        [q.text for q in load_questions(args.questions)[::40]]
        if args.questions
        else [p.text for p in default_prompts()]
    )
    prompts = [encode_prompt(tok, text, True) for text in texts][: args.prompts]
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=0)
    spent: dict[str, float] = collections.defaultdict(float)
    decoding = [False]  # inside a decoding pass's step (not a prefill)

    def timed(obj, name: str, key: str) -> None:
        inner = getattr(obj, name)

        def wrapper(*a, **k):
            t = time.perf_counter()
            out = inner(*a, **k)
            if decoding[0]:
                spent[key] += time.perf_counter() - t
            return out

        setattr(obj, name, wrapper)

    forward = model.forward

    def timed_forward(ids, *a, **k):
        decoding[0] = len(ids) <= 9  # a prefill's pass is not a step's
        t = time.perf_counter()
        out = forward(ids, *a, **k)
        if decoding[0]:
            spent["forward"] += time.perf_counter() - t
        return out

    results = {}
    for spec in args.drafters:
        drafter = make_drafter(spec, loaded) if spec != "none" else None
        engine = Engine(model, drafter, "auto", tok, cost_curve=saved_cost_prior(loaded, "cpu"))
        timed(engine.planner, "draft", "planner_draft")
        timed(engine.planner, "observe", "observe")
        timed(engine, "finish_step", "finish_step")
        for p in prompts[:2]:  # warm-up
            engine.generate(p, params, max_new_tokens=128, eos_token_ids=[])
        spent.clear()
        model.forward = timed_forward
        passes, seconds = 0, 0.0
        try:
            for _ in range(args.rounds):
                for p in prompts:
                    out = engine.generate(p, params, max_new_tokens=128, eos_token_ids=[])
                    seconds += out.stats.total_seconds - out.stats.prefill_seconds
                    passes += out.stats.target_passes
        finally:
            model.forward = forward
            decoding[0] = False
        results[spec] = {
            "passes": passes,
            "decode_tokens_per_second": args.rounds * len(prompts) * 128 / seconds,
            "ms_per_pass": {k: v / passes * 1e3 for k, v in sorted(spent.items())},
        }
        print(spec, json.dumps(results[spec]), file=sys.stderr, flush=True)
    result = {"command": " ".join(sys.argv), "machine": machine_info("cpu"), "drafters": results}
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
