"""The constraints a request may carry: JSON matching a schema, any JSON object, text matching a Lark grammar or a
regular expression. Each is plain data with its grammar in llguidance's form and a check of it; applying one while
decoding is :mod:`specwise.constraints`'s (which exports these names too).

This module imports nothing of specwise: ``SamplingParams`` holds a constraint, and the grammar's matcher draws with
the sampling functions, so the constraints' types sit below both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["Constraint", "ConstraintError", "Grammar", "JsonObject", "JsonSchema", "Regex"]


class ConstraintError(ValueError):
    """A constraint that cannot be used: an invalid schema, grammar or regex (the message names the problem)."""


def _llguidance():
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover - the extra is part of [dev]
        raise ConstraintError("constrained decoding needs llguidance: pip install 'specwise[constrained]'") from e
    return llguidance


@dataclass(frozen=True)
class Constraint:
    """Base class: a grammar the output must match (subclasses say how it is written)."""

    def grammar(self) -> str:
        """The grammar in llguidance's form."""
        raise NotImplementedError

    def check(self) -> None:
        """Raise ConstraintError naming the problem when the grammar is invalid."""
        llg = _llguidance()
        try:
            message = llg.LLMatcher.validate_grammar(self.grammar())
        except ValueError as e:
            raise ConstraintError(f"invalid {self.kind}: {e}") from e
        if message:
            first = message.strip().splitlines()[0]
            raise ConstraintError(f"invalid {self.kind}: {first}")

    @property
    def kind(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class JsonSchema(Constraint):
    """JSON matching a JSON schema. ``schema``: a dict, or its JSON text (stored as JSON text, properties in their
    order, so that the constraint is hashable like the rest of SamplingParams).

    flexible_whitespace: False (default): one layout, ``json.dumps``'s (``", "`` and ``": "``, no newlines), so
    that output ends and the grammar forces more tokens; True: any JSON whitespace between tokens. A schema's
    ``x-guidance`` options (llguidance's) override both.
    """

    schema: str
    flexible_whitespace: bool = False

    def __init__(self, schema: dict | str, flexible_whitespace: bool = False) -> None:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ConstraintError(f"invalid JSON schema: not JSON ({e})") from e
        if not isinstance(schema, dict) and not isinstance(schema, bool):
            raise ConstraintError(f"invalid JSON schema: expected an object, got {type(schema).__name__}")
        object.__setattr__(self, "schema", json.dumps(schema))
        object.__setattr__(self, "flexible_whitespace", bool(flexible_whitespace))

    def grammar(self) -> str:
        if self.flexible_whitespace:
            defaults = {"whitespace_flexible": True}
        else:
            defaults = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        return _llguidance().LLMatcher.grammar_from_json_schema(self.schema, defaults=defaults)

    @property
    def kind(self) -> str:
        return "JSON schema"


@dataclass(frozen=True)
class JsonObject(JsonSchema):
    """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""

    def __init__(self, flexible_whitespace: bool = False) -> None:
        super().__init__({"type": "object"}, flexible_whitespace)


@dataclass(frozen=True)
class Grammar(Constraint):
    """Text matching a Lark grammar (llguidance's dialect; a GBNF grammar is converted when it looks like one:
    it has ``::=``)."""

    lark: str

    def grammar(self) -> str:
        llg = _llguidance()
        text = self.lark
        if "::=" in text:
            try:
                text = llg.gbnf_to_lark(text)
            except Exception as e:  # the converter raises its own types on bad input
                raise ConstraintError(f"invalid grammar (GBNF): {e}") from e
        return llg.LLMatcher.grammar_from_lark(text)

    @property
    def kind(self) -> str:
        return "grammar"


@dataclass(frozen=True)
class Regex(Constraint):
    """Text matching a regular expression (the whole output)."""

    pattern: str

    def grammar(self) -> str:
        return _llguidance().LLMatcher.grammar_from_regex(self.pattern)

    @property
    def kind(self) -> str:
        return "regex"
