"""Building a draft vocabulary's ranking (:mod:`specwise.drafters.vocab`; the file format is
:mod:`specwise.artifacts`') from the target's own answers: ``python -m specwise.lab.ranking``. The target answers
instruction prompts through the batch engine; its tokens are ranked by how often the answers use them, then the
prompts', then the texts'."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from specwise.artifacts import fingerprint, write_ranking

__all__ = ["main", "rank_tokens", "read_answers", "sampled_prompts"]


def rank_tokens(counts: list[np.ndarray], vocab_size: int, always: Iterable[int] = (), size: int | None = None):
    """Token ids ranked by ``counts`` (one ``[vocab_size]`` array per source, in order of trust: the first decides,
    each later one breaks the earlier ones' ties), then by id (a BPE vocabulary's lower ids are its earlier, more
    frequent merges); ``always`` first. Returns int64 ``[size or vocab_size]``."""
    keys = [np.arange(vocab_size, dtype=np.int64)]  # lexsort: the last key is the primary one
    for c in reversed(counts):
        keys.append(-np.asarray(c, dtype=np.int64))
    first = np.zeros(vocab_size, dtype=np.int64)
    first[[int(t) for t in always]] = -1
    keys.append(first)
    order = np.lexsort(keys)
    return order[: size or vocab_size]


def sampled_prompts(paths: list[Path], per_file: int, seed: int) -> list[str]:
    """Up to ``per_file`` prompts (the ``prompt`` field of a JSONL file) from each file, a seeded sample, the files
    taken in turn (any first part of the list mixes them)."""
    rng = np.random.default_rng(seed)
    picked = []
    for path in paths:
        with open(path, encoding="utf-8") as f:  # lines end at "\n" only (a prompt may hold U+2028)
            rows = [json.loads(line)["prompt"] for line in f if line.strip()]
        picked.append([rows[i] for i in rng.permutation(len(rows))[:per_file]])
    longest = max((len(rows) for rows in picked), default=0)
    return [rows[i] for i in range(longest) for rows in picked if i < len(rows)]


def read_answers(path: Path | None) -> list[list[int]]:
    """Answers saved by an earlier run (one JSON list of token ids a line); a cut last line is dropped."""
    if path is None or not path.is_file():
        return []
    answers = []
    for line in path.read_text().split("\n"):
        try:
            answers.append([int(t) for t in json.loads(line)])
        except (ValueError, TypeError):
            break
    return answers


def _answer_tokens(target, prompts: list[str], max_new_tokens: int, batch: int, saved: Path | None, log):
    """The target's greedy answers to ``prompts`` (chat template), decoded ``batch`` sequences together; with
    ``saved``, each chunk's answers are appended there and a run resumes after the answers already saved."""
    from specwise.batch import BatchEngine, Request
    from specwise.engine import Engine
    from specwise.runtime import encode_prompt, eos_ids
    from specwise.sampling import SamplingParams

    answers = read_answers(saved)[: len(prompts)]
    if saved is not None:
        saved.write_text("".join(json.dumps(a) + "\n" for a in answers))  # without a cut last line
    eos = eos_ids(target)
    engine = Engine(target.model, None, gamma=1, tokenizer=target.tokenizer, eos_token_ids=eos)
    runner = BatchEngine(engine, max_batch=batch)
    for start in range(len(answers), len(prompts), 2 * batch):
        chunk = prompts[start : start + 2 * batch]
        requests = [
            Request(encode_prompt(target.tokenizer, p, chat=True)[:1024], SamplingParams(), max_new_tokens)
            for p in chunk
        ]
        done = [[t for e in events for t in e.token_ids] for events in runner.run_all(requests)]
        answers.extend(done)
        if saved is not None:
            with open(saved, "a") as f:
                f.write("".join(json.dumps(a) + "\n" for a in done))
        log(f"answers: {len(answers)}/{len(prompts)}, {sum(map(len, answers)):,} tokens")
    return answers


def main(argv: list[str] | None = None) -> int:
    """``python -m specwise.lab.ranking``: build a ranking; a bad input is one line on stderr (exit 2)."""
    try:
        return _main(argv)
    except (OSError, ValueError, KeyError) as err:  # unreadable files, bad JSON lines, prompts without "prompt"
        what = f"a prompt line has no {err}" if isinstance(err, KeyError) else str(err).splitlines()[0]
        print(f"error: {what}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specwise.lab.ranking",
        description="Rank a target's vocabulary by how often the target writes each token (a draft vocabulary).",
    )
    parser.add_argument("--target", required=True, help="the target model (a .gguf file or an ID)")
    parser.add_argument("--out", required=True, help="the ranking .npy file to write")
    parser.add_argument("--prompts", nargs="*", default=[], help="JSONL files of instruction prompts ({'prompt'})")
    parser.add_argument(
        "--per-file", type=int, default=100, help="prompts the target answers from each file (0: none, only counted)"
    )
    parser.add_argument("--texts", nargs="*", default=[], help="text files (tokenized; ranks below the answers)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="answers decoded together")
    parser.add_argument("--size", type=int, default=65536, help="ids kept (the largest draft vocabulary offered)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--answers", help="keep the answers' token ids here (JSONL; a run resumes after them)")
    parser.add_argument("--use-answers", type=int, help="rank by the first N answers only (default: all)")
    args = parser.parse_args(argv)

    from specwise.models import load_model
    from specwise.runtime import eos_ids

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        target = load_model(args.target)
    except NotImplementedError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    vocab = int(target.model.vocab_size)
    tok = target.tokenizer
    prompts = sampled_prompts([Path(p) for p in args.prompts], args.per_file, args.seed)
    saved = Path(args.answers) if args.answers else None
    if prompts:
        answers = _answer_tokens(target, prompts, args.max_new_tokens, args.batch, saved, log)
    else:  # a ranking from the answers saved so far (another run may still be adding to them)
        answers = read_answers(saved)
    answers = answers if args.use_answers is None else answers[: args.use_answers]
    answer_counts = np.zeros(vocab, dtype=np.int64)
    for a in answers:
        answer_counts += np.bincount(np.asarray(a, dtype=np.int64), minlength=vocab)[:vocab]

    def counts(texts: Iterable[str]) -> np.ndarray:
        total = np.zeros(vocab, dtype=np.int64)
        for text in texts:
            ids = np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
            total += np.bincount(ids, minlength=vocab)[:vocab]
        return total

    # every prompt of the files (what people ask: the words answers take up), then the text files
    prompt_counts = counts(p for path in args.prompts for p in sampled_prompts([Path(path)], 1 << 30, args.seed))
    text_counts = counts(Path(p).read_text(errors="replace") for p in args.texts)
    order = [answer_counts, prompt_counts, text_counts]
    ranking = rank_tokens(order, vocab, sorted(eos_ids(target) or ()), args.size)
    write_ranking(args.out, ranking)
    seen, total = int((answer_counts > 0).sum()), int(answer_counts.sum())
    log(f"wrote {args.out}: {len(ranking):,} ids; {seen:,} distinct tokens in {total:,} answer tokens")
    log(f"tokenizer fingerprint {fingerprint(tok)[:16]} (a shipped ranking is named {fingerprint(tok)[:16]}.npy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
