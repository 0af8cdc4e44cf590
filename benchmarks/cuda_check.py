"""The default model on CUDA against the CPU: greedy outputs, token for token, with every drafter.

Two steps. On the CPU, record the reference (plain greedy decoding of one Spec-Bench question per category):

    python benchmarks/cuda_check.py --device cpu --out benchmarks/results/cpu_reference.json

On the GPU, decode the same prompts plainly (native and Hugging Face implementations) and with each drafter, and
compare with the reference and with plain decoding on the GPU:

    python benchmarks/cuda_check.py --device cuda --reference benchmarks/results/cpu_reference.json \
        --out benchmarks/results/cuda_check.json

Float32 results on two devices differ by rounding, so plain greedy on CUDA may leave the CPU's path where the
two best logits are nearly tied; the report gives, for every such prompt, the position and the gap between the
two logits there. Speculative decoding must equal plain decoding on the same device exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

from specwise.drafters import make_drafter
from specwise.engine import Engine
from specwise.lab.bench.prompts import default_prompts, load_questions, select_prompts
from specwise.models import load_model
from specwise.runtime import encode_prompt
from specwise.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
DRAFTERS = ["ngram@4", "head@4", "head@auto", "ngram+head@auto", "ngram+head@8"]


def decode(engine: Engine, ids: list[int], n: int) -> tuple[list[int], float, dict]:
    """Greedy decoding of exactly n tokens (EOS ignored): token ids, seconds, statistics."""
    result = engine.generate(ids, GREEDY, max_new_tokens=n, eos_token_ids=[])
    return result.token_ids, result.stats.total_seconds, result.stats.to_dict()


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def logit_gap(hf_model, ids: list[int], tokens: list[int], at: int) -> dict:
    """Logits at the position where two outputs part: the gap between the two devices' choices there."""
    x = torch.tensor([ids + tokens[:at]], device=hf_model.device)
    logits = hf_model(input_ids=x).logits[0, -1].float()
    top = torch.topk(logits, 2)
    return {
        "top2_tokens": top.indices.tolist(),
        "top2_logits": [round(v, 6) for v in top.values.tolist()],
        "gap": round(float(top.values[0] - top.values[1]), 6),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--questions",
        default=os.environ.get("SPECWISE_QUESTIONS"),
        help="Spec-Bench's question.jsonl (default: $SPECWISE_QUESTIONS, else the project's prompts)",
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reference", default=None, help="the CPU's JSON (made with --device cpu)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 products as on the CPU

    loaded = load_model("default", device=args.device)
    hf_loaded = load_model("default", device=args.device, impl="hf")
    tok, n = loaded.tokenizer, args.max_new_tokens
    questions = select_prompts(
        (load_questions(args.questions) if args.questions else default_prompts()), None, 1
    )  # the first of each category
    prompts = [encode_prompt(tok, q.text, chat=True) for q in questions]
    reference = json.loads(Path(args.reference).read_text()) if args.reference else None
    plain_engine = Engine(loaded.model, None, gamma=0)
    hf_engine = Engine(hf_loaded.model, None, gamma=0)
    engines = {}
    if reference is not None:  # drafters only where the reference exists (the GPU run)
        for pair in DRAFTERS:
            spec, gamma = pair.rsplit("@", 1)
            drafter = make_drafter(spec, loaded, device=args.device)
            engines[pair] = Engine(loaded.model, drafter, gamma=gamma if gamma == "auto" else int(gamma))
    decode(plain_engine, prompts[0], 8)  # warm-up
    for engine in engines.values():
        decode(engine, prompts[0], 8)
    rows = []
    for i, (q, ids) in enumerate(zip(questions, prompts)):
        plain, seconds, _ = decode(plain_engine, ids, n)
        row = {"category": q.category, "question_id": q.id, "prompt_tokens": len(ids)}
        row["plain"] = {"token_ids": plain, "seconds": round(seconds, 4)}
        if reference is not None:
            ref = reference["rows"][i]
            assert str(ref["question_id"]) == q.id, "the reference was made from other questions"
            cut = first_difference(plain, ref["plain"]["token_ids"])
            row["plain"]["equals_cpu"] = cut is None
            if cut is not None:
                row["plain"]["parts_from_cpu_at"] = cut
                row["plain"]["logits_there"] = logit_gap(loaded.hf_model, ids, plain, cut)
            hf_tokens, hf_seconds, _ = decode(hf_engine, ids, n)
            row["hf_plain"] = {"equals_native": hf_tokens == plain, "seconds": round(hf_seconds, 4)}
            for pair, engine in engines.items():
                tokens, sec, stats = decode(engine, ids, n)
                row[pair] = {
                    "equals_plain": tokens == plain,
                    "seconds": round(sec, 4),
                    "tau": stats.get("mean_accepted_length"),
                }
                if tokens != plain:
                    row[pair]["parts_at"] = first_difference(tokens, plain)
        rows.append(row)
        flags = " ".join(
            f"{k}={'ok' if v.get('equals_plain', v.get('equals_cpu', v.get('equals_native', True))) else 'DIFF'}"
            for k, v in row.items()
            if isinstance(v, dict)
        )
        print(f"[{i + 1}/{len(questions)}] {q.category:>16} {flags}", file=sys.stderr)
    summary = {}
    if reference is not None:
        summary = {
            "plain_equals_cpu": sum(r["plain"]["equals_cpu"] for r in rows),
            "hf_equals_native": sum(r["hf_plain"]["equals_native"] for r in rows),
            **{f"{p}_equals_plain": sum(r[p]["equals_plain"] for r in rows) for p in engines},
            "prompts": len(rows),
        }
        for p in engines:
            plain_s = sum(r["plain"]["seconds"] for r in rows)
            summary[f"{p}_speed_ratio"] = round(plain_s / sum(r[p]["seconds"] for r in rows), 3)
    result = {
        "command": "python " + " ".join(sys.argv),
        "device": args.device,
        "gpu": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None,
        "machine": {"platform": platform.platform(), "torch": torch.__version__},
        "max_new_tokens": n,
        "summary": summary,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
