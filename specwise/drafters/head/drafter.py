"""The `head` drafter: a small trained decoder layer on the target's own features (in the spirit of EAGLE).

At each position the head reads the target's last hidden state (after the final norm, the input of the output
layer) and the embedding of the next token, and predicts the next position's hidden state; the target's own
output layer, restricted to a draft vocabulary of the most frequent tokens, turns that into q. Drafting more
than one token feeds the head its own predicted state. The target's embedding and output layer are reused
frozen, so a head file holds only the small layer (a few MB).

q is zero outside the draft vocabulary; the rejection rule handles that exactly (such tokens are never
drafted, and the residual distribution can still produce them).

The head runs on the host in numpy and the native kernels, whatever the target's device (its features come as
numpy arrays): on the quantized kernels (:mod:`specwise.drafters.head.quantized`, where the target is a GGUF file
on the CPU), else on the float kernels (float16 or float32 weights), else in numpy alone.

Training is in :mod:`specwise.lab.distill`; ``specwise distill`` writes a directory with ``config.json`` and
``model.safetensors`` that ``--drafter head:DIR`` loads (:func:`~specwise.drafters.head.format.read_head`).
"""

from __future__ import annotations

import numpy as np

from specwise.drafters.base import Draft, Drafter, common_prefix
from specwise.drafters.head.format import HeadWeights
from specwise.drafters.head.quantized import QuantizedHeadLayer, head_quantization_available, quantize_rows
from specwise.models.kernels import LayerKernel, layer_kernel, small_gemm, small_gemm_available
from specwise.models.kernels.layers import rotary_tables
from specwise.models.kernels.quant import QMat, q_gemm
from specwise.sampling import SamplingParams, probs_from_logits, sample

__all__ = ["HeadDrafter"]


def _vector(value) -> np.ndarray:
    return np.ascontiguousarray(value, dtype=np.float32)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMS norm of x ``[n, d]`` over its last dimension, scaled by ``weight`` ``[d]`` (float32)."""
    scale = 1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + np.float32(eps))
    return (x * scale.astype(np.float32)) * weight


def softmax_top(logits: np.ndarray) -> float:
    """The softmax's largest probability of a row of logits: 1 / sum(exp(l - max))."""
    shifted = logits.astype(np.float64) - float(logits.max())
    return float(1.0 / np.exp(shifted).sum())


class _Product:
    """``x @ W.T`` off the quantized kernels: specwise's float kernel reading W (float16 or float32) where it
    runs, else numpy in float32."""

    def __init__(self, weight: np.ndarray, kernel: bool) -> None:
        self.kernel = kernel
        self.weight = np.ascontiguousarray(weight if kernel else weight.astype(np.float32, copy=False))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.kernel:
            return small_gemm(x, self.weight)
        return x @ self.weight.T


def _quantized_weights(head: HeadWeights) -> tuple:
    """(fc, layer, output rows) of ``head`` on the quantized kernels, in Q8_0."""
    c, t = head.config, head.tensors
    fc = quantize_rows(t["fc.weight"], "head.fc")
    layer = QuantizedHeadLayer(
        c.hidden_size,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.intermediate_size,
        c.rms_eps,
        t["attn_norm"],
        t["qkv.weight"],
        t["o.weight"],
        t["mlp_norm"],
        t["gate_up.weight"],
        t["down.weight"],
    )
    output = quantize_rows(head.output_row_block, "head.output", (head.vocab_ids.size, c.hidden_size))
    return fc, layer, output


class HeadDrafter(Drafter):
    """Drafts with a trained head (:class:`~specwise.drafters.head.format.HeadWeights` from ``read_head``, with
    its target attached; an :class:`~specwise.drafters.head.module.EagleHead` is taken too) from the target's
    features.

    The target must keep its features (``needs_features``: the engine asks for them, ``Model.set_keep_features``).
    The head has its own KV cache (one layer) written by position: positions whose features came from the target are
    kept between steps, the speculative ones are overwritten by the next proposal.
    """

    name = "head"
    needs_features = True

    def __init__(
        self,
        head,
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
        # the whole context, 0.386 with 128 positions and 4 sinks, 0.374 with 32 (docs/ENGINE.md).
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be a positive number of positions or None, got {window!r}")
        if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
            raise ValueError(f"sinks must be an integer >= 0, got {sinks!r}")
        if not isinstance(head, HeadWeights):  # a training module (torch): its numpy view
            head = HeadWeights.from_module(head)
        if head.embed is None:
            raise RuntimeError("attach a target to the head first (attach_target)")
        self.window, self.sinks = window, sinks
        self.target = target
        self.device = "cpu"  # the head computes on the host (the target's features come as numpy arrays)
        self._c = head.config
        t = head.tensors
        # The drafter keeps what it computes with, not the head: the products' weights (Q8_0 on the quantized
        # kernels; float16 copies on the float kernels, see below; else float32), the norms, and the output layer's
        # draft-vocabulary rows (read on demand from a quantized target). The embedding is the target's.
        self._feature_norm, self._embed_norm = _vector(t["feature_norm"]), _vector(t["embed_norm"])
        self._out_norm = _vector(t["out_norm"])
        self._q = None
        self._fused = None
        if quantized and head_quantization_available():
            # the products on the quantized kernels, weights in Q8_0 and activations in 8 bits (half the bytes of
            # float16 per drafted token; see specwise.drafters.head.quantized); each step in native calls
            self._q = _quantized_weights(head)
            self._backend = "quantized"
            self._out_struct = (QMat * 1)(self._q[2].struct)  # the output layer, as the native step takes it
            norms = (self._feature_norm, self._embed_norm, self._out_norm)
            self._ends = self._q[1].ends(norms, self._q[0])  # the norms and fc around the layer, filled once
        else:
            # On a CPU with specwise's float kernels the products read float16 copies of the weights (computed in
            # float32): half the memory traffic per drafted token. A shipped head is stored in float16, so its own
            # weights are the same values; the output layer (rows of the target's) is rounded. That changes q
            # slightly, never the output: verification uses the q the draft was drawn from.
            kernel = small_gemm_available()
            self._backend = "kernel" if kernel else "numpy"
            self._keep_weights(head, half_weights and kernel, kernel)
            self._fused = self._fused_setup() if kernel else None
        self._embed = head.embed  # [vocab, d], the target's (WeightRows: rows read on demand)
        self._inv_freq = head.inv_freq
        self._vocab_ids = head.vocab_ids
        self._vocab_list = self._vocab_ids.tolist()
        self._memo = None  # (address of the last predicted feature, argmax, its probability, logits) of that step
        self._embedded = None  # one token's embedding row, read for the step that consumes it
        self._capacity = 0
        self._grow(capacity)
        self._fed: list[int] = []  # context tokens whose (feature, next token) pairs are in the head's cache
        # positions >= self._offset are at cache index position - self._shift (both 0 without a window)
        self._offset = self._shift = 0

    @property
    def quantized(self) -> bool:
        """Whether the products run on the quantized kernels."""
        return self._q is not None

    def _keep_weights(self, head: HeadWeights, half: bool, kernel: bool) -> None:
        """The weights of the products off the quantized kernels: float16 copies (``half``) or float32 ones."""
        t = head.tensors
        dtype = np.float16 if half else np.float32

        def product(name: str) -> _Product:
            return _Product(t[name].astype(dtype, copy=True), kernel)

        self._fc, self._qkv, self._o = product("fc.weight"), product("qkv.weight"), product("o.weight")
        self._gate_up, self._down = product("gate_up.weight"), product("down.weight")
        self._attn_norm, self._mlp_norm = _vector(t["attn_norm"]), _vector(t["mlp_norm"])
        self._lm = _Product(head.output_rows(dtype), kernel)

    def _fused_setup(self) -> LayerKernel | None:
        """The native layer kernel over the head's decoder layer (None where unavailable)."""
        c = self._c
        return layer_kernel(
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.intermediate_size,
            c.rms_eps,
            attn_norm=[self._attn_norm],
            qkv=[self._qkv.weight],
            qkv_bias=[None],
            o=[self._o.weight],
            o_bias=[None],
            mlp_norm=[self._mlp_norm],
            gate_up=[self._gate_up.weight],
            down=[self._down.weight],
        )

    def _grow(self, capacity: int) -> None:
        c = self._c
        shape = (c.num_kv_heads, capacity, c.head_dim)
        k_cache = np.zeros(shape, dtype=np.float32)
        v_cache = np.zeros(shape, dtype=np.float32)
        if self._capacity:
            k_cache[:, : self._capacity] = self.k_cache
            v_cache[:, : self._capacity] = self.v_cache
        self.k_cache, self.v_cache = k_cache, v_cache
        self._cos, self._sin = rotary_tables(self._inv_freq, capacity)  # [capacity, head_dim]
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
        self._memo = None
        capacity, self._capacity = self._capacity, 0
        self._grow(capacity)
        self.begin([])

    def begin(self, prompt: list[int]) -> None:
        self._fed = []
        self._offset = self._shift = 0

    def _step(self, features: np.ndarray, next_tokens, start: int, confidence: bool = False) -> np.ndarray:
        """Feed n positions at ``start`` (features ``[n, d]``, the next tokens a list or an int array of n);
        return predicted features ``[n, d]`` (float32). On the quantized step the output layer over the last one is
        computed too, for the :meth:`_choose` that follows (``confidence``: with the softmax's largest
        probability)."""
        c = self._c
        features = np.asarray(features)
        if features.ndim != 2 or features.shape[1] != c.hidden_size:
            raise ValueError(
                f"the head reads features [n, {c.hidden_size}], got {list(features.shape)}: use a head trained for "
                "this target (`specwise distill`)"
            )
        n = features.shape[0]
        if len(next_tokens) != n:
            raise ValueError(f"the head takes one next token per feature: {n} features, {len(next_tokens)} tokens")
        if start + n > self._capacity:
            self._grow(max(2 * self._capacity, start + n))
        emb = self._embedding(next_tokens)
        if self._q is not None:
            pred, best, top, logits = self._q[1].step(
                features, emb, start, self.k_cache, self.v_cache, self._cos, self._sin, self._ends, self._out_struct,
                confidence,
            )  # fmt: skip
            self._memo = (pred.ctypes.data + 4 * (n - 1) * c.hidden_size, best, top, logits)
            return pred
        eps = c.rms_eps
        features = features.astype(np.float32, copy=False)
        fused = np.concatenate([rms_norm(features, self._feature_norm, eps), rms_norm(emb, self._embed_norm, eps)], 1)
        x = self._fc(fused)  # [n, d], a new C-contiguous array
        if self._fused is not None:
            for lo in range(0, n, LayerKernel.MAX_ROWS):  # a row's result does not depend on the rows beside it
                rows = x[lo : lo + LayerKernel.MAX_ROWS]
                self._fused.run(rows, start + lo, self.k_cache, self.v_cache, self._capacity, self._cos, self._sin)
        else:
            x = self._layer(x, start)
        return rms_norm(x, self._out_norm, eps)

    def _layer(self, x: np.ndarray, start: int) -> np.ndarray:
        """The head's decoder layer in numpy on x ``[n, d]`` at positions ``start ..`` (writes the KV cache):
        ``x + o(attention(qkv(norm(x))))``, then ``down(silu(gate) * up)`` of its norm added to that."""
        c = self._c
        n, heads, kv, hd = x.shape[0], c.num_heads, c.num_kv_heads, c.head_dim
        end = start + n
        qkv = self._qkv(rms_norm(x, self._attn_norm, c.rms_eps))
        q = qkv[:, : heads * hd].reshape(n, heads, hd)
        k = qkv[:, heads * hd : (heads + kv) * hd].reshape(n, kv, hd)
        v = qkv[:, (heads + kv) * hd :].reshape(n, kv, hd)
        cos, sin = self._cos[start:end, None, :], self._sin[start:end, None, :]
        q = q * cos + np.roll(q, hd // 2, axis=-1) * sin  # rotate-half, its sign folded into the sine table
        k = k * cos + np.roll(k, hd // 2, axis=-1) * sin
        self.k_cache[:, start:end] = k.transpose(1, 0, 2)
        self.v_cache[:, start:end] = v.transpose(1, 0, 2)
        group = heads // kv
        keys = np.repeat(self.k_cache[:, :end], group, axis=0)  # [heads, end, hd]
        values = np.repeat(self.v_cache[:, :end], group, axis=0)
        scores = (q.transpose(1, 0, 2) @ keys.transpose(0, 2, 1)) * np.float32(1.0 / np.sqrt(hd))  # [heads, n, end]
        scores[:, np.arange(end)[None, :] > np.arange(start, end)[:, None]] = -np.inf  # causal
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        attn = (scores @ values).transpose(1, 0, 2).reshape(n, heads * hd)
        h = x + self._o(attn)
        gate, up = np.split(self._gate_up(rms_norm(h, self._mlp_norm, c.rms_eps)), 2, axis=-1)
        with np.errstate(over="ignore"):  # exp(-gate) overflows to inf for a very negative gate: silu 0
            act = gate / (np.float32(1.0) + np.exp(-gate)) * up
        return h + self._down(act)

    def _embedding(self, tokens) -> np.ndarray:
        """The target's embedding rows of ``tokens`` (a list or an int array) as float32 ``[n, d]``: one token read
        straight into a buffer the step consumes at once."""
        if len(tokens) == 1:
            if self._embedded is None:
                self._embedded = np.empty((1, self._c.hidden_size), dtype=np.float32)
            self._embed.row(int(tokens[0]), self._embedded[0])
            return self._embedded
        return self._embed.rows(np.asarray(tokens, dtype=np.int64))

    def _logits(self, feature: np.ndarray) -> np.ndarray:
        """The output layer over the draft vocabulary of one predicted feature ``[d]``: float32 ``[draft_vocab]``."""
        row = np.ascontiguousarray(feature[None], dtype=np.float32)
        if self._q is not None:
            return q_gemm(self._q[2], row, mode="q8")[0]
        return self._lm(row)[0]

    def _choose(
        self, feature: np.ndarray, params: SamplingParams, generator, stop: float
    ) -> tuple[int, np.ndarray | None, float]:
        """Draft token from a predicted feature [d]: argmax, or a sample from q over the full vocabulary.

        Also returns the head's confidence: greedy, its largest probability at temperature 1, an estimate of the
        chance that the target's greedy choice is this token (1 without a ``stop`` level, which is all it is used
        for); sampling, 1.
        """
        memo, self._memo = self._memo, None
        if memo is not None and memo[0] == feature.ctypes.data:  # computed by the native step that made feature
            _, best, top, logits = memo
            if params.greedy:
                return self._vocab_list[best], None, 1.0 if stop <= 0 or top is None else top
        else:
            logits = self._logits(feature)  # [draft_vocab]
        if params.greedy:
            best = int(np.argmax(logits))
            confidence = 1.0 if stop <= 0 else softmax_top(logits)
            return self._vocab_list[best], None, confidence
        # q over the draft vocabulary, then placed in the full vocabulary (zero elsewhere): top-k, top-p and
        # min-p give the same result on the draft vocabulary as on the full one with -inf outside it
        q_draft = probs_from_logits(logits, params)  # [draft_vocab]
        q = np.zeros(self.target.vocab_size, dtype=np.float32)
        q[self._vocab_ids] = q_draft
        # confidence 1: a sampled token is accepted with probability min(1, p/q), alpha = sum min(p, q) on
        # average, which q's largest probability does not estimate (a flat q at temperature 1 can match a flat p
        # well); the planner's measured acceptance per position decides the length instead
        return self._vocab_list[int(sample(q_draft, generator))], q, 1.0

    def propose(
        self,
        context: list[int],
        k: int,
        params: SamplingParams,
        generator: np.random.Generator | None,
        stop: float = 0.0,
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
        parts = [self.target.features(a, b) for a, b in pieces]
        features = parts[0] if len(parts) == 1 else np.concatenate(parts)  # [fed positions, d]
        next_tokens = [t for a, b in pieces for t in fed[a + 1 : b + 1]]
        first = pieces[0][0]
        want = params.greedy and stop > 0  # the quantized step computes the softmax's top probability too
        pred = self._step(features, next_tokens, first - (self._shift if first >= self._offset else 0), want)[-1]
        self._fed = fed
        tokens: list[int] = []
        probs: list[np.ndarray] = []
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
                pred = self._step(pred[None], [token], known + i - self._shift, want)[-1]
        return Draft(tokens, np.stack(probs) if probs else None, confidences, device=self.device)
