"""The README and docs/*.md stay navigable: every relative link names a file that exists
and every anchor a heading of it; the README stays short and names every variable the
settings read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.no_services

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 460

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as
    hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _broken_links(document: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of ``document`` whose file or heading is missing, with why;
    files are named relative to ``root``."""
    broken = []
    for target in LINK.findall(_prose(document.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (document.parent / file_part).resolve() if file_part else document
        if not linked.exists():
            broken.append(f"{target}: no file {linked.relative_to(root)}")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(root)}")
    return broken


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(document: Path) -> None:
    assert _broken_links(document) == []


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Run modes\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#run-modes) [gone](missing.md) [bad anchor](other.md#nothing)\n"
        "`[in code](missing.md)` [web](https://example.com/x) [here](#other)\n"
        "```\n[in a block](missing.md)\n```\n# Other\n"
    )
    assert _broken_links(page, root=tmp_path.resolve()) == [
        "missing.md: no file missing.md",
        "other.md#nothing: no heading #nothing in other.md",
    ]


def test_headings_become_github_anchors() -> None:
    assert _slug("9. Threat model and containment") == "9-threat-model-and-containment"
    assert _slug("Your first task") == "your-first-task"
    assert _slug("`make chaos`: faults, for real") == "make-chaos-faults-for-real"


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; keep it under ~450"


def test_the_readme_names_every_variable_the_settings_read() -> None:
    settings_text = "".join(
        path.read_text() for path in (ROOT / "agentplatform" / "settings").glob("*.py")
    )
    names = set(re.findall(r'\benv_value\(\s*"([A-Z][A-Z0-9_]+)"', settings_text))
    written = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", (ROOT / "README.md").read_text()))
    assert names, "no variables found in agentplatform/settings/"
    assert sorted(names - written) == []
