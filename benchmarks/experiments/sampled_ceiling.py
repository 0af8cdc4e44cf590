"""What speculation can gain when sampling at temperature 1: how often any drafter's token can be the target's.

Question: why does speculation gain nothing measurable at temperature 1, and what would a drafter need? Answer: the
target's largest probability averages 0.49 and the head's Σ min(p, q) 0.42 over 1,749 positions; with Zen 5's pass
costs even a free drafter of the head's acceptance gives at most 1.36×, and 1.3× needs Σ min(p, q) of 0.42 at 3%
of a pass or 0.51 at 10% (benchmarks/results/sampled_ceiling_zen5.json; docs/FIGURES.md).

On held-out prompts (never Spec-Bench; by default the 30 of ``default_drafter_choice_heldout/prompts.jsonl``) the
target decodes at temperature 1 with the head drafting one token a step (γ = 1, so every position is scored), and
at every drafted position the script keeps p (the target's distribution) and q (the head's, at its first drafting
step from the target's true features). From them:

- ``max_p``: E[max p], the acceptance of the best single token any drafter of single tokens could propose (an
  oracle of the target's argmax); ``top2_p``/``top4_p``: the most a tree of 2 or 4 candidates could accept at one
  position;
- ``head_alpha``: E[Σ min(p, q)], the head's acceptance under the rejection rule;
- ``head_coupled``: the chance that the head's token drawn by inverse CDF with the position's own uniform is the
  target's token drawn with the same uniform (the coupled rule, ids in vocabulary order);
- ``ceiling``: for i.i.d. acceptance a and a drafting cost of ``d`` one-token passes a token, the best
  max over γ of E[τ](a, γ) / (c(γ + 1) + γ d) with the measured c(k) (``--profile``: `specwise profile --json`);
  it leaves out every cost of a step besides the pass and the drafting, so it bounds what a drafter of that
  acceptance and cost can give;
- ``needed``: per drafting cost, the least i.i.d. acceptance whose ceiling reaches ``--goal``.

    python benchmarks/experiments/sampled_ceiling.py --profile benchmarks/results/profile_zen5_q8.json --out …
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import specwise.rejection as rejection
from specwise.lab.bench.runner import emit_json, machine_info
from specwise.metrics import expected_tau
from specwise.runtime import build_runtime, encode_prompt
from specwise.sampling import SamplingParams

HELDOUT = Path(__file__).resolve().parents[1] / "results" / "default_drafter_choice_heldout" / "prompts.jsonl"


def position_figures(q: np.ndarray, p: np.ndarray) -> dict[str, float]:
    """The figures of one position from q and p over the full vocabulary (float64)."""
    q, p = q / q.sum(), p / p.sum()
    top = np.sort(p)[::-1]
    fq, fp = np.cumsum(q), np.cumsum(p)
    # the coupled agreement: the measure of u in [0, 1) whose inverse-CDF token is the same under q and p
    lo = np.maximum(fq - q, fp - p)
    hi = np.minimum(fq, fp)
    return {
        "max_p": float(top[0]),
        "top2_p": float(top[:2].sum()),
        "top4_p": float(top[:4].sum()),
        "head_alpha": float(np.minimum(p, q).sum()),
        "head_coupled": float(np.clip(hi - lo, 0.0, None).sum()),
    }


def ceiling(a: float, cost: dict[int, float], d: float) -> dict:
    """max over γ of E[τ](a, γ) / (c(γ + 1) + γ d), with the γ that reaches it."""
    best = {"gamma": 0, "speedup": 1.0}
    for gamma in range(1, max(cost)):
        speedup = expected_tau(a, gamma) / (cost[gamma + 1] + gamma * d)
        if speedup > best["speedup"]:
            best = {"gamma": gamma, "speedup": speedup}
    return best


def needed(goal: float, cost: dict[int, float], d: float) -> float | None:
    """The least acceptance (to 0.001) whose :func:`ceiling` reaches ``goal``, or None where none below 1 does."""
    low, high = 0.0, 0.999
    if ceiling(high, cost, d)["speedup"] < goal:
        return None
    while high - low > 1e-3:
        mid = (low + high) / 2
        low, high = (mid, high) if ceiling(mid, cost, d)["speedup"] < goal else (low, mid)
    return round(high, 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--prompts",
        type=Path,
        default=HELDOUT.relative_to(Path.cwd()) if HELDOUT.is_relative_to(Path.cwd()) else HELDOUT,
        help="Spec-Bench-format questions (not Spec-Bench)",
    )
    ap.add_argument("--limit", type=int, default=30)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--profile", type=Path, required=True, help="`specwise profile --json` output: c(k)")
    ap.add_argument("--draft-cost", type=float, nargs="+", default=[0.0, 0.03, 0.05, 0.1], help="per token, in passes")
    ap.add_argument("--goal", type=float, default=1.3, help="the speedup over plain decoding asked of a drafter")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    runtime = build_runtime("default", "head", gamma=1)
    rows: list[dict[str, float]] = []
    inner = rejection.verify_stochastic  # the rule verify() applies to a drafted distribution

    def recording(tokens, q, p, generator):
        rows.append(position_figures(np.asarray(q[0, 0], np.float64), np.asarray(p[0, 0], np.float64)))
        return inner(tokens, q, p, generator)

    rejection.verify_stochastic = recording
    lines = args.prompts.read_text(encoding="utf-8").splitlines()
    questions = [json.loads(line)["turns"][0] for line in lines if line.strip()][: args.limit]
    for seed, question in enumerate(questions):
        ids = encode_prompt(runtime.tokenizer, question, chat=True)
        runtime.engine.generate(ids, SamplingParams(temperature=1.0, seed=seed), max_new_tokens=args.max_new_tokens)
    rejection.verify_stochastic = inner

    means = {name: float(np.mean([r[name] for r in rows])) for name in rows[0]}
    profile = json.loads(args.profile.read_text())
    cost = {int(k): float(v) for k, v in profile["cost_curve"].items()}
    ceilings = {
        name: {str(d): ceiling(means[name], cost, d) for d in args.draft_cost}
        for name in ("max_p", "head_alpha", "head_coupled")
    }
    result = {
        "command": "python benchmarks/experiments/sampled_ceiling.py "
        + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
            if v is not None
        ),
        "machine": machine_info("cpu"),
        "prompts": str(args.prompts),
        "questions": len(questions),
        "positions": len(rows),
        "means": means,
        "cost_curve": cost,
        "ceiling": ceilings,
        "goal": args.goal,
        "needed": {str(d): needed(args.goal, cost, d) for d in args.draft_cost},
    }
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
