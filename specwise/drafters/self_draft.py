"""The `self` drafter: the target drafts for itself, with all its layers and a small part of its output layer.

A pass of a model reads its decoder layers and its output layer; on models with a large vocabulary the output
layer is much of the pass (Gemma-3-270M: 262,144 rows of 640, 78% of a 1-token pass's time on the CPU; the default
model 29%, Qwen2.5-Coder-1.5B 19%). The `self` drafter runs the target's own layers on each drafted token, in the
target's own cache, and turns the last hidden state into q with the output layer's rows for the N tokens the
target writes most (a draft vocabulary, :mod:`specwise.drafters.vocab`). Then it rolls the target's cache back.

The verification pass that follows feeds the same tokens at the same positions: the target finds their keys,
values and last hidden states already in its cache (``QuantizedModel.reusable``) and runs its layers only on the
last drafted token; what it adds is the full output layer over the drafted rows, read once for all of them. A
drafted token's layers therefore run once whether it is accepted or not: drafting costs what the rejected tokens'
layers cost, and each accepted token saves the full output layer it would have read alone.

Greedy, the drafted token is the target's own choice whenever that choice is among the N tokens (the features are
the target's: only the output is trimmed); sampled, q is the target's p restricted to the N tokens and
renormalized, so the acceptance is p's mass over them. The output stays exact either way: the target verifies
every drafted token with its full p.
"""

from __future__ import annotations

import numpy as np

from specwise.drafters.base import Draft, Drafter
from specwise.models.base import Model
from specwise.sampling import SamplingParams, probs_from_logits, sample

__all__ = ["SelfDrafter", "trimmed_output", "DEFAULT_VOCAB"]

# The draft vocabulary's default size. On Gemma-3-270M (Spec-Bench questions, greedy, gamma auto, paired against
# plain) 4,096 / 8,192 / 16,384 / 32,768 rows gave 1.51 / 1.50 / 1.56 / 1.61x, 65,536 1.44x against 32,768's 1.62x in
# another run (its rows cost as much as they gain); 16,384 of Gemma's Q8_0 rows hold 11.2 MB, under 5% of its file,
# 32,768 would hold 8.8% (docs/FIGURES.md#self-speculation)
DEFAULT_VOCAB = 16384


def trimmed_output(model, ids: np.ndarray):
    """The rows ``ids`` of a GGUF target's output layer (the embedding where the file ties them), in the file's own
    block format: a QTensor ``[len(ids), hidden]`` whose row j gives token ``ids[j]``'s logit, the target's own.

    Kept in the file's format rather than re-quantized to Q4_0 as a draft model's layers are: on Gemma-3-270M (Q8_0
    rows) Q4_0 rows halved the memory but lost 5 points of greedy acceptance (0.85 -> 0.79 over 16,384 tokens on
    Spec-Bench questions) and 1.67x -> 1.46x of plain decoding's speed."""
    from specwise.models.gguf_file import GGUFFile
    from specwise.models.kernels.quant import QTensor, repack_jobs

    meta = GGUFFile(model.path)
    name = "output.weight" if "output.weight" in meta.tensors else "token_embd.weight"
    info = meta.tensors[name]
    head = QTensor(info.type, None, ids.size, info.shape[1], name=f"{name}[{ids.size} rows]")
    repack_jobs([(head, meta.raw(name), ids)], release=True)
    return head


class SelfDrafter(Drafter):
    """Drafts with the target's own layers and its output layer's rows for ``vocab_ids`` (see the module).

    target: the target's sequence (a ``QuantizedModel``: its cache takes the drafted tokens and keeps them for the
        verification pass, ``reusable``). head: the output rows (``trimmed_output``), shared by forks.
    """

    name = "self"
    needs_features = True  # the drafted tokens' last hidden states are what the trimmed output layer reads

    def __init__(self, target: Model, head, vocab_ids: np.ndarray, vocab_size: int) -> None:
        if not hasattr(target, "reusable"):
            raise ValueError(
                "the self drafter needs a GGUF target on the CPU (the quantized native model), whose cache keeps "
                "the drafted tokens for the verification pass: use a .gguf target, or another drafter"
            )
        self.target = target
        self.head = head
        self.vocab_ids = np.ascontiguousarray(vocab_ids, dtype=np.int64)
        self._vocab_list = self.vocab_ids.tolist()
        self.vocab_size = int(vocab_size)
        self.device = "cpu"

    def _forked(self, target: Model) -> None:
        self.target = target  # the head and the draft vocabulary are shared

    def pending(self, context: list[int]) -> int:
        return max(len(context) - self.target.length, 0)

    def _logits(self) -> np.ndarray:
        """The draft vocabulary's logits ``[N]`` at the target's last cached position."""
        from specwise.models.kernels.quant import q_gemm

        at = self.target.length
        h = self.target.features(at - 1, at)  # [1, hidden]
        return q_gemm(self.head, h, mode=self.target.precision)[0]

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
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        try:
            target.forward(np.asarray(pending, dtype=np.int64), num_logits=0)
            for i in range(k):
                logits = self._logits()  # [N]
                if params.greedy:
                    token = self._vocab_list[int(np.argmax(logits))]
                else:
                    # top-k, top-p and min-p over the draft vocabulary equal those over the full vocabulary with
                    # -inf outside it; q is then placed in the full vocabulary (zero elsewhere)
                    q_draft = probs_from_logits(logits, params)  # [N]
                    token = self._vocab_list[int(np.asarray(sample(q_draft, generator)).reshape(-1)[0])]
                    q = np.zeros(self.vocab_size, dtype=q_draft.dtype)
                    q[self.vocab_ids] = q_draft
                    probs.append(q)  # [vocab]
                tokens.append(token)
                if i + 1 < k:
                    target.forward(np.asarray([token], dtype=np.int64), num_logits=0)
        finally:
            target.rollback(start)  # the drafted positions stay in the cache for the verification pass
        return Draft(tokens, np.stack(probs) if probs else None, intake=len(pending))
