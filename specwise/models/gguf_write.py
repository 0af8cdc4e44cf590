"""Writing a Hugging Face causal LM to a GGUF file the way llama.cpp's converter (``convert_hf_to_gguf.py``) does.

Used by the tests that prove an architecture against its Hugging Face model (tests/test_hf_reference.py) and by
benchmarks that need a file of a known model. Supported: ``LlamaForCausalLM`` (with llama3 rope scaling),
``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``Phi3ForCausalLM`` and ``Gemma3ForCausalLM`` (text only).

What the file holds follows the converter, through the ``gguf`` package's own names (``gguf.constants``, its
``GGUFWriter.add_*`` helpers and ``TensorNameMap``):

- metadata ``{arch}.block_count``, ``.context_length``, ``.embedding_length``, ``.feed_forward_length``,
  ``.attention.head_count(_kv)``, ``.attention.key_length`` / ``.value_length`` (where the configuration gives
  ``head_dim``), ``.rope.freq_base`` (``.rope.freq_base_swa`` for Gemma 3's local layers),
  ``.attention.layer_norm_rms_epsilon``, ``.rope.scaling.*`` (linear, yarn, longrope), and per architecture:
  Llama's ``.vocab_size`` and ``.rope.dimension_count``; Phi-3's ``.rope.dimension_count``,
  ``.rope.scaling.original_context_length`` and ``.attention.sliding_window`` (0 for none); Gemma 3's
  ``.attention.sliding_window`` and ``.final_logit_softcapping``;
- Llama's query and key rows permuted from rotate-half halves to adjacent rotary pairs (per head, row
  ``(h, p, i)`` becomes ``(h, i, p)``); the other architectures' rows are written as they are (NEOX rotation);
- Gemma 3's norm weights written as ``1 + w``, the multiplier its RMSNorm applies;
- Phi-3's fused ``attn_qkv`` (rows q, k, v) and ``ffn_up`` (rows gate, then up: ``[2 * ff, hidden]``);
- llama3 rope scaling as the F32 tensor ``rope_freqs.weight`` of ``head_dim / 2`` factors (llama.cpp divides each
  frequency by its factor), Phi-3's longrope as ``rope_factors_long`` / ``rope_factors_short``;
- no ``output.weight`` when the output layer is tied to the embedding; vectors (norms, biases, factors) in F32.

What a GGUF file cannot say (an activation, an attention scale, a layer pattern llama.cpp fixes by architecture)
is refused with NotImplementedError naming it, rather than written into a file llama.cpp would misread.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

__all__ = ["write_gguf", "ARCHITECTURES", "llama3_rope_factors", "permute_rotary_rows"]

# Hugging Face class -> GGUF architecture name
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "Gemma3ForCausalLM": "gemma3",
}
# the activation each architecture's feed-forward uses in llama.cpp (a GGUF file does not name it)
_ACTIVATIONS = {"llama": "silu", "qwen2": "silu", "qwen3": "silu", "phi3": "silu", "gemma3": "gelu_pytorch_tanh"}
# llama.cpp's fixed Gemma 3 layer pattern: every sixth layer attends globally, the others through the window
GEMMA3_PATTERN = 6


def write_gguf(model, tokenizer, path: str | Path, types="F32", name: str | None = None) -> Path:
    """Write ``model`` (a Hugging Face causal LM of :data:`ARCHITECTURES`) to ``path`` as a GGUF file.

    tokenizer: None (a tiny model has none): a minimal byte-level vocabulary of ``vocab_size`` tokens is written
    (see :func:`_write_minimal_vocab`), enough for llama.cpp's and transformers' GGUF loaders to load the file; a
    real tokenizer is not written yet (NotImplementedError).
    types: the GGML type of every 2-D matrix (``"F32"``, ``"F16"``, ``"Q8_0"``, ``"Q4_0"`` ... or a
    ``gguf.GGMLQuantizationType``), or a mapping from role to type: ``"matrix"`` (the default of every matrix,
    F32 when absent), ``"embed"`` (token_embd), ``"output"``, or a layer tensor's name (``"attn_v"``,
    ``"ffn_down"``, ``"attn_qkv"`` ...). Norms, biases and rope factors are F32.
    name: ``general.name`` (the model's ``name_or_path`` when not given)."""
    import gguf

    arch = architecture_of(model)
    config = model.config
    _check_representable(arch, config)
    if tokenizer is not None:
        raise NotImplementedError("writing a tokenizer to GGUF is not supported yet: pass tokenizer=None")
    tensors = list(_tensors(model, arch))
    kinds = _types(tensors, types)
    layer_matrices = [kinds[n] for n, d in tensors if d.ndim == 2 and _role(n) not in ("embed", "output")]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name or str(getattr(config, "name_or_path", "") or arch))
    _write_metadata(writer, arch, config, _file_type(layer_matrices))
    _write_minimal_vocab(writer, config)
    for tensor_name, data in tensors:
        kind = kinds[tensor_name]
        writer.add_tensor(tensor_name, _encode(tensor_name, data, kind), raw_dtype=kind)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def architecture_of(model) -> str:
    """The GGUF architecture name of a Hugging Face model (NotImplementedError for one not supported)."""
    cls = type(model).__name__
    if cls not in ARCHITECTURES:
        raise NotImplementedError(f"{cls} cannot be written to GGUF (supported: {', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[cls]


# ---- configuration ----------------------------------------------------------------------------------------


def rope_parameters(config) -> tuple[dict, dict | None]:
    """(the full-attention layers' rope parameters, the sliding layers' or None), transformers 5's
    ``rope_parameters`` or transformers 4's ``rope_theta`` and ``rope_scaling``."""
    params = getattr(config, "rope_parameters", None)
    if params is None:
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    if "full_attention" in params or "sliding_attention" in params:
        return dict(params.get("full_attention") or {}), params.get("sliding_attention")
    return dict(params), None


def _rope_type(params: Mapping) -> str:
    return str(params.get("rope_type", params.get("type", "default")) or "default").lower()


def _head_dim(config) -> int:
    head_dim = getattr(config, "head_dim", None)
    return head_dim or config.hidden_size // config.num_attention_heads


def _check_representable(arch: str, config) -> None:
    """Refuse what a GGUF file of ``arch`` cannot describe (llama.cpp takes it from the architecture)."""
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    if act != _ACTIVATIONS[arch]:
        raise NotImplementedError(f"{arch} with activation {act!r}: llama.cpp's {arch} uses {_ACTIVATIONS[arch]}")
    if getattr(config, "use_sliding_window", False):
        raise NotImplementedError(f"{arch} with use_sliding_window: llama.cpp's {arch} has no sliding window")
    full, sliding = rope_parameters(config)
    kind = _rope_type(full)
    if kind not in ("default", "linear", "yarn", "llama3", "longrope", "su"):
        raise NotImplementedError(f"rope type {kind!r} cannot be written to GGUF")
    if kind == "llama3" and arch != "llama":
        raise NotImplementedError(f"llama3 rope scaling on {arch}: llama.cpp reads rope_freqs for llama only")
    if kind in ("longrope", "su") and arch != "phi3":
        raise NotImplementedError(f"longrope on {arch}: its factors are written for phi3 only")
    if arch == "phi3" and kind not in ("default", "longrope", "su"):
        raise NotImplementedError(f"rope type {kind!r} on phi3: the converter writes phi3's longrope only")
    if sliding is not None and _rope_type(sliding) != "default":
        raise NotImplementedError(f"rope scaling {_rope_type(sliding)!r} on sliding layers cannot be written")
    if arch == "gemma3":
        _check_gemma3(config)


def _check_gemma3(config) -> None:
    """Gemma 3's attention scale and layer pattern are fixed in llama.cpp: the model must have them."""
    layers = config.num_hidden_layers
    expected = ["full_attention" if (i + 1) % GEMMA3_PATTERN == 0 else "sliding_attention" for i in range(layers)]
    if list(getattr(config, "layer_types", expected)) != expected:
        raise NotImplementedError(
            f"gemma3 layer_types {config.layer_types}: llama.cpp's Gemma 3 makes every {GEMMA3_PATTERN}th layer "
            "global and the others sliding, and GGUF has no key for another pattern"
        )
    # llama.cpp: 1 / sqrt(head_dim), except the 27B model (62 layers): 1 / sqrt(hidden / heads)
    scalar = config.hidden_size // config.num_attention_heads if layers == 62 else _head_dim(config)
    if getattr(config, "query_pre_attn_scalar", scalar) != scalar:
        raise NotImplementedError(
            f"gemma3 query_pre_attn_scalar {config.query_pre_attn_scalar}: llama.cpp scales queries by "
            f"1/sqrt({scalar}) for this model, and GGUF has no key for it"
        )
    if getattr(config, "attn_logit_softcapping", None) is not None:
        raise NotImplementedError("gemma3 attention logit soft-capping cannot be written (Gemma 3 has none)")


# ---- metadata ---------------------------------------------------------------------------------------------


def _write_metadata(writer, arch: str, config, file_type: int) -> None:
    if arch == "phi3":
        _write_phi3_metadata(writer, config, file_type)
        return
    full, sliding = rope_parameters(config)
    _write_shape(writer, config)
    _write_rope_scaling(writer, full)
    writer.add_rope_freq_base(full.get("rope_theta", 10000.0))
    if sliding is not None and "rope_theta" in sliding:
        writer.add_rope_freq_base_swa(sliding["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if getattr(config, "head_dim", None) is not None:
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
    writer.add_file_type(file_type)
    if arch == "llama":
        writer.add_vocab_size(config.vocab_size)
        writer.add_rope_dimension_count(_head_dim(config))
    if arch == "gemma3":
        if getattr(config, "final_logit_softcapping", None):
            writer.add_final_logit_softcapping(config.final_logit_softcapping)
        if any(t == "sliding_attention" for t in config.layer_types):
            writer.add_sliding_window(config.sliding_window)


def _write_rope_scaling(writer, params: Mapping) -> None:
    """``rope.scaling.*`` as the converter writes them (llama3's factors are a tensor, not metadata)."""
    import gguf

    kind = _rope_type(params)
    factor = params.get("factor")
    if kind == "linear" and factor is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(factor)
    elif kind == "yarn" and factor is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(factor)
        writer.add_rope_scaling_orig_ctx_len(params["original_max_position_embeddings"])
        optional = {
            "extrapolation_factor": writer.add_rope_scaling_yarn_ext_factor,
            "attention_factor": writer.add_rope_scaling_yarn_attn_factor,
            "beta_fast": writer.add_rope_scaling_yarn_beta_fast,
            "beta_slow": writer.add_rope_scaling_yarn_beta_slow,
        }
        for key, add in optional.items():
            if params.get(key) is not None:
                add(params[key])
    elif kind in ("su", "longrope"):
        writer.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)


def _write_shape(writer, config) -> None:
    """The model's shape: layers, context, widths and heads."""
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)


def _write_phi3_metadata(writer, config, file_type: int) -> None:
    """Phi-3's own set (the converter's Phi3MiniModel writes no rope.scaling.type)."""
    full, _ = rope_parameters(config)
    rotary = full.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    _write_shape(writer, config)
    writer.add_rope_scaling_orig_ctx_len(config.original_max_position_embeddings)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(int(rotary * config.hidden_size) // config.num_attention_heads)
    writer.add_rope_freq_base(full.get("rope_theta", 10000.0))
    writer.add_file_type(file_type)
    writer.add_sliding_window(getattr(config, "sliding_window", None) or 0)
    if _rope_type(full) in ("su", "longrope"):
        writer.add_rope_scaling_attn_factors(_phi3_attn_factor(config))


def _phi3_attn_factor(config) -> float:
    """The longrope attention factor the converter writes: sqrt(1 + ln(s) / ln(original)) for s > 1."""
    full, _ = rope_parameters(config)
    if full.get("attention_factor") is not None:
        return float(full["attention_factor"])
    original = config.original_max_position_embeddings
    scale = config.max_position_embeddings / original
    return math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0


def _write_minimal_vocab(writer, config) -> None:
    """A byte-level ("gpt2") vocabulary of ``vocab_size`` tokens for a model without a tokenizer: the byte
    alphabet's characters, one token merging the first of them with itself (llama.cpp requires merges), and
    ``[PAD{id}]`` for the rest (the converter's name for unused ids); the configuration's bos / eos ids where they
    lie in the vocabulary."""
    import gguf

    vocab = config.vocab_size
    if vocab < 2:
        raise ValueError(f"a vocabulary of {vocab} tokens cannot be written")
    alphabet = [chr(c) for c in _byte_alphabet()]
    singles = min(256, vocab - 1)
    pair = alphabet[0] * 2
    tokens = [*alphabet[:singles], pair, *(f"[PAD{i}]" for i in range(singles + 1, vocab))]
    kinds = [gguf.TokenType.NORMAL] * (singles + 1) + [gguf.TokenType.UNUSED] * (vocab - singles - 1)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(kinds)
    writer.add_token_merges([f"{alphabet[0]} {alphabet[0]}"])
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id)):
        value = getattr(config, key, None)
        if isinstance(value, int) and 0 <= value < vocab:
            add(value)


def _byte_alphabet() -> list[int]:
    """The code points GPT-2's byte-level BPE spells the bytes 0..255 with."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [b if b in printable else next(extra) for b in range(256)]


# ---- tensors ----------------------------------------------------------------------------------------------


def _tensors(model, arch: str) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 values) of every tensor the converter writes, in its order."""
    import gguf

    config = model.config
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_id, config.num_hidden_layers)
    tied = _tied(model)
    for hf_name, tensor in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise NotImplementedError(f"tensor {hf_name} has no GGUF name in {arch}")
        data = tensor.detach().to("cpu").float().numpy()
        yield name, _converted(arch, config, hf_name, data)
    yield from _extra_tensors(arch, config)


def _tied(model) -> bool:
    out, emb = model.get_output_embeddings(), model.get_input_embeddings()
    return out is None or out.weight.data_ptr() == emb.weight.data_ptr()


def _converted(arch: str, config, hf_name: str, data: np.ndarray) -> np.ndarray:
    """A tensor as the converter changes it: Llama's q/k rows permuted, Gemma 3's norms shifted by one."""
    if arch == "llama" and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
        return permute_rotary_rows(data, config.num_attention_heads)
    if arch == "llama" and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
        return permute_rotary_rows(data, config.num_key_value_heads)
    if arch == "gemma3" and hf_name.endswith("norm.weight"):
        return data + np.float32(1.0)
    return data


def permute_rotary_rows(data: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a query or key projection from rotate-half order (the pair of rotary dimension i is i + d/2) to
    adjacent pairs (2i, 2i + 1), per head: row ``(h, p, i)`` becomes row ``(h, i, p)``."""
    rows = data.shape[0]
    return data.reshape(heads, 2, rows // heads // 2, *data.shape[1:]).swapaxes(1, 2).reshape(data.shape)


def _extra_tensors(arch: str, config) -> Iterator[tuple[str, np.ndarray]]:
    """Tensors the converter generates: llama3's rope_freqs, Phi-3's longrope factors."""
    full, _ = rope_parameters(config)
    kind = _rope_type(full)
    if kind == "llama3":
        yield "rope_freqs.weight", llama3_rope_factors(full, _head_dim(config))
    if arch == "phi3" and kind in ("su", "longrope"):
        yield "rope_factors_long.weight", np.asarray(full["long_factor"], dtype=np.float32)
        yield "rope_factors_short.weight", np.asarray(full["short_factor"], dtype=np.float32)


def llama3_rope_factors(params: Mapping, head_dim: int) -> np.ndarray:
    """llama3 rope scaling as ``head_dim / 2`` float32 factors, one per frequency: 1 for wavelengths shorter than
    original / high_freq_factor, ``factor`` for those longer than original / low_freq_factor, and between them
    ``1 / ((1 - s) / factor + s)`` with ``s = (original / wavelength - low) / (high - low)``: the scaled frequency
    is the frequency divided by its factor (Hugging Face's ``_compute_llama3_parameters``).

    ``original`` is the rope parameters' ``original_max_position_embeddings`` (what Hugging Face uses; llama.cpp's
    converter reads it from the top level of config.json, 8192 when absent there, which is every Llama 3's)."""
    base = params.get("rope_theta", 10000.0)
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    freqs = (np.float32(1.0) / np.power(np.float32(base), exponent)).astype(np.float32)
    factor = params.get("factor", 8.0)
    low, high = params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
    original = params.get("original_max_position_embeddings", 8192)
    factors = []
    for freq in freqs:
        wavelength = 2 * math.pi / float(freq)
        if wavelength < original / high:
            factors.append(1.0)
        elif wavelength > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


# ---- types ------------------------------------------------------------------------------------------------


def _role(name: str) -> str:
    if name.startswith("token_embd."):
        return "embed"
    if name.startswith("output."):
        return "output"
    return name.split(".")[-2]


def _types(tensors: list[tuple[str, np.ndarray]], types) -> dict[str, int]:
    """The GGML type of every tensor: F32 for vectors, ``types`` for matrices."""
    import gguf

    def parse(value):
        return value if isinstance(value, gguf.GGMLQuantizationType) else gguf.GGMLQuantizationType[str(value)]

    table = {k: parse(v) for k, v in types.items()} if isinstance(types, Mapping) else {"matrix": parse(types)}
    default = table.get("matrix", gguf.GGMLQuantizationType.F32)
    out = {}
    for name, data in tensors:
        kind = table.get(_role(name), default) if data.ndim == 2 else gguf.GGMLQuantizationType.F32
        block = gguf.GGML_QUANT_SIZES[kind][0]
        if data.shape[-1] % block:
            raise ValueError(
                f"{name}: rows of {data.shape[-1]} values cannot be stored as {kind.name} (blocks of {block})"
            )
        out[name] = kind
    return out


def _encode(name: str, data: np.ndarray, kind) -> np.ndarray:
    """The tensor's bytes (or float array) in ``kind``, by the gguf package's quantizers."""
    import gguf

    try:
        return gguf.quants.quantize(np.ascontiguousarray(data, dtype=np.float32), kind)
    except NotImplementedError as err:
        raise NotImplementedError(f"{name}: the gguf package cannot quantize to {kind.name} ({err})") from err


def _file_type(layer_matrices: list) -> int:
    """``general.file_type``: the type most layer matrices have, as llama.cpp's LlamaFileType names it."""
    import gguf

    kinds = layer_matrices or [gguf.GGMLQuantizationType.F32]
    kind = max(set(kinds), key=kinds.count)
    if kind == gguf.GGMLQuantizationType.F32:
        return gguf.LlamaFileType.ALL_F32
    for suffix in ("", "_M", "_S"):
        found = getattr(gguf.LlamaFileType, f"MOSTLY_{kind.name}{suffix}", None)
        if found is not None:
            return found
    return gguf.LlamaFileType.GUESSED
