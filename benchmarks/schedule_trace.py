"""What the adaptive schedule believes, step by step: a trace of its estimates on consecutive Spec-Bench answers.

One engine (drafter and gamma auto) answers the first question of the given categories one after the other, as a
server would; before every step (for each drafter of a combined one: "source") the trace records gamma chosen, the
confidence threshold, the estimated seconds of drafting one token and of passes over 1 and 2 tokens, the
acceptance estimates of the first positions and the estimated probability that asking yields a draft; after
every step, the measured time of the target pass (median per pass size in "measured_pass_ms").

    python benchmarks/schedule_trace.py --drafter head summarization qa translation \
        --out benchmarks/results/schedule_trace.json
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
    ap.add_argument("categories", nargs="+")
    ap.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--drafter", default="head")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--out", default="benchmarks/results/schedule_trace.json")
    args = ap.parse_args()

    loaded = load_model("default", device="cpu")
    engine = Engine(loaded.model, make_drafter(args.drafter, loaded, device="cpu"), gamma="auto")
    schedule = engine.schedule
    choose = schedule.choose
    steps: list[dict] = []

    def traced_choose(limit: int, source: int = 0) -> int:
        gamma = choose(limit, source=source)
        steps.append(
            {
                "source": source,
                "gamma": gamma,
                "min_confidence": round(schedule.min_confidence(source), 3),
                "draft_ms": round(1000 * schedule._draft_time(source), 2),
                "pass_1_ms": round(1000 * schedule._verify_time(1), 2),
                "pass_2_ms": round(1000 * schedule._verify_time(2), 2),
                "acceptance": [round(a, 3) for a in schedule.acceptance(source)[:3]],
                "draft_probability": round(schedule.draft_probability(source), 3),
            }
        )
        return gamma

    observe_pass = schedule.observe_pass
    passes: list[list] = []

    def traced_observe_pass(drafted: int, accepted: int, seconds: float, source: int = 0) -> None:
        passes.append([drafted, accepted, round(1000 * seconds, 2)])
        observe_pass(drafted, accepted, seconds, source=source)

    schedule.choose = traced_choose
    schedule.observe_pass = traced_observe_pass
    questions = {q["category"]: q for q in load_questions(args.questions, 1, args.categories)}
    answers = []
    for cat in args.categories:
        steps, passes = [], []
        ids = encode_prompt(loaded.tokenizer, questions[cat]["turns"][0], chat=True)
        params = SamplingParams(temperature=args.temperature, seed=0 if args.temperature > 0 else None)
        t0 = time.perf_counter()
        result = engine.generate(ids, params, max_new_tokens=args.max_new_tokens, eos_token_ids=[])
        seconds = time.perf_counter() - t0
        stats = result.stats
        print(
            f"{cat}: {seconds:.2f} s, {stats.target_passes} passes, plain steps {stats.plain_step_reasons}, "
            f"last step {steps[-1] if steps else None}"
        )
        answers.append(
            {
                "category": cat,
                "seconds": seconds,
                "target_passes": stats.target_passes,
                "plain_step_reasons": stats.plain_step_reasons,
                "gamma_histogram": stats.gamma_histogram,
                "steps": steps,
                "passes": passes,  # [tokens drafted, accepted, measured ms of the pass] per step
                "measured_pass_ms": {
                    str(k): round(statistics.median(p[2] for p in passes if p[0] + 1 == k), 2)
                    for k in sorted({p[0] + 1 for p in passes})
                },
            }
        )
    with open(args.out, "w") as f:
        json.dump({"command": "python " + " ".join(sys.argv), "drafter": args.drafter, "answers": answers}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
