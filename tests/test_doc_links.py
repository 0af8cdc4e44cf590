"""Every relative link in the project's Markdown files resolves to a file or folder of the checkout."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".git", ".venv", "build", "node_modules", ".pytest_cache"}
# [text](target) with an optional title; images too. Code spans are removed before matching.
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def markdown_files() -> list[Path]:
    return sorted(
        p
        for p in ROOT.rglob("*.md")
        if not any(part in SKIP or part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)
    )


def relative_links(text: str) -> list[str]:
    text = CODE.sub("", FENCE.sub("", text))
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # a URL (http:, mailto:) or an anchor in the same page
        out.append(target.split("#", 1)[0])
    return out


def test_the_link_pattern_finds_links_and_skips_code():
    text = "see [a](docs/A.md#x) and ![p](img.png) `[no](code.md)`\n```\n[no](fenced.md)\n```\n[u](https://x.org)"
    assert relative_links(text) == ["docs/A.md", "img.png"]


def uncommitted_plot(path: Path, target: str) -> bool:
    """A `specwise bench` report's plots: only results.json and report.md of a run are committed."""
    return path.name == "report.md" and path.parent.parent.name == "results" and target.endswith(".png")


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path):
    targets = [t for t in relative_links(path.read_text(encoding="utf-8")) if not uncommitted_plot(path, t)]
    missing = [t for t in targets if not (path.parent / t).exists()]
    assert not missing, f"{path.relative_to(ROOT)}: links to missing {missing}"
