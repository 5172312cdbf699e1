"""The docs are whole within the repository: every page under docs/ is linked from README.md, every relative link
in README.md and docs/ names a file that exists, and no tracked file names a path outside the repository."""

import re
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # a Markdown link's target, without its anchor
OUTSIDE = re.compile(r"\.\./shared|/work/")  # paths of the machines the project was made on, not of a clone


def markdown_pages() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def test_every_docs_page_is_linked_from_the_readme():
    linked = set(LINK.findall((REPO_ROOT / "README.md").read_text()))
    pages = {f"docs/{page.name}" for page in (REPO_ROOT / "docs").glob("*.md")}
    assert pages - linked == set()


def test_every_relative_link_names_a_file_of_the_repository():
    missing = [(page.name, target) for page in markdown_pages() for target in LINK.findall(page.read_text())
               if "://" not in target and not target.startswith("mailto:")
               and not (page.parent / target).exists()]
    assert missing == []


def test_no_tracked_file_names_a_path_outside_the_repository():
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    naming = [name for name in tracked if (REPO_ROOT / name).is_file() and name != Path(__file__).relative_to(
        REPO_ROOT).as_posix() and OUTSIDE.search((REPO_ROOT / name).read_text(errors="replace"))]
    assert naming == []
