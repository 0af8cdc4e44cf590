"""The request body limit: a body larger than the server accepts is refused (HTTP 413) before anything parses it.

``BodyLimitMiddleware`` refuses at once when the Content-Length header names more than the limit, and otherwise
counts the bytes as they arrive (a chunked body has no length), refusing as soon as they pass it. A body within the
limit is read whole and handed on, so JSON parsing and tokenization never see more than the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from specwise.server.errors import APIError, error_body_for

__all__ = [
    "BodyLimitMiddleware",
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_BODY_FLAG",
    "default_max_body_bytes",
]

MIB = 1024 * 1024
DEFAULT_MAX_BODY_BYTES = MIB  # the least default: a full 8,192-token prompt is about 40 kB of JSON
BYTES_PER_CONTEXT_TOKEN = 16  # the default's room per token of context (JSON escapes, token ids written out)
MAX_BODY_FLAG = "--max-body-bytes"  # the `specwise serve` option that raises the limit (named in the refusal)
DRAIN_BYTES = 16 * MIB  # a refused body is read and dropped up to this (or 8 times the limit) before the answer
DRAIN_SECONDS = 5.0  # ... and for at most this long


def default_max_body_bytes(context: int | None) -> int:
    """1 MiB, or 16 bytes per token of the model's context where that is more (None: context unknown)."""
    return max(DEFAULT_MAX_BODY_BYTES, BYTES_PER_CONTEXT_TOKEN * (context or 0))


class BodyTooLarge(Exception):
    """More than the limit arrived; ``size`` is what had arrived when the limit was passed."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class BodyLimitMiddleware:
    """A pure ASGI middleware: requests with a body over ``max_bytes`` get HTTP 413 and the connection closes; the
    rest of the body, up to ``drain_bytes``, is read and dropped first (never parsed), so that a client still
    sending it reads the answer instead of a reset connection.

    The body of every other request is read whole (at most ``max_bytes``) before the app runs, then replayed to it;
    a client that goes away while sending it gets no answer.
    """

    def __init__(self, app, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes
        # the rest of a refused body up to this many bytes is read and dropped before the answer, so that the client,
        # still sending, reads the 413 rather than a reset connection (a larger body is cut off)
        self.drain_bytes = max(8 * max_bytes, DRAIN_BYTES)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _drain(receive, self.drain_bytes if declared <= self.drain_bytes else 0)
            await self._refuse(send, scope, f"the request body ({declared} bytes) is")
            return
        try:
            body = await _read_body(receive, self.max_bytes)
        except BodyTooLarge:
            await _drain(receive, self.drain_bytes)
            await self._refuse(send, scope, "the request body is")
            return
        if body is not None:
            await self.app(scope, _replay(body, receive), send)

    async def _refuse(self, send, scope, what: str) -> None:
        """HTTP 413 in the error shape of the API the path belongs to (OpenAI's, Anthropic's for /v1/messages)."""
        message = (
            f"{what} larger than this server accepts ({self.max_bytes} bytes): send a shorter request, or start "
            f"the server with a larger {MAX_BODY_FLAG}"
        )
        content = error_body_for(scope.get("path", ""), APIError(413, message, code="request_too_large"))
        await _send_json(send, 413, content, close=True)


async def _drain(receive, limit: int, seconds: float = DRAIN_SECONDS) -> None:
    """Read and drop what is left of a request body, at most ``limit`` bytes and ``seconds``."""
    if limit <= 0:
        return

    async def drop() -> None:
        size = 0
        while size <= limit:
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                return
            size += len(message.get("body", b""))

    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(drop(), seconds)


async def _read_body(receive, limit: int) -> bytes | None:
    """The whole body (None when the client went away); raises BodyTooLarge once more than ``limit`` bytes came."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(size)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive):
    """A ``receive`` that gives the app the body already read, then passes on to the connection's own."""
    given = False

    async def replay() -> dict:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _content_length(scope) -> int | None:
    """The Content-Length header's value (None when absent or not a number)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_json(send, status: int, content: dict, close: bool = False) -> None:
    """A whole JSON response; ``close`` asks the server to close the connection after it (the rest of an
    unread body is not worth reading)."""
    payload = json.dumps(content, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
