"""A light tokenizer over a saved Hugging Face tokenizer directory, without importing transformers.

Decoding on the CPU starts in about a second; importing transformers alone costs 0.7 s and 30 MB. The tokenizer
of a GGUF file is built once by transformers and saved (``specwise.models.loader.gguf_tokenizer``); later runs load
the saved ``tokenizer.json`` with the ``tokenizers`` library directly and render chat templates with jinja2 the way
transformers does (sandboxed, ``trim_blocks``, ``lstrip_blocks``, its ``tojson``, ``raise_exception`` and
``strftime_now``). Encoding, decoding and the chat template give the same results as the transformers tokenizer
of the same directory (``tests/test_tokenizer.py``); anything else (tools, documents, ``save_pretrained``, ...) is
handed to that tokenizer, loaded on first use.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path

__all__ = ["LightTokenizer"]

_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


class LightTokenizer:
    """Encode, decode and chat templates of a saved tokenizer; the rest through transformers on demand."""

    def __init__(self, directory: str | Path) -> None:
        from tokenizers import Tokenizer

        self.directory = Path(directory)
        self._backend = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
        config = json.loads((self.directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        self._config = config
        template = self.directory / "chat_template.jinja"
        self.chat_template = (
            template.read_text(encoding="utf-8") if template.is_file() else config.get("chat_template") or None
        )
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        for name in _SPECIAL:
            token = config.get(name)
            if isinstance(token, dict):  # an AddedToken written out
                token = token.get("content")
            setattr(self, name, token)
            setattr(self, f"{name}_id", None if token is None else self._backend.token_to_id(token))

    # the parts of the transformers tokenizer API that decoding uses

    def __call__(self, text: str, add_special_tokens: bool = True, **kwargs) -> dict:
        if kwargs or not isinstance(text, str):
            return self._full(text, add_special_tokens=add_special_tokens, **kwargs)
        ids = self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs) -> list[int]:
        if kwargs:
            return self._full.encode(text, add_special_tokens=add_special_tokens, **kwargs)
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids, skip_special_tokens: bool = False, **kwargs) -> str:
        if kwargs:
            return self._full.decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)
        if hasattr(token_ids, "tolist"):
            token_ids = token_ids.tolist()
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        text = self._backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        return _clean_up(text) if self.clean_up_tokenization_spaces else text

    def get_vocab(self) -> dict[str, int]:
        return self._backend.get_vocab(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        """The base vocabulary, without added tokens (as transformers counts it)."""
        return self._backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)
        return [self._backend.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self._backend.token_to_id(tokens)
        return [self._backend.token_to_id(t) for t in tokens]

    def apply_chat_template(
        self, conversation, tokenize: bool = True, add_generation_prompt: bool = False, **kwargs
    ) -> str | list[int]:
        """The conversation rendered by the chat template (as transformers renders it); token ids if ``tokenize``.
        ``tools`` (OpenAI's list of tool dicts) is rendered here too; other options go to transformers."""
        plain = isinstance(conversation, list) and all(isinstance(m, dict) for m in conversation)
        if kwargs.keys() - {"tools"} or not plain:
            return self._full.apply_chat_template(
                conversation, tokenize=tokenize, add_generation_prompt=add_generation_prompt, **kwargs
            )
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template: use raw completion")
        special = {name: getattr(self, name) for name in _SPECIAL if getattr(self, name) is not None}
        if kwargs.get("tools") is not None:
            special["tools"] = kwargs["tools"]
        text = self._template.render(
            messages=[dict(m) for m in conversation], add_generation_prompt=add_generation_prompt, **special
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text

    @cached_property
    def _template(self):
        return _compile(self.chat_template)

    @cached_property
    def _full(self):
        """The transformers tokenizer of the same directory, for everything this class does not do itself."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.directory)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._full, name)

    def __reduce__(self):
        # copies (the server keeps one for its request thread) and pickles load the same directory afresh: the
        # compiled template and the backend are rebuilt rather than copied
        return (LightTokenizer, (self.directory,))

    def __repr__(self) -> str:
        return f"LightTokenizer({str(self.directory)!r}, vocab={len(self)})"


def _clean_up(text: str) -> str:
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m")):
        text = text.replace(a, b)
    for a, b in ((" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


def _compile(source: str):
    """A chat template compiled in a sandbox with the helpers chat templates expect."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)
