"""A raw GGUF writer for tests: every count, length, dimension, type and offset is written as given, so that a
test can state what a hostile file states (``gguf.GGUFWriter`` refuses most of it).

``tiny_model()`` is a valid two-layer Llama model (Q8_0 matrices, F32 norms, a 96-token vocabulary) as a
:class:`RawGGUF` to mutate; ``bytes()`` serialises it.
"""

from __future__ import annotations

import copy
import struct
from dataclasses import dataclass, field

import numpy as np

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FORMATS = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
            I64: "<q", F64: "<d"}  # fmt: skip
GGML_F32, GGML_Q8_0 = 0, 8


def _string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def _value(kind: int, value) -> bytes:
    if kind == STRING:
        return _string(value)
    if kind == ARRAY:
        element, items = value
        return struct.pack("<IQ", element, len(items)) + b"".join(_value(element, v) for v in items)
    return struct.pack(_FORMATS[kind], value)


@dataclass
class Tensor:
    name: str
    dims: list[int]  # ggml order: inputs first ([in, out] for a matrix)
    type: int
    data: bytes
    offset: int | None = None  # the offset the header states (None: where the data lies, see natural_offsets)


@dataclass
class RawGGUF:
    kvs: list[tuple[str, int, object]] = field(default_factory=list)  # (key, value type, value)
    tensors: list[Tensor] = field(default_factory=list)
    version: int = 3
    alignment: int = 32
    n_kv: int | None = None  # None: len(kvs)
    n_tensors: int | None = None  # None: len(tensors)

    def copy(self) -> RawGGUF:
        return copy.deepcopy(self)

    def kv(self, key: str) -> int:
        return next(i for i, (k, _, _) in enumerate(self.kvs) if k == key)

    def set(self, key: str, kind: int, value) -> RawGGUF:
        entry = (key, kind, value)
        try:
            self.kvs[self.kv(key)] = entry
        except StopIteration:
            self.kvs.append(entry)
        return self

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)

    def bytes(self) -> bytes:
        header = b"GGUF" + struct.pack("<IQQ", self.version, *self._counts())
        header += b"".join(_string(k) + struct.pack("<I", kind) + _value(kind, v) for k, kind, v in self.kvs)
        data = b""
        for t, at in zip(self.tensors, self.natural_offsets()):
            data += b"\0" * (at - len(data)) + t.data
        offsets = [at if t.offset is None else t.offset for t, at in zip(self.tensors, self.natural_offsets())]
        for t, offset in zip(self.tensors, offsets):
            header += _string(t.name) + struct.pack("<I", len(t.dims))
            header += b"".join(struct.pack("<Q", d) for d in t.dims) + struct.pack("<IQ", t.type, offset)
        header += b"\0" * (-len(header) % self.alignment)
        return header + data

    def natural_offsets(self) -> list[int]:
        """Where each tensor's data lies: one after the other, aligned (whatever offset the header states)."""
        offsets, at = [], 0
        for t in self.tensors:
            at += -at % self.alignment
            offsets.append(at)
            at += len(t.data)
        return offsets

    def _counts(self) -> tuple[int, int]:
        n_tensors = len(self.tensors) if self.n_tensors is None else self.n_tensors
        return n_tensors, len(self.kvs) if self.n_kv is None else self.n_kv


def q8_0(rows: int, cols: int, rng: np.random.Generator) -> bytes:
    """Random Q8_0 blocks of a [rows, cols] matrix: a float16 scale of about 0.01, then 32 int8 values."""
    blocks = rows * cols // 32
    out = np.empty((blocks, 34), dtype=np.uint8)
    out[:, :2] = np.full(blocks, 0.01 / np.sqrt(cols / 64), dtype=np.float16).view(np.uint8).reshape(blocks, 2)
    out[:, 2:] = rng.integers(-127, 128, size=(blocks, 32), dtype=np.int8).view(np.uint8)
    return out.tobytes()


def f32(values: np.ndarray) -> bytes:
    return np.asarray(values, dtype=np.float32).tobytes()


HIDDEN, FFN, HEADS, KV_HEADS, LAYERS, VOCAB = 64, 128, 4, 2, 2, 96


def tiny_model(seed: int = 0) -> RawGGUF:
    """A valid tiny Llama model (tied output layer) with a tokenizer vocabulary of VOCAB tokens."""
    rng = np.random.default_rng(seed)
    h, hd = HIDDEN, HIDDEN // HEADS
    g = RawGGUF()
    g.set("general.architecture", STRING, "llama")
    g.set("general.alignment", U32, 32)
    for key, value in (
        ("block_count", LAYERS),
        ("context_length", 256),
        ("embedding_length", h),
        ("feed_forward_length", FFN),
        ("attention.head_count", HEADS),
        ("attention.head_count_kv", KV_HEADS),
        ("rope.dimension_count", hd),
    ):
        g.set(f"llama.{key}", U32, value)
    g.set("llama.rope.freq_base", F32, 10000.0)
    g.set("llama.attention.layer_norm_rms_epsilon", F32, 1e-5)
    g.set("tokenizer.ggml.model", STRING, "gpt2")
    g.set("tokenizer.ggml.tokens", ARRAY, (STRING, [f"t{i}" for i in range(VOCAB)]))
    g.set("tokenizer.ggml.eos_token_id", U32, 2)

    def matrix(name: str, out: int, n_in: int) -> None:
        g.tensors.append(Tensor(name, [n_in, out], GGML_Q8_0, q8_0(out, n_in, rng)))

    def vector(name: str, n: int) -> None:
        g.tensors.append(Tensor(name, [n], GGML_F32, f32(1.0 + 0.1 * rng.standard_normal(n))))

    matrix("token_embd.weight", VOCAB, h)
    vector("output_norm.weight", h)
    for i in range(LAYERS):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", h)
        vector(p + "ffn_norm.weight", h)
        matrix(p + "attn_q.weight", HEADS * hd, h)
        matrix(p + "attn_k.weight", KV_HEADS * hd, h)
        matrix(p + "attn_v.weight", KV_HEADS * hd, h)
        matrix(p + "attn_output.weight", h, HEADS * hd)
        matrix(p + "ffn_gate.weight", FFN, h)
        matrix(p + "ffn_up.weight", FFN, h)
        matrix(p + "ffn_down.weight", h, FFN)
    return g
