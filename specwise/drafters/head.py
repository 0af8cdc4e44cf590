"""The `head` drafter: a small trained decoder layer on the target's own features (in the spirit of EAGLE).

At each position the head reads the target's last hidden state (after the final norm, the input of the output
layer) and the embedding of the next token, and predicts the next position's hidden state; the target's own
output layer, restricted to a draft vocabulary of the most frequent tokens, turns that into q. Drafting more
than one token feeds the head its own predicted state. The target's embedding and output layer are reused
frozen, so a head file holds only the small layer (a few MB).

q is zero outside the draft vocabulary; the rejection rule handles that exactly (such tokens are never
drafted, and the residual distribution can still produce them).

Training is in :mod:`specwise.distill`; ``specwise distill`` writes a directory with ``config.json`` and
``model.safetensors`` that ``--drafter head:DIR`` loads.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specwise.drafters.base import Draft, Drafter, common_prefix
from specwise.files import atomic_path, write_json_atomic
from specwise.models.kernels import LayerKernel, layer_kernel, small_gemm_available
from specwise.models.native import Linear, apply_rotary, rotary_tables
from specwise.sampling import SamplingParams, probs_from_logits, sample

__all__ = ["HeadConfig", "EagleHead", "HeadDrafter", "TargetMismatchError", "load_head", "new_head", "save_head"]

FORMAT = "specwise-head"
FORMAT_VERSION = 1


class TargetMismatchError(ValueError):
    """The head was trained for another target model."""


@dataclass
class HeadConfig:
    """Shape of a head and the identity of the target it was trained for."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    draft_vocab_size: int
    target: dict = field(default_factory=dict)  # name, architecture, vocab_size, hidden_size, layers, fingerprint
    training: dict = field(default_factory=dict)  # how it was made (free-form, written by distill)

    def to_json(self) -> dict:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> HeadConfig:
        if data.get("format") != FORMAT:
            raise ValueError(f"not a specwise head config (format {data.get('format')!r}, expected {FORMAT!r})")
        if data.get("format_version", 0) > FORMAT_VERSION:
            raise ValueError(
                f"head format version {data['format_version']} is newer than this specwise ({FORMAT_VERSION}): "
                "upgrade specwise"
            )
        keys = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in keys})


def target_identity(hf_model, name: str) -> dict:
    """What a head records about its target, to refuse another target later (see :func:`check_target`).

    The fingerprint is the mean of 16 slices of the output layer's weight: it tells models apart and survives
    a change of dtype or file format of the same weights.
    """
    config = hf_model.config
    weight = hf_model.get_output_embeddings().weight
    if hasattr(hf_model, "fingerprint"):  # a quantized target computes it without expanding its output layer
        fingerprint = hf_model.fingerprint()
    else:
        chunks = weight.detach().float().flatten().chunk(16)
        fingerprint = [round(float(c.double().abs().mean()), 6) for c in chunks]
    return {
        "name": name,
        "architecture": getattr(hf_model, "architecture", type(hf_model).__name__),
        "vocab_size": int(weight.shape[0]),
        "hidden_size": int(config.hidden_size),
        "num_layers": int(config.num_hidden_layers),
        "fingerprint": fingerprint,
    }


def check_target(config: HeadConfig, hf_model, name: str) -> None:
    """Raise TargetMismatchError when ``hf_model`` is not the target the head was trained for."""
    recorded = config.target
    actual = target_identity(hf_model, name)
    for key in ("architecture", "vocab_size", "hidden_size", "num_layers"):
        if recorded.get(key) != actual[key]:
            raise TargetMismatchError(
                f"this head was trained for {recorded.get('name')!r} ({key} {recorded.get(key)}), but the target "
                f"{name!r} has {key} {actual[key]}: train a head for this target with `specwise distill`"
            )
    fp_a, fp_b = recorded.get("fingerprint", []), actual["fingerprint"]
    if len(fp_a) != len(fp_b) or any(abs(a - b) > 1e-3 * max(abs(a), 1e-6) + 1e-5 for a, b in zip(fp_a, fp_b)):
        raise TargetMismatchError(
            f"this head was trained for {recorded.get('name')!r}, and the target {name!r} has the same shape but "
            "different weights: train a head for this target with `specwise distill`"
        )


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


def save_head(head: EagleHead, directory: Path, dtype: torch.dtype = torch.float16) -> None:
    """Write ``config.json`` and ``model.safetensors`` (trainable weights, the draft vocabulary) atomically."""
    from safetensors.torch import save_file

    tensors = {}
    for name, value in head.state_dict().items():
        value = value.detach().cpu()
        tensors[name] = value.to(dtype) if value.is_floating_point() and name != "inv_freq" else value
    with atomic_path(directory / "model.safetensors") as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    write_json_atomic(directory / "config.json", head.config.to_json())


def load_head(directory: Path | str, device: torch.device | str = "cpu") -> EagleHead:
    """Read a head directory (weights in float32 on ``device``); attach a target before use."""
    from safetensors.torch import load_file

    directory = Path(directory)
    cfg_path = directory / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(
            f"{directory} is not a head directory (no config.json): train one with `specwise distill --out DIR`"
        )
    config = HeadConfig.from_json(json.loads(cfg_path.read_text()))
    head = EagleHead(config)
    state = load_file(str(directory / "model.safetensors"))
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    head.load_state_dict(state)
    return head.to(device).eval()


class HeadDrafter(Drafter):
    """Drafts with an :class:`EagleHead` from the target's features.

    The target must keep its features (``needs_features``: the engine sets ``target.keep_features``). The head
    has its own KV cache (one layer) written by position: positions whose features came from the target are
    kept between steps, the speculative ones are overwritten by the next proposal.
    """

    name = "head"
    needs_features = True

    def __init__(
        self,
        head: EagleHead,
        target,
        capacity: int = 1024,
        half_weights: bool = True,
        alternatives: tuple[int, ...] = (),
        window: int | None = 128,
        sinks: int = 4,
    ) -> None:
        self.head = head.eval()
        # Catching up on a context longer than ``window`` positions (a new request's prompt), the head feeds its
        # first ``sinks`` positions and its last ``window`` ones only: its layer's cost no longer grows with the
        # prompt. The head then attends to fewer positions than it was trained with, which may change q (never the
        # output: verification uses the q the draft was drawn from). None: the whole context. On long passage
        # prompts from the corpora (not Spec-Bench) the shipped head's greedy acceptance at gamma 1 was 0.379 with
        # the whole context, 0.386 with 128 positions and 4 sinks, 0.374 with 32 (docs/ENGINE.md, session 9).
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be a positive number of positions or None, got {window!r}")
        if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
            raise ValueError(f"sinks must be an integer >= 0, got {sinks!r}")
        self.window, self.sinks = window, sinks
        # greedy drafts: this many runner-up tokens at each drafted position (a draft tree's leaves), verified in
        # the same pass by targets that verify trees
        self.alternatives = tuple(int(a) for a in alternatives)
        self.target = target
        self.device = target.device
        self._c = head.config
        # On a CPU with specwise's kernels the products read float16 copies of the weights (computed in float32):
        # half the memory traffic per drafted token. A shipped head is stored in float16, so its own weights are
        # the same values; the output layer (rows of the target's) is rounded. That changes q slightly, never the
        # output: verification uses the q the draft was drawn from.
        half = half_weights and small_gemm_available() and torch.device(self.device).type == "cpu"
        with torch.no_grad():

            def linear(weight: torch.Tensor) -> Linear:
                weight = weight.detach()
                return Linear(weight.half().contiguous() if half else weight)

            self._fc = linear(head.fc.weight)
            self._qkv = linear(head.qkv.weight)
            self._o = linear(head.o.weight)
            self._gate_up = linear(head.gate_up.weight)
            self._down = linear(head.down.weight)
            self._lm = linear(head.head_weight)
        self._backend = "kernel" if self._lm.kernel_ok else "torch"
        self._fused = self._fused_setup()
        self._vocab_ids = head.vocab_ids.to(self.device)
        self._capacity = 0
        self._grow(capacity)
        self._fed: list[int] = []  # context tokens whose (feature, next token) pairs are in the head's cache
        # positions >= self._offset are at cache index position - self._shift (both 0 without a window)
        self._offset = self._shift = 0

    def _fused_setup(self) -> LayerKernel | None:
        """The native layer kernel over the head's decoder layer (None where unavailable)."""
        if self._backend != "kernel":
            return None
        c, h = self._c, self.head
        return layer_kernel(
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.intermediate_size,
            c.rms_eps,
            attn_norm=[h.attn_norm.detach()],
            qkv=[self._qkv.weight],
            qkv_bias=[None],
            o=[self._o.weight],
            o_bias=[None],
            mlp_norm=[h.mlp_norm.detach()],
            gate_up=[self._gate_up.weight],
            down=[self._down.weight],
        )

    def _grow(self, capacity: int) -> None:
        c = self._c
        shape = (c.num_kv_heads, capacity, c.head_dim)
        k_cache = torch.zeros(shape, device=self.device)
        v_cache = torch.zeros(shape, device=self.device)
        if self._capacity:
            k_cache[:, : self._capacity] = self.k_cache
            v_cache[:, : self._capacity] = self.v_cache
        self.k_cache, self.v_cache = k_cache, v_cache
        cos, sin = rotary_tables(self.head.inv_freq, torch.arange(capacity, device=self.device))
        self._cos, self._sin = cos[:, None, :], sin[:, None, :]
        self._capacity = capacity

    def begin(self, prompt: list[int]) -> None:
        self._fed = []
        self._offset = self._shift = 0

    def _step(self, features: torch.Tensor, next_tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Feed n positions at ``start``; return predicted features [n, d]."""
        c, h, b = self._c, self.head, self._backend
        norm = h._norm
        n = features.shape[0]
        if start + n > self._capacity:
            self._grow(max(2 * self._capacity, start + n))
        emb = h.embed[next_tokens]
        x = self._fc(torch.cat([norm(features, h.feature_norm), norm(emb, h.embed_norm)], dim=-1), b)
        if self._fused is not None and n <= LayerKernel.MAX_ROWS and x.dtype == torch.float32:
            x = x.contiguous()
            self._fused.run(x, start, self.k_cache, self.v_cache, self._capacity, self._cos, self._sin)
            return norm(x, h.out_norm)
        qkv = self._qkv(norm(x, h.attn_norm), b).view(n, c.num_heads + 2 * c.num_kv_heads, c.head_dim)
        nq, nkv = c.num_heads, c.num_kv_heads
        qk = apply_rotary(qkv[:, : nq + nkv], self._cos[start : start + n], self._sin[start : start + n])
        end = start + n
        self.k_cache[:, start:end] = qk[:, nq:].transpose(0, 1)
        self.v_cache[:, start:end] = qkv[:, nq + nkv :].transpose(0, 1)
        mask = None
        if n > 1:
            rows = torch.arange(start, end, device=self.device)[:, None]
            mask = torch.arange(end, device=self.device)[None, :] <= rows
        attn = F.scaled_dot_product_attention(
            qk[:, :nq].transpose(0, 1)[None],
            self.k_cache[None, :, :end],
            self.v_cache[None, :, :end],
            attn_mask=mask,
            enable_gqa=nq != nkv,
        )[0]  # [heads, n, hd]
        x = x + self._o(attn.transpose(0, 1).reshape(n, nq * c.head_dim), b)
        gate, up = self._gate_up(norm(x, h.mlp_norm), b).chunk(2, dim=-1)
        x = x + self._down(F.silu(gate) * up, b)
        return norm(x, h.out_norm)

    def _choose(
        self, feature: torch.Tensor, params: SamplingParams, generator, extra: int = 0
    ) -> tuple[int, torch.Tensor | None, float, list[int]]:
        """Draft token from a predicted feature [d]: argmax, or a sample from q over the full vocabulary.

        Also returns the head's confidence: greedy, its largest probability at temperature 1, an estimate of the
        chance that the target's greedy choice is this token (calibrated: `benchmarks/head_calibration.py`);
        sampling, 1; and (greedy, ``extra`` > 0) the next ``extra`` best tokens.
        """
        logits = self._lm(feature[None], self._backend)[0]  # [draft_vocab]
        if params.greedy:
            if extra > 0:
                top = torch.topk(logits, extra + 1).indices
                best, others = int(top[0]), self._vocab_ids[top[1:]].tolist()
            else:
                best, others = int(logits.argmax()), []
            confidence = 1.0 if self.min_confidence <= 0 else float(torch.softmax(logits, -1)[best])
            return int(self._vocab_ids[best]), None, confidence, others
        # q over the draft vocabulary, then placed in the full vocabulary (zero elsewhere): top-k, top-p and
        # min-p give the same result on the draft vocabulary as on the full one with -inf outside it
        q_draft = probs_from_logits(logits, params)  # [draft_vocab]
        q = torch.zeros(self.target.vocab_size, device=self.device)
        q[self._vocab_ids] = q_draft
        # confidence 1: a sampled token is accepted with probability min(1, p/q), alpha = sum min(p, q) on
        # average, which q's largest probability does not estimate (a flat q at temperature 1 can match a flat p
        # well); the schedule's measured acceptance per position decides the length instead
        return int(self._vocab_ids[int(sample(q_draft, generator))]), q, 1.0, []

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None) -> Draft:
        known = min(self.target.length, len(context) - 1)  # positions with target features
        self.declined = False
        if k <= 0 or known <= 0:
            return Draft.empty(self.device)
        # cache position i holds (feature of context[: i + 1], context[i + 1]): keep those still matching, and
        # feed at least the last position, to predict from it
        fed = context[: known + 1]
        common = min(max(common_prefix(self._fed, fed) - 1, 0), known - 1)
        if self._fed and common >= self._offset:
            pieces = [(common, known)]  # continue the cache
        else:  # a new context: catch up on all of it, or on its sinks and its last window positions
            self._offset = self._shift = 0
            pieces = [(0, known)]
            if self.window is not None and known > self.sinks + self.window:
                self._offset = known - self.window
                self._shift = self._offset - self.sinks
                pieces = [(0, self.sinks), (self._offset, known)] if self.sinks else [(self._offset, known)]
        features = torch.cat([self.target.features(a, b) for a, b in pieces])  # [fed positions, d]
        next_tokens = torch.tensor([t for a, b in pieces for t in fed[a + 1 : b + 1]], device=self.device)
        first = pieces[0][0]
        pred = self._step(features, next_tokens, first - (self._shift if first >= self._offset else 0))[-1]
        self._fed = fed
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        alternatives: list[tuple[int, int]] = []
        reach = 1.0  # estimated probability that the whole draft so far is accepted
        for i in range(k):
            extra = self.alternatives[i] if i < len(self.alternatives) else 0
            token, q, confidence, others = self._choose(pred, params, generator, extra)
            reach *= confidence
            if reach < self.min_confidence:
                self.declined = not tokens
                break  # not worth verifying: below the schedule's break-even
            tokens.append(token)
            alternatives.extend((i, t) for t in others)
            if q is not None:
                probs.append(q)
            if i + 1 < k:
                pred = self._step(pred[None], torch.tensor([token], device=self.device), known + i - self._shift)[-1]
        draft = torch.tensor(tokens, dtype=torch.int64, device=self.device)
        return Draft(draft, torch.stack(probs) if probs else None, alternatives)


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
