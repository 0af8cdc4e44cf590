"""Where a decoding step's time goes outside the target's forward and the drafter, part by part.

Times, per call, the pieces a step runs around the target pass on the default model's vocabulary: the check of the
logits, the greedy rule, the sampling distribution (temperature 1 with top-k, top-p and min-p over the full
vocabulary), the stochastic rule with its draw, and the incremental detokenization; then a whole plain decoding run
split into the forward and the rest.

    python benchmarks/step_parts.py --out benchmarks/results/step_parts_default.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from specwise.engine import Engine, StopText
from specwise.lab.bench.runner import machine_info
from specwise.models.loader import load_model
from specwise.rejection import verify_greedy, verify_stochastic
from specwise.runtime import encode_prompt
from specwise.sampling import SamplingParams, check_logits, probs_from_logits


def per_call_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(repeats):
            fn()
        times.append((time.perf_counter() - t) / repeats * 1e3)
    return statistics.median(times)


def run_split(engine: Engine, model, ids: list[int], params: SamplingParams, tokens: int) -> dict:
    """A plain decoding run, split into the target's forward and everything else, per step (median of 5 runs)."""
    forward = model.forward
    spent = [0.0, 0]

    def timed(*args, **kwargs):
        t = time.perf_counter()
        out = forward(*args, **kwargs)
        spent[0] += time.perf_counter() - t
        spent[1] += 1
        return out

    model.forward = timed
    outside, inside = [], []
    try:
        for _ in range(5):
            spent[:] = [0.0, 0]
            t = time.perf_counter()
            engine.generate(ids, params, max_new_tokens=tokens, eos_token_ids=[])
            total = time.perf_counter() - t
            outside.append((total - spent[0]) / (spent[1] - 1) * 1e3)
            inside.append(spent[0] / spent[1] * 1e3)
    finally:
        model.forward = forward
    return {"outside_forward_ms": statistics.median(outside), "forward_ms": statistics.median(inside)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="default")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    loaded = load_model(args.target)
    model, tok = loaded.model, loaded.tokenizer
    vocab = model.vocab_size
    g = np.random.default_rng(0)
    sampled = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, min_p=0.05, seed=0)
    full = SamplingParams(temperature=1.0, seed=0)
    parts = {}
    for k in (1, 5):
        logits = g.standard_normal((k, vocab), dtype=np.float32) * 4
        drafts = logits[: k - 1].argmax(-1)[None]
        p = probs_from_logits(logits, full)[None]
        parts[f"check_logits_k{k}"] = per_call_ms(lambda x=logits: check_logits(x), args.repeats)
        parts[f"greedy_rule_k{k}"] = per_call_ms(lambda d=drafts, x=logits: verify_greedy(d, x[None]), args.repeats)
        parts[f"probs_t1_full_k{k}"] = per_call_ms(lambda x=logits: probs_from_logits(x, full), args.repeats)
        parts[f"probs_t1_topk_topp_minp_k{k}"] = per_call_ms(
            lambda x=logits: probs_from_logits(x, sampled), args.repeats
        )
        parts[f"stochastic_rule_k{k}"] = per_call_ms(
            lambda d=drafts, q=p: verify_stochastic(d, None, q, g), args.repeats
        )
    answer = list(range(1000, 1000 + args.tokens))

    def detokenize():
        text = StopText(tok, stop=["\n\n\n"])
        for i in range(0, len(answer), 2):
            text.feed(answer[i : i + 2], final=False)

    parts["detokenize_per_step"] = per_call_ms(detokenize, 5) / (len(answer) / 2)
    ids = encode_prompt(tok, "Write a story about a robot who learns to paint.", chat=True)
    engine = Engine(model, None, gamma=0, tokenizer=tok)
    runs = {
        "greedy": run_split(engine, model, ids, SamplingParams(temperature=0.0), args.tokens),
        "t1_top_p": run_split(engine, model, ids, SamplingParams(temperature=1.0, top_p=0.9, seed=0), args.tokens),
    }
    result = {
        "command": "python benchmarks/step_parts.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "machine": machine_info("cpu"),
        "vocab": vocab,
        "parts_ms": parts,
        "plain_runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({"parts_ms": parts, "plain_runs": runs}, indent=1))


if __name__ == "__main__":
    main()
