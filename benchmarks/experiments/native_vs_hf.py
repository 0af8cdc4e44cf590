"""The float32 paths for a model directory (safetensors): the native float32 model against the Hugging Face adapter on
the same weights, plain greedy decode tokens/s, interleaved rounds.

Question: does the native float32 stack earn its place beside the quantized model (GGUF files) and the Hugging Face
reference? Answer: yes for model directories of the Llama family on CPUs: 41.1 against 29.8 decode tokens/s, 1.39×
(benchmarks/results/native_vs_hf_default.json).

    python benchmarks/experiments/native_vs_hf.py --out benchmarks/results/native_vs_hf_default.json
"""

from __future__ import annotations

import argparse
import statistics

from specwise.engine import Engine
from specwise.lab.bench.runner import emit_json, script_header
from specwise.models import load_model
from specwise.models.loader import converted_gguf_dir, default_gguf_path
from specwise.models.threads import set_num_threads
from specwise.sampling import SamplingParams


def rate(model, n: int) -> float:
    ids = list(range(100, 164))
    stats = Engine(model, None, gamma=0).generate(ids, SamplingParams(), max_new_tokens=n, eos_token_ids=[]).stats
    return stats.new_tokens / (stats.total_seconds - stats.prefill_seconds)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None, help="a model directory (default: the default model as float32)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    set_num_threads(args.threads)
    target = args.target or str(converted_gguf_dir(default_gguf_path()))
    models = {impl: load_model(target, impl=impl).model for impl in ("native", "hf")}
    rates: dict[str, list[float]] = {impl: [] for impl in models}
    for model in models.values():
        rate(model, 8)  # warm up
    for r in range(args.rounds):
        for impl in models if r % 2 == 0 else reversed(list(models)):
            rates[impl].append(rate(models[impl], args.new_tokens))
    ratios = [a / b for a, b in zip(rates["native"], rates["hf"])]
    results = {
        **script_header(argv),
        "target": target,
        "classes": {impl: type(m).__name__ for impl, m in models.items()},
        "decode_tokens_per_s": rates,
        "median": {impl: statistics.median(v) for impl, v in rates.items()},
        "native_over_hf_per_round": ratios,
        "native_over_hf_median": statistics.median(ratios),
    }
    emit_json(results, args.out)


if __name__ == "__main__":
    main()
