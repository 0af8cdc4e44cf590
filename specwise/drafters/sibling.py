"""Finding a draft model for a target without being told: a smaller GGUF model of the same vocabulary among the
files on this machine (the fetch cache, filled by ``python -m specwise.lab.bench.fetch`` from the catalogue of
known files, :data:`specwise.artifacts.KNOWN_GGUFS`), for ``--drafter auto``."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["DRAFT_VOCAB_SIZE", "auto_model_spec", "find_sibling", "missing_sibling_hint"]

# the draft vocabulary `auto` gives a sibling when a ranking is shipped for the target's tokenizer: on
# Qwen2.5-Coder-1.5B with the 0.5B sibling (5 coding prompts, greedy, a busy machine: indicative), 65,536 tokens
# kept the full vocabulary's first-position acceptance (0.93 / 0.91) with a 43 MB smaller output layer; 32,768 and
# 49,152 lost acceptance on code (benchmarks/experiments/draft_vocab.py measures coverage, acceptance and cost by size)
DRAFT_VOCAB_SIZE = 65536
_SIZE = re.compile(r"(?<![0-9.])(\d+(?:\.\d+)?)[bB](?![a-zA-Z])")


def _parameters(meta) -> int:
    """Weights in the file (every tensor's element count)."""
    total = 0
    for info in meta.tensors.values():
        n = 1
        for d in info.shape:
            n *= int(d)
        total += n
    return total


def _tokens(meta) -> list | None:
    tokens = meta.array("tokenizer.ggml.tokens")
    return None if tokens is None else list(tokens)


def _gguf(path: Path):
    from specwise.models.gguf_file import GGUFError, GGUFFile

    try:
        return GGUFFile(path)
    except (GGUFError, OSError, ValueError):
        return None


def find_sibling(target_path: Path | str, folders: list[Path] | None = None) -> Path | None:
    """The draft model for the GGUF target at ``target_path``: among the ``.gguf`` files of ``folders`` (default:
    the fetch cache), one with the target's vocabulary (the same tokens, id for id), fewer weights, and a file the
    quantized native model runs; of several, those of the target's own model family and fine-tune (the file's
    ``general.basename`` and ``general.finetune``) first, then the smallest. None when there is none."""
    from specwise.files import gguf_dir
    from specwise.models.quantized import GGUFConfig

    target_path = Path(target_path)
    target = _gguf(target_path)
    if target is None:
        return None
    count = target.array_length("tokenizer.ggml.tokens")
    if not count:
        return None
    target_tokens: list | None = None  # read only when a candidate has as many tokens (262,144 strings: 40 MiB)
    target_size = _parameters(target)
    family = (target.get("general.basename"), str(target.get("general.finetune") or "").split("-")[0])
    best = None
    for folder in folders if folders is not None else [gguf_dir()]:
        for path in sorted(Path(folder).glob("*.gguf")):
            if path.resolve() == target_path.resolve():
                continue
            meta = _gguf(path)
            if meta is None or meta.array_length("tokenizer.ggml.tokens") != count:
                continue
            size = _parameters(meta)
            if size >= target_size:
                continue
            if target_tokens is None:
                target_tokens = _tokens(target)
            if _tokens(meta) != target_tokens:
                continue
            try:
                if GGUFConfig(meta).unsupported(meta) is not None:
                    continue
            except Exception:  # a damaged file is no candidate  # noqa: BLE001
                continue
            same = (meta.get("general.basename"), str(meta.get("general.finetune") or "").split("-")[0]) == family
            key = (not same, size, path.name)
            if best is None or key < best[0]:
                best = (key, path)
    return None if best is None else best[1]


def auto_model_spec(target_path: Path | str, tokenizer, folders: list[Path] | None = None) -> str | None:
    """``ngram+model:SIBLING`` (with ``?vocab=32768`` where a ranking is shipped for the tokenizer) for a GGUF target
    whose smaller sibling is on this machine, else None."""
    from specwise.artifacts import shipped_ranking

    sibling = find_sibling(target_path, folders)
    if sibling is None:
        return None
    vocab = f"?vocab={DRAFT_VOCAB_SIZE}" if shipped_ranking(tokenizer) is not None else ""
    return f"ngram+model:{sibling}{vocab}"


def _size_label(name: str) -> float | None:
    match = _SIZE.search(name)
    return float(match[1]) if match else None


def missing_sibling_hint(target_path: Path | str) -> str | None:
    """One line for a GGUF target without a sibling on this machine when ``python -m specwise.lab.bench.fetch`` knows a
    smaller model of its family (a known file whose name starts like the target's and names fewer parameters)."""
    from specwise.artifacts import KNOWN_GGUFS

    target = Path(target_path)
    meta = _gguf(target)
    base = meta.get("general.basename") if meta is not None else None
    own = _size_label(target.name)
    if not base or own is None:
        return None
    for key, source in sorted(KNOWN_GGUFS.items()):
        size = _size_label(source.filename)
        if source.filename.lower().startswith(str(base).lower() + "-") and size is not None and size < own:
            return (
                f"no draft model for {target.name} on this machine: its sibling {source.filename} would draft for "
                f"it (model: or ngram+model:, about 1.3-1.6x plain decoding measured on Qwen2.5-Coder-1.5B); "
                f"fetch it with `python -m specwise.lab.bench.fetch {key}` and --drafter auto uses it"
            )
    return None
