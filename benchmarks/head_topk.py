"""How often the target's greedy token is among the head's k most likely tokens, by Spec-Bench category.

Teacher-forced, first drafting step: the target answers each question greedily (native engine, EOS ignored),
then the head predicts every answer token from the target's true states. Top-1 is the greedy acceptance rate of
a first drafted token; top-k for k > 1 is what a draft tree with k branches at that position would accept.

    python benchmarks/head_topk.py --per-category 1 --max-new-tokens 64 --out benchmarks/results/head_topk.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_speed import load_questions  # noqa: E402

from specwise.drafters import NoDrafter, make_drafter  # noqa: E402
from specwise.engine import Engine  # noqa: E402
from specwise.models import load_model  # noqa: E402
from specwise.runtime import encode_prompt  # noqa: E402
from specwise.sampling import SamplingParams  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--drafter", default="head", help="a head drafter spec (head or head:DIR)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--out", default="benchmarks/results/head_topk.json")
    args = ap.parse_args()

    loaded = load_model("default")
    tok, hf = loaded.tokenizer, loaded.hf_model
    head = make_drafter(args.drafter, loaded).head
    full = hf.get_output_embeddings().weight.detach()
    by_cat: dict[str, list[float]] = {}
    hits, count = torch.zeros(args.k), 0
    for q in load_questions(args.questions, args.per_category, None):
        ids = encode_prompt(tok, q["turns"][0], chat=True)
        out = Engine(loaded.model, NoDrafter()).generate(ids, SamplingParams(), args.max_new_tokens, eos_token_ids=[])
        seq = torch.tensor([ids + out.token_ids])
        with torch.inference_mode():
            feats = hf.model(input_ids=seq).last_hidden_state.float()
            nxt = torch.cat([seq[:, 1:], torch.zeros_like(seq[:, :1])], 1)
            pred = head(feats, nxt, 1)[0][0]  # row t predicts the state at t + 1, hence token t + 2
            target_top = (feats[0] @ full.T).argmax(-1)  # row t: the target's token t + 1
            t = torch.arange(len(ids) - 1, seq.shape[1] - 2)  # rows whose prediction is an answer token
            ranked = head.vocab_ids[(pred[t] @ head.head_weight.T).topk(args.k, -1).indices]
            hit = (ranked == target_top[t + 1][:, None]).float().cumsum(-1)  # [n, k]: within the top j
        sums = by_cat.setdefault(q["category"], [0.0] * (args.k + 1))
        for j in range(args.k):
            sums[j] += float(hit[:, j].sum())
        sums[args.k] += len(t)
        hits += hit.sum(0)
        count += len(t)
        print(q["category"], [round(float(x), 3) for x in hit.mean(0)], file=sys.stderr)
    result = {
        "command": "python " + " ".join(sys.argv),
        "drafter": args.drafter,
        "positions": count,
        "top_k_agreement": [round(float(x) / count, 4) for x in hits],
        "by_category": {c: [round(s / v[-1], 4) for s in v[:-1]] for c, v in by_cat.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("drafter", "positions", "top_k_agreement")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
