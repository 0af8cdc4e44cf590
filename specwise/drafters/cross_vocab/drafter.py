"""A draft model of another vocabulary than the target's (Timor et al., ICML 2025, arXiv 2502.05202).

Two methods keep the output exact:

- **TLI** (token-level intersection): the draft model's distribution restricted to the tokens both vocabularies
  spell the same (by their bytes; turn and end markers by what they mark) and renormalized there, its ids mapped to
  the target's; the usual rejection rule verifies it, so the output is the target's at any temperature, top-k, top-p
  and min-p (q is a distribution over the target's ids that is zero outside the shared tokens).
- **SLEM** (string-level exact match): the draft model writes freely, greedily; its text is tokenized by the
  target's tokenizer (its boundary with the context handled: the target's last tokens are tokenized with it, and
  kept only where they come out the same) and proposed as single tokens. The greedy rule, or under sampling the
  coupled rule for single tokens, verifies them: exact too, whatever the draft.

The draft model keeps its own cache, in its own tokens, of the text the target's tokens spell: each step the text the
context gained is tokenized by the draft's tokenizer from a few draft tokens back (a target token may end inside
a draft token, or complete a character that byte tokens began) and only the draft tokens that differ from those in
the cache are fed, after rolling the cache back to the first difference. Special tokens travel as markers: a turn,
end or fill-in-the-middle marker of one vocabulary becomes the other's marker of the same role where the other has
one, and is left out of the draft's text where it has none (the draft's own beginning-of-text token is put first as
its tokenizer puts it).
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from specwise.drafters.base import Draft, Drafter, common_prefix
from specwise.drafters.cross_vocab.vocabulary import TokenSpace, VocabularyPair
from specwise.drafters.model import LOOKAHEAD, _draw, _top_probability
from specwise.models.base import Model
from specwise.sampling import SamplingParams, probs_from_logits

__all__ = ["CrossVocabDrafter", "METHODS", "cross_vocab_drafter"]

METHODS = ("auto", "tli", "slem")
_BACK = 3  # draft tokens re-tokenized behind the first byte the context changed (a word the new text continues)


class CrossVocabDrafter(Drafter):
    """A draft model of another vocabulary (see the module's docstring): ``method`` ``tli``, ``slem`` or ``auto``
    (SLEM, greedy and sampled: with SmolLM2-135M for Qwen2.5-Coder-1.5B, SLEM's greedy drafts, verified under sampling
    by the coupled rule, ran 1.19x TLI's speed on coding at temperature 0.7, top-p 0.95, 1.16x at temperature 1,
    and 1.02x [0.97, 1.07] over 13 categories at 0.7: its drafts reach the target's tokens that TLI cannot draft,
    and the target's own distribution on them is peaked).

    model: the draft model (its own ids); pair: the two vocabularies (:class:`VocabularyPair`).
    target_vocab: the width of the target's logits (q is over it).
    lookahead: greedy drafting spends a draft pass on the next token only while the product of the draft's
        probabilities so far times this clears the stop level (as ModelDrafter's).
    columns: the draft ids (sorted) of the draft model's logits' columns, where its output layer is restricted to a
        draft vocabulary (``restrict_output``: a cheaper pass); None: every row of its own. Both methods draft from
        these tokens only (TLI's q is zero outside them), so the output stays exact.
    """

    def __init__(
        self,
        model: Model,
        pair: VocabularyPair,
        target_vocab: int,
        method: str = "auto",
        lookahead: float = LOOKAHEAD,
        columns: np.ndarray | None = None,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown cross-vocabulary method {method!r}: use one of {', '.join(METHODS)}")
        if not 0 < lookahead <= 1:
            raise ValueError(f"lookahead must be in (0, 1], got {lookahead}")
        self.model, self.pair, self.method = model, pair, method
        self.target_vocab = int(target_vocab)
        self.lookahead = float(lookahead)
        self.device = model.device
        self.name = "model-tli" if method == "tli" else "model-slem"  # (auto: the method of its last draft)
        rows = min(pair.draft_rows, pair.draft.size)
        columns = np.arange(rows, dtype=np.int64) if columns is None else np.asarray(columns, dtype=np.int64)
        self._columns = columns  # [width] the draft id of each column of the draft model's logits
        self._width = int(np.searchsorted(columns, rows)) if columns.size else 0  # columns of real draft tokens
        self._col_of = np.full(max(rows, int(columns.max(initial=-1)) + 1), -1, dtype=np.int64)
        self._col_of[columns] = np.arange(columns.size)
        self._shared = self._in_columns(pair.shared_draft, pair.shared_target)  # TLI's: (draft ids, columns, targets)
        if not len(self._shared[0]) and method != "slem":
            raise ValueError(
                "the draft and target vocabularies share no token (in the draft vocabulary): TLI has nothing to draft "
                "(use method=slem, or a larger vocab=)"
            )
        self._reset()
        self._mark: tuple[int | None, int] | None = None

    def describe(self) -> dict:
        """The pair as reports give it: the method asked for, the two vocabularies' sizes, the tokens they share
        (TLI's) and the share of the draft's vocabulary that is the target's too."""
        pair = self.pair
        return {
            "method": self.method,
            "target_tokens": int(pair.target.size),
            "draft_tokens": int(pair.draft.size),
            "shared_tokens": int(len(pair.shared_draft)),
            "overlap": float(pair.overlap),
        }

    def _in_columns(self, drafts: np.ndarray, *more: np.ndarray) -> tuple[np.ndarray, ...]:
        """Of draft ids ``drafts`` (and arrays aligned with them), those in the logits' columns: (their draft ids,
        their columns, the aligned arrays' entries)."""
        cols = self._col_of[drafts] if drafts.size else np.empty(0, dtype=np.int64)
        keep = cols >= 0
        return (drafts[keep], cols[keep], *(m[keep] for m in more))

    def _reset(self) -> None:
        """Forget both sides' state: the context converted so far and the draft tokens in the cache."""
        self._ctx: list[int] = []  # target ids whose stream is in _cs
        self._cend: list[int] = [0]  # _cs's length after each of them
        self._cs = bytearray()  # the context's stream
        head = list(self.pair.draft.head)
        self._fed: list[int] = []  # draft ids in the draft model's cache
        self._fend: list[int] = [0]  # _fs's length after each of them
        self._fs = bytearray()  # their stream
        self._head = head  # the draft's beginning-of-text ids, always first in its cache
        self._last: np.ndarray | None = None  # the logits after the last fed token

    def _forked(self, target: Model) -> None:
        self.model = self.model.sequence()
        self._reset()
        self._mark = None

    def begin(self, prompt: list[int]) -> None:
        # as ModelDrafter's: the cache of the previous request is kept and rolled back to what the new one shares
        if self._mark is None or self._mark != (self.model.feeds, self.model.length):
            self.model.reset()
            self._reset()

    def pending(self, context: list[int]) -> int:
        return len(context) - common_prefix(self._ctx, context, limit=len(context) - 1)

    # ---- keeping the draft model's cache in step with the context ----------------------------------------------

    def _convert(self, context: list[int]) -> None:
        """Bring the context's stream to ``context`` (only the target tokens that changed are spelled again)."""
        same = common_prefix(self._ctx, context)
        if same < len(self._ctx):
            del self._ctx[same:]
            del self._cend[same + 1 :]
            del self._cs[self._cend[-1] :]
        pieces = self.pair.target_piece
        n = len(pieces)
        for t in context[same:]:
            self._cs += pieces[t] if 0 <= t < n else b""
            self._ctx.append(t)
            self._cend.append(len(self._cs))

    def _common_bytes(self) -> int:
        """Length of the longest common prefix of the fed tokens' stream and the context's."""
        a, b = self._fs, self._cs
        n = min(len(a), len(b))
        if a[:n] == b[:n]:
            return n
        lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if a[lo:mid] == b[lo:mid]:
                lo = mid
            else:
                hi = mid
        return lo

    def _truncate(self, n: int) -> None:
        """Keep the first ``n`` fed tokens (cache included)."""
        if n < len(self._fed):
            self._last = None
            self.model.rollback(n)
            del self._fed[n:]
            del self._fend[n + 1 :]
            del self._fs[self._fend[-1] :]

    def _feed(self, ids: list[int], logits: int = 1) -> np.ndarray:
        """Feed draft ``ids`` after the cache; the logits of the last ``logits`` positions."""
        rows = self.model.forward(np.asarray(ids, dtype=np.int64), num_logits=logits)
        self._last = rows[-1]
        pieces = self.pair.draft_piece
        for d in ids:
            self._fed.append(d)
            self._fs += pieces[d]
            self._fend.append(len(self._fs))
        return rows

    def _sync(self, context: list[int], heal: bool = False) -> tuple[np.ndarray | None, int, int | None]:
        """Bring the draft model's cache to the draft's tokens of ``context``; the logits for its next token (None
        when there is no text to draft after), how many draft tokens were fed, and the draft token held back (None:
        none). ``heal``: the context's last draft token is held back, where longer draft tokens begin with its
        text: the context may end inside a draft token (Qwen2.5's ``):\\n`` then ``   ``, where SmolLM2 writes
        ``):`` then ``\\n   ``), and the draft model, after a token it would have written longer, guesses badly."""
        self._convert(context)
        head = len(self._head)
        if self._fed[:head] != self._head:  # (a cache rolled back into its head: started again)
            self._truncate(0)
        if not self._fed:
            want = self._head + self.pair.to_draft(bytes(self._cs))
        else:
            agree = self._common_bytes()
            kept = max(head, bisect_right(self._fend, agree) - 1)  # fed tokens whose text the context has
            start = max(head, kept - _BACK)
            while start > head and self.pair.partial[self._fed[start - 1]]:
                start -= 1
            want = self._fed[:start] + self.pair.to_draft(bytes(self._cs[self._fend[start] :]))
        held = None
        if heal and len(want) > max(head, 1) and self.pair.extensions(want[-1]) is not None:
            held = want.pop()
        if not want:
            return None, 0, None
        same = common_prefix(self._fed, want)
        if same == len(want) == len(self._fed) and self._last is not None:  # the same text spelled anew
            return self._last, 0, held
        same = min(same, len(want) - 1)  # at least one token fed: its logits are needed
        limit = self.model.max_length
        if limit is not None and len(want) >= limit:
            return None, 0, None
        self._truncate(same)
        new = want[same:]
        return self._feed(new)[-1], len(new), held

    # ---- drafting ----------------------------------------------------------------------------------------------

    def propose(
        self,
        context: list[int],
        k: int,
        params: SamplingParams,
        generator: np.random.Generator | None,
        stop: float = 0.0,
    ) -> Draft:
        if k <= 0:
            return Draft.empty()
        slem = self.method != "tli"
        logits, intake, held = self._sync(context, heal=True)
        if logits is None:
            draft = Draft.empty()
        elif slem:
            self.name = "model-slem"
            draft = self._slem(context, logits, k, stop, intake, held)
        else:
            self.name = "model-tli"
            draft = self._tli(logits, k, params, generator, stop, intake, held)
        self._mark = (self.model.feeds, self.model.length)
        return draft

    def _room(self, k: int) -> int:
        """Draft tokens that fit in the draft model's context after its cache."""
        limit = self.model.max_length
        return k if limit is None else max(0, min(k, limit - self.model.length))

    def _tli(self, logits, k, params, generator, stop, intake, held) -> Draft:
        """TLI: draft from the shared tokens only, q mapped to the target's ids. With ``held`` (the context's last
        draft token, held back): where the draft model's most likely token beginning with its text is a longer one,
        the first token is drawn among those longer ones whose rest is a token of the target's (the rest mapped to
        it), else the held token is fed and drafting goes on as usual. Which of the two is a function of the draft
        model's logits, not of the draw: each token is drawn from the q it is verified with."""
        pair = self.pair
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        confidence: list[float] | None = [] if params.greedy and stop > 0 else None
        reach = 1.0
        k = self._room(k)
        if held is not None:
            # [n] longer draft tokens, their columns, the target's token of each one's rest
            drafts, cols, targets = self._in_columns(*pair.healed(held))
            options, option_cols = self._in_columns(pair.extensions(held))
            if not len(drafts) or int(options[int(np.argmax(logits[option_cols]))]) == held:
                logits = self._feed([held])[-1]
                held = None
        for i in range(k):
            if i or held is None:
                drafts, cols, targets = self._shared
            row = logits[cols]  # [n]
            if params.greedy:
                j = int(np.argmax(row))
                if confidence is not None:
                    confidence.append(_top_probability(row))
                    reach *= confidence[-1]
            else:
                q_row = probs_from_logits(row, params)  # [n]: top-k, top-p, min-p over the tokens it may draft
                j = _draw(q_row, generator)
                q = np.zeros(self.target_vocab, dtype=np.float32)
                q[targets] = q_row
                probs.append(q)  # [target_vocab]
            tokens.append(int(targets[j]))
            if confidence is not None and reach < stop:
                break
            if i + 1 < k:
                if confidence is not None and reach * self.lookahead < stop:
                    break
                logits = self._feed([int(drafts[j])])[-1]
        return Draft(tokens, np.stack(probs) if probs else None, confidence, intake=intake)

    def _slem(self, context, logits, k, stop, intake, held) -> Draft:
        """SLEM: the draft writes its own tokens greedily (the first one beginning with the text of ``held``, the
        context's last draft token, held back) until their text holds ``k`` of the target's tokens and the start of
        one more (whose end the text may cut), or ``k`` ending in one that no longer token of the target's begins
        with, or the stop level ends it; the target's tokens of that text, less a last one (but a lone one) that
        text after it might still join into a longer token."""
        pair = self.pair
        pieces = pair.draft_piece
        if held is not None:
            options, option_cols = self._in_columns(pair.extensions(held))  # draft ids beginning with held's text
            if not len(options):  # none of them among the columns: the held token fed after all
                logits, held = self._feed([held])[-1], None
        skip = len(pieces[held]) if held is not None else 0  # text of the first token that the context has
        text, ends, chances, ids = b"", [], [], []
        reach = 1.0
        steps = self._room(2 * k + 2)
        for i in range(steps):
            if i == 0 and held is not None:
                row = logits[option_cols]
                d = int(options[int(np.argmax(row))])
            else:
                row = logits[: self._width]
                d = int(self._columns[int(np.argmax(row))])
            if not pieces[d]:  # a special token the target has no counterpart of (or a text-start): stop there
                break
            text += pieces[d][skip:] if i == 0 else pieces[d]
            ends.append(len(text))
            chances.append(_top_probability(row))
            reach *= chances[-1]
            whole = _whole_characters(text)
            ids = self._continuation(context, whole) if whole else []
            if len(ids) > k or (stop > 0 and reach < stop):
                break
            if len(ids) == k and not pair.grows(ids[-1]):
                break  # the k-th token is whole whatever follows: no pass for the start of one more
            if i + 1 < steps:
                if stop > 0 and reach * self.lookahead < stop:
                    break
                logits = self._feed([d])[-1]
        if len(ids) > k:
            tokens = ids[:k]
        elif len(ids) > 1 and pair.grows(ids[-1]):
            tokens = ids[:-1]  # the text stopped where more of it might join its last token into a longer one
        else:
            tokens = ids  # (a lone one even so: on code, leaving it out lost more than its misses cost)
        if not tokens:
            return Draft.empty()
        confidence = self._confidence(tokens, ends, chances) if stop > 0 else None
        return Draft(tokens, None, confidence, intake=intake)

    def _continuation(self, context: list[int], text: bytes) -> list[int]:
        """The target's tokens for ``text`` after ``context``: the context's last few tokens are tokenized with it
        (a word it continues) and the result kept where those come out as they are in the context."""
        pair = self.pair
        tail = 0
        for t in reversed(context[-_BACK:]):
            piece = pair.target_piece[t] if 0 <= t < len(pair.target_piece) else b""
            if not piece or piece.startswith(b"\x00\x02"):
                break
            tail += 1
        for m in range(tail, 0, -1):
            before = context[len(context) - m :]
            ids = pair.to_target(pair.stream(before, pair.target_piece) + text)
            if ids[:m] == before and len(ids) > m:
                return ids[m:]
        return pair.to_target(text)

    def _confidence(self, tokens: list[int], ends: list[int], chances: list[float]) -> list[float]:
        """Each target token's confidence: the product of the draft's probabilities of the draft tokens whose text
        it reaches into first."""
        pieces = self.pair.target_piece
        out, at, j = [], 0, 0
        for t in tokens:
            at += len(pieces[t])
            c = 1.0
            while j < len(ends) and (j == 0 or ends[j - 1] < at):
                c *= chances[j]
                j += 1
            out.append(c)
        return out


def _whole_characters(text: bytes) -> bytes:
    """``text`` without an incomplete UTF-8 character at its end (a draft token that ends inside one: the target's
    tokens of the part would differ from those of the whole)."""
    cut = len(text)
    for back in range(1, min(4, len(text)) + 1):
        byte = text[-back]
        if byte < 0x80:
            break
        if byte >= 0xC0:  # a lead byte: whole if its sequence fits
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            if back < need:
                cut = len(text) - back
            break
    return text[:cut]


def cross_vocab_drafter(draft, target, options: dict[str, str]) -> CrossVocabDrafter:
    """The drafter of ``draft`` (a LoadedModel) for ``target`` (a LoadedModel) of another vocabulary; ``options``:
    the ``model:`` spec's (``method``: auto, tli or slem; ``lookahead``; ``vocab``, ``ranking``: the draft model's
    output restricted to the N tokens of its own vocabulary that it writes most, as for a draft model of the target's
    vocabulary, a cheaper pass). ``lookup`` is for a draft model of the target's own vocabulary, and refused here."""
    from specwise.drafters.vocab import lookahead_option, restrict_draft_output
    from specwise.models.loader import eos_ids

    method = options.get("method", "auto")
    if method not in METHODS:
        raise ValueError(f"bad drafter option method={method!r}: use method=tli, method=slem or method=auto")
    if "lookup" in options:
        raise ValueError(
            "drafter option lookup= is for a draft model of the target's vocabulary; this one drafts across "
            "vocabularies: drop it"
        )
    for loaded, what in ((draft, "draft"), (target, "target")):
        if loaded.tokenizer is None:
            raise ValueError(
                f"the {what} model has no tokenizer: a draft model of another vocabulary than the target's needs "
                "both tokenizers (a GGUF file carries its own; a model directory needs its tokenizer.json)"
            )
    pair = VocabularyPair(
        TokenSpace.from_tokenizer(target.tokenizer, "target"),
        TokenSpace.from_tokenizer(draft.tokenizer, "draft"),
        int(target.model.vocab_size),
        int(draft.model.vocab_size),
    )
    columns = None
    if "vocab" in options:  # the draft's own vocabulary ranked, its own end-of-sequence tokens kept
        columns = restrict_draft_output(draft.model, options, draft.tokenizer, eos_ids(draft) or ())
    return CrossVocabDrafter(
        draft.model, pair, int(target.model.vocab_size), method, lookahead_option(options), columns
    )
