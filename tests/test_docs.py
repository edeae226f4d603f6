"""The documentation stays true to the repository (issue 38): the README is a short front door, every link between
pages resolves (files and headings), every repository path a page names in code exists, and the MkDocs site
builds in strict mode (a broken link or a page missing from the navigation fails it)."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# A word in a code span that starts with one of these names a file or folder of the repository.
TOP_LEVEL = ("controlplane/", "apps/", "workers/", "templates/", "static/", "tests/", "bench/", "docs/", ".ci/")
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)|\!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.MULTILINE)


def _prose(path: Path) -> str:
    """The page without its fenced code blocks (a diagram or a shell session names no link)."""
    return FENCE.sub("", path.read_text())


def _anchors(path: Path) -> set[str]:
    """The heading ids Python-Markdown's toc gives this page (the text without its inline markup, slugified)."""
    ids = set()
    for heading in HEADING.findall(_prose(path)):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        text = re.sub(r"[*_]{1,2}([^*_]+)[*_]{1,2}", r"\1", text)
        ids.add(slugify(text, "-"))
    return ids


def _links(path: Path) -> list[str]:
    """The link targets of a page's prose (a link written inside a code span is text, not a link)."""
    return [a or b for a, b in LINK.findall(CODE_SPAN.sub("", _prose(path)))]


def _expand(word: str) -> list[str]:
    """`bench/results/x.{json,txt}` names two files."""
    match = re.search(r"\{([^{}]+)\}", word)
    if not match:
        return [word]
    return list(
        itertools.chain.from_iterable(
            _expand(word[: match.start()] + option + word[match.end() :]) for option in match.group(1).split(",")
        )
    )


def _named_paths(path: Path) -> list[str]:
    named = []
    for span in CODE_SPAN.findall(_prose(path)):
        for word in span.split():
            word = word.strip(",;:)(\"'").split("::")[0]
            if not word.startswith(TOP_LEVEL) or any(c in word for c in "<>*$…") or "..." in word:
                continue
            named.extend(_expand(word))
    return named


def test_the_readme_is_a_short_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move sections into docs/ (issue 38 asks for ~300)"
    for section in ("## Two commands", "## A five-minute tour", "## Repository map", "## Documentation"):
        assert section in lines, f"README.md lost its {section!r} section"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_of_a_page_resolves(page: Path) -> None:
    broken = []
    for href in _links(page):
        if href.startswith(("http://", "https://", "mailto:")):
            continue
        target, _, anchor = href.partition("#")
        file = (page.parent / target).resolve() if target else page
        if not file.exists():
            broken.append(f"{href}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{href}: {file.relative_to(ROOT)} has no heading with the id {anchor!r}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_a_page_names_exists(page: Path) -> None:
    missing = sorted({word for word in _named_paths(page) if not (ROOT / word.rstrip("/.")).exists()})
    assert not missing, f"{page.relative_to(ROOT)} names paths that are not in the repository: {missing}"


def test_every_docs_page_is_in_the_site_navigation_and_the_site_builds_strict(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()


def test_no_file_cites_a_document_outside_the_repository() -> None:
    """The methods and architecture the code cites are docs/methods.md and docs/architecture.md: a bare file name
    outside docs/ (or a path into a folder beside the repository) names a file a reader of the repository cannot
    open."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    outside = re.compile(r"(?<![\w/.-])(methods|architecture)\.md|\.\./shared/|shared/(methods|architecture)\.md")
    offenders = []
    for name in tracked:
        path = ROOT / name
        if (
            name.startswith("docs/")
            or name == "mkdocs.yml"
            or path.suffix not in {".py", ".md", ".html", ".js", ".txt"}
        ):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if outside.search(line):
                offenders.append(f"{name}:{number}")
    assert not offenders, f"cite docs/methods.md or docs/architecture.md instead: {offenders[:20]}"
