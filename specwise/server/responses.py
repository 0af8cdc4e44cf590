"""A request's answer from the events of its choices: a JSON body (:func:`collect`) or server-sent events
(:func:`sse`, a chunk per target pass and choice), with the usage of all the choices (:class:`Tally`); the event
stream cancels its jobs however it ends (:class:`JobStreamingResponse`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from specwise.extras import missing_extra

try:
    from fastapi.responses import JSONResponse, Response, StreamingResponse
except ModuleNotFoundError as err:
    raise missing_extra(err, "server", "specwise's server") from err

from specwise.metrics import SpecStats
from specwise.server import keepalive
from specwise.server.errors import APIError, as_api_error
from specwise.server.protocol import Choice, ResponseFormat, usage
from specwise.server.worker import ClientDisconnected, JobGroup, QueueFullError
from specwise.tools import ArgumentsPiece, CallStart, ContentPiece, ReasoningPiece, ReplyReader

if TYPE_CHECKING:
    from specwise.server.state import ServerState
    from specwise.step import Request

__all__ = ["CLIENT_CLOSED", "JobStreamingResponse", "Tally", "answer", "collect", "queue", "sse"]

CLIENT_CLOSED = 499  # the status logged for a request whose client went away (nobody reads it)


def queue(state: ServerState, requests: list[Request], endpoint: str) -> JobGroup:
    """The jobs of ``requests`` (one per choice) queued for the generation thread, counted under ``endpoint``;
    HTTP 429 when the queue is full."""
    group = JobGroup(requests, endpoint)
    try:
        state.worker.submit_all(group.jobs)
    except QueueFullError as err:
        raise APIError(429, f"the server is busy ({err}): retry later", code="queue_full", type_="server_busy") from err
    return group


async def answer(group: JobGroup, events, stream: bool, streamed, whole) -> Response:
    """A queued request's answer from its jobs' ``events``: an event stream (``streamed(first)``, an async
    iterator of server-sent events) once the first event is out, or a JSON body (``await whole(first)``). A bad
    request fails at the first event, before any byte of the response is sent; the jobs are cancelled however the
    answer ends (the stream cancels them when it ends)."""
    handed_over = False
    try:
        if stream:
            task = await keepalive.first_piece(events)
            if not task.done():  # a long prompt: the stream starts, beating until the first event (keepalive)
                handed_over = True
                return JobStreamingResponse(group, _late(task, streamed))
            first = task.result()
            handed_over = True
            return JobStreamingResponse(group, streamed(first))
        first = await anext(events)
        return JSONResponse(await whole(first))
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    except Exception as err:
        raise as_api_error(err) from err
    finally:
        if not handed_over:
            group.cancel()  # a no-op when they finished; stops them when the handler failed or was cancelled


async def _late(task, streamed):
    """A chat stream started before its first event: comment lines until it comes, then the events (an error that
    comes instead is the stream's error chunk)."""
    try:
        async for beat in keepalive.beats(task, keepalive.COMMENT):
            yield beat
        try:
            first = task.result()
        except ClientDisconnected:
            return
        except Exception as err:  # after the headers: the error goes in the stream, as OpenAI does
            yield _data(as_api_error(err).body())
            yield "data: [DONE]\n\n"
            return
        async for chunk in streamed(first):
            yield chunk
    finally:
        if not task.done():
            task.cancel()


class Tally:
    """A response's choices as their events come in: texts, log-probabilities, finish reasons, and the usage of
    them all (completion tokens and speculative statistics summed over the choices, the prompt counted once)."""

    def __init__(
        self, state: ServerState, n: int, prompt_tokens: int, logprobs: bool, readers: list[ReplyReader] | None = None
    ) -> None:
        self.state, self.n, self.prompt_tokens = state, n, prompt_tokens
        self.texts: list[list[str]] = [[] for _ in range(n)]
        self.reasoning: list[list[str]] = [[] for _ in range(n)]  # a thinking model's reasoning, apart
        self.logprobs = [[] if logprobs else None for _ in range(n)]
        self.finish: list[str | None] = [None] * n
        self.stats = SpecStats()
        self.readers = readers  # each choice's tool-call reader (None: the text is all content)

    def add(self, index: int, event) -> tuple[str, list]:
        """Take choice ``index``'s next event; returns its new content text and, when the request has tools, its
        pieces (content, calls' starts and arguments)."""
        pieces, text = [], event.text
        if self.readers is not None:
            pieces = self.readers[index].feed(event.text, event.token_ids, event.finish_reason is not None)
            text = "".join(p.text for p in pieces if isinstance(p, ContentPiece))
            self.reasoning[index].extend(p.text for p in pieces if isinstance(p, ReasoningPiece))
        self.texts[index].append(text)
        if self.logprobs[index] is not None:
            self.logprobs[index].extend(event.logprobs or [])
        if event.finish_reason is not None:
            reason = event.finish_reason
            self.finish[index] = reason if self.readers is None else self.readers[index].finish_reason(reason)
            self.stats.merge(event.stats)
        return text, pieces

    @property
    def done(self) -> bool:
        """Whether every choice has finished."""
        return all(reason is not None for reason in self.finish)

    def usage(self) -> dict:
        stats = self.stats
        stats.prompt_tokens = self.prompt_tokens
        return usage(stats, self.state.runtime.drafter_spec, self.state.runtime.engine.gamma, self.prompt_tokens)

    def choices(self) -> list[Choice]:
        return [
            Choice(i, "".join(self.texts[i]), self.finish[i], self.logprobs[i], self._calls(i), self._reasoning(i))
            for i in range(self.n)
        ]

    def _reasoning(self, index: int) -> str | None:
        """Choice ``index``'s reasoning (None: the model did not think apart from its answer)."""
        return "".join(self.reasoning[index]) if self.reasoning[index] else None

    def _calls(self, index: int) -> list[dict] | None:
        if self.readers is None or not self.readers[index].calls:
            return None
        return [call.openai() for call in self.readers[index].calls]


async def collect(tally: Tally, fmt: ResponseFormat, first: tuple, events) -> dict:
    tally.add(*first)
    async for index, event in events:
        tally.add(index, event)
    return fmt.response(tally.choices(), tally.usage())


async def sse(tally: Tally, fmt: ResponseFormat, pair: tuple, events, include_usage: bool):
    """Server-sent events: a chunk per target pass and choice with new text (or log-probabilities), a chunk
    ending each choice (the last with the usage), the usage chunk if asked for, then [DONE]."""
    for chunk in fmt.first_chunks(tally.n):
        yield _data(chunk)
    try:
        while True:
            index, event = pair
            text, pieces = tally.add(index, event)
            thought = "".join(p.text for p in pieces if isinstance(p, ReasoningPiece))
            if thought:
                yield _data(fmt.reasoning_chunk(index, thought))
            if text or event.logprobs:
                yield _data(fmt.text_chunk(index, text, event.logprobs))
            for delta in _call_deltas(pieces):
                yield _data(fmt.tool_call_chunk(index, [delta]))
            if event.finish_reason is not None:
                stats = tally.usage() if tally.done else None
                yield _data(fmt.final_chunk(index, tally.finish[index], stats))
                if tally.done:
                    if include_usage:
                        yield _data(fmt.usage_chunk(stats))
                    break
            pair = await anext(events)
    except ClientDisconnected:
        return
    except Exception as err:  # after the headers: the error goes in the stream, as OpenAI does
        yield _data(as_api_error(err).body())
    yield "data: [DONE]\n\n"


def _call_deltas(pieces: list) -> list[dict]:
    """OpenAI's ``delta.tool_calls`` entries of an event's pieces, a chunk each: a call's start (id, type, name and
    empty arguments), then its arguments (the pieces of one pass joined)."""
    out: list[dict] = []
    for piece in pieces:
        if isinstance(piece, CallStart):
            function = {"name": piece.name, "arguments": ""}
            out.append({"index": piece.index, "id": piece.id, "type": "function", "function": function})
        elif isinstance(piece, ArgumentsPiece):
            if out and out[-1]["index"] == piece.index and "id" not in out[-1]:
                out[-1]["function"]["arguments"] += piece.text
            else:
                out.append({"index": piece.index, "function": {"arguments": piece.text}})
    return out


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class JobStreamingResponse(StreamingResponse):
    """An event stream that cancels its job (a Job or a JobGroup) however it ends (finished, client gone, server
    stopping)."""

    def __init__(self, job: JobGroup, content) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()
