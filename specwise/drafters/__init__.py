"""Drafters: `none` (plain decoding), `ngram` (prompt lookup), `model:ID` (a draft model), `head:DIR` (a trained
head on the target's features), `self` (the target's own layers and part of its output layer)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from specwise.drafters.base import Draft, Drafter
from specwise.drafters.model import LOOKAHEAD, ModelDrafter
from specwise.drafters.ngram import NgramDrafter
from specwise.drafters.none import NoDrafter
from specwise.drafters.prediction import PredictionDrafter

__all__ = [
    "Draft",
    "Drafter",
    "HeadDrafter",
    "TargetMismatchError",
    "ModelDrafter",
    "NgramDrafter",
    "NoDrafter",
    "PredictionDrafter",
    "VocabularyMismatchError",
    "DRAFTERS",
    "BuildContext",
    "DrafterSpec",
    "Method",
    "check_same_vocabulary",
    "build_drafter",
    "parse_spec",
    "make_drafter",
    "resolve_drafter_spec",
]


def __getattr__(name: str):
    """The head drafter's names, imported when first asked for (the head package is loaded only where it is used)."""
    if name in ("HeadDrafter", "TargetMismatchError"):
        from specwise.drafters import head

        return getattr(head, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DRAFTER_HELP = (
    "auto (suffix where an index of the target's answers is shipped, else ngram+head where a head is, else "
    "ngram+model:SIBLING?vocab=65536 where a smaller GGUF model of the target's vocabulary is beside it or in the "
    "fetch cache, else ngram+self where the target's output layer is most of what its pass reads and a ranking is "
    "shipped for its tokenizer, else ngram+model:default across vocabularies where the target reads at least about "
    "7 times the default model's bytes a pass, else ngram) | "
    "none | ngram[:MAX_N[:MIN_N]] | "
    "model:ID[?vocab=N[&ranking=FILE]] (ID: default, a .gguf file, a model directory or a hub id; vocab=N: draft "
    "from the N tokens the target writes most, a ranking shipped for its tokenizer or FILE; a model of another "
    "vocabulary drafts across it, ?method=tli|slem to choose how) | "
    "head[:DIR] (a head trained by `specwise distill`; plain `head` is the one shipped for the default model) | "
    "suffix[:DIR] (the target's earlier answers: an index built by `specwise index`, plain `suffix` the one shipped "
    "for the target if any, and the request's own tokens) | "
    "self[?vocab=N[&ranking=FILE]] (the target drafts with its own layers and the N rows of its output layer for "
    "the tokens it writes most, default 16384, from a ranking shipped for its tokenizer or FILE) | "
    "A+B (several drafters, e.g. ngram+head: each step uses the one expected to give the most tokens per second)"
)


class VocabularyMismatchError(ValueError):
    """The draft model does not share the target's vocabulary."""


def check_same_vocabulary(target_size: int, draft_size: int, target_tokenizer=None, draft_tokenizer=None) -> None:
    """Raise VocabularyMismatchError unless the draft's vocabulary is the target's, id for id.

    The draft's output layer may be narrower than the target's when the two tokenizers agree on every id of the
    draft's rows: converters pad a model's output layer, and its token list, to its own width (Qwen2.5-0.5B and
    1.5B: 151,936 rows; 7B: 152,064, its extra ids "[PAD151936]" ...), and the draft never proposes the target's
    ids past its rows (q is zero there; the target's verification keeps the output exact)."""
    narrower = draft_size < target_size and target_tokenizer is not None and draft_tokenizer is not None
    if target_size != draft_size and not narrower:
        raise VocabularyMismatchError(
            f"draft vocabulary ({draft_size}) differs from target's ({target_size}): "
            "the drafter must share the target's tokenizer"
        )
    if target_tokenizer is None or draft_tokenizer is None:
        return
    t_vocab, d_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if t_vocab == d_vocab:
        return
    t_by_id = {i: s for s, i in t_vocab.items()}
    d_by_id = {i: s for s, i in d_vocab.items()}
    for i in sorted(set(t_by_id) | set(d_by_id)):
        if narrower and i >= draft_size:
            break  # the target's ids past the draft's rows: never proposed
        if t_by_id.get(i) != d_by_id.get(i):
            raise VocabularyMismatchError(
                f"draft and target tokenizers differ at token id {i} "
                f"(draft {d_by_id.get(i)!r}, target {t_by_id.get(i)!r}): "
                "the drafter must share the target's tokenizer"
            )


def make_drafter(
    spec: str,
    target,
    device="cpu",
    dtype=None,
    impl: str = "auto",
    precision: str | None = None,
) -> list[Drafter]:
    """Build the drafters of a CLI spec for ``target`` (a LoadedModel): the sources among which the engine's
    planner chooses each step, always a list (one drafter is a list of one; ``A+B`` gives two).

    precision: how a draft model from a GGUF file is evaluated (``q8`` or ``exact``; None: the default).
    """
    return build_drafter(resolve_drafter_spec(spec, target), target, device, dtype, impl, precision)


def build_drafter(
    spec: str,
    target,
    device="cpu",
    dtype=None,
    impl: str = "auto",
    precision: str | None = None,
) -> list[Drafter]:
    """make_drafter for a spec already resolved (``resolve_drafter_spec``: no ``auto`` left in it): one drafter
    per ``+``-separated part, in order."""
    build = BuildContext(target, device, dtype, impl, precision)
    return [_build_one(part, build) for part in spec.split("+")]


@dataclass(frozen=True)
class BuildContext:
    """What a drafter's builder is given besides its spec: the target (a LoadedModel) and how a draft model loads."""

    target: Any
    device: Any = "cpu"
    dtype: Any = None
    impl: str = "auto"
    precision: str | None = None  # how a draft model from a GGUF file is evaluated; None: the default


@dataclass(frozen=True)
class DrafterSpec:
    """One drafter of a ``--drafter`` spec (no ``+``): its method, and the argument after the method's separator
    (None where the spec is the method's name alone)."""

    text: str
    method: str
    arg: str | None

    def unknown(self) -> ValueError:
        return ValueError(f"unknown drafter {self.text!r}: use {DRAFTER_HELP}")


@dataclass(frozen=True)
class Method:
    """A drafting method of the catalogue: how its argument follows its name, and the builder that parses that
    argument and makes the drafter."""

    build: Callable[[DrafterSpec, BuildContext], Drafter]
    separator: str = ":"


def parse_spec(text: str) -> DrafterSpec:
    """The method and argument of one drafter's spec (``ngram:3`` -> ngram, ``"3"``; ``self?vocab=N`` -> self,
    ``"vocab=N"``); an unknown method is a ValueError naming the ones there are."""
    for name, method in DRAFTERS.items():
        if text == name:
            return DrafterSpec(text, name, None)
        if text.startswith(name + method.separator):
            return DrafterSpec(text, name, text[len(name) + len(method.separator) :])
    raise DrafterSpec(text, "", None).unknown()


def _build_one(text: str, build: BuildContext) -> Drafter:
    """One drafter of a spec without ``+``: its method's builder from the catalogue."""
    spec = parse_spec(text)
    return DRAFTERS[spec.method].build(spec, build)


def _none(spec: DrafterSpec, build: BuildContext) -> Drafter:
    """``none``: plain decoding."""
    if spec.arg:
        raise spec.unknown()
    return NoDrafter(build.device)


def _ngram(spec: DrafterSpec, build: BuildContext) -> Drafter:
    """``ngram[:MAX_N[:MIN_N]]``: prompt lookup."""
    max_s, _, min_s = (spec.arg or "").partition(":")
    try:
        max_n = int(max_s) if max_s else 3
        min_n = int(min_s) if min_s else 1
    except ValueError:
        raise ValueError(f"bad drafter {spec.text!r}: ngram takes integers, as in ngram:3 or ngram:3:2") from None
    return NgramDrafter(max_ngram=max_n, min_ngram=min_n, device=build.device)


def _model(spec: DrafterSpec, build: BuildContext) -> Drafter:
    """``model:ID[?key=value&...]``: a draft model (options: ``specwise.drafters.vocab.parse_model_spec``)."""
    from specwise.drafters.vocab import lookahead_option, lookup_option, parse_model_spec
    from specwise.models.loader import DEFAULT_PRECISION, load_model

    if not spec.arg:
        raise spec.unknown()
    target = build.target
    model_id, options = parse_model_spec(spec.arg)
    if not model_id:
        raise ValueError(f"bad drafter {spec.text!r}: name the draft model, as in model:PATH.gguf?vocab=32768")
    precision = build.precision or DEFAULT_PRECISION
    # dtype None: float32 (the loader's default)
    draft = load_model(
        model_id, device=build.device, dtype=build.dtype, impl=build.impl, precision=precision, drafting=True
    )
    try:
        check_same_vocabulary(target.model.vocab_size, draft.model.vocab_size, target.tokenizer, draft.tokenizer)
    except VocabularyMismatchError:
        if draft.tokenizer is None or target.tokenizer is None:
            raise
        options.setdefault("method", "auto")  # another vocabulary: drafted for across it
    if "method" in options:
        from specwise.drafters.cross_vocab import cross_vocab_drafter

        return cross_vocab_drafter(draft, target, options)
    lookup, lookahead = lookup_option(options), lookahead_option(options)
    if "vocab" in options:
        return _vocab_model_drafter(draft, target, options, lookup, lookahead)
    if draft.model.vocab_size < target.model.vocab_size:  # the target's output layer has more padding rows
        ids = np.arange(draft.model.vocab_size, dtype=np.int64)
        full = int(target.model.vocab_size)
        size = int(draft.model.vocab_size)
        return ModelDrafter(draft.model, ids, full, size, lookup=lookup, lookahead=lookahead)
    return ModelDrafter(draft.model, lookup=lookup, lookahead=lookahead)


def _suffix(spec: DrafterSpec, build: BuildContext) -> Drafter:
    """``suffix[:DIR]``: the target's earlier answers."""
    from specwise.drafters.suffix import make_suffix_drafter

    return make_suffix_drafter(spec.arg or "", build.target, build.device)


def resolve_drafter_spec(spec: str, target) -> str:
    """``auto`` becomes ``suffix`` when an index of the target's answers is shipped (its request counts do what
    prompt lookup does), else ``ngram+head`` when a head is shipped for the target (a LoadedModel), else
    ``ngram+model:SIBLING`` (over a draft vocabulary where a ranking is shipped) when the target is a GGUF file and
    a smaller one of the same vocabulary is beside it or in the fetch cache (``specwise.drafters.sibling``), else
    ``ngram+self`` when the target's output layer is over half of the bytes its pass reads (``self_pays``) and a
    ranking is shipped for its tokenizer, else ``ngram+model:default`` (drafted across vocabularies) when the
    default model's pass reads at most 0.15 of the target's and shares at least half of its vocabulary with it
    (``specwise.drafters.cross_vocab.choice``), else ``ngram``.

    On the default model, on prompts kept out of the index and out of Spec-Bench, `suffix` was the fastest of
    ngram+head, suffix, suffix+head and ngram+suffix+head (benchmarks/results/README.md)."""
    if spec != "auto":
        return spec
    from specwise.artifacts import shipped_head_dir, shipped_index_dir

    if shipped_index_dir(target.name) is not None:
        return "suffix"
    if shipped_head_dir(target.name) is not None:
        return "ngram+head"
    sibling = _auto_sibling(target)
    if sibling is not None:
        return sibling
    if self_pays(target):
        return "ngram+self"
    return _auto_cross_vocab(target) or "ngram"


# `auto` drafts with `self` where the output layer is at least this share of the bytes of the target's weights. Measured
# (Spec-Bench questions, gamma auto, 2 cores): Gemma-3-270M, 0.72 of its bytes: `self` 1.92x its plain decoding
# greedy, 1.46x at T = 0.7; the default model (0.31) 0.97x and Qwen2.5-Coder-1.5B (0.17) 1.01x: an accepted token
# saves the output layer's share of a pass and nothing more, while every drafted token costs a pass of the layers.
SELF_OUTPUT_SHARE = 0.5


def self_pays(target) -> bool:
    """Whether ``auto`` adds the `self` drafter for ``target`` (a LoadedModel): a GGUF target on the CPU whose output
    layer is at least SELF_OUTPUT_SHARE of its weights' bytes, with a ranking shipped for its tokenizer."""
    from specwise.artifacts import shipped_ranking
    from specwise.models.base import OutputRows, ReusableRows

    model = target.model
    if not isinstance(model, OutputRows) or not isinstance(model, ReusableRows) or not model.weight_bytes:
        return False
    if model.lm_head.nbytes < SELF_OUTPUT_SHARE * model.weight_bytes:
        return False
    return shipped_ranking(target.tokenizer) is not None


def _auto_sibling(target) -> str | None:
    """``ngram+model:SIBLING...`` for a GGUF target with a smaller sibling beside it or in the fetch cache; otherwise
    None, after one line on stderr when a sibling is known that could be fetched."""
    import sys

    from specwise.drafters.sibling import auto_model_spec, missing_sibling_hint

    path = _gguf_target(target)
    if path is None:
        return None
    spec = auto_model_spec(path, target.tokenizer)
    if spec is None:
        hint = missing_sibling_hint(path)
        if hint:
            print(f"specwise: {hint}", file=sys.stderr)
    return spec


def _gguf_target(target) -> str | None:
    """The file of a GGUF target on the quantized kernels (a LoadedModel), else None."""
    from pathlib import Path

    from specwise.models.base import QuantizedWeights

    if not isinstance(target.model, QuantizedWeights) or Path(target.model.path).suffix.lower() != ".gguf":
        return None
    return str(target.model.path)


def _auto_cross_vocab(target) -> str | None:
    """``ngram+model:default`` for a GGUF target of another vocabulary than the default model's, large enough for it
    to pay (``specwise.drafters.cross_vocab.choice``); otherwise None."""
    from specwise.drafters.cross_vocab.choice import auto_cross_vocab_spec

    path = _gguf_target(target)
    return None if path is None or target.tokenizer is None else auto_cross_vocab_spec(path)


def _vocab_model_drafter(
    draft, target, options: dict[str, str], lookup: int = 0, lookahead: float = LOOKAHEAD
) -> ModelDrafter:
    """A model drafter over a draft vocabulary (``vocab=N``, ``ranking=FILE``: see ``specwise.drafters.vocab``)."""
    from specwise.drafters.vocab import restrict_draft_output
    from specwise.models.loader import eos_ids

    full = int(draft.model.vocab_size)
    ids = restrict_draft_output(draft.model, options, target.tokenizer, eos_ids(target) or ())
    width = max(full, int(target.model.vocab_size))
    return ModelDrafter(draft.model, ids, width, full, lookup=lookup, lookahead=lookahead)


def _self(spec: DrafterSpec, build: BuildContext) -> Drafter:
    """``self[?vocab=N[&ranking=FILE]]``: the target's layers and N rows of its output layer (SelfDrafter)."""
    from specwise.drafters.self_draft import DEFAULT_VOCAB, SelfDrafter, check_self_target
    from specwise.drafters.vocab import draft_vocabulary, parse_model_spec, vocab_size_option
    from specwise.models.loader import eos_ids

    target = build.target
    _, options = parse_model_spec("" if spec.arg is None else "?" + spec.arg, kind="self")
    model = target.model
    check_self_target(model)  # before the draft vocabulary: the target is what to fix first
    full = int(model.vocab_size)
    size = vocab_size_option(options["vocab"]) if "vocab" in options else min(DEFAULT_VOCAB, full)
    ids = draft_vocabulary(size, options.get("ranking"), target.tokenizer, full, eos_ids(target) or ())
    return SelfDrafter.for_target(model, ids)


def quantized_head(model) -> bool:
    """Whether a head drafts on the quantized kernels: where its target runs on them (a GGUF on the CPU)."""
    from specwise.models.base import QuantizedWeights

    return isinstance(model, QuantizedWeights)


def _head(spec: DrafterSpec, build: BuildContext) -> Drafter:
    """``head[:DIR]``: a head trained by ``specwise distill`` (plain ``head``: the one shipped for the target)."""
    from specwise.artifacts import shipped_head_dir
    from specwise.drafters.head import HeadDrafter, check_target, read_head

    target = build.target
    directory = spec.arg or shipped_head_dir(target.name)
    if directory is None:
        raise ValueError(
            f"no head is shipped for target {target.name!r}: train one with `specwise distill --target "
            f"{target.name} --out DIR`, then use --drafter head:DIR"
        )
    head = read_head(directory)  # numpy, as in the file: the drafter makes the copies it computes with
    if target.hf_model is None:
        raise ValueError(
            "the head drafter needs the target's weights (a GGUF file's, or a Hugging Face model's: hf_model)"
        )
    check_target(head.config, target.hf_model, target.name)
    head.attach_target(target.hf_model)
    return HeadDrafter(head, target.model, quantized=quantized_head(target.model))


# The catalogue: each drafting method and its builder, as vLLM maps a speculative method to its proposer. A new
# drafter is a file of its own and one row here.
DRAFTERS: dict[str, Method] = {
    "none": Method(_none),
    "ngram": Method(_ngram),
    "model": Method(_model),
    "head": Method(_head),
    "suffix": Method(_suffix),
    "self": Method(_self, separator="?"),
}
