"""A native implementation of the Llama family (Llama, Mistral without a sliding window, Qwen2) in plain PyTorch.

Built for decoding one sequence fast on a small machine:

- fused QKV and gate/up projections (one matrix product each instead of three and two);
- a preallocated KV cache written by position: rollback moves a length, nothing is copied or freed;
- rotary tables precomputed for every position;
- the output layer only on the rows whose logits are asked for;
- a choice of matrix-product kernel per number of rows (see :class:`Linear`), measured by ``specwise profile``;
- on CPUs where specwise's kernels are built, all decoder layers of a pass over a few rows in one native call
  (the one layer kernel of ``kernels/qllama.c``, its float weights read in place as float rows), which removes the
  per-operator overhead of ~20 small torch operators per layer.

The Hugging Face model it is built from stays the reference: the tests check that the logits match it. Needs the
``hf`` extra (torch and transformers), imported only where a float32 model is loaded; at its boundary it follows
the contract of :mod:`specwise.models.base` (token ids in as anything ``numpy.asarray`` reads, logits and features
out as float32 numpy arrays on the CPU). The native kernels take numpy views of the CPU tensors (``Tensor.numpy()``:
the same memory, written in place).
"""

from __future__ import annotations

import copy

import numpy as np

try:
    import torch
except ModuleNotFoundError as err:  # torch code: the hf extra
    from specwise.extras import missing_extra

    raise missing_extra(err, "hf", "specwise.models.native (the float32 native model)") from err

from specwise.models.base import Model
from specwise.models.kernels import LayerKernel, layer_kernel, small_gemm, small_gemm_available
from specwise.models.layer import (
    LayerWeights,
    apply_rotary,
    cached_attention,
    causal_mask,
    decoder_layer,
    qkv_heads,
    rms_norm,
    rotary_tables,
)

__all__ = ["NativeModel", "native_supported", "GEMM_BACKENDS", "rotary_tables", "apply_rotary"]

_ARCHITECTURES = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}
GEMM_BACKENDS = ("torch", "kernel")


def native_supported(hf_model) -> str | None:
    """None when the native model can run ``hf_model``; otherwise the reason it cannot."""
    config = hf_model.config
    arch = type(hf_model).__name__
    if arch not in _ARCHITECTURES:
        return f"architecture {arch} is not in the native family ({', '.join(sorted(_ARCHITECTURES))})"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act} is not supported"
    window = getattr(config, "sliding_window", None)
    use_window = getattr(config, "use_sliding_window", arch == "MistralForCausalLM")
    if window and use_window and window < getattr(config, "max_position_embeddings", 0):
        return "sliding-window attention is not supported"
    if getattr(config, "mlp_bias", False):
        return "MLP biases are not supported"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1 is not supported"
    return None


class Linear:
    """``y = x @ W.T (+ b)`` with a choice of kernel by the number of rows of ``x``.

    Backends: ``torch`` (F.linear: MKL on CPUs, cuBLAS on GPUs) and ``kernel`` (specwise's small-row kernel, see
    ``specwise/models/kernels``), which applies to float32 CPU tensors of up to 32 rows and reads the torch
    weight in place; anything else uses torch. The backend for each row count is set by
    ``NativeModel.set_gemm``; ``specwise profile`` measures both. (OpenBLAS through numpy was tried too: alone it
    is fast for one row, but its thread pool fights OpenMP's inside a full forward pass, 5-10x slower.) The kernel
    reads numpy views of the weight and bias (the same memory) and writes a new float32 array, wrapped back as a
    tensor without a copy.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight.detach().contiguous()  # [out, in]
        self.bias = bias.detach().contiguous() if bias is not None else None
        # the kernel serves float32 and float16 CPU weights where it was built; anything else uses torch. A float16
        # weight with float32 inputs (a drafter's, for half the memory traffic) goes through the kernel up to 32
        # rows, and through torch with a float32 copy (made once) beyond.
        cpu = self.weight.device.type == "cpu"
        self.kernel_ok = cpu and self.weight.dtype in (torch.float32, torch.float16) and small_gemm_available()
        self.kernel_ok = self.kernel_ok and (self.bias is None or self.bias.dtype == torch.float32)
        self._weight_np = self.weight.numpy() if self.kernel_ok else None
        self._bias_np = self.bias.numpy() if self.kernel_ok and self.bias is not None else None
        self._converted: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, backend: str) -> torch.Tensor:
        wanted = backend == "kernel" or self.weight.dtype != x.dtype
        if self.kernel_ok and x.dtype == torch.float32 and x.device.type == "cpu" and x.shape[0] <= 32 and wanted:
            rows = x.detach().contiguous().numpy()
            return torch.from_numpy(small_gemm(rows, self._weight_np, self._bias_np))
        weight = self.weight
        if weight.dtype != x.dtype:
            if self._converted is None or self._converted.dtype != x.dtype:
                self._converted = weight.to(x.dtype)
            weight = self._converted
        return torch.nn.functional.linear(x, weight, self.bias)


class NativeModel(Model):
    """The Llama family behind the Model contract, built from a Hugging Face model's weights."""

    def __init__(self, hf_model, name: str = "native", capacity: int = 1024) -> None:
        reason = native_supported(hf_model)
        if reason is not None:
            raise NotImplementedError(f"{name}: the native model cannot run this model: {reason}")
        config = hf_model.config
        self.hf_model = hf_model.eval()  # the reference; shares the unfused weights
        self.name = name
        self.config = config
        base = hf_model.model
        self.device = str(base.embed_tokens.weight.device)  # "cpu", "cuda:0": a plain string (the contract)
        self.dtype = base.embed_tokens.weight.dtype
        self.hidden = config.hidden_size
        self.n_heads = config.num_attention_heads
        self.n_kv = getattr(config, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden // self.n_heads
        self.eps = float(config.rms_norm_eps)
        self.max_length = getattr(config, "max_position_embeddings", None)
        with torch.no_grad():
            self.embed = base.embed_tokens.weight.detach()
            self.layers = [self._layer(block) for block in base.layers]
            self.final_norm = base.norm.weight.detach()
            head = hf_model.get_output_embeddings()
            self.lm_head = Linear(head.weight.detach(), getattr(head, "bias", None))
        self.vocab_size = int(self.lm_head.weight.shape[0])
        rotary = base.rotary_emb
        self._inv_freq = rotary.inv_freq.detach().float().to(self.device)
        self._rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self._gemm: dict[int, str] = {}  # rows -> backend
        self._default_gemm = "torch"
        if self.kernel_usable:
            # measured on the development machine (specwise profile): the small-row kernel wins at 1..16 rows
            self._default_gemm = "kernel"
        self._length = 0
        self._capacity = 0
        self._grow(min(capacity, self.max_length or capacity))
        self._fused = self._fused_setup()

    def _fused_setup(self) -> LayerKernel | None:
        """The native layer kernel over this model's layers, or None where it does not serve them."""
        tables = (self._cos, self._sin)
        if not self.kernel_usable or any(t.dtype != torch.float32 or not t.is_contiguous() for t in tables):
            return None
        layers = self.layers
        return layer_kernel(
            self.hidden,
            self.n_heads,
            self.n_kv,
            self.head_dim,
            layers[0].down.weight.shape[1],
            self.eps,
            attn_norm=_views(layer.attn_norm for layer in layers),
            qkv=_views(layer.qkv.weight for layer in layers),
            qkv_bias=_views(layer.qkv.bias for layer in layers),
            o=_views(layer.o.weight for layer in layers),
            o_bias=_views(layer.o.bias for layer in layers),
            mlp_norm=_views(layer.mlp_norm for layer in layers),
            gate_up=_views(layer.gate_up.weight for layer in layers),
            down=_views(layer.down.weight for layer in layers),
        )

    @staticmethod
    def _layer(block) -> LayerWeights:
        attn, mlp = block.self_attn, block.mlp
        qkv_w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach()
        qkv_b = None
        if attn.q_proj.bias is not None:
            qkv_b = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).detach()
        gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach()
        return LayerWeights(
            attn_norm=block.input_layernorm.weight.detach(),
            qkv=Linear(qkv_w, qkv_b),
            o=Linear(attn.o_proj.weight.detach(), getattr(attn.o_proj, "bias", None)),
            mlp_norm=block.post_attention_layernorm.weight.detach(),
            gate_up=Linear(gate_up),
            down=Linear(mlp.down_proj.weight.detach()),
        )

    # ---- cache ---------------------------------------------------------------------------------------------

    def _grow(self, capacity: int) -> None:
        """(Re)allocate the KV cache and rotary tables for ``capacity`` positions, keeping what is cached."""
        shape = (len(self.layers), self.n_kv, capacity, self.head_dim)
        k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        if self._capacity:
            k_cache[:, :, : self._length] = self.k_cache[:, :, : self._length]
            v_cache[:, :, : self._length] = self.v_cache[:, :, : self._length]
        self.k_cache, self.v_cache = k_cache, v_cache  # [layers, kv_heads, capacity, head_dim]
        feats = torch.zeros((capacity, self.hidden), dtype=self.dtype, device=self.device)
        if self._capacity:
            feats[: self._length] = self._features[: self._length]
        self._features = feats  # [capacity, hidden], written when keep_features is set
        positions = torch.arange(capacity, device=self.device)
        cos, sin = rotary_tables(self._inv_freq, positions, self._rope_scale)  # [capacity, head_dim]
        self._cos, self._sin = cos.to(self.dtype), sin.to(self.dtype)
        self._capacity = capacity

    def sequence(self) -> NativeModel:
        """Another sequence over the same weights and kernels (shared, not copied), with its own empty KV cache and
        features (as large as this one's now). The layer kernel's scratch space is shared too: the sequences of a
        model run one after another, never at the same time."""
        other = copy.copy(self)
        other._length = other._capacity = 0
        other.keep_features = False
        other._grow(self._capacity)
        return other

    @property
    def length(self) -> int:
        return self._length

    def copy_prefix(self, source: Model, length: int) -> None:
        self._check_copy_prefix(source, getattr(source, "embed", None) is self.embed, length)
        if length > self._capacity:
            self._length = 0  # nothing of this sequence's to keep
            self._grow(max(length, source._capacity))
        self.k_cache[:, :, :length] = source.k_cache[:, :, :length]
        self.v_cache[:, :, :length] = source.v_cache[:, :, :length]
        if self.keep_features:
            self._features[:length] = source._features[:length]
        self._length = length

    def rollback(self, length: int) -> None:
        self._check_rollback(length)
        self._length = length  # stale entries past `length` are overwritten before they are read

    def features(self, start: int, end: int) -> np.ndarray:
        self._check_features(start, end)
        return np.array(self._features[start:end].float().cpu().numpy(), dtype=np.float32)  # a copy

    # ---- kernels ---------------------------------------------------------------------------------------------

    @property
    def kernel_usable(self) -> bool:
        """Whether the small-row kernel serves this model's weights (float32 on a CPU with the kernel built)."""
        return self.lm_head.kernel_ok and self.lm_head.weight.dtype == torch.float32

    @property
    def gemm(self) -> tuple[dict[int, str], str]:
        """The backend per row count and the default backend."""
        return dict(self._gemm), self._default_gemm

    def set_gemm(self, by_rows: dict[int, str] | None = None, default: str = "torch") -> None:
        """Choose the matrix-product backend per number of rows (``torch`` or ``kernel``)."""
        for backend in [default, *(by_rows or {}).values()]:
            if backend not in GEMM_BACKENDS:
                raise ValueError(f"unknown GEMM backend {backend!r}: use one of {GEMM_BACKENDS}")
        self._gemm = dict(by_rows or {})
        self._default_gemm = default

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.eps)

    def _attention(self, layer: int, qkv: torch.Tensor, start: int) -> torch.Tensor:
        """qkv: [k, (heads + 2 kv_heads) * head_dim] for cache rows start .. start + k - 1. Returns [k, heads * hd]."""
        k = qkv.shape[0]
        cos, sin = self._cos[start : start + k, None], self._sin[start : start + k, None]  # [k, 1, hd]
        q, keys, values = qkv_heads(qkv, self.n_heads, self.n_kv, self.head_dim, cos, sin)
        mask = None if k == 1 else causal_mask(start, k, self.device)
        return cached_attention(q, keys, values, self.k_cache[layer], self.v_cache[layer], start, mask)

    # ---- forward ---------------------------------------------------------------------------------------------

    def forward(self, tokens, num_logits: int | None = None) -> np.ndarray:
        ids = self._check_forward(tokens)  # an int64 array [k]
        keep = ids.size if num_logits is None else num_logits
        with torch.inference_mode():
            logits = self._run(torch.tensor(ids, device=self.device), num_logits)
        if keep == 0:
            return np.empty((0, self.vocab_size), dtype=np.float32)
        return np.ascontiguousarray(logits.float().cpu().numpy())

    def _run(self, tokens: torch.Tensor, num_logits: int | None) -> torch.Tensor:
        k = tokens.numel()
        start = self._length
        if start + k > self._capacity:
            self._grow(min(max(2 * self._capacity, start + k), self.max_length or start + k))
        backend = self._gemm.get(k, self._default_gemm)
        x = self.embed[tokens]  # [k, hidden]
        if backend == "kernel" and self._fused is not None and k <= LayerKernel.MAX_ROWS:
            x = x.contiguous()
            # numpy views of the CPU tensors: the kernel writes x and the caches in place
            caches = (self.k_cache.numpy(), self.v_cache.numpy())
            self._fused.run(x.numpy(), start, *caches, self._capacity, self._cos.numpy(), self._sin.numpy())
        else:
            x = self._torch_layers(x, start, backend)
        self._length = start + k
        keep = k if num_logits is None else num_logits
        if self.keep_features:
            h = self._rms_norm(x, self.final_norm)
            self._features[start : start + k] = h
            h = h[k - keep :]
        elif keep:
            h = self._rms_norm(x[k - keep :], self.final_norm)
        if keep == 0:
            return x.new_empty((0, self.vocab_size), dtype=torch.float32)
        head_backend = self._gemm.get(keep, self._default_gemm)
        return self.lm_head(h, head_backend).float()

    def _torch_layers(self, x: torch.Tensor, start: int, backend: str) -> torch.Tensor:
        def project(linear: Linear, rows: torch.Tensor) -> torch.Tensor:
            return linear(rows, backend)

        for i, layer in enumerate(self.layers):
            x = decoder_layer(x, layer, self.eps, lambda qkv, i=i: self._attention(i, qkv, start), project)
        return x


def _views(tensors) -> list[np.ndarray | None]:
    """numpy views (the same memory) of CPU tensors, None kept: what the native layer kernel reads."""
    return [None if t is None else t.detach().numpy() for t in tensors]
