"""The API key of ``specwise serve`` and of the replicas of ``specwise serve --ray``: its variable, read from the
arguments or the environment. Imports neither FastAPI nor the command line, so that both and the key's middleware
may use it."""

from __future__ import annotations

import argparse
import os

__all__ = ["API_KEY_ENV", "api_key"]

API_KEY_ENV = "SPECWISE_API_KEY"  # the API key when --api-key is not given


def api_key(args: argparse.Namespace) -> str | None:
    """The API key: --api-key, else $SPECWISE_API_KEY, else None (an empty variable counts as unset)."""
    if args.api_key is not None:
        return args.api_key
    return os.environ.get(API_KEY_ENV) or None
