"""In-process A/B of the decoder layers between builds of the native library: one call of the layer kernel
(``specwise_qllama_rows``: products, attention, norms) over k rows after a context of C tokens, the builds timed
alternately in one process, and their outputs compared bit for bit. Where kernel_ab.py times the weight products
alone, this one sees attention over the cache grow with the context. Both builds must take the layer kernel's
arguments as this checkout passes them (the structs of specwise.h).

    git worktree add /tmp/base <commit> && (cd /tmp/base && python setup.py build_ext --inplace)
    python benchmarks/layers_ab.py --libs /tmp/base/specwise/models/kernels/_native*.so \\
        specwise/models/kernels/_native*.so --out benchmarks/results/layers_ab.json
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time

import torch

from specwise.bench.runner import emit_json, machine_info
from specwise.models.kernels import quant
from specwise.models.loader import default_gguf_path
from specwise.models.quantized import QuantizedModel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libs", nargs=2, required=True, help="two library builds: the baseline, then the other")
    ap.add_argument("--target", default=None, help="GGUF file (default: the embedded model)")
    ap.add_argument("--contexts", nargs="+", type=int, default=[64, 300, 1000])
    ap.add_argument("--ks", nargs="+", type=int, default=[1, 3, 5])
    ap.add_argument("--reps", type=int, default=16)
    ap.add_argument("--kv-cache", default="float32", choices=["float32", "float16"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    libs = []
    for path in args.libs:
        lib = ctypes.CDLL(path)
        quant.declare(lib)
        libs.append(lib)
    model = QuantizedModel(args.target or default_gguf_path(), precision="q8", kv_cache=args.kv_cache)
    stack = model._stack
    g = torch.Generator().manual_seed(0)
    cells = []
    for ctx in args.contexts:
        model.reset()
        model.forward_batch([(model, torch.randint(0, model.vocab_size, (ctx,), generator=g))], [0])
        for k in args.ks:
            x0 = torch.randn(k, model.hidden, generator=g)
            cos, sin = model._tables(ctx + k)
            times, outs = [[], []], [None, None]
            for rep in range(args.reps):
                for i in (0, 1) if rep % 2 == 0 else (1, 0):
                    stack._lib = libs[i]
                    x = x0.clone()
                    t = time.perf_counter()
                    stack.run(x, [(model.k_cache, model.v_cache)] * k, list(range(ctx, ctx + k)), cos, sin, "q8")
                    times[i].append(time.perf_counter() - t)
                    outs[i] = x
            ratio = statistics.median(b / a for a, b in zip(*times))
            cell = {
                "context": ctx,
                "rows": k,
                "median_ms": [statistics.median(t) * 1e3 for t in times],
                "ratio_median": ratio,
                "same_bits": torch.equal(outs[0], outs[1]),
            }
            cells.append(cell)
            print(
                f"context {ctx} rows {k}: {cell['median_ms'][0]:.3f} -> {cell['median_ms'][1]:.3f} ms, "
                f"ratio {ratio:.3f}, {'same bits' if cell['same_bits'] else 'DIFFERENT'}",
                file=sys.stderr,
                flush=True,
            )
    stack._lib = model._lib
    result = {
        "command": " ".join(sys.argv),
        "machine": machine_info("cpu"),
        "threads": torch.get_num_threads(),
        "kv_cache": args.kv_cache,
        "libs": args.libs,
        "cells": cells,
    }
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
