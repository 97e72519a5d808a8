"""The documentation is reachable: every file in `docs/` is linked from the README (issue 28),
and every `docs/...` path the README names exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_doc_is_linked_from_the_readme_and_every_link_exists():
    readme = (REPO / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[^)#\s]+)\)", readme))
    present = {f"docs/{p.name}" for p in (REPO / "docs").iterdir() if p.is_file()}
    assert present - linked == set(), f"not linked from README.md: {sorted(present - linked)}"
    named = set(re.findall(r"(docs/[\w./-]+\.(?:md|json))", readme))
    assert named - present == set(), f"README.md names what docs/ does not have: {sorted(named - present)}"
