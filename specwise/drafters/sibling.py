"""Finding a draft model for a target without being told: a smaller GGUF model of the same vocabulary among the
files on this machine, for ``--drafter auto``: the GGUF files beside the target, then the fetch cache (filled by
``python -m specwise.lab.bench.fetch`` from the catalogue of known files, :data:`specwise.artifacts.KNOWN_GGUFS`),
then the embedded default model. A file is judged by its metadata and vocabulary, never by its name: a sibling saved
as ``qwen2.5-coder-0.5b-instruct-q4_k_m.gguf`` or ``draft.gguf`` is found alike. The search is bounded: a file at
least as large as the target is never opened (a draft that reads as many bytes as the target cannot pay), at most
MAX_CANDIDATES headers are read (tens of milliseconds each: the reader skips the arrays it is not asked for), and a
token list is read only for a candidate with as many tokens as the target's."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = [
    "DRAFT_VOCAB_SIZE",
    "MAX_CANDIDATES",
    "auto_model_spec",
    "candidate_files",
    "find_sibling",
    "missing_sibling_hint",
    "sibling_folders",
]

# the draft vocabulary `auto` gives a sibling when a ranking is shipped for the target's tokenizer: on
# Qwen2.5-Coder-1.5B with the 0.5B sibling (5 coding prompts, greedy, a busy machine: indicative), 65,536 tokens
# kept the full vocabulary's first-position acceptance (0.93 / 0.91) with a 43 MB smaller output layer; 32,768 and
# 49,152 lost acceptance on code (benchmarks/experiments/draft_vocab.py measures coverage, acceptance and cost by size)
DRAFT_VOCAB_SIZE = 65536
MAX_CANDIDATES = 64  # GGUF headers read by one search
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


def sibling_folders(target_path: Path | str) -> list[Path]:
    """Where ``auto`` looks for a sibling of the GGUF target at ``target_path``: its own folder, then the fetch
    cache."""
    from specwise.files import gguf_dir

    return [Path(target_path).parent, gguf_dir()]


def _default_model() -> list[Path]:
    """The embedded default model's file, where it is installed (a sibling of targets of SmolLM2's vocabulary)."""
    from specwise.models.loader import default_gguf_path

    try:
        return [default_gguf_path()]
    except FileNotFoundError:
        return []


def candidate_files(target_path: Path | str, folders: list[Path], extra: list[Path] = ()) -> list[Path]:
    """The ``.gguf`` files of ``folders`` (in order, each sorted by name), then ``extra``, that may be a draft model
    for the target: each file once, the target itself left out, none at least as large as the target's file, at
    most MAX_CANDIDATES."""
    target_path = Path(target_path)
    try:
        limit = target_path.stat().st_size
    except OSError:
        return []
    seen = {target_path.resolve()}
    out: list[Path] = []
    paths = [p for folder in folders for p in sorted(Path(folder).glob("*.gguf"))] + list(extra)
    for path in paths:
        try:
            real = path.resolve()
            if real in seen or not real.is_file() or real.stat().st_size >= limit:
                continue
        except OSError:
            continue
        seen.add(real)
        out.append(path)
        if len(out) >= MAX_CANDIDATES:
            break
    return out


def find_sibling(target_path: Path | str, folders: list[Path] | None = None) -> Path | None:
    """The draft model for the GGUF target at ``target_path``: among the ``.gguf`` files of ``folders`` (default:
    :func:`sibling_folders`, then the embedded default model; see :func:`candidate_files`), one with the target's
    tokenizer model and vocabulary (the same tokens, id for id), fewer weights, and a file the quantized native
    model runs; of several, those of the target's own model family and fine-tune (the file's ``general.basename``
    and ``general.finetune``) first, then the smallest. None when there is none."""
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
    kind = target.get("tokenizer.ggml.model")
    family = (target.get("general.basename"), str(target.get("general.finetune") or "").split("-")[0])
    best = None
    if folders is None:
        paths = candidate_files(target_path, sibling_folders(target_path), _default_model())
    else:
        paths = candidate_files(target_path, folders)
    for path in paths:
        meta = _gguf(path)
        if meta is None or meta.array_length("tokenizer.ggml.tokens") != count:
            continue
        if meta.get("tokenizer.ggml.model") != kind:
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
    """``ngram+model:SIBLING`` (with ``?vocab=DRAFT_VOCAB_SIZE`` where a ranking is shipped for the tokenizer) for a
    GGUF target whose smaller sibling is on this machine (:func:`find_sibling`), else None."""
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
                f"no smaller model of {target.name}'s vocabulary beside it or in the fetch cache: its sibling "
                f"{source.filename} would draft for it (model: or ngram+model:, about 1.3-1.6x plain decoding "
                f"measured on Qwen2.5-Coder-1.5B); fetch it with `python -m specwise.lab.bench.fetch {key}` (or put "
                "it beside the target) and --drafter auto uses it"
            )
    return None
