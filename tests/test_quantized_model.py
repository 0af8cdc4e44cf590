"""QuantizedModel on tiny Llama and Qwen2 GGUF files written here (gguf.GGUFWriter), against a float64 numpy
decoder written here from the file's dequantized tensors (``gguf.quants.dequantize``).

The reference applies rotary embeddings the way llama.cpp does on the file's own rows (adjacent pairs for
"llama", whose Q/K rows the converter permuted; halves for "qwen2"), so it also checks the model's un-permutation.

Bounds (max |logit - reference| / max |reference logit| over a 24-token sequence, float64 reference):
- ``exact``: EXACT_REL = 1e-5 (measured: 2.5e-7 .. 1.1e-6 over three sequences and every variant: float32 sums in
  another order);
- ``q8``: Q8_REL = 5e-2 (activations rounded to 8 bits per block of 32 in every product; measured, max over three
  sequences: Q4_0 1.6e-2, Q4_1 2.2e-2, Q8_0 1.5e-2, Q5_0 2.0e-2, K-quants 3.0e-2, Qwen2 Q5_1 1.4e-2, F16 4e-7: the
  float formats have no integer path).
Everything else is bit for bit: a row's logits do not depend on how the sequence was cut into passes, on
or on rollbacks; so greedy speculative decoding equals plain greedy decoding.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from specwise.drafters import Draft, Drafter, ModelDrafter, NgramDrafter, NoDrafter  # noqa: E402
from specwise.engine import Engine  # noqa: E402
from specwise.models.kernels import quant  # noqa: E402
from specwise.models.threads import get_num_threads, set_num_threads  # noqa: E402
from specwise.sampling import SamplingParams  # noqa: E402

if not quant.quantized_available():
    pytest.skip("the native quantized kernels are not built", allow_module_level=True)

from specwise.models.kernels.quant import MAX_ROWS  # noqa: E402
from specwise.models.quantized import QuantizedModel  # noqa: E402

EXACT_REL = 1e-5
Q8_REL = 5e-2
GREEDY = SamplingParams(temperature=0.0)
KQUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
PRECISIONS = ("exact", "q8")


@dataclass
class Spec:
    arch: str = "llama"
    types: dict = field(default_factory=dict)  # role ("matrix", "embed", "output", or a tensor suffix) -> type
    tied: bool = True  # no output.weight: the output layer is token_embd
    hidden: int = 64
    ffn: int = 128
    heads: int = 4
    kv_heads: int = 2
    layers: int = 2
    vocab: int = 100  # not a multiple of 16: a partial tile in the output layer
    theta: float = 10000.0
    eps: float = 1e-5
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def type_of(self, name: str):
        if name.startswith("token_embd."):
            role = "embed"
        elif name.startswith("output."):
            role = "output"
        else:
            role = name.split(".")[2]  # blk.N.<role>.weight
        return self.types.get(role, self.types["matrix"])


VARIANTS = {
    "llama-Q4_0": Spec(types={"matrix": T.Q4_0}),
    "llama-Q4_1": Spec(types={"matrix": T.Q4_1, "embed": T.Q8_0, "output": T.Q4_1}, tied=False, seed=1),
    "llama-Q8_0": Spec(types={"matrix": T.Q8_0}, seed=2),
    "llama-Q5_0": Spec(types={"matrix": T.Q5_0, "embed": T.F16, "output": T.F16}, tied=False, seed=3),
    "llama-F16": Spec(types={"matrix": T.F16}, seed=4),
    "llama-K": Spec(
        types={"matrix": T.Q4_K, "attn_v": T.Q6_K, "ffn_down": T.Q5_K, "embed": T.Q6_K, "output": T.Q5_K},
        tied=False,
        hidden=256,
        ffn=512,
        heads=4,
        kv_heads=2,
        seed=5,
    ),
    "qwen2-Q5_1": Spec(arch="qwen2", types={"matrix": T.Q5_1, "embed": T.Q8_0}, kv_heads=1, theta=1e6, seed=6),
}


# ---- writing the file ---------------------------------------------------------------------------------------


def kquant_blocks(rng, t, out: int, n_in: int, std: float) -> np.ndarray:
    """Random K-quant blocks (any bytes are valid ones) whose float16 scales give weights of about ``std``:
    d and dmin random positive, dmin chosen so that the asymmetric formats are roughly centred."""
    block, size = gguf.GGML_QUANT_SIZES[t]
    blocks = rng.integers(0, 256, size=(out * n_in // block, size), dtype=np.uint8)
    n = blocks.shape[0]
    d = rng.uniform(0.5, 1.5, size=n)

    def set_scales(scale: float) -> np.ndarray:
        if t == T.Q6_K:
            blocks[:, 208:210] = (d * scale).astype(np.float16).view(np.uint8).reshape(n, 2)
        else:
            centre = 7.5 if t == T.Q4_K else 15.5  # mean of q
            blocks[:, 0:2] = (d * scale).astype(np.float16).view(np.uint8).reshape(n, 2)
            blocks[:, 2:4] = (d * scale * centre).astype(np.float16).view(np.uint8).reshape(n, 2)
        return gguf.quants.dequantize(blocks.reshape(out, -1), t)

    unit = set_scales(1e-3).std()
    set_scales(1e-3 * std / unit)
    return blocks.reshape(out, -1)


def encode(rng, t, out: int, n_in: int, std: float) -> np.ndarray:
    """Bytes ``[out, row bytes]`` of a random ``[out, in]`` matrix of about ``std`` stored as ``t``."""
    if t in KQUANTS:
        return kquant_blocks(rng, t, out, n_in, std)
    w = (rng.standard_normal((out, n_in)) * std).astype(np.float32)
    return np.ascontiguousarray(gguf.quants.quantize(w, t)).view(np.uint8).reshape(out, -1)


def write_gguf(path, spec: Spec) -> dict[str, np.ndarray]:
    """Write the model; returns every tensor as the float64 values the file holds (dequantized)."""
    rng = np.random.default_rng(100 + spec.seed)
    h, hd = spec.hidden, spec.head_dim
    shapes = {"token_embd.weight": (spec.vocab, h)}
    if not spec.tied:
        shapes["output.weight"] = (spec.vocab, h)
    for i in range(spec.layers):
        p = f"blk.{i}."
        shapes |= {
            p + "attn_q.weight": (spec.heads * hd, h),
            p + "attn_k.weight": (spec.kv_heads * hd, h),
            p + "attn_v.weight": (spec.kv_heads * hd, h),
            p + "attn_output.weight": (h, spec.heads * hd),
            p + "ffn_gate.weight": (spec.ffn, h),
            p + "ffn_up.weight": (spec.ffn, h),
            p + "ffn_down.weight": (h, spec.ffn),
        }
    writer = gguf.GGUFWriter(str(path), spec.arch)
    writer.add_block_count(spec.layers)
    writer.add_context_length(256)
    writer.add_embedding_length(h)
    writer.add_feed_forward_length(spec.ffn)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_rope_freq_base(spec.theta)
    writer.add_layer_norm_rms_eps(spec.eps)
    writer.add_rope_dimension_count(hd)
    values: dict[str, np.ndarray] = {}
    for name, (out, n_in) in shapes.items():
        t = spec.type_of(name)
        std = 0.5 if name.startswith(("token_embd", "output")) else 1.0 / math.sqrt(n_in)
        raw = encode(rng, t, out, n_in, std)
        writer.add_tensor(name, raw, raw_dtype=t)
        values[name] = gguf.quants.dequantize(raw, t).reshape(out, n_in).astype(np.float64)
    vectors = {"output_norm.weight": h}
    for i in range(spec.layers):
        vectors |= {f"blk.{i}.attn_norm.weight": h, f"blk.{i}.ffn_norm.weight": h}
        if spec.arch == "qwen2":
            vectors |= {
                f"blk.{i}.attn_q.bias": spec.heads * hd,
                f"blk.{i}.attn_k.bias": spec.kv_heads * hd,
                f"blk.{i}.attn_v.bias": spec.kv_heads * hd,
            }
    for name, n in vectors.items():
        base = 1.0 if name.endswith("norm.weight") else 0.0
        v = (base + 0.2 * rng.standard_normal(n)).astype(np.float32)
        writer.add_tensor(name, v)
        values[name] = v.astype(np.float64)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return values


@pytest.fixture(scope="module", params=list(VARIANTS))
def tiny(request, tmp_path_factory):
    """(path, spec, float64 tensors) of one tiny GGUF model."""
    spec = VARIANTS[request.param]
    path = tmp_path_factory.mktemp("gguf") / f"{request.param}.gguf"
    values = write_gguf(path, spec)
    return path, spec, values


@pytest.fixture(params=PRECISIONS)
def precision(request):
    return request.param


# ---- the reference ------------------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, positions: np.ndarray, theta: float, pairs: bool) -> np.ndarray:
    """Rotary embedding of ``x`` ``[T, heads, D]``: on adjacent pairs (2i, 2i + 1) (llama.cpp's mode for the
    converter's permuted Llama rows) or on halves (i, i + D/2) (Qwen2, and Hugging Face's rotate-half)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)  # [D/2]
    angle = positions.astype(np.float64)[:, None, None] * inv  # [T, 1, D/2]
    cos, sin = np.cos(angle), np.sin(angle)
    a, b = (x[..., 0::2], x[..., 1::2]) if pairs else (x[..., : d // 2], x[..., d // 2 :])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    if pairs:
        return np.stack([ra, rb], axis=-1).reshape(x.shape)
    return np.concatenate([ra, rb], axis=-1)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def reference(spec: Spec, w: dict[str, np.ndarray], tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(logits ``[T, vocab]``, final-normed hidden states ``[T, hidden]``), float64, of the whole sequence."""
    n, hd, group = len(tokens), spec.head_dim, spec.heads // spec.kv_heads
    positions = np.arange(n)
    x = w["token_embd.weight"][tokens]  # [T, hidden]
    causal = np.tril(np.ones((n, n), dtype=bool))
    for i in range(spec.layers):
        p = f"blk.{i}."

        def proj(name, h, p=p):
            y = h @ w[p + name + ".weight"].T
            return y + w[p + name + ".bias"] if p + name + ".bias" in w else y

        h = rms_norm(x, w[p + "attn_norm.weight"], spec.eps)
        q = proj("attn_q", h).reshape(n, spec.heads, hd)
        k = proj("attn_k", h).reshape(n, spec.kv_heads, hd)
        v = proj("attn_v", h).reshape(n, spec.kv_heads, hd)
        pairs = spec.arch == "llama"
        q, k = rope(q, positions, spec.theta, pairs), rope(k, positions, spec.theta, pairs)
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # query head j reads j // group
        scores = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
        scores = np.where(causal, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", probs, v).reshape(n, spec.heads * hd)
        x = x + attn @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], spec.eps)
        mlp = silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)
        x = x + mlp @ w[p + "ffn_down.weight"].T
    feats = rms_norm(x, w["output_norm.weight"], spec.eps)
    head = w["token_embd.weight"] if spec.tied else w["output.weight"]
    return feats @ head.T, feats


def sequence(spec: Spec, n: int = 40, seed: int = 0) -> list[int]:
    return random.Random(seed).choices(range(spec.vocab), k=n)


def fresh(tiny, precision: str) -> QuantizedModel:
    return QuantizedModel(tiny[0], precision=precision)


def ids(tokens: list[int]) -> np.ndarray:
    return np.array(tokens, dtype=np.int64)


def assert_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray) and got.dtype == want.dtype, (type(got), getattr(got, "dtype", None))
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.array_equal(got, want), f"max difference {np.abs(got - want).max():.3g}"


# ---- numbers ------------------------------------------------------------------------------------------------


def test_loads_the_file(tiny, precision):
    path, spec, _ = tiny
    model = fresh(tiny, precision)
    assert model.vocab_size == spec.vocab and model.hidden == spec.hidden and model.length == 0
    assert model.config.architecture == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[spec.arch]
    assert model.tied == spec.tied and model.max_length == 256
    assert (model.qkv_biases[0] is not None) == (spec.arch == "qwen2")
    assert model.precision == precision and model.weight_bytes > 0


def test_its_optional_abilities_are_declared_protocols(tiny):
    """The quantized model has the abilities the drafters ask for by type (models/base.py); the other models do not,
    so that a drafter needing one refuses them by their type."""
    from specwise.drafters.self_draft import check_self_target
    from specwise.models.base import OutputRows, QuantizedWeights, ReusableRows
    from specwise.models.toy import ToyModel

    model = QuantizedModel(tiny[0])
    assert isinstance(model, OutputRows) and isinstance(model, ReusableRows) and isinstance(model, QuantizedWeights)
    assert model.weight_bytes > model.lm_head.nbytes > 0
    toy = ToyModel.random(16, seed=0)
    assert not any(isinstance(toy, ability) for ability in (OutputRows, ReusableRows, QuantizedWeights))
    check_self_target(model)
    with pytest.raises(ValueError, match="the self drafter needs a GGUF target"):
        check_self_target(toy)


def test_logits_match_float64_reference(tiny, precision):
    _, spec, w = tiny
    tokens = sequence(spec, 24)
    want, want_feats = reference(spec, w, tokens)
    model = fresh(tiny, precision)
    model.keep_features = True
    logits = model.forward(tokens)  # a list of ints: any integer sequence is taken
    assert isinstance(logits, np.ndarray) and logits.dtype == np.float32 and logits.shape == (24, spec.vocab)
    assert logits.flags.c_contiguous
    bound = EXACT_REL if precision == "exact" else Q8_REL
    err = np.abs(logits.astype(np.float64) - want).max() / np.abs(want).max()
    assert err <= bound, f"{precision}: relative error {err:.2e} > {bound:.0e}"
    feats = model.features(0, 24)
    assert feats.dtype == np.float32
    feat_err = np.abs(feats.astype(np.float64) - want_feats).max() / np.abs(want_feats).max()
    assert feat_err <= bound, f"{precision}: features' relative error {feat_err:.2e} > {bound:.0e}"
    # greedy choices agree with the reference wherever the reference's top two are not within the error
    top2 = np.sort(want, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 4 * bound * np.abs(want).max()
    np.testing.assert_array_equal(logits.argmax(-1)[clear], want.argmax(-1)[clear])


# ---- row independence through the whole model ----------------------------------------------------------------


def test_every_cut_of_the_sequence_gives_the_same_logits(tiny, precision):
    """One pass (internally in chunks of MAX_ROWS), one token at a time, and prefill / decode / verify /
    rollback / verify: the same logits bit for bit."""
    _, spec, _ = tiny
    tokens = sequence(spec, MAX_ROWS + 13, seed=1)
    n = len(tokens)
    whole = fresh(tiny, precision).forward(ids(tokens))  # [n, vocab]
    assert whole.shape == (n, spec.vocab)

    single = fresh(tiny, precision)
    ones = np.concatenate([single.forward(ids([t])) for t in tokens])
    assert_bits(ones, whole)
    assert single.length == n

    model = fresh(tiny, precision)
    assert_bits(model.forward(ids(tokens[:13])), whole[:13])  # prefill
    for i in range(13, 20):  # decode
        assert_bits(model.forward(ids(tokens[i : i + 1])), whole[i : i + 1])
    assert_bits(model.forward(ids(tokens[20:25])), whole[20:25])  # a 5-token verification pass
    model.rollback(22)  # 2 of 4 drafted tokens accepted
    assert model.length == 22
    assert_bits(model.forward(ids(tokens[22:27])), whole[22:27])  # the next verification pass
    for lo, hi in ((27, 35), (35, 36), (36, n)):
        assert_bits(model.forward(ids(tokens[lo:hi])), whole[lo:hi])
    assert model.length == n


def test_num_logits(tiny, precision):
    _, spec, _ = tiny
    tokens = sequence(spec, MAX_ROWS + 8, seed=2)
    whole = fresh(tiny, precision).forward(ids(tokens))
    model = fresh(tiny, precision)
    assert_bits(model.forward(ids(tokens[:10]), num_logits=3), whole[7:10])
    empty = model.forward(ids(tokens[10:20]), num_logits=0)
    assert empty.shape == (0, spec.vocab) and model.length == 20
    assert_bits(model.forward(ids(tokens[20:]), num_logits=MAX_ROWS // 2 + 2), whole[-(MAX_ROWS // 2 + 2) :])
    model.rollback(0)
    assert_bits(model.forward(ids(tokens), num_logits=MAX_ROWS + 3), whole[-(MAX_ROWS + 3) :])  # across chunks


def test_rollback_then_forward_equals_fresh_forward(tiny, precision):
    _, spec, _ = tiny
    tokens = sequence(spec, 30, seed=3)
    junk = sequence(spec, 9, seed=4)
    whole = fresh(tiny, precision).forward(ids(tokens))
    model = fresh(tiny, precision)
    model.forward(ids(tokens[:12]))
    model.forward(ids(junk))  # rejected drafts
    model.rollback(12)
    assert_bits(model.forward(ids(tokens[12:20])), whole[12:20])
    model.forward(ids(junk[:3]))
    model.rollback(20)
    assert_bits(model.forward(ids(tokens[20:])), whole[20:])
    model.reset()
    assert model.length == 0
    assert_bits(model.forward(ids(tokens)), whole)
    with pytest.raises(ValueError):
        model.rollback(31)


def test_thread_count_changes_no_logit(tiny, precision):
    _, spec, _ = tiny
    tokens = sequence(spec, 20, seed=14)
    want = fresh(tiny, precision).forward(ids(tokens))
    threads = get_num_threads()
    try:
        for n in (1, 2, 3):  # whatever count the default pass above ran on (one per worker under pytest-xdist)
            set_num_threads(n)
            assert_bits(fresh(tiny, precision).forward(ids(tokens)), want)
    finally:
        set_num_threads(threads)


def test_instruction_paths_give_the_same_logits(tiny, precision):
    """The whole pass (products, attention, softmax, SiLU) gives the same bits on the portable, AVX2 and AVX-512
    paths."""
    from specwise.models.kernels import quant

    _, spec, _ = tiny
    tokens = sequence(spec, 45, seed=15)
    best = quant.set_isa(None)
    try:
        quant.set_isa("portable")
        want = fresh(tiny, precision).forward(ids(tokens))
        for name in quant.ISAS[1 : quant.ISAS.index(best) + 1]:
            quant.set_isa(name)
            assert_bits(fresh(tiny, precision).forward(ids(tokens)), want)
    finally:
        quant.set_isa(None)


def test_float16_cache_keeps_rows_independent_and_paths_identical(tiny):
    """The float16 KV cache option (q8): a token's logits are the same bits in a pass of its own, inside a longer
    pass and on every instruction path; close to the float32 cache's."""
    from specwise.models.kernels import quant

    path, spec, _ = tiny
    tokens = sequence(spec, 30, seed=17)
    whole = QuantizedModel(path, precision="q8", kv_cache="float16").forward(ids(tokens))
    step = QuantizedModel(path, precision="q8", kv_cache="float16")
    step.forward(ids(tokens[:20]))
    rows = [step.forward(ids([t])) for t in tokens[20:]]
    assert_bits(np.concatenate(rows), whole[20:])
    best = quant.set_isa(None)
    try:
        for name in quant.ISAS[: quant.ISAS.index(best) + 1]:
            quant.set_isa(name)
            assert_bits(QuantizedModel(path, precision="q8", kv_cache="float16").forward(ids(tokens)), whole)
    finally:
        quant.set_isa(None)
    f32 = QuantizedModel(path, precision="q8").forward(ids(tokens))
    assert np.abs(whole - f32).max() < 0.05 * np.abs(f32).max()
    with pytest.raises(ValueError, match="q8 choice"):
        QuantizedModel(path, precision="exact", kv_cache="float16")
    with pytest.raises(ValueError, match="kv_cache must be"):
        QuantizedModel(path, kv_cache="bfloat16")


@pytest.mark.parametrize("kv_cache", ["float32", "float16"])
def test_bfloat16_attention_keeps_rows_independent(tmp_path, kv_cache):
    """The bfloat16 attention option (q8, AVX512_BF16): a token's logits are the same bits in a pass of its own,
    inside longer passes of any cut and on 1-3 threads; close to the float32 attention's, and not its bits; refused
    in exact, and where the CPU or the path in use has no AVX512_BF16."""
    from specwise.models.kernels import quant

    spec = Spec(types={"matrix": T.Q8_0}, hidden=384, ffn=256, heads=6, kv_heads=2, seed=21)
    path = tmp_path / "grouped.gguf"
    write_gguf(path, spec)
    tokens = sequence(spec, 40, seed=23)
    with pytest.raises(ValueError, match="q8 choice"):
        QuantizedModel(path, precision="exact", attention="bfloat16")
    with pytest.raises(ValueError, match="attention must be"):
        QuantizedModel(path, attention="float16")
    try:
        quant.set_isa("avx2")
        with pytest.raises(ValueError, match="AVX512_BF16"):
            QuantizedModel(path, precision="q8", attention="bfloat16")
    finally:
        quant.set_isa(None)
    if not quant.attention_bf16_supported():
        pytest.skip("the CPU has no AVX512_BF16")

    def run(cut: int = 0) -> np.ndarray:
        model = QuantizedModel(path, precision="q8", kv_cache=kv_cache, attention="bfloat16")
        if not cut:
            return model.forward(ids(tokens))
        return np.concatenate([model.forward(ids(tokens[i : i + cut])) for i in range(0, len(tokens), cut)])

    want = run()
    f32 = QuantizedModel(path, precision="q8", kv_cache=kv_cache).forward(ids(tokens))
    assert not np.array_equal(want, f32)
    assert np.abs(want - f32).max() < 0.05 * np.abs(f32).max()
    for cut in (1, 3, 7):
        assert_bits(run(cut), want)
    threads = get_num_threads()
    try:
        for n in (1, 3):
            set_num_threads(n)
            assert_bits(run(), want)
            assert_bits(run(3), want)
    finally:
        set_num_threads(threads)


@pytest.mark.parametrize("kv_cache", ["float32", "float16"])
def test_heads_sharing_a_key_value_head_in_one_task(tmp_path, kv_cache):
    """Heads of 64 with three query heads per key-value head (the default model's shape): on AVX-512 a thread takes
    up to three of them in one pass over the keys and values. Every split of the tasks between threads, every
    instruction path, and every cut of the sequence into passes gives the same bits; the logits match the float64
    reference."""
    from specwise.models.kernels import quant

    spec = Spec(types={"matrix": T.Q8_0}, hidden=384, ffn=256, heads=6, kv_heads=2, seed=21)
    path = tmp_path / "grouped.gguf"
    w = write_gguf(path, spec)
    tokens = sequence(spec, 40, seed=22)

    def run(cut: int = 0) -> np.ndarray:
        model = QuantizedModel(path, precision="q8", kv_cache=kv_cache)
        if not cut:
            return model.forward(ids(tokens))
        return np.concatenate([model.forward(ids(tokens[i : i + cut])) for i in range(0, len(tokens), cut)])

    want = run()
    if kv_cache == "float32":
        ref, _ = reference(spec, w, tokens)
        assert np.abs(want.astype(np.float64) - ref).max() / np.abs(ref).max() <= Q8_REL
    for cut in (1, 3, 7):
        assert_bits(run(cut), want)
    threads = get_num_threads()
    try:
        for n in (1, 2, 3, 4, 5):  # ranges of tasks that start and end inside a group of heads (and the default)
            set_num_threads(n)
            assert_bits(run(), want)
            assert_bits(run(3), want)
    finally:
        set_num_threads(threads)
    best = quant.set_isa(None)
    try:
        for name in quant.ISAS[: quant.ISAS.index(best) + 1]:
            quant.set_isa(name)
            assert_bits(run(), want)
            assert_bits(run(5), want)
    finally:
        quant.set_isa(None)


def test_capacity_growth_keeps_the_cache(tiny, precision):
    """A model made with a small cache grows it mid-sequence without changing a logit."""
    _, spec, _ = tiny
    tokens = sequence(spec, 50, seed=5)
    whole = fresh(tiny, precision).forward(ids(tokens))
    small = QuantizedModel(tiny[0], precision=precision, capacity=8)
    got = np.concatenate([small.forward(ids(tokens[lo : lo + 7])) for lo in range(0, 50, 7)])
    assert_bits(got, whole)


def test_reserving_room_for_a_prompt_grows_the_cache_once(tiny, precision, monkeypatch):
    """reserve(n) makes room for n positions in one growth (a power of two): the prompt's slices then never grow
    the cache (no copy of what it holds mid-prompt), and every logit is the same as when it grew on the way."""
    _, spec, _ = tiny
    tokens = sequence(spec, 50, seed=6)
    grown = QuantizedModel(tiny[0], precision=precision, capacity=8)
    want = np.concatenate([grown.forward(ids(tokens[lo : lo + 7])) for lo in range(0, 50, 7)])
    model = QuantizedModel(tiny[0], precision=precision, capacity=8)
    first = model.forward(ids(tokens[:3]))
    model.reserve(50)
    assert model.length == 3 and model._capacity == 64  # the next power of two, what was fed kept
    growths = []
    monkeypatch.setattr(model, "_grow", lambda capacity: growths.append(capacity))
    got = np.concatenate([first] + [model.forward(ids(tokens[lo : lo + 7])) for lo in range(3, 50, 7)])
    assert growths == []
    assert_bits(got, want)
    model.reserve(40)  # room enough already: nothing happens
    assert growths == []


# ---- features -------------------------------------------------------------------------------------------------


def test_features(tiny, precision):
    _, spec, _ = tiny
    tokens = sequence(spec, MAX_ROWS + 6, seed=10)
    plain = fresh(tiny, precision)
    logits = plain.forward(ids(tokens))
    with pytest.raises(RuntimeError, match="keep_features"):
        plain.features(0, 1)

    whole = fresh(tiny, precision)
    whole.keep_features = True
    assert_bits(whole.forward(ids(tokens)), logits)  # keeping features changes no logit
    feats = whole.features(0, len(tokens))
    assert feats.shape == (len(tokens), spec.hidden)
    # the features are the output layer's input: the logits are the product of them
    assert_bits(quant.q_gemm(whole.lm_head, feats, mode=precision), logits)

    model = fresh(tiny, precision)
    model.keep_features = True
    model.forward(ids(tokens[:5]))
    model.forward(ids(tokens[5:9]), num_logits=0)
    model.forward(ids(tokens[9:]), num_logits=1)
    assert_bits(model.features(0, len(tokens)), feats)
    assert_bits(model.features(3, 7), feats[3:7])
    assert model.features(4, 4).shape == (0, spec.hidden)
    with pytest.raises(ValueError):
        model.features(0, len(tokens) + 1)
    model.rollback(10)
    with pytest.raises(ValueError):
        model.features(0, 11)


def test_bad_arguments(tiny):
    with pytest.raises(ValueError, match="precision"):
        QuantizedModel(tiny[0], precision="int4")
    model = fresh(tiny, "exact")
    for empty in (np.array([], dtype=np.int64), []):
        with pytest.raises(ValueError, match="non-empty"):
            model.forward(empty)
    with pytest.raises(ValueError, match="1-D"):
        model.forward(ids([[1, 2]]))
    with pytest.raises(TypeError, match="integers"):
        model.forward(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="context"):
        model.forward(ids([1] * 257))
    assert model.length == 0
    # any integer dtype and layout is taken: the same logits as int64 ids
    want = model.forward(ids([1, 2, 3]))
    for tokens in (np.array([1, 2, 3], dtype=np.int32), np.array([1, 9, 2, 9, 3])[::2], (1, 2, 3)):
        model.rollback(0)
        assert_bits(model.forward(tokens), want)


def test_a_token_outside_the_vocabulary_is_refused_and_changes_nothing(tiny):
    model = fresh(tiny, "q8")
    model.forward(ids([1, 2, 3]))
    vocab = model.vocab_size
    for bad in ([4, vocab], [-1], [5] * 70 + [vocab]):  # one call from embedding to logits; a prefill in slices
        with pytest.raises(IndexError, match="outside"):
            model.forward(ids(bad))
        assert model.length == 3
    want = fresh(tiny, "q8")
    assert_bits(model.forward(ids([4, 5])), want.forward(ids([1, 2, 3, 4, 5]))[3:])


# ---- greedy speculative decoding ------------------------------------------------------------------------------


class OneWrongDrafter(Drafter):
    """The target's own greedy chain (from a twin model) with one token made wrong, at a position that moves from
    step to step: rejections at every position, and rollbacks of the target's cache, through the engine."""

    name = "one-wrong"

    def __init__(self, twin: QuantizedModel) -> None:
        self.inner = ModelDrafter(twin)
        self.vocab = twin.vocab_size
        self.steps = 0

    def begin(self, prompt: list[int]) -> None:
        self.inner.begin(prompt)
        self.steps = 0

    def propose(self, context, k, params, generator, stop=0.0) -> Draft:
        draft = self.inner.propose(context, k, params, generator)
        if not len(draft):
            return draft
        tokens = np.array(draft.tokens, dtype=np.int64)
        j = self.steps % len(draft)
        self.steps += 1
        tokens[j] = (int(tokens[j]) + 1) % self.vocab
        return Draft(tokens)


def greedy(engine: Engine, prompt: list[int], n: int = 40):
    return engine.generate(prompt, GREEDY, max_new_tokens=n, eos_token_ids=[])


def test_greedy_speculative_equals_plain(tiny, precision):
    path, spec, _ = tiny
    target = fresh(tiny, precision)
    other = "q8" if precision == "exact" else "exact"
    for prompt in ([1, 5, 9, 2], [3, 3, 3, 3, 40, 41, 42, 3, 3, 40], sequence(spec, 20, seed=11)):
        plain = greedy(Engine(target, NoDrafter()), prompt).token_ids
        assert len(plain) == 40
        twin = greedy(Engine(target, ModelDrafter(QuantizedModel(path, precision=precision)), gamma=4), prompt)
        assert twin.token_ids == plain
        assert twin.stats.acceptance_rate == 1.0  # the draft's 1-row passes give the target's k-row logits
        assert greedy(Engine(target, NgramDrafter(), gamma=3), prompt).token_ids == plain
        mixed = ModelDrafter(QuantizedModel(path, precision=other))
        assert greedy(Engine(target, mixed, gamma=5), prompt).token_ids == plain
        wrong = greedy(Engine(target, OneWrongDrafter(QuantizedModel(path, precision=precision)), gamma=4), prompt)
        assert wrong.token_ids == plain
        assert 0 < wrong.stats.accepted < wrong.stats.drafted


# ---- a draft model's narrower weights -----------------------------------------------------------------------

WIDE = {"Q5_0", "Q5_1", "Q8_0", "Q5_K", "Q6_K", "F16", "BF16", "F32"}


def test_drafting_narrows_the_wide_matrices_to_q4_0(tiny):
    """drafting=True: every layer matrix and the output layer stored wider than 5 bits per weight become Q4_0 (the
    values gguf's own Q4_0 quantization gives from the file's), the others and the embedding stay as they are."""
    path, spec, _ = tiny
    plain, draft = QuantizedModel(path), QuantizedModel(path, drafting=True)
    for layer_p, layer_d in zip(plain.layers, draft.layers):
        for p, d in zip(layer_p, layer_d):
            assert d.type_name == ("Q4_0" if p.type_name in WIDE else p.type_name)
            want = p.dequantize()
            if p.type_name in WIDE:
                q4 = gguf.quants.quantize(want, T.Q4_0)
                want = gguf.quants.dequantize(q4, T.Q4_0).reshape(want.shape)
            assert np.array_equal(d.dequantize(), want)
    assert draft.embed.type_name == plain.embed.type_name
    assert draft.lm_head.type_name == ("Q4_0" if plain.lm_head.type_name in WIDE else plain.lm_head.type_name)
    assert draft.tied == (plain.tied and plain.lm_head.type_name not in WIDE)
    assert draft.vocab_size == plain.vocab_size
    if any(w.type_name in WIDE for layer in plain.layers for w in layer):
        assert draft.weight_bytes < plain.weight_bytes + (plain.lm_head.nbytes if plain.tied else 0)
    # the narrower model's rows are still independent of how many share a pass
    tokens = ids(sequence(spec, 12))
    one = np.concatenate([draft.forward(tokens[i : i + 1]) for i in range(len(tokens))])
    draft.reset()
    assert_bits(draft.forward(tokens), one)


def test_a_narrowed_draft_model_keeps_the_output_exact(tiny):
    path, spec, _ = tiny
    target = QuantizedModel(path)
    prompt = sequence(spec, 20, seed=11)
    plain = greedy(Engine(target, NoDrafter()), prompt).token_ids
    drafted = greedy(Engine(target, ModelDrafter(QuantizedModel(path, drafting=True)), gamma=4), prompt)
    assert drafted.token_ids == plain
    assert drafted.stats.drafted > 0


def test_a_model_drafter_is_loaded_narrowed(tiny, monkeypatch):
    """`--drafter model:ID` loads its model with drafting=True (the loader passes it to QuantizedModel)."""
    import specwise.models.loader as loader
    from specwise.drafters import make_drafter

    path, spec, _ = tiny
    seen = {}

    def fake_load(arg, **kwargs):
        seen.update(kwargs)
        model = QuantizedModel(path, drafting=kwargs["drafting"])
        return type("Loaded", (), {"model": model, "tokenizer": None})()

    monkeypatch.setattr(loader, "load_model", fake_load)
    target = type("Loaded", (), {"model": QuantizedModel(path), "tokenizer": None})()
    [drafter] = make_drafter(f"model:{path}", target)
    assert seen["drafting"] is True and drafter.model.drafting


# ---- rotary tables --------------------------------------------------------------------------------------------


def test_rotary_tables_are_the_correctly_rounded_values_on_every_machine():
    """The tables' cos and sin are those of float32 angles (position * frequency) taken in float64 from additions
    and multiplications only (the same bits everywhere, whatever math library numpy uses), rounded to float32:
    the correctly rounded values, as numpy's float64 sin and cos rounded give them."""
    from specwise.models.kernels.layers import inverse_frequencies, rotary_tables, sin_cos

    for head_dim, theta in ((64, 1e4), (128, 1e6), (16, 5e5)):
        inv = inverse_frequencies(head_dim, theta)
        assert inv.dtype == np.float32 and inv.shape == (head_dim // 2,)
        cos, sin = rotary_tables(inv, 3000)
        assert cos.shape == sin.shape == (3000, head_dim) and cos.dtype == sin.dtype == np.float32
        assert cos.flags.c_contiguous and sin.flags.c_contiguous
        angles = np.outer(np.arange(3000, dtype=np.float32), inv).astype(np.float64)
        want_cos, want_sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        np.testing.assert_array_equal(cos, np.concatenate([want_cos, want_cos], 1))
        np.testing.assert_array_equal(sin, np.concatenate([-want_sin, want_sin], 1))  # rotate-half's sign folded
        some, _ = rotary_tables(inv, np.array([7, 2999]))
        np.testing.assert_array_equal(some, cos[[7, 2999]])
    x = np.random.default_rng(0).uniform(-(2.0**25), 2.0**25, 100_000)
    s, c = sin_cos(x)
    assert np.abs(s - np.sin(x)).max() <= 2.3e-16 and np.abs(c - np.cos(x)).max() <= 2.3e-16
    with pytest.raises(ValueError, match="2\\^26"):
        sin_cos(np.array([2.0**26]))
