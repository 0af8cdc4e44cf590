"""Tool calls (OpenAI's function calling) for any chat model: the request's tools checked (:mod:`.spec`), the
model's tool-call format read from its chat template, and for each format, in one module of :mod:`.formats`, the
conversation rendered for it, the grammar its calls must follow and the parser that reads calls out of its reply as
it streams (the pieces of an answer and the parsers' base: :mod:`.parse`).

Usage::

    request = tool_request(tools, tool_choice, parallel_tool_calls)   # ToolError names the bad field
    fmt = detect_format(tokenizer.chat_template)
    text = render_chat(tokenizer, messages, request, fmt)
    constraint = fmt.constraint(request, tokenizer)                     # for SamplingParams(constraint=...)
    parser = fmt.parser(request)                                        # feed it the reply's text
"""

from __future__ import annotations

from specwise.tools.formats import FORMATS, ToolFormat, ToolGrammar, detect_format, special_token_id
from specwise.tools.parse import (
    ArgumentsPiece,
    CallParser,
    CallStart,
    ContentPiece,
    ReasoningPiece,
    ToolCall,
    new_call_id,
)
from specwise.tools.spec import Function, ToolChoice, ToolError, ToolRequest, check_history, tool_request
from specwise.tools.text import MarkedText, ReplyReader

__all__ = [
    "FORMATS",
    "ArgumentsPiece",
    "CallParser",
    "CallStart",
    "ContentPiece",
    "Function",
    "MarkedText",
    "ReasoningPiece",
    "ReplyReader",
    "ToolCall",
    "ToolChoice",
    "ToolError",
    "ToolFormat",
    "ToolGrammar",
    "ToolRequest",
    "check_history",
    "detect_format",
    "new_call_id",
    "render_chat",
    "special_token_id",
    "tool_request",
]


def render_chat(tokenizer, messages: list[dict], request: ToolRequest | None, fmt: ToolFormat | None = None) -> str:
    """The conversation (OpenAI's message dicts) with the request's tools, rendered by the tokenizer's chat
    template for the assistant's reply (``fmt``: the template's format, detected when not given)."""
    fmt = fmt or detect_format(getattr(tokenizer, "chat_template", None))
    messages, tools = fmt.prompt(messages, request)
    if tools is None:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
