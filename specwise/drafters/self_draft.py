"""The `self` drafter: the target drafts for itself, with all its layers and a small part of its output layer.

A pass of a model reads its decoder layers and its output layer; on models with a large vocabulary the output
layer is much of the pass (Gemma-3-270M: 262,144 rows of 640, 72% of the bytes of its weights; the default model
31%, Qwen2.5-Coder-1.5B 17%). The `self` drafter runs the target's own layers on each drafted token, in the
target's own cache, and turns the last hidden state into q with the output layer's rows for the N tokens the
target writes most (a draft vocabulary, :mod:`specwise.drafters.vocab`). Then it rolls the target's cache back.

The verification pass that follows feeds the same tokens at the same positions: the target finds their keys,
values and last hidden states already in its cache (``QuantizedModel.reusable``) and runs its layers only on the
last drafted token; what it adds is the full output layer over the drafted rows, read once for all of them. A
drafted token's layers therefore run once whether it is accepted or not: drafting costs what the rejected tokens'
layers cost, and each accepted token saves the full output layer it would have read alone.

The drafted columns are the N tokens and the request's own tokens outside them (its prompt and its answer so far,
``MAX_SEEN``). Greedy, the drafted token is the target's own choice whenever that choice is among them (the
features are the target's: only the output is trimmed); sampled, q is about the target's p restricted to them and
renormalized, so the acceptance is about p's mass over them. The output stays exact either way: the target
verifies every drafted token with its full p.
"""

from __future__ import annotations

import numpy as np

from specwise.drafters.base import Draft, Drafter
from specwise.models.base import Model, OutputRows, ReusableRows
from specwise.sampling import SamplingParams, probs_from_logits, sample

__all__ = ["SelfDrafter", "check_self_target", "DEFAULT_VOCAB", "MAX_SEEN"]

# Tokens of the request's own text (prompt and answer so far) outside the draft vocabulary are drafted too, up to this
# many: what a text has written it tends to write again (a name, a tag, a rare word), and a frequency ranking built
# from other texts lacks it. Their logits come from the output layer's rows, dequantized (numbers a little off the
# quantized product's, which only q sees).
MAX_SEEN = 1024

# The draft vocabulary's default size. On Gemma-3-270M (Spec-Bench questions, greedy, gamma auto, paired against
# plain) 4,096 / 8,192 / 16,384 / 32,768 rows gave 1.51 / 1.50 / 1.56 / 1.61x, 65,536 1.44x against 32,768's 1.62x in
# another run (its rows cost as much as they gain); 16,384 of Gemma's Q8_0 rows hold 11.2 MB, under 5% of its file,
# 32,768 would hold 8.8% (docs/FIGURES.md#self-speculation)
DEFAULT_VOCAB = 16384


def check_self_target(target: Model) -> None:
    """Refuse a target whose cache cannot keep the drafted tokens for the verification pass, or whose output layer's
    rows cannot be read apart (one line)."""
    if not isinstance(target, ReusableRows) or not isinstance(target, OutputRows):
        raise ValueError(
            "the self drafter needs a GGUF target on the CPU (the quantized native model), whose cache keeps "
            "the drafted tokens for the verification pass: use a .gguf target, or another drafter"
        )


class SelfDrafter(Drafter):
    """Drafts with the target's own layers and its output layer's rows for ``vocab_ids`` (see the module).

    target: the target's sequence (a ``QuantizedModel``: its cache takes the drafted tokens and keeps them for the
        verification pass, ``reusable``; :func:`check_self_target`). head: the output rows, shared by forks
        (:meth:`for_target` reads them).
    """

    name = "self"
    needs_features = True  # the drafted tokens' last hidden states are what the trimmed output layer reads

    def __init__(self, target: Model, head, vocab_ids: np.ndarray, vocab_size: int) -> None:
        self.target = target
        self.head = head
        self.vocab_ids = np.ascontiguousarray(vocab_ids, dtype=np.int64)
        self._vocab_list = self.vocab_ids.tolist()
        self.vocab_size = int(vocab_size)
        self.device = "cpu"
        self._in_vocab = np.zeros(self.vocab_size, dtype=bool)  # shared by forks
        self._in_vocab[self.vocab_ids] = True
        self._forget_text()

    @classmethod
    def for_target(cls, target: Model, vocab_ids: np.ndarray) -> SelfDrafter:
        """The drafter over ``vocab_ids`` of ``target``'s vocabulary, its rows read from the file in the file's own
        block format (``QuantizedModel.read_output_rows``): the draft's logits are the target's own. Not re-quantized
        to Q4_0 as a draft model's layers are: on Gemma-3-270M (Q8_0 rows) Q4_0 rows halved the memory but lost 5
        points of greedy acceptance (0.85 -> 0.79 over 16,384 tokens on Spec-Bench questions) and 1.67x -> 1.46x of
        plain decoding's speed."""
        check_self_target(target)
        return cls(target, target.read_output_rows(vocab_ids), vocab_ids, int(target.vocab_size))

    def _forget_text(self) -> None:
        """Per sequence: the request's own tokens outside the draft vocabulary (``MAX_SEEN``), their output rows
        ``[m, hidden]``, every drafted column's token id, and how much of the context was looked at."""
        self._seen: list[int] = []
        self._seen_rows = np.empty((0, int(self.head.shape[1])), dtype=np.float32)
        self._columns, self._column_ids = self._vocab_list, self.vocab_ids
        self._scanned = 0
        self._output = None  # (the target sequence, its pass's model struct over the head's rows)

    def _forked(self, target: Model) -> None:
        self.target = target  # the head and the draft vocabulary are shared
        self._forget_text()

    def begin(self, prompt: list[int]) -> None:
        self._forget_text()

    def pending(self, context: list[int]) -> int:
        return max(len(context) - self.target.length, 0)

    def _take_in(self, context: list[int]) -> None:
        """Add the context's new tokens that lie outside the draft vocabulary to the drafted columns."""
        if self._scanned > len(context):  # another text than the one begun
            self._forget_text()
        new = np.asarray(context[self._scanned :], dtype=np.int64)
        self._scanned = len(context)
        room = MAX_SEEN - len(self._seen)
        if not new.size or room <= 0:
            return
        new = np.unique(new[(new >= 0) & (new < self.vocab_size)])
        fresh = new[~self._in_vocab[new]]
        if self._seen:
            fresh = fresh[~np.isin(fresh, self._seen)]
        if fresh.size:
            add = fresh[:room]
            rows = self.target.lm_head.rows(add)  # [m, hidden] float32
            self._seen += add.tolist()
            self._seen_rows = np.concatenate([self._seen_rows, rows])
            self._columns = self._vocab_list + self._seen
            self._column_ids = np.concatenate([self.vocab_ids, np.asarray(self._seen, dtype=np.int64)])

    def _feed(self, tokens: list[int]) -> np.ndarray:
        """Feed ``tokens`` to the target (their layers, in its cache) and return the drafted columns' logits
        ``[N + m]`` after the last: the draft vocabulary's (the target's pass ends in its rows: one native call), then
        the request's own tokens'."""
        target = self.target
        if self._output is None or self._output[0] is not target:
            self._output = (target, target.output_rows(self.head))
        logits = target.forward_last(np.asarray(tokens, dtype=np.int64), self._output[1])[0]
        if not self._seen:
            return logits
        at = target.length
        h = target.features(at - 1, at)[0]  # [hidden]
        return np.concatenate([logits, self._seen_rows @ h])

    def propose(
        self,
        context: list[int],
        k: int,
        params: SamplingParams,
        generator: np.random.Generator | None,
        stop: float = 0.0,
    ) -> Draft:
        target = self.target
        start = target.length
        pending = context[start:]
        if k <= 0 or not pending or start > len(context):
            return Draft.empty()
        self._take_in(context)
        columns, column_ids = self._columns, self._column_ids
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        try:
            logits = self._feed(pending)  # [N + m]
            for i in range(k):
                if params.greedy:
                    token = columns[int(np.argmax(logits))]
                else:
                    # top-k, top-p and min-p over the drafted columns equal those over the full vocabulary with
                    # -inf outside them; q is then placed in the full vocabulary (zero elsewhere)
                    q_draft = probs_from_logits(logits, params)  # [N + m]
                    token = columns[int(np.asarray(sample(q_draft, generator)).reshape(-1)[0])]
                    q = np.zeros(self.vocab_size, dtype=q_draft.dtype)
                    q[column_ids] = q_draft
                    probs.append(q)  # [vocab]
                tokens.append(token)
                if i + 1 < k:
                    logits = self._feed([token])
        finally:
            target.rollback(start)  # the drafted positions stay in the cache for the verification pass
        return Draft(tokens, np.stack(probs) if probs else None, intake=len(pending))
