"""How far a model drafter's greedy speedup could go with a better rule for when to stop drafting.

Question: which stop rule should greedy drafting with a draft model use? Answer: the product of the draft's
probabilities with a lookahead of 0.5 (the model drafter's default): replayed on 40 human-written prompts each, the
modelled speedup 1.91 (MBPP) and 1.50 (OASST) against 1.82 and 1.40 for the product rule alone, the oracle 2.26 and
1.95; checked on 10 coding questions (1.96 against 1.88) and end to end, 1.027× [1.002, 1.052] the rule before
(benchmarks/results/xeon_qwen15_lookahead/: policy_*.json, report.md).

For each question the target's greedy answer is decoded plainly; the draft model then reads the prompt and the
answer in one pass (its logits at a position are those it computes while drafting there: a row's logits do not
depend on how many rows share a pass, and in greedy drafting the draft model's context is the target's as long as
its tokens are accepted). That gives, at every answer position, whether the draft model's choice is the target's
and the draft model's probability of its choice. On those sequences the script replays drafting rules step by
step with the measured costs of ``--profile`` (the target's pass over k tokens, t(k), and a draft pass):

- ``fixed``: draft gamma tokens at every step;
- ``product``: draft while the product of the draft's probabilities stays at or above a stop level, as specwise's
  greedy drafting does (the pass that shows the next token's probability is spent, as it is there);
- ``oracle``: draft exactly the tokens that will be accepted (no rule can do better with this draft model).

A step drafting n tokens costs its draft passes plus t(n + 1) and yields the accepted tokens plus the target's
own. The speedup is against plain decoding at t(1) a token; overheads the costs leave out (Python, sampling, the
draft's intake of the prompt) are left out for every rule alike, so compare rules with each other and with the
measured run, not with the goal directly.

Choosing on human-written prompts (``--prompts``), then checking on a Spec-Bench category:

    python benchmarks/experiments/draft_policy.py --target …/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf \\
        --drafter "model:…/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf?vocab=65536" \\
        --prompts $SPECWISE_PROMPTS/mbpp.prompts.jsonl --skip 24 --questions 40 \\
        --profile benchmarks/results/profile_qwen15_draft05_prefetch_q8.json --out policy_mbpp.json
    python benchmarks/experiments/draft_policy.py … --questions-file question.jsonl --questions 10 --out check.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

__all__ = ["replay", "main"]

GO = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # guesses of the next token's probability tried by the "ahead" rule


def replay(
    answers: list[tuple[list[bool], list[float]]],
    passes: dict[int, float],
    draft_pass: float,
    rule: str,
    level: float = 0.0,
    max_gamma: int = 8,
    go: float = 1.0,
) -> dict:
    """Replay one drafting rule over answers given as (agrees, probabilities) per position. Returns tokens, time and
    the speedup over plain decoding (one token per ``passes[1]``)."""
    tokens = seconds = 0.0
    steps = drafted = accepted = 0
    cap = min(max_gamma, max(passes) - 1)
    for agrees, probs in answers:
        n_pos, t = len(agrees), 0
        while t < n_pos:
            run = 0
            while t + run < n_pos and run < cap and agrees[t + run]:
                run += 1
            room = min(cap, n_pos - t - 1)  # the step's own token ends the answer at the last position
            if rule == "oracle":
                n, draft_passes = min(run, room), min(run, room)
            elif rule == "fixed":
                n = min(int(level), room)
                draft_passes = n
            elif rule in ("product", "ahead"):
                # product: after each kept token, the next token's probability is computed (one draft pass) and
                # the token kept while the product stays at or above the level. ahead: the next pass is spent only
                # while the product times ``go`` (a guess of the next probability) stays at or above the level
                n, reach, draft_passes = 0, 1.0, 1  # the first token's probability comes with the step's first pass
                while n < room:
                    if reach * probs[t + n] < level:
                        break
                    reach *= probs[t + n]
                    n += 1
                    if n < room and (rule == "product" or reach * go >= level):
                        draft_passes += 1
                    else:
                        break
            else:
                raise ValueError(f"unknown rule {rule!r}")
            took = min(run, n)
            seconds += draft_passes * draft_pass + passes[n + 1]
            tokens += took + 1
            t += took + 1
            steps += 1
            drafted += n
            accepted += took
    return {
        "rule": rule,
        "level": level,
        **({"go": go} if rule == "ahead" else {}),
        "steps": steps,
        "drafted": drafted,
        "accepted": accepted,
        "tokens_per_step": tokens / steps,
        "speedup": tokens * passes[1] / seconds,
    }


def _questions(
    prompts: str | None, category: str, count: int, skip: int, questions: str | None = None
) -> list[tuple[str, str]]:
    """(id, text) of the questions of ``category`` (to check: a Spec-Bench question file, else the project's own
    prompts), or of a ``*.prompts.jsonl`` file of human-written prompts (to choose a rule's levels on: never on
    Spec-Bench), every ``skip``-th line."""
    if prompts is None:
        from specwise.lab.bench.prompts import default_prompts, load_questions, select_prompts

        chosen = select_prompts(load_questions(questions) if questions else default_prompts(), [category], count)
        return [(str(q.id), q.text) for q in chosen]
    rows = [json.loads(line) for line in Path(prompts).read_text().splitlines() if line.strip()]
    chosen = rows[::skip][:count]
    return [(str(r.get("source") or i), str(r["prompt"])) for i, r in enumerate(chosen)]


def _answers(target: str, drafter: str, chosen: list[tuple[str, str]], max_new: int) -> tuple[list, list]:
    from specwise.runtime import build_runtime, encode_prompt
    from specwise.sampling import SamplingParams

    runtime = build_runtime(target, drafter, "auto", "cpu")
    engine = runtime.engine
    source = engine.drafters[0]
    draft = source.model
    ids_map = getattr(source, "vocab_ids", None)
    answers, rows = [], []
    for qid, text in chosen:
        prompt = encode_prompt(runtime.tokenizer, text, chat=True)
        answer = engine.generate(prompt, SamplingParams(), max_new).token_ids  # greedy: the target's own answer
        draft.reset()
        logits = np.asarray(draft.forward(prompt + answer[:-1], num_logits=len(answer)), dtype=np.float64)
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        where = probs.argmax(axis=-1)
        top = probs[np.arange(len(where)), where]
        choice = where if ids_map is None else np.asarray(ids_map)[where]
        agrees = [bool(a == b) for a, b in zip(choice.tolist(), answer)]
        answers.append((agrees, top.tolist()))
        rows.append({"question_id": qid, "answer_tokens": len(answer), "agreement": sum(agrees) / len(agrees)})
    return answers, rows


def main(argv: list[str] | None = None) -> None:
    from specwise.lab.bench.runner import emit_json, script_header
    from specwise.models.threads import set_num_threads

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True, help="a model drafter spec, e.g. model:FILE?vocab=65536")
    ap.add_argument("--profile", required=True, help="`specwise profile --json` of the target with this drafter")
    ap.add_argument("--category", default="coding")
    ap.add_argument("--questions", type=int, default=10)
    ap.add_argument("--prompts", help="a *.prompts.jsonl file of human-written prompts instead of the questions")
    ap.add_argument(
        "--questions-file",
        default=os.environ.get("SPECWISE_QUESTIONS"),
        help="Spec-Bench's question.jsonl (default: $SPECWISE_QUESTIONS, else the project's prompts)",
    )
    ap.add_argument("--skip", type=int, default=1, help="with --prompts: every skip-th prompt")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    set_num_threads(args.threads)
    try:
        profile = json.loads(Path(args.profile).read_text())
        passes = {int(k): float(v) for k, v in profile["forward_seconds"].items()}
        draft_pass = float(profile["drafter_seconds_per_token"])
        chosen = _questions(args.prompts, args.category, args.questions, args.skip, args.questions_file)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(
            f"error: {err!r} reading --profile {args.profile} or --prompts {args.prompts}: give --profile the JSON "
            "of `specwise profile --json --drafter model:…` and --prompts a *.prompts.jsonl file"
        ) from None
    answers, rows = _answers(args.target, args.drafter, chosen, args.max_new_tokens)
    positions = sum(len(a) for a, _ in answers)
    agreement = sum(sum(a) for a, _ in answers) / positions
    results = [replay(answers, passes, draft_pass, "oracle")]
    results += [replay(answers, passes, draft_pass, "fixed", g) for g in range(1, max(passes))]
    levels = [round(0.05 * i, 2) for i in range(1, 20)]
    results += [replay(answers, passes, draft_pass, "product", s) for s in levels]
    results += [replay(answers, passes, draft_pass, "ahead", s, go=g) for s in levels for g in GO]
    best = {rule: max((r for r in results if r["rule"] == rule), key=lambda r: r["speedup"]) for rule in
            ("oracle", "fixed", "product", "ahead")}  # fmt: skip
    # how well the draft's probability predicts agreement: agreement rate by probability band
    bands = []
    for lo in (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99):
        hi = {0.0: 0.3, 0.3: 0.5, 0.5: 0.7, 0.7: 0.8, 0.8: 0.9, 0.9: 0.95, 0.95: 0.99, 0.99: 1.01}[lo]
        sel = [a for ag, pr in answers for a, p in zip(ag, pr) if lo <= p < hi]
        bands.append({"probability": [lo, min(hi, 1.0)], "positions": len(sel),
                      "agreement": sum(sel) / len(sel) if sel else None})  # fmt: skip
    out = {
        **script_header(argv),
        "target": args.target,
        "drafter": args.drafter,
        "profile": args.profile,
        "pass_seconds": passes,
        "draft_pass_seconds": draft_pass,
        "positions": positions,
        "agreement": agreement,
        "agreement_by_probability": bands,
        "best": best,
        "rules": results,
        "questions": rows,
    }
    emit_json(out, args.out)
    for rule, r in best.items():
        print(f"{rule:8s} level {r['level']:<5} speedup {r['speedup']:.3f} tokens/step {r['tokens_per_step']:.2f}")
    print(f"agreement {agreement:.3f} over {positions} positions")


if __name__ == "__main__":
    main()
