"""Is the head's confidence an estimate of acceptance? (confidence, accepted) for first-position greedy drafts.

The adaptive schedule stops a head's draft once the product of its confidences falls below the break-even
acceptance, so the confidence (the head's largest probability) should be calibrated. Drafts one token per step
(γ = 1, the confidence threshold off) on the first question of each Spec-Bench category and bins the outcomes.

    python benchmarks/head_calibration.py --out benchmarks/results/head_calibration.json
"""

from __future__ import annotations

import argparse
import json
import sys

from engine_speed import load_questions

from specwise.drafters import make_drafter
from specwise.engine import Engine
from specwise.models import load_model
from specwise.runtime import encode_prompt
from specwise.sampling import SamplingParams
from specwise.schedule import FixedGamma


class OneTokenWithConfidence(FixedGamma):
    """γ = 1 with a threshold that never declines but makes the head compute its confidence."""

    def min_confidence(self) -> float:
        return 1e-9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--head", default="head", help="drafter spec of the head (default: the shipped one)")
    ap.add_argument("--out", default="benchmarks/results/head_calibration.json")
    args = ap.parse_args()

    loaded = load_model("default", device="cpu")
    head = make_drafter(args.head, loaded, device="cpu")
    pairs: list[tuple[float, bool]] = []
    last: dict[str, float] = {}
    choose, observe = head._choose, head.observe

    def recording_choose(*a, **k):
        out = choose(*a, **k)
        last["confidence"] = out[2]
        return out

    def recording_observe(num_accepted: int) -> None:
        if "confidence" in last:
            pairs.append((last.pop("confidence"), num_accepted > 0))
        observe(num_accepted)

    head._choose, head.observe = recording_choose, recording_observe
    engine = Engine(loaded.model, head, gamma=OneTokenWithConfidence(1))
    for q in load_questions(args.questions, args.per_category, None):
        ids = encode_prompt(loaded.tokenizer, q["turns"][0], chat=True)
        engine.generate(ids, SamplingParams(temperature=0.0), max_new_tokens=args.max_new_tokens, eos_token_ids=[])
    edges = [i / 10 for i in range(11)]
    bins = []
    for lo, hi in zip(edges, edges[1:]):
        sel = [a for c, a in pairs if lo <= c < hi or (hi == 1.0 and c == 1.0)]
        if sel:
            bins.append({"confidence": [lo, hi], "drafts": len(sel), "accepted": sum(sel) / len(sel)})
            print(f"confidence {lo:.1f}-{hi:.1f}: {len(sel):4d} drafts, accepted {sum(sel) / len(sel):.2f}")
    result = {"command": "python " + " ".join(sys.argv), "drafts": len(pairs), "bins": bins}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
