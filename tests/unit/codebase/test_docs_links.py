"""The docs stand on their own: every relative link in the README and docs/ names a file of the repository, and every
page of docs/ is reachable from the index."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_names_a_file_of_the_repository():
    broken = []
    for page in _pages():
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists() or ROOT not in path.parents:
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_the_index_reaches_every_page():
    index = (ROOT / "docs" / "index.md").read_text()
    unlisted = [p.name for p in (ROOT / "docs").glob("*.md") if p.name != "index.md" and f"]({p.name}" not in index]
    assert not unlisted, f"docs/index.md does not list {unlisted}"
