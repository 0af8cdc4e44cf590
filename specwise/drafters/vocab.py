"""Draft vocabularies: the part of the target's vocabulary a draft model drafts from.

A draft model's output layer is a large share of what one of its tokens costs (Qwen2.5-Coder-0.5B: 151,936 rows of
896, about a quarter of its weights). Over a subset of the vocabulary, the tokens the target actually writes, it
reads that much less per token. The output stays exact: q is a distribution over the subset (zero elsewhere) and
the target verifies every drafted token with its full p; a token outside the subset is never drafted.

A **ranking** is the target's vocabulary ordered by how often the target writes each token, most frequent first
(the first N ids are the draft vocabulary of size N). It is an ``.npy`` file of token ids (uint32, int32 or int64),
read without unpickling and checked against the target's vocabulary (range, uniqueness, size). Rankings shipped
with specwise live in ``specwise/shipped/vocabs/<fingerprint>.npy``, named by the fingerprint of the tokenizer
they rank (:func:`fingerprint`); the format is :mod:`specwise.artifacts`'. ``python -m specwise.lab.ranking``
builds one from the target's own answers to instruction prompts and from text corpora (never from benchmark
questions).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specwise.artifacts import (
    RANKING_REBUILD,
    DraftVocabError,
    fingerprint,
    read_ranking,
    refuse_ranking,
    shipped_ranking,
    write_ranking,
)

__all__ = [
    "DraftVocabError",
    "draft_vocabulary",
    "fingerprint",
    "parse_model_spec",
    "read_ranking",
    "restrict_draft_output",
    "shipped_ranking",
    "write_ranking",
]


def draft_vocabulary(size: int | None, ranking: Path | str | None, tokenizer, vocab_size: int, always=()) -> np.ndarray:
    """The draft vocabulary (sorted int64 token ids) of ``size`` tokens: the first ``size`` ids of ``ranking`` (a
    file; None: the ranking shipped for ``tokenizer``), plus the ids in ``always`` (end-of-sequence tokens) where
    the ranking's first ``size`` lack them. ``size`` None takes the whole ranking."""
    if size is not None and not 1 <= size <= vocab_size:
        raise DraftVocabError(
            f"draft vocabulary size {size}: give 1 to {vocab_size} (the tokens of the model's output layer)"
        )
    if ranking is None:
        ranking = shipped_ranking(tokenizer)
        if ranking is None:
            raise DraftVocabError(
                f"no draft vocabulary ranking is shipped for this target's tokenizer: {RANKING_REBUILD}, then add "
                "&ranking=FILE to the drafter spec"
            )
    ids = read_ranking(ranking, vocab_size)
    if size is not None and size > ids.size:
        refuse_ranking(
            ranking,
            f"ranks {ids.size:,} token ids, fewer than the draft vocabulary of {size:,} asked for",
            f"ask for at most {ids.size:,}, or {RANKING_REBUILD} --size {size}",
        )
    chosen = ids if size is None else ids[:size]
    extra = [int(t) for t in always if 0 <= int(t) < vocab_size]
    return np.unique(np.concatenate([chosen, np.asarray(extra, dtype=np.int64)]))


def restrict_draft_output(model, options: dict[str, str], tokenizer, always=()) -> np.ndarray:
    """Restrict a draft ``model``'s output layer to its draft vocabulary (``options``: a ``model:`` spec's ``vocab``
    and ``ranking``; ``tokenizer``: the vocabulary ranked, its shipped ranking where no file is named; ``always``:
    ids kept whatever the ranking says, see :func:`draft_vocabulary`). Returns the kept ids (sorted): its logits'
    columns. Refused for a model whose output layer cannot be cut (not the quantized native model)."""
    from specwise.models.base import OutputRows

    size = vocab_size_option(options["vocab"])
    if not isinstance(model, OutputRows):
        raise ValueError(
            f"a draft vocabulary (vocab={options['vocab']}) needs a GGUF draft model on the CPU (the quantized native "
            "model): use a .gguf draft, or drop ?vocab="
        )
    ids = draft_vocabulary(size, options.get("ranking"), tokenizer, int(model.vocab_size), always)
    model.restrict_output(ids)
    return ids


def parse_model_spec(arg: str, kind: str = "model") -> tuple[str, dict[str, str]]:
    """Split a ``model:`` drafter's argument ``ID?key=value&key=value`` into the model ID and its options
    (``vocab``: a draft vocabulary size, ``ranking``: a ranking file, ``lookup``: the longest match of greedy drafting
    on the draft model itself, ``lookahead``: the guess of the next token's probability that decides whether a draft
    pass is spent on it, see ModelDrafter; ``method``: how a draft model of another vocabulary drafts, see
    :mod:`specwise.drafters.cross_vocab`). Unknown or repeated keys are refused. ``kind="self"``: the options of the
    `self` drafter's ``?...`` (``vocab`` and ``ranking`` only; no ID)."""
    model_id, sep, query = arg.partition("?")
    options: dict[str, str] = {}
    if not sep:
        return model_id, options
    keys = ("vocab", "ranking", "lookup", "lookahead", "method") if kind == "model" else ("vocab", "ranking")
    for item in query.split("&"):
        key, eq, value = item.partition("=")
        if key not in keys or not eq or not value:
            if kind != "model":
                raise ValueError(
                    f"bad drafter option {item!r} in {kind}{arg}: {kind} takes vocab=N and ranking=FILE only, as in "
                    f"{kind}?vocab=16384"
                )
            raise ValueError(
                f"bad drafter option {item!r} in model:{arg}: use model:ID?vocab=N (a draft vocabulary of the N "
                "tokens the target writes most), optionally &ranking=FILE, lookup=N (the draft model checks "
                "prompt-lookup continuations of matches up to N tokens long), lookahead=X (0 < X <= 1: a greedy "
                "draft's next pass is spent while its confidence times X clears the stop level) and method=tli|slem "
                "(a draft model of another vocabulary: how it drafts across)"
            )
        if key in options:
            raise ValueError(f"drafter option {key!r} given twice in {'model:' if kind == 'model' else kind}{arg}")
        options[key] = value
    if "ranking" in options and "vocab" not in options:
        options["vocab"] = "all"
    return model_id, options


def lookup_option(options: dict[str, str]) -> int:
    """``lookup=N`` as an int (0 when absent), refused outside 1..8."""
    value = options.get("lookup")
    if value is None:
        return 0
    try:
        size = int(value)
    except ValueError:
        size = 0
    if not 1 <= size <= 8:
        raise ValueError(f"bad drafter option lookup={value!r}: give the longest match to look up, 1 to 8 (lookup=3)")
    return size


def lookahead_option(options: dict[str, str]) -> float:
    """``lookahead=X`` as a float (ModelDrafter's default when absent), refused outside (0, 1]."""
    from specwise.drafters.model import LOOKAHEAD

    value = options.get("lookahead")
    if value is None:
        return LOOKAHEAD
    try:
        guess = float(value)
    except ValueError:
        guess = 0.0
    if not 0 < guess <= 1:
        raise ValueError(
            f"bad drafter option lookahead={value!r}: give a probability in (0, 1] (1: a pass whenever the draft's "
            f"confidence clears the stop level; the default {LOOKAHEAD})"
        )
    return guess


def vocab_size_option(value: str) -> int | None:
    """``vocab=N`` as an int (``all``: None, the whole ranking)."""
    if value == "all":
        return None
    try:
        size = int(value)
    except ValueError:
        raise ValueError(f"bad drafter option vocab={value!r}: give a number of tokens, as in vocab=32768") from None
    if size < 1:
        raise ValueError(f"bad drafter option vocab={value!r}: give a number of tokens >= 1, as in vocab=32768")
    return size


if __name__ == "__main__":  # the former path of the ranking's builder, which is the lab's: run as a program, forward
    from specwise.lab.ranking import main

    raise SystemExit(main())
