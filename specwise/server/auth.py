"""API keys: ``Authorization: Bearer <key>`` on every route but ``/health`` and ``/`` (or ``x-api-key: <key>`` on
Anthropic's Messages routes, as Anthropic's clients send it), and the warning for an open server.

With a key set (``specwise serve --api-key`` or ``SPECWISE_API_KEY``) a request without the header, or with another
key, gets HTTP 401 and an error in its API's shape (OpenAI's, or Anthropic's on ``/v1/messages``) before its body is
read. ``/health`` and ``/`` (which names the model only: Claude Code probes it with ``HEAD /``) stay open for load
balancers and liveness probes; ``/metrics`` needs the key like the API (Prometheus sends it with ``authorization:
credentials`` in the scrape config), and so do the OpenAPI document and its pages.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress

from fastapi.responses import JSONResponse

from specwise.server.errors import APIError, error_body_for
from specwise.server.options import API_KEY_ENV

__all__ = ["API_KEY_ENV", "OPEN_PATHS", "APIKeyMiddleware", "exposure_warning", "is_loopback"]

OPEN_PATHS = frozenset({"/health", "/"})  # answered without a key (liveness; "/" names the model only)
X_API_KEY_PATHS = ("/v1/messages",)  # Anthropic's routes, whose clients send the key as ``x-api-key``
MISSING = "Missing API key: send it as 'Authorization: Bearer <key>' (this server requires one)"
MISSING_X_API_KEY = (
    "Missing API key: send it as 'x-api-key: <key>' or 'Authorization: Bearer <key>' (this server requires one)"
)
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


def x_api_key(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The key of an ``x-api-key: <key>`` header (Anthropic's), or None."""
    for name, value in headers:
        if name.lower() == b"x-api-key":
            return value.strip() or None
    return None


def presented_keys(path: str, headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The keys a request to ``path`` presents: its bearer token, and on Anthropic's routes its ``x-api-key``."""
    keys = [bearer_token(headers)]
    if path.startswith(X_API_KEY_PATHS):
        keys.append(x_api_key(headers))
    return [key for key in keys if key is not None]


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
        path = scope.get("path", "")
        keys = presented_keys(path, scope.get("headers", []))
        if any(hmac.compare_digest(_digest(key), self._digest) for key in keys):
            await self.app(scope, receive, send)
            return
        missing = MISSING_X_API_KEY if path.startswith(X_API_KEY_PATHS) else MISSING
        response = unauthorized(missing if not keys else WRONG, path)
        await response(scope, receive, send)


def unauthorized(message: str, path: str = "") -> JSONResponse:
    """HTTP 401 for a bad key, in the shape of ``path``'s API (OpenAI's: type ``invalid_request_error``, code
    ``invalid_api_key``; Anthropic's: type ``authentication_error``)."""
    body = error_body_for(path, APIError(401, message, code="invalid_api_key"))
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
