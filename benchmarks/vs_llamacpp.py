"""What ``specwise bench --llama-cpp`` does not measure: how often greedy decoding by specwise ``q8`` and by
llama.cpp agrees with ``exact`` (the dequantized float32 model's numbers) on the same GGUF file.

Speed against llama.cpp is ``specwise bench``'s (interleaved rounds, paired intervals):

    specwise bench --out /tmp/vs-llamacpp --questions question.jsonl \\
        --limit-per-category 2 --rounds 3 --drafter none auto --gamma auto --no-hf --llama-cpp --threads 2

This script decodes every question greedily (128 tokens, EOS ignored) with specwise ``q8`` plain, specwise
``exact`` plain and llama.cpp (``llama-server`` from the same prompt ids), and reports per method the share of
answers identical to ``exact`` and the tokens before the first difference. Decoding after a long context, against
``llama-bench -d N``, is decode_vs_llama_bench.py's.

    python benchmarks/vs_llamacpp.py --per-category 2 --out /tmp/agreement.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from specwise.engine import Engine
from specwise.lab.bench.llamacpp import LlamaServer, find_llama_cpp
from specwise.lab.bench.prompts import default_prompts, load_questions, select_prompts
from specwise.lab.bench.runner import machine_info
from specwise.models import load_model
from specwise.models.loader import gguf_source
from specwise.models.quantized import QuantizedModel
from specwise.models.threads import set_num_threads
from specwise.runtime import encode_prompt
from specwise.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def first_difference(a: list[int], b: list[int]) -> int:
    """Index of the first differing token (the shorter length when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def plain(model, ids: list[int], n: int) -> list[int]:
    return Engine(model, None, gamma=0).generate(ids, GREEDY, max_new_tokens=n, eos_token_ids=[]).token_ids


def agreement(tokens: dict[str, list[list[int]]], reference: list[list[int]]) -> dict:
    """Per method: identical answers and tokens before the first difference, against the reference's."""
    out = {}
    for method, answers in tokens.items():
        prefix = [first_difference(a, r) for a, r in zip(answers, reference)]
        out[method] = {
            "answers": len(answers),
            "identical_share": sum(a == r for a, r in zip(answers, reference)) / len(answers),
            "median_tokens_before_first_difference": statistics.median(prefix),
            "mean_tokens_before_first_difference": statistics.fmean(prefix),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="default", help="default or a .gguf file")
    ap.add_argument(
        "--questions",
        default=os.environ.get("SPECWISE_QUESTIONS"),
        help="Spec-Bench's question.jsonl (default: $SPECWISE_QUESTIONS, else the project's prompts)",
    )
    ap.add_argument("--categories", nargs="*", default=None)
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-cache", default="float32", choices=["float32", "float16"], help="q8's KV cache")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--no-llama-cpp",
        metavar="WHY",
        default=None,
        help="agreement of q8 with exact only, llama.cpp left out for the reason given (a file it cannot run)",
    )
    args = ap.parse_args()
    set_num_threads(args.threads)
    gguf = gguf_source(args.target)
    if gguf is None or (args.no_llama_cpp is None and find_llama_cpp() is None):
        raise SystemExit("needs a GGUF target and the llama.cpp binaries (see specwise/lab/bench/llamacpp.py)")
    prompts = select_prompts(
        (load_questions(args.questions) if args.questions else default_prompts()), args.categories, args.per_category
    )
    q8, exact = load_model(args.target, precision="q8"), load_model(args.target, precision="exact")
    q8_model = q8.model if args.kv_cache == "float32" else QuantizedModel(gguf, precision="q8", kv_cache=args.kv_cache)
    encoded = [encode_prompt(q8.tokenizer, p.text, chat=True) for p in prompts]
    reference = [plain(exact.model, ids, args.new_tokens) for ids in encoded]
    tokens = {"q8": [plain(q8_model, ids, args.new_tokens) for ids in encoded]}
    if args.no_llama_cpp is None:
        with LlamaServer(gguf, threads=args.threads, ctx_size=4096) as server:
            tokens["llama.cpp"] = [server.greedy(ids, args.new_tokens)["token_ids"] for ids in encoded]
    results = {
        "command": " ".join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "target": str(gguf),
        "machine": machine_info("cpu"),
        "threads": args.threads,
        "kv_cache": args.kv_cache,
        "new_tokens": args.new_tokens,
        "prompts": [p.id for p in prompts],
        "agreement_with_exact": agreement(tokens, reference),
        "llama_cpp_left_out": args.no_llama_cpp,
    }
    text = json.dumps(results, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps(results["agreement_with_exact"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
