"""The native Llama-family model against the Hugging Face reference (the hf extra), and the small-row kernel
(numpy arrays in and out: no torch needed)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import needs_hf, tiny_llama
from specwise.drafters import ModelDrafter, NgramDrafter, NoDrafter
from specwise.engine import Engine
from specwise.models import kernels, load_model
from specwise.sampling import SamplingParams


def logits(model, ids):
    model.reset()
    out = model.forward(np.array(ids))
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.flags.c_contiguous
    return out


def models():
    """(HFModel, NativeModel), imported where the hf extra is installed (the test is skipped otherwise)."""
    needs_hf()
    from specwise.models import HFModel, NativeModel

    return HFModel, NativeModel


def close(got, want, tol: float) -> None:
    np.testing.assert_allclose(got, want, atol=tol, rtol=tol)


def tiny_family(arch: str, seed: int = 0):
    torch = needs_hf()
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=80,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.5,
    )
    torch.manual_seed(seed)
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False)).eval()
    return MistralForCausalLM(MistralConfig(**common, sliding_window=None)).eval()


@pytest.mark.parametrize("backend", ["torch", "kernel"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_native_logits_match_hf(arch, backend):
    HFModel, NativeModel = models()
    hf = tiny_llama(seed=5) if arch == "llama" else tiny_family(arch)
    if backend == "kernel" and not kernels.small_gemm_available():
        pytest.skip(f"kernel unavailable: {kernels.kernel_error()}")
    native = NativeModel(hf)
    native.set_gemm(default=backend)
    ids = [3, 14, 15, 9, 2, 6, 5, 35, 8, 9, 7, 9, 3]
    close(logits(native, ids), logits(HFModel(hf), ids), 1e-4)


@pytest.mark.skipif(not kernels.small_gemm_available(), reason=f"kernel unavailable: {kernels.kernel_error()}")
def test_native_layer_kernel_matches_hf_on_odd_shapes():
    """The one-call layer kernel (kernel backend): head_dim 12 (not a multiple of 8), GQA, biases on q/k/v and o,
    1..32 rows after a cached prefix, and a cache that grows; the same logits as the Hugging Face model."""
    HFModel, NativeModel = models()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=70,
        hidden_size=48,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.4,
        attention_bias=True,
    )
    torch.manual_seed(11)
    hf = LlamaForCausalLM(config).eval()
    native = NativeModel(hf, capacity=16)
    native.set_gemm(default="kernel")
    assert native._fused is not None  # the kernel path is the one under test
    ids = [(7 * i) % 69 + 1 for i in range(80)]
    ref = logits(HFModel(hf), ids)
    native.reset()
    out, pos = [], 0
    for k in (20, 1, 3, 32, 5, 19):  # 20 + 1 + 3 + 32 + 5 + 19 = 80
        out.append(native.forward(np.array(ids[pos : pos + k])))
        pos += k
    close(np.concatenate(out), ref, 1e-4)


def test_native_rollback_and_incremental_forward_match_one_pass():
    _, NativeModel = models()
    native = NativeModel(tiny_llama(seed=6))
    ids = list(range(1, 30))
    ref = logits(native, ids)
    native.reset()
    native.forward(np.array(ids[:10]))
    native.forward([77, 78, 79, 80])  # rejected draft (a list of ints is token ids too)
    native.rollback(10)
    parts = [native.forward(np.array(ids[10:13]))]
    for t in ids[13:]:
        parts.append(native.forward(np.array([t])))
    close(np.concatenate(parts), ref[10:], 1e-5)


def test_native_cache_grows_past_its_initial_capacity():
    HFModel, NativeModel = models()
    hf = tiny_llama(seed=7)
    native = NativeModel(hf, capacity=8)
    ids = [i % 90 + 1 for i in range(50)]
    close(logits(native, ids), logits(HFModel(hf), ids), 1e-4)


def test_native_num_logits_and_context_limit():
    _, NativeModel = models()
    native = NativeModel(tiny_llama(seed=8))
    assert native.device == "cpu"  # a plain string
    none = native.forward(np.array([1, 2, 3]), num_logits=0)
    assert none.shape == (0, native.vocab_size) and none.dtype == np.float32
    assert native.forward(np.array([4, 5]), num_logits=1).shape == (1, native.vocab_size)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        native.forward(np.zeros(600, dtype=np.int64))
    with pytest.raises(ValueError, match="1-D"):
        native.forward(np.array([[1, 2]]))


@pytest.mark.parametrize("backend", ["torch", "kernel"])
def test_native_features_are_float32_copies(backend):
    """Features come out as float32 numpy arrays, copies: a later pass over the same positions does not change
    what was read before."""
    _, NativeModel = models()
    native = NativeModel(tiny_llama(seed=8))
    native.set_gemm(default=backend)
    native.keep_features = True
    native.forward(np.array([1, 2, 3, 4]))
    first = native.features(0, 4)
    assert first.dtype == np.float32 and first.shape == (4, native.hidden)
    kept = first.copy()
    native.rollback(2)
    native.forward(np.array([9, 9]))
    np.testing.assert_array_equal(first, kept)
    assert not np.array_equal(native.features(2, 4), kept[2:])


def test_native_greedy_identity_and_sampling(tiny_target, tiny_target_twin):
    _, NativeModel = models()
    native = NativeModel(tiny_target.model)
    greedy = SamplingParams()
    plain_hf = Engine(tiny_target, NoDrafter()).generate([1, 2, 3], greedy, 30, eos_token_ids=[]).token_ids
    plain = Engine(native, NoDrafter()).generate([1, 2, 3], greedy, 30, eos_token_ids=[]).token_ids
    assert plain == plain_hf
    draft = NativeModel(tiny_target_twin.model)
    for drafter in (ModelDrafter(draft), NgramDrafter()):
        assert Engine(native, drafter, gamma=4).generate([1, 2, 3], greedy, 30, eos_token_ids=[]).token_ids == plain


def test_decoder_layer_matches_hf_with_and_without_autograd():
    """The shared torch layer (native model, head) on a Hugging Face layer's fused weights equals that layer, and its
    in-place path (no autograd) gives the values of its autograd path."""
    _, NativeModel = models()
    import torch

    from specwise.models.layer import causal_mask, decoder_layer, qkv_heads

    hf = tiny_llama(seed=3)
    native = NativeModel(hf)
    layer, n = native.layers[0], 6
    cos, sin = native._cos[:n, None], native._sin[:n, None]

    def attend(qkv):
        q, k, v = qkv_heads(qkv, native.n_heads, native.n_kv, native.head_dim, cos, sin)
        mask = causal_mask(0, n, "cpu")
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, enable_gqa=True
        )
        return out.transpose(0, 1).reshape(n, -1)

    def project(linear, rows):
        return linear(rows, "torch")

    x = torch.randn(n, native.hidden)
    with torch.no_grad():
        in_place = decoder_layer(x.clone(), layer, native.eps, attend, project)
        position_ids = torch.arange(n)[None]
        embeddings = hf.model.rotary_emb(x[None], position_ids)
        ref = hf.model.layers[0](
            x[None],
            position_embeddings=embeddings,
            attention_mask=torch.where(causal_mask(0, n, "cpu"), 0.0, -1e9)[None, None],
        )
        ref = ref[0] if isinstance(ref, tuple) else ref
    with torch.enable_grad():
        graph = decoder_layer(x.clone().requires_grad_(), layer, native.eps, attend, project)
    assert torch.equal(in_place, graph.detach())
    torch.testing.assert_close(in_place, ref[0], atol=1e-5, rtol=1e-5)


def test_unsupported_architecture_falls_back_to_hf(tmp_path):
    HFModel, _ = models()
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=64)).save_pretrained(
        tmp_path / "gpt2"
    )
    loaded = load_model(str(tmp_path / "gpt2"))
    assert isinstance(loaded.model, HFModel)
    with pytest.raises(NotImplementedError, match="native model cannot run it"):
        load_model(str(tmp_path / "gpt2"), impl="native")
    with pytest.raises(ValueError, match="unknown implementation"):
        load_model(str(tmp_path / "gpt2"), impl="fast")


def float_layer_weights(rng, layers=2, hidden=40, heads=4, kv=2, head_dim=10, inter=24, dtype=np.float32):
    """Random per-layer weights for :func:`kernels.layer_kernel` (biases on q/k/v and o)."""

    def mat(*shape):
        return (0.3 * rng.standard_normal(shape, dtype=np.float32)).astype(dtype)

    def vec(n):
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    qkv_out = (heads + 2 * kv) * head_dim
    return dict(
        attn_norm=[vec(hidden) for _ in range(layers)],
        qkv=[mat(qkv_out, hidden) for _ in range(layers)],
        qkv_bias=[vec(qkv_out) for _ in range(layers)],
        o=[mat(hidden, heads * head_dim) for _ in range(layers)],
        o_bias=[vec(hidden) for _ in range(layers)],
        mlp_norm=[vec(hidden) for _ in range(layers)],
        gate_up=[mat(2 * inter, hidden) for _ in range(layers)],
        down=[mat(hidden, inter) for _ in range(layers)],
    )


def test_the_float_kernels_give_the_same_bits_on_every_path():
    """The float products (float rows of the library's one table) and the float layers run on every instruction
    path the CPU has, portable included, and every path gives the same bits: the products while the rows of x stream
    from L1 and in tiles past it, float32 and float16 weights; the layers (one layer kernel for float and quantized
    weights) over a prefix and then single rows."""
    from specwise.models.kernels import quant
    from specwise.models.kernels.layers import inverse_frequencies, rotary_tables

    if kernels.native_library() is None:
        pytest.skip(f"kernels not built: {kernels.kernel_error()}")
    best = quant.set_isa(None)
    paths = quant.ISAS[: quant.ISAS.index(best) + 1]
    rng = np.random.default_rng(3)
    products = []
    for k, n_in, n_out in ((3, 40, 24), (5, 1000, 13), (7, 576, 9), (1, 9, 5)):  # 5 x 1000: tiles (past L1)
        x, w = rng.standard_normal((k, n_in), dtype=np.float32), rng.standard_normal((n_out, n_in), dtype=np.float32)
        b = rng.standard_normal(n_out, dtype=np.float32)
        products.append((x, w, b))
        products.append((x, w.astype(np.float16), None))
    weights = float_layer_weights(rng)
    head_dim, layers, kv, capacity = 10, 2, 2, 24
    cos, sin = rotary_tables(inverse_frequencies(head_dim, 10000.0), capacity)
    x0 = rng.standard_normal((9, 40), dtype=np.float32)
    results = {}
    try:
        for path in paths:
            assert quant.set_isa(path) == path
            assert kernels.small_gemm_available()
            got = [kernels.small_gemm(x, w, b) for x, w, b in products]
            kernel = kernels.layer_kernel(40, 4, kv, head_dim, 24, 1e-5, **weights)
            assert kernel is not None
            caches = [np.zeros((layers, kv, capacity, head_dim), dtype=np.float32) for _ in range(2)]
            xs = [x0[:6].copy(), x0[6:7].copy(), x0[7:9].copy()]
            start = 0
            for x in xs:
                kernel.run(x, start, *caches, capacity, cos, sin)
                start += x.shape[0]
            results[path] = (got, xs, caches)
    finally:
        quant.set_isa(None)
    for got, (x, w, b) in zip(results[paths[0]][0], products):  # the numbers themselves: a float64 reference
        close(got, x.astype(np.float64) @ w.T.astype(np.float64) + (0.0 if b is None else b), 1e-4)
    for path in paths[1:]:
        for a, b in zip(results[paths[0]][0], results[path][0]):
            np.testing.assert_array_equal(a, b, err_msg=f"small_gemm on {path}")
        for a, b in zip(results[paths[0]][1] + results[paths[0]][2], results[path][1] + results[path][2]):
            np.testing.assert_array_equal(a, b, err_msg=f"the float layers on {path}")


@pytest.mark.skipif(not kernels.small_gemm_available(), reason=f"kernel unavailable: {kernels.kernel_error()}")
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 16, 32])
@pytest.mark.parametrize(("n_out", "n_in"), [(96, 64), (7, 9), (5, 3), (130, 576)])
def test_small_gemm_matches_float64_reference(rows, n_out, n_in):
    rng = np.random.default_rng(rows * 1000 + n_out)
    x = rng.standard_normal((rows, n_in), dtype=np.float32)
    w = rng.standard_normal((n_out, n_in), dtype=np.float32)
    b = rng.standard_normal(n_out, dtype=np.float32)
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + b
    y = kernels.small_gemm(x, w, b)
    assert y.dtype == np.float32 and y.shape == (rows, n_out) and y.flags.c_contiguous
    close(y, ref, 1e-4)
    close(kernels.small_gemm(x, w), ref - b, 1e-4)


@pytest.mark.skipif(not kernels.small_gemm_available(), reason=f"kernel unavailable: {kernels.kernel_error()}")
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 40])
@pytest.mark.parametrize(("n_out", "n_in"), [(96, 64), (7, 9), (130, 576)])
def test_small_gemm_with_float16_weights_matches_float64_reference(rows, n_out, n_in):
    rng = np.random.default_rng(rows * 1000 + n_out)
    x = rng.standard_normal((rows, n_in), dtype=np.float32)
    w = rng.standard_normal((n_out, n_in), dtype=np.float32).astype(np.float16)
    b = rng.standard_normal(n_out, dtype=np.float32)
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + b
    close(kernels.small_gemm(x, w, b), ref, 1e-4)


def test_small_gemm_reads_its_weight_in_place_and_does_not_keep_it_alive():
    """small_gemm makes a weight's struct once: a later call sees the weight's values as they are then, and the
    weight is freed once its owner drops it (the struct does not hold it)."""
    import gc
    import weakref

    if not kernels.small_gemm_available():
        pytest.skip(f"kernel unavailable: {kernels.kernel_error()}")
    x = np.ones((2, 24), dtype=np.float32)
    w = np.ones((5, 24), dtype=np.float32)
    np.testing.assert_array_equal(kernels.small_gemm(x, w), np.full((2, 5), 24.0, dtype=np.float32))
    w[3] = 2.0
    np.testing.assert_array_equal(kernels.small_gemm(x, w)[:, 3], [48.0, 48.0])
    gone = weakref.ref(w)
    del w
    gc.collect()
    assert gone() is None
    other = np.full((5, 24), 3.0, dtype=np.float32)  # may take the freed array's place in memory and its id
    np.testing.assert_array_equal(kernels.small_gemm(x, other), np.full((2, 5), 72.0, dtype=np.float32))


def test_the_native_model_passes_numpy_views_to_the_kernels(monkeypatch):
    """The float32 native model hands the kernels numpy views of its CPU tensors (the same memory: the layer
    kernel's writes to x and the caches are the model's), never torch tensors."""
    if not kernels.small_gemm_available():
        pytest.skip(f"kernel unavailable: {kernels.kernel_error()}")
    HFModel, NativeModel = models()
    from specwise.models import native as native_module

    seen = []
    real = native_module.small_gemm

    def spy(x, weight, bias=None, *args):
        seen.append((x, weight, bias))
        return real(x, weight, bias, *args)

    monkeypatch.setattr(native_module, "small_gemm", spy)
    hf = tiny_llama(seed=5)
    model = NativeModel(hf)
    model.set_gemm(default="kernel")
    ids = [3, 14, 15, 9]
    close(logits(model, ids), logits(HFModel(hf), ids), 1e-4)
    assert seen and all(isinstance(a, np.ndarray) for x, w, b in seen for a in (x, w) + (() if b is None else (b,)))
    assert np.shares_memory(seen[-1][1], model.lm_head.weight.numpy())  # the weight read in place
    assert np.abs(model.k_cache.numpy()[:, :, : len(ids)]).sum() > 0  # the layer kernel wrote the model's cache


@pytest.mark.slow
def test_native_matches_hf_on_the_default_model(smollm_hf):
    """Max abs logit difference <= 1e-4 in float32 on the real model, and the same greedy output."""
    HFModel, NativeModel = models()
    from specwise.runtime import encode_prompt

    hf = HFModel(smollm_hf.hf_model)
    native = NativeModel(smollm_hf.hf_model)
    ids = encode_prompt(smollm_hf.tokenizer, "Explain what a prime number is.", chat=True)
    diff = float(np.abs(logits(native, ids) - logits(hf, ids)).max())
    assert diff <= 1e-4, f"native logits differ from the reference by {diff}"
    greedy = SamplingParams()
    a = Engine(native, NoDrafter()).generate(ids, greedy, 32).token_ids
    b = Engine(hf, NoDrafter()).generate(ids, greedy, 32).token_ids
    assert a == b
