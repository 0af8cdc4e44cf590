"""A draft model's draft vocabulary: what a drafted token costs and how often the draft still agrees with the target,
by draft vocabulary size.

Question: how many tokens should a sibling draft model keep in its output layer (``model:…?vocab=N``)? Answer:
65,536 for the Qwen2.5 pair: it kept the full vocabulary's first-position acceptance with a 43 MB smaller output
layer, where 32,768 and 49,152 lost acceptance on code (specwise/drafters/sibling.py; end to end, 65,536 against
32,768: benchmarks/results/xeon_qwen15_vocab32768_coding/).

For each size N (the first N ids of a ranking, ``python -m specwise.lab.ranking``): the milliseconds of one
draft-model token (a 1-row pass with its logits, after a 64-token prefill; rounds interleaved, medians), the share
of the target's held-out answer tokens inside the vocabulary (coverage), and the greedy first-token acceptance:
over the held-out answers, teacher-forced, how often the draft's argmax over the vocabulary is the target's next
token (the target's greedy answers, so this is the acceptance of a first drafted token under greedy decoding).

The held-out answers are those of the answers file (``--answers``, as the ranking's builder writes it) from
``--heldout-from`` on, which the ranking must not have seen; their prompts are re-made from the same prompt files,
count and seed as the builder's.

    python benchmarks/experiments/draft_vocab.py --draft D.gguf --ranking R.npy --answers A.jsonl \\
        --heldout-from 300 --prompts $SPECWISE_PROMPTS/{mbpp,oasst_en,gsm8k_train}.prompts.jsonl \\
        --per-file 120 --out draft_vocab.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from specwise.drafters.vocab import read_ranking
from specwise.lab.bench.runner import emit_json, script_header
from specwise.lab.ranking import read_answers, sampled_prompts
from specwise.models import load_model
from specwise.models.quantized import QuantizedModel
from specwise.runtime import encode_prompt


def token_ms(model: QuantizedModel, steps: int = 32) -> float:
    """Milliseconds of one 1-token pass with its logits, after a 64-token prefill."""
    model.reset()
    model.forward(np.arange(100, 164))
    began = time.perf_counter()
    for i in range(steps):
        model.forward([200 + i], num_logits=1)
    return (time.perf_counter() - began) / steps * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--ranking", required=True)
    ap.add_argument("--answers", required=True)
    ap.add_argument("--heldout-from", type=int, required=True)
    ap.add_argument("--heldout", type=int, default=40, help="held-out answers used")
    ap.add_argument("--prompts", nargs="+", required=True)
    ap.add_argument("--per-file", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sizes", type=int, nargs="+", default=[8192, 16384, 24576, 32768, 49152])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    header = script_header(argv)

    loaded = load_model(args.draft, drafting=True)  # the draft model, and the tokenizer it shares with the target
    draft, tok = loaded.model, loaded.tokenizer
    vocab = int(draft.vocab_size)
    ranking = read_ranking(args.ranking, vocab)
    prompts = sampled_prompts([Path(p) for p in args.prompts], args.per_file, args.seed)
    answers = read_answers(Path(args.answers))
    pairs = list(zip(prompts, answers))[args.heldout_from : args.heldout_from + args.heldout]
    sizes = [n for n in args.sizes if n <= len(ranking)]
    member = {n: np.zeros(vocab, dtype=bool) for n in sizes}
    for n in sizes:
        member[n][ranking[:n]] = True
    hits = {n: 0 for n in ["full", *sizes]}
    covered = {n: 0 for n in sizes}
    total = 0
    for prompt, answer in pairs:
        ids = encode_prompt(tok, prompt, chat=True)[:1024]
        draft.reset()
        logits = np.asarray(draft.forward(ids + answer[:-1], num_logits=len(answer)))  # [len(answer), vocab]
        want = np.asarray(answer)
        total += len(answer)
        hits["full"] += int((logits.argmax(-1) == want).sum())
        for n in sizes:
            mask = member[n]
            hits[n] += int((np.where(mask, logits, -np.inf).argmax(-1) == want).sum())
            covered[n] += int(mask[want].sum())

    models = {"full": QuantizedModel(args.draft, drafting=True)}
    for n in sizes:
        models[n] = QuantizedModel(args.draft, drafting=True)
        models[n].restrict_output(np.sort(ranking[:n]))
    ms: dict = {k: [] for k in models}
    for _ in range(args.rounds):
        for k, m in models.items():
            ms[k].append(token_ms(m))
    rows = {}
    for k in models:
        rows[str(k)] = {
            "ms_per_draft_token": round(statistics.median(ms[k]), 3),
            "ms_rounds": [round(x, 3) for x in ms[k]],
            "greedy_first_token_acceptance": round(hits[k] / max(total, 1), 4),
            "coverage": 1.0 if k == "full" else round(covered[k] / max(total, 1), 4),
            "weight_mb": round(models[k].weight_bytes / 1e6, 1),
        }
    result = {
        **header,
        "draft": Path(args.draft).name,
        "heldout_answers": len(pairs),
        "heldout_tokens": total,
        "by_size": rows,
    }
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
