"""The Llama decoder layer in torch operators, shared by the native model's torch path and the head drafter (its
training module and its drafter).

A layer is pre-norm attention then a SwiGLU MLP, each added to the residual stream, with fused projections:
``qkv`` (queries, keys and values in one product) and ``gate_up``. The C kernels (``kernels/qllama.c``) compute the
same layer in one native call; these functions are the torch path beside them, and the reference they are tested
against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

try:
    import torch
    import torch.nn.functional as F
except ModuleNotFoundError as err:  # torch code: the hf extra
    from specwise.extras import missing_extra

    raise missing_extra(err, "hf", "specwise.models.layer (the float32 decoder layer)") from err

__all__ = [
    "LayerWeights",
    "apply_rotary",
    "cached_attention",
    "causal_mask",
    "decoder_layer",
    "qkv_heads",
    "rms_norm",
    "rotary_tables",
]


@dataclass
class LayerWeights:
    """One decoder layer's weights: norm vectors ``[d]`` and projections (anything ``project`` applies, see
    :func:`decoder_layer`): ``qkv`` d -> (heads + 2 kv_heads) * head_dim, ``o`` heads * head_dim -> d,
    ``gate_up`` d -> 2 * intermediate, ``down`` intermediate -> d."""

    attn_norm: torch.Tensor
    qkv: Any
    o: Any
    mlp_norm: torch.Tensor
    gate_up: Any
    down: Any


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm of x ``[..., d]`` over its last dimension, scaled by ``weight`` ``[d]``."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rotary_tables(
    inv_freq: torch.Tensor, positions: torch.Tensor, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``[n, head_dim]`` for rotate-half rotary embeddings at ``positions``, for
    :func:`apply_rotary`. rotate_half(x) = cat(-x2, x1) = roll(x, half) * [-1]*half + [1]*half, so the sign is
    folded into the sine table."""
    freqs = torch.outer(positions.float(), inv_freq.float())  # [n, head_dim / 2]
    emb = torch.cat([freqs, freqs], dim=-1)
    sin = emb.sin() * scale
    half = inv_freq.numel()
    return emb.cos() * scale, torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x ``[..., head_dim]`` with tables from :func:`rotary_tables` broadcast to it."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)


def qkv_heads(
    qkv: torch.Tensor, n_heads: int, n_kv: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries ``[..., n_heads, hd]``, keys and values ``[..., n_kv, hd]`` from a fused projection
    ``[..., (n_heads + 2 n_kv) * hd]``, rotary applied to queries and keys at once (tables broadcast to
    ``[..., 1, hd]``)."""
    heads = qkv.view(*qkv.shape[:-1], n_heads + 2 * n_kv, head_dim)
    qk = apply_rotary(heads[..., : n_heads + n_kv, :], cos, sin)
    return qk[..., :n_heads, :], qk[..., n_heads:, :], heads[..., n_heads + n_kv :, :]


def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """Attention of n rows at cache rows ``start`` .. ``start + n - 1`` over the cache up to their end.

    q ``[n, heads, hd]``, k and v ``[n, kv_heads, hd]`` (written into the caches ``[kv_heads, capacity, hd]``);
    mask ``[n, start + n]`` (True: may attend) or None (every row sees every cached row up to the end). Returns
    ``[n, heads * hd]``.
    """
    n, end = q.shape[0], start + q.shape[0]
    k_cache[:, start:end] = k.transpose(0, 1)
    v_cache[:, start:end] = v.transpose(0, 1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k_cache[None, :, :end],
        v_cache[None, :, :end],
        attn_mask=mask,
        enable_gqa=q.shape[1] != k.shape[1],
    )[0]  # [heads, n, hd]
    return out.transpose(0, 1).reshape(n, -1)


def causal_mask(start: int, n: int, device: torch.device | str) -> torch.Tensor:
    """True where row i (at position start + i) may see position j: j <= start + i. Shape ``[n, start + n]``."""
    rows = torch.arange(n, device=device)[:, None] + start
    cols = torch.arange(start + n, device=device)[None, :]
    return cols <= rows


def _call(projection, x: torch.Tensor) -> torch.Tensor:
    return projection(x)


def decoder_layer(
    x: torch.Tensor,
    layer: LayerWeights,
    eps: float,
    attend: Callable[[torch.Tensor], torch.Tensor],
    project: Callable[[Any, torch.Tensor], torch.Tensor] = _call,
) -> torch.Tensor:
    """One decoder layer on x ``[..., d]``: ``x + o(attend(qkv(norm(x))))``, then the MLP
    ``down(silu(gate) * up)`` of its norm added to that.

    layer: any object with :class:`LayerWeights`' attributes; ``project(projection, rows)`` applies one of its
    projections (default: ``projection(rows)``, as for an ``nn.Linear``). ``attend(qkv)`` turns the fused
    projection ``[..., (heads + 2 kv_heads) * hd]`` into the attention output ``[..., heads * hd]``. Without
    autograd the MLP works in place (same values, fewer buffers).
    """
    h = x + project(layer.o, attend(project(layer.qkv, rms_norm(x, layer.attn_norm, eps))))
    gate, up = project(layer.gate_up, rms_norm(h, layer.mlp_norm, eps)).chunk(2, dim=-1)  # [..., intermediate]
    if torch.is_grad_enabled():
        return h + project(layer.down, F.silu(gate) * up)
    return h.add_(project(layer.down, F.silu(gate).mul_(up)))
