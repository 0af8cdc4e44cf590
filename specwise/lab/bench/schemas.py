"""The JSON-schema suite: 20 shapes of constrained output, each with a prompt, and an extraction schema for
Spec-Bench questions (benchmark prompts only).

Every shape is bounded (strings have a ``maxLength``, arrays a ``maxItems``, numbers a range and numbers with a
fraction a ``multipleOf``), so that a complete answer fits in a known number of tokens
(:func:`specwise.constraints.max_json_bytes`: a token is at least one byte): given that many tokens, every answer
ends complete and valid.

``benchmarks/constrained_suite.py`` runs them; ``tests/test_constrained.py`` checks every shape on a tiny model.
"""

from __future__ import annotations

__all__ = ["SUITE", "EXTRACTION", "extraction_prompt"]


def _str(n: int, **extra) -> dict:
    return {"type": "string", "maxLength": n, **extra}


def _obj(properties: dict, required: list[str] | None = None) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


_NUM = {"type": "number", "minimum": 0, "maximum": 100, "multipleOf": 0.1}

# name -> (schema, prompt)
SUITE: dict[str, tuple[dict, str]] = {
    "flat": (
        _obj({"name": _str(24), "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
        "Extract the person as JSON: Maria Lopez is 34 and lives in Madrid.",
    ),
    "nested": (
        _obj(
            {
                "name": _str(24),
                "address": _obj({"street": _str(32), "city": _str(20), "zip": _str(5, pattern="^[0-9]{5}$")}),
            }
        ),
        "Give the contact as JSON: John Smith, 12 Oak Street, Springfield, 62704.",
    ),
    "enums": (
        _obj({"status": {"enum": ["open", "closed", "pending"]}, "priority": {"enum": [1, 2, 3]}}),
        "A ticket is still waiting for review and is of top priority (1). Give its status and priority as JSON.",
    ),
    "array_of_strings": (
        _obj({"tags": {"type": "array", "items": _str(12), "minItems": 1, "maxItems": 4}}),
        "Give up to four one-word tags for a blog post about baking sourdough bread, as JSON.",
    ),
    "number_ranges": (
        _obj(
            {
                "price": {"type": "number", "minimum": 0, "maximum": 1000, "multipleOf": 0.01},
                "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                "discount": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.01},
            }
        ),
        "An order: 3 chairs at 45.50 each with a 10% discount. Give price, quantity and discount (0 to 1) as JSON.",
    ),
    "string_patterns": (
        _obj({"sku": _str(8, pattern="^[A-Z]{3}-[0-9]{4}$"), "date": _str(10, pattern="^[0-9]{4}-[0-9]{2}-[0-9]{2}$")}),
        "Product ABC-1234 was shipped on March 5, 2024. Give its SKU and the date (YYYY-MM-DD) as JSON.",
    ),
    "optional_fields": (
        _obj(
            {"name": _str(24), "nickname": _str(16), "age": {"type": "integer", "minimum": 0, "maximum": 120}},
            required=["name"],
        ),
        "Describe Robert, known as Bob, as JSON (name, and a nickname or age if known).",
    ),
    "any_of": (
        _obj(
            {
                "answer": {
                    "anyOf": [
                        {"type": "integer", "minimum": 0, "maximum": 1000},
                        _str(20),
                        {"type": "null"},
                    ]
                }
            }
        ),
        "How many legs do three spiders have in total? Answer as JSON with the field answer.",
    ),
    "booleans": (
        _obj({"vegan": {"type": "boolean"}, "gluten_free": {"type": "boolean"}, "spicy": {"type": "boolean"}}),
        "A dish of rice, beans, chili and cheese: is it vegan, gluten free, spicy? Answer as JSON.",
    ),
    "array_of_objects": (
        _obj(
            {
                "items": {
                    "type": "array",
                    "items": _obj({"name": _str(16), "qty": {"type": "integer", "minimum": 1, "maximum": 20}}),
                    "minItems": 1,
                    "maxItems": 4,
                }
            }
        ),
        "Shopping list: two apples, a loaf of bread and six eggs. Give the items and quantities as JSON.",
    ),
    "nested_arrays": (
        _obj(
            {
                "grid": {
                    "type": "array",
                    "items": {
                        "type": "array",
                        "items": {"type": "integer", "minimum": 0, "maximum": 9},
                        "minItems": 3,
                        "maxItems": 3,
                    },
                    "minItems": 3,
                    "maxItems": 3,
                }
            }
        ),
        "Give a 3 by 3 tic-tac-toe board as JSON, 0 for empty, 1 for X and 2 for O, with X on the diagonal.",
    ),
    "const": (
        _obj({"type": {"const": "event"}, "level": {"enum": ["info", "warning", "error"]}, "message": _str(40)}),
        "Log the disk becoming full as a JSON event with a level and a short message.",
    ),
    "formats": (
        _obj({"email": _str(40, format="email"), "day": _str(10, format="date")}),
        "Alice (alice@example.com) signed up on 2023-07-14. Give her email and the day as JSON.",
    ),
    "nullable": (
        _obj({"title": _str(32), "subtitle": {"type": ["string", "null"], "maxLength": 32}}),
        "The book 'Dune' has no subtitle. Give its title and subtitle (null if none) as JSON.",
    ),
    "deep": (
        _obj({"a": _obj({"b": _obj({"c": _obj({"value": {"type": "integer", "minimum": 0, "maximum": 100}})})})}),
        "Put the number 42 at a.b.c.value in a JSON object.",
    ),
    "refs": (
        {
            "$defs": {
                "point": _obj(
                    {
                        "x": {"type": "integer", "minimum": -99, "maximum": 99},
                        "y": {"type": "integer", "minimum": -99, "maximum": 99},
                    }
                )
            },
            **_obj({"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}}),
        },
        "A line goes from (1, 2) to (5, -3). Give its start and end points as JSON.",
    ),
    "top_level_array": (
        {"type": "array", "items": _str(16), "minItems": 1, "maxItems": 5},
        "List up to five primary and secondary colours as a JSON array of strings.",
    ),
    "mixed_types": (
        _obj(
            {
                "id": {"type": "integer", "minimum": 1, "maximum": 99999},
                "score": {"type": "number", "minimum": 0, "maximum": 10, "multipleOf": 0.5},
                "label": _str(16),
                "active": {"type": "boolean"},
                "tags": {"type": "array", "items": {"enum": ["new", "sale", "popular"]}, "maxItems": 3},
            }
        ),
        "Product 1042, rated 8.5, label 'Desk lamp', on sale and popular, currently active. Give it as JSON.",
    ),
    "one_of_objects": (
        _obj(
            {
                "shape": {
                    "anyOf": [
                        _obj({"kind": {"const": "circle"}, "radius": _NUM}),
                        _obj(
                            {
                                "kind": {"const": "rect"},
                                "width": _NUM,
                                "height": _NUM,
                            }
                        ),
                    ]
                }
            }
        ),
        "A rectangle 4 wide and 3 high. Describe the shape as JSON.",
    ),
    "record_list": (
        _obj(
            {
                "people": {
                    "type": "array",
                    "items": _obj(
                        {
                            "name": _str(20),
                            "role": {"enum": ["author", "editor", "reviewer"]},
                            "years": {"type": "integer", "minimum": 0, "maximum": 50},
                        }
                    ),
                    "minItems": 1,
                    "maxItems": 3,
                },
                "count": {"type": "integer", "minimum": 0, "maximum": 3},
            }
        ),
        "Ann wrote the book over 2 years, Ben edited it for 1 year and Cy reviewed it. List the people as JSON.",
    ),
}

# Spec-Bench questions (extraction and others) answered in this shape: a summary, up to four named items with a
# score and a confidence
EXTRACTION = _obj(
    {
        "summary": _str(160),
        "items": {
            "type": "array",
            "items": _obj({"name": _str(40), "score": {"type": "integer", "minimum": 0, "maximum": 10}}),
            "maxItems": 4,
        },
        "confidence": {"enum": ["low", "medium", "high"]},
    }
)


def extraction_prompt(question: str) -> str:
    """A Spec-Bench question asked for an answer in :data:`EXTRACTION`'s shape."""
    return (
        question + "\n\nAnswer in JSON: a short summary, the items with a score from 0 to 10 each, and your confidence."
    )
