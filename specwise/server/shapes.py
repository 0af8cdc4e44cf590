"""The OpenAI wire format's answers: the error body, the usage (with the speculative statistics), and the JSON of
whole responses and of stream chunks for completions and chat completions (:class:`ResponseFormat`). The request
bodies are in :mod:`specwise.server.protocol`."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from specwise.engine import TokenLogprob
from specwise.extras import missing_extra
from specwise.metrics import SpecStats
from specwise.server.logprobs import TextOffsets, TokenTexts, chat_logprobs, completion_logprobs

try:
    from pydantic import BaseModel
except ModuleNotFoundError as err:
    raise missing_extra(err, "server", "specwise's server") from err

__all__ = [
    "ChatFormat",
    "Choice",
    "CompletionFormat",
    "ErrorDetail",
    "ErrorResponse",
    "ResponseFormat",
    "error_body",
    "usage",
]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The body of every error: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorDetail


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    """The JSON of an error response, as OpenAI writes it (see ErrorResponse)."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def usage(stats: SpecStats, drafter: str, gamma: int | str, prompt_tokens: int | None = None) -> dict:
    """OpenAI's token counts plus the request's speculative statistics (the CLI's ``stats``) under ``speculative``.

    prompt_tokens: the prompt's length when ``stats`` merges several choices of one prompt (counted once).
    """
    prompt = stats.prompt_tokens if prompt_tokens is None else prompt_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": stats.new_tokens,
        "total_tokens": prompt + stats.new_tokens,
        # prompt tokens an earlier request's cache held (not fed again), as OpenAI reports its prompt caching
        "prompt_tokens_details": {"cached_tokens": min(stats.cached_tokens, prompt)},
        # the prediction's tokens drafted and accepted / drafted and rejected by the target (SpecStats); no
        # reasoning tokens are told apart
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "accepted_prediction_tokens": stats.accepted_prediction_tokens,
            "rejected_prediction_tokens": stats.rejected_prediction_tokens,
        },
        "speculative": {"drafter": drafter, "gamma": gamma, **stats.to_dict()},
    }


@dataclass
class Choice:
    """One whole choice of a response: its index, text, finish reason and, when asked for, its tokens'
    log-probabilities."""

    index: int
    text: str
    finish_reason: str
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[dict] | None = None  # OpenAI's tool_calls of a chat message (None: no calls)
    reasoning: str | None = None  # a thinking model's reasoning, apart from the text (None: none)


class ResponseFormat:
    """Builds the JSON of one response (or of its stream chunks).

    texts: the tokens' texts, for log-probabilities; top: alternatives per token (None: no log-probabilities).
    """

    prefix = "cmpl"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(self, model: str, texts: TokenTexts | None = None, top: int | None = None) -> None:
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.texts, self.top = texts, top

    def _envelope(self, object_name: str, choices: list[dict], usage: dict | None = None) -> dict:
        body = {"id": self.id, "object": object_name, "created": self.created, "model": self.model}
        body["choices"] = choices
        if usage is not None:
            body["usage"] = usage
        return body

    def _logprobs(self, index: int, entries: list[TokenLogprob] | None) -> dict | None:
        """A choice's ``logprobs`` object for ``entries`` (None when none were asked for)."""
        return None

    def _choice(self, index: int, text: str | None, finish_reason: str | None, chunk: bool, logprobs) -> dict:
        return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}

    def first_chunks(self, n: int) -> list[dict]:
        """The chunks sent before any text (one per choice, or none)."""
        return []

    def text_chunk(self, index: int, text: str, logprobs: list[TokenLogprob] | None = None) -> dict:
        """Choice ``index``'s new text and its new tokens' log-probabilities."""
        choice = self._choice(index, text, None, True, self._logprobs(index, logprobs))
        return self._envelope(self.chunk_object_name, [choice])

    def final_chunk(self, index: int, finish_reason: str, usage: dict | None) -> dict:
        """The chunk that ends choice ``index``: its finish_reason (and, on the response's last, the usage)."""
        return self._envelope(self.chunk_object_name, [self._choice(index, None, finish_reason, True, None)], usage)

    def reasoning_chunk(self, index: int, text: str) -> dict:
        """Choice ``index``'s new reasoning (chat's ``delta.reasoning_content``)."""
        return self.text_chunk(index, text)

    def usage_chunk(self, usage: dict) -> dict:
        """The extra last chunk of ``stream_options.include_usage``: no choices, only usage."""
        return self._envelope(self.chunk_object_name, [], usage)

    def response(self, choices: list[Choice], usage: dict) -> dict:
        """A whole (non-streamed) response."""
        bodies = [
            self._choice(c.index, c.text, c.finish_reason, False, self._logprobs(c.index, c.logprobs)) for c in choices
        ]
        return self._envelope(self.object_name, bodies, usage)


class CompletionFormat(ResponseFormat):
    """Responses of /v1/completions (log-probabilities in the legacy form, offsets into the choice's text)."""

    def __init__(self, model: str, texts: TokenTexts | None = None, top: int | None = None) -> None:
        super().__init__(model, texts, top)
        self._offsets: dict[int, TextOffsets] = {}  # each choice's text so far, for text_offset

    def _logprobs(self, index: int, entries: list[TokenLogprob] | None) -> dict | None:
        if entries is None or self.top is None:
            return None
        return completion_logprobs(entries, self.texts, self.top, self._offsets.setdefault(index, TextOffsets()))


class ChatFormat(ResponseFormat):
    """Responses of /v1/chat/completions."""

    prefix = "chatcmpl"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def _logprobs(self, index: int, entries: list[TokenLogprob] | None) -> dict | None:
        if entries is None or self.top is None:
            return None
        return chat_logprobs(entries, self.texts, self.top)

    def _choice(self, index: int, text: str | None, finish_reason: str | None, chunk: bool, logprobs) -> dict:
        if chunk:
            delta = {} if text is None else {"content": text}
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        message = {"role": "assistant", "content": text}
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}

    def first_chunks(self, n: int) -> list[dict]:
        return [
            self._envelope(
                self.chunk_object_name,
                [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
            )
            for i in range(n)
        ]

    def reasoning_chunk(self, index: int, text: str) -> dict:
        choice = {"index": index, "delta": {"reasoning_content": text}, "logprobs": None, "finish_reason": None}
        return self._envelope(self.chunk_object_name, [choice])

    def response(self, choices: list[Choice], usage: dict) -> dict:
        body = super().response(choices, usage)
        for choice, out in zip(choices, body["choices"]):
            if choice.reasoning is not None:  # as llama.cpp's and vLLM's servers give a thinking model's reasoning
                out["message"]["reasoning_content"] = choice.reasoning
            if choice.tool_calls:
                out["message"]["tool_calls"] = choice.tool_calls
                out["message"]["content"] = choice.text or None  # OpenAI's null content beside calls
        return body

    def tool_call_chunk(self, index: int, calls: list[dict]) -> dict:
        """Choice ``index``'s new tool-call pieces, as OpenAI streams them: ``{"index", "id", "type", "function":
        {"name", "arguments": ""}}`` opening a call, then ``{"index", "function": {"arguments": piece}}``."""
        choice = {"index": index, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None}
        return self._envelope(self.chunk_object_name, [choice])
