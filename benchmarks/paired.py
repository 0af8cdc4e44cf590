"""Paired speedups with confidence intervals from an `engine_speed.py` result.

`engine_speed.py --repeats R` runs every method once per round, in a rotating order, so a method's r-th run of an
answer and plain decoding's r-th run of the same answer are close in time: the machine's drift hits both. Each
such pair gives a ratio t_plain / t_method; per category and method this prints the geometric mean of the ratios
over the category's answers (questions x seeds) and rounds, a 95% interval (Student t on the log ratios), and a
verdict:

    faster   the whole interval is above 1
    slower   the whole interval is below 1
    even     the interval holds 1 (no difference this run can show)

Rounds of one greedy answer share one output, so their pairs differ by timing noise only; at temperature 1 the
answers (seeds) differ in text too. The interval counts every pair as independent, which is optimistic when the
answer-to-answer spread is large and only a few answers are in a category: read "slower"/"faster" with that in
mind, and prefer more answers per category to more rounds.

    python benchmarks/paired.py benchmarks/results/s10_greedy.json [--json OUT]
    python benchmarks/paired.py BEFORE.json AFTER.json    # side by side: the paired geometric means of each run
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from scipy import stats as scipy_stats


def paired(result: dict, baseline: str = "native_plain") -> dict[str, dict[str, dict]]:
    """{category: {method: {"geomean", "low", "high", "pairs", "verdict"}}} from an engine_speed result."""
    runs = result["runs"]
    by_answer: dict[tuple, dict[str, list[float]]] = {}  # (category, question, seed) -> method -> seconds per round
    for r in runs:
        key = (r["category"], r["question_id"], r.get("seed"))
        by_answer.setdefault(key, {})[r["method"]] = r.get("seconds_all_repeats") or [r["seconds"]]
    logs: dict[str, dict[str, list[float]]] = {}
    for key, methods in by_answer.items():
        base = methods.get(baseline)
        if base is None:
            raise ValueError(f"the result has no {baseline!r} run for {key}: nothing to pair with")
        for name, seconds in methods.items():
            if name == baseline:
                continue
            if len(seconds) != len(base):
                raise ValueError(f"{name} and {baseline} have different numbers of rounds for {key}")
            cell = logs.setdefault(key[0], {}).setdefault(name, [])
            cell.extend(math.log(b / s) for b, s in zip(base, seconds))
    out: dict[str, dict[str, dict]] = {}
    for cat, methods in logs.items():
        out[cat] = {}
        for name, values in methods.items():
            mean = statistics.fmean(values)
            if len(values) > 1:
                half = scipy_stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
            else:
                half = math.inf
            low, high = math.exp(mean - half), math.exp(mean + half)
            verdict = "faster" if low > 1 else "slower" if high < 1 else "even"
            out[cat][name] = {
                "geomean": math.exp(mean),
                "low": low,
                "high": high,
                "pairs": len(values),
                "verdict": verdict,
            }
    return out


def table(cells: dict[str, dict[str, dict]]) -> str:
    """A markdown table: per category and method, the paired geometric mean [95% interval] and the verdict."""
    names = list(dict.fromkeys(n for methods in cells.values() for n in methods))
    short = [n.removeprefix("native_") for n in names]
    lines = ["| category | " + " | ".join(short) + " |", "|---" * (len(names) + 1) + "|"]
    for cat, methods in cells.items():
        row = []
        for n in names:
            c = methods.get(n)
            mark = {"faster": "", "even": " (even)", "slower": " **slower**"}[c["verdict"]] if c else ""
            row.append(f"{c['geomean']:.2f} [{c['low']:.2f}, {c['high']:.2f}]{mark}" if c else "")
        lines.append(f"| {cat} | " + " | ".join(row) + " |")
    means = []
    for n in names:
        values = [methods[n]["geomean"] for methods in cells.values() if n in methods]
        slower = sum(methods[n]["verdict"] == "slower" for methods in cells.values() if n in methods)
        means.append(f"{statistics.fmean(values):.3f} mean, {min(values):.2f} lowest, {slower} slower")
    lines.append("| **all** | " + " | ".join(means) + " |")
    return "\n".join(lines)


def compare(results: dict[str, dict[str, dict[str, dict]]]) -> str:
    """A markdown table of several runs side by side: per category and method, each run's paired geometric mean
    (a downward arrow where the run's interval lies below 1)."""
    names = list(dict.fromkeys(n for cells in results.values() for methods in cells.values() for n in methods))
    files = list(results)
    head = [f"{n.removeprefix('native_')}, {Path(f).stem}" for n in names for f in files]
    lines = ["| category | " + " | ".join(head) + " |", "|---" + "|---:" * len(head) + "|"]
    cats = list(dict.fromkeys(c for cells in results.values() for c in cells))
    for cat in cats:
        row = []
        for n in names:
            for f in files:
                c = results[f].get(cat, {}).get(n)
                row.append("" if c is None else f"{c['geomean']:.2f}" + (" ↓" if c["verdict"] == "slower" else ""))
        lines.append(f"| {cat} | " + " | ".join(row) + " |")
    means = []
    for n in names:
        for f in files:
            values = [m[n]["geomean"] for m in results[f].values() if n in m]
            means.append(f"**{statistics.fmean(values):.3f}**" if values else "")
    lines.append("| **mean** | " + " | ".join(means) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="JSON files written by benchmarks/engine_speed.py")
    ap.add_argument("--baseline", default="native_plain")
    ap.add_argument("--json", help="also write the cells (of the first file) as JSON here")
    args = ap.parse_args()
    loaded = {f: json.loads(Path(f).read_text()) for f in args.results}
    cells = {f: paired(r, args.baseline) for f, r in loaded.items()}
    for f, r in loaded.items():
        print(f"{f}: {r.get('command', '')}\n")
        print(table(cells[f]) + "\n")
    if len(cells) > 1:
        print(compare(cells))
    if args.json:
        first = args.results[0]
        Path(args.json).write_text(
            json.dumps({"source": first, "command": "python " + " ".join(sys.argv), "cells": cells[first]}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
