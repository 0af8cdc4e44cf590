"""The bfloat16 attention (``QuantizedModel(..., attention="bfloat16")``) against the float32 one on a GGUF file:
one layer's attention alone, whole prompts read, and greedy agreement.

- ``--alone P ...``: one layer's attention for a slice of ``MAX_ROWS`` rows after P positions, random queries, keys
  and values of the model's shape, the float32 and the bfloat16 tiled loops interleaved (the best of ``--repeats``
  each): one thread's CPU time and ``--threads`` threads' wall time.
- ``--lengths N ...``: each prompt (the first N tokens of ``--corpus``) read from an empty cache in slices of
  ``MAX_ROWS`` rows, float32 and bfloat16 interleaved ``--repeats`` times, with the kernels' split of the layers'
  time (products, attention, the rest).
- ``--agreement N``: the first N tokens of ``--corpus`` read in slices with every row's logits kept, in both: the
  share of positions whose greedy (top-1) token is the same, and at those where it is not, float32's margin between
  its own top token and bfloat16's (how close a call it was).

Both attentions run on one loaded model (the layer stack's run options switch between them), so the weights and
the machine are the same for both. Needs a CPU with AVX512_BF16.

    python benchmarks/attention_bf16.py --target qwen.gguf --corpus tinyshakespeare.txt --alone 1024 4096 8192 \\
        --lengths 4096 8192 --agreement 4096 --out bf16.json
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prefill_lengths import corpus_tokens, lscpu, specwise_slices  # noqa: E402

from specwise.lab.bench.environment import emit_json, load_average, script_header  # noqa: E402
from specwise.models.threads import set_num_threads  # noqa: E402

ATTENTIONS = ("float32", "bfloat16")


def use(model, attention: str) -> None:
    """Run the model's next passes with this attention (the stack's run options), from an empty cache that no pass
    reuses (what the other attention wrote is not taken back)."""
    model.reset()
    model.discard_past_length()
    model._stack.options.attention = ATTENTIONS.index(attention)


def alone(stack, positions: int, rows: int, attention: str, threads: int, data: dict) -> tuple[float, float]:
    """(thread CPU seconds, wall seconds) of one layer's attention of a slice of ``rows`` rows after ``positions``."""
    from specwise.models.kernels.abi import QRows, QRun, QShape, QWork

    heads, kv, hd = stack.n_heads, stack.n_kv, stack.head_dim
    cap = positions + rows
    if data.get("positions") != positions:
        rng = np.random.default_rng(positions)
        data.clear()
        data["positions"] = positions
        # keys of about 2 / sqrt(hd): scores of a few units, as in the kernels' tests
        data["k"] = (rng.standard_normal((1, kv, cap, hd)) * 2.0 / np.sqrt(hd)).astype(np.float32)
        data["v"] = rng.standard_normal((1, kv, cap, hd)).astype(np.float32)
        data["qkv"] = rng.standard_normal((rows, (heads + 2 * kv) * hd)).astype(np.float32)
        data["scores"] = np.ones(heads * rows * cap, dtype=np.float32)
        data["attn"] = np.zeros((rows, heads * hd), dtype=np.float32)
    k_rows = (ctypes.c_void_p * rows)(*[data["k"].ctypes.data] * rows)
    v_rows = (ctypes.c_void_p * rows)(*[data["v"].ctypes.data] * rows)
    caps = (ctypes.c_int64 * rows)(*[cap] * rows)
    pos = (ctypes.c_int64 * rows)(*range(positions, cap))
    qrows = QRows()
    qrows.rows, qrows.kv_half = rows, 0
    qrows.k_rows, qrows.v_rows = ctypes.addressof(k_rows), ctypes.addressof(v_rows)
    qrows.cap, qrows.pos = ctypes.addressof(caps), ctypes.addressof(pos)
    shape = QShape(1, stack.hidden, heads, kv, hd, stack.intermediate, 1e-5)
    work = QWork(None, 0, data["scores"].ctypes.data, data["scores"].size)
    run = QRun(threads, 0, ATTENTIONS.index(attention))
    cpu, wall = time.thread_time(), time.perf_counter()
    status = stack._lib.specwise_qllama_attention(
        ctypes.byref(shape), ctypes.byref(qrows), 0, 0, float(1 / np.sqrt(hd)), data["qkv"].ctypes.data,
        data["attn"].ctypes.data, ctypes.byref(work), ctypes.byref(run), -1,
    )  # fmt: skip
    if status != 0:
        raise SystemExit(f"error: specwise_qllama_attention returned {status}")
    return time.thread_time() - cpu, time.perf_counter() - wall


def alone_ab(stack, positions: int, rows: int, threads: int, repeats: int) -> dict:
    """Both attentions alone after ``positions``, interleaved, on one thread (CPU time) and ``threads`` (wall)."""
    data: dict = {}
    entry: dict = {"positions": positions, "rows": rows}
    for n in sorted({1, threads}):
        best = {a: [float("inf"), float("inf")] for a in ATTENTIONS}
        for _ in range(repeats):
            for a in ATTENTIONS:
                cpu, wall = alone(stack, positions, rows, a, n, data)
                best[a] = [min(best[a][0], cpu), min(best[a][1], wall)]
        key, i = ("cpu_s", 0) if n == 1 else ("wall_s", 1)
        f32, b16 = best["float32"][i], best["bfloat16"][i]
        entry[f"threads_{n}"] = {f"float32_{key}": f32, f"bfloat16_{key}": b16, "bfloat16_time_ratio": b16 / f32}
        print(f"attention alone after {positions}, {n} thread(s): bfloat16 {b16 / f32:.2f}x float32", flush=True)
    return entry


def agreement(model, ids: list[int], rows: int) -> dict:
    """Greedy agreement of bfloat16 with float32 over every position of one prompt read in slices."""
    use(model, "bfloat16")
    top_b = np.concatenate([model.forward(ids[lo : lo + rows]).argmax(-1) for lo in range(0, len(ids), rows)])
    use(model, "float32")
    top_f, margins = [], []
    for lo in range(0, len(ids), rows):
        logits = model.forward(ids[lo : lo + rows])
        best = logits.argmax(-1)
        other = top_b[lo : lo + len(best)]
        for r in np.nonzero(best != other)[0]:
            margins.append(float(logits[r, best[r]] - logits[r, other[r]]))
        top_f.append(best)
    top_f = np.concatenate(top_f)
    same = int((top_f == top_b).sum())
    return {
        "positions": len(ids),
        "same_top1": same,
        "agreement": same / len(ids),
        "float32_margin_where_different": sorted(margins),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="a .gguf file")
    ap.add_argument("--corpus", help="a text file the prompts are cut from (--lengths, --agreement)")
    ap.add_argument("--alone", type=int, nargs="*", default=[], metavar="POSITIONS")
    ap.add_argument("--lengths", type=int, nargs="*", default=[])
    ap.add_argument("--agreement", type=int, default=0, metavar="TOKENS")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    header = script_header(argv)
    header["lscpu"] = lscpu()

    from specwise.models import load_model
    from specwise.models.kernels.quant import MAX_ROWS, attention_bf16_supported

    if not attention_bf16_supported():
        raise SystemExit("error: the bfloat16 attention needs a CPU with AVX512_BF16")
    set_num_threads(args.threads)
    loaded = load_model(args.target, precision="q8")
    model = loaded.model
    model.governor.set_fixed(True)  # every pass on --threads threads
    result: dict = {**header, "target": Path(args.target).name, "threads": args.threads, "max_rows": MAX_ROWS}
    result["alone"] = [alone_ab(model._stack, p, MAX_ROWS, args.threads, args.repeats) for p in args.alone]
    longest = max(args.lengths + [args.agreement])
    ids = corpus_tokens(loaded.tokenizer, Path(args.corpus), longest) if longest else []
    result["corpus"] = Path(args.corpus).name if args.corpus else None
    result["lengths"] = []
    for n in args.lengths:
        runs: dict = {a: [] for a in ATTENTIONS}
        for _ in range(args.repeats):
            for a in ATTENTIONS:
                use(model, a)
                runs[a].append(specwise_slices(model, ids[:n], MAX_ROWS))
                print(f"{n} tokens, {a}: {runs[a][-1]['seconds']:.1f} s", flush=True)
        best = {a: min(r["seconds"] for r in runs[a]) for a in ATTENTIONS}
        result["lengths"].append(
            {"tokens": n, "runs": runs, "best_seconds": best, "bfloat16_time_ratio": best["bfloat16"] / best["float32"]}
        )
    if args.agreement:
        result["agreement"] = agreement(model, ids[: args.agreement], MAX_ROWS)
        print(f"greedy agreement over {args.agreement} positions: {result['agreement']['agreement']:.4f}", flush=True)
    result["load_average_end"] = load_average()
    emit_json(result, args.out)


if __name__ == "__main__":
    main()
