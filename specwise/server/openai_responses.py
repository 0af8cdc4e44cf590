"""OpenAI's Responses API (``POST /v1/responses``) over the one chat path (:mod:`specwise.server.chat`). Being
written."""

from __future__ import annotations


def add_routes(app) -> None:
    """Add the Responses routes to ``app``."""
