"""A reply's text as the tool parsers need it: the detokenized text, except that a format's special marker tokens
(``<tool_call>`` where the vocabulary has it as a special token, which ordinary decoding drops) are kept."""

from __future__ import annotations

from collections.abc import Iterable

from specwise.engine import StopText
from specwise.tools.parse import CallParser, ContentPiece, Piece, ReasoningPiece, ToolCall
from specwise.tools.reasoning import ReasoningSplitter

__all__ = ["MarkedText", "ReplyReader"]


class _KeepMarkers:
    """A tokenizer whose decoding drops special tokens but those of ``keep`` (decoded as their text)."""

    def __init__(self, tokenizer, keep: set[int]) -> None:
        self.tokenizer, self.keep = tokenizer, keep

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        parts, run = [], []
        for token in ids:
            if token in self.keep:
                parts.append(self.tokenizer.decode(run, skip_special_tokens=skip_special_tokens) if run else "")
                parts.append(self.tokenizer.decode([token], skip_special_tokens=False))
                run = []
            else:
                run.append(token)
        if run:
            parts.append(self.tokenizer.decode(run, skip_special_tokens=skip_special_tokens))
        return "".join(parts)


class MarkedText:
    """The text of a reply's tokens, fed as they come (``feed(token_ids, final)`` returns the new text), with the
    marker tokens ``keep`` in it, stop strings applied as the engine applies them."""

    def __init__(self, tokenizer, keep: set[int], stop: Iterable[str] = ()) -> None:
        self._text = StopText(_KeepMarkers(tokenizer, set(keep)), stop)

    def feed(self, token_ids: list[int], final: bool) -> str:
        text, _, _ = self._text.feed(list(token_ids), final)
        return text


class ReplyReader:
    """One reply's answer read as its tokens come: its text (with the format's marker tokens kept where decoding
    drops them) split into reasoning and answer where the model thinks (``reasoning``), and the answer fed to the
    format's tool-call parser (``parser``; None: the answer is all content). ``feed`` returns the new pieces."""

    def __init__(
        self,
        parser: CallParser | None,
        tokenizer=None,
        markers: set[int] | None = None,
        stop=(),
        reasoning: ReasoningSplitter | None = None,
    ) -> None:
        self.parser = parser
        self.reasoning = reasoning
        self._marked = MarkedText(tokenizer, markers, stop) if markers else None

    def feed(self, text: str, token_ids: list[int], final: bool) -> list[Piece]:
        """The pieces of the reply's next event (its text and tokens; ``final``: the reply ended)."""
        if self._marked is not None:
            text = self._marked.feed(token_ids, final)
        pieces: list[Piece] = []
        if self.reasoning is not None:
            thought, text = self.reasoning.feed(text, final)
            if thought:
                pieces.append(ReasoningPiece(thought))
        if self.parser is None:
            return pieces + ([ContentPiece(text)] if text else [])
        return pieces + self.parser.feed(text, final)

    @property
    def calls(self) -> list[ToolCall]:
        return [] if self.parser is None else self.parser.calls

    def finish_reason(self, reason: str) -> str:
        """OpenAI's finish reason: ``tool_calls`` for a reply that ended after whole calls, else ``reason``."""
        calls = self.calls
        return "tool_calls" if reason == "stop" and calls and all(c.complete for c in calls) else reason
