"""The head's training module: one decoder layer on the target's features, unrolled over whole sequences as
drafting runs it (:class:`EagleHead`), its initialisation from a target (:func:`new_head`), and writing it as a head
directory (:func:`save_head`)."""

from __future__ import annotations

import math

try:
    import torch
    from torch import nn
except ModuleNotFoundError as err:  # torch code: the distill extra
    from specwise.extras import missing_extra

    raise missing_extra(err, "distill", "the head's training module (specwise.drafters.head.module)") from err

from pathlib import Path

import numpy as np

from specwise.drafters.head.format import HeadConfig, check_target_shapes, target_identity, write_head
from specwise.models.layer import decoder_layer, qkv_heads, rms_norm, rotary_tables
from specwise.models.target_layers import HFTargetLayers, TensorRows, target_layers

__all__ = ["EagleHead", "new_head", "save_head", "torch_dtype"]


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
        # frozen target parts, set by attach_target (not saved): torch tensors [vocab, d] on the target's device, or
        # a quantized target's rows read on demand (WeightRows)
        self.embed = None
        self._target_output = None  # the target's output layer weight [vocab, d]
        self._head_weight: torch.Tensor | None = None

    def attach_target(self, target) -> None:
        """Take the target's embedding and output layer (``target``: a Hugging Face model or a target's
        :class:`~specwise.models.base.TargetLayers`; frozen, shared; a quantized target's rows are read on demand).
        The output layer's draft-vocabulary rows are gathered when first asked for (:attr:`head_weight`,
        :meth:`output_rows`)."""
        layers = target_layers(target)
        self._check_target_shapes(tuple(layers.embedding.shape), tuple(layers.output.shape))
        self.embed, self._target_output = _frozen(layers.embedding), _frozen(layers.output)
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
        device, kind = (weight.device, weight.dtype) if isinstance(weight, torch.Tensor) else ("cpu", torch.float32)
        ids = self.vocab_ids.to(device)
        out = torch.empty((ids.numel(), weight.shape[1]), dtype=dtype or kind, device=device)
        for a in range(0, ids.numel(), chunk):
            out[a : a + chunk] = _take(weight, ids[a : a + chunk])
        return out

    def output_row_block(self, first: int, count: int) -> torch.Tensor:
        """Rows ``first .. first + count - 1`` of :meth:`output_rows`, float32 (for slice-by-slice conversions)."""
        if self._head_weight is not None:
            return self._head_weight[first : first + count].float()
        weight = self._target_output
        if weight is None:
            raise RuntimeError("attach a target to the head first (attach_target)")
        ids = self.vocab_ids[first : first + count]
        return _take(weight, ids.to(weight.device) if isinstance(weight, torch.Tensor) else ids).float()

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.config.rms_eps)

    def fuse(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Input of the layer: [..., d] from features [..., d] and token ids [...]."""
        emb = torch.as_tensor(_take(self.embed, next_tokens), device=features.device)
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


def _frozen(rows):
    """A target weight as the module keeps it: a torch weight itself (detached, on its device), else the rows as
    they are (a quantized target's, read on demand)."""
    return rows.tensor.detach() if isinstance(rows, TensorRows) else rows


def _take(weight, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` (any shape) of a target weight kept by :func:`_frozen`: a torch weight indexed on its device, or
    rows read on demand (float32, on the host)."""
    if isinstance(weight, torch.Tensor):
        return weight[ids]
    flat = weight.rows(ids.reshape(-1).cpu().numpy())
    return torch.from_numpy(flat).reshape(*ids.shape, flat.shape[-1])


def _shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[..., t - n, :] at t along dim -2 (zeros for t < n)."""
    if n == 0:
        return x
    pad = torch.zeros_like(x[..., :n, :])
    return torch.cat([pad, x[..., :-n, :]], dim=-2)


def new_head(hf_model, name: str, vocab_ids, intermediate_size: int | None = None, seed: int = 0) -> EagleHead:
    """A freshly initialised head for ``hf_model`` (a Hugging Face model; shaped like one of its layers, its rotary
    frequencies and final norm taken where the model has them), attached to it."""
    layers = HFTargetLayers(hf_model)
    shape = layers.layer_shape()
    cfg = HeadConfig(
        hidden_size=shape["hidden_size"],
        num_heads=shape["num_heads"],
        num_kv_heads=shape["num_kv_heads"],
        head_dim=shape["head_dim"],
        intermediate_size=int(intermediate_size or shape["intermediate_size"]),
        rms_eps=shape["rms_eps"],
        draft_vocab_size=len(vocab_ids),
        target=target_identity(layers, name),
    )
    torch.manual_seed(seed)
    head = EagleHead(cfg)
    for module in (head.fc, head.qkv, head.o, head.gate_up, head.down):
        nn.init.normal_(module.weight, std=0.02)
    with torch.no_grad():
        head.vocab_ids.copy_(torch.as_tensor(vocab_ids))
        inv_freq = layers.inverse_frequencies()
        if inv_freq is not None:
            head.inv_freq.copy_(inv_freq.float())
        else:
            hd = cfg.head_dim
            head.inv_freq.copy_(1.0 / shape["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))
        norm = layers.final_norm()
        if norm is not None:  # predicted features live where the target's final norm puts them
            head.out_norm.copy_(norm.float())
    head.attach_target(layers)
    return head


def torch_dtype(dtype):
    """A torch dtype from a torch dtype or its name (``"float16"``)."""
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def save_head(head: EagleHead, directory: Path | str, dtype="float16") -> None:
    """Write the training module ``head`` as a head directory (:func:`~specwise.drafters.head.format.write_head`):
    trainable weights in ``dtype`` (a torch dtype or its name), the rotary frequencies in float32 and the draft
    vocabulary."""
    dtype = torch_dtype(dtype)
    tensors, kinds = {}, {}
    for name, value in head.state_dict().items():
        value = value.detach().cpu().contiguous()
        if value.is_floating_point() and name != "inv_freq":
            value = value.to(dtype)
        if value.dtype == torch.bfloat16:  # no numpy dtype: its bits, named BF16 in the file
            tensors[name], kinds[name] = value.view(torch.int16).numpy().view(np.uint16), "BF16"
        else:
            tensors[name] = value.numpy()
    write_head(directory, head.config, tensors, kinds)
