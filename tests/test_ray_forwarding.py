"""How a replica of ``specwise serve --ray`` hands its response to the gateway, without a cluster: the messages
queued since the last batch go as one, consecutive body parts joined, in order, ending where the app ended."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi", reason="needs the server extra: pip install 'specwise[server]'")

from specwise.server.ray import _pending

DONE = object()


def start() -> dict:
    return {"type": "http.response.start", "status": 200, "headers": []}


def body(data: bytes, more: bool = True) -> dict:
    return {"type": "http.response.body", "body": data, "more_body": more}


def batches(messages: list, first_alone: bool = False) -> list:
    """The batches _pending makes of ``messages`` queued all at once (or the first taken before the rest came)."""

    async def run():
        queue: asyncio.Queue = asyncio.Queue()
        out, finished = [], False
        pending = list(messages)
        if not first_alone:
            for m in pending:
                queue.put_nowait(m)
            pending = []
        else:
            queue.put_nowait(pending.pop(0))
        while not finished:
            batch, finished = _pending(await queue.get(), queue, DONE)
            out.append(batch)
            for m in pending:
                queue.put_nowait(m)
            pending = []
        return out

    return asyncio.run(run())


def test_queued_body_parts_go_as_one():
    got = batches([start(), body(b"data: 1\n\n"), body(b"data: 2\n\n"), body(b"", more=False), DONE])
    assert got == [[start(), body(b"data: 1\n\ndata: 2\n\n", more=False)]]


def test_a_message_taken_alone_goes_alone_and_order_is_kept():
    got = batches([start(), body(b"a"), body(b"b"), DONE], first_alone=True)
    assert got == [[start()], [body(b"ab")]]
    assert [m for batch in got for m in batch][0]["type"] == "http.response.start"


def test_a_finished_body_is_not_joined_with_what_follows():
    got = batches([body(b"x", more=False), body(b"y"), DONE])
    assert got == [[body(b"x", more=False), body(b"y")]]


def test_nothing_after_done():
    assert batches([DONE]) == [[]]
