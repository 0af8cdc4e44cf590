"""The head drafter's products on the quantized kernels: its weights in Q8_0, activations in 8 bits.

A drafted token of the head reads its layer, its input projection and the output layer over the draft vocabulary
(8,192 rows for the shipped head): 18 MB in float16, 9.5 MB in Q8_0. On a CPU bound by memory that halves the
cost of a drafted token. A drafter need not be exact (the rejection rule keeps the output exact, verification uses
the q a draft was drawn from), so the head's own numerics are free to change; its acceptance is measured
(``docs/DISTILL.md``).
"""

from __future__ import annotations

import numpy as np
import torch

from specwise.models.kernels.quant import DecoderStack, QTensor, quantized_available

__all__ = ["QuantizedHeadLayer", "quantize_rows", "head_quantization_available"]

GGML_Q8_0 = 8


def head_quantization_available() -> bool:
    try:
        import gguf.quants  # noqa: F401
    except ImportError:
        return False
    return quantized_available()


def quantize_rows(weight, name: str = "", shape: tuple[int, int] | None = None) -> QTensor:
    """A float matrix ``[out, in]`` (in a multiple of 32) as a Q8_0 QTensor, quantized a slice of rows at a time
    (no float32 copy of the whole matrix). weight: a tensor, or a function ``(first, count) -> rows`` with
    ``shape`` given."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    if callable(weight):
        block, (out, n_in) = weight, shape
    else:
        weight = weight.detach()
        out, n_in = weight.shape

        def block(first: int, count: int) -> torch.Tensor:
            return weight[first : first + count]

    def rows(first: int, count: int) -> np.ndarray:
        pieces = []
        for lo in range(first, first + count, 256):  # numpy's quantization makes several copies of its input
            w = np.ascontiguousarray(block(lo, min(256, first + count - lo)).float().cpu().numpy())
            pieces.append(np.ascontiguousarray(quantize(w, GGMLQuantizationType.Q8_0)).reshape(-1))
        return np.concatenate(pieces)

    return QTensor(GGML_Q8_0, rows, out, n_in, name=name)


class QuantizedHeadLayer:
    """One Llama decoder layer (no biases) run by the quantized layer kernel, with the caller's KV cache."""

    def __init__(
        self,
        hidden: int,
        n_heads: int,
        n_kv: int,
        head_dim: int,
        intermediate: int,
        eps: float,
        attn_norm: torch.Tensor,
        qkv: torch.Tensor,
        o: torch.Tensor,
        mlp_norm: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
    ) -> None:
        self.hidden, self.n_heads, self.n_kv, self.head_dim = hidden, n_heads, n_kv, head_dim
        self.intermediate, self.eps = intermediate, float(eps)
        q_rows, kv_rows = n_heads * head_dim, n_kv * head_dim
        self.weights = [
            quantize_rows(qkv[:q_rows], "head.q"),
            quantize_rows(qkv[q_rows : q_rows + kv_rows], "head.k"),
            quantize_rows(qkv[q_rows + kv_rows :], "head.v"),
            quantize_rows(o, "head.o"),
            quantize_rows(gate_up[:intermediate], "head.gate"),
            quantize_rows(gate_up[intermediate:], "head.up"),
            quantize_rows(down, "head.down"),
        ]
        self._stack = DecoderStack(
            [self.weights],
            [attn_norm.detach().float().contiguous()],
            [mlp_norm.detach().float().contiguous()],
            [None],
            n_heads,
            n_kv,
            head_dim,
            eps,
        )

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.weights)

    def run(self, x: torch.Tensor, start: int, k_cache, v_cache, capacity: int, cos, sin) -> None:
        """The layer on x ``[k, hidden]`` (float32, contiguous, updated in place) at positions ``start ..``;
        writes k_cache / v_cache ``[kv_heads, capacity, head_dim]``; cos, sin: ``[capacity, head_dim]``."""
        k = x.shape[0]
        self._stack.run(x, [(k_cache[None], v_cache[None])] * k, list(range(start, start + k)), cos, sin, "q8")
