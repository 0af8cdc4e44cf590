"""Cost curve of a target and cost of a drafter, measured on this machine.

c(k) = time(forward of k tokens) / time(forward of 1 token): speculation pays when a pass over gamma + 1 tokens
costs little more than a pass over one. The profile is saved as JSON under the cache directory, where the
native model takes its choice of matrix-product backend per row count from, and the runtime gives c(k) to the
adaptive planner as its prior (:func:`saved_cost_curve`).
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from specwise.files import profiles_dir, safe_name, write_json_atomic

__all__ = [
    "cost_curve",
    "drafter_cost",
    "profile_path",
    "save_profile",
    "load_profile",
    "saved_cost_curve",
]


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
    limit = getattr(model, "max_length", None)
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
    if getattr(drafter, "needs_features", False):
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


def profile_path(model_name: str, device: str) -> Path:
    safe = safe_name(model_name)
    return profiles_dir() / f"{safe}-{device.replace(':', '')}-{platform.machine()}.json"


def save_profile(path: Path, data: dict) -> None:
    """Write JSON atomically."""
    write_json_atomic(path, data)


def load_profile(model_name: str, device: str) -> dict | None:
    path = profile_path(model_name, device)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def saved_cost_curve(model_name: str, device: str, implementation: str | None = None) -> dict[int, float] | None:
    """The cost curve c(k) that `specwise profile` saved for ``model_name`` on ``device`` (the key of
    ``specwise.models.loader.profile_device``), the adaptive planner's prior; None when no usable profile was
    saved, or (given ``implementation``, a model class name) when it measured another implementation."""
    profile = load_profile(model_name, device) or {}
    if implementation is not None and profile.get("implementation", implementation) != implementation:
        return None
    try:
        curve = {int(k): float(v) for k, v in (profile.get("cost_curve") or {}).items()}
    except (ValueError, TypeError, AttributeError):
        return None
    return curve if curve and all(v > 0 for v in curve.values()) else None
