"""A random-weight GGUF file with the shapes and block formats of a real model, to time a target this machine has no
weights for.

Question: what does a pass of Qwen2.5-7B-Instruct cost here, without its weights? Answer: 203 ms for one token,
c(2..9) 1.16–1.93 (benchmarks/results/profile_qwen7b_random_q8.json), the input of project_pair.py's projection.

The values are noise; what a pass costs depends on the bytes it reads and the shapes it multiplies, and those are
the real model's: every matrix has its shape and GGML block format, the tokenizer metadata is copied from a real
GGUF file of the same family (so ``specwise`` loads it as it loads the real one), and the vocabulary is padded to
the model's embedding rows with unused ``[PAD{id}]`` tokens as llama.cpp's converter pads it.

Block formats: the Q4_K_M mix. The output layer is Q6_K; ``attn_v`` and ``ffn_down`` are Q6_K in the layers where
the reference file (a real Q4_K_M file) has them in Q6_K, layer by layer (Qwen2.5-Coder-1.5B-Instruct-Q4_K_M has 28
layers, as Qwen2.5-7B does: layers 0, 1, 5-10, 13, 16, 19, 21, 24 and 27); every other matrix, the token
embedding included, is Q4_K; norms and biases are F32.

Blocks are random bytes with their float16 scales set to small finite values (a weight's spread about
1/sqrt(row length)), so that activations stay finite; norms are ones, biases zeros. Tensor data is written in
chunks of rows (the 7B file is ~4.7 GB; at most one chunk is held in memory).

    python benchmarks/experiments/random_gguf.py --shape qwen2.5-7b \\
        --tokenizer-from ~/.cache/specwise/gguf/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf \\
        --out ~/.cache/specwise/synthetic/Qwen2.5-7B-Instruct-random-Q4_K_M.gguf
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

__all__ = ["SHAPES", "Shape", "tensor_plan", "write_random_gguf", "main"]

CHUNK_BYTES = 64 << 20  # rows of a matrix written at a time


@dataclass(frozen=True)
class Shape:
    """The shapes of a qwen2-architecture model (what a GGUF file's metadata and tensor shapes say)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_base: float = 1e6
    rms_eps: float = 1e-6
    context: int = 32768
    tied: bool = False  # output layer tied to the embedding (no output.weight)


SHAPES = {
    # Qwen2.5-7B-Instruct's config.json: hidden_size 3584, 28 layers, 28 heads, 4 KV heads (head dim 128),
    # intermediate_size 18944, vocab_size 152064, rope_theta 1e6, rms_norm_eps 1e-6, untied lm_head
    "qwen2.5-7b": Shape("Qwen2.5-7B-Instruct", 3584, 28, 28, 4, 128, 18944, 152064),
    # Qwen2.5-1.5B-Instruct's (tied), for checking a random file against the real one
    "qwen2.5-1.5b": Shape("Qwen2.5-1.5B-Instruct", 1536, 28, 12, 2, 128, 8960, 151936, tied=True),
}

# bytes per block and values per block of the formats written
_BLOCK = {"Q4_K": (144, 256), "Q6_K": (210, 256), "F32": (4, 1)}


def tensor_plan(shape: Shape, q6k_layers: dict[str, set[int]]) -> list[tuple[str, tuple[int, ...], str]]:
    """(GGUF name, shape as (rows, row length) or (length,), GGML type) of every tensor, in writing order.
    q6k_layers: for ``attn_v`` and ``ffn_down``, the layers whose matrix is Q6_K."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    plan = [("token_embd.weight", (shape.vocab, h), "Q4_K")]
    for i in range(shape.layers):
        b = f"blk.{i}."

        def kind(role: str, i: int = i) -> str:
            return "Q6_K" if i in q6k_layers.get(role, set()) else "Q4_K"

        plan += [
            (b + "attn_norm.weight", (h,), "F32"),
            (b + "attn_q.weight", (q, h), "Q4_K"),
            (b + "attn_q.bias", (q,), "F32"),
            (b + "attn_k.weight", (kv, h), "Q4_K"),
            (b + "attn_k.bias", (kv,), "F32"),
            (b + "attn_v.weight", (kv, h), kind("attn_v")),
            (b + "attn_v.bias", (kv,), "F32"),
            (b + "attn_output.weight", (h, q), "Q4_K"),
            (b + "ffn_norm.weight", (h,), "F32"),
            (b + "ffn_gate.weight", (shape.ffn, h), "Q4_K"),
            (b + "ffn_up.weight", (shape.ffn, h), "Q4_K"),
            (b + "ffn_down.weight", (h, shape.ffn), kind("ffn_down")),
        ]
    plan.append(("output_norm.weight", (h,), "F32"))
    if not shape.tied:
        plan.append(("output.weight", (shape.vocab, h), "Q6_K"))
    for name, dims, kind_ in plan:
        if dims[-1] % _BLOCK[kind_][1]:
            raise ValueError(f"{name}: rows of {dims[-1]} values cannot be stored as {kind_} (blocks of 256)")
    return plan


def _row_bytes(dims: tuple[int, ...], kind: str) -> int:
    size, per = _BLOCK[kind]
    return dims[-1] // per * size


def _nbytes(dims: tuple[int, ...], kind: str) -> int:
    return (dims[0] if len(dims) == 2 else 1) * _row_bytes(dims, kind)


def _random_blocks(rng: np.random.Generator, n: int, kind: str, row_length: int) -> np.ndarray:
    """``n`` random blocks of ``kind`` as bytes [n, block bytes], float16 scales set so that a weight's spread is
    about 1 / sqrt(row_length) and its mean about 0."""
    size, _ = _BLOCK[kind]
    blocks = np.frombuffer(rng.bytes(n * size), dtype=np.uint8).reshape(n, size).copy()
    spread = 1.0 / math.sqrt(row_length)
    if kind == "Q4_K":  # d, dmin (float16), 12 bytes of 6-bit scales and mins, 128 bytes of 4-bit values
        # a weight is d * scale * q - dmin * min, scale and min ~ U(0, 63), q ~ U(0, 15): spread about 165 d
        d = np.float16(spread / 165.0)
        blocks[:, 0:4] = np.array([d, d * np.float16(8.0)], dtype=np.float16).view(np.uint8)
    else:  # Q6_K: 128 + 64 bytes of 6-bit values, 16 int8 scales, d (float16); a weight d * scale * (q - 32)
        d = np.float16(spread / 1370.0)
        blocks[:, 208:210] = np.array([d], dtype=np.float16).view(np.uint8)
    return blocks


def _chunks(rng: np.random.Generator, dims: tuple[int, ...], kind: str, name: str) -> Iterator[np.ndarray]:
    """The tensor's bytes, a chunk of rows at a time."""
    if kind == "F32":
        value = 0.0 if name.endswith(".bias") else 1.0
        yield np.full(dims, value, dtype=np.float32)
        return
    rows, row_bytes = dims[0], _row_bytes(dims, kind)
    per_row = dims[1] // _BLOCK[kind][1]
    step = max(1, CHUNK_BYTES // row_bytes)
    for start in range(0, rows, step):
        n = min(step, rows - start)
        yield _random_blocks(rng, n * per_row, kind, dims[1])


def reference_q6k_layers(reader) -> dict[str, set[int]]:
    """For ``attn_v`` and ``ffn_down``: the layers whose matrix the reference file stores as Q6_K."""
    out: dict[str, set[int]] = {"attn_v": set(), "ffn_down": set()}
    for t in reader.tensors:
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in out and t.tensor_type.name == "Q6_K":
            out[parts[2]].add(int(parts[1]))
    return out


def _copy_tokenizer(writer, reader, vocab: int) -> int:
    """Every ``tokenizer.*`` key of the reference, its token list padded to ``vocab`` with ``[PAD{id}]`` (type
    unused) as llama.cpp's converter pads a vocabulary to the embedding's rows. Returns the reference's count."""
    import gguf

    fields = {f.name: f for f in reader.fields.values() if f.name.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" not in fields:
        raise ValueError("the reference GGUF has no tokenizer.ggml.tokens: pass a real model's file")
    tokens = fields["tokenizer.ggml.tokens"].contents()
    if len(tokens) > vocab:
        raise ValueError(f"the reference has {len(tokens)} tokens, more than the shape's vocabulary ({vocab})")
    for name, field in fields.items():
        value = field.contents()
        main = field.types[0]
        sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        if name == "tokenizer.ggml.tokens":
            value = [*value, *(f"[PAD{i}]" for i in range(len(tokens), vocab))]
        elif name == "tokenizer.ggml.token_type":
            value = [*value, *([int(gguf.TokenType.UNUSED)] * (vocab - len(tokens)))]
        writer.add_key_value(name, value, main, sub_type=sub)
    return len(tokens)


def write_random_gguf(
    shape: Shape, reference: str | Path, out: str | Path, seed: int = 0, q6k_layers: dict[str, set[int]] | None = None
) -> dict:
    """Write a random-weight qwen2 GGUF of ``shape`` to ``out`` (atomically: a temporary file renamed), the
    tokenizer and the Q6_K layers of the Q4_K_M mix taken from ``reference`` (``q6k_layers``, where given, names
    the Q6_K layers of ``attn_v`` and ``ffn_down`` instead). Returns what was written."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(reference))
    except (ValueError, OSError) as err:
        raise ValueError(f"{reference} cannot be read as a GGUF file ({err}): pass a real model's GGUF") from err
    q6k = reference_q6k_layers(reader) if q6k_layers is None else q6k_layers
    plan = tensor_plan(shape, q6k)
    out = Path(out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), "qwen2")
    try:
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name(f"{shape.name} (random weights, Q4_K_M shapes)")
        writer.add_block_count(shape.layers)
        writer.add_context_length(shape.context)
        writer.add_embedding_length(shape.hidden)
        writer.add_feed_forward_length(shape.ffn)
        writer.add_head_count(shape.heads)
        writer.add_head_count_kv(shape.kv_heads)
        if shape.head_dim != shape.hidden // shape.heads:
            writer.add_key_length(shape.head_dim)
            writer.add_value_length(shape.head_dim)
        writer.add_rope_freq_base(shape.rope_base)
        writer.add_layer_norm_rms_eps(shape.rms_eps)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
        reference_tokens = _copy_tokenizer(writer, reader, shape.vocab)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        del reader  # its memory map is no longer needed
        for name, dims, kind in plan:
            if kind == "F32":
                writer.add_tensor_info(name, dims, np.dtype(np.float32), _nbytes(dims, kind))
            else:
                byte_shape = (dims[0], _row_bytes(dims, kind))
                writer.add_tensor_info(
                    name, byte_shape, np.dtype(np.uint8), _nbytes(dims, kind), gguf.GGMLQuantizationType[kind]
                )
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        fout = writer.fout[0]
        rng = np.random.default_rng(seed)
        for name, dims, kind in plan:
            writer.write_padding(fout, fout.tell())
            written = 0
            for chunk in _chunks(rng, dims, kind, name):
                chunk.tofile(fout)
                written += chunk.nbytes
            if written != _nbytes(dims, kind):  # the plan and the chunks disagree: a bug here, not in the input
                raise AssertionError(f"{name}: wrote {written} bytes, planned {_nbytes(dims, kind)}")
            writer.write_padding(fout, written)
        writer.close()
        os.replace(tmp, out)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    counts: dict[str, int] = {}
    for _, _, kind in plan:
        counts[kind] = counts.get(kind, 0) + 1
    return {
        "path": str(out),
        "bytes": out.stat().st_size,
        "shape": asdict(shape),
        "tensors_by_type": counts,
        "q6k_layers": {k: sorted(v) for k, v in q6k.items()},
        "reference": str(reference),
        "reference_tokens": reference_tokens,
        "seed": seed,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-7b")
    ap.add_argument("--tokenizer-from", required=True, help="a real GGUF file of the family (tokenizer, Q6_K mix)")
    ap.add_argument("--out", required=True, help="the GGUF file to write (not inside the repository)")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the model (a quick smoke run)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    reference = Path(args.tokenizer_from).expanduser()
    if not reference.is_file():
        print(
            f"error: {reference} is not a file: fetch one with "
            "`python -m specwise.lab.bench.fetch qwen2.5-coder-1.5b-instruct`",
            file=sys.stderr,
        )
        return 2
    shape = SHAPES[args.shape]
    if args.layers is not None:
        if args.layers < 1:
            print(f"error: --layers {args.layers}: give a count of at least 1", file=sys.stderr)
            return 2
        shape = replace(shape, layers=args.layers)
    try:
        info = write_random_gguf(shape, reference, args.out, seed=args.seed)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {info['path']}: {info['bytes'] / 1e9:.2f} GB, {info['tensors_by_type']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
