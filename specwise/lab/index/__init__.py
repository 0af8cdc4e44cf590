"""Building the `suffix` drafter's global index: ``specwise index``.

The target answers requests one at a time through the engine (greedy, and sampled at the temperatures given in
turn): human-written prompts (``*.prompts.jsonl`` files; by default the prompts shipped with specwise), tasks on
passages of the user's plain-text corpus (``--corpus-dir``) and requests the target writes itself (the formats:
:mod:`specwise.lab.answers`). Never benchmark questions. Each answer is kept with the last few tokens of its
prompt (:data:`specwise.drafters.suffix.LEAD`) and indexed by :class:`specwise.drafters.suffix.SuffixIndex`.

The answers are saved in chunks under a data directory as they come, so an interrupted run continues where it
stopped (a rerun with a larger ``--max-prompts`` or ``--budget-tokens`` extends the same chunks); the index is
written atomically at the end, with the target's identity.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specwise.files import cache_dir, safe_name, write_json_atomic
from specwise.lab.answers import AnswerOptions, Generate, answer_in_chunks, check_plan

__all__ = ["IndexOptions", "build_index", "calibrate", "default_data_dir", "run_index"]


@dataclass
class IndexOptions(AnswerOptions):
    """What ``specwise index`` answers (:class:`specwise.lab.answers.AnswerOptions`) and the index it writes."""

    out: Path = Path("index")
    max_new_tokens: int = 256
    temperatures: tuple[float, ...] = (0.0, 0.0, 0.8)  # request j at temperatures[j % n]
    budget_tokens: int | None = None  # stop once this many tokens are generated (None: answer every request)
    max_prompt_tokens: int = 512
    chunk: int = 32  # answers per saved chunk
    max_index_mb: float = 16.0


def default_data_dir(target: str) -> Path:
    """Where the answers for an index of ``target`` are kept by default."""
    return cache_dir() / "index" / safe_name(target)


def build_index(
    requests: list[list[int]],
    generate: Generate,
    data_dir: Path,
    out: Path,
    info: dict,
    temperatures: tuple[float, ...] = (0.0,),
    seed: int = 0,
    max_requests: int | None = None,
    budget_tokens: int | None = None,
    chunk: int = 32,
    max_index_mb: float = 16.0,
    calibration_answers: int = 300,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    """Answer ``requests`` (prompt token ids) with ``generate`` in chunks saved under ``data_dir`` (resumable),
    then write the index of the answers to ``out``.

    Request j is answered at ``temperatures[j % len]`` with seed ``seed * 1_000_003 + j``; the budget is checked
    before each answer. info: the index's metadata (``target``: the identity; the rest is kept as given).
    The drafts' confidences are fitted (:func:`calibrate`) on up to ``calibration_answers`` greedy answers held out
    of an index of the others. Returns a report: tokens, tokens/s of this run's generation, the index's size.
    """
    from specwise.drafters.suffix import LEAD, SuffixIndex

    data_dir.mkdir(parents=True, exist_ok=True)
    plan = {
        "target": info.get("target", {}).get("name"),
        "fingerprint": info.get("target", {}).get("fingerprint"),
        "requests_sha256": hashlib.sha256(json.dumps(requests).encode()).hexdigest(),
        "temperatures": list(temperatures),
        "seed": seed,
        "chunk": chunk,
        "max_new_tokens": info.get("build", {}).get("max_new_tokens"),
    }
    check_plan(data_dir, plan)
    todo = requests if max_requests is None else requests[:max_requests]
    done = answer_in_chunks(todo, generate, data_dir, temperatures, seed, chunk, budget_tokens, progress)
    generated, run_tokens, run_seconds = done.generated, done.this_run, done.seconds
    sequences: list[list[int]] = []
    greedy: list[tuple[list[int], list[int], int]] = []  # greedy answers (prompt, answer, place in sequences)
    for j, (prompt, answer) in enumerate(zip(todo, (a for answers in done.chunks for a in answers))):
        if answer:
            sequences.append(prompt[-LEAD:] + answer)
            if temperatures[j % len(temperatures)] == 0:
                greedy.append((prompt, answer, len(sequences) - 1))
    per_token = 2 if info.get("target", {}).get("vocab_size", 1 << 20) < 0xFFFF else 4
    budget = int(max_index_mb * 2**20) // (per_token + 4)  # token ids and the suffix array
    size = sum(len(s) + 1 for s in sequences)
    if size > budget:
        keep, total = 0, 0
        while keep < len(sequences) and total + len(sequences[keep]) + 1 <= budget:
            total += len(sequences[keep]) + 1
            keep += 1
        log(f"index: keeping the first {keep} of {len(sequences)} answers ({max_index_mb:g} MB at most)")
        sequences = sequences[:keep]
    build = dict(info.get("build", {}))
    build.update({"answers": len(sequences), "generated_tokens": generated})
    held = greedy[::10][:calibration_answers]  # every 10th greedy answer, held out
    out_of_train = {place for _, _, place in held}
    train = [seq for place, seq in enumerate(sequences) if place not in out_of_train]
    fitted = calibrate(train, [(prompt, answer) for prompt, answer, _ in held])
    if fitted:
        log(f"index: confidences fitted on {len(held)} held-out answers: {json.dumps(fitted)}")
    meta = {**info, "build": build, "calibration": fitted}
    index = SuffixIndex.from_sequences(sequences, info=meta)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    index.save(out)
    disk = sum(f.stat().st_size for f in Path(out).iterdir())
    return {
        "out": str(out),
        "answers": len(sequences),
        "indexed_tokens": len(index),
        "generated_tokens": generated,
        "generated_this_run": run_tokens,
        "tokens_per_second": round(run_tokens / run_seconds, 1) if run_seconds > 0 else None,
        "index_mb": round(disk / 2**20, 3),
    }


SMOOTH_GRID = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
HALF_GRID = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)


def calibrate(
    train: list[list[int]], held: list[tuple[list[int], list[int]]], k: int = 8, max_match: int = 24, min_match: int = 2
) -> dict:
    """(smooth, half) of the drafts' confidences (:func:`specwise.drafters.suffix.confidence`) for each source, fitted
    by likelihood on ``held`` (prompt, greedy answer) pairs with an index of ``train``.

    At every position of a held-out answer each source drafts ``k`` tokens, as the drafter does with its request's
    context (the prompt and the answer so far); each token up to the first wrong one is an event (its counts, the
    match length, whether it is the answer's next token): the probability that a token is accepted once the ones
    before it are. Sources with fewer than 50 events keep the defaults (absent from the result).
    """
    from specwise.drafters.suffix import LOCAL_ORDERS, NgramCounts, SuffixIndex

    index = SuffixIndex.from_sequences(train)
    orders = tuple(n for n in LOCAL_ORDERS if n <= max_match) + (max_match,)
    events: dict[str, list[tuple[int, int, int, bool]]] = {"index": [], "counts": []}

    def record(source, tokens, counts, length, truth, grow) -> None:
        for j, (token, (count, total)) in enumerate(zip(tokens, counts)):
            hit = j < len(truth) and token == truth[j]
            events[source].append((count, total, length + j if grow else length, hit))
            if not hit:
                break

    for prompt, answer in held:
        local = NgramCounts(orders)
        done = 0
        for i in range(len(answer)):
            context = prompt + answer[:i]
            local.extend(context, done)
            done = len(context)
            truth = answer[i : i + k]
            match = index.match(context, max_match, min_match)
            if match[0]:
                tokens, _, counts = index.draft(match, k, 0.0, 1.0, 1.0)
                record("index", tokens, counts, match[0], truth, grow=True)
            n, tokens, _, counts = local.draft(context, k, max_match, min_match, 0.0, 1.0, 1.0)
            record("counts", tokens, counts, n, truth, grow=False)
    fitted = {}
    for source, rows in events.items():
        if len(rows) < 50:
            continue
        c, total, length, hit = (np.array(col, dtype=np.float64) for col in zip(*rows))
        best = None
        for smooth in SMOOTH_GRID:
            for half in HALF_GRID:
                q = np.clip((c + smooth * length / (length + half)) / (total + smooth), 1e-6, 1 - 1e-6)
                loglik = float(np.mean(hit * np.log(q) + (1 - hit) * np.log1p(-q)))
                if best is None or loglik > best[0]:
                    best = (loglik, smooth, half, float(q.mean()))
        fitted[source] = {
            "smooth": best[1],
            "half": best[2],
            "events": len(rows),
            "acceptance": round(float(hit.mean()), 4),
            "mean_confidence": round(best[3], 4),
        }
    return fitted


def self_written_requests(engine, tokenizer, count: int, path: Path, seed: int, progress: bool = True) -> list[str]:
    """``count`` user requests the target writes itself (sampled at temperature 1 from the opening of a user turn,
    as in Magpie), cached in ``path`` (written after each one: an interrupted run continues)."""
    from specwise.lab.answers import progress_bar, request_cache, request_seed, user_turn_prefix
    from specwise.sampling import SamplingParams

    state = request_cache(path, user_turn_prefix(tokenizer), seed, "tries")
    prefix, kept = state["prefix"], state["prompts"]
    seen = set(kept)
    initial = min(len(kept), count)
    bar = progress_bar(count, "writing requests", "request", initial, progress)
    while len(kept) < count:
        if state["tries"] > 4 * count + 16:
            raise RuntimeError(f"the target wrote too few usable requests ({len(kept)} of {count})")
        params = SamplingParams(temperature=1.0, seed=request_seed(seed, state["tries"]))
        state["tries"] += 1
        result = engine.generate(prefix, params, max_new_tokens=96)
        ids = result.token_ids[:-1] if result.finish_reason == "stop" else []
        text = tokenizer.decode(ids, skip_special_tokens=True).strip() if len(ids) >= 6 else ""
        if text and text not in seen:
            seen.add(text)
            kept.append(text)
            bar.update(1)
        write_json_atomic(path, state)
    bar.close()
    return kept[:count]


def run_index(opts: IndexOptions, log: Callable[[str], None] = print) -> dict:
    """Load the target, gather the requests, answer them and write the index to ``opts.out``. Returns a report."""
    from specwise.drafters.suffix import index_identity
    from specwise.lab.answers import engine_answers, gather_prompts
    from specwise.runtime import build_runtime, encode_prompt

    prompts, tasks = gather_prompts(opts)  # checked before the model loads
    runtime = build_runtime(opts.target, drafter="ngram", gamma="auto", device=opts.device)
    loaded, engine, tok = runtime.target, runtime.engine, runtime.tokenizer
    data_dir = Path(opts.data_dir) if opts.data_dir else default_data_dir(loaded.name)
    data_dir.mkdir(parents=True, exist_ok=True)
    texts = prompts + tasks
    counts = {"prompts": len(prompts)}
    if tasks:
        counts["passages"] = len(tasks)
    if opts.self_prompts > 0:
        written = self_written_requests(
            engine, tok, opts.self_prompts, data_dir / "self_prompts.json", opts.seed, opts.progress
        )
        texts += written
        counts["self_prompts"] = len(written)
    random.Random(opts.seed).shuffle(texts)
    requests = [ids for ids in (encode_prompt(tok, t, chat=True) for t in texts) if len(ids) <= opts.max_prompt_tokens]
    log(f"index: {len(requests)} requests ({counts}), answering {opts.max_prompts or 'all'} -> {data_dir}")
    info = {
        "target": index_identity(loaded),
        "build": {
            "command": os.environ.get("SPECWISE_COMMAND", ""),
            "requests": counts,
            "max_new_tokens": opts.max_new_tokens,
            "temperatures": list(opts.temperatures),
            "seed": opts.seed,
        },
    }
    return build_index(
        requests,
        engine_answers(engine, opts.max_new_tokens),
        data_dir,
        Path(opts.out),
        info,
        temperatures=opts.temperatures,
        seed=opts.seed,
        max_requests=opts.max_prompts,
        budget_tokens=opts.budget_tokens,
        chunk=opts.chunk,
        max_index_mb=opts.max_index_mb,
        progress=opts.progress,
        log=log,
    )
