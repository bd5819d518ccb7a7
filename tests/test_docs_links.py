"""Every link between the docs resolves: the relative links and images of README.md and
docs/**/*.md, and every `docs/...md#anchor` the code's comments cite. Anchors are
explicit ids (`<a id="b-...">` in the benchmarks' history, `<a id="a-...">` in
docs/architecture.md) or GitHub's slugs of headings. A citation by a quoted heading
(`docs/benchmarks.md, "Some heading"`) breaks when the heading changes, so the
benchmarks and the architecture page are cited by anchor only; docs/wire.md, which has
no explicit anchors, may be cited by a quoted fragment that must occur in it. Reads
files only: no network, no Django."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CODE_DIRS = ("collab", "static", "templates", "tests", "deploy")
CODE_SUFFIXES = {".py", ".js", ".html", ".toml", ".txt", ".md", ".cfg"}

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
CITED = re.compile(r"\bdocs/[\w./-]+\.(?:md|png)(?:#[\w-]+)?")
BY_HEADING = re.compile(r"docs/(benchmarks|architecture)\.md,?\s+\(?\"")
WIRE_QUOTE = re.compile(r"docs/wire\.md,\s+((?:\"[^\"]+\"(?:,\s*|\s+and\s+)?)+)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation gone, spaces to
    hyphens."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        found.update(ANCHOR.findall(line))
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def check(target: Path, fragment: str | None, where: str) -> str | None:
    if not target.exists():
        return f"{where}: no such file {target.relative_to(ROOT)}"
    if fragment and target.suffix == ".md" and fragment not in anchors(target):
        return f"{where}: no anchor #{fragment} in {target.relative_to(ROOT)}"
    return None


def doc_links() -> list[str]:
    problems = []
    for doc in DOCS:
        fenced = False
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            if FENCE.match(line):
                fenced = not fenced
            if fenced:
                continue
            for url in LINK.findall(line):
                if re.match(r"^[a-z]+:", url) or url.startswith("//"):
                    continue  # http(s), mailto: not checked here
                path, _, fragment = url.partition("#")
                target = (doc.parent / path).resolve() if path else doc
                problem = check(target, fragment or None, f"{doc.relative_to(ROOT)}:{number} ({url})")
                if problem:
                    problems.append(problem)
    return problems


def code_files() -> list[Path]:
    files = [ROOT / "pyproject.toml", ROOT / "Makefile"]
    this = Path(__file__).resolve()
    for name in CODE_DIRS:
        for path in sorted((ROOT / name).rglob("*")):
            if path.suffix in CODE_SUFFIXES and path.is_file() and "vendor" not in path.parts and path != this:
                files.append(path)
    return [f for f in files if f.exists()]


def code_citations() -> list[str]:
    problems = []
    wire = (ROOT / "docs" / "wire.md").read_text(encoding="utf-8").lower()
    for path in code_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        joined = re.sub(r"\n\s*(?:#\s*|//\s*|\*\s*)?", " ", text)  # a citation may wrap a line
        where = str(path.relative_to(ROOT))
        for cited in set(CITED.findall(text)):
            file, _, fragment = cited.partition("#")
            problem = check(ROOT / file, fragment or None, f"{where} ({cited})")
            if problem:
                problems.append(problem)
        for m in BY_HEADING.finditer(joined):
            problems.append(f"{where}: cites docs/{m.group(1)}.md by a heading, not an anchor")
        for m in WIRE_QUOTE.finditer(joined):
            for quoted in re.findall(r"\"([^\"]+)\"", m.group(1)):
                if quoted.lower() not in wire:
                    problems.append(f'{where}: docs/wire.md has no "{quoted}"')
    return problems


def test_doc_links_resolve() -> None:
    assert doc_links() == []


def test_code_citations_resolve() -> None:
    assert code_citations() == []


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Agent runs (`agents`)", "agent-runs-agents"),
        ("Load test report (`loadtest --json FILE`)", "load-test-report-loadtest---json-file"),
    ],
)
def test_slug(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


if __name__ == "__main__":
    for line in doc_links() + code_citations():
        print(line)
    print(f"checked {len(DOCS)} docs and {len(code_files())} code files")
