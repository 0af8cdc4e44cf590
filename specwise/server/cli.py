"""`specwise serve`: run the OpenAI-compatible server with uvicorn."""

from __future__ import annotations

import argparse
import gc
import re
import sys

from specwise.extras import require
from specwise.server.options import API_KEY_ENV, api_key

__all__ = ["api_key", "cmd_serve", "parse_size", "register"]

LOG_LEVELS = ["critical", "error", "warning", "info", "debug"]
_SIZE = re.compile(r"^(\d+)([kmg]?)(?:i?b)?$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(text: str) -> int:
    """A size in bytes: ``1048576``, ``512k``, ``4M``, ``1GiB`` (units of 1024; argparse type)."""
    found = _SIZE.match(text.strip())
    if found is None:
        raise argparse.ArgumentTypeError(f"must be a number of bytes such as 1048576, 512k or 4M, got {text!r}")
    size = int(found.group(1)) * _UNITS[found.group(2).lower()]
    if size < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return size


def register(subparsers) -> None:
    """Add the `serve` subcommand."""
    from specwise.cli import add_model_args

    p = subparsers.add_parser(
        "serve",
        help="serve an OpenAI- and Anthropic-compatible HTTP API (chat, Responses, Messages, completions, streaming)",
        description="Serve /v1/chat/completions, /v1/responses, /v1/messages (and count_tokens), /v1/completions, "
        "/infill, /v1/models, /health and /metrics.",
    )
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind, 0 for any free one (default: 8000)")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: the target's name)")
    _add_batch_args(p)
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=None,
        help="token budget of requests that give none (default: rest of the context for chat, 16 for completions)",
    )
    p.add_argument(
        "--max-body-bytes",  # limits.MAX_BODY_FLAG (not imported: the server's modules load when it starts)
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="larger request bodies get HTTP 413 before they are read: bytes, or with k, M, G (units of 1024; "
        "default: 1M, or 16 bytes per token of the model's context where that is more)",
    )
    p.add_argument(
        "--reasoning-format",
        choices=("auto", "none"),
        default="auto",
        help="auto: a thinking model's reasoning (Qwen3's <think>) apart from its answer (reasoning_content, "
        "Responses' reasoning items, Messages' thinking blocks); none: left inline in the text (default: auto)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads of the model's passes (default: the cores this process may run on; 1 suits small shared "
        "CPUs)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help=f"require 'Authorization: Bearer KEY' on every route but /health (default: ${API_KEY_ENV} if set, "
        "else no key; the variable keeps the key out of the process list)",
    )
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="uvicorn's log level (default: info)")
    _add_cluster_args(p)
    p.set_defaults(func=cmd_serve)


def _add_batch_args(p: argparse.ArgumentParser) -> None:
    """The batch's options: its size, its queue, how long prompts share steps, the memory of kept caches."""
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
        "--max-step-seconds",
        type=float,
        default=0.4,  # batch.MAX_STEP_SECONDS (not imported: the engine loads when the server starts)
        metavar="SECONDS",
        help="while a long prompt is read, a step in which other requests stream takes at most this long: the "
        "prompt is fed in slices chosen by their measured cost (default: 0.4)",
    )
    p.add_argument(
        "--prefill-share",
        type=float,
        default=0.4,  # batch.PREFILL_SHARE
        metavar="SHARE",
        help="the share of the time such a prompt takes while other requests stream, which keep about 1 - SHARE of "
        "their rate (default: 0.4)",
    )
    p.add_argument(
        "--cache-memory",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="memory the batch's caches may hold, finished requests' kept for their next turn (least recently used "
        "dropped first): bytes, or with k, M, G (default: a quarter of the machine's memory)",
    )


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    """The options of serving on a Ray cluster."""
    cluster = p.add_argument_group("Ray cluster (docs/SCALING.md; needs pip install 'specwise[cluster]')")
    cluster.add_argument(
        "--ray",
        action="store_true",
        help="serve as a Ray Serve application: replicas of this server behind one endpoint (--threads per replica)",
    )
    cluster.add_argument(
        "--address", default=None, help="the Ray cluster to join, e.g. HEAD:6379 (default: start one on this machine)"
    )
    cluster.add_argument("--replicas", type=int, default=1, help="replicas (the least, with --max-replicas; default 1)")
    cluster.add_argument(
        "--max-replicas",
        type=int,
        default=None,
        help="autoscale between --replicas and this on the requests each replica has (default: a fixed number)",
    )
    cluster.add_argument(
        "--gateways", type=int, default=1, help="replicas of the gateway that forwards requests (default 1)"
    )


def _check_args(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    if args.max_batch < 1:
        raise ValueError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.max_queue < 1:
        raise ValueError(f"--max-queue must be >= 1, got {args.max_queue}")
    if not args.max_step_seconds > 0:
        raise ValueError(f"--max-step-seconds must be > 0, got {args.max_step_seconds}")
    if not 0 < args.prefill_share < 1:
        raise ValueError(f"--prefill-share must be between 0 and 1, got {args.prefill_share}")
    if args.default_max_tokens is not None and args.default_max_tokens < 1:
        raise ValueError(f"--default-max-tokens must be >= 1, got {args.default_max_tokens}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError(f"--api-key must not be empty (leave it out, and {API_KEY_ENV} unset, to serve without a key)")
    if not args.ray:
        given = [flag for flag, value in _CLUSTER_FLAGS.items() if getattr(args, value) != _CLUSTER_DEFAULTS[value]]
        if given:
            raise ValueError(f"{given[0]} applies to a Ray cluster: add --ray (see docs/SCALING.md)")


_CLUSTER_FLAGS = {"--address": "address", "--replicas": "replicas", "--max-replicas": "max_replicas"}
_CLUSTER_FLAGS["--gateways"] = "gateways"
_CLUSTER_DEFAULTS = {"address": None, "replicas": 1, "max_replicas": None, "gateways": 1}


def cmd_serve(args: argparse.Namespace) -> int:
    """Load the model, build the app and serve it until interrupted (with --ray: deploy it on a Ray cluster)."""
    _check_args(args)
    if args.ray:
        from specwise.server.ray import cmd_serve_ray  # Ray is imported there (a missing one named: [cluster])

        return cmd_serve_ray(args)
    require("server", "specwise serve")
    import uvicorn

    from specwise.runtime import build_runtime
    from specwise.server.app import serving_app
    from specwise.server.auth import exposure_warning

    if args.threads is not None:
        from specwise.models.threads import set_num_threads

        set_num_threads(args.threads)
    key = api_key(args)
    runtime = build_runtime(
        args.target, args.drafter, args.gamma, args.device, args.impl, args.precision, args.attention, args.kv_cache
    )
    app = serving_app(runtime, args, key)
    state = app.state.server
    print(
        f"specwise: serving {state.model_name!r} ({type(runtime.engine.target).__name__}, drafter "
        f"{runtime.drafter_spec}, gamma {args.gamma}, max batch {args.max_batch}, request bodies up to "
        f"{state.max_body_bytes} bytes, device {runtime.device}, API key {'required' if key else 'not required'}) "
        f"at http://{args.host}:{args.port}/v1",
        file=sys.stderr,
        flush=True,
    )
    warning = exposure_warning(args.host, args.port, key)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)
    # the model's objects live as long as the process: the collector need not scan them again, which makes parsing
    # a body of many small JSON arrays or objects (on the event loop) several times faster
    gc.collect()
    gc.freeze()
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0
