"""What decoding gives back: the events of a stream and the result of a request, each emitted token's
log-probability (opt-in), and the text, decoded incrementally and held back at stop strings."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from specwise.metrics import SpecStats
from specwise.sampling import SamplingParams, log_probs

__all__ = ["GenerationEvent", "GenerationResult", "LogprobOptions", "StopText", "TokenLogprob", "token_logprobs"]


@dataclass(frozen=True)
class LogprobOptions:
    """Opt-in: record the target's log-probability of every emitted token, from the logits of the pass that
    verified it (accepted draft tokens and the recovered or bonus token alike: never the drafter's).

    top: the most likely alternatives to list at each position (0: only the emitted token's log-probability).
    sampled: False (default): of the model's own distribution, ``log_softmax`` of the logits (temperature 1,
        nothing cut), as OpenAI and vLLM report them; True: of the distribution the token was drawn from under
        the request's SamplingParams (temperature, top-k, top-p, min-p; greedy: 0 for the argmax). Alternatives
        of probability 0 are never listed.
    """

    top: int = 0
    sampled: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.top, bool) or not isinstance(self.top, int) or self.top < 0:
            raise ValueError(f"top (log-probability alternatives) must be an integer >= 0, got {self.top!r}")


@dataclass
class TokenLogprob:
    """One emitted token's log-probability and the ``top`` most likely tokens at its position (most likely
    first, as ``(token id, log-probability)``)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class GenerationEvent:
    """A piece of streamed output: the tokens of one target pass (after stop handling) and their text.

    text: new text since the previous event ("" while text is held back, e.g. a possible stop string).
    token_ids: new token ids.
    num_from_draft: how many of ``token_ids`` were drafted tokens accepted by the target.
    finish_reason: "stop" (EOS or stop string) or "length" on the last event, else None.
    stats: the run's statistics, on the last event only.
    logprobs: one TokenLogprob per token of ``token_ids`` when the request asked for them (LogprobOptions), else
        None.
    """

    text: str
    token_ids: list[int]
    num_from_draft: int = 0
    finish_reason: str | None = None
    stats: SpecStats | None = None
    logprobs: list[TokenLogprob] | None = None


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: SpecStats
    logprobs: list[TokenLogprob] | None = None

    def to_dict(self) -> dict:
        out = {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }
        if self.logprobs is not None:
            out["logprobs"] = [{"token_id": t.token_id, "logprob": t.logprob, "top": t.top} for t in self.logprobs]
        return out


class StopText:
    """Incremental detokenization with stop strings: never emits text at or past a stop string.

    Text that could be the start of a stop string, or an incomplete UTF-8 character, is held back until
    the next tokens decide it.
    """

    OVERLAP = 4  # tokens decoded again before the new ones, so that merges across the boundary come out right

    def __init__(self, tokenizer, stop: Iterable[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.token_ids: list[int] = []
        self.sent = 0  # characters of text already emitted
        self._base = 0  # the text of token_ids[:_base] is _base_text, final (no incomplete character at its end)
        self._base_text = ""

    def _decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _text(self) -> str:
        """The text of all tokens so far, decoding only the new tokens and a few before them: the text of the
        tokens from ``lo`` with that of ``lo .. _base`` taken off, appended to the text up to ``_base`` (a full
        decode whenever that does not line up, e.g. after an incomplete character)."""
        ids, base = self.token_ids, self._base
        lo = max(0, base - self.OVERLAP)
        head, window = self._decode(ids[lo:base]), self._decode(ids[lo:])
        if window.startswith(head):
            text = self._base_text + window[len(head) :]
        else:
            text = self._decode(ids)
        if not text.endswith("\ufffd"):
            self._base, self._base_text = len(ids), text
        return text

    def feed(self, new_ids: list[int], final: bool) -> tuple[str, list[int], bool]:
        """Add tokens; return (new text, new tokens kept, whether a stop string ended the output)."""
        start = len(self.token_ids)
        self.token_ids.extend(new_ids)
        text = self._text()
        hit = self._first_stop(text)
        if hit is not None:
            # keep the fewest tokens whose text contains the stop string
            for m in range(start + 1, len(self.token_ids) + 1):
                if self._first_stop(self._decode(self.token_ids[:m])) is not None:
                    break
            kept = self.token_ids[start:m]
            del self.token_ids[m:]
            self._base, self._base_text = 0, ""  # the output ends here
            return self._take(text[:hit]), kept, True
        if final:
            return self._take(text), new_ids, False
        end = len(text.rstrip("\ufffd"))  # hold back an incomplete multi-byte character
        safe = end
        for s in self.stop:  # hold back a suffix that could start a stop string
            held = next((n for n in range(min(len(s) - 1, end), 0, -1) if text[:end].endswith(s[:n])), 0)
            safe = min(safe, end - held)
        return self._take(text[: max(safe, self.sent)]), new_ids, False

    def _first_stop(self, text: str) -> int | None:
        found = [i for i in (text.find(s, max(0, self.sent - len(s))) for s in self.stop) if i >= 0]
        return min(found) if found else None

    def _take(self, text: str) -> str:
        piece = text[self.sent :]
        self.sent = max(self.sent, len(text))
        return piece


def token_logprobs(
    logits: np.ndarray, tokens: list[int], options: LogprobOptions, params: SamplingParams
) -> list[TokenLogprob]:
    """The log-probability of ``tokens[i]`` under row ``i`` of ``logits`` ``[len(tokens), vocab]``, with each
    row's ``options.top`` most likely tokens (most likely first, ties by the lowest id, as the greedy choice; those
    of probability 0 left out)."""
    if not tokens:
        return []
    lp = log_probs(logits, params if options.sampled else None)  # [n, vocab]
    chosen = lp[np.arange(len(tokens)), tokens].tolist()
    top = min(options.top, lp.shape[-1])
    alternatives: list[list[tuple[int, float]]] = [[] for _ in tokens]
    if top:
        for row in range(len(tokens)):
            alternatives[row] = _most_likely(lp[row], top)
    return [TokenLogprob(t, c, a) for t, c, a in zip(tokens, chosen, alternatives)]


def _most_likely(row: np.ndarray, top: int) -> list[tuple[int, float]]:
    """The ``top`` largest finite values of ``row`` as (index, value), largest first, equal values by the lowest
    index: a partition finds the ``top``-th largest value, and only the entries at or above it are sorted."""
    vocab = row.shape[0]
    kth = np.partition(row, vocab - top)[vocab - top] if top < vocab else -np.inf
    candidates = np.flatnonzero(row >= kth) if kth > -np.inf else np.flatnonzero(row > -np.inf)
    values = row[candidates]
    order = np.argsort(-values, kind="stable")[:top]  # stable: equal values keep their ascending ids
    return list(zip(candidates[order].tolist(), values[order].tolist()))
