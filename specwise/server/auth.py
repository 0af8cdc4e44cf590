"""API keys: ``Authorization: Bearer <key>`` on every route but ``/health``, and the warning for an open server.

With a key set (``specwise serve --api-key`` or ``SPECWISE_API_KEY``) a request without the header, or with another
key, gets HTTP 401 and an OpenAI-style error before its body is read. ``/health`` stays open for load balancers and
liveness probes; ``/metrics`` needs the key like the API (Prometheus sends it with ``authorization: credentials``
in the scrape config), and so do the OpenAPI document and its pages.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress

from fastapi.responses import JSONResponse

from specwise.server.options import API_KEY_ENV
from specwise.server.protocol import error_body

__all__ = ["API_KEY_ENV", "OPEN_PATHS", "APIKeyMiddleware", "exposure_warning", "is_loopback"]

OPEN_PATHS = frozenset({"/health"})  # answered without a key
MISSING = "Missing API key: send it as 'Authorization: Bearer <key>' (this server requires one)"
WRONG = "Incorrect API key provided: send the key this server was started with (--api-key or SPECWISE_API_KEY)"


def _digest(key: bytes) -> bytes:
    """A fixed-length digest: comparing digests takes the same time whatever the key's length."""
    return hashlib.sha256(key).digest()


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header (the scheme in any case), or None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
    return None


class APIKeyMiddleware:
    """Requires the API key on every route but OPEN_PATHS (a pure ASGI middleware: streams pass untouched)."""

    def __init__(self, app, api_key: str) -> None:
        if not api_key:
            raise ValueError("the API key must not be empty")
        self.app = app
        self._digest = _digest(api_key.encode("utf-8"))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope.get("headers", []))
        if token is not None and hmac.compare_digest(_digest(token), self._digest):
            await self.app(scope, receive, send)
            return
        response = unauthorized(MISSING if token is None else WRONG)
        await response(scope, receive, send)


def unauthorized(message: str) -> JSONResponse:
    """HTTP 401 with OpenAI's error for a bad key (type ``invalid_request_error``, code ``invalid_api_key``)."""
    body = error_body(message, "invalid_request_error", None, "invalid_api_key")
    return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": 'Bearer realm="specwise"'})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is reachable only from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve beyond this machine
        return False


def exposure_warning(host: str, port: int, api_key: str | None) -> str | None:
    """The warning to print at start when the server listens beyond loopback without a key (None: no warning)."""
    if api_key or is_loopback(host):
        return None
    return (
        f"specwise: WARNING: listening on {host}:{port} without an API key: anyone who can reach this port can use "
        f"the model; set --api-key or {API_KEY_ENV} (or listen on 127.0.0.1)"
    )
