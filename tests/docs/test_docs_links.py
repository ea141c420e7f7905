"""Every relative link in README.md and the docs (docs/**/*.md) resolves: the file or folder exists and, for a
``#fragment`` into a Markdown file, that file has a heading with that anchor (GitHub's rule: lower
case, punctuation dropped, spaces to hyphens, ``-1``, ``-2`` ... for repeats). Links inside code
blocks and code spans are not links and are skipped; http(s) and mailto links are not checked."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """The heading anchors GitHub gives ``page``."""
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"^(https?:|mailto:)", target):
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target} (no heading #{fragment})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_the_checker_sees_links_and_anchors():
    assert "docs/methods/token_level.md#gac-method-gac" in links(ROOT / "README.md")
    assert "gac-method-gac" in anchors(ROOT / "docs" / "methods" / "token_level.md")
    assert "methods/token_level.md" in links(ROOT / "docs" / "methods.md")
    assert prose("a `[x](nowhere)` b\n```\n[y](nowhere)\n```\n") == "a  b\n\n"


def test_readme_is_a_front_page():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 300
