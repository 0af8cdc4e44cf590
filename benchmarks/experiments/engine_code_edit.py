"""The code-edit workload in the library, without a server: `Engine` against `BatchEngine` on the same requests.

Question: is the server's shortfall on code edits the engine's? Answer: no: in the library both verify the first
edit at about the same speed (median 49 and 51 decode tokens/s, passes of 61 and 73 ms) where the server's passes
took 130 ms (benchmarks/results/zen4_engine_code_edit.json; docs/FIGURES.md). batch_solo_overhead.py asks the same
of short questions.

Each of the first ``--limit`` code edits of ``specwise bench --workload code-edit`` (chat, greedy, the original as
``prediction`` unless ``--no-prediction``) runs through the runtime's ``Engine`` and through a ``BatchEngine`` (the
server's loop) in one process, ``--rounds`` times, alternating; per run: tokens, target passes, the seconds of
verification passes and of drafting, decode tokens/s (tokens over the seconds after the prompt's pass).

    python benchmarks/experiments/engine_code_edit.py \\
        --target ~/.cache/specwise/gguf/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf --drafter auto --limit 2 --rounds 2 \\
        --out results.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from specwise.batch import BatchEngine, Request
from specwise.lab.bench.runner import emit_json, script_header
from specwise.lab.bench.workloads import workload_requests
from specwise.runtime import build_runtime
from specwise.sampling import SamplingParams


def _run(runtime, batch: BatchEngine | None, prompt: list[int], prediction: list[int] | None, budget: int) -> dict:
    params = SamplingParams(temperature=0.0)
    t0 = time.perf_counter()
    if batch is None:
        result = runtime.engine.generate(prompt, params, max_new_tokens=budget, prediction=prediction)
        stats, tokens = result.stats, result.token_ids
    else:
        events = batch.run_all([Request(prompt, params, budget, prediction=prediction)])[0]
        stats, tokens = events[-1].stats, [t for e in events for t in e.token_ids]
    seconds = time.perf_counter() - t0
    decode = seconds - stats.prefill_seconds
    return {
        "tokens": len(tokens),
        "token_ids": tokens,
        "target_passes": stats.target_passes,
        "verify_seconds": stats.verify_seconds,
        "draft_seconds": stats.draft_seconds,
        "decode_tokens_per_second": len(tokens) / decode if decode > 0 else None,
        "by_drafter": stats.by_drafter,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", default="auto")
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=1536)
    parser.add_argument("--no-prediction", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    items = workload_requests("code-edit", args.limit)
    runtime = build_runtime(args.target, drafter=args.drafter, gamma="auto")
    tok = runtime.tokenizer
    batch = BatchEngine(runtime.engine, max_batch=16)
    runs = []
    for round_ in range(args.rounds):
        for item in items:
            text = tok.apply_chat_template(item.messages, tokenize=False, add_generation_prompt=True)
            prompt = tok(text, add_special_tokens=False)["input_ids"]
            prediction = None if args.no_prediction else tok(item.prediction, add_special_tokens=False)["input_ids"]
            for loop in ("engine", "batch"):
                run = _run(runtime, batch if loop == "batch" else None, prompt, prediction, args.max_new_tokens)
                runs.append({"item": item.id, "round": round_, "loop": loop, **run})
                print(item.id, loop, run["tokens"], run["target_passes"], round(run["verify_seconds"], 2), flush=True)
    summary = {
        loop: {
            "decode_tokens_per_second_median": statistics.median(
                r["decode_tokens_per_second"] for r in runs if r["loop"] == loop
            ),
            "seconds_per_pass_median": statistics.median(
                r["verify_seconds"] / r["target_passes"] for r in runs if r["loop"] == loop
            ),
        }
        for loop in ("engine", "batch")
    }
    emit_json({**script_header(argv), "drafter": runtime.drafter_spec, "summary": summary, "runs": runs}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
