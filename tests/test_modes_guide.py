"""Each mode's hint (core/modes.py MODE_GUIDE) is one definition: the console's Modes tab shows it and
docs/modes.md quotes it word for word, so the two cannot drift apart."""

from __future__ import annotations

from pathlib import Path

from core.modes import MODE_GUIDE, MODES

DOCS = Path(__file__).resolve().parent.parent / "docs" / "modes.md"


def test_every_mode_has_a_guide() -> None:
    assert list(MODE_GUIDE) == list(MODES)
    for guide in MODE_GUIDE.values():
        assert guide.what and guide.use_when and guide.avoid_when


def test_docs_quote_each_guide_as_the_code_has_it() -> None:
    text = DOCS.read_text()
    for name, guide in MODE_GUIDE.items():
        row = f"| `{name}` | {guide.what} | {guide.use_when} | {guide.avoid_when} |"
        assert row in text, f"docs/modes.md's 'When to use which' row for {name} differs from MODE_GUIDE"
