"""Where a pass of the quantized native model goes: weight products, output layer, attention and the rest.

For each precision, passes over k tokens after a given context are timed as a whole (median of interleaved rounds),
then the same weight products alone (every layer's q_gemm calls on random rows, in the model's order) and the
output layer alone; attention and the rest (norms, rotary, cache writes, activation, Python) is the difference.

    python benchmarks/pass_parts.py --out benchmarks/results/pass_parts.json
    python benchmarks/pass_parts.py --target /path/model.gguf --contexts 64 2048 --ks 1 2 3 5 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from specwise.lab.bench.runner import machine_info
from specwise.models.kernels.quant import q_gemm
from specwise.models.loader import default_gguf_path
from specwise.models.quantized import QuantizedModel
from specwise.models.threads import get_num_threads


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def products(model: QuantizedModel, k: int, mode: str) -> callable:
    rng = np.random.default_rng(0)
    h = rng.standard_normal((k, model.hidden), dtype=np.float32)
    a = rng.standard_normal((k, model.n_heads * model.head_dim), dtype=np.float32)
    m = rng.standard_normal((k, model.intermediate), dtype=np.float32)

    def run():
        for q, kk, v, o, gate, up, down in model.layers:
            q_gemm([q, kk, v], h, mode=mode)
            q_gemm(o, a, mode=mode)
            q_gemm([gate, up], h, mode=mode)
            q_gemm(down, m, mode=mode)

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="a GGUF file (default: the embedded model)")
    ap.add_argument("--precisions", nargs="+", default=["q8", "exact"])
    ap.add_argument("--contexts", nargs="+", type=int, default=[64, 2048])
    ap.add_argument("--ks", nargs="+", type=int, default=[1, 2, 3, 4, 5, 6, 8])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    path = args.target or str(default_gguf_path())
    results = {
        "command": " ".join(["python", *sys.argv]),
        "target": path,
        "machine": machine_info("cpu"),
        "threads": get_num_threads(),
        "runs": [],
    }
    for precision in args.precisions:
        model = QuantizedModel(path, precision=precision, capacity=max(args.contexts) + 64)
        results["weight_bytes"] = model.weight_bytes
        for context in args.contexts:
            ids = np.random.default_rng(0).integers(0, model.vocab_size, context + max(args.ks))
            model.reset()
            model.forward(ids[:context], num_logits=0)
            samples: dict[int, list[float]] = {k: [] for k in args.ks}
            for _ in range(args.rounds):  # interleaved: a disturbance hits every k alike
                for k in args.ks:

                    def one(k=k, model=model, context=context, ids=ids):
                        model.rollback(context)
                        model.forward(ids[context : context + k])

                    one()
                    samples[k].append(timed(one, args.repeats))
            full = {k: statistics.median(v) for k, v in samples.items()}
            row = {"precision": precision, "context": context, "forward_s": full, "c": {}}
            row["c"] = {k: full[k] / full[args.ks[0]] for k in args.ks}
            if context == min(args.contexts):
                parts = {}
                for k in args.ks:
                    prod = products(model, k, precision)
                    prod()
                    h = np.random.default_rng(0).standard_normal((1, model.hidden), dtype=np.float32)
                    head = timed(
                        lambda h=h, model=model, mode=precision: q_gemm(model.lm_head, h, mode=mode),
                        args.repeats * args.rounds,
                    )
                    p = timed(prod, args.repeats * args.rounds)
                    parts[k] = {"products_s": p, "output_layer_s": head, "attention_and_rest_s": full[k] - p - head}
                row["parts"] = parts
            results["runs"].append(row)
            print(
                f"{precision:5s} ctx {context:5d}: "
                + "  ".join(f"k={k} {full[k] * 1e3:.2f} ms (c {row['c'][k]:.2f})" for k in args.ks),
                file=sys.stderr,
            )
            for k, part in row.get("parts", {}).items():
                print(
                    f"      k={k}: products {part['products_s'] * 1e3:.2f} ms, output layer "
                    f"{part['output_layer_s'] * 1e3:.2f} ms, "
                    f"attention and rest {part['attention_and_rest_s'] * 1e3:.2f} ms",
                    file=sys.stderr,
                )
    text = json.dumps(results, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
