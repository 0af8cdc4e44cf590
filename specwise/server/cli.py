"""`specwise serve`: run the OpenAI-compatible server with uvicorn."""

from __future__ import annotations

import argparse
import sys

from specwise.extras import require

__all__ = ["cmd_serve", "register"]

LOG_LEVELS = ["critical", "error", "warning", "info", "debug"]


def register(subparsers) -> None:
    """Add the `serve` subcommand."""
    from specwise.cli import add_model_args

    p = subparsers.add_parser(
        "serve",
        help="serve an OpenAI-compatible HTTP API (completions, chat, streaming, Prometheus metrics)",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics.",
    )
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind, 0 for any free one (default: 8000)")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: the target's name)")
    p.add_argument(
        "--max-batch",
        type=int,
        default=16,
        help="requests generated together, sharing each target pass (default: 16; 1: one at a time)",
    )
    p.add_argument(
        "--max-queue", type=int, default=64, help="requests that may wait for the batch before HTTP 429 (default: 64)"
    )
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=None,
        help="token budget of requests that give none (default: rest of the context for chat, 16 for completions)",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's; 1 suits small shared CPUs)"
    )
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="uvicorn's log level (default: info)")
    p.set_defaults(func=cmd_serve)


def _check_args(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    if args.max_batch < 1:
        raise ValueError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.max_queue < 1:
        raise ValueError(f"--max-queue must be >= 1, got {args.max_queue}")
    if args.default_max_tokens is not None and args.default_max_tokens < 1:
        raise ValueError(f"--default-max-tokens must be >= 1, got {args.default_max_tokens}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")


def cmd_serve(args: argparse.Namespace) -> int:
    """Load the model, build the app and serve it until interrupted."""
    _check_args(args)
    require("server", "specwise serve")
    import uvicorn

    from specwise.runtime import build_runtime
    from specwise.server.app import create_app

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    runtime = build_runtime(args.target, args.drafter, args.gamma, args.device, args.impl, args.precision)
    app = create_app(
        runtime,
        model_name=args.served_model_name,
        max_queue=args.max_queue,
        default_max_tokens=args.default_max_tokens,
        max_batch=args.max_batch,
    )
    name = app.state.server.model_name
    print(
        f"specwise: serving {name!r} ({type(runtime.engine.target).__name__}, drafter {runtime.drafter_spec}, "
        f"gamma {args.gamma}, max batch {args.max_batch}, device {runtime.device}) "
        f"at http://{args.host}:{args.port}/v1",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0
