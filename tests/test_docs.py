"""The README and docs/ hold what a newcomer needs, where they look first, with no dead links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def test_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) < 300


def test_first_screen_says_what_it_is_how_to_add_it_and_how_to_start() -> None:
    first = "\n".join(README.read_text().splitlines()[:70])
    for needed in ("pip install", "./dev demo", "./dev test", "```python", "delayq_enabled", "apply_async(",
                   "How it turns on", "GLANCE:START"):
        assert needed in first, needed


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    dead = [target for target, _ in LINK.findall(page.read_text())
            if "://" not in target and not target.startswith("mailto:")
            and not (page.parent / target).exists()]
    assert not dead, f"{page.name} links to missing files: {dead}"


def test_every_doc_is_linked_from_the_readme() -> None:
    text = README.read_text()
    orphans = [p.name for p in DOCS if f"docs/{p.name}" not in text]
    assert not orphans, orphans
