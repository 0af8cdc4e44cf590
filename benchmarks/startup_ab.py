"""Start-up of two source trees of specwise side by side: ``load_model(MODEL)`` timed in fresh processes.

Each round runs both trees once, in alternating order (the second process of a pair was measured ~15% faster than
the first on the same machine, whichever tree it was), so the ratio is the geometric mean of the two orders'
median paired ratios. A tree is a checkout with its kernels built in place (``python setup.py build_ext
--inplace``); both run with this interpreter.

    python benchmarks/startup_ab.py --old /tmp/old --new . --rounds 12 --out startup.json
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

from specwise.lab.bench.runner import emit_json, script_header

_CHILD = (
    "import time\nt = time.perf_counter()\nfrom specwise.models import load_model\n"
    "load_model({model!r})\nprint(time.perf_counter() - t)\n"
)


def once(tree: Path, model: str) -> float:
    """Seconds from importing specwise to a loaded model, in a fresh process using ``tree``'s sources."""
    env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD.format(model=model)], env=env, cwd="/", capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, required=True)
    ap.add_argument("--new", type=Path, required=True)
    ap.add_argument("--model", default="default")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error("--rounds must be at least 2: each order of the two trees needs a round")
    once(args.old, args.model), once(args.new, args.model)  # warm the page cache and the tokenizer caches
    rows = []
    for r in range(args.rounds):
        first, second = (args.old, args.new) if r % 2 == 0 else (args.new, args.old)
        times = {first: once(first, args.model), second: once(second, args.model)}
        rows.append({"old_first": r % 2 == 0, "old_s": times[args.old], "new_s": times[args.new]})
    ratios = {
        order: statistics.median(x["new_s"] / x["old_s"] for x in rows if x["old_first"] == order)
        for order in (True, False)
    }
    emit_json(
        {
            **script_header(argv),
            "model": args.model,
            "old": str(args.old),
            "new": str(args.new),
            "rounds": rows,
            "median_old_s": statistics.median(x["old_s"] for x in rows),
            "median_new_s": statistics.median(x["new_s"] for x in rows),
            "ratio_new_over_old_old_first": ratios[True],
            "ratio_new_over_old_new_first": ratios[False],
            "ratio_new_over_old": math.sqrt(ratios[True] * ratios[False]),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
