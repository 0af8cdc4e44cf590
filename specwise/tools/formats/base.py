"""What every tool-call format shares: the :class:`ToolFormat` a format subclasses (its rendering, its grammar, its
parser), the grammar they are written in (:class:`ToolGrammar`, llguidance's Lark dialect) and its pieces, and the
conversation as a template that renders tools takes it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from specwise.constraints import Constraint
from specwise.tools.parse import CallParser
from specwise.tools.spec import Function, ToolRequest
from specwise.tools.tokens import grammar_tag

__all__ = [
    "LAYOUT",
    "ToolFormat",
    "ToolGrammar",
    "arguments_object",
    "call_schema",
    "lark_json",
    "one_of",
    "template_messages",
    "thinking_rules",
]

# fixed separators, as JsonSchema's default layout: the parsers and the grammar agree on one layout; lenient: schema
# keywords the grammar engine cannot enforce (propertyNames, uniqueItems, not, if/then, ...; agents' tool schemas
# use them) are left unchecked rather than refusing the request
LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


@dataclass(frozen=True)
class ToolGrammar(Constraint):
    """A tool-call grammar in llguidance's Lark dialect (its JSON parts inline as ``%json``)."""

    lark: str

    def grammar(self) -> str:
        from specwise.constraints import _llguidance

        return _llguidance().LLMatcher.grammar_from_lark(self.lark)

    @property
    def kind(self) -> str:
        return "tool-call grammar"


class ToolFormat:
    """A tool-call format: how a conversation with tools is rendered for the model (:meth:`prompt`), the grammar
    its reply must follow (:meth:`constraint`) and the parser that reads calls out of it (:meth:`parser`). One
    module of :mod:`specwise.tools.formats` holds each format, its parser beside it."""

    name = ""
    native = True  # the chat template renders the tools itself
    order = 50  # where detect_format asks it among the formats (lower: sooner)
    fallback = False  # the format of a template that no other detects (one format says True)

    def detects(self, template: str) -> bool:
        """Whether a chat template writes this format (``detect_format`` asks the formats in their order; the
        fallback format, asked none, says False)."""
        return False

    def prompt(self, messages: list[dict], request: ToolRequest | None) -> tuple[list[dict], list[dict] | None]:
        """The messages and ``tools`` to hand the chat template (None: render without tools)."""
        if request is None:
            return template_messages(messages), None
        return template_messages(messages), request.openai()

    def constraint(self, request: ToolRequest | None, tokenizer, thinking=None) -> Constraint | None:
        """The grammar the reply must follow (None: unconstrained); ``thinking``: the model's thinking tags
        (:class:`~specwise.tools.reasoning.ThinkingTags`), a thinking block the grammar lets come first."""
        raise NotImplementedError

    def parser(self, request: ToolRequest | None) -> CallParser | None:
        """A parser for one reply (None: the reply is all content)."""
        raise NotImplementedError

    def markers(self, tokenizer) -> set[int]:
        """Special tokens of this format that the reply's text must keep (decoding would drop them)."""
        return set()

    def __repr__(self) -> str:
        return f"ToolFormat({self.name!r})"


# ---- the grammars' pieces


def call_schema(function: Function, arguments_key: str) -> dict:
    """The JSON schema of one call of ``function``: its name, then its arguments."""
    return {
        "type": "object",
        "properties": {"name": {"const": function.name}, arguments_key: function.parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def one_of(schemas: list[dict]) -> dict:
    """One schema, or a choice of several."""
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def lark_json(schema: dict) -> str:
    """A JSON schema as a Lark rule's body, in the layout the parsers read."""
    return "%json " + json.dumps({**schema, "x-guidance": LAYOUT})


def thinking_rules(tokenizer, thinking) -> list[str]:
    """Grammar rules letting a thinking block (its opening tag optional: a template may have opened it) come
    before the ``reply`` rule: the model thinks freely, then the reply follows the grammar."""
    opener, special = grammar_tag(tokenizer, thinking.open)
    closer, close_special = grammar_tag(tokenizer, thinking.close)
    escaped = re.escape(thinking.close).replace("/", "\\/")  # a slash would end Lark's regex
    thought = "/(?s:.+)/" if close_special else f"/(?s:.+)/ & ~/(?s:.*){escaped}(?s:.*)/"
    return ["start: think? reply", f"think: {opener}? THOUGHT? {closer} /[ \\t\\r\\n]*/", f"THOUGHT: {thought}"]


# ---- the conversation as the templates take it


def arguments_object(arguments: str):
    """A history call's arguments (JSON text) as the templates take them: the parsed object, or the text when it
    is not JSON."""
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return arguments


def _template_call(call: dict) -> dict:
    function = call["function"]
    return {**call, "function": {**function, "arguments": arguments_object(function["arguments"])}}


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages for a template that renders tools: calls' arguments as objects, a call's null content as ''."""
    out = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [_template_call(call) for call in message["tool_calls"]]
        if message.get("content") is None:
            message["content"] = ""
        out.append(message)
    return out
