"""Each architecture against its Hugging Face model (DESIGN.md lesson 16): a tiny random ``transformers`` model,
written to GGUF by ``specwise.models.gguf_write`` (llama.cpp's names and conventions), decoded by the quantized
native model and by the Hugging Face fallback, and compared with the Hugging Face model itself.

The models: hidden 64, heads 4, key-value heads 2, vocabulary 128 (Phi-3: 32,064), random norms and biases, and
attention sharpened so that a position or rotation wrong anywhere shows: query and key projections scaled by SHARP
(by NORM_SHARP through the query and key norms of Qwen3 and Gemma 3, which would undo a projection's scale); on
average the most-attended position holds 45-69% of a row's attention. 260 positions of random tokens fed in passes
of 1 to 130 rows (the cache read across passes): past Gemma 3's 16-token window, 4x llama3's 64-token original
context.

The reference is the Hugging Face model in float64 with eager attention (its rotary angles are float32, as
Hugging Face computes them whatever the dtype). Bounds, with what was measured over the 260 positions (logits up
to about 4):

- ``exact`` on the F32 file: max |logit - reference| <= EXACT_TOL = 1e-4. Measured: llama 1.5e-5, qwen2 1.0e-5,
  llama3 7.7e-5, qwen3 1.3e-5, gemma3 3.0e-5, phi3 2.1e-5 (the float32 Hugging Face model: 1.0e-5 .. 2.8e-5;
  llama3's frequencies are divided by the file's factors as llama.cpp does, not scaled as transformers does);
- ``q8`` on the Q8_0 file against the reference holding the file's Q8_0 weights: the same greedy (argmax) choice
  at Q8_AGREE = 0.85 of the positions (measured: llama 0.93, qwen2 0.94, llama3 0.89, qwen3 0.94, gemma3 0.92,
  phi3 0.88: on
  a 64-wide model sharp attention turns the 8-bit activations' rounding into score changes, max |q8 - reference|
  0.24 .. 0.45), and at 98% of those where the reference's top two logits are DECISIVE apart (measured: 100%,
  phi3 99%);
- the Hugging Face fallback (``load_model(path, impl="hf")``: transformers' GGUF loader, float32): EXACT_TOL.
  Measured: llama 2.1e-5, qwen2 1.4e-5, qwen3 1.2e-5, phi3 2.7e-5, gemma3 2.2e-5. It ignores every rope scaling
  a file states: the fallback refuses such files (FALLBACK_REFUSES, and the variants).

An architecture the native model does not run yet is skipped ("not yet native: <its refusal>") until it does;
llama and qwen2 must pass. A variant the file names and a model does not implement must be refused with
NotImplementedError naming it, or match the reference: never run wrongly. About 10 s on 2 cores.

The Hugging Face models need the hf extra (torch and transformers): without it the module is skipped. The models
under test take numpy token ids and return numpy logits (the Model contract); the references are computed in torch
and compared as numpy arrays.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import pytest

from conftest import needs_hf

torch = needs_hf()  # the whole module: every case is a Hugging Face model
gguf = pytest.importorskip("gguf")
import transformers  # noqa: E402

from specwise.models.gguf_file import GGUFFile  # noqa: E402
from specwise.models.gguf_write import llama3_rope_factors, permute_rotary_rows, write_gguf  # noqa: E402
from specwise.models.kernels import quant  # noqa: E402

EXACT_TOL = 1e-4
Q8_AGREE = 0.85
DECISIVE = 0.2  # a reference margin (top logit - second) past q8's rounding (max |q8 - reference| 0.2 .. 0.45)
SHARP = 3.0  # query and key projections scaled by this
NORM_SHARP = 1.8  # query and key norms (Qwen3, Gemma 3) multiply by this (queries and keys of unit RMS)
POSITIONS = 260
PASSES = (130, 1, 1, 1, 7, 16, 33, 1, 70)  # rows per pass: a prefill, single steps, drafts, a long verify
VOCAB = 128
Q8 = gguf.GGMLQuantizationType.Q8_0
assert sum(PASSES) == POSITIONS


@dataclass(frozen=True)
class Case:
    """A tiny Hugging Face model: its config class and arguments; ``required``: the native model must run it."""

    config: str
    args: dict = field(default_factory=dict)
    required: bool = False
    layers: int = 2
    vocab: int = VOCAB


ROPE_LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,  # wavelengths 6 (kept), 20 and 63 (smoothed), 199... (divided by 8)
}
CASES = {
    "llama": Case("LlamaConfig", {"tie_word_embeddings": False}, required=True),
    "qwen2": Case("Qwen2Config", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, required=True),
    "llama3": Case("LlamaConfig", {"rope_parameters": ROPE_LLAMA3}),
    # head_dim 128 as in every Qwen3 (not hidden / heads: key_length must be read), q/k norms
    "qwen3": Case("Qwen3Config", {"head_dim": 128}),
    # fused attn_qkv and ffn_up; vocabulary past Phi3Config's default pad id 32000, which transformers' GGUF loader
    # keeps (a GGUF file has no pad id for the config)
    "phi3": Case("Phi3Config", {"original_max_position_embeddings": 512, "tie_word_embeddings": False}, vocab=32064),
    # every 6th layer global (llama.cpp's fixed pattern), the others a 16-token window; head_dim 256 and
    # query_pre_attn_scalar 256 as in Gemma 3 1B-12B (a GGUF file states neither scalar nor pattern)
    "gemma3": Case("Gemma3TextConfig", {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 16}, layers=6),
}
# variants the native model may not implement: refused naming what, or exact
VARIANTS = {
    "llama-linear": Case("LlamaConfig", {"rope_parameters": {"rope_type": "linear", "factor": 4.0}}),
    "llama-yarn": Case(
        "LlamaConfig",
        {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
    ),
    "qwen2-yarn": Case(
        "Qwen2Config",
        {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
    ),
    "phi3-longrope": Case(
        "Phi3Config",
        {
            "original_max_position_embeddings": 64,
            "tie_word_embeddings": True,  # as Phi-4-mini; half the bytes of the large vocabulary
            "rope_parameters": {
                "rope_type": "longrope",
                "short_factor": [1.0, 1.1, 1.2, 1.3, 1.5, 1.8, 2.0, 2.5],
                "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0],
            },
        },
        vocab=32064,
    ),
    "gemma3-linear": Case(
        "Gemma3TextConfig",
        {
            "head_dim": 256,
            "query_pre_attn_scalar": 256,
            "sliding_window": 16,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        },
        layers=6,
    ),
}
WHAT = {  # what a refusal of each variant must name
    "llama-linear": "linear",
    "llama-yarn": "yarn",
    "qwen2-yarn": "yarn",
    "phi3-longrope": "rope",
    "gemma3-linear": "linear",
}


# ---- building the models ------------------------------------------------------------------------------------


def build(case: Case, seed: int = 0):
    """The float32 Hugging Face model of ``case``, eager attention, sharpened."""
    cls = getattr(transformers, case.config)
    config = cls(
        vocab_size=case.vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=case.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        **case.args,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    _sharpen(model.eval())
    return model


@torch.no_grad()
def _sharpen(model) -> None:
    """Queries and keys scaled by SHARP (projections, or the q/k norms that would undo that); every other norm
    and every bias random, so that a wrong or missing one shows."""
    gemma = "gemma" in type(model).__name__.lower()
    qk = model.config.num_attention_heads * _head_dim(model.config)
    qk += model.config.num_key_value_heads * _head_dim(model.config)
    for name, p in model.named_parameters():
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            multiplier = NORM_SHARP * (1 + 0.2 * torch.randn_like(p))
            p.copy_(multiplier - 1 if gemma else multiplier)  # Gemma's RMSNorm multiplies by 1 + w
        elif name.endswith(("q_proj.weight", "k_proj.weight")):
            p.mul_(SHARP)
        elif name.endswith("qkv_proj.weight"):
            p[:qk].mul_(SHARP)
        elif "norm" in name:
            p.add_(0.2 * torch.randn_like(p))
        elif name.endswith(".bias"):
            p.normal_(0.0, 0.3)


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def tokens(vocab: int = VOCAB, seed: int = 1) -> np.ndarray:
    """POSITIONS random token ids (int64; drawn by torch's generator, as the measured bounds were)."""
    return torch.randint(0, vocab, (POSITIONS,), generator=torch.Generator().manual_seed(seed)).numpy()


@torch.no_grad()
def reference(model, ids: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """(float64 logits ``[T, vocab]``, per layer the mean over rows and heads of the largest attention weight).
    Hugging Face computes the rotary angles in float32 whatever the model's dtype (position x frequency, then cos
    and sin): those are part of its numbers."""
    out = copy.deepcopy(model).double()(torch.from_numpy(ids)[None], output_attentions=True, use_cache=False)
    return out.logits[0].numpy(), [a[0].max(-1).values.mean().item() for a in out.attentions]


@torch.no_grad()
def q8_weights(model):
    """A copy of ``model`` whose matrices hold what a Q8_0 file stores of them."""
    copied = copy.deepcopy(model)
    for p in copied.parameters():
        if p.dim() == 2:
            w = p.float().numpy()
            stored = gguf.quants.dequantize(gguf.quants.quantize(w, Q8), Q8).reshape(w.shape)
            p.copy_(torch.from_numpy(stored))
    return copied


@dataclass
class Written:
    name: str
    case: Case
    model: object
    f32: object  # path of the F32 file
    q8: object  # path of the Q8_0 file (None for a variant)
    ids: np.ndarray  # int64 [POSITIONS]
    logits: np.ndarray  # float64 reference
    attention: list[float]


def written(name: str, case: Case, tmp_path_factory, q8: bool = True) -> Written:
    """``case``'s model, its F32 (and Q8_0) file, the tokens and the reference."""
    model = build(case)
    folder = tmp_path_factory.mktemp(name)
    f32 = write_gguf(model, None, folder / f"{name}.gguf", name=f"tiny-{name}")
    if q8:
        q8 = write_gguf(model, None, folder / f"{name}-q8.gguf", types="Q8_0", name=f"tiny-{name}-q8")
    ids = tokens(case.vocab)
    logits, attention = reference(model, ids)
    return Written(name, case, model, f32, q8, ids, logits, attention)


@pytest.fixture(scope="module", params=list(CASES))
def arch(request, tmp_path_factory) -> Written:
    return written(request.param, CASES[request.param], tmp_path_factory)


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory) -> Written:
    return written(request.param, VARIANTS[request.param], tmp_path_factory, q8=False)


# ---- running them -------------------------------------------------------------------------------------------


def in_passes(model, ids: np.ndarray) -> np.ndarray:
    """Logits of every position, fed in PASSES (float64)."""
    out, at = [], 0
    for n in PASSES:
        logits = model.forward(ids[at : at + n])
        assert isinstance(logits, np.ndarray) and logits.dtype == np.float32 and logits.shape == (n, model.vocab_size)
        out.append(logits)
        at += n
    return np.concatenate(out).astype(np.float64)


def native(path, precision: str, required: bool = False):
    """QuantizedModel of ``path``, or a skip naming why the native model does not run it (a failure when
    ``required``)."""
    if not quant.quantized_available():
        pytest.skip("the native quantized kernels are not built")
    from specwise.models.quantized import QuantizedModel, checked_file

    try:
        meta = checked_file(path)
    except NotImplementedError as err:
        if required:
            raise
        pytest.skip(f"not yet native: {err}")
    return QuantizedModel(path, precision=precision, meta=meta)


def fallback(path, monkeypatch, tmp_path):
    """The Hugging Face fallback's model of ``path`` (transformers' GGUF loader, converted into a fresh cache)."""
    from specwise.models.loader import load_model

    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path))
    return load_model(str(path), impl="hf").model


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


# ---- the tests ----------------------------------------------------------------------------------------------


def test_the_reference_attends_sharply(arch):
    """Positions matter: on average the most-attended position holds over 40% of a row's attention in every
    layer (measured: 0.45 (qwen3, gemma3's global layer) .. 0.69)."""
    assert min(arch.attention) > 0.4, arch.attention
    assert 1.0 < np.abs(arch.logits).max() < 10.0  # logits of a scale the absolute bound is meant for


def test_exact_logits_match_hugging_face(arch):
    logits = in_passes(native(arch.f32, "exact", arch.case.required), arch.ids)
    assert max_diff(logits, arch.logits) <= EXACT_TOL


def test_q8_greedy_agrees_with_hugging_face(arch):
    """Greedy choices of ``q8`` on the Q8_0 file against the reference holding the file's weights: Q8_AGREE of
    all positions, and all but one in 50 of those where the reference's top two logits are DECISIVE apart."""
    logits = in_passes(native(arch.q8, "q8", arch.case.required), arch.ids)
    with torch.no_grad():  # float32: 5e-5 is nothing here
        expected = q8_weights(arch.model)(torch.from_numpy(arch.ids)[None], use_cache=False).logits[0].numpy()
    same = logits.argmax(-1) == expected.argmax(-1)
    top = np.sort(expected, axis=-1)[:, -2:]  # [second, first]
    decisive = top[:, 1] - top[:, 0] >= DECISIVE
    assert same.mean() >= Q8_AGREE, same.mean()
    assert same[decisive].mean() >= 0.98, same[decisive].mean()


@pytest.mark.parametrize("precision", ["exact", "q8"])
def test_instruction_paths_agree_on_every_architecture(arch, precision):
    """Each architecture's whole pass (its activation, norms and attention variant included) gives the same bits on
    the portable, AVX2 and AVX-512 paths."""
    path = arch.q8 if precision == "q8" else arch.f32
    best = quant.set_isa(None)
    try:
        quant.set_isa("portable")
        want = in_passes(native(path, precision, arch.case.required), arch.ids)
        for name in quant.ISAS[1 : quant.ISAS.index(best) + 1]:
            quant.set_isa(name)
            assert np.array_equal(in_passes(native(path, precision, arch.case.required), arch.ids), want), name
    finally:
        quant.set_isa(None)


def test_hf_fallback_matches_hugging_face(arch, monkeypatch, tmp_path):
    if arch.name in FALLBACK_REFUSES:
        with pytest.raises(NotImplementedError, match=FALLBACK_REFUSES[arch.name]):
            fallback(arch.f32, monkeypatch, tmp_path)
        return
    logits = in_passes(fallback(arch.f32, monkeypatch, tmp_path), arch.ids)
    assert max_diff(logits, arch.logits) <= EXACT_TOL


def test_speculation_is_exact_on_every_architecture(arch):
    """Greedy speculative decoding equals plain greedy decoding token for token on each architecture (q8, past
    Gemma 3's window): with prompt lookup, with the model drafting for itself (everything accepted), with a draft
    model of the other precision (some rejected), and batched through forward_batch's sequences."""
    from specwise.drafters import ModelDrafter, NgramDrafter, NoDrafter
    from specwise.engine import Engine
    from specwise.sampling import SamplingParams

    greedy = SamplingParams(temperature=0.0)
    target = native(arch.q8, "q8")
    prompt = arch.ids[:40].tolist() * 2  # repeats: prompt lookup finds drafts

    def run(drafter, gamma: int) -> list[int]:
        engine = Engine(target, drafter, gamma=gamma)
        return engine.generate(prompt, greedy, max_new_tokens=48, eos_token_ids=[]).token_ids

    plain = run(NoDrafter(), 1)
    assert run(NgramDrafter(), 3) == plain
    assert run(ModelDrafter(native(arch.q8, "q8")), 4) == plain
    assert run(ModelDrafter(native(arch.q8, "exact")), 5) == plain


def test_the_server_runs_every_architecture(arch, monkeypatch, tmp_path):
    """``specwise serve`` on each architecture's file (with the tokenizer the writer puts in it): the default
    drafter's greedy completion equals plain decoding's."""
    pytest.importorskip("fastapi")
    native(arch.q8, "q8")  # skips an architecture the native model does not run
    from fastapi.testclient import TestClient

    from specwise.runtime import build_runtime
    from specwise.server.app import create_app

    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path))  # the tokenizer's cache
    answers = []
    for drafter in ("none", "auto"):
        with TestClient(create_app(build_runtime(str(arch.q8), drafter, "auto", "cpu"), model_name="m")) as client:
            body = {"model": "m", "prompt": "abc abc abc abc", "max_tokens": 24, "temperature": 0}
            reply = client.post("/v1/completions", json=body)
            assert reply.status_code == 200, reply.text
            answers.append(reply.json()["choices"][0]["text"])
    assert answers[0] == answers[1]


def test_a_suffix_index_drafts_for_every_architecture(arch, tmp_path, monkeypatch):
    """`specwise index`'s builder on each architecture's file: an index of the model's own greedy answers drafts
    them again (most drafts accepted), and greedy output stays plain output."""
    native(arch.q8, "q8")  # skips an architecture the native model does not run
    from specwise.drafters.suffix import index_identity, make_suffix_drafter
    from specwise.engine import Engine
    from specwise.lab.index import build_index
    from specwise.models.loader import load_model
    from specwise.sampling import SamplingParams

    greedy = SamplingParams(temperature=0.0)
    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path / "cache"))  # the tokenizer's cache
    loaded = load_model(str(arch.q8))
    prompts = [arch.ids[:12].tolist(), arch.ids[40:60].tolist()]
    plain_engine = Engine(loaded.model, None, gamma=0)
    plain = [plain_engine.generate(p, greedy, max_new_tokens=32, eos_token_ids=[]).token_ids for p in prompts]

    def answer(prompt, temperature, seed):
        return plain[prompts.index(prompt)]

    build_index(
        prompts, answer, tmp_path / "data", tmp_path / "index", {"target": index_identity(loaded)}, progress=False
    )
    engine = Engine(loaded.model, make_suffix_drafter(str(tmp_path / "index"), loaded), gamma="auto")
    for prompt, expected in zip(prompts, plain):
        result = engine.generate(prompt, greedy, max_new_tokens=32, eos_token_ids=[])
        assert result.token_ids == expected
        assert result.stats.accepted >= 16


def test_native_refuses_a_variant_naming_it_or_is_exact(variant):
    """What the file names and the native model does not implement is refused, never ignored."""
    refused_or_exact(variant, lambda: native(variant.f32, "exact", required=True))


def test_hf_fallback_refuses_a_variant_naming_it_or_is_exact(variant, monkeypatch, tmp_path):
    refused_or_exact(variant, lambda: fallback(variant.f32, monkeypatch, tmp_path))


def refused_or_exact(w: Written, load) -> None:
    """``load()`` raises NotImplementedError naming what ``w`` uses that it does not implement, or its model's
    logits are within EXACT_TOL of the reference."""
    try:
        model = load()
    except NotImplementedError as err:
        assert WHAT[w.name] in str(err), str(err)
        return
    assert max_diff(in_passes(model, w.ids), w.logits) <= EXACT_TOL


# what transformers' GGUF loader (5.24) reads of the rope is rope.freq_base only: it would run these files with
# unscaled rotary frequencies (measured: max |logit - reference| 1.2 .. 5.7), so the fallback refuses them, naming
# what it would ignore (the variants' refusals are checked through WHAT)
FALLBACK_REFUSES = {"llama3": "llama3 rope scaling"}


# ---- what the writer writes ---------------------------------------------------------------------------------


def test_llama_rows_are_permuted_to_adjacent_pairs_and_back():
    from specwise.models.quantized import _unpermute_rows

    rows = np.arange(2 * 16 * 3, dtype=np.float32).reshape(32, 3)  # 2 heads of 16 rows
    permuted = permute_rotary_rows(rows, 2)
    assert np.array_equal(permuted[0], rows[0]) and np.array_equal(permuted[1], rows[8])  # pair (0, 8) adjacent
    assert np.array_equal(permuted[_unpermute_rows(32, 2)], rows)


def test_llama3_factors_divide_hugging_face_frequencies():
    """rope_freqs: base frequencies / factors = Hugging Face's llama3 frequencies (llama.cpp divides by them)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = build(CASES["llama3"]).config
    hf, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    head_dim = _head_dim(config)
    base = 1.0 / ROPE_LLAMA3["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim)
    factors = llama3_rope_factors(ROPE_LLAMA3, head_dim)
    assert factors[0] == 1.0 and factors[-1] == 8.0 and 1.0 < factors[1] < factors[2] < 8.0
    np.testing.assert_allclose(base / factors, hf.double().numpy(), rtol=1e-6)


def test_metadata_and_tensors_follow_the_converter(tmp_path):
    path = write_gguf(build(CASES["gemma3"]), None, tmp_path / "g.gguf")
    meta = GGUFFile(path)
    assert meta.get("general.architecture") == "gemma3"
    assert meta.get("gemma3.attention.sliding_window") == 16
    assert meta.get("gemma3.attention.key_length") == 256
    assert meta.get("gemma3.rope.freq_base") == 1e6 and meta.get("gemma3.rope.freq_base_swa") == 1e4
    assert "output.weight" not in meta.tensors  # tied
    assert {"blk.5.post_attention_norm.weight", "blk.5.post_ffw_norm.weight", "blk.0.attn_q_norm.weight"} <= set(
        meta.tensors
    )
    model = build(Case("Phi3Config", CASES["phi3"].args))
    phi3 = GGUFFile(write_gguf(model, None, tmp_path / "p.gguf"))
    assert phi3.tensors["blk.0.attn_qkv.weight"].shape == (4 * 16 + 2 * 2 * 16, 64)  # q, k, v rows
    gate_up = model.model.layers[0].mlp.gate_up_proj.weight.detach().numpy()  # gate rows, then up rows
    np.testing.assert_array_equal(phi3.floats("blk.0.ffn_up.weight").reshape(2 * 128, 64), gate_up)
    assert phi3.get("phi3.attention.sliding_window") == 0 and phi3.get("phi3.rope.scaling.type") is None
    llama = GGUFFile(write_gguf(build(CASES["llama3"]), None, tmp_path / "l.gguf"))
    assert llama.get("llama.vocab_size") == VOCAB and llama.get("llama.rope.dimension_count") == 16
    assert llama.tensors["rope_freqs.weight"].shape == (8,) and llama.get("llama.rope.scaling.type") is None


def test_gemma3_norms_are_stored_as_their_multiplier(tmp_path):
    model = build(CASES["gemma3"])
    meta = GGUFFile(write_gguf(model, None, tmp_path / "g.gguf"))
    w = model.model.layers[0].post_feedforward_layernorm.weight.detach().numpy()
    np.testing.assert_array_equal(meta.floats("blk.0.post_ffw_norm.weight").reshape(-1), w + np.float32(1))


@pytest.mark.parametrize(
    "change, what",
    [
        ({"query_pre_attn_scalar": 64}, "query_pre_attn_scalar"),
        ({"layer_types": ["full_attention"] * 6}, "layer_types"),
        ({"hidden_activation": "gelu"}, "activation"),
    ],
)
def test_what_gguf_cannot_say_is_refused_by_the_writer(change, what, tmp_path):
    case = CASES["gemma3"]
    model = build(Case(case.config, {**case.args, **change}, layers=case.layers))
    with pytest.raises(NotImplementedError, match=what):
        write_gguf(model, None, tmp_path / "x.gguf")


def test_longrope_outside_phi3_is_refused_by_the_writer(tmp_path):
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    model = build(Case("LlamaConfig", {"rope_parameters": rope, "original_max_position_embeddings": 64}))
    with pytest.raises(NotImplementedError, match="longrope"):
        write_gguf(model, None, tmp_path / "x.gguf")


def test_quantized_matrices_need_whole_blocks(tmp_path):
    with pytest.raises(ValueError, match="token_embd.weight: rows of 64 values cannot be stored as Q4_K"):
        write_gguf(build(CASES["llama"]), None, tmp_path / "x.gguf", types={"matrix": "Q8_0", "embed": "Q4_K"})
