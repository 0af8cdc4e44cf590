"""`specwise profile`: the cost curve of a target and the cost of a drafter, measured on this machine.

c(k) = time(forward of k tokens) / time(forward of 1 token): speculation pays when a pass over gamma + 1 tokens
costs little more than a pass over one. A draft model of another vocabulary than the target's is also described:
the two vocabularies' overlap, and for each method (TLI, SLEM) its cost per drafted token and its acceptance on a
short greedy probe (:func:`cross_vocab_profile`). The profile is saved as JSON under the cache directory
(its format: :mod:`specwise.artifacts`), where the native model takes its choice of matrix-product backend per row
count from, and the runtime gives c(k) to the adaptive planner as its prior
(:func:`specwise.artifacts.saved_cost_curve`).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np

from specwise.artifacts import profile_path, save_profile

__all__ = ["PROBE_PROMPTS", "cmd_profile", "cost_curve", "cross_vocab_profile", "drafter_cost", "register"]

# the greedy probe of each cross-vocabulary method: a coding question and a prose one, PROBE_TOKENS new tokens each
PROBE_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number, with a docstring and a short example.",
    "Explain in a few sentences why the sky is blue.",
)
PROBE_TOKENS = 48
PROBE_GAMMA = 4


def _sync(device) -> None:
    """Wait for a CUDA device's queued work (only torch models run there, so torch is loaded then)."""
    torch = sys.modules.get("torch")
    if torch is not None and str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def _random_ids(high: int, n: int, seed: int = 0) -> np.ndarray:
    """``n`` token ids uniform in ``[0, high)``, the same on every machine (a seeded Philox generator)."""
    return np.random.Generator(np.random.Philox(seed)).integers(0, high, size=n, dtype=np.int64)


def _timed_forward(model, ids: np.ndarray, context: int, k: int) -> float:
    """Seconds of one forward of ``ids[context : context + k]`` after rolling the cache back to ``context``."""
    model.rollback(context)
    _sync(model.device)
    t0 = time.perf_counter()
    model.forward(ids[context : context + k])
    _sync(model.device)
    return time.perf_counter() - t0


def cost_curve(model, max_k: int = 16, repeats: int = 30, context: int = 64) -> dict[int, float]:
    """Seconds per forward for k = 1 .. max_k after ``context`` cached tokens: the median of ``repeats`` timed
    forwards per k, interleaved pass by pass (each sweep times every k once, in alternating order), after one
    untimed sweep.

    Interleaving: on a shared machine the speed drifts within seconds (the same 1-token pass took 4.2 to 6.5 ms in
    different processes on the development machine); timing every k in turn, pass by pass, makes the drift hit all
    k alike, so that the ratios c(k) = t(k) / t(1) hold even when the seconds move, and the median drops disturbed
    passes. The earlier design (a few passes of one k at a time, after a fresh prefill of the context for every k)
    read c(5) anywhere between 1.19 and 1.87 on the same build.

    The context matters: attention over the cache grows with it, and extra rows cost more after a few hundred
    tokens than after a few dozen. Measure after a context like the ones decoding sees.
    """
    limit = model.max_length
    if limit is not None and context + max_k > limit:
        raise ValueError(
            f"a context of {context} tokens and {max_k} more do not fit the model's {limit}: lower --context"
        )
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    ids = _random_ids(model.vocab_size, context + max_k)
    model.reset()
    model.forward(ids[:context], num_logits=0)
    ks = list(range(1, max_k + 1))
    for k in ks:  # warm-up sweep, not counted
        _timed_forward(model, ids, context, k)
    times: dict[int, list[float]] = {k: [] for k in ks}
    for sweep in range(repeats):
        for k in ks if sweep % 2 == 0 else ks[::-1]:
            times[k].append(_timed_forward(model, ids, context, k))
    model.reset()
    return {k: statistics.median(v) for k, v in times.items()}


def drafter_cost(drafter, vocab_size: int, k: int = 4, context: int = 64, repeats: int = 5, target=None) -> float:
    """Median seconds per drafted token of ``drafter.propose`` (greedy) on a repetitive synthetic context, in the
    steady state of decoding: the drafter has already seen the context, as it has after the first step.

    A drafter that reads the target's features (the head) or drafts in the target's cache (self) needs ``target``:
    the context is fed to it first, and what a proposal leaves past the target's length is discarded before the next
    (in decoding every step drafts new tokens; the same ones again would be found computed).
    """
    from specwise.sampling import SamplingParams

    base = _random_ids(vocab_size, context // 2).tolist()
    ctx = base + base  # repeats, so that prompt lookup finds matches
    params = SamplingParams()
    times = []
    if drafter.needs_features:
        if target is None:
            raise ValueError(f"drafter {drafter.name!r} reads the target's features: pass target=")
        target.reset()
        target.set_keep_features(True)
        target.forward(np.asarray(ctx[:-1], dtype=np.int64), num_logits=0)
    drafter.begin(ctx)
    for _ in range(repeats + 1):  # the first proposal builds the drafter's state (index, cache) and is not counted
        if target is not None:
            target.discard_past_length()
        t0 = time.perf_counter()
        draft = drafter.propose(ctx, k, params, None)
        times.append((time.perf_counter() - t0) / max(1, len(draft)))
    return statistics.median(times[1:])


def cross_vocab_profile(runtime, one_pass: float, tokens: int = PROBE_TOKENS) -> dict | None:
    """The runtime's draft model of another vocabulary (None: it has none), as ``CrossVocabDrafter.describe`` gives
    it, with ``methods``: for TLI and SLEM each, the seconds per drafted token (:func:`drafter_cost`), that cost
    relative to a one-token target pass (``one_pass`` seconds), and on PROBE_PROMPTS (greedy, ``tokens`` new tokens
    each, PROBE_GAMMA tokens drafted a step) the drafted and accepted tokens, α and τ."""
    from specwise.drafters.cross_vocab import CrossVocabDrafter
    from specwise.engine import Engine
    from specwise.metrics import SpecStats
    from specwise.runtime import encode_prompt, eos_ids
    from specwise.sampling import SamplingParams

    found = [d for d in runtime.engine.drafters if isinstance(d, CrossVocabDrafter)]
    if not found:
        return None
    drafter, model, tokenizer = found[0], runtime.target.model, runtime.tokenizer
    out = drafter.describe()
    prompts = [encode_prompt(tokenizer, text, chat=True) for text in PROBE_PROMPTS]
    methods = {}
    for method in ("tli", "slem"):
        one = CrossVocabDrafter(drafter.model, drafter.pair, drafter.target_vocab, method, drafter.lookahead)
        seconds = drafter_cost(one, model.vocab_size, target=model)
        engine = Engine(model, [one], PROBE_GAMMA, tokenizer, eos_ids(runtime.target))
        stats = SpecStats()
        for ids in prompts:
            stats.merge(engine.generate(ids, SamplingParams(), tokens).stats)
        methods[method] = {
            "seconds_per_token": seconds,
            "relative_cost": seconds / one_pass,
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "acceptance_rate": stats.acceptance_rate if stats.drafted else None,
            "mean_accepted_length": stats.mean_accepted_length,
        }
    out["methods"] = methods
    out["probe"] = {"prompts": len(prompts), "new_tokens": tokens, "gamma": PROBE_GAMMA, "greedy": True}
    return out


def _cross_vocab_lines(cross: dict) -> list[str]:
    """The printed report of :func:`cross_vocab_profile`'s result."""
    lines = [
        f"vocabularies: {cross['overlap']:.1%} of the draft's {cross['draft_tokens']:,} tokens are the target's "
        f"({cross['shared_tokens']:,} shared; the target has {cross['target_tokens']:,})"
    ]
    probe = cross["probe"]
    for method, m in cross["methods"].items():
        alpha = "–" if m["acceptance_rate"] is None else f"{m['acceptance_rate']:.3f}"
        lines.append(
            f"  {method}: {m['seconds_per_token'] * 1000:.3f} ms per token = {m['relative_cost']:.4f} of c(1); "
            f"greedy probe ({probe['prompts']} prompts, {probe['new_tokens']} tokens, gamma {probe['gamma']}): "
            f"alpha {alpha}, tau {m['mean_accepted_length']:.2f}"
        )
    return lines


def register(sub) -> None:
    """Add ``specwise profile`` to the command line's subparsers."""
    from specwise.cli import add_model_args

    prof = sub.add_parser("profile", help="measure the cost curve c(k) of the target and the drafter's cost")
    add_model_args(prof)
    prof.add_argument("--max-k", type=int, default=16, help="largest number of tokens per forward (default: 16)")
    prof.add_argument(
        "--repeats",
        type=int,
        default=30,
        help="timed forwards per k, interleaved over k = 1 .. max-k pass by pass; the median is kept (default: 30)",
    )
    prof.add_argument(
        "--context",
        type=int,
        default=256,
        help="tokens in the cache before each timed forward, like a prompt and part of an answer (default: 256)",
    )
    prof.add_argument("--json", action="store_true", help="print the profile as JSON")
    prof.set_defaults(func=cmd_profile)


def cmd_profile(args: argparse.Namespace) -> int:
    from specwise.models.threads import get_num_threads
    from specwise.runtime import build_runtime

    if not 1 <= args.max_k <= 32:
        raise ValueError(f"--max-k must be in 1..32, got {args.max_k}")
    if args.context < 1:
        raise ValueError(f"--context must be >= 1, got {args.context}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    runtime = build_runtime(
        args.target, args.drafter, args.gamma, args.device, args.impl, args.precision, args.attention, args.kv_cache
    )
    model = runtime.target.model
    backends: dict[str, dict[int, float]] = {}
    native = sys.modules.get("specwise.models.native")  # the float32 native model (torch): loaded only where used
    if native is not None and isinstance(model, native.NativeModel):
        for backend in native.GEMM_BACKENDS:
            if backend == "kernel" and not model.kernel_usable:
                continue
            model.set_gemm(default=backend)
            print(f"measuring forward passes with the {backend} backend ...", file=sys.stderr)
            backends[backend] = cost_curve(model, args.max_k, args.repeats, args.context)
        best = {k: min(backends, key=lambda b: backends[b][k]) for k in range(1, args.max_k + 1)}
        model.set_gemm(best, default=best[args.max_k])
        seconds = {k: backends[best[k]][k] for k in best}
    else:
        print("measuring forward passes ...", file=sys.stderr)
        seconds = cost_curve(model, args.max_k, args.repeats, args.context)
        best = {}
    # several drafters (ngram+head): the first, the one asked first each step
    drafter_s = drafter_cost(runtime.engine.drafters[0], model.vocab_size, target=model)
    data = {
        "model": runtime.target.name,
        "implementation": type(model).__name__,
        "device": runtime.device,
        "threads": get_num_threads(),
        "machine": platform.machine(),
        "context": args.context,
        "forward_seconds": {str(k): v for k, v in seconds.items()},
        "cost_curve": {str(k): v / seconds[1] for k, v in seconds.items()},
        "gemm": {str(k): v for k, v in best.items()},
        "backends": {b: {str(k): v for k, v in c.items()} for b, c in backends.items()},
        "drafter": runtime.drafter_spec,
        "drafter_seconds_per_token": drafter_s,
        "drafter_relative_cost": drafter_s / seconds[1],
        "cross_vocabulary": cross_vocab_profile(runtime, seconds[1]),
    }
    torch_version = _torch_version()
    if torch_version is not None:  # the hf extra is installed
        data["torch"] = torch_version
    from specwise.models.loader import profile_device

    path = profile_path(runtime.target.name, profile_device(runtime.device, model))
    save_profile(path, data)
    if args.json:
        print(json.dumps(data))
        return 0
    print(f"{runtime.target.name} ({data['implementation']}, {runtime.device}, {data['threads']} threads)")
    print(" k  forward ms   c(k)" + ("  backend" if best else ""))
    for k, v in seconds.items():
        print(f"{k:2d}  {v * 1000:10.1f}  {v / seconds[1]:5.2f}" + (f"  {best[k]}" if best else ""))
    relative = data["drafter_relative_cost"]
    print(f"drafter {runtime.drafter_spec}: {drafter_s * 1000:.3f} ms per token = {relative:.4f} of c(1)")
    if data["cross_vocabulary"] is not None:
        print("\n".join(_cross_vocab_lines(data["cross_vocabulary"])))
    print(f"saved to {path}")
    return 0


def _torch_version() -> str | None:
    """torch's version where the hf extra is installed (None without it), for the profile's record."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None
