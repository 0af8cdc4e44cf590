"""The native library's interface in ctypes: a ``Structure`` for every struct of ``quant.h`` and ``specwise.h``
(field for field, in order) and the argument and return types of every function the header declares.

Pointers to structs are typed (``POINTER(QShape)`` for ``const qshape *``), so a call that passes the wrong struct,
or an integer address, fails in Python with a TypeError instead of in C; pointers to data buffers (``float *``,
``const int64_t *``) are ``c_void_p``, which takes a numpy array's address. ``tests/test_bindings.py`` parses the
header and checks every Structure and every signature here against it. The suffix index's structs and functions
are bound beside the index (``specwise/drafters/suffix/index.py``), under its own ABI version.
"""

from __future__ import annotations

import ctypes

__all__ = [
    "QPack",
    "QJob",
    "QMat",
    "QArch",
    "QShape",
    "QLayers",
    "QRows",
    "QWork",
    "QRun",
    "QModel",
    "QPass",
    "QHead",
    "QStep",
    "QLogits",
    "SpmVocab",
    "SIGNATURES",
    "declare",
    "pointer_to",
]

_p, _i, _i32, _i64, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_int32, ctypes.c_int64, ctypes.c_float
_ptr = ctypes.POINTER


# ---------------------------------------------------------------------------------------------------- quant.h


class QPack(ctypes.Structure):
    """``qpack``: where specwise_q_repack writes a tensor's tiles, with each buffer's bytes."""

    _fields_ = [
        ("type", _i32),
        ("out", _i64),
        ("in_", _i64),
        ("q", _p),
        ("s", _p),
        ("m", _p),
        ("sd", _p),
        ("md", _p),
        ("q_bytes", _i64),
        ("s_bytes", _i64),
        ("m_bytes", _i64),
        ("sd_bytes", _i64),
        ("md_bytes", _i64),
    ]


class QJob(ctypes.Structure):
    """``qjob``: one tensor for specwise_q_repack_jobs."""

    _fields_ = [("dst", QPack), ("raw", _p), ("raw_bytes", _i64), ("rows", _p), ("release", _i32)]


class QMat(ctypes.Structure):
    """``qmat``: one matrix as the products read it (its format, shape and buffers)."""

    _fields_ = [
        ("kind", _i),
        ("block", _i),
        ("offset", _i),
        ("has_m", _i),
        ("half", _i),
        ("out", _i),
        ("in_", _i),
        ("q", _p),
        ("s", _p),
        ("m", _p),
        ("sub", _i),
        ("sd", _p),
        ("md", _p),
    ]


class QArch(ctypes.Structure):
    """``qarch``: what the layers do beyond the Llama layer."""

    _fields_ = [
        ("q_norm", _p),
        ("k_norm", _p),
        ("post_attn_norm", _p),
        ("post_mlp_norm", _p),
        ("window", _p),
        ("attn_scale", _f),
        ("embed_scale", _f),
        ("act", _i),
    ]


# ------------------------------------------------------------------------------------------------- specwise.h


class QShape(ctypes.Structure):
    """``qshape``: the shape of a stack of decoder layers."""

    _fields_ = [
        ("layers", _i64),
        ("hidden", _i64),
        ("heads", _i64),
        ("kv_heads", _i64),
        ("head_dim", _i64),
        ("inter", _i64),
        ("eps", _f),
    ]


class QLayers(ctypes.Structure):
    """``qlayers``: the layers' norms, matrices (7 per layer), biases and variant."""

    _fields_ = [
        ("attn_norm", _p),
        ("weights", _ptr(QMat)),
        ("n_weights", _i64),
        ("qkv_bias", _p),
        ("o_bias", _p),
        ("mlp_norm", _p),
        ("arch", _ptr(QArch)),
    ]


class QRows(ctypes.Structure):
    """``qrows``: a pass's rows, their caches, capacities and positions, and the rotary tables."""

    _fields_ = [
        ("x", _p),
        ("x_floats", _i64),
        ("rows", _i64),
        ("k_rows", _p),
        ("v_rows", _p),
        ("cap", _p),
        ("pos", _p),
        ("cos", _p),
        ("sin", _p),
        ("cos_local", _p),
        ("sin_local", _p),
        ("table_rows", _i64),
        ("kv_half", _i32),
    ]


class QWork(ctypes.Structure):
    """``qwork``: the scratch and scores buffers with the floats each holds."""

    _fields_ = [("scratch", _p), ("scratch_floats", _i64), ("scores", _p), ("scores_floats", _i64)]


class QRun(ctypes.Structure):
    """``qrun``: threads, mode and attention (0: float32, 1: bfloat16) of a call."""

    _fields_ = [("threads", _i64), ("mode", _i32), ("attention", _i32)]


class QModel(ctypes.Structure):
    """``qmodel``: a model's embedding, final norm and output layer."""

    _fields_ = [("embed", _ptr(QMat)), ("final_norm", _p), ("final_eps", _f), ("head", _ptr(QMat))]


class QPass(ctypes.Structure):
    """``qpass``: one sequence's tokens, and where its features and logits go."""

    _fields_ = [
        ("ids", _p),
        ("keep", _i64),
        ("features", _p),
        ("features_floats", _i64),
        ("logits", _p),
        ("logits_floats", _i64),
    ]


class QHead(ctypes.Structure):
    """``qhead``: the head drafter's norms and input projection around its layer."""

    _fields_ = [("feature_norm", _p), ("embed_norm", _p), ("fc", _ptr(QMat)), ("out_norm", _p)]


class QStep(ctypes.Structure):
    """``qstep``: one step of the head over n positions of its cache."""

    _fields_ = [
        ("features", _p),
        ("emb", _p),
        ("n", _i64),
        ("k_cache", _p),
        ("v_cache", _p),
        ("cap", _i64),
        ("start", _i64),
        ("cos", _p),
        ("sin", _p),
        ("table_rows", _i64),
        ("pred", _p),
    ]


class QLogits(ctypes.Structure):
    """``qlogits``: the output layer over a head step's last row, and where its results go."""

    _fields_ = [("out_w", _ptr(QMat)), ("logits", _p), ("logits_floats", _i64), ("best", _p), ("top_prob", _p)]


class SpmVocab(ctypes.Structure):
    """``spmvocab``: a SentencePiece-style vocabulary and its merges as the encoder reads them (spm.c)."""

    _fields_ = [
        ("bytes", _p),
        ("offsets", _p),
        ("n", _i64),
        ("longest", _i64),
        ("table", _p),
        ("table_size", _i64),
        ("kinds", _p),
        ("groups", _p),
        ("pair_keys", _p),
        ("pair_values", _p),
        ("pairs_size", _i64),
        ("added_lengths", _p),
        ("added_max", _i64),
        ("byte_ids", _p),
        ("unk", _i32),
        ("space_prefix", _i32),
    ]


# ------------------------------------------------------------------------------------------------- functions

_d, _i64p, _ip = ctypes.c_double, _ptr(_i64), _ptr(_i)

# name: (argument types, return type), in the header's order
SIGNATURES: dict[str, tuple[list, object]] = {
    "specwise_q_isa_supported": ([], _i),
    "specwise_q_isa": ([], _i),
    "specwise_attention_bf16_supported": ([], _i),
    "specwise_q_set_isa": ([_i], _i),
    "specwise_q_layout": ([_i] + [_ip] * 8, _i),
    "specwise_q_sizes": ([_i, _i64, _i64] + [_i64p] * 5, _i),
    "specwise_q_repack": ([_ptr(QPack), _p, _i64, _i64, _i64], _i),
    "specwise_q_repack_jobs": ([_ptr(QJob), _i64, _i64p], _i),
    "specwise_q_gemm": ([_ptr(QMat), _i, _p, _p, _p, _i, _i, _i], _i),
    "specwise_q_row": ([_ptr(QMat), _i64, _p], _i),
    "specwise_q_gather": ([_ptr(QMat), _p, _i64, _p], _i),
    "specwise_q_requantize_q4_0": ([_ptr(QMat), _i64, _i64, _p, _i64], _i),
    "specwise_q_abs_sum": ([_ptr(QMat), _i64, _i64], _d),
    "specwise_logits_scan": ([_p, _i, _i, _p], _i),
    "specwise_qllama_timings": ([_i, _p], None),
    "specwise_qllama_scratch_floats": ([_ptr(QShape), _i64], _i64),
    "specwise_qllama_rows": ([_ptr(QShape), _ptr(QLayers), _ptr(QRows), _ptr(QWork), _ptr(QRun)], _i),
    "specwise_qllama_attention": (
        [_ptr(QShape), _ptr(QRows), _i64, _i64, _f, _p, _p, _ptr(QWork), _ptr(QRun), _i64],
        _i,
    ),
    "specwise_rms_norm_rows": ([_p, _p, _p, _i, _i, _f], None),
    "specwise_qllama_forward": (
        [_ptr(QShape), _ptr(QLayers), _ptr(QRows), _ptr(QWork), _ptr(QRun), _ptr(QModel), _ptr(QPass)],
        _i,
    ),
    "specwise_head_step": (
        [_ptr(QShape), _ptr(QLayers), _ptr(QHead), _ptr(QStep), _ptr(QWork), _ptr(QRun), _ptr(QLogits)],
        _i,
    ),
    "specwise_probs": ([_p, _i, _i, _f, _i, _d, _f, _p], _i),
    "specwise_sample": ([_p, _i, _i, _p, _p], _i),
    "specwise_spm_index": ([_ptr(SpmVocab), _p], _i64),
    "specwise_spm_lookup": ([_ptr(SpmVocab), _p, _p, _i64, _p], _i64),
    "specwise_spm_pairs": ([_ptr(SpmVocab), _p, _p, _p, _i64, _p, _p], _i64),
    "specwise_spm_encode": ([_ptr(SpmVocab), _p, _i64, _p, _i64, _p], _i64),
    "specwise_spm_decode": ([_ptr(SpmVocab), _p, _i64, _i, _p, _i64], _i64),
}


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set every function's argument and return types on the loaded library (once, when it loads)."""
    for name, (args, res) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    return lib


def pointer_to(obj):
    """A typed pointer to a ctypes struct, or to the first struct of an array of them, for the kernels' struct
    arguments and struct-pointer fields (the struct must stay alive as long as the pointer is used)."""
    if isinstance(obj, ctypes.Structure):
        return ctypes.pointer(obj)
    if isinstance(obj, ctypes.Array) and issubclass(obj._type_, ctypes.Structure):
        return ctypes.cast(obj, _ptr(obj._type_))
    raise TypeError(f"pointer_to takes a ctypes Structure or an array of them, got {type(obj).__name__}")
