"""The JSON-schema suite on the default model: plain against the default drafter, greedy, per shape: validity,
equal answers, speedup, forced tokens and what the grammar's masks cost.

Three configurations: ``per_token`` is constrained plain decoding one pass per token (what llama.cpp's grammars
and vLLM's structured output do: a forced token costs a pass like any other); ``none`` is specwise's plain decoding,
which feeds the tokens the grammar forces in the next pass (jump-forward, exact); ``auto`` is the default drafter
(or ``--drafter``) with jump-forward. Ratios are given against both plain decoders.

The items are the suite's 20 shapes with their prompts (specwise/lab/bench/schemas.py) and questions of
``--categories`` (extraction by default: the project's own prompts, or a Spec-Bench file with ``--questions``) asked
for an answer in the suite's extraction shape. Every shape is
bounded and each request gets max_json_bytes(schema) new tokens, so every answer ends complete: the goal is 100%
valid. Each round runs the three configurations on every item, each first in turn; tokens/s end to end, the paired
ratio per item (geometric mean over rounds; also on decode tokens/s, after the prefill, which dominates the short
answers), whether the two answers are equal and valid against the schema
(jsonschema), the share of tokens the grammar forced (jump-forward) and tau. The mask cost is timed apart: the
plain answer's tokens replayed through a fresh grammar state (a mask and a step per token), against the plain run's
time per target pass.

    python benchmarks/constrained_suite.py --rounds 3 --out benchmarks/results/constrained_suite.json
    python benchmarks/constrained_suite.py --shapes flat enums --spec-bench 1 --rounds 1   # a smoke run
    python benchmarks/constrained_suite.py --drafter ngram+head --rounds 1   # another drafter against plain
    python benchmarks/constrained_suite.py --questions question.jsonl --categories extraction writing --spec-bench 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import jsonschema

from specwise.constraints import GrammarState, JsonSchema, max_json_bytes
from specwise.lab.bench.prompts import default_prompts, load_questions, select_prompts
from specwise.lab.bench.runner import emit_json, script_header
from specwise.lab.bench.schemas import EXTRACTION, SUITE, extraction_prompt
from specwise.models.threads import set_num_threads
from specwise.runtime import build_runtime, encode_prompt
from specwise.sampling import SamplingParams

DRAFTERS = ("per_token", "none", "auto")  # plain one pass per token, plain with jump-forward, speculative


def mask_cost(runtime, tokens: list[int], constraint) -> float:
    """Seconds per token of a fresh grammar state replaying ``tokens`` (one mask and one step each)."""
    engine = runtime.engine
    eos = set(engine.eos_token_ids or ())  # the tokens that end an answer, as the engine was built with
    state = GrammarState(constraint, runtime.tokenizer, engine.target.vocab_size, eos)
    start = time.perf_counter()
    for token in tokens:
        state.mask()
        state.advance([token])
    return (time.perf_counter() - start) / max(1, len(tokens))


def valid(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def geomean(values: list[float]) -> float | None:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None


def items(args) -> list[dict]:
    """The shapes asked for and the Spec-Bench questions, each with its prompt, schema and token budget."""
    out = [
        {"id": name, "kind": "suite", "text": SUITE[name][1], "schema": SUITE[name][0]}
        for name in (args.shapes or list(SUITE))
    ]
    if args.spec_bench:
        prompts = select_prompts(
            (load_questions(args.questions) if args.questions else default_prompts()), args.categories, args.spec_bench
        )
        out += [
            {"id": f"spec_bench/{p.id}", "kind": "spec_bench", "text": extraction_prompt(p.text), "schema": EXTRACTION}
            for p in prompts
        ]
    for item in out:
        item["max_new_tokens"] = max_json_bytes(item["schema"])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", choices=sorted(SUITE), help="the suite's shapes to run (default: all 20)")
    ap.add_argument(
        "--questions",
        default=os.environ.get("SPECWISE_QUESTIONS"),
        help="Spec-Bench's question.jsonl (default: $SPECWISE_QUESTIONS, else the project's prompts)",
    )
    ap.add_argument("--categories", nargs="+", default=["extraction"])
    ap.add_argument("--spec-bench", type=int, default=10, help="Spec-Bench questions per category (0: none)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafter", default="auto", help="the speculative configuration set against plain (default: auto)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    set_num_threads(args.threads)
    specs = {"per_token": "none", "none": "none", "auto": args.drafter}  # "auto": the speculative side
    runtimes = {d: build_runtime("default", specs[d], "auto", "cpu") for d in DRAFTERS}
    runtimes["per_token"].engine.jump_forward = False  # forced tokens one pass each, as llama.cpp and vLLM decode
    tokenizer = runtimes["none"].tokenizer
    work = items(args)
    for item in work:
        item["ids"] = encode_prompt(tokenizer, item["text"], chat=True)
        item["params"] = SamplingParams(temperature=0.0, constraint=JsonSchema(item["schema"]))
    for runtime in runtimes.values():  # warm up
        runtime.engine.generate(work[0]["ids"], work[0]["params"], 16)
    rates = {d: [[] for _ in work] for d in DRAFTERS}
    decode = {d: [[] for _ in work] for d in DRAFTERS}  # tokens/s after the prefill (short answers: mostly prefill)
    pass_seconds: list[float] = []
    results: dict[str, list] = {d: [None] * len(work) for d in DRAFTERS}
    for r in range(args.rounds):
        order = DRAFTERS[r % 3 :] + DRAFTERS[: r % 3]  # each configuration first in turn
        for i, item in enumerate(work):
            for d in order:
                result = runtimes[d].engine.generate(item["ids"], item["params"], item["max_new_tokens"])
                stats = result.stats
                rates[d][i].append(stats.new_tokens / stats.total_seconds)
                decode[d][i].append(stats.new_tokens / (stats.total_seconds - stats.prefill_seconds))
                results[d][i] = result
                if d == "none":
                    pass_seconds.append(stats.verify_seconds / stats.target_passes)
    plain_pass = statistics.median(pass_seconds)
    rows = []
    for i, item in enumerate(work):
        plain, spec, per_token = results["none"][i], results["auto"][i], results["per_token"][i]
        mask = mask_cost(runtimes["none"], plain.token_ids, item["params"].constraint)
        rows.append(
            {
                "id": item["id"],
                "kind": item["kind"],
                "max_new_tokens": item["max_new_tokens"],
                "tokens": len(plain.token_ids),
                "finish_reason": {d: results[d][i].finish_reason for d in DRAFTERS},
                "valid": {d: valid(results[d][i].text, item["schema"]) for d in DRAFTERS},
                "equal": plain.token_ids == spec.token_ids == per_token.token_ids,
                "tokens_per_s": {d: statistics.median(rates[d][i]) for d in DRAFTERS},
                "paired_speedup": geomean([a / b for a, b in zip(rates["auto"][i], rates["none"][i])]),
                "paired_decode_speedup": geomean([a / b for a, b in zip(decode["auto"][i], decode["none"][i])]),
                "paired_speedup_vs_per_token": geomean(
                    [a / b for a, b in zip(rates["auto"][i], rates["per_token"][i])]
                ),
                "paired_decode_speedup_vs_per_token": geomean(
                    [a / b for a, b in zip(decode["auto"][i], decode["per_token"][i])]
                ),
                "jump_forward_speedup": geomean([a / b for a, b in zip(rates["none"][i], rates["per_token"][i])]),
                "forced_share": spec.stats.forced / max(1, spec.stats.new_tokens),
                "tau": {d: results[d][i].stats.mean_accepted_length for d in DRAFTERS},
                "acceptance_rate": spec.stats.acceptance_rate,
                "mask_seconds_per_token": mask,
                "mask_share_of_plain_pass": mask / plain_pass,
                "answer": plain.text,
            }
        )

    def summary(kind: str | None) -> dict:
        chosen = [row for row in rows if kind is None or row["kind"] == kind]
        if not chosen:
            return {}
        return {
            "items": len(chosen),
            "valid": sum(all(row["valid"].values()) for row in chosen) / len(chosen),
            "equal": sum(row["equal"] for row in chosen) / len(chosen),
            "paired_speedup": geomean([row["paired_speedup"] for row in chosen]),
            "paired_decode_speedup": geomean([row["paired_decode_speedup"] for row in chosen]),
            "paired_speedup_vs_per_token": geomean([row["paired_speedup_vs_per_token"] for row in chosen]),
            "paired_decode_speedup_vs_per_token": geomean(
                [row["paired_decode_speedup_vs_per_token"] for row in chosen]
            ),
            "jump_forward_speedup": geomean([row["jump_forward_speedup"] for row in chosen]),
            "tokens_median": statistics.median(row["tokens"] for row in chosen),
            "forced_share_median": statistics.median(row["forced_share"] for row in chosen),
            "mask_share_of_plain_pass_median": statistics.median(row["mask_share_of_plain_pass"] for row in chosen),
        }

    emit_json(
        {
            **script_header(argv),
            "drafters": {d: runtimes[d].drafter_spec for d in DRAFTERS},
            "plain_pass_seconds": plain_pass,
            "summary": {"all": summary(None), "suite": summary("suite"), "spec_bench": summary("spec_bench")},
            "items": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
