"""The docs, the READMEs and the configs name no machine's paths: not this checkout's, not the
home folder's, not an installed package's beyond its ``site-packages/`` (generated docs, such as
``make zoo``'s and ``make bench``'s, are written from runs on some machine)."""

import glob
import os
import re

import pytest

from tests.conftest import REPO

#: What the test reads: every doc, both READMEs, every config, the bench runs docs are made from.
PATTERNS = ("docs/**/*", "README*.md", "configs/**/*", "tools/benchmarks/runs/*")


def files():
    found = set()
    for pattern in PATTERNS:
        found.update(p for p in glob.glob(os.path.join(REPO, pattern), recursive=True))
    return sorted(p for p in found if os.path.isfile(p) and "__pycache__" not in p)


def machine_paths():
    """Patterns of this machine's paths: the checkout, the home folder (each as a whole folder
    name), and a path that goes on into ``site-packages``."""
    found = [re.compile(r"[\w.~+-]/(?:site|dist)-packages\b")]
    for folder in (REPO, os.path.expanduser("~")):
        folder = folder.rstrip("/\\")
        if folder and folder != "~":
            found.append(re.compile(re.escape(folder) + r"(?![\w.-])"))
    return found


def test_the_checked_files_are_found():
    names = [os.path.relpath(p, REPO) for p in files()]
    assert "README.md" in names and "README_zh-CN.md" in names
    assert os.path.join("docs", "zoo.md") in names
    assert os.path.join("configs", "_base_", "gcu_runtime.py") in names


@pytest.mark.parametrize("path", files(), ids=lambda p: os.path.relpath(p, REPO))
def test_no_machine_path(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    for pattern in machine_paths():
        match = pattern.search(text)
        assert match is None, (
            f"{match.group(0)!r} at line {text.count(chr(10), 0, match.start()) + 1}"
        )


@pytest.mark.parametrize("name", ["README.md", "README_zh-CN.md"])
def test_the_readme_is_the_users_path_in_under_250_lines(name):
    """Test internals and measurements live in docs/ (development.md, performance.md)."""
    with open(os.path.join(REPO, name), encoding="utf-8") as f:
        lines = f.read().count("\n")
    assert lines < 250, f"{name}: {lines} lines; move developer content to docs/"
