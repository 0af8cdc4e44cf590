"""The `model` drafter: any causal LM that shares the target's vocabulary, optionally drafting from a subset of it
(a draft vocabulary, :mod:`specwise.drafters.vocab`)."""

from __future__ import annotations

import numpy as np

from specwise.drafters.base import Draft, Drafter, common_prefix
from specwise.drafters.ngram import NgramDrafter
from specwise.models.base import Model
from specwise.sampling import SamplingParams, probs_from_logits, sample

# Greedy drafting with a stop level spends a draft pass on the next token only while the product of the draft's
# probabilities so far, times this guess of the next one's, stays at or above the stop level: a pass spent on a token
# the stop level then cuts is lost. Chosen on human-written prompts (never Spec-Bench) by replaying drafting rules
# on the draft model's probabilities along the target's answers (benchmarks/experiments/draft_policy.py): 0.5 was
# within 1% of the best guess on both coding (MBPP) and chat (OASST) prompts for Qwen2.5-Coder-1.5B with its 0.5B
# sibling.
LOOKAHEAD = 0.5


def _top_probability(logits: np.ndarray) -> float:
    """The softmax's largest value over a row of logits (the probability of its argmax): 1 / sum(exp(l - max))."""
    shifted = logits - logits.max()
    return float(1.0 / np.exp(shifted, dtype=np.float32).sum(dtype=np.float32))


def _draw(probs: np.ndarray, generator: np.random.Generator | None) -> int:
    """One token drawn from a row of probabilities (``sample`` with the run's generator)."""
    return int(np.asarray(sample(probs, generator)).reshape(-1)[0])


class ModelDrafter(Drafter):
    """Drafts autoregressively with a smaller model; keeps its own KV cache in step with the context.

    Before each proposal the drafter rolls its cache back to the longest prefix it shares with the context
    and feeds what is new (the accepted tokens, the recovered or bonus token, and, after an all-accepted
    step, its own last draft, which it had not yet fed).

    vocab_ids: the draft vocabulary, when the model's logits are over a subset of the vocabulary (``[n]`` int64
        token ids, column j of the logits being token ``vocab_ids[j]``; see ``QuantizedModel.restrict_output``):
        greedy drafts the subset's argmax, sampling draws from q over the subset, placed in the full vocabulary of
        ``vocab_size`` ids with zeros elsewhere (the target's verification keeps the output exact either way).
    lookup: greedy drafting speculates on the draft model itself (0: off). After each drafted token, the tokens
        that followed the longest earlier match (up to ``lookup`` tokens long) of the context's suffix are fed with
        it in one pass of the draft model, and kept as far as the draft model's own argmax agrees with them: where
        the answer repeats the prompt or itself, one draft pass yields several draft tokens, the same ones the
        token-by-token draft would give.
    lookahead: greedy drafting with a stop level spends a draft pass on the next token only while the product of
        the draft model's probabilities so far times ``lookahead`` (a guess of the next one's) clears the stop level
        (1: whenever the product clears it).
    """

    name = "model"

    def __init__(
        self,
        model: Model,
        vocab_ids: np.ndarray | list[int] | None = None,
        vocab_size: int | None = None,
        input_size: int | None = None,
        lookup: int = 0,
        lookahead: float = LOOKAHEAD,
    ) -> None:
        """input_size: how many token ids the draft model takes in (its embedding's rows; default: ``vocab_size``
        with a draft vocabulary, else the width of its logits). A context holding a token past them (a target's
        padding row, never written by a trained model) gets no draft from then on, rather than an error."""
        self.model = model
        default = vocab_size if vocab_ids is not None and vocab_size is not None else model.vocab_size
        self.input_size = int(input_size if input_size is not None else default)
        self.device = model.device
        self._fed: list[int] = []  # tokens in the draft model's cache
        if vocab_ids is not None:
            vocab_ids = np.ascontiguousarray(vocab_ids, dtype=np.int64).reshape(-1)
            if vocab_size is None or vocab_ids.size != model.vocab_size:
                raise ValueError(
                    f"a draft vocabulary of {vocab_ids.size} ids needs a model with logits over as many "
                    f"(this one has {model.vocab_size}) and the full vocabulary's size"
                )
        self.vocab_ids = vocab_ids
        self._vocab_list = None if vocab_ids is None else vocab_ids.tolist()
        self.vocab_size = int(vocab_size if vocab_size is not None else model.vocab_size)
        self.lookup = NgramDrafter(max_ngram=lookup, device=self.device) if lookup > 0 else None
        self._mark: tuple[int | None, int] | None = None  # the cache's (feeds, length) after this drafter's last pass
        if not 0 < lookahead <= 1:
            raise ValueError(f"lookahead must be in (0, 1], got {lookahead}")
        self.lookahead = float(lookahead)

    def _forked(self, target: Model) -> None:
        self.model = self.model.sequence()  # the draft model's weights, its own cache
        self._fed = []
        self._mark = None
        if self.lookup is not None:
            self.lookup = self.lookup.fork(target)  # the same lookup, its own index

    def begin(self, prompt: list[int]) -> None:
        # the draft model's cache is kept from the previous request: the next sync rolls it back to the prefix the
        # new context shares (a system prompt, the earlier turns of a chat) and takes in only the rest, as the
        # target's prompt caching does. Rolling back and feeding gives a fresh cache's logits (the Model contract),
        # so the drafts are the same. Emptied when anything else wrote the cache since this drafter's last pass.
        if self._mark is None or self._mark != (self.model.feeds, self.model.length):
            self.model.reset()
            self._fed = []
        if self.lookup is not None:
            self.lookup.begin(prompt)

    def pending(self, context: list[int]) -> int:
        return len(context) - common_prefix(self._fed, context, limit=len(context) - 1)

    def _sync(self, context: list[int]) -> tuple[np.ndarray | None, int]:
        """Bring the cache to ``context[:-1]`` plus the last token; return logits for the next token (None when
        the context holds a token the draft model cannot take in) and how many tokens were taken in."""
        common = common_prefix(self._fed, context, limit=len(context) - 1)
        new = context[common:]
        if max(new) >= self.input_size:
            return None, 0
        self.model.rollback(common)
        del self._fed[common:]
        logits = self.model.forward(np.asarray(new, dtype=np.int64), num_logits=1)
        self._fed.extend(new)
        return logits[-1], len(new)

    def propose(
        self,
        context: list[int],
        k: int,
        params: SamplingParams,
        generator: np.random.Generator | None,
        stop: float = 0.0,
    ) -> Draft:
        draft = self._propose(context, k, params, generator, stop)
        self._mark = (self.model.feeds, self.model.length)
        return draft

    def _propose(
        self, context: list[int], k: int, params: SamplingParams, generator: np.random.Generator | None, stop: float
    ) -> Draft:
        if k <= 0:
            return Draft.empty()
        logits, intake = self._sync(context)  # [vocab]
        if logits is None:
            return Draft.empty()
        if params.greedy and self.lookup is not None:
            return Draft(self._staged(context, k, logits), None, intake=intake)
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        ids = self._vocab_list
        # greedy with a stop level: each token's confidence is the draft model's probability of it (its largest),
        # the planner's estimate that the target's greedy choice is the same; drafting stops at the first token
        # where their product falls below the stop level (the planner cuts that token: no pass is spent after it)
        confidence: list[float] | None = [] if params.greedy and stop > 0 else None
        reach = 1.0
        for i in range(k):
            if params.greedy:
                token = self._argmax(logits)
                if confidence is not None:
                    confidence.append(_top_probability(logits))
                    reach *= confidence[-1]
                    if reach < stop:
                        tokens.append(token)
                        break
            elif ids is None:
                q = probs_from_logits(logits, params)  # [vocab]
                token = _draw(q, generator)
                probs.append(q)
            else:
                # top-k, top-p and min-p over the draft vocabulary equal those over the full vocabulary with -inf
                # outside it; q is then placed in the full vocabulary (zero elsewhere) for the rejection rule
                q_draft = probs_from_logits(logits, params)  # [draft_vocab]
                token = ids[_draw(q_draft, generator)]
                q = np.zeros(self.vocab_size, dtype=q_draft.dtype)
                q[self.vocab_ids] = q_draft
                probs.append(q)  # [vocab]
            tokens.append(token)
            if i + 1 < k:
                if confidence is not None and reach * self.lookahead < stop:
                    break  # the next token would likely be cut: no pass spent to see it (this one is fed later)
                logits = self.model.forward(np.asarray([token], dtype=np.int64), num_logits=1)[-1]
                self._fed.append(token)
        draft_probs = np.stack(probs) if probs else None  # [k, vocab] float32
        return Draft(tokens, draft_probs, confidence, intake=intake)

    def _argmax(self, logits: np.ndarray) -> int:
        """The greedy token of a row of the draft model's logits (a column of the draft vocabulary mapped back)."""
        best = int(np.argmax(logits))
        return best if self._vocab_list is None else self._vocab_list[best]

    def _staged(self, context: list[int], k: int, logits: np.ndarray) -> list[int]:
        """``k`` greedy draft tokens, each draft pass also checking a lookup continuation (see ``lookup``): the
        same tokens as drafting one by one, in fewer passes where the continuation agrees."""
        self.lookup.index(context)
        sequence = list(context)
        tokens: list[int] = []
        while True:
            token = self._argmax(logits)
            tokens.append(token)
            sequence.append(token)
            if len(tokens) >= k:
                return tokens
            guess, _ = self.lookup.lookup(sequence, k - len(tokens))
            feed = [token] + guess
            rows = self.model.forward(np.asarray(feed, dtype=np.int64), num_logits=len(feed))
            self._fed.extend(feed)
            kept = 0
            while kept < len(guess) and len(tokens) < k and self._argmax(rows[kept]) == guess[kept]:
                tokens.append(guess[kept])
                sequence.append(guess[kept])
                kept += 1
            dropped = len(guess) - kept
            if dropped:  # the cache keeps what the draft model agreed with
                self.model.rollback(self.model.length - dropped)
                del self._fed[-dropped:]
            if len(tokens) >= k:
                return tokens
            logits = rows[kept]
