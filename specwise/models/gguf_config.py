"""What a GGUF file's metadata says about its model, for the quantized native model (``quantized.py``): the
architectures it runs (:data:`FAMILIES`, how each differs from the Llama layer), the hyperparameters read strictly
from the metadata (:class:`GGUFConfig`), and whether a file is one it runs (:func:`checked_file`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specwise.models.gguf_check import check_tensors, meta_float, meta_int
from specwise.models.gguf_file import GGUFError, GGUFFile

__all__ = ["FAMILIES", "FIM_METADATA_KEYS", "Family", "GGUFConfig", "gguf_config", "checked_file", "fim_token_ids"]

# fill-in-the-middle role (specwise.fim) -> its GGUF metadata key (llama.cpp's names)
FIM_METADATA_KEYS = {
    "prefix": "tokenizer.ggml.fim_pre_token_id",
    "suffix": "tokenizer.ggml.fim_suf_token_id",
    "middle": "tokenizer.ggml.fim_mid_token_id",
    "pad": "tokenizer.ggml.fim_pad_token_id",
    "repo": "tokenizer.ggml.fim_rep_token_id",
    "file_sep": "tokenizer.ggml.fim_sep_token_id",
}


@dataclass(frozen=True)
class Family:
    """How an architecture's GGUF file differs from the Llama layer (llama.cpp's conventions for each)."""

    hf: str  # the Hugging Face class of the same model
    permuted_qk: bool = False  # the converter permuted Q and K rows to interleaved rotary pairs (llama)
    qkv_bias: bool = False  # optional q, k, v biases (qwen2; some llama files)
    qk_norm: bool = False  # RMS norms of each query and key head before rotary (qwen3, gemma3)
    fused: bool = False  # q, k, v in one attn_qkv tensor, gate and up in one ffn_up tensor (phi3)
    gemma: bool = False  # Gemma 3: post norms, GeGLU, the embedding scale, local and global layers


FAMILIES = {
    "llama": Family("LlamaForCausalLM", permuted_qk=True, qkv_bias=True),
    "qwen2": Family("Qwen2ForCausalLM", qkv_bias=True),
    "qwen3": Family("Qwen3ForCausalLM", qk_norm=True),
    "phi3": Family("Phi3ForCausalLM", fused=True),
    "gemma3": Family("Gemma3ForCausalLM", qk_norm=True, gemma=True),
}
_ARCHITECTURES = {arch: f.hf for arch, f in FAMILIES.items()}
GEMMA3_SWA_PATTERN = 6  # Gemma 3: every sixth layer attends globally (unless attention.sliding_window_pattern says)
GEMMA3_LOCAL_BASE = 10000.0  # Gemma 3: the windowed layers' rotary base (unless rope.freq_base_swa says)


class GGUFConfig:
    """What the model needs from a GGUF file's metadata, named like a Hugging Face config.

    For the native family every value is read strictly (:mod:`specwise.models.gguf_check`): a value of the wrong
    type or out of range is a GGUFError naming the key; another architecture is only named (``unsupported``)."""

    def __init__(self, meta: GGUFFile) -> None:
        arch = meta.get("general.architecture")
        self.gguf_architecture = arch
        self.architecture = _ARCHITECTURES.get(arch, str(arch))
        if arch not in _ARCHITECTURES:
            return

        def count(name, default=None, low=1, high=1 << 20):
            return meta_int(meta, f"{arch}.{name}", default, low, high)

        self.hidden_size = count("embedding_length")
        self.num_hidden_layers = count("block_count", high=4096)
        self.intermediate_size = count("feed_forward_length", high=1 << 22)
        self.num_attention_heads = count("attention.head_count", high=4096)
        self.num_key_value_heads = count("attention.head_count_kv", self.num_attention_heads, high=4096)
        if self.num_attention_heads % self.num_key_value_heads:
            raise GGUFError(
                f"{meta.path.name}: metadata {arch}.attention.head_count_kv ({self.num_key_value_heads}) does not "
                f"divide {arch}.attention.head_count ({self.num_attention_heads})"
            )
        if self.hidden_size % self.num_attention_heads and meta.get(f"{arch}.attention.key_length") is None:
            raise GGUFError(
                f"{meta.path.name}: metadata {arch}.embedding_length ({self.hidden_size}) is not a multiple of "
                f"{arch}.attention.head_count ({self.num_attention_heads}) and no key_length is given"
            )
        self.head_dim = count("attention.key_length", self.hidden_size // self.num_attention_heads)
        self.value_dim = count("attention.value_length", self.head_dim)
        self.rope_dim = count("rope.dimension_count", self.head_dim)
        self.rope_theta = meta_float(meta, f"{arch}.rope.freq_base", 10000.0, 0.0, float("inf"))
        self.rope_scaling = meta.get(f"{arch}.rope.scaling.type")
        self.rms_norm_eps = meta_float(meta, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6, 0.0, 1.0)
        self.max_position_embeddings = count("context_length", 2048, high=(1 << 31) - 1)
        self.sliding_window = count("attention.sliding_window", 0, low=0, high=(1 << 31) - 1)
        self.rope_scaling_factor = meta_float(meta, f"{arch}.rope.scaling.factor", 1.0, 0.0, 1e6)
        self.vocab_size = count("vocab_size", 0, low=0, high=(1 << 31) - 1)
        self.family = FAMILIES[arch]
        self.swa_pattern = self._swa_pattern(meta, arch) if self.sliding_window else None
        self.rope_theta_local = meta_float(meta, f"{arch}.rope.freq_base_swa", GEMMA3_LOCAL_BASE, 0.0, float("inf"))
        own = f"{arch}."
        self._unknown = [
            k for k in [*meta.metadata, *meta._array_at] if k.startswith(own) and k[len(own) :] not in _READ_KEYS
        ]

    def unsupported(self, meta: GGUFFile) -> str | None:
        """None when the quantized native model runs this file; otherwise why not (a GGUFError for a file whose
        tensors do not match its configuration)."""
        if self.gguf_architecture not in _ARCHITECTURES:
            return f"architecture {self.gguf_architecture!r} is not in the native family ({', '.join(_ARCHITECTURES)})"
        if self.rope_scaling not in (None, "none", "linear"):
            return f"rope scaling {self.rope_scaling!r} is not supported"
        if self.rope_scaling in (None, "none") and self.rope_scaling_factor != 1.0:
            return f"a rope scaling factor of {self.rope_scaling_factor:g} without a scaling type is not supported"
        if self._unknown:
            value = meta.get(self._unknown[0], "an array")
            return f"metadata {self._unknown[0]} ({value!r}) is not supported"
        if self.rope_dim != self.head_dim:
            return "partial rotary embeddings are not supported"
        if self.value_dim != self.head_dim:
            return "value heads of another width than the key heads are not supported"
        if self.head_dim > 512 or self.head_dim % 2:
            return f"a head width of {self.head_dim} is not supported (an even width up to 512)"
        if self.sliding_window and not self.family.gemma and self.gguf_architecture != "phi3":
            return "sliding-window attention is not supported for this architecture"
        try:
            check_tensors(meta, self, *self.tensor_shapes())
        except NotImplementedError as err:
            return str(err)
        from specwise.models.kernels.quant import supported_types

        types = supported_types()
        for info in meta.tensors.values():
            if len(info.shape) == 2 and info.type not in types:
                return f"tensor {info.name} is {info.type_name}, which the native kernels do not read"
        return None

    def tensor_shapes(self) -> tuple[dict, dict, dict, dict]:
        """Each layer's matrices, norms and optional biases by part name, and the optional tensors outside the
        layers, with their shapes (numpy order) as this family's GGUF files store them."""
        f, h, ff = self.family, self.hidden_size, self.intermediate_size
        q, kv, hd = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim, self.head_dim
        if f.fused:
            matrices = {"attn_qkv": (q + 2 * kv, h), "attn_output": (h, q), "ffn_up": (2 * ff, h), "ffn_down": (h, ff)}
        else:
            matrices = {"attn_q": (q, h), "attn_k": (kv, h), "attn_v": (kv, h), "attn_output": (h, q)}
            matrices |= {"ffn_gate": (ff, h), "ffn_up": (ff, h), "ffn_down": (h, ff)}
        vectors = {"attn_norm": (h,), "ffn_norm": (h,)}
        if f.qk_norm:
            vectors |= {"attn_q_norm": (hd,), "attn_k_norm": (hd,)}
        if f.gemma:
            vectors |= {"post_attention_norm": (h,), "post_ffw_norm": (h,)}
        biases = {"attn_q": (q,), "attn_k": (kv,), "attn_v": (kv,)} if f.qkv_bias else {}
        extra = {"rope_freqs.weight": (hd // 2,)} if self.gguf_architecture == "llama" else {}
        return matrices, vectors, biases, extra

    def row_parts(self, name: str, rows: int) -> list[tuple[int, int]]:
        """(first row, rows) of each matrix the model keeps of tensor ``name`` (``rows`` rows): Phi-3's fused
        attn_qkv holds q, k and v, its ffn_up gate and up; any other tensor is one matrix."""
        if self.family.fused and name.endswith("attn_qkv.weight"):
            q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
            return [(0, q), (q, kv), (q + kv, kv)]
        if self.family.fused and name.endswith("ffn_up.weight"):
            ff = self.intermediate_size
            return [(0, ff), (ff, ff)]
        return [(0, rows)]

    def _swa_pattern(self, meta: GGUFFile, arch: str) -> list[bool]:
        """Which layers attend through the sliding window: ``attention.sliding_window_pattern`` as one flag per
        layer, or as n (every n-th layer global, the others windowed); Gemma 3's default n is 6, other families
        window every layer."""
        key = f"{arch}.attention.sliding_window_pattern"
        n = self.num_hidden_layers
        flags = meta.array(key) if key in meta._array_at else None
        if flags is not None:
            if len(flags) != n or any(type(f) is not bool for f in flags):
                raise GGUFError(f"{meta.path.name}: metadata {key} must hold one flag (a bool) per layer ({n})")
            return list(flags)
        every = meta_int(meta, key, GEMMA3_SWA_PATTERN if self.family.gemma else 0, low=0, high=1 << 20)
        return [True] * n if every == 0 else [i % every < every - 1 for i in range(n)]

    def windows(self) -> list[int] | None:
        """Each layer's sliding window (0: global), or None when every layer attends to every position."""
        if not self.sliding_window:
            return None
        return [self.sliding_window if windowed else 0 for windowed in self.swa_pattern]


# metadata of the native family's architectures that GGUFConfig reads (any other key of the architecture is refused)
_READ_KEYS = {
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "rope.dimension_count",
    "rope.freq_base",
    "rope.scaling.type",
    "attention.layer_norm_rms_epsilon",
    "context_length",
    "attention.sliding_window",
    "rope.scaling.factor",
    "vocab_size",
    "attention.sliding_window_pattern",
    "rope.freq_base_swa",
    # only yarn and longrope read it, and both are refused (their type, or Phi-3's rope_factors tensors)
    "rope.scaling.original_context_length",
}


def checked_file(path: str | Path) -> GGUFFile:
    """The GGUF file at ``path`` once the quantized native model has checked it: a GGUFError for a damaged or
    inconsistent file, NotImplementedError (with the reason) for one it does not run."""
    meta = GGUFFile(path)
    reason = GGUFConfig(meta).unsupported(meta)
    if reason is not None:
        raise NotImplementedError(f"{Path(path).name}: the quantized native model cannot run it: {reason}")
    return meta


def gguf_config(path: str | Path) -> GGUFConfig:
    """The model's shape as a GGUF file's metadata gives it."""
    return GGUFConfig(GGUFFile(path))


def fim_token_ids(meta: GGUFFile, vocab: int) -> tuple[dict[str, int], list[str]]:
    """The fill-in-the-middle tokens the file's metadata names (role -> id, see :data:`FIM_METADATA_KEYS`) and, for
    each key it holds that is not a token id inside the vocabulary (``0 .. vocab - 1``), a line saying it is ignored
    (the vocabulary's names are looked up instead)."""
    found: dict[str, int] = {}
    ignored: list[str] = []
    for role, key in FIM_METADATA_KEYS.items():
        value = meta.get(key)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab:
            found[role] = int(value)
        else:
            ignored.append(
                f"{meta.path.name}: metadata {key} ({value!r}) is not a token id of the vocabulary (0..{vocab - 1}): "
                "ignored"
            )
    return found, ignored
