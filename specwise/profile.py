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
import time
from pathlib import Path

import torch

from specwise.files import profiles_dir, safe_name, write_json_atomic

__all__ = [
    "measure_forward",
    "cost_curve",
    "drafter_cost",
    "profile_path",
    "save_profile",
    "load_profile",
    "saved_cost_curve",
]


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def measure_forward(model, k: int, context: int = 64, repeats: int = 7) -> float:
    """Median seconds of one forward of ``k`` tokens after ``context`` cached tokens (the rows are rolled back)."""
    gen = torch.Generator().manual_seed(k)
    ids = torch.randint(0, model.vocab_size, (context + k,), generator=gen).to(model.device)
    model.reset()
    model.forward(ids[:context], num_logits=0)
    times = []
    for _ in range(repeats + 1):  # the first run warms up
        model.rollback(context)
        _sync(model.device)
        t0 = time.perf_counter()
        model.forward(ids[context:])
        _sync(model.device)
        times.append(time.perf_counter() - t0)
    model.reset()
    return statistics.median(times[1:])


def cost_curve(model, max_k: int = 16, repeats: int = 7, context: int = 64, rounds: int = 3) -> dict[int, float]:
    """Seconds per forward for k = 1 .. max_k after ``context`` cached tokens (``rounds`` interleaved rounds of
    about ``repeats / rounds`` timed forwards per k, median per k).

    Rounds: on a shared machine the speed drifts within seconds; each round measures every k in turn, so drift
    hits all k alike, and the median over rounds drops a disturbed round. Three profiles each with 3 rounds of 3
    and with 5 rounds of 3, interleaved on the development machine (float32 engine; the files are in git history
    at 580c369, benchmarks/results/profile_s10/), read c(2) = 1.04–1.27 against 1.06–1.14 but c(5) = 1.67–1.73 against
    1.35–1.56: no clear gain for 1.7 times the time, so 3 rounds stay the default.

    The context matters: attention over the cache grows with it, and extra rows cost more after a few hundred
    tokens than after a few dozen (on the development machine c(2) = 0.98 after 64 tokens and 1.09 after 256 with
    the float32 engine: profile_s4_cpu.json and profile_s8_cpu.json in git history at 580c369). Measure after a
    context like the ones decoding sees.
    """
    limit = getattr(model, "max_length", None)
    if limit is not None and context + max_k > limit:
        raise ValueError(
            f"a context of {context} tokens and {max_k} more do not fit the model's {limit}: lower --context"
        )
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    times: dict[int, list[float]] = {k: [] for k in range(1, max_k + 1)}
    for _ in range(rounds):
        for k in times:
            times[k].append(measure_forward(model, k, context=context, repeats=max(1, round(repeats / rounds))))
    return {k: statistics.median(v) for k, v in times.items()}


def drafter_cost(drafter, vocab_size: int, k: int = 4, context: int = 64, repeats: int = 5, target=None) -> float:
    """Median seconds per drafted token of ``drafter.propose`` (greedy) on a repetitive synthetic context, in the
    steady state of decoding: the drafter has already seen the context, as it has after the first step.

    A drafter that reads the target's features (the head) needs ``target``: the context is fed to it first.
    """
    from specwise.sampling import SamplingParams

    gen = torch.Generator().manual_seed(0)
    base = torch.randint(0, vocab_size, (context // 2,), generator=gen).tolist()
    ctx = base + base  # repeats, so that prompt lookup finds matches
    params = SamplingParams()
    times = []
    if getattr(drafter, "needs_features", False):
        if target is None:
            raise ValueError(f"drafter {drafter.name!r} reads the target's features: pass target=")
        target.reset()
        target.keep_features = True
        target.forward(torch.tensor(ctx[:-1], device=target.device), num_logits=0)
    drafter.begin(ctx)
    for _ in range(repeats + 1):  # the first proposal builds the drafter's state (index, cache) and is not counted
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
