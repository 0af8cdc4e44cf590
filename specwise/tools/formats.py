"""The tool-call formats: which one a model uses (read from its chat template), how a conversation with tools is
rendered for it, the grammar its calls must follow, and its parser.

- ``hermes``: the template renders ``tools`` and its calls are ``<tool_call>\\n{"name": ..., "arguments": ...}
  \\n</tool_call>`` (Qwen2.5, Qwen3);
- ``llama3_json``: the template renders ``tools`` and its calls are one JSON object ``{"name": ...,
  "parameters": ...}`` (Llama 3.1, 3.2, 3.3);
- ``generic``: any other template (SmolLM2, Gemma 3, ...): the tools are described in a system message and the
  reply is a JSON object holding the calls or the text, as llama.cpp's server does for such models.

The grammars are llguidance's Lark dialect. In ``auto`` mode the grammar lets the model write text freely and
takes over once it opens a call: Hermes' text before a call is a lazy lexeme that ends at the first
``<tool_call>`` (llguidance's ``lazy``; text after the last call may not hold the tag), so every call that opens
is made to match a function's schema; a Llama reply that starts with ``{`` must be a call. ``required`` and a named
function allow only calls (of that function); ``none`` forbids the opener. Where the vocabulary has a marker as a
special token, the grammar names that token (``<tool_call>``) rather than its text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from specwise.constraints import Constraint, JsonSchema
from specwise.tools.loose import LooseCalls
from specwise.tools.parse import CallParser, GenericParser, HermesParser, LlamaJsonParser
from specwise.tools.spec import Function, ToolRequest

__all__ = ["FORMATS", "ToolFormat", "ToolGrammar", "detect_format", "special_token_id"]

# fixed separators, as JsonSchema's default layout: the parsers and the grammar agree on one layout; lenient: schema
# keywords the grammar engine cannot enforce (propertyNames, uniqueItems, not, if/then, ...; agents' tool schemas
# use them) are left unchecked rather than refusing the request
_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


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


def special_token_id(tokenizer, text: str) -> int | None:
    """The id of ``text`` when the vocabulary has it as one special token (which decoding drops), else None."""
    token = single_token_id(tokenizer, text)
    if token is None:
        return None
    return token if tokenizer.decode([token], skip_special_tokens=True) == "" else None


def grammar_tag(tokenizer, text: str) -> tuple[str, bool]:
    """How a grammar names a format's tag ``text``, and whether the grammar reads it as a special token: the token
    by its id (``<[id]>``) where the vocabulary has the tag as one token that the grammar engine holds special
    (Qwen2.5's ``<tool_call>`` is an added token: ordinary decoding writes it, but the grammar engine never spells
    it from bytes), else the tag's text as a string."""
    token = single_token_id(tokenizer, text)
    if token is not None and _grammar_special(tokenizer, token):
        return f"<[{token}]>", True
    return json.dumps(text), False


def single_token_id(tokenizer, text: str) -> int | None:
    """The id of ``text`` where the vocabulary encodes it as one token of that text, else None."""
    if tokenizer is None:
        return None
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1 or tokenizer.decode(ids, skip_special_tokens=False) != text:
        return None
    return ids[0]


def _grammar_special(tokenizer, token: int) -> bool:
    """Whether the grammar engine's tokenizer for ``tokenizer`` holds ``token`` special (None tokenizer: no)."""
    from specwise.constraints import grammar_tokenizer

    try:
        return bool(grammar_tokenizer(tokenizer).is_special_token(token))
    except Exception:  # no grammar engine, or a tokenizer it cannot read: the tag is text
        return False


def _call_schema(function: Function, arguments_key: str) -> dict:
    """The JSON schema of one call of ``function``: its name, then its arguments."""
    return {
        "type": "object",
        "properties": {"name": {"const": function.name}, arguments_key: function.parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _one_of(schemas: list[dict]) -> dict:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _lark_json(schema: dict) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": _LAYOUT})


class ToolFormat:
    """A tool-call format: rendering, grammar and parser (see the module's docstring)."""

    name = ""
    native = True  # the chat template renders the tools itself

    def prompt(self, messages: list[dict], request: ToolRequest | None) -> tuple[list[dict], list[dict] | None]:
        """The messages and ``tools`` to hand the chat template (None: render without tools)."""
        if request is None:
            return _template_messages(messages), None
        return _template_messages(messages), request.openai()

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


class Hermes(ToolFormat):
    name = "hermes"

    def markers(self, tokenizer) -> set[int]:
        found = (special_token_id(tokenizer, HermesParser.OPEN), special_token_id(tokenizer, HermesParser.CLOSE))
        return {t for t in found if t is not None}

    def constraint(self, request: ToolRequest | None, tokenizer, thinking=None) -> Constraint | None:
        if request is None:
            return None
        opener, special = grammar_tag(tokenizer, HermesParser.OPEN)
        closer, _ = grammar_tag(tokenizer, HermesParser.CLOSE)
        schema = _one_of([_call_schema(f, "arguments") for f in request.callable])
        rules = [f'body: "\\n" fn "\\n" {closer}', f"fn: {_lark_json(schema)}"]
        if special:  # text cannot hold a special token: the opener ends it
            rules.append("TEXT: /(?s:.+)/")
            text_only = "start: TEXT?"
        else:
            rules.append(f"TAIL: /(?s:.*)/ & ~/(?s:.*){HermesParser.OPEN}(?s:.*)/")
            text_only = "start: TAIL"
        mode, many = request.choice.mode, request.parallel
        if mode == "none":
            start = [text_only]
        elif request.choice.calls_only:
            # the model may end its line after the last call before it ends the reply
            start = ['start: call ("\\n" call)* "\\n"?' if many else 'start: call "\\n"?', f"call: {opener} body"]
        elif special:
            start = [f"start: TEXT? (call TEXT?){'*' if many else '?'}", f"call: {opener} body"]
        else:
            head = f"head[lazy]: /(?s:.*)/ {opener}"
            start = ["start: (head body)* TAIL" if many else "start: TAIL | head body TAIL", head]
        if thinking is not None:
            start = [line.replace("start:", "reply:", 1) for line in start] + _thinking_rules(tokenizer, thinking)
        return ToolGrammar("\n".join(start + rules) + "\n")

    def parser(self, request: ToolRequest | None) -> CallParser | None:
        if request is None or request.choice.mode == "none":
            return None
        if request.choice.calls_only:  # the grammar writes the calls in their tags
            return HermesParser()
        functions = {f.name: f.parameters for f in request.callable}
        return HermesParser(LooseCalls(functions, request.parallel))


class LlamaJson(ToolFormat):
    name = "llama3_json"

    def constraint(self, request: ToolRequest | None, tokenizer, thinking=None) -> Constraint | None:
        if request is None:
            return None
        schema = _one_of([_call_schema(f, "parameters") for f in request.callable])
        text = "TEXT: /[^{](?s:.*)/"
        if request.choice.mode == "none":
            start = "start: TEXT?"
        elif request.choice.calls_only:
            start = "start: call"
        else:
            start = "start: TEXT? | call"
        return ToolGrammar(f"{start}\ncall: {_lark_json(schema)}\n{text}\n")

    def parser(self, request: ToolRequest | None) -> CallParser | None:
        return None if request is None or request.choice.mode == "none" else LlamaJsonParser()


GENERIC_TOOLS = "You can call these functions (tools), described as JSON schemas:\n{tools}\n\n"
GENERIC_CALLS = '{{"tool_calls": [{{"name": "<function name>", "arguments": {{<its arguments>}}}}]}} to call {which}'
GENERIC_TEXT = '{{"response": "<your answer>"}} to answer directly'


class Generic(ToolFormat):
    name = "generic"
    native = False

    def prompt(self, messages: list[dict], request: ToolRequest | None) -> tuple[list[dict], list[dict] | None]:
        out = _generic_history(messages)
        if request is None or request.choice.mode == "none":
            return out, None
        text = self.instructions(request)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
        return out, None

    @staticmethod
    def instructions(request: ToolRequest) -> str:
        """The system message's description of the tools and of the reply's JSON."""
        tools = "\n".join(json.dumps(f.openai()["function"], ensure_ascii=False) for f in request.functions)
        if request.choice.mode == "function":
            which = f"the function {request.choice.name}"
        else:
            which = "one or more of them" if request.parallel else "one of them"
        reply = GENERIC_CALLS.format(which=which)
        if not request.choice.calls_only:
            reply += ", or " + GENERIC_TEXT.format()
        return GENERIC_TOOLS.format(tools=tools) + f"Reply with one JSON object: {reply}."

    def constraint(self, request: ToolRequest | None, tokenizer, thinking=None) -> Constraint | None:
        if request is None or request.choice.mode == "none":
            return None
        calls = {"type": "array", "items": _one_of([_call_schema(f, "arguments") for f in request.callable])}
        calls["minItems"] = 1
        if not request.parallel:
            calls["maxItems"] = 1
        branches = [_object({"tool_calls": calls})]
        if not request.choice.calls_only:
            branches.append(_object({"response": {"type": "string"}}))
        return JsonSchema({**_one_of(branches), "x-guidance": _LAYOUT})

    def parser(self, request: ToolRequest | None) -> CallParser | None:
        return None if request is None or request.choice.mode == "none" else GenericParser()


def _thinking_rules(tokenizer, thinking) -> list[str]:
    """Grammar rules letting a thinking block (its opening tag optional: a template may have opened it) come
    before the ``reply`` rule: the model thinks freely, then the reply follows the grammar."""
    opener, special = grammar_tag(tokenizer, thinking.open)
    closer, close_special = grammar_tag(tokenizer, thinking.close)
    escaped = re.escape(thinking.close).replace("/", "\\/")  # a slash would end Lark's regex
    thought = "/(?s:.+)/" if close_special else f"/(?s:.+)/ & ~/(?s:.*){escaped}(?s:.*)/"
    return ["start: think? reply", f"think: {opener}? THOUGHT? {closer} /[ \\t\\r\\n]*/", f"THOUGHT: {thought}"]


def _object(properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


FORMATS = {cls.name: cls() for cls in (Hermes, LlamaJson, Generic)}


def detect_format(template: str | None) -> ToolFormat:
    """The tool-call format of a chat template: Hermes when it renders tools and ``<tool_call>`` tags, Llama's
    JSON when it renders tools and calls with ``"parameters"`` in Llama 3's headers, else the generic format."""
    if not template or "tools" not in template:
        return FORMATS["generic"]
    if "<tool_call>" in template:
        return FORMATS["hermes"]
    if "<|start_header_id|>" in template and '"parameters"' in template:
        return FORMATS["llama3_json"]
    return FORMATS["generic"]


def _arguments_object(arguments: str):
    """A history call's arguments (JSON text) as the templates take them: the parsed object, or the text when it
    is not JSON."""
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return arguments


def _template_call(call: dict) -> dict:
    function = call["function"]
    return {**call, "function": {**function, "arguments": _arguments_object(function["arguments"])}}


def _template_messages(messages: list[dict]) -> list[dict]:
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


def _generic_history(messages: list[dict]) -> list[dict]:
    """Messages for a template without tools: an assistant's calls become its content, the JSON it would have
    written (``{"tool_calls": [...]}``); tool results become a user message (consecutive ones merged), each a line
    ``{"tool_response": {"id", "name", "content"}}``."""
    out: list[dict] = []
    names: dict[str, str] = {}
    results = False  # whether out[-1] is a user message of tool results
    for message in messages:
        role = message["role"]
        if role == "tool":
            call_id = message.get("tool_call_id")
            line = {"tool_response": {"id": call_id, "name": names.get(call_id), "content": message.get("content")}}
            text = json.dumps(line, ensure_ascii=False)
            if results:
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text})
            results = True
            continue
        results = False
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                names[call["id"]] = call["function"]["name"]
                args = _arguments_object(call["function"]["arguments"])
                calls.append({"name": call["function"]["name"], "arguments": args})
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)})
            continue
        out.append({"role": role, "content": message.get("content") or ""})
    return out
