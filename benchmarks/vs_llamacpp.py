"""specwise against llama.cpp on the same GGUF file: greedy decoding of Spec-Bench questions, side by side.

For every question the prompt is encoded once (the model's chat template, specwise's tokenizer) and the same
token ids go to every method, which then decodes ``--new-tokens`` tokens greedily with EOS ignored. The methods run
back to back in an order rotated from one question (and round) to the next:

- ``llama.cpp``: ``llama-completion`` (llama.cpp's command-line program, ``-t threads``, greedy, EOS ignored) on the
  chat-formatted prompt text; decode tokens/s is its own report's ``eval time`` (llama-server decodes the same
  prompts about 4 ms per token slower on the default model, so the program is the stronger peer); its token ids,
  for the agreement figures, come from ``llama-server`` on the same prompt ids after the timed rounds;
- ``specwise q8`` and ``specwise exact``: plain decoding (``--drafter none``) on the quantized native model;
- ``specwise default``: the default drafter (``auto``) with gamma auto, q8.

specwise's decode tokens/s is new tokens / (total - prefill) seconds, as llama.cpp counts it. Ratios are paired:
each run of a method is divided by the llama.cpp run next to it (same question, same round), and summarised by
geometric means with 95% Student-t intervals. Agreement: every method's tokens are compared with ``specwise exact``
(the dequantized float32 model's numbers): the share of identical answers and the tokens before the first
difference. ``--depth N`` adds decoding after N tokens of context (``llama-bench -d N`` for llama.cpp).

    python benchmarks/vs_llamacpp.py --per-category 2 --rounds 3 --out benchmarks/results/vs_llamacpp_default.json
    python benchmarks/vs_llamacpp.py --target ~/.cache/specwise/gguf/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf \\
        --methods llama.cpp q8 exact --per-category 1 --rounds 2 --out benchmarks/results/vs_llamacpp_qwen15.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from specwise.bench.llamacpp import LlamaServer, completion_decode, find_llama_cpp, llama_bench
from specwise.bench.prompts import load_questions, select_prompts
from specwise.bench.runner import machine_info
from specwise.drafters import make_drafter
from specwise.engine import Engine
from specwise.models import load_model
from specwise.models.loader import gguf_source
from specwise.runtime import encode_prompt
from specwise.sampling import SamplingParams

QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"
METHODS = ("llama.cpp", "q8", "exact", "default")
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 15: 2.13, 20: 2.09}


def t95(dof: int) -> float:
    if dof <= 0:
        return float("nan")
    keys = sorted(k for k in T95 if k <= dof)
    return T95[keys[-1]] if dof < 30 else 1.96


def geometric_interval(ratios: list[float]) -> dict:
    logs = [math.log(r) for r in ratios if r > 0]
    if not logs:
        return {"n": 0}
    mean = statistics.fmean(logs)
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("nan")
    return {"n": len(logs), "geomean": math.exp(mean), "low": math.exp(mean - half), "high": math.exp(mean + half)}


def first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


class Specwise:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def run(self, ids: list[int], n: int, text: str = "") -> dict:
        result = self.engine.generate(ids, SamplingParams(temperature=0.0), max_new_tokens=n, eos_token_ids=[])
        s = result.stats
        decode = s.total_seconds - s.prefill_seconds
        return {
            "token_ids": result.token_ids,
            "decode_tokens_per_s": s.new_tokens / decode if decode > 0 else float("nan"),
            "seconds": s.total_seconds,
            "tau": s.mean_accepted_length,
        }


class LlamaCpp:
    def __init__(self, gguf: Path, threads: int) -> None:
        self.gguf, self.threads = gguf, threads

    def run(self, ids: list[int], n: int, text: str) -> dict:
        out = completion_decode(self.gguf, text, n, self.threads)
        return {"token_ids": None, "decode_tokens_per_s": out["decode_tokens_per_s"]}


def depth_run(model, n_new: int, depth: int) -> float:
    """specwise plain decoding of n_new tokens after depth tokens of context (decode tokens/s)."""
    ids = torch.randint(100, model.vocab_size - 100, (depth,), generator=torch.Generator().manual_seed(depth))
    engine = Engine(model, None, gamma=0)
    result = engine.generate(ids.tolist(), SamplingParams(temperature=0.0), max_new_tokens=n_new, eos_token_ids=[])
    s = result.stats
    return s.new_tokens / (s.total_seconds - s.prefill_seconds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="default")
    ap.add_argument("--questions", default=str(QUESTIONS))
    ap.add_argument("--categories", nargs="*", default=None)
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depth", type=int, default=0, help="also decode 64 tokens after this many tokens of context")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if find_llama_cpp() is None and "llama.cpp" in args.methods:
        raise SystemExit("llama.cpp binaries not found: build them (see specwise/bench/llamacpp.py)")
    gguf = gguf_source(args.target)
    prompts = select_prompts(load_questions(args.questions), args.categories, args.per_category)
    q8 = load_model(args.target, precision="q8")
    runners: dict[str, object] = {}
    if "q8" in args.methods:
        runners["q8"] = Specwise(Engine(q8.model, None, gamma=0))
    if "default" in args.methods:
        drafter = make_drafter("auto", q8)
        runners["default"] = Specwise(Engine(q8.model, drafter, gamma="auto"))
    exact = None
    if "exact" in args.methods:
        exact = load_model(args.target, precision="exact")
        runners["exact"] = Specwise(Engine(exact.model, None, gamma=0))
    if "llama.cpp" in args.methods:
        runners["llama.cpp"] = LlamaCpp(gguf, args.threads)
    order = [m for m in args.methods if m in runners]
    records = []
    server = None

    def chat_text(prompt) -> str:
        messages = [{"role": "user", "content": prompt.text}]
        return q8.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    try:
        warm = encode_prompt(q8.tokenizer, prompts[0].text, chat=True)
        for method in order:
            runners[method].run(warm, 16, chat_text(prompts[0]))
        job = 0
        for rnd in range(args.rounds):
            for prompt in prompts:
                ids = encode_prompt(q8.tokenizer, prompt.text, chat=True)
                turn = order[job % len(order) :] + order[: job % len(order)]
                job += 1
                for method in turn:
                    out = runners[method].run(ids, args.new_tokens, chat_text(prompt))
                    where = {"method": method, "round": rnd, "id": prompt.id, "category": prompt.category}
                    records.append({**where, **out})
                    print(
                        f"round {rnd} {prompt.category:15s} {prompt.id:>4s} {method:9s} "
                        f"{out['decode_tokens_per_s']:7.1f} tokens/s",
                        file=sys.stderr,
                    )
        bench = {}
        if "llama.cpp" in order:
            server = LlamaServer(gguf, threads=args.threads, ctx_size=4096).start()
            for prompt in prompts:  # token ids for the agreement figures (untimed)
                ids = encode_prompt(q8.tokenizer, prompt.text, chat=True)
                tokens = server.greedy(ids, args.new_tokens)["token_ids"]
                for r in records:
                    if r["method"] == "llama.cpp" and r["id"] == prompt.id:
                        r["token_ids"] = tokens
            server.stop()
            server = None
            bench["tg"] = llama_bench(gguf, n_gen=args.new_tokens, threads=args.threads, repetitions=3)
            if args.depth:
                bench["depth"] = llama_bench(gguf, n_gen=64, threads=args.threads, depth=args.depth, repetitions=3)
        depth = {}
        if args.depth:
            depth["q8"] = [depth_run(q8.model, 64, args.depth) for _ in range(3)]
            if exact is not None:
                depth["exact"] = [depth_run(exact.model, 64, args.depth) for _ in range(3)]
    finally:
        if server is not None:
            server.stop()
    summary = summarize(records, order)
    results = {
        "command": " ".join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "target": str(gguf),
        "machine": machine_info("cpu"),
        "threads": args.threads,
        "new_tokens": args.new_tokens,
        "llama_bench": bench,
        "depth": {"tokens": args.depth, "specwise_decode_tokens_per_s": depth} if args.depth else None,
        "summary": summary,
        "records": records,
    }
    text = json.dumps(results, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps(summary, indent=1))
    return 0


def summarize(records: list[dict], order: list[str]) -> dict:
    by = {(r["method"], r["round"], r["id"]): r for r in records}
    keys = sorted({(r["round"], r["id"], r["category"]) for r in records})
    categories = list(dict.fromkeys(r["category"] for r in records))
    out: dict = {"methods": {}, "agreement": {}, "exactness": {}}
    for method in order:
        tps = [r["decode_tokens_per_s"] for r in records if r["method"] == method]
        entry = {"median_decode_tokens_per_s": statistics.median(tps)}
        if "llama.cpp" in order and method != "llama.cpp":
            ratios = [
                by[(method, rnd, qid)]["decode_tokens_per_s"] / by[("llama.cpp", rnd, qid)]["decode_tokens_per_s"]
                for rnd, qid, _ in keys
            ]
            entry["vs_llama_cpp"] = geometric_interval(ratios)
            entry["vs_llama_cpp_by_category"] = {
                c: geometric_interval(
                    [
                        by[(method, rnd, qid)]["decode_tokens_per_s"]
                        / by[("llama.cpp", rnd, qid)]["decode_tokens_per_s"]
                        for rnd, qid, cat in keys
                        if cat == c
                    ]
                )
                for c in categories
            }
        if "q8" in order and method == "default":
            ratios = [
                by[(method, rnd, qid)]["decode_tokens_per_s"] / by[("q8", rnd, qid)]["decode_tokens_per_s"]
                for rnd, qid, _ in keys
            ]
            entry["vs_specwise_q8_plain"] = geometric_interval(ratios)
        out["methods"][method] = entry
    if "exact" in order:
        first_round = [(rnd, qid) for rnd, qid, _ in keys if rnd == 0]
        for method in order:
            if method == "exact":
                continue
            same, prefix = 0, []
            for rnd, qid in first_round:
                a, b = by[(method, rnd, qid)]["token_ids"], by[("exact", rnd, qid)]["token_ids"]
                same += a == b
                prefix.append(first_difference(a, b))
            out["agreement"][method] = {
                "answers": len(first_round),
                "identical_share": same / len(first_round),
                "median_tokens_before_first_difference": statistics.median(prefix),
                "mean_tokens_before_first_difference": statistics.fmean(prefix),
            }
    if "default" in order and "q8" in order:
        same = sum(by[("default", rnd, qid)]["token_ids"] == by[("q8", rnd, qid)]["token_ids"] for rnd, qid, _ in keys)
        out["exactness"]["default_equals_q8_plain"] = f"{same}/{len(keys)}"
    return out


if __name__ == "__main__":
    sys.exit(main())
