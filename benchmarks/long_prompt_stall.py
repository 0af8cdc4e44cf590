"""How much a long prompt stalls another client's stream: in-process continuous batching (``BatchEngine``, what the
server's worker runs), one client streaming short answers while another sends an N-token prompt.

For each length N a fresh batch first serves the streaming client alone, then the N-token prompt joins and the
client keeps streaming, one short request after another, until the prompt's first token, then alone again (its solo
rate: the mean of before and after, as a machine that others share changes speed meanwhile). Reported per length:
the client's tokens/s alone and while the prompt is read (and their ratio), its longest gap between tokens inside a
request and its longest time to first token then, the long prompt's time to first token, and the steps' times.
The long prompt is the first N tokens of a text (``--corpus``); the client's requests are short chat questions.
The JSON also holds the command, the settings and the machine (``lscpu``'s model name and
flags, the load average before and after).

    python benchmarks/long_prompt_stall.py --target qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --corpus tinyshakespeare.txt --lengths 4096 8192 --out stall.json

Goal: the streaming client keeps at least half of its solo rate and never waits more than 1 s between tokens.
``--slices fixed`` runs the earlier fixed slices instead (256 prompt tokens a step, ``max_step_seconds`` None), for
comparison (``both``: each length both ways).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prefill_lengths import corpus_tokens, lscpu  # noqa: E402

from specwise.batch import MAX_STEP_SECONDS, PREFILL_SHARE, BatchEngine, Request  # noqa: E402
from specwise.lab.bench.environment import emit_json, load_average, script_header  # noqa: E402
from specwise.models.threads import set_num_threads  # noqa: E402
from specwise.runtime import build_runtime, encode_chat  # noqa: E402
from specwise.sampling import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
QUESTIONS = [
    "In one sentence, what is a sonnet?",
    "Name three plays by Shakespeare and say in a line what each is about.",
    "Write a short rhyming couplet about the sea.",
    "What does 'wherefore' mean in 'wherefore art thou Romeo'? Answer briefly.",
]


class Stream:
    """The streaming client: short requests one after another, each token's arrival timed (a step's events arrive
    when the step returns, as the server's worker hands them over)."""

    def __init__(self, batch: BatchEngine, questions: list[list[int]], tokens: int) -> None:
        self.batch, self.questions, self.tokens = batch, questions, tokens
        self.asked = 0
        self.rid: int | None = None
        self.requests: list[dict] = []  # per request: submitted, token arrival times (one per event with tokens)

    def ask(self) -> None:
        prompt = self.questions[self.asked % len(self.questions)]
        self.asked += 1
        self.rid = self.batch.submit(Request(prompt, GREEDY, self.tokens))
        self.requests.append({"submitted": time.perf_counter(), "arrivals": [], "counts": []})

    def event(self, event, now: float, again: bool) -> None:
        current = self.requests[-1]
        if event.token_ids:
            current["arrivals"].append(now)
            current["counts"].append(len(event.token_ids))
        if event.finish_reason is not None:
            self.rid = None
            if again:
                self.ask()

    def window(self, start: float, end: float) -> dict:
        """The client's experience between ``start`` and ``end``: tokens/s, its longest gap between two tokens of
        one request, its longest time to first token (requests submitted in the window)."""
        tokens, gaps, ttfts = 0, [], []
        for request in self.requests:
            arrivals = request["arrivals"]
            for t, n in zip(arrivals, request["counts"]):
                if start <= t <= end:
                    tokens += n
            gaps += [b - a for a, b in zip(arrivals, arrivals[1:]) if start <= a and b <= end]
            if arrivals and start <= request["submitted"] <= end and arrivals[0] <= end:
                ttfts.append(arrivals[0] - request["submitted"])
        seconds = end - start
        return {
            "seconds": round(seconds, 3),
            "tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 3) if seconds > 0 else None,
            "longest_gap_s": round(max(gaps), 3) if gaps else None,
            "median_gap_s": round(statistics.median(gaps), 4) if gaps else None,
            "longest_ttft_s": round(max(ttfts), 3) if ttfts else None,
            "requests": len(ttfts),
        }


def run_length(engine, questions, long_ids: list[int], args, fixed: bool) -> dict:
    """One length: the client alone for ``--solo-requests`` requests, then beside the long prompt until its first
    token, then alone again for as many requests (its solo rate is the mean of before and after: a machine that
    others share changes speed meanwhile)."""
    options = {"max_step_seconds": None} if fixed else {"max_step_seconds": args.max_step_seconds}
    batch = BatchEngine(engine, max_batch=args.max_batch, prefill_share=args.prefill_share, **options)
    stream = Stream(batch, questions, args.stream_tokens)
    steps: list[dict] = []
    marks = {"before": time.perf_counter()}  # when each phase began
    phase = "before"
    stream.ask()
    long_rid = None
    while True:
        step = batch.step()
        now = time.perf_counter()
        steps.append(
            {"phase": phase, "seconds": round(step.seconds, 4), "prefill": step.prefill_fed, "rows": step.rows}
        )
        for rid, event in step.events:
            if rid == stream.rid:
                stream.event(event, now, again=phase == "beside")
            elif rid == long_rid and event.token_ids and phase == "beside":
                phase, marks["after"] = "after", now
                after_from = len(stream.requests)  # the request under way began beside the prompt
        if stream.rid is None:
            if phase == "before" and len(stream.requests) >= args.solo_requests:
                # the client alone is measured: the long prompt joins and the client goes on
                phase, marks["beside"] = "beside", time.perf_counter()
                long_rid = batch.submit(Request(long_ids, GREEDY, 1))
            elif phase == "after" and len(stream.requests) - after_from >= args.solo_requests:
                marks["end"] = now
                break
            stream.ask()
    before = stream.window(marks["before"], marks["beside"])
    beside = stream.window(marks["beside"], marks["after"])
    after = stream.window(marks["after"], marks["end"])
    rates = [w["tokens_per_s"] for w in (before, after) if w["tokens_per_s"]]
    solo_rate = statistics.mean(rates) if rates else None
    ratio = beside["tokens_per_s"] / solo_rate if solo_rate and beside["tokens_per_s"] else None
    longest_wait = max(x for x in (beside["longest_gap_s"], beside["longest_ttft_s"]) if x is not None)
    beside_steps = [s["seconds"] for s in steps if s["phase"] == "beside"]
    ttft = marks["after"] - marks["beside"]
    return {
        "prompt_tokens": len(long_ids),
        "slices": "fixed 256 tokens" if fixed else "by cost",
        "stream_solo_before": before,
        "stream_beside_long_prompt": beside,
        "stream_solo_after": after,
        "stream_solo_tokens_per_s": round(solo_rate, 3) if solo_rate else None,
        "rate_ratio": round(ratio, 3) if ratio else None,
        "longest_wait_s": longest_wait,
        "long_prompt_ttft_s": round(ttft, 2),
        "long_prompt_tokens_per_s": round(len(long_ids) / ttft, 1),
        "steps_beside": {
            "count": len(beside_steps),
            "max_seconds": round(max(beside_steps), 3),
            "median_seconds": round(statistics.median(beside_steps), 4),
            "prefill_rows": sum(s["prefill"] for s in steps if s["phase"] == "beside"),
        },
        "goal_met": bool(ratio and ratio >= 0.5 and longest_wait <= 1.0),
        **({"steps": steps} if args.keep_steps else {}),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="default", help="a .gguf file or a model name")
    p.add_argument("--drafter", default="auto")
    p.add_argument("--corpus", required=True, help="a text file the long prompts are cut from")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--stream-tokens", type=int, default=48, help="tokens of each streaming request's answer")
    p.add_argument("--solo-requests", type=int, default=3, help="the client's requests alone, before and after")
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--max-step-seconds", type=float, default=MAX_STEP_SECONDS)
    p.add_argument("--prefill-share", type=float, default=PREFILL_SHARE)
    p.add_argument(
        "--slices",
        choices=("cost", "fixed", "both"),
        default="cost",
        help="prompt slices by cost (the default), fixed ones of 256 tokens (as before, for comparison), or both",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--keep-steps", action="store_true", help="every step's seconds, prompt rows and rows in the JSON")
    p.add_argument("--out")
    args = p.parse_args(argv)
    header = script_header(argv)
    header["lscpu"] = lscpu()
    header["load_average_before"] = load_average()
    set_num_threads(args.threads)
    runtime = build_runtime(args.target, args.drafter, "auto")
    tokenizer = runtime.tokenizer
    questions = [encode_chat(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    ids = corpus_tokens(tokenizer, Path(args.corpus), max(args.lengths) + 64 * len(args.lengths))
    # warm up (thread pools, the kernels' first passes): a short prompt read and a short answer, not measured
    warm = ids[-256:]
    BatchEngine(runtime.engine, max_batch=2).run_all([Request(warm, GREEDY, 4), Request(questions[0], GREEDY, 16)])
    results = []
    for i, n in enumerate(args.lengths):
        long_ids = ids[64 * i : 64 * i + n]  # each length its own start: no cache of another length's prompt helps
        for fixed in {"cost": (False,), "fixed": (True,), "both": (False, True)}[args.slices]:
            result = run_length(runtime.engine, questions, long_ids, args, fixed)
            print(
                f"{n} tokens ({result['slices']}): stream {result['stream_solo_tokens_per_s']} tok/s alone, "
                f"{result['stream_beside_long_prompt']['tokens_per_s']} beside (x{result['rate_ratio']}), longest "
                f"wait {result['longest_wait_s']} s; prompt's first token after {result['long_prompt_ttft_s']} s",
                flush=True,
            )
            results.append(result)
    header["load_average_after"] = load_average()
    settings = {
        "target": args.target,
        "drafter": runtime.drafter_spec,
        "gamma": "auto",
        "threads": args.threads,
        "max_batch": args.max_batch,
        "slices": args.slices,
        "max_step_seconds": args.max_step_seconds,
        "prefill_share": args.prefill_share,
        "stream_tokens": args.stream_tokens,
        "solo_requests": args.solo_requests,
        "corpus": Path(args.corpus).name,
    }
    emit_json({**header, "settings": settings, "results": results}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
