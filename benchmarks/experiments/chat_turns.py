"""Multi-turn chats with a draft model: its cache kept across requests against emptied at every request.

Question: does keeping the draft model's cache across a chat's requests (it takes in only what a turn adds), and
with ``--batch`` the batch engine's prompt caching (the conversation's slot keeps the target's and the draft model's
caches), pay on later turns? Answer: yes. Qwen2.5-Coder-1.5B with the 0.5B draft, 10 conversations: turns 2-3
1.09× [1.00, 1.19] the speed with the draft cache kept (benchmarks/results/xeon_qwen15_chat_turns.json); through
the batch engine 1.87× [1.65, 2.11] with prompt caching (benchmarks/results/xeon_qwen15_chat_turns_batch.json);
turn 1 unchanged and answers identical in both.

Each conversation is a human-written opening prompt (``--prompts``, a ``*.prompts.jsonl`` file, never
Spec-Bench) and two follow-ups, each turn the whole conversation so far through the chat template, greedy. Both
ways run every conversation in turn (the order rotated), each from empty caches. The empty-cache way resets the
draft models (``Model.reset``) before each request, which makes the drafter begin from an empty cache; with
``--batch`` it runs each request on a new ``BatchEngine``, so nothing is kept between turns. Turns 2 and 3 are where
the ways differ; their answers must be identical (the drafts are the same either way).

    python benchmarks/experiments/chat_turns.py --target …/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf --drafter auto \\
        --prompts $SPECWISE_PROMPTS/oasst_en.prompts.jsonl --conversations 10 --out chat_turns.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path


class Result:
    """A batch engine's answer as ``Engine.generate`` gives it: text, token ids, statistics."""

    def __init__(self, text: str, token_ids: list[int], stats) -> None:
        self.text, self.token_ids, self.stats = text, token_ids, stats


FOLLOW_UPS = ("Can you give a concrete example?", "Summarize your answers so far in three bullet points.")


def _paired(ratios: dict[int, list[float]]) -> dict:
    """Geometric mean over conversations (each the geometric mean over its turns) and a 95% t interval (the bench's
    ``geometric_interval``)."""
    from specwise.lab.bench.paired import geometric_interval

    per_conversation = [math.exp(sum(math.log(r) for r in v) / len(v)) for v in ratios.values()]
    g = geometric_interval(per_conversation)
    interval = None if g["low"] is None else [g["low"], g["high"]]
    return {"ratio": g["geomean"], "interval": interval, "conversations": g["n"]}


def main(argv: list[str] | None = None) -> None:
    from specwise.batch import BatchEngine, Request
    from specwise.drafters.model import ModelDrafter
    from specwise.lab.bench.runner import emit_json, script_header
    from specwise.models.threads import set_num_threads
    from specwise.runtime import build_runtime, encode_chat
    from specwise.sampling import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", default="auto")
    ap.add_argument("--prompts", required=True, help="a *.prompts.jsonl file of human-written prompts")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--skip", type=int, default=37, help="every skip-th prompt of the file")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", action="store_true", help="through the batch engine: its prompt caching against none")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    try:  # the prompts are read before the models load
        lines = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
        openings = [str(r["prompt"]) for r in lines[:: args.skip][: args.conversations]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"error: --prompts {args.prompts}: {err!r}: give a *.prompts.jsonl file") from None
    set_num_threads(args.threads)
    runtime = build_runtime(args.target, args.drafter, "auto", "cpu")
    engine, tokenizer = runtime.engine, runtime.tokenizer
    drafts = [d.model for d in engine.drafters if isinstance(d, ModelDrafter)]
    if not drafts:
        raise SystemExit(f"error: {runtime.drafter_spec} has no draft model: give model:FILE or auto with a sibling")
    warm = encode_chat(tokenizer, [{"role": "user", "content": openings[0]}])  # one-time costs out of the runs
    engine.generate(warm, SamplingParams(), 8)
    if args.batch:
        BatchEngine(engine, max_batch=2).run_all([Request(warm, SamplingParams(), 8)])
    ways = ("kept", "fresh")
    runs, answers = [], {}
    for c, opening in enumerate(openings):
        for way in ways if c % 2 == 0 else tuple(reversed(ways)):
            for model in (engine.target, *drafts):  # every conversation from empty caches
                model.reset()
            batch = BatchEngine(engine, max_batch=2) if args.batch else None
            messages = [{"role": "user", "content": opening}]
            for turn in range(1 + len(FOLLOW_UPS)):
                ids = encode_chat(tokenizer, messages)
                if way == "fresh":
                    if batch is not None:  # a new batch engine: no slot holds this conversation's caches
                        batch = BatchEngine(engine, max_batch=2)
                    else:  # the draft models' caches emptied: each drafter begins from an empty one
                        for model in drafts:
                            model.reset()
                t0 = time.perf_counter()
                if batch is None:
                    result = engine.generate(ids, SamplingParams(), args.max_new_tokens)
                else:
                    events = batch.run_all([Request(ids, SamplingParams(), args.max_new_tokens)])[0]
                    token_ids = [t for e in events for t in e.token_ids]
                    result = Result(tokenizer.decode(token_ids, skip_special_tokens=True), token_ids, events[-1].stats)
                seconds = time.perf_counter() - t0
                s = result.stats
                runs.append(
                    {
                        "conversation": c,
                        "way": way,
                        "turn": turn + 1,
                        "prompt_tokens": len(ids),
                        "new_tokens": s.new_tokens,
                        "seconds": seconds,
                        "tokens_per_second": s.new_tokens / seconds,
                        "draft_seconds": s.draft_seconds,
                        "verify_seconds": s.verify_seconds,
                        "prefill_seconds": s.prefill_seconds,
                        "cached_tokens": s.cached_tokens,
                        "by_drafter": s.by_drafter,
                    }
                )
                answers.setdefault((c, turn), {})[way] = result.token_ids
                messages += [{"role": "assistant", "content": result.text}]
                if turn < len(FOLLOW_UPS):
                    messages += [{"role": "user", "content": FOLLOW_UPS[turn]}]
    by = {(r["conversation"], r["way"], r["turn"]): r for r in runs}
    summary = {}
    for turns, label in (((2, 3), "turns 2-3"), ((1,), "turn 1")):
        ratios: dict[int, list[float]] = {}
        for c in range(len(openings)):
            for t in turns:
                kept, fresh = by.get((c, "kept", t)), by.get((c, "fresh", t))
                if kept and fresh:
                    ratios.setdefault(c, []).append(fresh["seconds"] / kept["seconds"])
        summary[label] = _paired(ratios)
    identical = all(len(set(map(tuple, v.values()))) == 1 for v in answers.values())
    out = {
        **script_header(argv),
        "target": args.target,
        "drafter": runtime.drafter_spec,
        "through": "batch engine" if args.batch else "engine",
        "follow_ups": list(FOLLOW_UPS),
        "speed_kept_over_fresh": summary,
        "answers_identical": identical,
        "runs": runs,
    }
    emit_json(out, args.out)
    for label, s in summary.items():
        print(f"{label}: kept cache {s['ratio']:.3f}x the speed of an empty one, interval {s['interval']}")
    print(f"answers identical: {identical}")


if __name__ == "__main__":
    main()
