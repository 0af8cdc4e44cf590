"""Write a vocabulary-only copy of a GGUF file: its architecture and every ``tokenizer.*`` key (tokens, token types,
merges, special ids, chat template), no tensors, gzipped. The tests build tiny random models around such copies so
that tool calls, FIM, reasoning and stop tokens are tested on the real vocabularies users run.

    python scripts/vocab_fixture.py MODEL.gguf tests/fixtures/NAME.vocab.gguf.gz [--set-token ID TEXT ...]
        [--chat-template FILE]

``--set-token`` renames a token and makes it a user-defined token (a vocabulary of the same family with a few added
tokens, e.g. Qwen3's ``<think>`` in Qwen2.5's padding slots); ``--chat-template`` replaces the template (the text
after a leading ``{#- ... -#}`` comment).
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import tempfile
from pathlib import Path

import gguf


def _value(field: gguf.ReaderField):
    return field.contents()


def write_vocab(source: Path, out: Path, set_tokens: dict[int, str], template: str | None) -> None:
    reader = gguf.GGUFReader(str(source))
    arch = _value(reader.fields["general.architecture"])
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "vocab.gguf"
        writer = gguf.GGUFWriter(str(plain), arch)
        writer.add_name(f"{_value(reader.fields['general.name'])} (vocabulary only)")
        tokens = list(_value(reader.fields["tokenizer.ggml.tokens"]))
        types = list(_value(reader.fields["tokenizer.ggml.token_type"]))
        for token_id, text in set_tokens.items():
            tokens[token_id], types[token_id] = text, gguf.TokenType.USER_DEFINED
        writer.add_tokenizer_model(_value(reader.fields["tokenizer.ggml.model"]))
        if "tokenizer.ggml.pre" in reader.fields:
            writer.add_tokenizer_pre(_value(reader.fields["tokenizer.ggml.pre"]))
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        if "tokenizer.ggml.merges" in reader.fields:
            writer.add_token_merges(list(_value(reader.fields["tokenizer.ggml.merges"])))
        if "tokenizer.ggml.scores" in reader.fields:
            writer.add_token_scores([float(x) for x in _value(reader.fields["tokenizer.ggml.scores"])])
        for key, field in reader.fields.items():
            name = key.removeprefix("tokenizer.ggml.")
            if key.startswith("tokenizer.ggml.") and name.endswith("_token_id"):
                writer.add_uint32(key, int(_value(field)))
            elif key.startswith("tokenizer.ggml.add_"):
                writer.add_bool(key, bool(_value(field)))
        found = reader.fields.get("tokenizer.chat_template")
        chat = template if template is not None else None if found is None else _value(found)
        if chat:
            writer.add_chat_template(chat)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with open(plain, "rb") as src, gzip.open(out, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--set-token", nargs=2, action="append", default=[], metavar=("ID", "TEXT"))
    parser.add_argument("--chat-template", type=Path)
    args = parser.parse_args()
    template = None
    if args.chat_template is not None:
        text = args.chat_template.read_text(encoding="utf-8")
        template = text.split("-#}\n", 1)[1] if text.startswith("{#-") else text
    write_vocab(args.source, args.out, {int(i): t for i, t in args.set_token}, template)
    print(f"{args.out}: {args.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
