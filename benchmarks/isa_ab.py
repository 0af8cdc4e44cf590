"""In-process A/B of two instruction paths of one build of the native library (e.g. ``avx2`` against ``avx512``): the
weight products of a decoder layer stack and its output layer, timed for each number of rows k with the paths
alternating call by call, and the products checked to be the same bits on both.

The matrices are a GGUF model's (``--target FILE``) or random blocks in the shapes and formats of a named model
(``--shapes qwen2.5-1.5b-q4_k_m``: no file needed; the formats' numbers are random, their cost is the file's).

    python benchmarks/isa_ab.py --paths avx2 avx512 --shapes qwen2.5-1.5b-q4_k_m --ks 1 4 8 16 32 --threads 1 \\
        --out benchmarks/results/isa_ab.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from specwise.lab.bench.runner import emit_json, machine_info
from specwise.models.kernels import quant
from specwise.models.threads import get_num_threads

# GGML type: (inputs per block, bytes per block, offsets of the float16 scale fields in a block)
BLOCKS = {2: (32, 18, (0,)), 3: (32, 20, (0, 2)), 8: (32, 34, (0,)), 12: (256, 144, (0, 2)), 14: (256, 210, (208,))}
Q4_K, Q6_K = 12, 14
# per layer: groups of (type, out, in) sharing one call, as the layer kernel calls them; then the output layer
SHAPES = {
    "qwen2.5-1.5b-q4_k_m": {
        "layers": 28,
        "groups": [
            [(Q4_K, 1536, 1536), (Q4_K, 256, 1536), (Q6_K, 256, 1536)],
            [(Q4_K, 1536, 1536)],
            [(Q4_K, 8960, 1536), (Q4_K, 8960, 1536)],
            [(Q6_K, 1536, 8960)],
        ],
        "output": (Q6_K, 151936, 1536),
    },
}


def random_tensor(rng: np.random.Generator, ggml_type: int, out: int, n_in: int) -> quant.QTensor:
    """Random blocks of ``ggml_type`` with small positive float16 scales."""
    block, size, fields = BLOCKS[ggml_type]
    raw = rng.integers(0, 256, size=(out * n_in // block, size), dtype=np.uint8)
    for offset in fields:
        scales = rng.uniform(0.001, 0.01, size=raw.shape[0]).astype(np.float16)
        raw[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return quant.QTensor(ggml_type, raw.reshape(-1), out, n_in)


def shaped_groups(name: str) -> list[list[quant.QTensor]]:
    """The product groups of a named model, every layer its own matrices (a pass streams them all from memory)."""
    spec, rng = SHAPES[name], np.random.default_rng(0)
    groups = [[random_tensor(rng, t, o, i) for t, o, i in g] for _ in range(spec["layers"]) for g in spec["groups"]]
    return groups + [[random_tensor(rng, *spec["output"])]]


def model_groups(path: str) -> list[list[quant.QTensor]]:
    from specwise.models.quantized import QuantizedModel

    model = QuantizedModel(path, precision="q8")
    groups = []
    for layer in model.layers:
        groups += [layer[0:3], layer[3:4], layer[4:6], layer[6:7]]
    return groups + [[model.lm_head]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paths", nargs=2, default=["avx2", "avx512"], choices=quant.ISAS, help="baseline, then the other")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--target", help="GGUF file")
    source.add_argument("--shapes", choices=sorted(SHAPES), help="random matrices of a named model's shapes")
    ap.add_argument("--ks", nargs="+", type=int, default=[1, 4, 8, 16, 32])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=get_num_threads())
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    for path in args.paths:
        if quant.set_isa(path) != path:
            print(f"this CPU does not run the {path} path", file=sys.stderr)
            return 2
    groups = model_groups(args.target) if args.target else shaped_groups(args.shapes)
    rows = {}
    for k in args.ks:
        rng = np.random.default_rng(0)
        xs = {g[0].shape[1]: rng.standard_normal((k, g[0].shape[1]), dtype=np.float32) for g in groups}
        times: list[list[float]] = [[], []]
        outputs: list[list[np.ndarray]] = [[], []]
        for rep in range(args.reps):
            for i in (0, 1) if rep % 2 == 0 else (1, 0):
                quant.set_isa(args.paths[i])
                start = time.perf_counter()
                ys = [quant.q_gemm(g, xs[g[0].shape[1]], mode="q8", threads=args.threads) for g in groups]
                times[i].append(time.perf_counter() - start)
                if rep == 0:
                    outputs[i] = ys
        same = all(np.array_equal(a, b) for a, b in zip(*outputs))
        med = [statistics.median(t) * 1e3 for t in times]
        ratios = [b / a for a, b in zip(times[0], times[1])]
        rows[k] = {"median_ms": med, "ratio_median": statistics.median(ratios), "same_bits": same}
        verdict = "same" if same else "DIFFERENT"
        print(f"k={k:3d} {med[0]:9.2f} {med[1]:9.2f} ms  x{rows[k]['ratio_median']:.3f}  {verdict}", file=sys.stderr)
    quant.set_isa(None)
    emit_json(
        {
            "command": " ".join(sys.argv),
            "machine": machine_info("cpu"),
            "threads": args.threads,
            "paths": args.paths,
            "rows": rows,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
