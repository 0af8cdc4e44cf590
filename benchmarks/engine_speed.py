"""Plain decoding speed: the native engine against the Hugging Face adapter and Hugging Face `generate`.

Runs interleaved on the same prompts (the first question of each Spec-Bench category by default), greedy, a fixed
number of new tokens (EOS ignored so that every method produces the same length), and also the ngram drafter on
the native engine. Writes JSON and prints medians and ratios.

    python benchmarks/engine_speed.py --questions ../shared/data/spec_bench/question.jsonl \
        --per-category 1 --max-new-tokens 128 --out benchmarks/results/engine_speed.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from specwise.drafters import NoDrafter, make_drafter, parse_tree
from specwise.engine import Engine
from specwise.models import HFModel, load_model
from specwise.runtime import encode_prompt
from specwise.sampling import SamplingParams


def load_questions(path: str, per_category: int, categories: list[str] | None) -> list[dict]:
    chosen: dict[str, list[dict]] = {}
    with open(path) as f:
        for line in f:
            q = json.loads(line)
            cat = q["category"]
            if categories and cat not in categories:
                continue
            if len(chosen.setdefault(cat, [])) < per_category:
                chosen[cat].append(q)
    return [q for qs in chosen.values() for q in qs]


def run_engine(engine: Engine, ids: list[int], n: int, params: SamplingParams) -> tuple[list[int], float, dict]:
    t0 = time.perf_counter()
    result = engine.generate(ids, params, max_new_tokens=n, eos_token_ids=[])
    return result.token_ids, time.perf_counter() - t0, result.stats.to_dict()


def run_hf_generate(hf_model, ids: list[int], n: int) -> tuple[list[int], float, dict]:
    inputs = torch.tensor([ids], device=hf_model.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf_model.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist(), time.perf_counter() - t0, {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--categories", nargs="*", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", nargs="+", default=["4"], help="gammas for the ngram drafter: integers and/or auto")
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face adapter and generate")
    ap.add_argument("--drafter", nargs="+", default=["ngram"], help="drafter specs, e.g. ngram ngram:3:2 head")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (outputs compared with plain)")
    ap.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="sampling: answers per question, each with its own seed shared by every method (sampled texts differ "
        "between methods, so more answers per cell average that out); ignored when greedy",
    )
    ap.add_argument(
        "--pairs",
        nargs="+",
        default=None,
        metavar="SPEC@GAMMA[#TREE]",
        help="drafter@gamma pairs instead of the product; #2,1 sets the head's draft tree (--tree), #none chains",
    )
    ap.add_argument(
        "--repeats", type=int, default=1, help="runs of every method per question (rotating order); the fastest is kept"
    )
    ap.add_argument(
        "--keep-engines",
        action="store_true",
        help="one engine per method for the whole run, as a server keeps one: the adaptive schedule carries its "
        "measured times and acceptance from request to request (gamma 'auto-cold' still starts every run afresh)",
    )
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default: cpu)")
    ap.add_argument("--out", default="benchmarks/results/engine_speed.json")
    args = ap.parse_args()

    loaded = load_model("default", device=args.device)  # the native model (the default for the Llama family)
    native, tok, hf_module = loaded.model, loaded.tokenizer, loaded.hf_model
    greedy = args.temperature == 0
    if not greedy:
        args.no_hf = True  # the Hugging Face baselines here are greedy only
    n = args.max_new_tokens
    seed = {"value": 0}  # per question: every method samples with the same seed

    def params() -> SamplingParams:
        return SamplingParams(temperature=args.temperature, seed=None if greedy else seed["value"])

    methods = {"native_plain": lambda ids: run_engine(Engine(native, NoDrafter()), ids, n, params())}
    if not args.no_hf:
        methods["hf_adapter_plain"] = lambda ids: run_engine(Engine(HFModel(hf_module), NoDrafter()), ids, n, params())
        methods["hf_generate"] = lambda ids: run_hf_generate(hf_module, ids, n)

    def parse_pair(text: str) -> tuple[str, str, str | None]:  # SPEC@GAMMA or SPEC@GAMMA#TREE
        body, _, tree = text.partition("#")
        spec, gamma = body.rsplit("@", 1)
        return spec, gamma, tree or None

    pairs = [parse_pair(p) for p in args.pairs] if args.pairs else []
    pairs = pairs or [(spec, g, None) for spec in args.drafter for g in args.gamma]
    drafters = {
        (spec, tree): make_drafter(spec, loaded, device=args.device, tree=None if tree is None else parse_tree(tree))
        for spec, tree in dict.fromkeys((spec, tree) for spec, _, tree in pairs)
    }
    kept: dict[str, Engine] = {}

    def engine_for(name: str, drafter, gamma) -> Engine:
        if not args.keep_engines or gamma == "auto-cold":
            return Engine(native, drafter, gamma="auto" if gamma == "auto-cold" else gamma)
        if name not in kept:
            kept[name] = Engine(native, drafter, gamma=gamma)
        return kept[name]

    for spec, g, tree in pairs:
        gamma = g if g in ("auto", "auto-cold") else int(g)
        name = f"native_{spec.replace(':', '_')}_g{g}" + ("" if tree is None else f"_tree{tree.replace(',', '-')}")
        methods[name] = lambda ids, gamma=gamma, drafter=drafters[spec, tree], name=name: run_engine(
            engine_for(name, drafter, gamma), ids, n, params()
        )
    questions = load_questions(args.questions, args.per_category, args.categories)
    warm = encode_prompt(tok, "Hello!", chat=True)
    for fn in methods.values():  # warm-up
        fn(warm)
    rows = []
    names = list(methods)
    seeds = 1 if greedy else max(1, args.seeds)
    jobs = [(q, 1000 + i * seeds + s) for i, q in enumerate(questions) for s in range(seeds)]
    for i, (q, job_seed) in enumerate(jobs):
        ids = encode_prompt(tok, q["turns"][0], chat=True)
        seed["value"] = job_seed
        outputs, best, all_seconds = {}, {}, {name: [] for name in names}
        for rep in range(args.repeats):
            shift = (i + rep) % len(names)
            order = names[shift:] + names[:shift]  # rotate to cancel drift
            for name in order:
                tokens, seconds, stats = methods[name](ids)
                all_seconds[name].append(seconds)
                if greedy and name in outputs and tokens != outputs[name]:
                    raise RuntimeError(f"{name}: greedy output changed between repeats")
                outputs.setdefault(name, tokens)
                if name not in best or seconds < best[name][1]:
                    best[name] = (tokens, seconds, stats)
        for name in order:
            tokens, seconds, stats = best[name]
            rows.append(
                {
                    "question_id": q["question_id"],
                    "seed": None if greedy else job_seed,
                    "category": q["category"],
                    "method": name,
                    "prompt_tokens": len(ids),
                    "new_tokens": len(tokens),
                    "seconds": seconds,  # the fastest of the repeats (noise on a shared machine only adds time)
                    "seconds_all_repeats": all_seconds[name],
                    "tokens_per_second": len(tokens) / seconds,
                    "stats": stats,
                }
            )
        same = {name: not greedy or outputs[name] == outputs["native_plain"] for name in names}
        for r in rows[-len(names) :]:
            r["equals_native_plain"] = same[r["method"]]
        speeds = {r["method"]: r["tokens_per_second"] for r in rows[-len(names) :]}
        print(
            f"[{i + 1}/{len(jobs)}] {q['category']:>16}: "
            + "  ".join(f"{n} {speeds[n]:.1f}" for n in names)
            + ("" if all(same.values()) else f"  OUTPUT DIFFERS: {same}"),
            file=sys.stderr,
        )

    def med(name: str) -> float:
        return statistics.median(r["tokens_per_second"] for r in rows if r["method"] == name)

    def tau(name: str) -> float | None:
        stats = [r["stats"] for r in rows if r["method"] == name and r["stats"].get("target_passes")]
        passes = sum(st["target_passes"] for st in stats)
        return sum(st["new_tokens"] for st in stats) / passes if passes else None

    summary = {name: {"median_tokens_per_second": med(name), "tau": tau(name)} for name in names}
    for name in names:
        if "hf_generate" in names:
            summary[name]["ratio_to_hf_generate"] = med(name) / med("hf_generate")
        summary[name]["ratio_to_native_plain"] = med(name) / med("native_plain")
    by_cat = {}
    for cat in dict.fromkeys(r["category"] for r in rows):
        # tokens per second over the category's questions together (total tokens / total seconds)
        per = {}
        for n in names:
            mine = [r for r in rows if r["method"] == n and r["category"] == cat]
            per[n] = sum(r["new_tokens"] for r in mine) / sum(r["seconds"] for r in mine)
        by_cat[cat] = {
            "tokens_per_second": per,
            "speedup_over_native_plain": {
                n: per[n] / per["native_plain"] for n in names if n.startswith("native_") and n != "native_plain"
            },
        }
    for name in names:
        if name.startswith("native_") and name != "native_plain":
            ups = [v["speedup_over_native_plain"][name] for v in by_cat.values()]
            summary[name]["mean_category_speedup"] = statistics.mean(ups)
            summary[name]["lowest_category_speedup"] = min(ups)
    result = {
        "command": "python " + " ".join(sys.argv),
        "machine": {
            "platform": platform.platform(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "device": args.device,
            "gpu": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None,
        },
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "temperature": args.temperature,
        "seeds_per_question": seeds,
        "eos_ignored": True,
        "engines": "kept per method across runs" if args.keep_engines else "a new engine per run",
        "all_outputs_equal_native_plain": all(r["equals_native_plain"] for r in rows),
        "summary": summary,
        "by_category": by_cat,
        "runs": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({"summary": summary, "all_outputs_equal": result["all_outputs_equal_native_plain"]}, indent=2))
    for cat, v in by_cat.items():
        print(
            f"{cat:>16}: " + "  ".join(f"{n}/native plain = {r:.2f}" for n, r in v["speedup_over_native_plain"].items())
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
