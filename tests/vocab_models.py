"""Tiny random models around the real vocabularies users run: ``tests/fixtures/*.vocab.gguf.gz`` hold every
``tokenizer.*`` key of a real GGUF file (made by ``scripts/vocab_fixture.py``), and :func:`tiny_vocab_gguf` writes a
one-layer Llama with random weights around one of them, so that tool calls, FIM, reasoning and stop tokens are
tested on the real tokens, types, merges, special ids and chat template."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import gguf
import numpy as np

FIXTURES = Path(__file__).parent / "fixtures"
QWEN_VOCAB = FIXTURES / "qwen2.5-coder.vocab.gguf.gz"  # Qwen2.5-Coder-1.5B-Instruct's (Apache-2.0, the Qwen team)
GEMMA_VOCAB = FIXTURES / "gemma-3.vocab.gguf.gz"  # Gemma-3-270M's (Gemma terms of use; Google)
# Gemma 3's turn markers (the base model's file has no chat template): a template written for the tests
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}\n"
    "{{ m.content }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
QWEN3_TEMPLATE_FILE = FIXTURES / "qwen3-chat-template.jinja"
# Qwen3's vocabulary is Qwen2.5's with four added tokens in its padding slots
QWEN3_TOKENS = {151665: "<tool_response>", 151666: "</tool_response>", 151667: "<think>", 151668: "</think>"}


def qwen3_template() -> str:
    return QWEN3_TEMPLATE_FILE.read_text(encoding="utf-8").split("-#}\n", 1)[1]


def _reader(vocab: Path, tmp: Path) -> gguf.GGUFReader:
    if not vocab.name.endswith(".gz"):  # a GGUF file as it is (the default model's)
        return gguf.GGUFReader(str(vocab))
    plain = tmp / (vocab.name.removesuffix(".gz"))
    if not plain.exists():
        with gzip.open(vocab, "rb") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return gguf.GGUFReader(str(plain))


def tiny_vocab_gguf(
    path: Path,
    vocab: Path = QWEN_VOCAB,
    template: str | None = None,
    set_tokens: dict[int, str] | None = None,
    seed: int = 0,
    hidden: int = 32,
    context: int = 4096,
) -> Path:
    """A one-layer random Llama GGUF at ``path`` with the vocabulary of ``vocab`` (a fixture, or a GGUF file such as
    the default model's; its chat template, or
    ``template``; ``set_tokens``: tokens renamed and made user-defined, as Qwen3's added tokens)."""
    source = _reader(Path(vocab), Path(path).parent)

    def field(key: str):
        return source.fields[key].contents()

    tokens, types = list(field("tokenizer.ggml.tokens")), list(field("tokenizer.ggml.token_type"))
    for token_id, text in (set_tokens or {}).items():
        tokens[token_id], types[token_id] = text, gguf.TokenType.USER_DEFINED
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-real-vocab")
    writer.add_block_count(1)
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(2 * hidden)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(hidden // 4)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model(field("tokenizer.ggml.model"))
    writer.add_tokenizer_pre(field("tokenizer.ggml.pre"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if "tokenizer.ggml.merges" in source.fields:
        writer.add_token_merges(list(field("tokenizer.ggml.merges")))
    if "tokenizer.ggml.scores" in source.fields:
        writer.add_token_scores([float(x) for x in field("tokenizer.ggml.scores")])
    for key in source.fields:
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            writer.add_uint32(key, int(field(key)))
        elif key.startswith("tokenizer.ggml.add_"):
            writer.add_bool(key, bool(field(key)))
    chat = template if template is not None else field("tokenizer.chat_template")
    writer.add_chat_template(chat)
    rng = np.random.default_rng(seed)
    h, kv = hidden, hidden // 2
    shapes = {"token_embd.weight": (len(tokens), h), "output.weight": (len(tokens), h)}
    shapes |= {f"blk.0.attn_{x}.weight": (h if x in "q output" else kv, h) for x in ("q", "k", "v", "output")}
    shapes |= {"blk.0.ffn_gate.weight": (2 * h, h), "blk.0.ffn_up.weight": (2 * h, h)}
    shapes["blk.0.ffn_down.weight"] = (h, 2 * h)
    for name, shape in shapes.items():
        std = 0.5 if name in ("token_embd.weight", "output.weight") else 1 / np.sqrt(shape[1])
        dtype = np.float16 if shape[0] == len(tokens) else np.float32  # the vocabulary's rows in half: a smaller file
        writer.add_tensor(name, (rng.standard_normal(shape) * std).astype(dtype))
    for name in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        writer.add_tensor(name, np.ones(h, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
