"""JSON-schema-constrained decoding on the default model: plain against the default drafter, greedy, side by side,
and what the grammar's masks cost.

Each round runs both configurations on every prompt (Spec-Bench extraction and writing questions asked for a JSON
answer: measurement only), in alternating order; tokens/s end to end, the paired ratio per prompt (geometric mean
over rounds), and whether the two answers are equal and valid JSON for the schema. The mask cost is timed apart:
the plain answer's tokens replayed through a fresh grammar state (a mask and a step per token), against the
plain pass's time per token.

    python benchmarks/constrained.py --rounds 3 --out constrained.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from specwise.bench.prompts import load_questions, select_prompts
from specwise.bench.runner import emit_json, script_header
from specwise.constraints import GrammarState, JsonSchema
from specwise.runtime import build_runtime, encode_prompt
from specwise.sampling import SamplingParams

QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"
SCHEMA = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "maxLength": 200},
        "items": {
            "type": "array",
            "maxItems": 5,
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 60}, "score": {"type": "integer"}},
                "required": ["name", "score"],
                "additionalProperties": False,
            },
        },
        "confidence": {"enum": ["low", "medium", "high"]},
    },
    "required": ["summary", "items", "confidence"],
    "additionalProperties": False,
}


def run(runtime, ids: list[int], params: SamplingParams, n: int) -> tuple[float, list[int]]:
    result = runtime.engine.generate(ids, params, max_new_tokens=n)
    return result.stats.new_tokens / result.stats.total_seconds, result.token_ids


def mask_cost(runtime, tokens: list[int], params: SamplingParams) -> float:
    """Seconds per token of a fresh grammar state replaying ``tokens`` (one mask and one step each)."""
    model = runtime.target.model
    state = GrammarState(params.constraint, runtime.tokenizer, model.vocab_size, runtime.engine.eos_token_ids or set())
    start = time.perf_counter()
    for token in tokens:
        state.mask()
        if not state._consume(token):
            break
    return (time.perf_counter() - start) / max(1, len(tokens))


def valid(runtime, tokens: list[int]) -> bool:
    try:
        data = json.loads(runtime.tokenizer.decode(tokens, skip_special_tokens=True))
    except ValueError:
        return False
    return isinstance(data, dict) and set(data) == {"summary", "items", "confidence"}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", default=str(QUESTIONS))
    ap.add_argument("--categories", nargs="+", default=["extraction", "writing"])
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    params = SamplingParams(temperature=0.0, constraint=JsonSchema(SCHEMA))
    prompts = select_prompts(load_questions(args.questions), args.categories, args.per_category)
    runtimes = {d: build_runtime("default", d, "auto", "cpu") for d in ("none", "auto")}
    texts = [
        p.text + "\n\nAnswer in JSON: a summary, the items with a score each, and your confidence." for p in prompts
    ]
    encoded = [encode_prompt(runtimes["none"].tokenizer, t, chat=True) for t in texts]
    for runtime in runtimes.values():  # warm up
        run(runtime, encoded[0], params, 16)
    rates: dict[str, list[list[float]]] = {d: [[] for _ in encoded] for d in runtimes}
    answers: dict[str, list[list[int]]] = {}
    for r in range(args.rounds):
        order = list(runtimes) if r % 2 == 0 else list(reversed(runtimes))
        for i, ids in enumerate(encoded):
            for d in order:
                rate, tokens = run(runtimes[d], ids, params, args.new_tokens)
                rates[d][i].append(rate)
                answers.setdefault(d, [None] * len(encoded))[i] = tokens
    paired = [
        math.exp(statistics.fmean(math.log(a / b) for a, b in zip(s, p))) for s, p in zip(rates["auto"], rates["none"])
    ]
    plain_pass = 1.0 / statistics.median(statistics.median(r) for r in rates["none"])
    masks = [mask_cost(runtimes["none"], tokens, params) for tokens in answers["none"]]
    emit_json(
        {
            **script_header(argv),
            "prompts": [p.id for p in prompts],
            "schema": SCHEMA,
            "tokens_per_s": {d: [statistics.median(r) for r in rows] for d, rows in rates.items()},
            "paired_speedup_by_prompt": paired,
            "paired_speedup": math.exp(statistics.fmean(math.log(x) for x in paired)),
            "answers_equal": [a == b for a, b in zip(answers["auto"], answers["none"])],
            "answers_valid": [valid(runtimes["none"], t) for t in answers["none"]],
            "answer_tokens": [len(t) for t in answers["none"]],
            "mask_seconds_per_token": statistics.median(masks),
            "mask_share_of_plain_token": statistics.median(masks) / plain_pass,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
