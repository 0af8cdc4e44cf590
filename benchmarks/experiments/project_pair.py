"""A projection of speculative decoding's speedup for a target this machine has no weights for.

Question: what would the Qwen pair give past this machine, with Qwen2.5-7B-Instruct as the target? Answer: with
the 1.5B pair's acceptance by position, 7B + 0.5B projected 2.87× plain at γ 7, 2.31× calibrated by the 1.5B check
(projected 1.60×, measured 1.29×) (benchmarks/results/projection_qwen7b.json; docs/FIGURES.md "Past this machine").

The target is Qwen2.5-7B-Instruct (a random-weight file of its shapes, ``benchmarks/experiments/random_gguf.py``)
with the Qwen2.5-Coder-0.5B-Instruct draft model, from

- the target's measured pass times t(k) over k = 1 .. 9 tokens (``specwise profile --json``),
- the draft's measured cost per drafted token: ``drafter_seconds_per_token`` of a profile run with
  ``--drafter model:DRAFT`` (the check's: the 1.5B target with the 0.5B draft; a draft token costs the same whatever
  it drafts for; the 7B file cannot be profiled with the 0.5B draft, its 152,064 output rows differ from the
  draft's 151,936 and specwise refuses the pair), or ``--draft-profile``, a profile of the draft as a target (its
  t(1)),
- the real pair's measured acceptance by draft position (a ``specwise bench`` results.json of the 1.5B target with
  the 0.5B draft: ``accepted_by_position`` / ``drafted_by_position`` of one configuration).

For gamma = 1 .. 8 drafted tokens per step (positions 0 .. gamma - 1):

    E[tokens per step](gamma) = 1 + sum_{i < gamma} A_i
    A_i  = P(the first i + 1 drafted tokens are all accepted) = accepted_by_position[i] / drafted_by_position[i]
    cost(gamma) = gamma * draft token + t(gamma + 1)
    speedup(gamma) = E[tokens per step] * t(1) / cost(gamma)          (plain decoding: one token per t(1))

A_i is kept non-increasing; a position drafted fewer than ``--min-drafted`` times is extrapolated from the last
reliable one with the mean conditional acceptance A_i / A_{i-1} of the reliable positions (flagged in the output).
The same arithmetic on the 1.5B target's profile is the check: it is set beside the measured speedup of the run the
acceptance comes from; their ratio (the step overheads the model leaves out: the draft's catch-up over accepted
tokens, sampling, Python) is reported and applied to the 7B projection as a second, calibrated figure.

    specwise profile --target ~/.cache/specwise/synthetic/Qwen2.5-7B-Instruct-random-Q4_K_M.gguf --drafter none \\
        --max-k 9 --repeats 12 --json > benchmarks/results/profile_qwen7b_random_q8.json
    specwise profile --target ~/.cache/specwise/gguf/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf \\
        --drafter model:$HOME/.cache/specwise/gguf/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf \\
        --max-k 9 --repeats 12 --json > benchmarks/results/profile_qwen15_draft05_q8.json
    python benchmarks/experiments/project_pair.py \\
        --target-profile benchmarks/results/profile_qwen7b_random_q8.json \\
        --check-profile benchmarks/results/profile_qwen15_draft05_q8.json \\
        --acceptance benchmarks/results/qwen15_coding/results.json --category coding \\
        --out benchmarks/results/projection_qwen7b.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

__all__ = ["acceptance_curve", "expected_tokens", "project", "main"]


def acceptance_curve(
    drafted: list[int], accepted: list[int], positions: int = 8, min_drafted: int = 20
) -> tuple[list[float], list[bool]]:
    """(A_0 .. A_{positions-1}, extrapolated flags) from per-position counts: A_i = accepted[i] / drafted[i] where
    drafted[i] >= min_drafted, non-increasing; later positions extrapolated with the mean conditional rate."""
    if len(drafted) != len(accepted) or any(a > d or a < 0 for a, d in zip(accepted, drafted)):
        raise ValueError("acceptance counts: accepted_by_position must match drafted_by_position, each <= drafted")
    measured: list[float] = []
    for d, a in zip(drafted, accepted):
        if d < min_drafted:
            break
        rate = a / d
        measured.append(min(rate, measured[-1]) if measured else rate)
    if not measured:
        raise ValueError(f"no draft position was drafted {min_drafted} times: lower --min-drafted or use a longer run")
    conditional = [b / a for a, b in zip(measured, measured[1:]) if a > 0] or [measured[0]]
    rate = sum(conditional) / len(conditional)
    curve, flags = list(measured[:positions]), [False] * min(positions, len(measured))
    while len(curve) < positions:
        curve.append(curve[-1] * rate)
        flags.append(True)
    return curve, flags


def expected_tokens(curve: list[float], gamma: int) -> float:
    """Tokens a step emits on average when ``gamma`` tokens are drafted: the accepted ones and one from the target."""
    if gamma > len(curve):
        raise ValueError(f"gamma {gamma} is past the acceptance curve's {len(curve)} positions")
    return 1.0 + sum(curve[:gamma])


def project(pass_seconds: dict[int, float], draft_seconds: float, curve: list[float], gammas: list[int]) -> dict:
    """Per gamma: expected tokens per step, seconds per step and the speedup over plain decoding (one token per
    pass over 1 token); ``best`` is the gamma of the highest speedup. Gammas whose pass over gamma + 1 tokens was
    not measured are left out (listed in ``unmeasured``)."""
    plain = pass_seconds[1]
    rows, unmeasured = [], []
    for gamma in gammas:
        if gamma + 1 not in pass_seconds or gamma > len(curve):
            unmeasured.append(gamma)
            continue
        tokens = expected_tokens(curve, gamma)
        step = gamma * draft_seconds + pass_seconds[gamma + 1]
        rows.append(
            {
                "gamma": gamma,
                "expected_tokens_per_step": tokens,
                "cost_of_step_in_passes": step / plain,
                "seconds_per_step": step,
                "tokens_per_second": tokens / step,
                "speedup": tokens * plain / step,
            }
        )
    if not rows:
        raise ValueError("no gamma could be projected: profile the target with --max-k of at least 2")
    best = max(rows, key=lambda r: r["speedup"])
    return {
        "pass_seconds_1": plain,
        "plain_tokens_per_second": 1.0 / plain,
        "draft_seconds_per_token": draft_seconds,
        "draft_cost_in_passes": draft_seconds / plain,
        "by_gamma": rows,
        "unmeasured": unmeasured,
        "best": {"gamma": best["gamma"], "speedup": best["speedup"], "tokens_per_second": best["tokens_per_second"]},
    }


# ---- inputs -----------------------------------------------------------------------------------------------


def _read_json(path: str, what: str) -> dict:
    try:
        with open(Path(path).expanduser()) as fh:
            return json.load(fh)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(
            f"{what} {path} cannot be read ({err}): give the JSON file `specwise ... --json` wrote"
        ) from err


def read_profile(path: str) -> dict:
    """A ``specwise profile --json`` output: its pass times by k and, when profiled with a model drafter, the
    draft's seconds per token."""
    data = _read_json(path, "profile")
    if "forward_seconds" not in data:
        raise ValueError(f"{path} has no forward_seconds: give the output of `specwise profile --json`")
    passes = {int(k): float(v) for k, v in data["forward_seconds"].items()}
    if 1 not in passes:
        raise ValueError(f"{path} has no pass over 1 token: profile from k = 1")
    drafter = str(data.get("drafter") or "none")
    draft = data.get("drafter_seconds_per_token") if drafter.startswith("model:") else None
    return {
        "path": path,
        "model": data.get("model"),
        "command": data.get("command"),
        "threads": data.get("threads"),
        "context": data.get("context"),
        "drafter": drafter,
        "pass_seconds": passes,
        "cost_curve": {int(k): float(v) for k, v in (data.get("cost_curve") or {}).items()},
        "draft_seconds_per_token": draft,
    }


def _draft_seconds(profiles: list[dict | None], draft_profile: dict | None) -> tuple[float, str]:
    """The draft's seconds per token: --draft-profile's pass over 1 token, else the first of ``profiles`` made
    with a model drafter (a draft token costs the same whichever target it drafts for)."""
    if draft_profile is not None:
        return draft_profile["pass_seconds"][1], f"pass over 1 token of {draft_profile['path']}"
    for profile in profiles:
        if profile is not None and profile["draft_seconds_per_token"] is not None:
            return float(profile["draft_seconds_per_token"]), f"drafter_seconds_per_token of {profile['path']}"
    names = ", ".join(p["path"] for p in profiles if p is not None)
    raise ValueError(
        f"no draft cost: {names} were profiled without a model drafter: profile one with "
        "--drafter model:DRAFT.gguf, or give --draft-profile"
    )


def read_acceptance(path: str, category: str, config: str | None) -> dict:
    """The measured acceptance counts by position, and the measured speedups, of one configuration of a
    ``specwise bench`` results.json (by default the one drafting with a model alone)."""
    data = _read_json(path, "results")
    rows = [s for s in data.get("summary", []) if s.get("category") == category]
    if not rows:
        raise ValueError(f"{path} has no summary for category {category!r}: pick one it has (e.g. all, coding)")
    if config is None:
        chosen = [s for s in rows if ":model:" in s["config"] and "+" not in s["config"]]
    else:
        chosen = [s for s in rows if config in s["config"]]
    if len(chosen) != 1:
        names = ", ".join(s["config"] for s in rows)
        raise ValueError(f"--config must name exactly one configuration of {path} (found {len(chosen)}): {names}")
    row = chosen[0]
    plain = next((s for s in rows if s["config"].endswith(":none")), None)
    stats = row["stats"]
    decode = None
    if plain and plain.get("decode_tokens_per_second_median") and row.get("decode_tokens_per_second_median"):
        decode = row["decode_tokens_per_second_median"] / plain["decode_tokens_per_second_median"]
    return {
        "path": path,
        "command": data.get("command"),
        "cpu": (data.get("machine") or {}).get("cpu"),
        "config": row["config"],
        "category": category,
        "drafted_by_position": stats["drafted_by_position"],
        "accepted_by_position": stats["accepted_by_position"],
        "gamma_histogram": stats.get("gamma_histogram"),
        "mean_accepted_length": row.get("mean_accepted_length"),
        "measured_speedup_vs_plain": row.get("speedup_vs_plain"),
        "measured_decode_speedup_vs_plain": decode,
    }


# ---- the projection ---------------------------------------------------------------------------------------


def run(args) -> dict:
    from specwise.lab.bench.runner import script_header

    target = read_profile(args.target_profile)
    check = read_profile(args.check_profile) if args.check_profile else None
    draft_profile = read_profile(args.draft_profile) if args.draft_profile else None
    acceptance = read_acceptance(args.acceptance, args.category, args.config)
    curve, flags = acceptance_curve(
        acceptance["drafted_by_position"], acceptance["accepted_by_position"], max(args.gammas), args.min_drafted
    )
    draft, draft_source = _draft_seconds([target, check], draft_profile)
    result = {
        **script_header(args.argv),
        "inputs": {"target_profile": target, "draft_profile": draft_profile, "acceptance": acceptance},
        "acceptance_curve": curve,
        "acceptance_extrapolated": flags,
        "draft_seconds_source": draft_source,
        "projection": project(target["pass_seconds"], draft, curve, args.gammas),
    }
    result["notes"] = _notes(target, check, acceptance)
    if check is not None:
        check_draft, check_source = _draft_seconds([check, target], draft_profile)
        projected = project(check["pass_seconds"], check_draft, curve, args.gammas)
        measured = acceptance["measured_decode_speedup_vs_plain"] or acceptance["measured_speedup_vs_plain"]
        ratio = measured / projected["best"]["speedup"] if measured else None
        result["check"] = {
            "profile": check,
            "draft_seconds_source": check_source,
            "projection": projected,
            "measured_speedup": measured,
            "measured_over_projected": ratio,
        }
        if ratio is not None:
            result["projection"]["calibrated_best_speedup"] = result["projection"]["best"]["speedup"] * ratio
    return result


def _notes(target: dict, check: dict | None, acceptance: dict) -> list[str]:
    """Where the inputs were not measured alike (the projection then mixes conditions)."""
    notes = []
    if check is not None:
        for key in ("threads", "context"):
            if target.get(key) != check.get(key):
                notes.append(f"{key} differ: target profile {target.get(key)}, check profile {check.get(key)}")
    if acceptance.get("gamma_histogram"):
        notes.append(
            "the acceptance comes from a run whose gamma was chosen per step (histogram in inputs.acceptance): "
            "a position is counted only in steps that drafted that far"
        )
    return notes


def _summary(result: dict) -> str:
    p = result["projection"]
    lines = [
        f"target t(1) {p['pass_seconds_1'] * 1e3:.1f} ms, draft token {p['draft_seconds_per_token'] * 1e3:.1f} ms "
        f"({p['draft_cost_in_passes']:.2f} of a pass); acceptance "
        + " ".join(
            f"{a:.2f}{'*' if x else ''}" for a, x in zip(result["acceptance_curve"], result["acceptance_extrapolated"])
        ),
        "  ".join(f"g{r['gamma']} {r['speedup']:.2f}x" for r in p["by_gamma"]),
        f"projected best: gamma {p['best']['gamma']}, {p['best']['speedup']:.2f}x plain",
    ]
    if "check" in result:
        c = result["check"]
        lines.append(
            f"check (1.5B): projected {c['projection']['best']['speedup']:.2f}x at gamma "
            f"{c['projection']['best']['gamma']}, measured {c['measured_speedup'] or float('nan'):.2f}x"
        )
        if "calibrated_best_speedup" in p:
            lines.append(f"calibrated by the check: {p['calibrated_best_speedup']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from specwise.lab.bench.runner import emit_json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target-profile", required=True, help="`specwise profile --json` of the target to project")
    ap.add_argument("--check-profile", default=None, help="the same for the target the acceptance was measured on")
    ap.add_argument("--draft-profile", default=None, help="a profile of the draft as a target (its t(1) is a token)")
    ap.add_argument("--acceptance", required=True, help="a `specwise bench` results.json of the real pair")
    ap.add_argument("--category", default="coding")
    ap.add_argument("--config", default=None, help="a substring naming one configuration (default: model: alone)")
    ap.add_argument("--gammas", nargs="+", type=int, default=list(range(1, 9)))
    ap.add_argument("--min-drafted", type=int, default=20, help="fewer drafts at a position: extrapolated")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if any(g < 1 for g in args.gammas):
        print("error: --gammas must be 1 or more", file=sys.stderr)
        return 2
    try:
        result = run(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    emit_json(result, args.out)
    print(_summary(result), file=sys.stderr)
    return 0 if all(math.isfinite(r["speedup"]) for r in result["projection"]["by_gamma"]) else 1


if __name__ == "__main__":
    sys.exit(main())
