"""README is the first minutes (what it answers, the seed's answer, install, the commands, where the manual is);
the manual is docs/, one page per task or reference. Every relative link in them resolves."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, blanks as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).strip().replace(" ", "-")


def test_the_readme_is_for_the_first_minutes():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 300


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    text = page.read_text(encoding="utf-8")
    for href in _LINK.findall(text):
        if re.match(r"^[a-z]+://|^mailto:", href):
            continue
        path, _, anchor = href.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), (page, href)
        if anchor and target.suffix == ".md":
            headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.M)}
            assert anchor in headings, (page, href)


def test_the_manual_has_a_page_per_task_and_reference():
    names = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert {"inspect.md", "fleets-and-ssh.md", "analyze.md", "report.md", "cron-prometheus-alerts.md",
            "kubernetes.md", "engines/sglang.md", "engines/vllm.md", "engines/trtllm.md", "json.md", "exit-codes.md",
            "how-it-works.md", "development.md"} <= names
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert all("docs/" + name in readme for name in names)  # the README links every page
