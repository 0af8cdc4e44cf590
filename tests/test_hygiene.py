"""What a user gets needs nothing outside the repository and speaks of the project as it is.

- No path into a development checkout's data folder (``../shared``, ``shared/data``) in the package (every file,
  the shipped data included), the docs, the README or the scripts: users have no such folder.
- No words of the development process (work sessions, numbered levers, issue numbers) in the docs, the README, the
  changelog, the scripts, or the package's comments, docstrings and strings.
- The README stays a product page (at most 160 lines).
- ``specwise distill`` and ``specwise index`` find prompts with no flag and no environment variable: the ones
  shipped in the package.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from specwise.lab import answers

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specwise"
BUILD_OUTPUTS = {".so", ".o", ".pyc", ".pyd", ".dll", ".dylib"}

# ---- what the checks look for -----------------------------------------------------------------------------------

OUTSIDE = re.compile(rb"\.\./shared|shared/data")

PROCESS_WORDS = re.compile(
    r"\bsessions?\b"  # a work session ("measured in the session", "session 15")
    r"|\blevers?\s+\d"  # a numbered lever of a study plan
    r"|\bissues?\s*#?\d+\b(?![.,]\d)"  # "issue 12", "issue #12" (not "issues 0.58 instructions")
    r"|(?<![\w#&/])#\d{1,4}\b"  # "#41" (not C's token pasting "##256", an HTML entity or a URL's anchor)
    r"|\bthe lead\b",  # whoever leads the work
    re.IGNORECASE,
)


def test_the_patterns_find_what_they_mean_and_nothing_else():
    for text in (
        "measured in the session",
        "Session 15 made it faster",
        "lever 3",
        "see issue 12",
        "issue #41",
        "fixed in #41",
        "the lead measured it",
    ):
        assert PROCESS_WORDS.search(text), text
    for text in (
        "This core issues 0.58 instructions per cycle",
        "key_scores##SUFFIX##256(q)",
        "docs/FIGURES.md#the-light-core",
        "oasst-model-eval/en_100_text.jsonl#3",
        "the suffix LEAD tokens",
        "a leading run of True",
        "helpers chat templates expect",
    ):
        assert not PROCESS_WORDS.search(text), text
    assert OUTSIDE.search(b"--prompts-dir ../shared/data/prompts") and OUTSIDE.search(b"`shared/data/prompts`")
    assert not OUTSIDE.search(b"specwise/shipped/prompts, a shared prefix, data/")


# ---- the files they read ----------------------------------------------------------------------------------------


def _files(folder: Path):
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in BUILD_OUTPUTS:
            yield path


def product_files() -> list[Path]:
    """Every file of the package, the docs, the README, the changelog and the scripts."""
    files = [*_files(PACKAGE), *_files(ROOT / "docs"), *_files(ROOT / "scripts")]
    return files + [ROOT / "README.md", ROOT / "CHANGELOG.md"]


def prose(path: Path) -> str:
    """The words of a file a reader sees: a Python file's comments and strings (docstrings, help, messages), every
    other text file whole. Third-party prompts (``*.prompts.jsonl``) and binary files have none of the project's."""
    if path.name.endswith(".prompts.jsonl"):
        return ""
    data = path.read_bytes()
    if b"\0" in data[:4096]:
        return ""
    text = data.decode("utf-8")
    if path.suffix != ".py":
        return text
    kept = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING) or token.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            kept.append(f"{token.start[0]}: {token.string}")
    return "\n".join(kept)


def _hits(pattern, data, path: Path) -> list[str]:
    where = path.relative_to(ROOT)
    return [f"{where}: ...{data[max(m.start() - 40, 0) : m.end() + 40]!r}..." for m in pattern.finditer(data)]


def test_the_product_names_no_path_outside_the_repository():
    files = product_files()
    assert len(files) > 50 and ROOT / "specwise" / "lab" / "answers.py" in files  # the walk sees the package
    hits = [hit for path in files for hit in _hits(OUTSIDE, path.read_bytes(), path)]
    assert hits == [], "paths users do not have (ship the data, or take a flag):\n" + "\n".join(hits)


def test_no_process_words_in_the_docs_or_the_package():
    files = product_files()
    assert any(path.suffix == ".py" for path in files) and ROOT / "docs" / "FIGURES.md" in files
    hits = [hit for path in files for hit in _hits(PROCESS_WORDS, prose(path), path)]
    assert hits == [], "say what the project is and does, not how the work went:\n" + "\n".join(hits)


def test_prose_reads_comments_and_strings_but_not_names(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""Fast since session 9."""\nsession = make()  # a session\nx = 1\n')
    words = prose(path)
    assert "Fast since session 9." in words and "# a session" in words and "session = make" not in words


def test_the_readme_is_a_product_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines: move details to docs/ (at most 160)"
    text = "\n".join(lines)
    assert "make demo" in text and "make test" in text  # the quick start's two commands


def _slug(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rule): lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_into_the_docs_name_headings_that_exist():
    """Anchors (``docs/FIGURES.md#a-busy-machine``) in the README and the docs name a heading of the page they link
    to (that the files exist is tests/test_doc_links.py's check)."""
    broken, checked = [], 0
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)  # links, not code
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path, _, anchor = target.partition("#")
            if not anchor or re.match(r"[a-z]+:", target):
                continue
            linked = (page.parent / path).resolve() if path else page
            if linked.suffix != ".md" or not linked.exists():
                continue
            checked += 1
            headings = re.findall(r"^#+ (.+)$", linked.read_text(encoding="utf-8"), flags=re.MULTILINE)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert checked > 20 and broken == [], "\n".join(broken)


def test_slugs_follow_the_renderers_rule():
    assert _slug("The default model against llama.cpp") == "the-default-model-against-llamacpp"
    assert _slug("Suffix drafter and `specwise index`") == "suffix-drafter-and-specwise-index"


# ---- the prompts shipped for distill and index ------------------------------------------------------------------


def test_prompts_default_to_the_shipped_ones(monkeypatch):
    monkeypatch.delenv("SPECWISE_PROMPTS", raising=False)
    directory = answers.resolve_prompts_dir()
    assert directory == answers.SHIPPED_PROMPTS and directory.is_relative_to(PACKAGE)
    prompts, tasks = answers.gather_prompts(answers.AnswerOptions(prompts_dir=directory))
    assert len(prompts) >= 100 and tasks == [] and all(p.strip() for p in prompts)
    assert (directory / "README.md").is_file()  # their sources and licences


@pytest.mark.parametrize("command", ["distill", "index"])
def test_the_commands_read_the_shipped_prompts_without_a_flag(command, monkeypatch, tmp_path):
    from specwise.cli import build_parser

    parser = build_parser()
    monkeypatch.delenv("SPECWISE_PROMPTS", raising=False)
    opts = answers.answer_options(parser.parse_args([command, "--out", "o"]))
    assert opts["prompts_dir"] == answers.SHIPPED_PROMPTS
    monkeypatch.setenv("SPECWISE_PROMPTS", str(tmp_path))  # the variable, then the flag, come first
    assert answers.answer_options(parser.parse_args([command, "--out", "o"]))["prompts_dir"] == tmp_path
    flagged = parser.parse_args([command, "--out", "o", "--prompts-dir", "mine"])
    assert answers.answer_options(flagged)["prompts_dir"] == Path("mine")


def test_the_shipped_prompts_are_package_data():
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    patterns = data.get("specwise.shipped.prompts", [])
    shipped = [p for p in answers.SHIPPED_PROMPTS.iterdir() if p.suffix in (".jsonl", ".md")]
    assert len(shipped) >= 3 and (answers.SHIPPED_PROMPTS / "__init__.py").is_file()
    for path in shipped:
        assert any(path.match(pattern) for pattern in patterns), f"{path.name} is not in the package data"


def test_a_prompts_directory_is_any_folder_of_prompt_files(tmp_path):
    (tmp_path / "mine.prompts.jsonl").write_text('{"prompt": "one"}\n\n{"prompt": "two", "source": "me"}\n')
    (tmp_path / "notes.txt").write_text("not prompts")
    assert sorted(answers.gather_prompts(answers.AnswerOptions(prompts_dir=tmp_path))[0]) == ["one", "two"]
    (tmp_path / "bad.prompts.jsonl").write_text('{"text": "no prompt key"}\n')
    with pytest.raises(ValueError, match=r"bad\.prompts\.jsonl:1: .*\"prompt\""):
        answers.gather_prompts(answers.AnswerOptions(prompts_dir=tmp_path))
    with pytest.raises(FileNotFoundError, match="--prompts-dir"):
        answers.gather_prompts(answers.AnswerOptions(prompts_dir=tmp_path / "empty"))
