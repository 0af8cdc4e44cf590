"""A cheaper variant of a draft model's GGUF file, to measure what it costs in acceptance before a kernel is built
for it: fewer bits for the draft's matrices, or fewer layers.

Question: would a 3-bit or a shallower draft model pay? Answer: no. The Qwen pair on 10 coding questions: the 0.5B
draft as it is 1.63× plain (acceptance 0.85), in 3 bits 1.50× (0.75), without layers 18–21 1.10× (0.60); a native
3-bit kind projected at most 1.64× (benchmarks/results/xeon_qwen15_draft_variants_coding/: report.md,
projection_3bit.json).

``--bits 3`` writes every matrix of the layers and the output layer with 3-bit values: per block of 32 weights a
float16 scale ``d`` and levels -4 .. 3, the scale chosen per block to minimise the squared error (the largest
weight mapped to -4 or to 3, and scales between). The blocks are stored in Q4_0's layout (levels + 8 in its 4-bit
fields), which the existing kernels read, so the file decodes exactly as a 3-bit kind would; only its size and
pass time are those of Q4_0. A native 3-bit kind would read 14 bytes per block instead of 18 (0.78x the bytes).

``--drop-layers A-B`` removes layers A .. B (inclusive) and renumbers the rest: a shallower draft whose pass time is
measured as it is (fewer layers, fewer bytes).

The tokenizer and every other key are copied; the embedding is kept as it is.

``--project RESULTS.json`` reads a ``specwise bench`` run and projects what a native 3-bit kind would give: each run
of a configuration whose drafter names ``--scale`` has its draft time multiplied by ``--byte-ratio`` (14 / 18: the
bytes a 3-bit block reads against Q4_0's; an upper bound on the saving, since a draft pass also does work that
does not scale with the weights' bytes), paired with plain's run of the same prompt and round as the bench pairs
them (geometric mean over rounds per prompt, then over prompts).

    python benchmarks/experiments/draft_variant.py \\
        --source ~/.cache/specwise/gguf/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf \\
        --bits 3 --out ~/.cache/specwise/variants/Qwen2.5-Coder-0.5B-Instruct-q3levels.gguf
    python benchmarks/experiments/draft_variant.py \\
        --project benchmarks/results/xeon_qwen15_draft_variants_coding/results.json \\
        --scale q3levels --out benchmarks/results/xeon_qwen15_draft_variants_coding/projection_3bit.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import numpy as np

__all__ = ["quantize_3bit_q4_0", "write_variant", "project", "main"]

BLOCK = 32
LEVELS_LOW, LEVELS_HIGH = -4, 3
# divisors of the block's signed largest weight tried for the scale: the largest weight lands on level -c
DIVISORS = (-4.0, -3.75, -3.5, -3.25, -3.0, 3.0, 3.25, 3.5)


def quantize_3bit_q4_0(weights: np.ndarray) -> np.ndarray:
    """Rows of float32 weights ``[rows, n]`` (n a multiple of 32) as Q4_0 bytes ``[rows, n / 32 * 18]`` whose values
    are 3-bit levels -4 .. 3 times each block's float16 scale (the scale of least squared error among ``DIVISORS``)."""
    rows, n = weights.shape
    if n % BLOCK:
        raise ValueError(f"rows of {n} weights are not whole blocks of {BLOCK}")
    blocks = weights.reshape(-1, BLOCK).astype(np.float32)
    which = np.argmax(np.abs(blocks), axis=1)
    largest = blocks[np.arange(blocks.shape[0]), which]
    best_err = np.full(blocks.shape[0], np.inf, dtype=np.float32)
    best_d = np.zeros(blocks.shape[0], dtype=np.float16)
    for c in DIVISORS:
        d = (largest / c).astype(np.float16)  # the scale as it will be stored
        d32 = d.astype(np.float32)
        safe = np.where(d32 == 0, 1.0, d32)
        q = np.clip(np.rint(blocks / safe[:, None]), LEVELS_LOW, LEVELS_HIGH)
        err = np.sum((blocks - q * d32[:, None]) ** 2, axis=1)
        better = err < best_err
        best_err[better] = err[better]
        best_d[better] = d[better]
    d32 = best_d.astype(np.float32)
    safe = np.where(d32 == 0, 1.0, d32)
    q = (np.clip(np.rint(blocks / safe[:, None]), LEVELS_LOW, LEVELS_HIGH) + 8).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)  # Q4_0: byte j holds weight j (low half) and weight j + 16 (high half)
    out = np.empty((blocks.shape[0], 18), dtype=np.uint8)
    out[:, :2] = best_d.view(np.uint8).reshape(-1, 2)
    out[:, 2:] = packed
    return out.reshape(rows, n // BLOCK * 18)


def _dropped(spec: str | None) -> set[int]:
    if not spec:
        return set()
    m = re.fullmatch(r"(\d+)(?:-(\d+))?", spec)
    if not m:
        raise ValueError(f"--drop-layers {spec!r}: give A or A-B (layer numbers)")
    first, last = int(m.group(1)), int(m.group(2) or m.group(1))
    if last < first:
        raise ValueError(f"--drop-layers {spec!r}: the range ends before it starts")
    return set(range(first, last + 1))


def write_variant(source: str | Path, out: str | Path, bits: int | None = None, drop: set[int] | None = None) -> dict:
    """Write the variant of ``source`` to ``out`` (atomically). Returns what was written."""
    import gguf
    from gguf.quants import dequantize

    from specwise.models.gguf_config import checked_file

    drop = drop or set()
    checked_file(source)  # sizes, offsets and shapes checked before the file is read (GGUFError: a ValueError)
    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    layers = int(reader.fields[f"{arch}.block_count"].contents())
    if drop and (max(drop) >= layers or len(drop) >= layers):
        raise ValueError(f"the file has {layers} layers: cannot drop {sorted(drop)}")
    kept = [i for i in range(layers) if i not in drop]
    renumber = {old: new for new, old in enumerate(kept)}
    out = Path(out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    converted, error = 0, []
    try:
        for field in reader.fields.values():
            if field.name.startswith("GGUF.") or field.name == "general.architecture":
                continue
            main = field.types[0]
            sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
            value = field.contents()
            if field.name == f"{arch}.block_count":
                value = len(kept)
            writer.add_key_value(field.name, value, main, sub_type=sub)
        for t in reader.tensors:
            name = t.name
            m = re.match(r"blk\.(\d+)\.(.*)", name)
            if m:
                if int(m.group(1)) in drop:
                    continue
                name = f"blk.{renumber[int(m.group(1))]}.{m.group(2)}"
            matrix = len(t.shape) == 2 and (m is not None or name == "output.weight")
            if bits == 3 and matrix and t.tensor_type not in (gguf.GGMLQuantizationType.F32,):
                weights = dequantize(t.data, t.tensor_type).astype(np.float32)
                packed = quantize_3bit_q4_0(weights)
                back = dequantize(packed, gguf.GGMLQuantizationType.Q4_0)
                error.append(float(np.sqrt(np.mean((back - weights) ** 2)) / (np.sqrt(np.mean(weights**2)) + 1e-12)))
                writer.add_tensor(name, packed, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
                converted += 1
            else:
                writer.add_tensor(name, t.data, raw_dtype=t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return {
        "source": str(source),
        "path": str(out),
        "bytes": out.stat().st_size,
        "bits": bits,
        "dropped_layers": sorted(drop),
        "layers": len(kept),
        "converted_matrices": converted,
        "relative_rms_error_median": float(np.median(error)) if error else None,
    }


def project(results: dict, scale: str, byte_ratio: float = 14 / 18) -> dict:
    """Paired speedups over plain of every configuration in a bench's ``results`` (the bench's pairing,
    ``paired_speedups``, on 1 / total seconds), as measured, and for those whose drafter names ``scale``, with their
    draft time multiplied by ``byte_ratio``."""
    from specwise.lab.bench.paired import paired_speedups

    if not 0 < byte_ratio <= 1:
        raise ValueError(f"--byte-ratio {byte_ratio}: give a fraction in (0, 1]")
    if not any(r["config"] == "specwise:none" for r in results["runs"]):
        raise ValueError("the results hold no plain runs (specwise:none) to pair with")
    drafters = {c["id"]: c["drafter"] for c in results["configurations"]}
    runs = []
    for r in results["runs"]:
        seconds = r["stats"]["total_seconds"]
        saved = r["stats"]["draft_seconds"] * (1 - byte_ratio) if scale in drafters[r["config"]] else 0.0
        keys = {k: r.get(k, 0) for k in ("config", "category", "prompt_id", "seed", "round")}
        runs.append({**keys, "measured": 1 / seconds, "projected": 1 / (seconds - saved), "stats": r["stats"]})
    out: dict[str, dict] = {}
    for config in results["configurations"]:
        if config["id"] == "specwise:none":
            continue
        measured = paired_speedups(runs, config["id"], "specwise:none", [], "measured")
        if not measured:
            continue
        projected = paired_speedups(runs, config["id"], "specwise:none", [], "projected")
        own = [r["stats"] for r in runs if r["config"] == config["id"]]
        out[config["label"]] = {
            "scaled": scale in config["drafter"],
            "paired_speedup_measured": measured[0]["geomean"],
            "paired_speedup_projected": projected[0]["geomean"],
            "draft_share_of_time": sum(st["draft_seconds"] for st in own) / sum(st["total_seconds"] for st in own),
        }
    return {"byte_ratio": byte_ratio, "scale": scale, "source_command": results.get("command"), "configurations": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", help="the draft model's GGUF file")
    parser.add_argument("--out", required=True, help="where to write the variant (or the projection's JSON)")
    parser.add_argument("--bits", type=int, choices=(3,), help="3: every matrix of the layers and the output in 3 bits")
    parser.add_argument("--drop-layers", help="A-B: remove layers A .. B (inclusive)")
    parser.add_argument("--project", help="a bench's results.json: project a native 3-bit kind instead")
    parser.add_argument("--scale", default="q3levels", help="with --project: the drafters whose time is scaled")
    parser.add_argument("--byte-ratio", type=float, default=14 / 18, help="with --project: the draft time's factor")
    args = parser.parse_args(argv)
    if args.project:
        try:
            projection = project(json.loads(Path(args.project).read_text()), args.scale, args.byte_ratio)
        except (ValueError, OSError, KeyError) as err:
            print(f"error: {args.project}: {err}", file=sys.stderr)
            return 2
        from specwise.lab.bench.runner import emit_json, script_header

        emit_json({**script_header(argv), **projection}, args.out)
        print(json.dumps(projection["configurations"], indent=1))
        return 0
    if not args.source:
        parser.error("give --source (a variant to write) or --project (a bench's results to project)")
    try:
        written = write_variant(args.source, args.out, args.bits, _dropped(args.drop_layers))
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(written, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
