"""Draft passes against draft tokens for model drafters, per question, greedy.

Question: does the draft model speculating on itself (``model:…?lookup=N``: prompt-lookup continuations checked in
its own passes) save draft passes? Answer: few: 99–117 passes for 100–136 draft tokens with ``&lookup=3`` against
one pass a token without, and no end-to-end gain (benchmarks/results/xeon_qwen15_staged_coding/draft_passes.json,
and results.json beside it).

Per question: how many passes of the draft model the answer took, how many rows they fed, and the step's time split
(draft, verify). The questions are the first ``--questions`` of ``--category`` (the project's own prompts, or a
Spec-Bench question file with ``--questions-file``).

    python benchmarks/experiments/draft_passes.py --target …/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf \\
        --drafters "model:…0.5B…gguf?vocab=65536" "model:…0.5B…gguf?vocab=65536&lookup=3" \\
        --questions-file question.jsonl --questions 4 --out draft_passes.json
"""

from __future__ import annotations

import argparse
import os

from specwise.lab.bench.prompts import default_prompts, load_questions, select_prompts
from specwise.lab.bench.runner import emit_json, script_header
from specwise.models.threads import set_num_threads
from specwise.runtime import build_runtime, encode_prompt
from specwise.sampling import SamplingParams


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafters", nargs="+", required=True)
    ap.add_argument("--category", default="coding")
    ap.add_argument("--questions", type=int, default=4, help="how many questions of --category")
    ap.add_argument(
        "--questions-file",
        default=os.environ.get("SPECWISE_QUESTIONS"),
        help="Spec-Bench's question.jsonl (default: $SPECWISE_QUESTIONS, else the project's prompts)",
    )
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    set_num_threads(args.threads)
    chosen = select_prompts(
        load_questions(args.questions_file) if args.questions_file else default_prompts(),
        [args.category],
        args.questions,
    )
    out = {}
    for spec in args.drafters:
        runtime = build_runtime(args.target, spec, "auto", "cpu")
        draft = runtime.engine.drafters[0].model
        counts = {"passes": 0, "rows": 0}
        forward = draft.forward

        def recording(tokens, num_logits=None, forward=forward, counts=counts):
            counts["passes"] += 1
            counts["rows"] += len(tokens)
            return forward(tokens, num_logits)

        draft.forward = recording
        answers = []
        for q in chosen:
            counts.update(passes=0, rows=0)
            ids = encode_prompt(runtime.tokenizer, q.text, chat=True)
            stats = runtime.engine.generate(ids, SamplingParams(), args.max_new_tokens).stats
            answers.append(
                {
                    "question_id": q.id,
                    "tokens_per_s": stats.new_tokens / stats.total_seconds,
                    "new_tokens": stats.new_tokens,
                    "drafted": stats.drafted,
                    "accepted": stats.accepted,
                    "target_passes": stats.target_passes,
                    "draft_passes": counts["passes"],  # the prompt's intake included
                    "draft_rows": counts["rows"],
                    "draft_seconds": stats.draft_seconds,
                    "verify_seconds": stats.verify_seconds,
                }
            )
        out[spec] = answers
    emit_json({**script_header(argv), "target": args.target, "by_drafter": out}, args.out)


if __name__ == "__main__":
    main()
