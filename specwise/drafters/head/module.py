"""The head's training module: one decoder layer on the target's features, unrolled over whole sequences as
drafting runs it (:class:`EagleHead`), and its initialisation from a target (:func:`new_head`)."""

from __future__ import annotations

import math

try:
    import torch
    from torch import nn
except ModuleNotFoundError as err:  # torch code: the distill extra
    from specwise.extras import missing_extra

    raise missing_extra(err, "distill", "the head's training module (specwise.drafters.head.module)") from err

from specwise.drafters.head.format import HeadConfig, check_target_shapes, target_identity
from specwise.models.layer import decoder_layer, qkv_heads, rms_norm, rotary_tables

__all__ = ["EagleHead", "new_head"]


class EagleHead(nn.Module):
    """One decoder layer mapping (target feature at t, embedding of token t+1) to the feature at t+1.

    Trainable: input norms, the fusing projection, the decoder layer (:func:`specwise.models.layer.decoder_layer`,
    with this module as its weights) and the output norm. Frozen and not saved: the target's embedding and its
    output layer's rows for the draft vocabulary (``attach_target``).
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
        self._target_output = None  # the target's output layer weight [vocab, d]
        self._head_weight: torch.Tensor | None = None

    def attach_target(self, hf_model) -> None:
        """Take the target's embedding and output layer (frozen, shared; a quantized target's rows are read on
        demand). The output layer's draft-vocabulary rows are gathered when first asked for (:attr:`head_weight`,
        :meth:`output_rows`)."""
        embed = hf_model.get_input_embeddings().weight.detach()
        output = hf_model.get_output_embeddings().weight.detach()
        self._check_target_shapes(tuple(embed.shape), tuple(output.shape))
        self.embed, self._target_output = embed, output
        self._head_weight = None

    def _check_target_shapes(self, embed: tuple[int, ...], output: tuple[int, ...]) -> None:
        """Refuse a target whose embedding or output layer (``[vocab, hidden]``) does not fit the head
        (TargetMismatchError; :func:`~specwise.drafters.head.format.check_target_shapes`)."""
        check_target_shapes(self.config, self.vocab_ids.cpu().numpy(), embed, output)

    @property
    def head_weight(self) -> torch.Tensor:
        """The target's output layer on the draft vocabulary ``[draft_vocab, d]``, in its dtype (gathered once)."""
        if self._head_weight is None:
            if self._target_output is None:
                raise RuntimeError("attach a target to the head first (attach_target)")
            self._head_weight = self.output_rows()
        return self._head_weight

    @head_weight.setter
    def head_weight(self, value: torch.Tensor | None) -> None:
        self._head_weight = value

    def output_rows(self, dtype: torch.dtype | None = None, chunk: int = 1024) -> torch.Tensor:
        """The output layer's draft-vocabulary rows ``[draft_vocab, d]`` in ``dtype`` (None: the target's), gathered
        ``chunk`` rows at a time: no whole float32 copy is made on the way to float16. (:attr:`head_weight` itself
        when it was gathered already and has that dtype.)"""
        if self._head_weight is not None:
            return self._head_weight.to(dtype or self._head_weight.dtype)
        weight = self._target_output
        if weight is None:
            raise RuntimeError("attach a target to the head first (attach_target)")
        ids = self.vocab_ids.to(weight.device)
        out = torch.empty((ids.numel(), weight.shape[1]), dtype=dtype or weight.dtype, device=weight.device)
        for a in range(0, ids.numel(), chunk):
            out[a : a + chunk] = torch.as_tensor(weight[ids[a : a + chunk]])  # a quantized target's rows: numpy
        return out

    def output_row_block(self, first: int, count: int) -> torch.Tensor:
        """Rows ``first .. first + count - 1`` of :meth:`output_rows`, float32 (for slice-by-slice conversions)."""
        if self._head_weight is not None:
            return self._head_weight[first : first + count].float()
        if self._target_output is None:
            raise RuntimeError("attach a target to the head first (attach_target)")
        ids = self.vocab_ids[first : first + count].to(self._target_output.device)
        return torch.as_tensor(self._target_output[ids]).float()

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.config.rms_eps)

    def fuse(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Input of the layer: [..., d] from features [..., d] and token ids [...]."""
        emb = torch.as_tensor(self.embed[next_tokens], device=features.device)  # a quantized target's rows: numpy
        both = torch.cat([self._norm(features, self.feature_norm), self._norm(emb, self.embed_norm)], dim=-1)
        return self.fc(both)

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
        T = features.shape[1]
        cos, sin = rotary_tables(self.inv_freq, torch.arange(T, device=features.device))
        cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, hd]
        outputs: list[torch.Tensor] = []
        keys: list[torch.Tensor] = []  # per step: [B, heads, T, hd]
        values: list[torch.Tensor] = []
        feats = features

        def attend(qkv: torch.Tensor) -> torch.Tensor:
            return self._unrolled_attention(qkv, cos, sin, keys, values)

        for _ in range(steps):
            x = self.fuse(feats, next_tokens)  # [B, T, d]
            pred = self._norm(decoder_layer(x, self, c.rms_eps, attend), self.out_norm)  # [B, T, d]
            outputs.append(pred)
            # next step: position t reads the prediction made at t - 1
            feats = torch.cat([torch.zeros_like(pred[:, :1]), pred[:, :-1]], dim=1)
        return outputs

    def _unrolled_attention(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: list, values: list
    ) -> torch.Tensor:
        """Attention of drafting step s = len(keys) + 1 (this step's keys and values are appended to the lists):
        qkv [B, T, (heads + 2 kv_heads) * hd] -> [B, T, heads * hd]."""
        c = self.config
        B, T = qkv.shape[:2]
        positions = torch.arange(T, device=qkv.device)
        group = c.num_heads // c.num_kv_heads
        scale = 1.0 / math.sqrt(c.head_dim)
        q, k, v = qkv_heads(qkv, c.num_heads, c.num_kv_heads, c.head_dim, cos, sin)  # [B, T, h, hd]
        q = q.transpose(1, 2)  # [B, heads, T, hd]
        keys.append(k.transpose(1, 2).repeat_interleave(group, dim=1))
        values.append(v.transpose(1, 2).repeat_interleave(group, dim=1))
        s = len(keys)
        # scores against the first step's (true) keys, at j <= t - s + 1
        scores = [q @ keys[0].transpose(-1, -2) * scale]  # [B, heads, T, T]
        allowed = positions[None, :] <= positions[:, None] - (s - 1)
        scores[0] = scores[0].masked_fill(~allowed, float("-inf"))
        # and against each later step m's key at position t - (s - m)
        for m in range(2, s + 1):
            km = _shift(keys[m - 1], s - m)
            scores.append(((q * km).sum(-1) * scale)[..., None])
        weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1)  # [B, heads, T, T + s - 1]
        weights = torch.nan_to_num(weights)  # rows with no allowed key (t < s - 1) are invalid anyway
        attn = weights[..., :T] @ values[0]
        for m in range(2, s + 1):
            attn = attn + weights[..., T + m - 2 : T + m - 1] * _shift(values[m - 1], s - m)
        return attn.transpose(1, 2).reshape(B, T, c.num_heads * c.head_dim)


def _shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[..., t - n, :] at t along dim -2 (zeros for t < n)."""
    if n == 0:
        return x
    pad = torch.zeros_like(x[..., :n, :])
    return torch.cat([pad, x[..., :-n, :]], dim=-2)


def new_head(hf_model, name: str, vocab_ids, intermediate_size: int | None = None, seed: int = 0) -> EagleHead:
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
        draft_vocab_size=len(vocab_ids),
        target=target_identity(hf_model, name),
    )
    torch.manual_seed(seed)
    head = EagleHead(cfg)
    for module in (head.fc, head.qkv, head.o, head.gate_up, head.down):
        nn.init.normal_(module.weight, std=0.02)
    with torch.no_grad():
        head.vocab_ids.copy_(torch.as_tensor(vocab_ids))
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
