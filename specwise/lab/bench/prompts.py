"""The benchmark's inputs: the project's own small prompt set (the default) and Spec-Bench question files.

The default set is written for this project (it is not taken from Spec-Bench or any other benchmark): one prompt
per kind of task, some of which copy from their prompt (where prompt lookup shines) and some of which do not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BenchPrompt",
    "DEFAULT_PROMPTS",
    "default_prompts",
    "interleave_categories",
    "load_questions",
    "select_prompts",
]


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt: a stable id, its category and the user message."""

    id: str
    category: str
    text: str


_PASSAGE = (
    "The town library opened in 1911 with four hundred books donated by a retired sea captain. For decades it "
    "occupied two rooms above the post office. In 1968 it moved into a converted grain warehouse by the river, "
    "where the high ceilings let the librarians build a mezzanine for the children's collection. A flood in 1994 "
    "damaged the ground floor, and volunteers spent a summer drying and rebinding more than three thousand "
    "volumes. Today the library lends tools and seeds as well as books, and its reading room is open until ten "
    "o'clock every night."
)

DEFAULT_PROMPTS: tuple[BenchPrompt, ...] = (
    BenchPrompt("own-writing", "writing", "Write a short story about a lighthouse keeper who finds a map in a bottle."),
    BenchPrompt("own-summary", "summarization", f"{_PASSAGE}\n\nSummarize the passage above in three sentences."),
    BenchPrompt(
        "own-extraction",
        "extraction",
        f"{_PASSAGE}\n\nList every year mentioned in the passage above, each with the event it marks.",
    ),
    BenchPrompt(
        "own-coding",
        "coding",
        "Write a Python function `count_vowels(text)` that returns how many vowels a string contains. "
        "Add a docstring and two usage examples.",
    ),
    BenchPrompt(
        "own-math",
        "math",
        "A cyclist rides 18 km in 45 minutes, rests for 15 minutes, then rides 12 km in 30 minutes. "
        "What is her average speed over the whole trip, rest included? Show each step.",
    ),
    BenchPrompt("own-qa", "qa", "Why do we see lightning before we hear thunder? Explain it to a ten-year-old."),
    BenchPrompt(
        "own-translation",
        "translation",
        "Translate into French: The museum is closed on Mondays, but the garden stays open until sunset.",
    ),
)


def default_prompts() -> list[BenchPrompt]:
    """The project's own prompt set, one prompt per category."""
    return list(DEFAULT_PROMPTS)


def load_questions(path: str | Path) -> list[BenchPrompt]:
    """Read a Spec-Bench question file (JSON lines with ``question_id``, ``category`` and ``turns``).

    Only the first turn is used, as a single user message.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"question file not found: {path}")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            turns = item["turns"]
            prompts.append(BenchPrompt(str(item["question_id"]), str(item["category"]), str(turns[0])))
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as err:
            raise ValueError(
                f"{path}:{number}: not a Spec-Bench question ({err!r}); each line must be a JSON object with "
                '"question_id", "category" and a non-empty list "turns"'
            ) from None
    if not prompts:
        raise ValueError(f"{path} holds no questions")
    return prompts


def select_prompts(prompts: list[BenchPrompt], categories: list[str] | None, limit: int | None) -> list[BenchPrompt]:
    """Keep ``categories`` (all when None, in order of first appearance) and the first ``limit`` of each."""
    available = list(dict.fromkeys(p.category for p in prompts))
    wanted = list(dict.fromkeys(categories)) if categories else available
    unknown = [c for c in wanted if c not in available]
    if unknown:
        raise ValueError(f"unknown categories {unknown}: the prompts have {available}")
    if limit is not None and limit < 1:
        raise ValueError(f"the limit per category must be >= 1, got {limit}")
    chosen = []
    for category in wanted:
        of_category = [p for p in prompts if p.category == category]
        chosen.extend(of_category if limit is None else of_category[:limit])
    return chosen


def interleave_categories(prompts: list[BenchPrompt]) -> list[BenchPrompt]:
    """The prompts one category after another in turn (the first of each category, then the second, ...): a load
    test that takes the first n mixes the kinds of task."""
    by_category: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        by_category.setdefault(p.category, []).append(p)
    longest = max((len(v) for v in by_category.values()), default=0)
    return [group[i] for i in range(longest) for group in by_category.values() if i < len(group)]
