"""Checks of a GGUF file's metadata and tensors against the model they describe, before native code sees them.

:class:`specwise.models.gguf_file.GGUFFile` checks that the header fits the file (counts, lengths, dimensions,
offsets). This module checks that it is the model it claims to be: every metadata value the model reads has the
type and range it needs (:func:`meta_int`, :func:`meta_float`), and every tensor has the shape and type that the
configuration gives (:func:`check_tensors`). A file that fails is refused with one :class:`GGUFError` line naming
the key or tensor, what was found and what was expected; a file that is well formed but uses something the native
model does not implement raises NotImplementedError naming it.
"""

from __future__ import annotations

import math
import re

from specwise.models.gguf_file import FLOAT_TYPES, GGUFError, GGUFFile

__all__ = ["meta_int", "meta_float", "check_tensors"]

_LAYER = re.compile(r"blk\.(\d+)\.(.+)")
# what a tensor the native family does not use is, where its name says so (for the refusal's message)
_KNOWN_EXTRAS = {
    "rope_freqs.weight": "rope frequency factors (llama3 rope scaling)",
    "rope_factors_long.weight": "longrope frequency factors (Phi-3 128k)",
    "rope_factors_short.weight": "longrope frequency factors (Phi-3 128k)",
    "attn_output.bias": "an attention output bias",
    "attn_q_norm.weight": "a query norm (Qwen3, Gemma 3)",
    "attn_k_norm.weight": "a key norm (Qwen3, Gemma 3)",
    "attn_qkv.weight": "a fused query-key-value projection (Phi-3)",
    "post_attention_norm.weight": "a post-attention norm (Gemma)",
    "post_ffw_norm.weight": "a post-feed-forward norm (Gemma)",
    "ffn_gate_inp.weight": "a mixture-of-experts router",
}


def _name(meta: GGUFFile) -> str:
    return meta.path.name


def meta_int(meta: GGUFFile, key: str, default: int | None = None, low: int = 1, high: int = 1 << 31) -> int:
    """An integer metadata value in [low, high]; ``default`` when absent (a GGUFError when absent without one,
    or of another type: a string, a float, a bool, an array)."""
    value = meta.get(key)
    if value is None:
        if key in getattr(meta, "_array_at", {}):
            raise GGUFError(f"{_name(meta)}: metadata {key} is an array: expected one integer")
        if default is None:
            raise GGUFError(f"{_name(meta)}: metadata {key} is missing")
        return default
    if type(value) is not int:
        raise GGUFError(f"{_name(meta)}: metadata {key} is {value!r} ({type(value).__name__}): expected an integer")
    if not low <= value <= high:
        raise GGUFError(f"{_name(meta)}: metadata {key} is {value:,}: expected an integer in [{low:,}, {high:,}]")
    return value


def meta_float(meta: GGUFFile, key: str, default: float, low: float, high: float) -> float:
    """A finite number in (low, high) (integers accepted); ``default`` when absent."""
    value = meta.get(key)
    if value is None:
        if key in getattr(meta, "_array_at", {}):
            raise GGUFError(f"{_name(meta)}: metadata {key} is an array: expected one number")
        return default
    if type(value) not in (int, float) or not math.isfinite(value) or not low < value < high:
        raise GGUFError(f"{_name(meta)}: metadata {key} is {value!r}: expected a finite number in ({low:g}, {high:g})")
    return float(value)


def _expect(meta: GGUFFile, name: str, shape: tuple[int, ...], floats: bool = False) -> None:
    """Tensor ``name`` exists with ``shape`` (numpy order), and is F32 / F16 / BF16 when ``floats``."""
    info = meta.tensors.get(name)
    if info is None:
        raise GGUFError(f"{_name(meta)}: tensor {name} is missing")
    if info.shape != shape:
        raise GGUFError(
            f"{_name(meta)}: tensor {name} has shape {list(info.shape)}: the configuration gives {list(shape)}"
        )
    if floats and info.type not in FLOAT_TYPES:
        raise GGUFError(f"{_name(meta)}: tensor {name} is {info.type_name}: expected F32, F16 or BF16")


def check_tensors(
    meta: GGUFFile,
    config,
    matrices: dict[str, tuple[int, int]],
    vectors: dict[str, tuple[int, ...]],
    biases: dict[str, tuple[int]] | None = None,
    extra: dict[str, tuple[int, ...]] | None = None,
) -> None:
    """Every tensor of a native-family model has the shape and type ``config`` gives, nothing is missing, and nothing
    is there that the model would not use (NotImplementedError naming it).

    matrices, vectors: each layer's matrices and float vectors (norms) by part name (``attn_q`` for
    ``blk.N.attn_q.weight``) with their shapes (numpy order); biases: the optional float biases (``blk.N.<part>.bias``,
    all of them or none in a layer); extra: optional float tensors outside the layers (``rope_freqs.weight``)."""
    h = config.hidden_size
    embed = meta.tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise GGUFError(f"{_name(meta)}: tensor token_embd.weight is missing or not a matrix")
    vocab = embed.shape[0]
    _expect(meta, "token_embd.weight", (vocab, h))
    _check_vocab(meta, config, vocab)
    expected = {"token_embd.weight", "output_norm.weight"}
    _expect(meta, "output_norm.weight", (h,), floats=True)
    if "output.weight" in meta.tensors:
        _expect(meta, "output.weight", (vocab, h))
        expected.add("output.weight")
    for name, shape in (extra or {}).items():
        if name in meta.tensors:
            _expect(meta, name, shape, floats=True)
            expected.add(name)
    biases = biases or {}
    for i in range(config.num_hidden_layers):
        p = f"blk.{i}."
        for part, shape in matrices.items():
            _expect(meta, f"{p}{part}.weight", shape)
        for part, shape in vectors.items():
            _expect(meta, f"{p}{part}.weight", shape, floats=True)
        present = [part for part in biases if f"{p}{part}.bias" in meta.tensors]
        if present and len(present) != len(biases):
            missing = next(part for part in biases if part not in present)
            raise GGUFError(f"{_name(meta)}: tensor {p}{missing}.bias is missing (the layer has other biases)")
        for part in present:
            _expect(meta, f"{p}{part}.bias", biases[part], floats=True)
        expected.update(f"{p}{part}.weight" for part in (*matrices, *vectors))
        expected.update(f"{p}{part}.bias" for part in present)
    for name in meta.tensors:
        if name in expected:
            continue
        layer = _LAYER.fullmatch(name)
        if layer and int(layer.group(1)) >= config.num_hidden_layers:
            raise GGUFError(
                f"{_name(meta)}: tensor {name} belongs to layer {layer.group(1)}, but metadata "
                f"{config.gguf_architecture}.block_count is {config.num_hidden_layers}"
            )
        what = _KNOWN_EXTRAS.get(layer.group(2) if layer else name, "a tensor the native model does not use")
        raise NotImplementedError(f"tensor {name} ({what}) is not supported by the native model")


def _check_vocab(meta: GGUFFile, config, vocab: int) -> None:
    """The vocabulary the metadata gives (its token list, vocab_size) is the embedding's rows, and the special
    token ids lie inside it."""
    tokens = meta.array_length("tokenizer.ggml.tokens")
    if tokens is not None and tokens != vocab:
        raise GGUFError(
            f"{_name(meta)}: tensor token_embd.weight has {vocab:,} rows, but the tokenizer has {tokens:,} tokens"
        )
    if config.vocab_size and config.vocab_size != vocab:
        raise GGUFError(
            f"{_name(meta)}: metadata {config.gguf_architecture}.vocab_size is {config.vocab_size:,}, but tensor "
            f"token_embd.weight has {vocab:,} rows"
        )
    for role in ("bos", "eos", "unknown", "padding", "eot", "eom", "sep"):
        key = f"tokenizer.ggml.{role}_token_id"
        if meta.get(key) is not None:
            meta_int(meta, key, low=0, high=vocab - 1)
