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

import torch

from specwise.drafters.base import Draft, Drafter, common_prefix
from specwise.drafters.head.module import EagleHead
from specwise.drafters.head.quantized import QuantizedHeadLayer, head_quantization_available, quantize_rows
from specwise.models.kernels import LayerKernel, layer_kernel, small_gemm_available
from specwise.models.kernels.quant import QMat, q_gemm
from specwise.models.layer import (
    LayerWeights,
    cached_attention,
    causal_mask,
    decoder_layer,
    qkv_heads,
    rms_norm,
    rotary_tables,
)
from specwise.models.native import Linear
from specwise.sampling import SamplingParams, probs_from_logits, sample

__all__ = ["HeadDrafter"]


def _linear(weight: torch.Tensor, half: bool) -> Linear:
    weight = weight.detach()
    return Linear(weight.half().contiguous() if half else weight.float())


def _vector(weight: torch.Tensor) -> torch.Tensor:
    return weight.detach().float().contiguous()


def _quantized_weights(head: EagleHead) -> tuple:
    """(fc, layer, output rows) of ``head`` on the quantized kernels, in Q8_0."""
    c = head.config
    fc = quantize_rows(head.fc.weight, "head.fc")
    layer = QuantizedHeadLayer(
        c.hidden_size,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.intermediate_size,
        c.rms_eps,
        head.attn_norm,
        head.qkv.weight,
        head.o.weight,
        head.mlp_norm,
        head.gate_up.weight,
        head.down.weight,
    )
    output = quantize_rows(head.output_row_block, "head.output", (head.vocab_ids.numel(), c.hidden_size))
    return fc, layer, output


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
        window: int | None = 128,
        sinks: int = 4,
        quantized: bool = False,
    ) -> None:
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
        self.target = target
        self.device = target.device
        self._c = head.config
        # On a CPU with specwise's kernels the products read float16 copies of the weights (computed in float32):
        # half the memory traffic per drafted token. A shipped head is stored in float16, so its own weights are
        # the same values; the output layer (rows of the target's) is rounded. That changes q slightly, never the
        # output: verification uses the q the draft was drawn from.
        half = half_weights and small_gemm_available() and torch.device(self.device).type == "cpu"
        # quantized: the products on the quantized kernels, weights in Q8_0 and activations in 8 bits (half the
        # bytes of float16 per drafted token; see specwise.drafters.head.quantized)
        self._q = None
        # The drafter keeps what it computes with, not the head: float16 weights, or float32 ones (the head's own
        # where they are float32), the norms, and the output layer's draft-vocabulary rows (gathered in the
        # products' dtype, read on demand from a quantized target). The embedding is the target's.
        with torch.no_grad():
            if quantized and torch.device(self.device).type == "cpu" and head_quantization_available():
                self._q = _quantized_weights(head)
            else:
                self._keep_weights(head, half)
            self._feature_norm, self._embed_norm = _vector(head.feature_norm), _vector(head.embed_norm)
            self._out_norm = _vector(head.out_norm)
        self._embed = head.embed  # [vocab, d], the target's
        self._inv_freq = head.inv_freq.detach().float()
        self._memo = None  # (address of the last predicted feature, argmax, its probability, logits) of that step
        self._embedded = None  # one token's embedding row, read for the quantized step
        if self._q is not None:  # each step in native calls (QuantizedHeadLayer.step)
            self._backend, self._fused = "quantized", None
            self._out_struct = (QMat * 1)(self._q[2].struct)  # the output layer, as the native step takes it
            norms = (self._feature_norm, self._embed_norm, self._out_norm)
            self._ends = self._q[1].ends(norms, self._q[0])  # the norms and fc around the layer, filled once
        else:
            self._backend = "kernel" if self._lm.kernel_ok else "torch"
            self._fused = self._fused_setup()
        self._vocab_ids = head.vocab_ids.to(self.device)
        self._vocab_list = self._vocab_ids.tolist()
        self._capacity = 0
        self._grow(capacity)
        self._fed: list[int] = []  # context tokens whose (feature, next token) pairs are in the head's cache
        # positions >= self._offset are at cache index position - self._shift (both 0 without a window)
        self._offset = self._shift = 0

    @property
    def quantized(self) -> bool:
        """Whether the products run on the quantized kernels."""
        return self._q is not None

    def _keep_weights(self, head: EagleHead, half: bool) -> None:
        """The weights of the products off the quantized kernels: float16 copies (``half``) or float32 ones."""
        self._fc = _linear(head.fc.weight, half)
        self._qkv = _linear(head.qkv.weight, half)
        self._o = _linear(head.o.weight, half)
        self._gate_up = _linear(head.gate_up.weight, half)
        self._down = _linear(head.down.weight, half)
        self._layer = LayerWeights(
            _vector(head.attn_norm), self._qkv, self._o, _vector(head.mlp_norm), self._gate_up, self._down
        )
        self._lm = Linear(head.output_rows(torch.float16 if half else None))

    def _fused_setup(self) -> LayerKernel | None:
        """The native layer kernel over the head's decoder layer (None where unavailable)."""
        if self._backend != "kernel":
            return None
        c, layer = self._c, self._layer
        return layer_kernel(
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.intermediate_size,
            c.rms_eps,
            attn_norm=[layer.attn_norm],
            qkv=[self._qkv.weight],
            qkv_bias=[None],
            o=[self._o.weight],
            o_bias=[None],
            mlp_norm=[layer.mlp_norm],
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
        cos, sin = rotary_tables(self._inv_freq, torch.arange(capacity, device=self.device))
        self._cos, self._sin = cos[:, None, :], sin[:, None, :]
        self._capacity = capacity

    def _forked(self, target) -> None:
        """Shares the head's weights (float16, float32 or quantized copies), its layer kernel (and that kernel's
        scratch space: the sequences draft one after another), the norms and the output rows; its own KV cache,
        reading features from ``target``."""
        if target.vocab_size != self.target.vocab_size:
            raise ValueError(
                f"the fork's target has a vocabulary of {target.vocab_size}, the head's target {self.target.vocab_size}"
                ": fork for a sequence of the same target (its sequence())"
            )
        self.target = target
        capacity, self._capacity = self._capacity, 0
        self._grow(capacity)
        self.begin([])

    def begin(self, prompt: list[int]) -> None:
        self._fed = []
        self._offset = self._shift = 0

    def _step(
        self, features: torch.Tensor, next_tokens: torch.Tensor, start: int, confidence: bool = False
    ) -> torch.Tensor:
        """Feed n positions at ``start``; return predicted features [n, d]. On the native step the output layer
        over the last one is computed too, for the :meth:`_choose` that follows (``confidence``: with the
        softmax's largest probability)."""
        c, b = self._c, self._backend
        n = features.shape[0]
        if features.dim() != 2 or features.shape[1] != c.hidden_size:
            raise ValueError(
                f"the head reads features [n, {c.hidden_size}], got {list(features.shape)}: use a head trained for "
                "this target (`specwise distill`)"
            )
        if start + n > self._capacity:
            self._grow(max(2 * self._capacity, start + n))
        if self._q is not None:
            emb = self._embedding(next_tokens)
            pred, best, top, logits = self._q[1].step(
                features, emb, start, self.k_cache, self.v_cache, self._cos, self._sin, self._ends, self._out_struct,
                confidence,
            )  # fmt: skip
            self._memo = (pred.data_ptr() + 4 * (n - 1) * c.hidden_size, best, top, logits)
            return pred
        emb = self._embed[next_tokens]
        fused = torch.cat([self._norm(features, self._feature_norm), self._norm(emb, self._embed_norm)], dim=-1)
        x = self._fc(fused, b)
        if self._fused is not None and n <= LayerKernel.MAX_ROWS and x.dtype == torch.float32:
            x = x.contiguous()
            self._fused.run(x, start, self.k_cache, self.v_cache, self._capacity, self._cos, self._sin)
            return self._norm(x, self._out_norm)

        def attend(qkv: torch.Tensor) -> torch.Tensor:
            cos, sin = self._cos[start : start + n], self._sin[start : start + n]
            q, k, v = qkv_heads(qkv, c.num_heads, c.num_kv_heads, c.head_dim, cos, sin)
            mask = causal_mask(start, n, self.device) if n > 1 else None
            return cached_attention(q, k, v, self.k_cache, self.v_cache, start, mask)

        def project(linear: Linear, rows: torch.Tensor) -> torch.Tensor:
            return linear(rows, b)

        return self._norm(decoder_layer(x, self._layer, c.rms_eps, attend, project), self._out_norm)

    def _embedding(self, tokens) -> torch.Tensor:
        """The target's embedding rows of ``tokens`` (a tensor, or a list): one token of a quantized target read
        straight into a buffer the native step consumes at once."""
        rows = getattr(self._embed, "tensor", None)
        if isinstance(tokens, list) and len(tokens) == 1 and hasattr(rows, "row"):
            if self._embedded is None:
                self._embedded = torch.empty((1, self._c.hidden_size), dtype=torch.float32)
            rows.row(tokens[0], self._embedded[0])
            return self._embedded
        return self._embed[tokens if torch.is_tensor(tokens) else torch.tensor(tokens, device=self.device)]

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self._c.rms_eps)

    def _choose(
        self, feature: torch.Tensor, params: SamplingParams, generator, stop: float
    ) -> tuple[int, torch.Tensor | None, float]:
        """Draft token from a predicted feature [d]: argmax, or a sample from q over the full vocabulary.

        Also returns the head's confidence: greedy, its largest probability at temperature 1, an estimate of the
        chance that the target's greedy choice is this token (calibrated: `benchmarks/head_calibration.py`;
        1 without a ``stop`` level, which is all it is used for); sampling, 1.
        """
        memo, self._memo = self._memo, None
        if memo is not None and memo[0] == feature.data_ptr():  # computed by the native step that made feature
            _, best, top, logits = memo
            if params.greedy:
                return self._vocab_list[best], None, 1.0 if stop <= 0 or top is None else top
        elif self._q is not None:
            logits = q_gemm(self._q[2], feature[None].float().contiguous(), mode="q8")[0]  # [draft_vocab]
        else:
            logits = self._lm(feature[None], self._backend)[0]  # [draft_vocab]
        if params.greedy:
            best = int(logits.argmax())
            confidence = 1.0 if stop <= 0 else float(torch.softmax(logits, -1)[best])
            return int(self._vocab_ids[best]), None, confidence
        # q over the draft vocabulary, then placed in the full vocabulary (zero elsewhere): top-k, top-p and
        # min-p give the same result on the draft vocabulary as on the full one with -inf outside it
        q_draft = probs_from_logits(logits, params)  # [draft_vocab]
        q = torch.zeros(self.target.vocab_size, device=self.device)
        q[self._vocab_ids] = q_draft
        # confidence 1: a sampled token is accepted with probability min(1, p/q), alpha = sum min(p, q) on
        # average, which q's largest probability does not estimate (a flat q at temperature 1 can match a flat p
        # well); the planner's measured acceptance per position decides the length instead
        return int(self._vocab_ids[int(sample(q_draft, generator))]), q, 1.0

    @torch.inference_mode()
    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None, stop: float = 0.0
    ) -> Draft:
        """Draft up to ``k`` tokens, each with the head's confidence; drafting stops after the first token at which
        the product of the confidences falls below ``stop`` (the planner cuts that token)."""
        known = min(self.target.length, len(context) - 1)  # positions with target features
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
        want = params.greedy and stop > 0  # the native step computes the softmax's top probability too
        pred = self._step(features, next_tokens, first - (self._shift if first >= self._offset else 0), want)[-1]
        self._fed = fed
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        confidences: list[float] = []
        reach = 1.0  # estimated probability that the whole draft so far is accepted
        for i in range(k):
            token, q, confidence = self._choose(pred, params, generator, stop)
            tokens.append(token)
            confidences.append(confidence)
            if q is not None:
                probs.append(q)
            reach *= confidence
            if reach < stop:
                break  # not worth verifying from here: below the planner's break-even
            if i + 1 < k:
                nxt = [token] if self._q is not None else torch.tensor([token], device=self.device)
                pred = self._step(pred[None], nxt, known + i - self._shift, want)[-1]
        draft = torch.tensor(tokens, dtype=torch.int64, device=self.device)
        return Draft(draft, torch.stack(probs) if probs else None, confidences)
