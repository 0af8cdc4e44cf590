"""A streamed answer whose first piece is long in coming (minutes of reading a long prompt on a CPU) starts its event
stream anyway, and sends a beat every few seconds until the piece comes: clients that give up on a silent
connection (coding agents' idle timeouts) see the server working.

A streamed request waits up to :data:`FIRST_WAIT` seconds for its first piece, as every stream did before: a bad
request still fails with an HTTP error then. Past that wait the response's headers go out with the API's opening
events (Anthropic's ``message_start`` and ``ping``, OpenAI Responses' ``response.created``; chat completions send
nothing yet), then a beat every :data:`BEAT_SECONDS` (an SSE comment line, which every client's parser skips, or
Anthropic's ``ping`` event, which its API sends the same way); an error that comes instead of the first piece is
then an error event in the stream, as the APIs send errors after their headers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

__all__ = ["BEAT_SECONDS", "COMMENT", "FIRST_WAIT", "beats", "close", "first_piece"]

FIRST_WAIT = 5.0  # seconds a streamed request waits for its first piece before its headers go out
BEAT_SECONDS = 10.0  # then, seconds between beats until the first piece comes
COMMENT = ": keep-alive\n\n"  # an SSE comment: parsers skip it


async def first_piece(pieces: AsyncIterator, wait: float | None = None) -> asyncio.Task:
    """A task taking the first item of ``pieces``, after waiting up to ``wait`` seconds (default
    :data:`FIRST_WAIT`) for it: done when it came (or failed) in time."""
    task = asyncio.ensure_future(anext(pieces))
    await asyncio.wait({task}, timeout=FIRST_WAIT if wait is None else wait)
    return task


async def beats(task: asyncio.Task, beat: str, every: float | None = None) -> AsyncIterator[str]:
    """``beat`` every ``every`` seconds (default :data:`BEAT_SECONDS`) until ``task`` is done; the task is
    cancelled if the stream ends first (the client went away: cancelling it cancels the request's jobs)."""
    every = BEAT_SECONDS if every is None else every
    try:
        while not task.done():
            done, _ = await asyncio.wait({task}, timeout=every)
            if not done:
                yield beat
    finally:
        if not task.done():
            task.cancel()


async def close(pieces: AsyncIterator, task: asyncio.Task | None) -> None:
    """Close ``pieces`` when its stream ends, unless ``task`` is still taking its first item (the client went away
    during the wait): then the task is cancelled, which ends the generator (its own ``finally`` runs), and closing it
    meanwhile would fail (it is running)."""
    if task is not None and not task.done():
        task.cancel()
        return
    await pieces.aclose()
