"""The docs speak to users: no page uses terms only the authors know (the project's history, its
issue numbers, or the folder of papers and data beside the authors' checkout), and no package file
points a reader at that folder."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PACKAGE_FILES = sorted(p for p in (ROOT / "ensemble_bench").rglob("*")
                       if p.is_file() and p.suffix in {".py", ".yaml", ".csv", ".md", ".txt"})
AUTHORS_TERMS = {
    "the project's history": re.compile(r"\bthe seeds\b|\(seeds,|seed (?:papers?|methods?)", re.I),
    "an issue number": re.compile(r"\bissues? #?\d+", re.I),
    "the authors' shared folder": re.compile(r"(?<![\w.-])shared/"),
}


def authors_terms(text: str) -> list[str]:
    return [f"{what}: {match.group(0)!r}" for what, pattern in AUTHORS_TERMS.items()
            for match in pattern.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_use_no_authors_only_terms(page):
    assert authors_terms(page.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_package_names_no_shared_folder(path):
    assert AUTHORS_TERMS["the authors' shared folder"].search(path.read_text(encoding="utf-8")) is None


def test_the_check_finds_each_term():
    found = authors_terms("the methods after the seeds (issue 21) cite shared/papers/000.txt")
    assert [line.split(":")[0] for line in found] == ["the project's history", "an issue number",
                                                      "the authors' shared folder"]
    assert authors_terms("an ensemble of two models; see docs/papers.md and sharedfolder/x") == []
