"""The README stays a five-minute read and every document is reachable: docs/README.md lists every
doc in docs/, and every relative link in README.md and docs/*.md points at a file of the checkout."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def relative_links(md: Path) -> list[str]:
    return [t for t in LINK.findall(md.read_text(encoding="utf-8")) if not re.match(r"[a-z]+:", t)]


def test_the_readme_is_at_most_150_lines():
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= 150, f"README.md has {n} lines; move detail to docs/ and link it"


def test_docs_readme_lists_every_doc():
    listed = set(relative_links(ROOT / "docs" / "README.md"))
    docs = {p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    assert docs - listed == set(), f"docs/README.md does not list {sorted(docs - listed)}"


def test_every_relative_link_resolves():
    broken = [
        f"{md.relative_to(ROOT)} -> {t}"
        for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for t in relative_links(md)
        if not (md.parent / t).exists()
    ]
    assert broken == []


def test_the_link_finder_finds_links_and_skips_urls(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("[a](a.md) [b](../b/README.md#sec) [c](https://x.org/c.md) `[d](d)`\n")
    assert relative_links(md) == ["a.md", "../b/README.md", "d"]
