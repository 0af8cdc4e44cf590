"""Damaged and hostile GGUF files: each is refused with one line naming what was wrong (a GGUFError, or a
NotImplementedError for a well-formed file using something the native model does not implement) before native
code reads it. None crashes, reads or writes out of bounds (``make sanitize`` runs this file under AddressSanitizer
and UndefinedBehaviorSanitizer), ends in another exception type, or decodes.

The files are written by ``gguf_raw`` (every count, length, dimension, type and offset as the test states it), from
a valid two-layer model that the first tests load and decode.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
from gguf_raw import (
    ARRAY,
    F32,
    GGML_F32,
    GGML_Q8_0,
    HIDDEN,
    I32,
    STRING,
    U32,
    U64,
    VOCAB,
    RawGGUF,
    Tensor,
    f32,
    q8_0,
    tiny_model,
)

from specwise.models.gguf_file import GGUFError, GGUFFile
from specwise.models.kernels import quant

if not quant.quantized_available():
    pytest.skip("the native quantized kernels are not built", allow_module_level=True)

from specwise.models.quantized import QuantizedModel, checked_file  # noqa: E402

BIG = 1 << 64


def load(path) -> QuantizedModel:
    """Load and decode a few tokens (what a user's first command does)."""
    model = QuantizedModel(path, precision="q8", capacity=64, huge_pages=False)
    model.forward([1, 5, 7])
    return model


def test_the_base_model_loads_and_decodes(tmp_path):
    path = tmp_path / "base.gguf"
    path.write_bytes(tiny_model().bytes())
    model = load(path)
    assert model.vocab_size == VOCAB
    logits = model.forward([3])
    assert logits.shape == (1, VOCAB) and logits.dtype == np.float32 and np.isfinite(logits).all()


def test_the_default_model_passes_every_check():
    from specwise.models.loader import default_gguf_path

    meta = checked_file(default_gguf_path())
    assert len(meta.tensors) == 272


# ---- variants: (a function of the valid model -> the file's bytes, a pattern the refusal must contain) ----------


def _truncated(fraction: float):
    def make(g: RawGGUF) -> bytes:
        data = g.bytes()
        return data[: int(len(data) * fraction)]

    return make


def _header_cut(g: RawGGUF) -> bytes:
    data = g.bytes()
    return data[: GGUF_HEADER_END(data) // 2]


def GGUF_HEADER_END(data: bytes) -> int:  # noqa: N802
    """Bytes of the header (the data of the first tensor starts there)."""
    from tempfile import NamedTemporaryFile

    with NamedTemporaryFile(suffix=".gguf") as f:
        f.write(data)
        f.flush()
        return GGUFFile(f.name).data_start


def _with(edit):
    """A variant made by editing a copy of the model in place."""

    def make(g: RawGGUF) -> bytes:
        g = g.copy()
        edit(g)
        return g.bytes()

    return make


def _patch(offset_of, value: bytes):
    """A variant made by overwriting bytes of the valid file at offset_of(data)."""

    def make(g: RawGGUF) -> bytes:
        data = bytearray(g.bytes())
        at = offset_of(data)
        data[at : at + len(value)] = value
        return bytes(data)

    return make


def _dims(name: str, dims: list[int], data: bytes | None = None):
    def edit(g: RawGGUF) -> None:
        t = g.tensor(name)
        t.dims = dims
        if data is not None:
            t.data = data

    return _with(edit)


def _set(key: str, kind: int, value):
    return _with(lambda g: g.set(key, kind, value))


def _drop_kv(key: str):
    return _with(lambda g: g.kvs.pop(g.kv(key)))


def _drop_tensor(name: str):
    return _with(lambda g: g.tensors.remove(g.tensor(name)))


def _add_tensor(name: str, dims: list[int], kind: int = GGML_F32):
    def edit(g: RawGGUF) -> None:
        n = 1
        for d in dims:
            n *= d
        data = f32([1.0] * n) if kind == GGML_F32 else _q8(n // dims[0], dims[0])
        g.tensors.append(Tensor(name, dims, kind, data))

    return _with(edit)


def _nested(depth: int):
    value = (U32, [1])
    for _ in range(depth):
        value = (ARRAY, [value])
    return _set("general.nested", ARRAY, value)


def _q8(rows: int, cols: int) -> bytes:
    return q8_0(rows, cols, np.random.default_rng(1))


def _set_counts(n_tensors=None, n_kv=None):
    def edit(g: RawGGUF) -> None:
        g.n_tensors, g.n_kv = n_tensors, n_kv

    return _with(edit)


def _tensor_offset(name: str, offset: int):
    return _with(lambda g: setattr(g.tensor(name), "offset", offset))


def _overlap(g: RawGGUF) -> None:
    names = [t.name for t in g.tensors]
    g.tensor("blk.0.ffn_norm.weight").offset = g.natural_offsets()[names.index("blk.0.attn_norm.weight")]


def _duplicate_tensor(g: RawGGUF) -> None:
    t = g.tensor("blk.1.ffn_norm.weight")
    g.tensors.append(Tensor(t.name, list(t.dims), t.type, t.data))


def _first_key_length(data: bytearray) -> int:
    return 24  # magic, version, two counts: the first key's length follows


def _first_value_type(data: bytearray) -> int:
    return 24 + 8 + len("general.architecture")


H = HIDDEN
VARIANTS = {
    # the header
    "empty": (lambda g: b"", "empty"),
    "wrong magic": (lambda g: b"GGML" + g.bytes()[4:], "no GGUF magic"),
    "version 1": (_with(lambda g: setattr(g, "version", 1)), "version 1"),
    "version 4": (_with(lambda g: setattr(g, "version", 4)), "version 4"),
    "six bytes": (lambda g: g.bytes()[:6], "ends inside"),
    "2^63 metadata entries": (_set_counts(n_kv=1 << 63), "metadata entries cannot fit"),
    "2^64-1 tensors": (_set_counts(n_tensors=BIG - 1), "tensors cannot fit"),
    "more tensors than written": (_set_counts(n_tensors=30), "ends inside|not a multiple|cannot fit|runs past"),
    "key of 2^64-1 bytes": (_patch(_first_key_length, struct.pack("<Q", BIG - 1)), "runs past the end"),
    "unknown value type": (_patch(_first_value_type, struct.pack("<I", 99)), "unknown value type 99"),
    "an empty array": (_set("general.tags", ARRAY, (U32, [])), None),  # valid
    "array element type 77": (lambda g: _array_field(g, 0, struct.pack("<I", 77)), "unknown element type 77"),
    "array of 2^62 integers": (lambda g: _array_field(g, 4, struct.pack("<Q", 1 << 62)), "cannot fit"),
    "string array element of 2^60 bytes": (lambda g: _string_element(g, 1 << 60), "ends inside|runs past"),
    "arrays nested 10 deep": (_nested(10), "nests arrays deeper"),
    "duplicate key": (_with(lambda g: g.kvs.append(g.kvs[g.kv("llama.block_count")])), "appears twice"),
    "alignment 0": (_set("general.alignment", U32, 0), "general.alignment"),
    "alignment 3": (_set("general.alignment", U32, 3), "general.alignment"),
    "alignment a string": (_set("general.alignment", STRING, "32"), "general.alignment"),
    "header cut in half": (_header_cut, "ends inside|runs past|cannot fit"),
    "cut at 30%": (_truncated(0.3), "runs past the end"),
    "cut at 99%": (_truncated(0.99), "runs past the end"),
    # the tensor table
    "rank 0": (_dims("blk.0.attn_norm.weight", []), "0 dimensions"),
    "rank 5": (_dims("blk.0.attn_norm.weight", [H, 1, 1, 1, 1]), "5 dimensions"),
    "ffn_down [1536, 2^64-1]": (_dims("blk.0.ffn_down.weight", [1536, BIG - 1]), "more than 2\\^63 elements"),
    "ffn_down [1536, 2^32+576]": (_dims("blk.0.ffn_down.weight", [1536, (1 << 32) + 576]), "runs past the end"),
    "token_embd rows 2^32+96": (_dims("token_embd.weight", [H, (1 << 32) + VOCAB]), "runs past the end"),
    "zero dimension": (_dims("blk.1.ffn_up.weight", [H, 0]), "zero dimension"),
    "unknown GGML type": (_with(lambda g: setattr(g.tensor("blk.0.attn_q.weight"), "type", 200)), "unknown GGML type"),
    "rows not whole blocks": (_dims("blk.0.attn_q.weight", [48, 85], _q8(85, 48)[: 85 * 48 // 32 * 34]), "not whole"),
    "offset past the end": (_tensor_offset("blk.1.ffn_down.weight", 1 << 40), "runs past the end"),
    "offset 2^64-32": (_tensor_offset("blk.1.ffn_down.weight", BIG - 32), "runs past the end"),
    "offset not aligned": (_tensor_offset("output_norm.weight", 4), "not a multiple of 32"),
    "overlapping tensors": (_with(_overlap), "overlap"),
    "duplicate tensor": (_with(_duplicate_tensor), "appears twice"),
    # the metadata's types and ranges
    "0 heads": (_set("llama.attention.head_count", U32, 0), "head_count is 0"),
    "heads a string": (_set("llama.attention.head_count", STRING, "4"), "head_count is '4'.*expected an integer"),
    "heads an array": (_set("llama.attention.head_count", ARRAY, (U32, [4, 4])), "head_count is an array"),
    "kv heads do not divide": (_set("llama.attention.head_count_kv", U32, 3), "does not divide"),
    "negative kv heads": (_set("llama.attention.head_count_kv", I32, -2), "head_count_kv is -2"),
    "hidden a float": (_set("llama.embedding_length", F32, 64.0), "embedding_length is 64.0"),
    "hidden 2^40": (_set("llama.embedding_length", U64, 1 << 40), "embedding_length is"),
    "block count missing": (_drop_kv("llama.block_count"), "block_count is missing"),
    "block count 3 for 2 layers": (_set("llama.block_count", U32, 3), "blk.2.* is missing"),
    "block count 1 for 2 layers": (_set("llama.block_count", U32, 1), "belongs to layer 1.*block_count is 1"),
    "negative eps": (_set("llama.attention.layer_norm_rms_epsilon", F32, -1e-5), "epsilon is"),
    "NaN rope base": (_set("llama.rope.freq_base", F32, float("nan")), "freq_base is nan"),
    "context 0": (_set("llama.context_length", U32, 0), "context_length is 0"),
    "eos outside the vocabulary": (_set("tokenizer.ggml.eos_token_id", U32, 5000), "eos_token_id is 5,000"),
    "vocab_size differs": (_set("llama.vocab_size", U32, 1000), "vocab_size is 1,000"),
    # shapes and types against the configuration
    "ffn_down input 256": (_dims("blk.0.ffn_down.weight", [256, H], _q8(H, 256)), "ffn_down.weight has shape"),
    "v projection too wide": (_dims("blk.1.attn_v.weight", [H, 64], _q8(64, H)), "attn_v.weight has shape"),
    "embedding narrower": (_dims("token_embd.weight", [32, VOCAB], _q8(VOCAB, 32)), "token_embd.weight has shape"),
    "fewer embedding rows than tokens": (
        _dims("token_embd.weight", [H, 80], _q8(80, H)),
        "80 rows, but the tokenizer has 96 tokens",
    ),
    "quantized norm": (
        _with(lambda g: _retype(g, "blk.0.attn_norm.weight", GGML_Q8_0, _q8(1, H))),
        "attn_norm.weight is Q8_0: expected F32",
    ),
    "norm as a matrix": (_dims("blk.0.ffn_norm.weight", [H, 1]), "ffn_norm.weight has shape"),
    "missing ffn_up": (_drop_tensor("blk.1.ffn_up.weight"), "blk.1.ffn_up.weight is missing"),
    "missing output norm": (_drop_tensor("output_norm.weight"), "output_norm.weight is missing"),
    "output layer of another shape": (_add_tensor("output.weight", [H, 50], GGML_Q8_0), "output.weight has shape"),
    "only a q bias": (_add_tensor("blk.0.attn_q.bias", [H]), "attn_k.bias is missing"),
    # well formed, but something the native model does not implement: refused, never ignored
    "rope_freqs (llama3)": (_add_tensor("rope_freqs.weight", [8]), None),  # valid: llama3 rope factors
    "rope_freqs of another width": (_add_tensor("rope_freqs.weight", [5]), "rope_freqs.weight has shape"),
    "rope_freqs quantized": (_add_tensor("rope_freqs.weight", [32], GGML_Q8_0), "rope_freqs.weight has shape"),
    "rope_freqs of zeros": (_with(lambda g: _zero_factors(g)), "rope_freqs.weight holds factors"),
    "sliding window on llama": (_set("llama.attention.sliding_window", U32, 8), "sliding-window attention"),
    "rope scaling factor without a type": (_set("llama.rope.scaling.factor", F32, 4.0), "scaling factor of 4"),
    "an unknown tensor": (_add_tensor("blk.0.mystery.weight", [H]), "blk.0.mystery.weight .*not supported"),
    "q norm (Qwen3)": (_add_tensor("blk.0.attn_q_norm.weight", [16]), "query norm"),
    "a soft-cap": (_set("llama.attn_logit_softcapping", F32, 50.0), "attn_logit_softcapping.*not supported"),
    "rope scaling yarn": (_set("llama.rope.scaling.type", STRING, "yarn"), "rope scaling 'yarn'"),
}


def _zero_factors(g: RawGGUF) -> None:
    g.tensors.append(Tensor("rope_freqs.weight", [8], GGML_F32, f32([0.0] * 8)))


def _retype(g: RawGGUF, name: str, kind: int, data: bytes) -> None:
    t = g.tensor(name)
    t.type, t.data = kind, data


def _array_field(g: RawGGUF, at: int, value: bytes) -> bytes:
    """The file with an array of two integers whose element type (at 0) or count (at 4) is overwritten."""
    g = g.copy().set("general.tags", ARRAY, (U32, [7, 7]))
    data = bytearray(g.bytes())
    at += data.index(b"general.tags") + len("general.tags") + 4  # after the key and the value type
    data[at : at + len(value)] = value
    return bytes(data)


def _string_element(g: RawGGUF, n: int) -> bytes:
    """The file with the last token's length (in the vocabulary, a string array) set to n."""
    data = bytearray(g.bytes())
    at = data.index(f"t{VOCAB - 1}".encode()) - 8
    data[at : at + 8] = struct.pack("<Q", n)
    return bytes(data)


VALID = {name for name, (_, pattern) in VARIANTS.items() if pattern is None}


@pytest.fixture(scope="module")
def base() -> RawGGUF:
    return tiny_model()


@pytest.mark.parametrize("name", [n for n in VARIANTS if n not in VALID])
def test_a_hostile_file_is_refused_in_one_line(name, base, tmp_path):
    make, pattern = VARIANTS[name]
    path = tmp_path / "model.gguf"
    path.write_bytes(make(base))
    with pytest.raises((GGUFError, NotImplementedError), match=pattern) as caught:
        load(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("model.gguf:"), message


@pytest.mark.parametrize("name", sorted(VALID))
def test_unusual_but_valid_metadata_still_loads(name, base, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(VARIANTS[name][0](base))
    load(path)


def test_the_corpus_is_large():
    assert len(VARIANTS) - len(VALID) >= 40


def test_the_cli_refuses_a_hostile_file_without_a_traceback(base, tmp_path):
    """From the command line: a non-zero exit, no signal, no traceback, the problem named in one line."""
    cases = {
        "overflow.gguf": (VARIANTS["ffn_down [1536, 2^32+576]"][0](base), "runs past the end"),
        "heads.gguf": (VARIANTS["0 heads"][0](base), "head_count is 0"),
        "cut.gguf": (VARIANTS["header cut in half"][0](base), "ends inside|runs past|cannot fit"),
    }
    env = {**os.environ, "SPECWISE_CACHE": str(tmp_path / "cache")}
    env.pop("SPECWISE_DEBUG", None)
    for file, (data, pattern) in cases.items():
        path = tmp_path / file
        path.write_bytes(data)
        run = subprocess.run(
            [sys.executable, "-m", "specwise", "generate", "hi", "--target", str(path), "--max-new-tokens", "2"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert run.returncode > 0, (file, run.returncode, run.stderr)
        assert "Traceback" not in run.stderr, run.stderr
        assert re.search(pattern, run.stderr), run.stderr


# ---- the native entry points check their own arguments (a wrong call from Python is an error, not a write) -------


def test_the_native_entry_points_refuse_sizes_that_do_not_fit():
    import ctypes

    from specwise.models.kernels.quant import SW_EARG, SW_ERANGE, QPack, QTensor, _lib

    lib = _lib()
    rng = np.random.default_rng(0)
    w = QTensor(GGML_Q8_0, np.frombuffer(q8_0(40, 64, rng), dtype=np.uint8), 40, 64, name="w")
    sizes = [ctypes.c_int64() for _ in range(5)]
    refs = [ctypes.byref(s) for s in sizes]
    assert lib.specwise_q_sizes(GGML_Q8_0, 1 << 31, 64, *refs) == SW_EARG  # more rows than the tiles index
    assert lib.specwise_q_sizes(GGML_Q8_0, (1 << 32) + 40, 64, *refs) == SW_EARG  # truncated to 40 by an int
    assert lib.specwise_q_sizes(GGML_Q8_0, 40, 48, *refs) == SW_EARG  # not whole blocks
    assert lib.specwise_q_sizes(GGML_Q8_0, 40, 64, *refs) == 0
    # re-packing into buffers smaller than the layout, or rows past the tensor, writes nothing
    raw = np.frombuffer(q8_0(40, 64, rng), dtype=np.uint8)
    q = np.zeros(sizes[0].value, dtype=np.uint8)
    s = np.zeros(sizes[1].value, dtype=np.uint8)
    pack = QPack(GGML_Q8_0, 40, 64, q.ctypes.data, s.ctypes.data, None, None, None, q.size - 1, s.size, 0, 0, 0)
    assert lib.specwise_q_repack(ctypes.byref(pack), raw.ctypes.data, raw.size, 0, 40) == SW_EARG
    pack.q_bytes = q.size
    assert lib.specwise_q_repack(ctypes.byref(pack), raw.ctypes.data, raw.size, 30, 11) == SW_EARG
    assert lib.specwise_q_repack(ctypes.byref(pack), raw.ctypes.data, raw.size - 1, 0, 40) == SW_EARG
    pack.out = (1 << 32) + 40
    assert lib.specwise_q_repack(ctypes.byref(pack), raw.ctypes.data, raw.size, 0, 40) == SW_EARG
    pack.out = 40
    assert lib.specwise_q_repack(ctypes.byref(pack), raw.ctypes.data, raw.size, 0, 40) == 0
    # rows and ids outside the matrix
    out = np.empty((2, 64), dtype=np.float32)
    assert lib.specwise_q_row(ctypes.byref(w.struct), 40, out.ctypes.data) == SW_ERANGE
    assert lib.specwise_q_row(ctypes.byref(w.struct), -1, out.ctypes.data) == SW_ERANGE
    ids = np.array([3, 1 << 32], dtype=np.int64)
    assert lib.specwise_q_gather(ctypes.byref(w.struct), ids.ctypes.data, 2, out.ctypes.data) == SW_ERANGE
    block = np.zeros(2 * 18, dtype=np.uint8)  # room for one row of Q4_0, two asked
    assert lib.specwise_q_requantize_q4_0(ctypes.byref(w.struct), 0, 2, block.ctypes.data, block.size) == SW_EARG
    assert lib.specwise_q_abs_sum(ctypes.byref(w.struct), 40 * 64 - 1, 2) == -2.0
    # a matrix that is not one, and more parts than the product takes
    bad = quant.QMat(9, 32, 0, 0, 1, 40, 64, w.struct.q, w.struct.s, None, 0, None, None)
    assert lib.specwise_q_row(ctypes.byref(bad), 0, out.ctypes.data) == SW_EARG
    x, y = np.zeros((1, 64), dtype=np.float32), np.zeros((1, 9 * 40), dtype=np.float32)
    parts = (quant.QMat * 9)(*([w.struct] * 9))
    status = lib.specwise_q_gemm(parts, 9, x.ctypes.data, None, y.ctypes.data, 1, 1, 1)
    assert status == SW_EARG
    with pytest.raises(ValueError, match="2\\^30"):
        QTensor(GGML_Q8_0, raw, (1 << 32) + 40, 64)


def test_the_layer_kernel_refuses_a_shape_or_position_that_does_not_fit(tmp_path):
    path = tmp_path / "base.gguf"
    path.write_bytes(tiny_model().bytes())
    model = load(path)
    shape = model._stack.shape  # the qshape every pass of the model reads (filled once at load)
    for bad in ({"kv_heads": 0}, {"kv_heads": 3}, {"inter": 64}, {"layers": 3}, {"hidden": 1 << 40}):
        saved = {k: getattr(shape, k) for k in bad}
        for k, v in bad.items():
            setattr(shape, k, v)
        try:
            with pytest.raises(ValueError, match="does not fit|refused"):
                model.forward([4])
        finally:
            for k, v in saved.items():
                setattr(shape, k, v)
    model.rollback(0)
    model.forward([4])
