"""The README's promises that can rot silently: its example profile loads and runs, and its links resolve.

The example profile is the YAML block after the `readme-example-profile` marker in README.md; it is
validated with the same loader `--profile` uses and run for a few requests on the simulator. Every relative
link (and image) in README.md and docs/*.md must point at a file that exists, and an `#anchor` at a heading
of that file (GitHub's slug rules), so moving a page or renaming a heading breaks a test, not a reader.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.profile import load_profile
from core.profile.loading import load_calibration

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MARKER = "<!-- readme-example-profile"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _example_yaml() -> str:
    text = README.read_text()
    at = text.find(MARKER)
    assert at >= 0, "README.md lost its example profile marker"
    block = re.search(r"```yaml\n(.*?)```", text[at:], re.S)
    assert block is not None, "no ```yaml block after the example profile marker"
    return block.group(1)


def test_readme_example_profile_loads(tmp_path: Path) -> None:
    path = tmp_path / "my-chat.yaml"
    path.write_text(_example_yaml())
    profile = load_profile(path)
    assert profile.name == "my-chat"
    assert profile.workload.tasks, "the example should define a task"
    load_calibration(profile)  # the calibration it names resolves from any directory


def test_readme_example_profile_runs(tmp_path: Path) -> None:
    path = tmp_path / "my-chat.yaml"
    path.write_text(_example_yaml())
    done = subprocess.run(
        [sys.executable, "-m", "console", "--batch", "--profile", str(path), "--requests", "60"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["event"] == "summary"
    assert summary["completed"] > 0


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _prose_lines(path: Path) -> list[str]:
    lines, in_code = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            lines.append(line)
    return lines


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose_lines(path):
        match = re.match(r"^#{1,6} (.+)$", line)
        if not match:
            continue
        slug = _slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def _links(path: Path) -> list[str]:
    found = []
    for line in _prose_lines(path):
        # Inline code may show link-like text that is not a link.
        found += LINK.findall(re.sub(r"`[^`]*`", "", line))
    return found


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_link_checker_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[gone](missing.md) [fine](#title) [bad anchor](#nope)\n```\n[in code](x.md)\n```\n")
    assert _links(page) == ["missing.md", "#title", "#nope"]
    assert _anchors(page) == {"title"}


def test_readme_stays_a_manual_of_at_most_350_lines() -> None:
    # The README is the user's manual; measurements live in docs/ (house style: <= 350 lines).
    lines = README.read_text().count("\n")
    assert lines <= 350, f"README.md has {lines} lines; move detail to docs/ (at most 350)"
