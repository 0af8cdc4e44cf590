"""The server's errors: :class:`APIError` (an OpenAI-style body ``{"error": {"message", "type", "param",
"code"}}``), the engine's and the worker's errors as API errors, and the app's exception handlers (validation
errors named by the parameter at fault; a bad request gets a 4xx, never a 5xx)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from specwise.extras import missing_extra

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ModuleNotFoundError as err:
    raise missing_extra(err, "server", "specwise's server") from err

from specwise.server.protocol import error_body
from specwise.server.worker import BatchFailed, ServerStopping

__all__ = ["APIError", "add_error_handlers", "as_api_error", "error_body_for", "error_shape"]


class APIError(Exception):
    """An error returned to the client as an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type_: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def as_api_error(err: Exception) -> APIError:
    if isinstance(err, APIError):
        return err
    if isinstance(err, ValueError):  # the engine's validation: a bad request
        return APIError(400, str(err))
    if isinstance(err, ServerStopping):
        return APIError(503, str(err), type_="server_error", code="shutting_down")
    if isinstance(err, BatchFailed):
        return APIError(500, f"generation failed: {err}", type_="server_error")
    return APIError(500, f"generation failed: {type(err).__name__}: {err}", type_="server_error")


MAX_ERRORS_READ = 32  # of a validation error's list, for the message (the first names the field)
_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|.*\[.*\])$")  # pydantic's union-member steps in a location


def _param(loc: tuple) -> str | None:
    """``("body", "messages", 0, "content", "str")`` -> ``"messages[0].content"``."""
    parts: list[str] = []
    for item in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif not _TYPE_TAG.match(str(item)):
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or None


def _validation_message(errors: list[dict]) -> tuple[str, str | None]:
    first = errors[0]
    kind, param = first.get("type"), _param(tuple(first.get("loc", ())))
    unknown = first.get("ctx", {}).get("field") if kind == "extra_forbidden" else None
    if unknown is not None:  # found before the fields were validated: ctx has its path from the error's location
        param = f"{param or ''}{'' if unknown.startswith('[') or not param else '.'}{unknown}"
        return f"Unrecognized request argument supplied: {param}", param
    if kind == "json_invalid":
        return f"Malformed JSON body: {first.get('ctx', {}).get('error', 'could not parse it')}", None
    if param is None:
        return "The request body must be a JSON object (send it with Content-Type: application/json)", None
    if kind == "missing":
        return f"Missing required parameter: '{param}'", param
    if kind == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}", param
    same = [e["msg"] for e in errors[:MAX_ERRORS_READ] if _param(tuple(e.get("loc", ()))) == param]
    return f"Invalid '{param}': {' or '.join(dict.fromkeys(same))}", param


# path prefix -> the body of an error in that API's shape (Anthropic's routes answer in Anthropic's shape)
_SHAPES: dict[str, Callable[[APIError], dict]] = {}


def error_shape(prefix: str):
    """Register the decorated function (APIError -> body) as the error shape of the routes under ``prefix``."""

    def register(shape: Callable[[APIError], dict]) -> Callable[[APIError], dict]:
        _SHAPES[prefix] = shape
        return shape

    return register


def error_body_for(path: str, err: APIError) -> dict:
    """``err``'s body in the shape of the API that ``path`` belongs to (OpenAI's where none is registered)."""
    shape = next((f for prefix, f in _SHAPES.items() if path.startswith(prefix)), None)
    return err.body() if shape is None else shape(err)


def _response(request: Request, err: APIError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body_for(request.url.path, err), status_code=err.status, headers=headers)


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = _validation_message(list(exc.errors()) or [{"loc": ()}])
    return _response(request, APIError(400, message, param))


async def _on_api_error(request: Request, exc: APIError) -> JSONResponse:
    return _response(request, exc)


def _unparsed_body_message(cause: BaseException | None) -> str | None:
    """What was wrong with a body that FastAPI could not read as JSON, beyond a syntax error (None: unknown)."""
    if isinstance(cause, RecursionError):
        return "Malformed JSON body: it nests arrays or objects too deeply"
    if isinstance(cause, ValueError) and "digits" in str(cause):  # Python's limit on the digits of an integer
        return "Malformed JSON body: a number has too many digits"
    if isinstance(cause, UnicodeDecodeError):
        return f"Malformed JSON body: it is not UTF-8 ({cause.reason} at byte {cause.start})"
    return None


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    message = f"{detail}: {request.method} {request.url.path}" if exc.status_code in (404, 405) else detail
    if exc.status_code == 400:
        message = _unparsed_body_message(exc.__cause__) or message
    err = APIError(exc.status_code, message, type_=kind)
    return _response(request, err, getattr(exc, "headers", None))


async def _on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    return _response(request, APIError(500, f"internal error: {type(exc).__name__}: {exc}", type_="server_error"))


def add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected_error)
