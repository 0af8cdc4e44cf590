"""Whole passes of GGUF models under builds of the native library, side by side: each round runs every build in
turn, each in a fresh process (``SPECWISE_NATIVE_LIB``), and times passes of k tokens after a 64-token context
(medians of ``--repeats``); ratios are per round against the first build, so that the machine's drift cancels.

A model is ``FILE`` or ``FILE?draft=N``: loaded as a draft model is (``drafting``: the layers' wider matrices
re-quantized to Q4_0) with its output layer cut to the first N ids of the shipped ranking, as ``model:FILE?vocab=N``
drafts.

    git worktree add /tmp/base <commit> && (cd /tmp/base && python setup.py build_ext --inplace)
    python benchmarks/pass_ab.py --libs /tmp/base/specwise/models/kernels/_native*.so \\
        specwise/models/kernels/_native*.so --models 0.5B.gguf?draft=65536 1.5B.gguf --ks 1 5 --out ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from specwise.bench.runner import emit_json, script_header

CHILD = r"""
import json, statistics, sys, time, torch
from specwise.models.quantized import QuantizedModel
spec, ks, repeats = sys.argv[1], [int(k) for k in sys.argv[2].split(",")], int(sys.argv[3])
path, _, option = spec.partition("?draft=")
model = QuantizedModel(path, precision="q8", drafting=bool(option))
if option:
    import numpy as np
    from pathlib import Path
    from specwise.drafters.vocab import read_ranking
    import specwise
    (ranking,) = (Path(specwise.__file__).parent / "shipped" / "vocabs").glob("*.npy")
    model.restrict_output(np.sort(read_ranking(ranking, model.vocab_size)[: int(option)]))
ids = torch.randint(0, 30000, (64 + max(ks),), generator=torch.Generator().manual_seed(0))
model.forward(ids[:64], num_logits=0)
out = {}
for k in ks:
    times = []
    for _ in range(repeats):
        model.rollback(64)
        start = time.perf_counter()
        model.forward(ids[64 : 64 + k])
        times.append(time.perf_counter() - start)
    out[k] = statistics.median(times) * 1e3
print(json.dumps(out))
"""


def run(lib: str, model: str, ks: list[int], repeats: int) -> dict[int, float]:
    env = dict(os.environ, SPECWISE_NATIVE_LIB=lib)
    args = [sys.executable, "-c", CHILD, model, ",".join(map(str, ks)), str(repeats)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libs", nargs="+", required=True, help="library builds; the first is the baseline")
    ap.add_argument("--models", nargs="+", required=True, help="FILE or FILE?draft=N")
    ap.add_argument("--ks", nargs="+", type=int, default=[1, 5])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    libs = [os.path.abspath(lib) for lib in args.libs]
    ms: dict[str, dict[str, dict[int, list[float]]]] = {
        m: {lib: {k: [] for k in args.ks} for lib in libs} for m in args.models
    }
    for r in range(args.rounds):
        for model in args.models:
            for lib in libs:
                for k, v in run(lib, model, args.ks, args.repeats).items():
                    ms[model][lib][k].append(v)
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    rows = []
    for model in args.models:
        base = ms[model][libs[0]]
        for lib in libs:
            for k in args.ks:
                ratios = [a / b for a, b in zip(ms[model][lib][k], base[k])]
                rows.append(
                    {
                        "model": os.path.basename(model),
                        "lib": lib,
                        "k": k,
                        "median_ms": statistics.median(ms[model][lib][k]),
                        "per_round_ms": ms[model][lib][k],
                        "time_vs_first": statistics.median(ratios),
                        "time_vs_first_range": [min(ratios), max(ratios)],
                    }
                )
    result = {**script_header(None), "rows": rows}
    for row in rows:
        print(
            f"{row['model']:45s} k={row['k']:<3d} {row['median_ms']:8.2f} ms  x{row['time_vs_first']:.3f}  {row['lib']}"
        )
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
