"""In-process A/B of the weight products between builds of the native library: every decoder layer's products
(fused QKV, attention output, fused gate/up, down) and the output layer of a GGUF model, for each number of rows k,
the builds timed alternately in one process (two cores drift between processes), their products compared bit for
bit. pass_ab.py times whole passes of each build in fresh processes.

    # the baseline: the library of another commit, built in a worktree
    git worktree add /tmp/base <commit> && (cd /tmp/base && python setup.py build_ext --inplace)
    python benchmarks/kernel_ab.py --libs /tmp/base/specwise/models/kernels/_native*.so \\
        specwise/models/kernels/_native*.so --out benchmarks/results/kernel_ab.json
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time

import numpy as np

from specwise.lab.bench.runner import emit_json, machine_info
from specwise.models.kernels import abi, quant
from specwise.models.loader import default_gguf_path
from specwise.models.quantized import QuantizedModel
from specwise.models.threads import get_num_threads


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libs", nargs="+", required=True, help="library builds; the first is the baseline")
    ap.add_argument("--target", default=None, help="GGUF file (default: the embedded model)")
    ap.add_argument("--ks", nargs="+", type=int, default=[1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 64])
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--mode", default="q8", choices=quant.MODES)
    ap.add_argument("--isa", default=None, choices=quant.ISAS, help="instruction path (default: the best supported)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    libs = []
    for path in args.libs:
        lib = ctypes.CDLL(path)
        abi.declare(lib)
        if args.isa:
            lib.specwise_q_set_isa(quant.ISAS.index(args.isa))
        libs.append(lib)
    model = QuantizedModel(args.target or default_gguf_path(), precision=args.mode)
    groups = []
    for layer in model.layers:
        groups += [layer[0:3], layer[3:4], layer[4:6], layer[6:7]]
    groups.append([model.lm_head])
    calls = [((abi.QMat * len(g))(*[p.struct for p in g]), g[0].shape[1], sum(p.shape[0] for p in g)) for g in groups]
    mode, threads = 1 if args.mode == "q8" else 0, get_num_threads()
    rows = {}
    for k in args.ks:
        rng = np.random.default_rng(0)
        xs = {n_in: rng.standard_normal((k, n_in), dtype=np.float32) for _, n_in, _ in calls}
        ys = [{n_out: np.empty((k, n_out), dtype=np.float32) for _, _, n_out in calls} for _ in libs]
        same = [True for _ in libs]
        times = [[] for _ in libs]
        for rep in range(args.reps):
            order = range(len(libs)) if rep % 2 == 0 else reversed(range(len(libs)))
            for i in order:
                fn = libs[i].specwise_q_gemm
                t0 = time.perf_counter()
                for structs, n_in, n_out in calls:
                    fn(
                        structs,
                        len(structs),
                        xs[n_in].ctypes.data,
                        None,
                        ys[i][n_out].ctypes.data,
                        k,
                        mode,
                        threads,
                    )
                times[i].append(time.perf_counter() - t0)
                if (
                    rep == 0
                ):  # the products (the last call of each output width) equal the baseline build's, bit for bit
                    same[i] = all(np.array_equal(ys[i][n], ys[0][n]) for n in ys[0]) if i else True
        med = [statistics.median(t) * 1e3 for t in times]
        ratios = [[b / a for a, b in zip(times[0], t)] for t in times[1:]]
        rows[k] = {
            "median_ms": med,
            "ratio_median": [statistics.median(r) for r in ratios],
            "ratio_q25_q75": [statistics.quantiles(r, n=4)[::2] for r in ratios],
            "same_as_baseline": same[1:],
        }
        print(
            k,
            " ".join(f"{m:.3f}" for m in med),
            "ratio",
            " ".join(f"{statistics.median(r):.3f}" for r in ratios),
            "same" if all(same) else "DIFFERENT",
            file=sys.stderr,
            flush=True,
        )
    result = {
        "command": " ".join(sys.argv),
        "machine": machine_info("cpu"),
        "threads": threads,
        "mode": args.mode,
        "isa": args.isa or "best supported",
        "libs": args.libs,
        "rows": rows,
    }
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
