"""Per-part times of a quantized pass from the kernel's own timings (``specwise_qllama_timings``): weight products,
attention, norms/rotary/SiLU inside the layers, and everything outside them (output layer, Python).

    python benchmarks/kernel_parts.py --out benchmarks/results/kernel_parts_default.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time

import numpy as np

from specwise.lab.bench.runner import machine_info
from specwise.models.kernels import native_library
from specwise.models.loader import default_gguf_path
from specwise.models.quantized import QuantizedModel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None)
    ap.add_argument("--precision", default="q8")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--ks", nargs="+", type=int, default=[1, 3, 5, 8])
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lib = native_library()
    model = QuantizedModel(args.target or default_gguf_path(), precision=args.precision)
    ids = np.random.default_rng(0).integers(0, model.vocab_size, args.context + max(args.ks))
    model.forward(ids[: args.context], num_logits=0)
    rows = {}
    for k in args.ks:
        for _ in range(3):
            model.rollback(args.context)
            model.forward(ids[args.context : args.context + k])
        parts = (ctypes.c_double * 3)()
        lib.specwise_qllama_timings(1, None)
        times = []
        for _ in range(args.passes):
            model.rollback(args.context)
            t0 = time.perf_counter()
            model.forward(ids[args.context : args.context + k])
            times.append(time.perf_counter() - t0)
        lib.specwise_qllama_timings(0, parts)
        n, mean = args.passes, sum(times) / args.passes
        rows[k] = {
            "pass_median_ms": statistics.median(times) * 1e3,
            "products_ms": parts[0] / n * 1e3,
            "attention_ms": parts[1] / n * 1e3,
            "norms_rotary_silu_ms": parts[2] / n * 1e3,
            "outside_layers_ms": (mean - sum(parts) / n) * 1e3,
        }
        print(k, {key: round(v, 2) for key, v in rows[k].items()}, file=sys.stderr)
    base = rows[args.ks[0]]["pass_median_ms"]
    for r in rows.values():
        r["c"] = r["pass_median_ms"] / base
    result = {"command": " ".join(["python", *sys.argv]), "machine": machine_info("cpu"), "rows": rows}
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
