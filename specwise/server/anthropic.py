"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``) over the one chat path
(:mod:`specwise.server.chat`). Being written."""

from __future__ import annotations


def add_routes(app) -> None:
    """Add the Messages routes to ``app``."""
