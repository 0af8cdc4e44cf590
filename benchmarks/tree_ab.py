"""Paired A/B of two checkouts of specwise (e.g. the commit before a kernel change and after): each round runs
every checkout in a fresh process, in alternating order, with PYTHONPATH at the checkout so that its own Python and
its own built library (``python setup.py build_ext --inplace`` in it) are used. Each process times

- pass cost: passes of k tokens after a context of C tokens (rolled back after each; medians of --repeats), and
- plain greedy decoding: --decode tokens after the context, one pass per token (tokens/s),

on a GGUF target's quantized model (``--impl q8`` or ``exact``) or on the float32 native model built from the same
file (``--impl float``: the hf extra). Ratios are per round against the first checkout (so the machine's drift
cancels), reported as medians with their min and max; ``same_bits`` says whether every checkout gave the first
one's logits bit for bit.

    python benchmarks/tree_ab.py --trees /tmp/ab-base /tmp/ab-new --target default --impl q8 --rounds 7 --out ab.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import hashlib, json, statistics, sys, time
import numpy as np
target, impl = sys.argv[1], sys.argv[2]
ks = [int(k) for k in sys.argv[3].split(",")]
repeats, context, decode, threads = (int(x) for x in sys.argv[4:8])
from specwise.models import load_model
from specwise.models.threads import set_num_threads
set_num_threads(threads)
if impl == "float":
    from specwise.models.native import NativeModel
    model = NativeModel(load_model(target, impl="hf").hf_model)
else:
    model = load_model(target, precision=impl).model
ids = np.random.default_rng(0).integers(100, 30000, context + max(ks) + 1).astype(np.int64)
model.reset()
model.forward(ids[:context], num_logits=0)
digest = hashlib.sha256()
cost = {}
for k in ks:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        logits = model.forward(ids[context : context + k])
        times.append(time.perf_counter() - t)
        model.rollback(context)
    digest.update(np.ascontiguousarray(logits).tobytes())
    cost[k] = statistics.median(times)
tok = int(ids[context])
t = time.perf_counter()
for _ in range(decode):
    logits = model.forward([tok], num_logits=1)
    tok = int(np.argmax(logits[-1]))
seconds = time.perf_counter() - t
digest.update(np.ascontiguousarray(logits).tobytes())
print(json.dumps({"pass_ms": {str(k): 1e3 * v for k, v in cost.items()}, "decode_tok_s": decode / seconds,
                  "hash": digest.hexdigest()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", nargs="+", required=True, help="checkouts, each built in place (the first: the base)")
    ap.add_argument("--target", default="default", help="default | a .gguf file")
    ap.add_argument("--impl", choices=("q8", "exact", "float"), default="q8")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 5, 8])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    runs = {tree: [] for tree in args.trees}
    for r in range(args.rounds):
        order = args.trees if r % 2 == 0 else list(reversed(args.trees))
        for tree in order:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
            env.pop("SPECWISE_NATIVE_LIB", None)
            argv = [
                args.python,
                "-c",
                CHILD,
                args.target,
                args.impl,
                ",".join(map(str, args.ks)),
                str(args.repeats),
                str(args.context),
                str(args.decode),
                str(args.threads),
            ]
            out = subprocess.run(argv, env=env, cwd=os.path.abspath(tree), capture_output=True, text=True, check=True)
            runs[tree].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {tree}: {runs[tree][-1]}", file=sys.stderr)
    base = args.trees[0]

    def ratios(tree, get):
        values = [get(b) and get(t) / get(b) for b, t in zip(runs[base], runs[tree])]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    summary = {}
    for tree in args.trees[1:]:
        summary[tree] = {
            "decode_tok_s_ratio": ratios(tree, lambda run: run["decode_tok_s"]),
            "pass_ms_ratio": {str(k): ratios(tree, lambda run, k=k: run["pass_ms"][str(k)]) for k in args.ks},
            "same_bits": all(t["hash"] == b["hash"] for b, t in zip(runs[base], runs[tree])),
        }
    result = {"args": vars(args), "summary": summary, "runs": runs}
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
