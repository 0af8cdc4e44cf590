"""Prompts to token ids off the event loop: chat-template rendering and tokenization on a thread of their own.

A long prompt takes the tokenizer a while (about 1.3 s a megabyte for the default model on a small CPU). Run on the
event loop, that time is lost to every other request, ``/health`` included; run on a thread that holds Python's
global lock, it is lost all the same. So the encoder's thread encodes with the Rust tokenizer's batch call, which
lets go of the lock while it works; only the template's rendering (pure Python) shares the interpreter, in the
usual short turns.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["PromptEncoder", "lock_free_backend"]

T = TypeVar("T")


class PromptEncoder:
    """A private copy of the tokenizer and the one thread that uses it (requests are encoded one at a time).

    ``run(fn, ...)`` runs ``fn`` on that thread and awaits it; ``text`` and ``chat`` are what ``fn`` calls.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = copy.deepcopy(tokenizer)  # the generation thread decodes with the original
        self._backend = lock_free_backend(self.tokenizer)
        self._pool: ThreadPoolExecutor | None = None

    async def run(self, fn: Callable[..., T], *args) -> T:
        """``fn(*args)`` on the encoder's thread (its exceptions are raised here)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="specwise-encode")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        """End the thread (after the encoding under way); ``run`` starts a new one if called again."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of raw text, as ``tokenizer(text)["input_ids"]`` gives them."""
        if self._backend is not None:
            return list(self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def chat(self, messages: list[dict], tools: list[dict] | None = None, extra: dict | None = None) -> list[int]:
        """Token ids of a conversation through the chat template, ready for the assistant's reply (as
        ``specwise.runtime.encode_chat``); ``tools``: OpenAI's tool dicts, for a template that renders them;
        ``extra``: more variables for the template."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model's tokenizer has no chat template: use /v1/completions")
        options = dict(extra or {}) if tools is None else {**(extra or {}), "tools": tools}
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **options)
        return self.text(text, add_special_tokens=False)


def lock_free_backend(tokenizer):
    """The tokenizer's ``tokenizers.Tokenizer`` (whose ``encode_batch`` releases the global lock), or specwise's
    compact SentencePiece tokenizer (whose native calls release it too), or None.

    specwise's own tokenizer keeps it as ``_backend``; a transformers fast tokenizer names it
    ``backend_tokenizer`` (looked up on the class: specwise's would load transformers' tokenizer to answer).
    """
    from specwise.models.spm_tokenizer import SentencePieceTokenizer

    kinds: tuple[type, ...] = (SentencePieceTokenizer,)
    try:
        from tokenizers import Tokenizer

        kinds += (Tokenizer,)
    except ModuleNotFoundError:
        pass
    backend = getattr(tokenizer, "_backend", None)
    if backend is None and hasattr(type(tokenizer), "backend_tokenizer"):
        backend = tokenizer.backend_tokenizer
    return backend if isinstance(backend, kinds) else None
