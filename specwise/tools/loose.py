"""Calls a model writes outside its own format: a reply that is nothing but a JSON object (bare, or fenced as a
Markdown code block) naming one of the request's functions with its arguments, as Qwen2.5-Coder writes them when
the choice is ``auto``. Such a reply is a call when its name is listed and its arguments match that function's
schema (:func:`matches_schema`: the checks that decide a call's shape); anything else stays content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

__all__ = ["LooseCalls", "matches_schema"]

_FENCED = re.compile(r"\s*```(?:json)?[ \t]*\n(?P<body>.*?)\n?\s*```\s*", re.DOTALL)
MAX_DEPTH = 64  # of a schema or value checked; deeper: not a match


class LooseCalls:
    """Which replies are loose calls, for a request's functions (name -> parameters schema)."""

    def __init__(self, functions: Mapping[str, dict], parallel: bool = True) -> None:
        self.functions = dict(functions)
        self.parallel = parallel

    def may_open(self, text: str) -> bool | None:
        """Whether a reply beginning with ``text`` may be a loose call: True once its opening (an optional fence,
        then ``{"name": "``) names a listed function, False once it cannot be one, None while too little has come
        to tell."""
        rest = text.lstrip()
        if rest.startswith("```") or (rest and "```".startswith(rest)):
            line = rest.find("\n")
            if line < 0:
                return None if "json".startswith(rest[3:].strip()) else False
            if rest[3:line].strip() not in ("", "json"):
                return False
            rest = rest[line + 1 :].lstrip()
        if rest.startswith("{{"):  # a doubled opening brace (see calls)
            rest = rest[1:]
        for expected in ("{", '"name"', ":", '"'):
            if len(rest) < len(expected):
                return None if expected.startswith(rest) else False
            if not rest.startswith(expected):
                return False
            rest = rest[len(expected) :].lstrip() if expected != '"' else rest[len(expected) :]
        end = rest.find('"')
        if end < 0:
            return None if any(name.startswith(rest) for name in self.functions) else False
        return rest[:end] in self.functions

    def calls(self, text: str) -> list[tuple[str, str]] | None:
        """The calls (name, arguments as JSON text) of a whole reply that is a loose call (or, where parallel calls
        are allowed, a JSON array of them), else None."""
        fenced = _FENCED.fullmatch(text)
        body = (fenced.group("body") if fenced else text).strip()
        value = _json(body)
        if value is None and body.startswith("{{"):  # Qwen2.5-Coder at times doubles the braces around its call
            value = _doubled_braces(body)
        if value is None:
            return None
        items = value if isinstance(value, list) and self.parallel else [value]
        out = []
        for item in items:
            call = self._call(item)
            if call is None:
                return None
            out.append(call)
        return out or None

    def _call(self, item: object) -> tuple[str, str] | None:
        if not isinstance(item, dict) or not item.keys() <= {"name", "arguments", "parameters"}:
            return None
        name, args = item.get("name"), item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if name not in self.functions or not isinstance(args, dict):
            return None
        if not matches_schema(args, self.functions[name]):
            return None
        return name, json.dumps(args, ensure_ascii=False)


def _json(text: str):
    """``text`` parsed as JSON, or None where it is not JSON (a JSON null is no call either)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _doubled_braces(body: str):
    """The object of ``{{...}`` followed by closing braces only (``}}``, ``}}}``): Qwen2.5-Coder's call written with
    doubled braces, else None."""
    try:
        value, end = json.JSONDecoder().raw_decode(body[1:])
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) and not body[1 + end :].strip().strip("}") else None


_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer(),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def matches_schema(value: object, schema: object, depth: int = 0) -> bool:
    """Whether ``value`` has the shape ``schema`` asks for: ``type`` (one or a list), ``enum``, ``const``,
    ``properties`` with ``required`` and ``additionalProperties: false``, ``items``, ``anyOf`` / ``oneOf``. Other
    keywords (formats, lengths, ranges, references) are not checked: a loose call is judged by its shape."""
    if depth > MAX_DEPTH:
        return False
    if not isinstance(schema, dict):
        return True
    if "const" in schema and value != schema["const"]:
        return False
    if "enum" in schema and isinstance(schema["enum"], list) and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if isinstance(kind, str) else []
    if kinds and not any(_TYPES.get(k, lambda v: True)(value) for k in kinds):
        return False
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list) and branches and not any(matches_schema(value, b, depth + 1) for b in branches):
        return False
    if isinstance(value, dict):
        return _object_matches(value, schema, depth)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return all(matches_schema(v, schema["items"], depth + 1) for v in value)
    return True


def _object_matches(value: dict, schema: dict, depth: int) -> bool:
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    if any(key not in value for key in required):
        return False
    if schema.get("additionalProperties") is False and not value.keys() <= properties.keys():
        return False
    return all(matches_schema(v, properties[k], depth + 1) for k, v in value.items() if k in properties)
