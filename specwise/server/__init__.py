"""The OpenAI-compatible HTTP server: ``create_app(runtime)`` builds it, ``specwise serve`` runs it.

Imported lazily, so that ``specwise generate`` does not pay for FastAPI.
"""

from __future__ import annotations

__all__ = ["create_app"]


def __getattr__(name: str):
    if name == "create_app":
        from specwise.server.app import create_app

        return create_app
    raise AttributeError(f"module 'specwise.server' has no attribute {name!r}")
