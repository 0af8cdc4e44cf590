"""What the server's routes share (:class:`ServerState`): the runtime, the generation worker, the metrics and the
serving options. It sits below every route's module (the app, the adapters of each API, the request path), so
that each of them reads it without importing another."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import Request

    from specwise.runtime import Runtime
    from specwise.server.encoding import PromptEncoder
    from specwise.server.logprobs import TokenTexts
    from specwise.server.metrics import ServerMetrics
    from specwise.server.worker import GenerationWorker

__all__ = ["ServerState", "server_state"]


@dataclass
class ServerState:
    """What the routes share: the runtime, the generation worker, the metrics and the serving options."""

    runtime: Runtime
    model_name: str
    worker: GenerationWorker
    metrics: ServerMetrics
    default_max_tokens: int | None
    encoder: PromptEncoder  # prompts -> token ids on a thread of its own (the worker thread decodes)
    max_body_bytes: int
    created: int
    token_texts: TokenTexts  # token ids -> text and bytes, for log-probabilities
    reasoning_format: str = "auto"  # auto: a thinking model's reasoning apart from its answer; none: inline

    @property
    def context(self) -> int | None:
        """The target's context size in tokens (None when unknown)."""
        return self.runtime.engine.target.max_length


def server_state(request: Request) -> ServerState:
    """The state of the app serving ``request`` (``create_app`` keeps it in ``app.state.server``)."""
    return request.app.state.server
