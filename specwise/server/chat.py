"""The one request path of every chat API: chat completions, Anthropic Messages and OpenAI Responses each
translate their body into a :class:`~specwise.server.protocol.ChatCompletionRequest`, :func:`prepare_chat` turns
it into the one generation job (tools, template, constraint, budget), and :func:`reply_pieces` reads the reply as
the answer's pieces (content, reasoning, calls' starts and arguments) followed by a :class:`ReplyEnd`. Each API
writes those pieces in its own shape; none of them encodes, constrains or parses on its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specwise.server.errors import APIError, as_api_error
from specwise.server.parsing import ChatTools, chat_tools, encode_chat, encode_prediction, generation_request
from specwise.server.protocol import ChatCompletionRequest
from specwise.server.responses import Tally, queue
from specwise.server.worker import ClientDisconnected
from specwise.step import Request
from specwise.tools import ContentPiece, ReplyReader, ToolCall

if TYPE_CHECKING:
    from fastapi import Request as HTTPRequest

    from specwise.server.state import ServerState

__all__ = ["ChatJob", "ReplyEnd", "prepare_chat", "reply_pieces"]


@dataclass(frozen=True)
class ChatJob:
    """A chat request ready to run: the step's request (prompt ids, sampling, constraint, budget), its tools, and
    the endpoint its metrics count it under (``chat``; the Messages API's ``messages``)."""

    request: Request
    tools: ChatTools
    stop: list[str]
    n: int = 1
    endpoint: str = "chat"

    @property
    def prompt_tokens(self) -> int:
        return len(self.request.prompt_ids)

    def readers(self, state: ServerState) -> list[ReplyReader] | None:
        """Each choice's reader of the reply (None: the reply is all content)."""
        return self.tools.readers(state.runtime.tokenizer, self.stop, self.n, self.request.prompt_ids)


async def prepare_chat(state: ServerState, body: ChatCompletionRequest) -> ChatJob:
    """``body``'s job: tools checked, the conversation rendered by the model's template (on the encoder's
    thread), the budget checked against the context. Raises APIError naming the field at fault."""
    tools = chat_tools(state, body)
    prompt_ids = await state.encoder.run(encode_chat, state, body.messages, tools, body.chat_template_kwargs)
    max_tokens = body.max_completion_tokens or body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    prediction = None if body.prediction is None else await state.encoder.run(encode_prediction, state, body.prediction)
    request = generation_request(state, body, prompt_ids, max_tokens, "chat", param, prediction, tools.constraint)
    return ChatJob(request, tools, body.stop_list(), body.n)


@dataclass
class ReplyEnd:
    """The end of a reply: OpenAI's finish reason (``stop``, ``length``, ``tool_calls``), the engine's own
    reason (``stop`` / ``length``), the whole content, the calls, the usage (OpenAI's dict with the
    speculative statistics) and the reply's token ids (a stop string's tokens included: which one ended it)."""

    finish_reason: str
    engine_reason: str
    content: str
    calls: list[ToolCall]
    usage: dict
    token_ids: list[int] = field(default_factory=list)


async def reply_pieces(state: ServerState, request: HTTPRequest, job: ChatJob) -> AsyncIterator:
    """One reply (``job.n`` must be 1) as it comes: lists of pieces (ContentPiece, ReasoningPiece, CallStart,
    ArgumentsPiece), one list per target pass, then a :class:`ReplyEnd`. Errors before the first piece raise
    APIError (nothing was sent yet); a client that went away ends the iteration. The job is cancelled however
    the iteration ends."""
    if job.n != 1:
        raise APIError(400, "this API generates one reply per request", param="n")
    readers = job.readers(state)
    group = queue(state, [job.request], job.endpoint)
    tally = Tally(state, 1, job.prompt_tokens, False, readers)
    events = group.events(request.is_disconnected)
    token_ids: list[int] = []
    try:
        while True:
            try:
                _, event = await anext(events)
            except ClientDisconnected:
                return
            except StopAsyncIteration:
                return
            except APIError:
                raise
            except Exception as err:
                raise as_api_error(err) from err
            text, pieces = tally.add(0, event)
            token_ids.extend(event.token_ids)
            if readers is None and text:
                pieces = [ContentPiece(text)]
            if pieces:
                yield pieces
            if event.finish_reason is not None:
                calls = readers[0].calls if readers is not None else []
                content = "".join(tally.texts[0])
                yield ReplyEnd(tally.finish[0], event.finish_reason, content, list(calls), tally.usage(), token_ids)
                return
    finally:
        group.cancel()
