"""The OpenAI wire format: request bodies (validated by pydantic) and the JSON of responses and stream chunks.

Requests are strict about names (an unknown field is an error, as at OpenAI) and lenient about what common
clients send by default (``n=1``, zero penalties, ``user``). The sampling extensions ``top_k``, ``min_p`` and
``ignore_eos`` follow vLLM (with the openai client, pass them in ``extra_body``).
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from specwise.extras import missing_extra
from specwise.metrics import SpecStats

try:
    from pydantic import BaseModel, ConfigDict, Field, field_validator
except ModuleNotFoundError as err:
    raise missing_extra(err, "server", "specwise's server") from err

__all__ = [
    "ChatCompletionRequest",
    "ChatFormat",
    "ChatMessage",
    "CompletionFormat",
    "CompletionRequest",
    "ErrorResponse",
    "ResponseFormat",
    "SamplingRequest",
    "usage",
]

MAX_STOP_STRINGS = 16
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StreamOptions(_Strict):
    """``include_usage``: also send a last chunk with empty ``choices`` and the usage (as OpenAI does)."""

    include_usage: bool = False


class SamplingRequest(_Strict):
    """Fields common to chat and text completions."""

    model: str = Field(description="the served model's id, as listed by GET /v1/models")
    max_tokens: int | None = Field(None, ge=1, description="new tokens at most (default: see the server docs)")
    temperature: float | None = Field(None, ge=0, description="0 is greedy (default: 1)")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling mass (default: 1, disabled)")
    top_k: int | None = Field(None, ge=-1, description="keep the k most likely tokens (0 or -1: disabled)")
    min_p: float | None = Field(None, ge=0, lt=1, description="drop tokens below min_p x the top probability")
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX, description="seed for sampling (default: random)")
    stop: str | list[str] | None = Field(None, description=f"up to {MAX_STOP_STRINGS} stop strings")
    ignore_eos: bool = Field(False, description="keep generating past the end-of-sequence token")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="only 1 is supported")
    presence_penalty: float | None = Field(None, description="only 0 is supported")
    frequency_penalty: float | None = Field(None, description="only 0 is supported")
    user: str | None = Field(None, description="ignored")

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are supported, got {len(value)}")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("penalties are not supported (they would change the target's distribution): use 0")
        return value

    def stop_list(self) -> list[str]:
        """The stop strings as a list."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class TextPart(_Strict):
    """One text part of a message's content."""

    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    """One message of a conversation; ``developer`` is taken as ``system``."""

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def template_dict(self) -> dict:
        """The message as the chat template expects it: a role and one string."""
        text = self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1, description="the conversation so far (at least one message)")
    max_completion_tokens: int | None = Field(None, ge=1, description="the newer name of max_tokens; wins over it")


class CompletionRequest(SamplingRequest):
    """POST /v1/completions. ``prompt`` is a string or a list of token ids (a list of one string is accepted)."""

    prompt: str | list[int] | list[str] = Field(description="one prompt: a string or a list of token ids")
    echo: bool = Field(False, description="not supported (only false)")
    suffix: str | None = Field(None, description="not supported (only null)")
    best_of: int | None = Field(None, ge=1, le=1, description="only 1 is supported")

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported: the response holds the completion only")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix (insertion) is not supported")
        return value


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The body of every error: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorDetail


def usage(stats: SpecStats, drafter: str, gamma: int | str) -> dict:
    """OpenAI's token counts plus the request's speculative statistics (the CLI's ``stats``) under ``speculative``."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.new_tokens,
        "total_tokens": stats.prompt_tokens + stats.new_tokens,
        "speculative": {"drafter": drafter, "gamma": gamma, **stats.to_dict()},
    }


class ResponseFormat:
    """Builds the JSON of one response (or of its stream chunks)."""

    prefix = "cmpl"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(self, model: str) -> None:
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def _envelope(self, object_name: str, choices: list[dict], usage: dict | None = None) -> dict:
        body = {"id": self.id, "object": object_name, "created": self.created, "model": self.model}
        body["choices"] = choices
        if usage is not None:
            body["usage"] = usage
        return body

    def _choice(self, text: str | None, finish_reason: str | None, chunk: bool) -> dict:
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}

    def first_chunk(self) -> dict | None:
        """A chunk sent before any text (None when the format has none)."""
        return None

    def text_chunk(self, text: str) -> dict:
        return self._envelope(self.chunk_object_name, [self._choice(text, None, chunk=True)])

    def final_chunk(self, finish_reason: str, usage: dict) -> dict:
        """The chunk that ends the choice: its finish_reason and the request's usage."""
        return self._envelope(self.chunk_object_name, [self._choice(None, finish_reason, chunk=True)], usage)

    def usage_chunk(self, usage: dict) -> dict:
        """The extra last chunk of ``stream_options.include_usage``: no choices, only usage."""
        return self._envelope(self.chunk_object_name, [], usage)

    def response(self, text: str, finish_reason: str, usage: dict) -> dict:
        """A whole (non-streamed) response."""
        return self._envelope(self.object_name, [self._choice(text, finish_reason, chunk=False)], usage)


class CompletionFormat(ResponseFormat):
    """Responses of /v1/completions."""


class ChatFormat(ResponseFormat):
    """Responses of /v1/chat/completions."""

    prefix = "chatcmpl"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def _choice(self, text: str | None, finish_reason: str | None, chunk: bool) -> dict:
        if chunk:
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        message = {"role": "assistant", "content": text}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}

    def first_chunk(self) -> dict:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return self._envelope(self.chunk_object_name, [choice])
