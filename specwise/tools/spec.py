"""A request's tools checked: the functions (names, JSON-schema parameters), the tool choice, parallel calls, and
the conversation's tool messages (each answers an earlier call). Every problem is a :class:`ToolError` naming
the request field at fault, as OpenAI names it (``tools[0].function.parameters``, ``tool_choice``,
``messages[3].tool_call_id``)."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

__all__ = [
    "MAX_SCHEMA_DEPTH",
    "Function",
    "ToolChoice",
    "ToolError",
    "ToolRequest",
    "check_history",
    "json_depth",
    "json_size",
    "schema_depth_error",
    "tool_request",
]

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
MAX_TOOLS = 128  # OpenAI's limit on functions per request
EMPTY_PARAMETERS = {"type": "object", "properties": {}}  # a function without parameters takes none
# the deepest nesting of objects and arrays a schema may have (the schema itself is level 1): about 30 nested
# objects, far past any real tool's; deeper schemas are refused before the validators and the grammar compiler,
# which recurse (a 200-level schema overflowed Python's stack in the meta-schema check)
MAX_SCHEMA_DEPTH = 64
# JSON values (objects, arrays, strings, numbers...) in all the parameter schemas of one request's tools: checking
# and compiling a schema costs up to 0.2 ms a value (the meta-schema check; the grammar compiler grows faster than
# linearly with optional properties), so this bounds a request's checks to about a second on a busy 2-core machine
# (16,384 took 3 s); fifteen coding-agent tools hold about 250, a large MCP tool set a few thousand
MAX_SCHEMA_VALUES = 8192
CACHED_SCHEMA_CHARS = 16_384  # schemas up to this long are checked once (agents send the same tools every turn)


class ToolError(ValueError):
    """A bad tool definition, tool choice or tool message; ``param`` is the request field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Function:
    """One function the model may call: its name, description and parameters (a JSON schema, as JSON text so
    that the function is hashable)."""

    name: str
    description: str | None
    parameters_json: str

    @property
    def parameters(self) -> dict:
        """The arguments' schema, self-contained: one that points into itself (``{"$ref": "#/$defs/Item"}``, as
        pydantic writes nested models) gets an ``$id``, which keeps those pointers resolving inside the schema
        when it is placed in a larger one (a call's grammar: the name, then these arguments)."""
        schema = json.loads(self.parameters_json)
        if "$id" not in schema and _points_into_itself(schema):
            schema = {"$id": f"urn:specwise:tool:{self.name}", **schema}
        return schema

    def openai(self) -> dict:
        """The tool as OpenAI's ``tools`` list holds it (and as chat templates take it): the parameters as
        given."""
        function = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = json.loads(self.parameters_json)
        return {"type": "function", "function": function}


def _points_into_itself(schema: dict) -> bool:
    """Whether ``schema`` holds a local reference (a ``$ref`` starting with ``#``), found without recursion."""
    stack: list = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


@dataclass(frozen=True)
class ToolChoice:
    """``auto`` (text or calls), ``none`` (text only), ``required`` (at least one call) or ``function`` (a call of
    ``name``)."""

    mode: str = "auto"
    name: str | None = None

    @property
    def calls_only(self) -> bool:
        """Whether the reply must be calls (``required`` or a named function)."""
        return self.mode in ("required", "function")


@dataclass(frozen=True)
class ToolRequest:
    """A request's tools: the functions, the choice and whether several calls may come in one reply."""

    functions: tuple[Function, ...]
    choice: ToolChoice = ToolChoice()
    parallel: bool = True

    @property
    def callable(self) -> tuple[Function, ...]:
        """The functions the reply may call (the named one alone when the choice names one)."""
        if self.choice.mode == "function":
            return tuple(f for f in self.functions if f.name == self.choice.name)
        return self.functions

    def openai(self) -> list[dict]:
        """The tools as OpenAI's ``tools`` list holds them."""
        return [f.openai() for f in self.functions]


def tool_request(tools: list[dict] | None, tool_choice: str | dict | None, parallel: bool | None) -> ToolRequest | None:
    """The request's tools checked (None: no tools). ``tools`` and ``tool_choice`` as OpenAI's JSON has them
    (their shapes already checked, e.g. by the server's request model); raises ToolError."""
    if not tools:
        if tool_choice is not None:
            raise ToolError("tool_choice needs tools: give the functions the model may call in tools", "tool_choice")
        if tools is not None:
            raise ToolError("tools is empty: give at least one function, or leave tools out", "tools")
        return None
    if len(tools) > MAX_TOOLS:
        raise ToolError(f"at most {MAX_TOOLS} tools are supported, got {len(tools)}", "tools")
    total = 0
    for i, tool in enumerate(tools):  # the size of the work before any of it
        total += json_size((tool.get("function") or {}).get("parameters"), MAX_SCHEMA_VALUES - total)
        if total > MAX_SCHEMA_VALUES:
            raise ToolError(
                f"the tools' parameter schemas hold more than {MAX_SCHEMA_VALUES} JSON values in all (passed at "
                f"tools[{i}]): send fewer tools or smaller schemas",
                "tools",
            )
    functions: list[Function] = []
    for i, tool in enumerate(tools):
        function = _function(tool.get("function") or {}, f"tools[{i}].function")
        if any(f.name == function.name for f in functions):
            raise ToolError(f"two tools are named {function.name!r}: give each function its own name", "tools")
        functions.append(function)
    choice = _choice(tool_choice, functions)
    return ToolRequest(tuple(functions), choice, True if parallel is None else bool(parallel))


def _function(spec: dict, where: str) -> Function:
    name = spec.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ToolError(
            f"invalid function name {name!r}: use 1 to 64 letters, digits, underscores or dashes", f"{where}.name"
        )
    parameters = spec.get("parameters")
    parameters = EMPTY_PARAMETERS if parameters is None else parameters
    check_parameters(parameters, f"{where}.parameters")
    return Function(name, spec.get("description"), json.dumps(parameters))


def json_size(value: object, limit: int) -> int:
    """How many JSON values ``value`` holds, itself included (None: 0), counted without recursion and only up to
    ``limit + 1``."""
    if value is None:
        return 0
    count, stack = 0, [value]
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def json_depth(value: object, limit: int) -> int:
    """The nesting depth of ``value``'s objects and arrays (a scalar: 0, ``{}``: 1), counted without recursion
    and only up to ``limit + 1``: a value nested deeper than ``limit`` returns ``limit + 1`` at once."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def schema_depth_error(schema: object, field: str) -> str | None:
    """Why ``schema`` (a JSON schema given in ``field``) is nested too deeply to take (None: it is not)."""
    if json_depth(schema, MAX_SCHEMA_DEPTH) <= MAX_SCHEMA_DEPTH:
        return None
    return (
        f"{field} nests objects and arrays more than {MAX_SCHEMA_DEPTH} levels deep: flatten the schema, or "
        "name repeated parts in $defs and point to them with $ref"
    )


def check_parameters(schema: object, param: str) -> None:
    """Raise ToolError unless ``schema`` is a JSON schema of an object that constrained decoding can follow
    (at most MAX_SCHEMA_DEPTH levels deep, checked against the JSON Schema meta-schema when jsonschema is
    installed, and compiled by llguidance, leniently: keywords it cannot enforce are left unchecked)."""
    if not isinstance(schema, dict):
        raise ToolError(f"{param} must be a JSON schema (an object), got {type(schema).__name__}", param)
    too_deep = schema_depth_error(schema, param)
    if too_deep is not None:
        raise ToolError(too_deep, param)
    if schema.get("type", "object") != "object":
        raise ToolError(f'{param} must describe an object (type "object"), got type {schema["type"]!r}', param)
    text = json.dumps(schema)
    problem = _cached_schema_problem(text) if len(text) <= CACHED_SCHEMA_CHARS else _schema_problem(text)
    if problem is not None:
        raise ToolError(f"{param}{problem}", param)


def _schema_problem(text: str) -> str | None:
    """What is wrong with the JSON schema ``text`` (to follow the field's name), None when nothing: checked
    against the JSON Schema meta-schema when jsonschema is installed, then compiled by llguidance."""
    schema = json.loads(text)
    try:
        import jsonschema
    except ModuleNotFoundError:
        jsonschema = None
    if jsonschema is not None:
        try:
            jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
        except jsonschema.SchemaError as err:
            return f" is not a valid JSON schema: {err.message}"
    from specwise.constraints import ConstraintError, JsonSchema

    try:  # leniently, as the call's grammar: keywords the engine cannot enforce are left unchecked, not refused
        own = schema.get("x-guidance") if isinstance(schema.get("x-guidance"), dict) else {}
        JsonSchema({**schema, "x-guidance": {**own, "lenient": True}}).check()
    except ConstraintError as err:
        return f": {err}"
    return None


_cached_schema_problem = functools.lru_cache(maxsize=1024)(_schema_problem)


def _choice(tool_choice: str | dict | None, functions: list[Function]) -> ToolChoice:
    if tool_choice is None:
        return ToolChoice()
    if isinstance(tool_choice, str):
        return ToolChoice(tool_choice)
    name = (tool_choice.get("function") or {}).get("name")
    if not any(f.name == name for f in functions):
        known = ", ".join(f.name for f in functions)
        raise ToolError(f"tool_choice names the function {name!r}, which is not in tools ({known})", "tool_choice")
    return ToolChoice("function", name)


def check_history(messages: list[dict]) -> None:
    """Raise ToolError unless every ``tool`` message answers a call of an earlier assistant message (its
    ``tool_call_id`` is one of theirs). ``messages``: OpenAI's message dicts."""
    calls: set[str] = set()
    for i, message in enumerate(messages):
        for call in message.get("tool_calls") or []:
            calls.add(call.get("id"))
        if message.get("role") == "tool":
            answered = message.get("tool_call_id")
            if answered not in calls:
                raise ToolError(
                    f"messages[{i}] is a tool result for {answered!r}, which no earlier assistant message called: "
                    "give the id of a call in an earlier message's tool_calls",
                    f"messages[{i}].tool_call_id",
                )
