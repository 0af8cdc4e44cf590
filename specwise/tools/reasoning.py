"""A thinking model's reply split into its reasoning and its answer: Qwen3 and the DeepSeek-R1 distills think in
``<think> ... </think>`` before they answer. Where the chat template and the vocabulary show the tags
(:func:`thinking_tags`), :class:`ReasoningSplitter` gives the text between them as reasoning and the rest as the
answer (in which tool calls are then read), as it streams. Where the template opens the thinking itself (the
prompt ends with ``<think>``), the reply starts inside it. Decoding is untouched: the split is the reading of the
same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from specwise.tools.tokens import single_token_id

__all__ = ["ReasoningSplitter", "ThinkingTags", "thinking_tags"]

TAGS = (("<think>", "</think>"),)


@dataclass(frozen=True)
class ThinkingTags:
    """A model's thinking tags, their token ids, and whether decoding drops them (special tokens)."""

    open: str
    close: str
    open_id: int
    close_id: int

    def starts_inside(self, tokenizer, prompt_ids: list[int]) -> bool:
        """Whether a prompt ends inside the thinking: its last tag is an unclosed ``open`` (DeepSeek-R1's and
        Qwen3-Thinking's templates open it for the model)."""
        tail = tokenizer.decode(list(prompt_ids[-16:]), skip_special_tokens=False)
        return tail.rfind(self.open) > tail.rfind(self.close)


def thinking_tags(tokenizer) -> ThinkingTags | None:
    """The thinking tags of a model whose chat template names them and whose vocabulary has each as one token
    (None: the model does not think in tags)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    for open_, close in TAGS:
        if open_ not in template or close not in template:
            continue
        open_id, close_id = single_token_id(tokenizer, open_), single_token_id(tokenizer, close)
        if open_id is not None and close_id is not None:
            return ThinkingTags(open_, close, open_id, close_id)
    return None


def _held(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that begins ``tag`` (held back: the tag may be coming)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningSplitter:
    """Splits a reply's text, fed in pieces, into (reasoning, answer) pieces. ``inside``: the reply starts inside
    the thinking. A reply that does not open with the tag (after whitespace) is all answer. Whitespace around the
    reasoning and at the answer's start is dropped."""

    def __init__(self, tags: ThinkingTags, inside: bool = False) -> None:
        self.tags = tags
        self.state = "thinking" if inside else "opening"
        self.buf = ""
        self._pending = ""  # whitespace inside the reasoning, given out when more reasoning follows
        self._started = False  # whether reasoning text has been given out

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """The new (reasoning, answer) text of the reply's next ``text`` (``final``: the reply ended)."""
        self.buf += text
        reasoning, answer = "", ""
        if self.state == "opening":
            head = self.buf.lstrip()
            if head.startswith(self.tags.open):
                self.buf, self.state = head[len(self.tags.open) :], "thinking"
            elif not final and self.tags.open.startswith(head):
                return "", ""
            else:
                self.state = "answer"
        if self.state == "thinking":
            end = self.buf.find(self.tags.close)
            if end >= 0:
                reasoning = self._reasoning(self.buf[:end], final=True)
                self.buf, self.state = self.buf[end + len(self.tags.close) :].lstrip(), "answer_start"
            else:
                keep = 0 if final else _held(self.buf, self.tags.close)
                reasoning = self._reasoning(self.buf[: len(self.buf) - keep], final)
                self.buf = self.buf[len(self.buf) - keep :]
        if self.state == "answer_start":
            self.buf = self.buf.lstrip()
            if self.buf or final:
                self.state = "answer"
        if self.state == "answer":
            answer, self.buf = self.buf, ""
        return reasoning, answer

    def _reasoning(self, text: str, final: bool) -> str:
        text = self._pending + text
        if not self._started:
            text = text.lstrip()
        body = text if final else text.rstrip()
        body = body.rstrip() if final else body
        self._pending = "" if final else text[len(body) :]
        self._started = self._started or bool(body)
        return body
