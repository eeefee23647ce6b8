"""The docs state rules; they do not send the reader to section numbers of specifications
this repository does not contain ("seed 000 §3.6")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_doc_cites_a_section_number() -> None:
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        assert "§" not in text, doc.name
        assert not re.search(r"seed 00\d §|seed §", text, re.I), doc.name
