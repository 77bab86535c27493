"""The house's layout rules that a reader relies on, checked where they can drift: every tracked Python file's lines
within 120 characters (the width the code, its comments and its docstrings are wrapped to)."""
import shutil
import subprocess

import pytest

from conftest import ROOT

WIDTH = 120


def _tracked_python() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.split()


def test_every_python_line_fits_the_width():
    long = [f"{name}:{i}: {len(line)} characters"
            for name in _tracked_python()
            for i, line in enumerate((ROOT / name).read_text().splitlines(), 1) if len(line) > WIDTH]
    assert not long, "\n".join(long)
