"""Whole passes of GGUF models under builds of the native library, side by side: each round runs every build in
turn, each in a fresh process (``SPECWISE_NATIVE_LIB``), and times passes of k tokens after a context of C tokens
(``--contexts``, 64 by default; attention's share grows with it; medians of ``--repeats``); ratios are per round
against the first build, so that the machine's drift cancels. Each pass's logits are hashed: ``same_bits`` says
whether every build gave the first build's bits.

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

from specwise.lab.bench.runner import emit_json, script_header

CHILD = r"""
import hashlib, json, statistics, sys, time
import numpy as np
from specwise.models.quantized import QuantizedModel
spec, ks, repeats, context = sys.argv[1], [int(k) for k in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
path, _, option = spec.partition("?draft=")
model = QuantizedModel(path, precision="q8", drafting=bool(option))
if option:
    from pathlib import Path
    from specwise.drafters.vocab import read_ranking
    import specwise
    (ranking,) = (Path(specwise.__file__).parent / "shipped" / "vocabs").glob("*.npy")
    model.restrict_output(np.sort(read_ranking(ranking, model.vocab_size)[: int(option)]))
ids = np.random.default_rng(0).integers(0, 30000, context + max(ks))
model.forward(ids[:context], num_logits=0)
out = {}
for k in ks:
    times = []
    for _ in range(repeats):
        model.rollback(context)
        start = time.perf_counter()
        logits = model.forward(ids[context : context + k])
        times.append(time.perf_counter() - start)
    digest = hashlib.sha256(np.ascontiguousarray(logits, dtype=np.float32).tobytes()).hexdigest()
    out[k] = [statistics.median(times) * 1e3, digest]
print(json.dumps(out))
"""


def run(lib: str, model: str, ks: list[int], repeats: int, context: int) -> dict[int, list]:
    """{k: [median milliseconds, sha256 of the last pass's logits]} of one build in a fresh process."""
    env = dict(os.environ, SPECWISE_NATIVE_LIB=lib)
    args = [sys.executable, "-c", CHILD, model, ",".join(map(str, ks)), str(repeats), str(context)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libs", nargs="+", required=True, help="library builds; the first is the baseline")
    ap.add_argument("--models", nargs="+", required=True, help="FILE or FILE?draft=N")
    ap.add_argument("--ks", nargs="+", type=int, default=[1, 5])
    ap.add_argument("--contexts", nargs="+", type=int, default=[64], help="tokens of context before the passes")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    libs = [os.path.abspath(lib) for lib in args.libs]
    cells = [(m, c) for m in args.models for c in args.contexts]
    ms = {cell: {lib: {k: [] for k in args.ks} for lib in libs} for cell in cells}
    bits = {cell: {lib: {} for lib in libs} for cell in cells}
    for r in range(args.rounds):
        for cell in cells:
            for lib in libs:
                for k, (v, digest) in run(lib, cell[0], args.ks, args.repeats, cell[1]).items():
                    ms[cell][lib][k].append(v)
                    bits[cell][lib][k] = digest
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    rows = []
    for cell in cells:
        base = ms[cell][libs[0]]
        for lib in libs:
            for k in args.ks:
                ratios = [a / b for a, b in zip(ms[cell][lib][k], base[k])]
                rows.append(
                    {
                        "model": os.path.basename(cell[0]),
                        "context": cell[1],
                        "lib": lib,
                        "k": k,
                        "median_ms": statistics.median(ms[cell][lib][k]),
                        "per_round_ms": ms[cell][lib][k],
                        "time_vs_first": statistics.median(ratios),
                        "time_vs_first_range": [min(ratios), max(ratios)],
                        "same_bits": bits[cell][lib][k] == bits[cell][libs[0]][k],
                    }
                )
    result = {**script_header(None), "same_bits": all(row["same_bits"] for row in rows), "rows": rows}
    for row in rows:
        print(
            f"{row['model']:45s} C={row['context']:<5d} k={row['k']:<3d} {row['median_ms']:8.2f} ms  "
            f"x{row['time_vs_first']:.3f}  {'same bits' if row['same_bits'] else 'DIFFERENT'}  {row['lib']}"
        )
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
