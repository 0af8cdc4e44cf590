"""A light tokenizer over a ``tokenizer.json`` and its ``tokenizer_config.json``, without importing transformers.

The tokenizer of a GGUF file is built from the file's metadata by :mod:`specwise.models.gguf_tokenizer` and cached
as such a directory (``specwise.models.loader.gguf_tokenizer``); a saved Hugging Face tokenizer directory loads the
same way. Text is encoded and decoded by the ``tokenizers`` library, or for a SentencePiece-style GGUF vocabulary
(Gemma 3, Phi-3) by specwise's compact native tokenizer built straight from the file
(:mod:`specwise.models.spm_tokenizer`: the same ids in a few MiB); chat templates are rendered with jinja2 as
transformers renders them (sandboxed, ``trim_blocks``, ``lstrip_blocks``, its ``tojson``, ``raise_exception``,
``strftime_now``, ``dict`` and ``namespace``; ``tools``, ``documents``, ``continue_final_message``, named templates
and any other keyword passed to the template). Encoding, decoding, the vocabulary, special and added tokens and the
chat template give what the transformers tokenizer of the same directory gives (``tests/test_tokenizer.py``); what
only transformers does (tensors, padding and truncation, tools given as Python functions, ...) is handed to that
tokenizer, loaded on first use, and needs the ``hf`` extra. One file because it is one object, the stand-in for
transformers' tokenizer that every caller takes whole.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Mapping
from datetime import datetime
from functools import cached_property
from pathlib import Path

__all__ = ["LightTokenizer"]

_NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_REASONING = ("reasoning_content", "thinking", "reasoning")
# apply_chat_template's options that only transformers implements (with the value meaning "not asked for")
_HF_CHAT_OPTIONS = {
    "padding": False,
    "truncation": False,
    "max_length": None,
    "return_tensors": None,
    "return_assistant_tokens_mask": False,
    "sanitize_control_tokens": False,
}
_HF_CALL_OPTIONS = {"padding": False, "truncation": None, "max_length": None, "verbose": True}
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class LightTokenizer:
    """Encode, decode, tokens and chat templates of a saved tokenizer; the rest through transformers on demand.

    directory: a folder with ``tokenizer.json`` and ``tokenizer_config.json`` (a ``chat_template.jinja`` beside
    them, and ``additional_chat_templates/NAME.jinja``, where the template is saved apart).
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        text = self.directory / "tokenizer.json"  # read by tokenizers itself: a Python copy adds ~40 MiB for Gemma 3
        config = json.loads((self.directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        templates = {}
        extra = self.directory / "additional_chat_templates"
        if extra.is_dir():
            templates = {p.stem: p.read_text(encoding="utf-8") for p in sorted(extra.glob("*.jinja"))}
        template = self.directory / "chat_template.jinja"
        main = template.read_text(encoding="utf-8") if template.is_file() else None
        self._setup(text, config, main, templates)

    @classmethod
    def from_json(cls, tokenizer_json: str, config: dict, directory: str | Path | None = None) -> LightTokenizer:
        """A tokenizer from the text of a ``tokenizer.json`` and the settings of a ``tokenizer_config.json``;
        ``directory``: where these are saved (copies load it from there), else the tokenizer is held in memory."""
        self = cls.__new__(cls)
        self.directory = None if directory is None else Path(directory)
        self._setup(tokenizer_json, dict(config), None, {})
        return self

    @classmethod
    def from_backend(cls, backend, config: dict) -> LightTokenizer:
        """A tokenizer over an encoder already built (a ``tokenizers.Tokenizer``, or the compact
        :class:`~specwise.models.spm_tokenizer.SentencePieceTokenizer` of a SentencePiece-style GGUF vocabulary) and
        the settings of a ``tokenizer_config.json``; held in memory (copies share the backend)."""
        self = cls.__new__(cls)
        self.directory = None
        self._setup(backend, dict(config), None, {})
        return self

    def _setup(self, text, config: dict, main: str | None, templates: dict[str, str]) -> None:
        """``text``: the ``tokenizer.json`` text, the path of the file, or the backend itself (then the ``tokenizers``
        library is not imported)."""
        if not isinstance(config, dict):
            raise ValueError("tokenizer_config.json does not hold an object")
        if isinstance(text, (str, Path)):
            from tokenizers import Tokenizer

            self._backend = Tokenizer.from_file(str(text)) if isinstance(text, Path) else Tokenizer.from_str(text)
        else:
            self._backend = text
        self._config = config
        self.init_kwargs = config
        named = config.get("chat_template")
        if isinstance(named, list):  # [{"name": ..., "template": ...}, ...]
            for item in named:
                if (
                    isinstance(item, dict)
                    and isinstance(item.get("name"), str)
                    and isinstance(item.get("template"), str)
                ):
                    templates.setdefault(item["name"], item["template"])
            named = None
        if main is None:
            main = named if isinstance(named, str) and named else templates.pop("default", None)
        self.chat_template: str | None = main or None
        self.chat_templates: dict[str, str] = templates  # the named ones beside the default
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self.model_max_length = int(config.get("model_max_length") or 1 << 60)
        self.padding_side = config.get("padding_side", "right")
        self.add_bos_token = bool(config.get("add_bos_token", False))
        self.add_eos_token = bool(config.get("add_eos_token", False))
        for name in _NAMED:
            token = config.get(name)
            if isinstance(token, dict):  # an AddedToken written out
                token = token.get("content")
            if not isinstance(token, str):
                token = None
            setattr(self, name, token)
            setattr(self, f"{name}_id", None if token is None else self._backend.token_to_id(token))

    # ---- encoding and decoding -------------------------------------------------------------------------------

    def __call__(self, text, text_pair=None, add_special_tokens: bool = True, return_tensors=None, **kwargs) -> dict:
        """``{"input_ids": ..., "attention_mask": ...}`` of a text or a list of texts (lists of ids; numpy arrays
        with ``return_tensors="np"``, texts of one length only)."""
        mask = kwargs.pop("return_attention_mask", None)
        if (
            text_pair is not None
            or return_tensors not in (None, "np")
            or not _defaults(kwargs, _HF_CALL_OPTIONS)
            or not (
                isinstance(text, str) or (isinstance(text, (list, tuple)) and all(isinstance(t, str) for t in text))
            )
        ):
            if mask is not None:
                kwargs["return_attention_mask"] = mask
            return self._full(
                text,
                text_pair=text_pair,
                add_special_tokens=add_special_tokens,
                return_tensors=return_tensors,
                **kwargs,
            )
        if isinstance(text, str):
            ids = self._backend.encode(text, add_special_tokens=add_special_tokens).ids
            out = {"input_ids": ids, "attention_mask": [1] * len(ids)}
        else:
            rows = [e.ids for e in self._backend.encode_batch(list(text), add_special_tokens=add_special_tokens)]
            out = {"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]}
        if mask is False:
            del out["attention_mask"]
        if return_tensors == "np":
            import numpy as np

            if not isinstance(text, str) and len({len(r) for r in out["input_ids"]}) > 1:
                raise ValueError("texts of different lengths cannot be one array without padding")
            out = {k: np.asarray(v if not isinstance(text, str) else [v], dtype=np.int64) for k, v in out.items()}
        return out

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs) -> list[int]:
        if kwargs or not isinstance(text, str):
            return self._full.encode(text, add_special_tokens=add_special_tokens, **kwargs)
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def tokenize(self, text: str, add_special_tokens: bool = False, **kwargs) -> list[str]:
        if kwargs or not isinstance(text, str):
            return self._full.tokenize(text, add_special_tokens=add_special_tokens, **kwargs)
        return self._backend.encode(text, add_special_tokens=add_special_tokens).tokens

    def decode(
        self, token_ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool | None = None, **kwargs
    ) -> str:
        if kwargs:
            return self._full.decode(
                token_ids,
                skip_special_tokens=skip_special_tokens,
                clean_up_tokenization_spaces=clean_up_tokenization_spaces,
                **kwargs,
            )
        text = self._backend.decode(_ids(token_ids), skip_special_tokens=skip_special_tokens)
        clean = (
            self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        )
        return _clean_up(text) if clean else text

    def batch_decode(self, sequences, skip_special_tokens: bool = False, **kwargs) -> list[str]:
        return [self.decode(s, skip_special_tokens=skip_special_tokens, **kwargs) for s in _rows(sequences)]

    # ---- vocabulary and special tokens -----------------------------------------------------------------------

    def get_vocab(self) -> dict[str, int]:
        return self._backend.get_vocab(with_added_tokens=True)

    def iter_tokens(self):
        """Every token's text in id order (None for an id without one), one at a time: what ``get_vocab`` holds,
        without building its dict (60 MB for Gemma 3's 262,144 tokens)."""
        backend = self._backend
        for i in range(backend.get_vocab_size(with_added_tokens=True)):
            yield backend.id_to_token(i)

    @property
    def vocab_size(self) -> int:
        """The base vocabulary, without added tokens (as transformers counts it)."""
        return self._backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def vocab(self) -> dict[str, int]:
        return self.get_vocab()

    @property
    def backend_tokenizer(self):
        """What encodes and decodes: a ``tokenizers.Tokenizer``, or for a SentencePiece-style GGUF vocabulary
        specwise's compact :class:`~specwise.models.spm_tokenizer.SentencePieceTokenizer` (the same API for what
        specwise calls; anything else of it is answered by a ``tokenizers.Tokenizer`` it builds on first use)."""
        return self._backend

    @property
    def name_or_path(self) -> str:
        return "" if self.directory is None else str(self.directory)

    @property
    def is_fast(self) -> bool:
        return True

    @property
    def added_tokens_decoder(self) -> dict:
        """Added tokens by id (``tokenizers.AddedToken``)."""
        return dict(sorted(self._backend.get_added_tokens_decoder().items()))

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        return {token.content: i for i, token in self.added_tokens_decoder.items()}

    def get_added_vocab(self) -> dict[str, int]:
        return self.added_tokens_encoder

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens that are set (``bos_token``, ``eos_token``, ...)."""
        return {name: getattr(self, name) for name in _NAMED if getattr(self, name) is not None}

    @property
    def extra_special_tokens(self) -> list[str]:
        """The special tokens beside the named ones (``extra_special_tokens`` of the configuration, or its older
        name ``additional_special_tokens``)."""
        extra = self._config.get("extra_special_tokens", self._config.get("additional_special_tokens")) or []
        if isinstance(extra, dict):  # named extra tokens: {"image_token": "<image>", ...}
            extra = list(extra.values())
        tokens = [t.get("content") if isinstance(t, dict) else t for t in extra if isinstance(t, (str, dict))]
        return [t for t in tokens if isinstance(t, str)]

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens, then the extra ones, each once (as transformers lists them)."""
        return list(dict.fromkeys([*self.special_tokens_map.values(), *self.extra_special_tokens]))

    @property
    def all_special_ids(self) -> list[int]:
        return [i for i in (self._backend.token_to_id(t) for t in self.all_special_tokens) if i is not None]

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        if isinstance(ids, int) or (hasattr(ids, "ndim") and getattr(ids, "ndim", 1) == 0):
            return self._backend.id_to_token(int(ids))
        special = set(self.all_special_ids) if skip_special_tokens else ()
        return [self._backend.id_to_token(i) for i in _ids(ids) if i not in special]

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            found = self._backend.token_to_id(tokens)
            return self.unk_token_id if found is None else found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        decoder = self._backend.decoder
        return decoder.decode(list(tokens)) if decoder is not None else "".join(tokens)

    # ---- chat templates --------------------------------------------------------------------------------------

    def get_chat_template(self, chat_template: str | None = None, tools=None) -> str:
        """The template used: ``chat_template`` (a template, or the name of one of the tokenizer's), else the
        ``tool_use`` one where tools are given and it exists, else the tokenizer's own."""
        if chat_template is not None:
            return self.chat_templates.get(chat_template, chat_template)
        if tools is not None and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        if self.chat_template:
            return self.chat_template
        if "default" in self.chat_templates:
            return self.chat_templates["default"]
        raise ValueError("this tokenizer has no chat template: use raw completion")

    def apply_chat_template(
        self,
        conversation,
        tools: list | None = None,
        documents: list | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        tokenize: bool = True,
        return_dict: bool = False,
        tokenizer_kwargs: dict | None = None,
        **kwargs,
    ):
        """The conversation rendered by the chat template as transformers renders it: text, or with ``tokenize``
        its token ids (a dict with ``return_dict``); a list of conversations gives a list. ``tools`` (OpenAI's
        tool dicts), ``documents`` and any other keyword reach the template; padding, truncation, tensors,
        assistant masks and tools given as Python functions are transformers' (the ``hf`` extra)."""
        hf_only = {k: kwargs.pop(k) for k in list(kwargs) if k in _HF_CHAT_OPTIONS}
        functions = tools is not None and not all(isinstance(t, Mapping) for t in tools)
        if not _defaults(hf_only, _HF_CHAT_OPTIONS) or functions or tokenizer_kwargs:
            return self._full.apply_chat_template(
                conversation,
                tools=tools,
                documents=documents,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=tokenize,
                return_dict=return_dict,
                tokenizer_kwargs=tokenizer_kwargs,
                **hf_only,
                **kwargs,
            )
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot be used together")
        source = self.get_chat_template(chat_template, tools)
        if isinstance(conversation, (list, tuple)) and not conversation:
            raise ValueError("cannot apply a chat template to an empty conversation")
        batched = isinstance(conversation, (list, tuple)) and (
            isinstance(conversation[0], (list, tuple)) or hasattr(conversation[0], "messages")
        )
        conversations = list(conversation) if batched else [conversation]
        if documents is not None and not all(isinstance(d, Mapping) for d in documents):
            raise TypeError("documents should be a list of dicts with 'title' and 'text' keys")
        variables = _plain({**self.special_tokens_map, **kwargs})
        template = _compile(source)
        rendered = [
            _render(
                template,
                source,
                _messages(chat),
                _plain(tools),
                _plain(documents),
                add_generation_prompt,
                continue_final_message,
                variables,
            )
            for chat in conversations
        ]
        if not tokenize:
            return rendered if batched else rendered[0]
        ids = [self._backend.encode(text, add_special_tokens=False).ids for text in rendered]
        if return_dict:
            masks = [[1] * len(row) for row in ids]
            return (
                {"input_ids": ids, "attention_mask": masks}
                if batched
                else {"input_ids": ids[0], "attention_mask": masks[0]}
            )
        return ids if batched else ids[0]

    # ---- saving, copying, the rest -----------------------------------------------------------------------------

    def save_pretrained(self, save_directory: str | Path, **kwargs) -> tuple[str, ...]:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat templates) to ``save_directory``;
        transformers loads the folder as well."""
        if kwargs.get("push_to_hub"):
            return self._full.save_pretrained(save_directory, **kwargs)
        target = Path(save_directory)
        target.mkdir(parents=True, exist_ok=True)
        config = dict(self._config)
        config.pop("chat_template", None)
        if self.chat_templates:
            named = [{"name": "default", "template": self.chat_template}] if self.chat_template else []
            config["chat_template"] = named + [{"name": k, "template": v} for k, v in self.chat_templates.items()]
        elif self.chat_template:
            config["chat_template"] = self.chat_template
        config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
        files = (target / "tokenizer.json", target / "tokenizer_config.json")
        source = None if self.directory is None else self.directory / "tokenizer.json"
        if source is not None and source.is_file() and source.resolve() != files[0].resolve():
            shutil.copyfile(source, files[0])  # as it is (the text is not kept in memory: 30 MB for Gemma 3)
        elif source is None or not source.is_file():
            files[0].write_text(self._backend.to_str(), encoding="utf-8")
        files[1].write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
        stale = target / "chat_template.jinja"  # a template saved apart would take precedence over the config's
        if stale.is_file() and (self.directory is None or stale.resolve() != (self.directory / stale.name).resolve()):
            os.remove(stale)
        return tuple(str(f) for f in files)

    @cached_property
    def _full(self):
        """The transformers tokenizer of the same tokenizer, for what this class does not do itself."""
        try:
            from transformers import AutoTokenizer
        except ModuleNotFoundError as err:
            from specwise.extras import missing_extra

            raise missing_extra(err, "hf", "this use of the tokenizer") from err
        if self.directory is not None:
            return AutoTokenizer.from_pretrained(self.directory)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="specwise-tokenizer-") as tmp:
            self.save_pretrained(tmp)
            return AutoTokenizer.from_pretrained(tmp)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._full, name)

    def __reduce__(self):
        # copies (the server keeps one for its request thread) and pickles load the same tokenizer afresh: the
        # compiled template and the backend are rebuilt rather than copied (the compact backend is shared)
        from specwise.models.spm_tokenizer import SentencePieceTokenizer

        if self.directory is not None:
            return (LightTokenizer, (self.directory,))
        config = dict(self._config)
        if self.chat_template and "chat_template" not in config:
            config["chat_template"] = self.chat_template
        if isinstance(self._backend, SentencePieceTokenizer):  # immutable: shared by copies
            return (_from_backend, (self._backend, config))
        return (_from_json, (self._backend.to_str(), config))

    def __repr__(self) -> str:
        where = repr(str(self.directory)) if self.directory is not None else "in memory"
        return f"LightTokenizer({where}, vocab={len(self)})"


def _from_json(tokenizer_json: str, config: dict) -> LightTokenizer:
    return LightTokenizer.from_json(tokenizer_json, config)


def _from_backend(backend, config: dict) -> LightTokenizer:
    return LightTokenizer.from_backend(backend, config)


def _defaults(given: dict, defaults: dict) -> bool:
    """Whether every option given is one of ``defaults`` and has its value there (or None / False)."""
    return all(k in defaults and (v is None or v is False or v == defaults[k]) for k, v in given.items())


def _ids(token_ids) -> list[int]:
    if hasattr(token_ids, "tolist"):
        token_ids = token_ids.tolist()
    if isinstance(token_ids, int):
        return [token_ids]
    return [int(i) for i in token_ids]


def _rows(sequences) -> list:
    if hasattr(sequences, "tolist"):
        sequences = sequences.tolist()
    return list(sequences)


def _clean_up(text: str) -> str:
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m")):
        text = text.replace(a, b)
    for a, b in ((" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


# ---- chat templates ---------------------------------------------------------------------------------------------


def _plain(value):
    """What a template may see: plain JSON values rebuilt from the input (dataclasses and pydantic models as dicts,
    numpy scalars as numbers), anything else a placeholder naming its type. Templates are untrusted code: the
    objects callers pass have methods the sandbox does not know to refuse."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":
        return _plain(item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return _plain(dump())
    return f"<{type(value).__name__}>"


def _messages(chat) -> list[dict]:
    """A conversation as the template sees it: plain dicts without the keys whose value is None (APIs send
    ``content=None`` or ``tool_calls=None``), a message's reasoning under each name templates read it by."""
    chat = getattr(chat, "messages", chat)
    out = []
    for message in _plain(list(chat)):
        if not isinstance(message, dict):
            raise TypeError(f"chat messages should be dicts, dataclasses or pydantic models, but got {message!r}")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _render(template, source, chat, tools, documents, add_generation_prompt, continue_final, variables) -> str:
    final = None
    if continue_final:
        if not chat:
            raise ValueError("continue_final_message is set but the conversation is empty")
        key = continue_final if isinstance(continue_final, str) else "content"
        final = chat[-1].get(key)
        if final is None:
            raise ValueError(f'continue_final_message is set but the final message has no "{key}" to continue')
        fields = [key]
        if key in _REASONING:
            fields = [f for f in _REASONING if chat[-1].get(f) == final]
        if not any(f in source for f in fields):
            raise ValueError(f'continue_final_message is set to "{key}" but the chat template does not read it')
        if isinstance(final, list):
            for block in reversed(final):
                if isinstance(block, dict) and "text" in block:
                    final = block["text"]
                    block["text"] = block["text"] + _CONTINUE_TAG
                    break
            else:
                raise ValueError("continue_final_message is set but the final message has no text to continue")
        else:
            for f in fields:
                chat[-1][f] = chat[-1][f] + _CONTINUE_TAG
    text = template.render(
        messages=chat, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt, **variables
    )
    if final is not None:
        tag = _CONTINUE_TAG.strip()
        if str(final).strip() not in text or tag not in text:
            raise ValueError("continue_final_message is set but the chat template dropped part of the final message")
        at = text.rindex(tag)
        text = text[:at] if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
    return text


_COMPILED: dict[str, object] = {}


def _compile(source: str):
    """A chat template compiled in a sandbox with the helpers chat templates expect (cached by its text)."""
    hit = _COMPILED.get(source)
    if hit is not None:
        return hit
    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` (the assistant's part, for masks): rendered as it is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class TemplateDict:
        """``dict(...)`` in a template: builds a dict; nothing else of the type is reachable."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class Namespace(jinja2.utils.Namespace):
        """``namespace(...)`` refusing names that start with an underscore (no way to CPython's internals)."""

        def __init__(*args, **kwargs):  # noqa: N805 (jinja's own signature: a field may be called "self")
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                Namespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a template cannot set {name!r} on a namespace")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = Namespace
    compiled = env.from_string(source)
    if len(_COMPILED) > 32:
        _COMPILED.clear()
    _COMPILED[source] = compiled
    return compiled
