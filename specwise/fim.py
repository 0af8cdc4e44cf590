"""Fill in the middle (FIM): the text before a cursor (the prefix) and after it (the suffix) in, the middle out.

A code model trained for infilling reads the prefix and the suffix between its own special tokens and writes the
middle after a "middle" token, ending it with an end-of-generation token. :func:`fim_tokens` finds those tokens
of a model: from the GGUF metadata (``tokenizer.ggml.fim_pre_token_id``, ``fim_suf``, ``fim_mid``, ``fim_pad``,
``fim_rep``, ``fim_sep``, read by the loader and checked against the vocabulary) where the file names them, else
by their names in the vocabulary:

- Qwen2.5-Coder: ``<|fim_prefix|>``, ``<|fim_suffix|>``, ``<|fim_middle|>``, ``<|fim_pad|>``, ``<|repo_name|>``,
  ``<|file_sep|>``;
- StarCoder: ``<fim_prefix>``, ``<fim_suffix>``, ``<fim_middle>``, ``<fim_pad>``, ``<repo_name>``, ``<file_sep>``;
- CodeLlama: ``▁<PRE>``, ``▁<SUF>``, ``▁<MID>`` (and ``▁<EOT>`` to end).

:func:`fim_prompt` lays out a prompt in prefix-suffix-middle order (each text piece tokenized on its own, so that
nothing merges across a special token)::

    [BOS] <PRE> prefix <SUF> suffix <MID> middle

With files of context (``extra``) and a model that has the repository and file-separator tokens, the
repository-level layout Qwen2.5-Coder was trained on::

    <REPO>{repo_name}\\n<SEP>{file 1 name}\\n{file 1 text}\\n<SEP>{file 2 name}\\n{file 2 text}\\n...
    <SEP>{filename}\\n<PRE> prefix <SUF> suffix <MID> middle

(each file's text ends with a newline, added where it has none). A model without those tokens gets the files'
texts, each ending with a newline, before ``<PRE>``.

``middle`` is the start of the middle that the caller already knows (llama.cpp's ``prompt`` of ``/infill``): the
model continues it. Generation ends at the model's end-of-sequence token and at :meth:`FimTokens.stop_ids`: the
padding, repository and file-separator tokens, and ``<|endoftext|>`` (``<EOT>`` for CodeLlama) where the
vocabulary has it. The prompt holds the suffix, so prompt lookup (the ``ngram`` drafter) and the ``suffix``
drafter's request counts draft from it: a middle that runs into the suffix's first tokens is drafted from there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from specwise.models.gguf_config import FIM_METADATA_KEYS  # role -> GGUF metadata key (llama.cpp's names)

__all__ = [
    "FIM_METADATA_KEYS",
    "FimTokens",
    "FimUnsupported",
    "engine_eos",
    "fim_prompt",
    "fim_stop_ids",
    "fim_tokens",
    "require_fim",
]

_REQUIRED = ("prefix", "suffix", "middle")
_OPTIONAL = ("pad", "repo", "file_sep")


@dataclass(frozen=True)
class _Style:
    """The names of one family's FIM tokens in a vocabulary."""

    prefix: str
    suffix: str
    middle: str
    pad: str | None = None
    repo: str | None = None
    file_sep: str | None = None
    ends: tuple[str, ...] = ()  # other end-of-generation tokens


STYLES = {
    "qwen": _Style(
        "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
        ("<|endoftext|>",),
    ),
    "starcoder": _Style(
        "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>", "<repo_name>", "<file_sep>", ("<|endoftext|>",)
    ),
    "codellama": _Style("▁<PRE>", "▁<SUF>", "▁<MID>", ends=("▁<EOT>", "<EOT>")),
}  # fmt: skip


class FimUnsupported(ValueError):
    """The model has no fill-in-the-middle tokens."""


@dataclass(frozen=True)
class FimTokens:
    """A model's fill-in-the-middle token ids.

    prefix, suffix, middle: the tokens that open the prefix, the suffix and the middle.
    pad, repo, file_sep: the padding token, the repository-name token and the file separator (None: absent).
    ends: other tokens that end a middle (``<|endoftext|>``, CodeLlama's ``<EOT>``).
    source: where they were found: ``metadata`` (the GGUF file's) or the style whose names matched.
    """

    prefix: int
    suffix: int
    middle: int
    pad: int | None = None
    repo: int | None = None
    file_sep: int | None = None
    ends: tuple[int, ...] = ()
    source: str = "metadata"

    @property
    def repo_level(self) -> bool:
        """Whether the model has the tokens of the repository-level layout (repository name, file separator)."""
        return self.repo is not None and self.file_sep is not None

    def special_ids(self) -> set[int]:
        """Every FIM token id (a prompt given as token ids holding one is already a FIM prompt)."""
        ids = {self.prefix, self.suffix, self.middle, self.pad, self.repo, self.file_sep}
        return {i for i in ids if i is not None}

    def stop_ids(self) -> set[int]:
        """The tokens that end a middle, besides the model's end-of-sequence token."""
        return {i for i in (self.pad, self.repo, self.file_sep, *self.ends) if i is not None}


def fim_tokens(source, metadata: dict[str, int] | None = None, vocab_size: int | None = None) -> FimTokens | None:
    """The FIM tokens of ``source`` (a LoadedModel, or a tokenizer), or None when it has none.

    metadata: role -> id from the GGUF file (``prefix``, ``suffix``, ``middle``, ``pad``, ``repo``, ``file_sep``;
    a LoadedModel carries them as ``fim_token_ids``). It wins where it names all of prefix, suffix and middle; the
    vocabulary's names fill in the optional roles it does not name.
    vocab_size: the model's vocabulary (a LoadedModel's model gives it): a named token past it is not the model's.
    """
    tokenizer, metadata, vocab_size = _parts(source, metadata, vocab_size)
    named = _by_name(tokenizer, vocab_size)
    if metadata and all(role in metadata for role in _REQUIRED):
        fields = {role: metadata[role] for role in (*_REQUIRED, *_OPTIONAL) if role in metadata}
        if named is not None:
            fields |= {role: getattr(named, role) for role in _OPTIONAL if role not in fields}
            fields["ends"] = named.ends
        return FimTokens(**fields, source="metadata")
    return named


def require_fim(source, metadata: dict[str, int] | None = None) -> FimTokens:
    """:func:`fim_tokens`, or FimUnsupported naming what the model lacks."""
    found = fim_tokens(source, metadata)
    if found is None:
        raise FimUnsupported(
            "this model has no fill-in-the-middle tokens (no tokenizer.ggml.fim_* metadata, and none of "
            "<|fim_prefix|>, <fim_prefix> or ▁<PRE> in its vocabulary): use a code model trained for infilling, "
            "such as Qwen2.5-Coder"
        )
    return found


def fim_stop_ids(fim: FimTokens, eos: Iterable[int] | None) -> set[int]:
    """The tokens that end a middle: ``eos`` (the model's end-of-sequence tokens) and the FIM stop tokens."""
    return set(eos or ()) | fim.stop_ids()


def engine_eos(engine) -> set[int]:
    """The end-of-sequence tokens an Engine stops at when a request names none (``Engine.eos_ids``)."""
    return engine.eos_ids()


def fim_prompt(
    tokenizer,
    fim: FimTokens,
    prefix: str | Sequence[int],
    suffix: str | Sequence[int],
    middle: str | Sequence[int] = "",
    *,
    extra: Sequence[tuple[str, str]] = (),
    repo_name: str = "project",
    filename: str = "file",
    encode: Callable[[str], list[int]] | None = None,
) -> list[int]:
    """The token ids of a FIM prompt (the layout is the module's docstring's).

    prefix, suffix, middle: text, or token ids taken as they are.
    extra: files of context, as (filename, text) pairs.
    repo_name, filename: the repository's and the current file's names (the repository-level layout only).
    encode: text -> token ids without special tokens (default: ``tokenizer.encode(text, add_special_tokens=False)``).
    """
    if encode is None:
        encode = _encoder(tokenizer)

    def ids(piece: str | Sequence[int]) -> list[int]:
        if isinstance(piece, str):
            return list(encode(piece)) if piece else []
        return [int(t) for t in piece]

    out = _leading(tokenizer)
    if extra and fim.repo_level:
        out += [fim.repo, *ids(f"{repo_name}\n")]
        for name, text in extra:
            out += [fim.file_sep, *ids(f"{name}\n{_line_ended(text)}")]
        out += [fim.file_sep, *ids(f"{filename}\n")]
    else:
        for _, text in extra:
            out += ids(_line_ended(text))
    return out + [fim.prefix, *ids(prefix), fim.suffix, *ids(suffix), fim.middle, *ids(middle)]


def _line_ended(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def _parts(source, metadata: dict[str, int] | None, vocab_size: int | None):
    """(tokenizer, metadata, the model's vocabulary size or None) of a LoadedModel or a tokenizer."""
    from specwise.models.loader import LoadedModel

    if isinstance(source, LoadedModel):
        metadata = metadata if metadata is not None else source.fim_token_ids
        vocab_size = vocab_size if vocab_size is not None else source.model.vocab_size
        return source.tokenizer, metadata, vocab_size
    return source, metadata, vocab_size


def _by_name(tokenizer, vocab_size: int | None) -> FimTokens | None:
    """The FIM tokens of the first style whose prefix, suffix and middle are all in the vocabulary."""
    if tokenizer is None:
        return None
    vocab = tokenizer.get_vocab()

    def find(name: str | None) -> int | None:
        token = vocab.get(name) if name is not None else None
        return token if token is not None and (vocab_size is None or 0 <= token < vocab_size) else None

    for style_name, style in STYLES.items():
        required = [find(getattr(style, role)) for role in _REQUIRED]
        if None in required:
            continue
        optional = {role: find(getattr(style, role)) for role in _OPTIONAL}
        ends = tuple(t for t in map(find, style.ends) if t is not None)
        return FimTokens(*required, **optional, ends=ends, source=style_name)
    return None


def _encoder(tokenizer) -> Callable[[str], list[int]]:
    def encode(text: str) -> list[int]:
        if tokenizer is None:
            raise ValueError("text needs a tokenizer: pass one, or give the prefix, suffix and middle as token ids")
        return list(tokenizer.encode(text, add_special_tokens=False))

    return encode


def _leading(tokenizer) -> list[int]:
    """The beginning-of-sequence token where the tokenizer starts every text with it, else nothing."""
    bos = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
    if bos is None:
        return []
    try:
        starts = list(tokenizer("", add_special_tokens=True)["input_ids"])
    except (TypeError, KeyError, ValueError):
        return []
    return [bos] if starts[:1] == [bos] else []
