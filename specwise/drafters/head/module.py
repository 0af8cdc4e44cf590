"""The head's training module: one decoder layer on the target's features, unrolled over whole sequences as
drafting runs it (:class:`EagleHead`), and its initialisation from a target (:func:`new_head`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from specwise.drafters.head.format import HeadConfig, target_identity
from specwise.models.native import apply_rotary, rotary_tables

__all__ = ["EagleHead", "new_head"]


class EagleHead(nn.Module):
    """One decoder layer mapping (target feature at t, embedding of token t+1) to the feature at t+1.

    Trainable: input norms, the fusing projection, the decoder layer and the output norm. Frozen and not saved:
    the target's embedding and its output layer's rows for the draft vocabulary (``attach_target``).
    """

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        d, hd = c.hidden_size, c.head_dim
        self.feature_norm = nn.Parameter(torch.ones(d))
        self.embed_norm = nn.Parameter(torch.ones(d))
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.qkv = nn.Linear(d, (c.num_heads + 2 * c.num_kv_heads) * hd, bias=False)
        self.o = nn.Linear(c.num_heads * hd, d, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(d))
        self.gate_up = nn.Linear(d, 2 * c.intermediate_size, bias=False)
        self.down = nn.Linear(c.intermediate_size, d, bias=False)
        self.out_norm = nn.Parameter(torch.ones(d))
        self.register_buffer("vocab_ids", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("inv_freq", torch.ones(hd // 2))
        # frozen target parts, set by attach_target (not saved)
        self.embed: torch.Tensor | None = None  # [vocab, d]
        self.head_weight: torch.Tensor | None = None  # [draft_vocab, d]

    def attach_target(self, hf_model) -> None:
        """Take the target's embedding and the draft-vocabulary rows of its output layer (frozen, shared)."""
        self.embed = hf_model.get_input_embeddings().weight.detach()
        head = hf_model.get_output_embeddings().weight.detach()
        self.head_weight = head[self.vocab_ids.to(head.device)].contiguous()

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.config.rms_eps)

    def fuse(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Input of the layer: [..., d] from features [..., d] and token ids [...]."""
        emb = self.embed[next_tokens]
        both = torch.cat([self._norm(features, self.feature_norm), self._norm(emb, self.embed_norm)], dim=-1)
        return self.fc(both)

    def qkv_heads(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Rotated queries and keys, and values: [..., n, heads or kv_heads, hd]."""
        c = self.config
        qkv = self.qkv(self._norm(x, self.attn_norm))
        heads = qkv.view(*qkv.shape[:-1], c.num_heads + 2 * c.num_kv_heads, c.head_dim)
        qk = apply_rotary(heads[..., : c.num_heads + c.num_kv_heads, :], cos, sin)
        return qk[..., : c.num_heads, :], qk[..., c.num_heads :, :], heads[..., c.num_heads + c.num_kv_heads :, :]

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual, MLP and output norm after attention: the predicted feature [..., d]."""
        h = x + self.o(attn)
        gate, up = self.gate_up(self._norm(h, self.mlp_norm)).chunk(2, dim=-1)
        h = h + self.down(F.silu(gate) * up)
        return self._norm(h, self.out_norm)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., draft_vocab] of (predicted or true) features."""
        return features @ self.head_weight.T

    # ---- training: several drafting steps unrolled over whole sequences -------------------------------------

    def forward(self, features: torch.Tensor, next_tokens: torch.Tensor, steps: int = 1) -> list[torch.Tensor]:
        """Teacher-forced drafting, unrolled ``steps`` times as it happens at inference.

        features: [B, T, d] the target's features at positions 0..T-1; next_tokens: [B, T] the token at t+1.
        Returns one [B, T, d] tensor per step s (1-based): row t predicts the feature at t+1 when the inputs
        at positions > t - s + 1 are the head's own earlier predictions (valid for t >= s - 1). At step s,
        position t attends to true keys up to t - s + 1 and to its own predictions at t - s + 2 .. t, which is
        what the cache holds when the s-th token of a draft is made.
        """
        c = self.config
        B, T, _ = features.shape
        positions = torch.arange(T, device=features.device)
        cos, sin = rotary_tables(self.inv_freq, positions)
        cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, hd]
        group = c.num_heads // c.num_kv_heads
        scale = 1.0 / math.sqrt(c.head_dim)
        outputs: list[torch.Tensor] = []
        keys: list[torch.Tensor] = []  # per step: [B, heads, T, hd]
        values: list[torch.Tensor] = []
        feats = features
        for s in range(1, steps + 1):
            x = self.fuse(feats, next_tokens)  # [B, T, d]
            q, k, v = self.qkv_heads(x, cos, sin)  # [B, T, h, hd]
            q = q.transpose(1, 2)  # [B, heads, T, hd]
            k = k.transpose(1, 2).repeat_interleave(group, dim=1)
            v = v.transpose(1, 2).repeat_interleave(group, dim=1)
            keys.append(k)
            values.append(v)
            # scores against the first step's (true) keys, at j <= t - s + 1
            scores = [q @ keys[0].transpose(-1, -2) * scale]  # [B, heads, T, T]
            allowed = positions[None, :] <= positions[:, None] - (s - 1)
            scores[0] = scores[0].masked_fill(~allowed, float("-inf"))
            # and against each later step m's key at position t - (s - m)
            for m in range(2, s + 1):
                shift = s - m
                km = _shift(keys[m - 1], shift)
                scores.append(((q * km).sum(-1) * scale)[..., None])
            weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1)  # [B, heads, T, T + s - 1]
            weights = torch.nan_to_num(weights)  # rows with no allowed key (t < s - 1) are invalid anyway
            attn = weights[..., :T] @ values[0]
            for m in range(2, s + 1):
                attn = attn + weights[..., T + m - 2 : T + m - 1] * _shift(values[m - 1], s - m)
            attn = attn.transpose(1, 2).reshape(B, T, c.num_heads * c.head_dim)
            pred = self.finish(x, attn)  # [B, T, d]
            outputs.append(pred)
            # next step: position t reads the prediction made at t - 1
            feats = torch.cat([torch.zeros_like(pred[:, :1]), pred[:, :-1]], dim=1)
        return outputs


def _shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[..., t - n, :] at t along dim -2 (zeros for t < n)."""
    if n == 0:
        return x
    pad = torch.zeros_like(x[..., :n, :])
    return torch.cat([pad, x[..., :-n, :]], dim=-2)


def new_head(
    hf_model, name: str, vocab_ids: torch.Tensor, intermediate_size: int | None = None, seed: int = 0
) -> EagleHead:
    """A freshly initialised head for ``hf_model`` (shaped like one of its layers), attached to it."""
    config = hf_model.config
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    cfg = HeadConfig(
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
        intermediate_size=int(intermediate_size or config.intermediate_size),
        rms_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
        draft_vocab_size=int(vocab_ids.numel()),
        target=target_identity(hf_model, name),
    )
    torch.manual_seed(seed)
    head = EagleHead(cfg)
    for module in (head.fc, head.qkv, head.o, head.gate_up, head.down):
        nn.init.normal_(module.weight, std=0.02)
    with torch.no_grad():
        head.vocab_ids.copy_(vocab_ids)
        rotary = getattr(getattr(hf_model, "model", None), "rotary_emb", None)
        if rotary is not None:
            head.inv_freq.copy_(rotary.inv_freq.float())
        else:
            base = float(getattr(config, "rope_theta", 10000.0))
            hd = cfg.head_dim
            head.inv_freq.copy_(1.0 / base ** (torch.arange(0, hd, 2).float() / hd))
        norm = getattr(getattr(hf_model, "model", None), "norm", None)
        if norm is not None:  # predicted features live where the target's final norm puts them
            head.out_norm.copy_(norm.weight.float())
    head.attach_target(hf_model)
    return head
