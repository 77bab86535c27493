"""The house's layout rules that a reader relies on, checked where they can drift: every tracked Python file's lines
within 120 characters (the width the code, its comments and its docstrings are wrapped to), and the product's
classes within the size past which one is split by its concerns (the tests' own files are left out: a test module
grows with what it tests). A module's length is no rule: a module is split where its concern splits, never
squeezed under a count."""
import ast
import shutil
import subprocess

import pytest

from conftest import ROOT

WIDTH = 120
CLASS_LINES = 250


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


def test_no_product_class_past_its_size():
    big = []
    for name in _tracked_python():
        if name.startswith("tests/"):
            continue
        text = (ROOT / name).read_text()
        big += [f"{name}: class {n.name}: {n.end_lineno - n.lineno + 1} lines" for n in ast.walk(ast.parse(text))
                if isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > CLASS_LINES]
    assert not big, "\n".join(big)
