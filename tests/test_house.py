"""The house's layout rules that a reader relies on, checked where they can drift: every tracked Python file's lines
within 120 characters (the width the code, its comments and its docstrings are wrapped to), and the product's
classes within the size past which one is split by its concerns (the tests' own files are left out: a test module
grows with what it tests), and no comment continued in the right margin of the line below it (a comment too long
for its line goes above the code it explains). A module's length is no rule: a module is split where its concern
splits, never squeezed under a count."""

import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize

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
    long = [
        f"{name}:{i}: {len(line)} characters"
        for name in _tracked_python()
        for i, line in enumerate((ROOT / name).read_text().splitlines(), 1)
        if len(line) > WIDTH
    ]
    assert not long, "\n".join(long)


def test_no_product_class_past_its_size():
    big = []
    for name in _tracked_python():
        if name.startswith("tests/"):
            continue
        text = (ROOT / name).read_text()
        big += [
            f"{name}: class {n.name}: {n.end_lineno - n.lineno + 1} lines"
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > CLASS_LINES
        ]
    assert not big, "\n".join(big)


MARGIN = re.compile(r"#\s{3,}\S")  # a comment whose words start far right of its '#': a margin's continuation


def margin_continuations(text: str) -> list[int]:
    """The lines of `text` whose comment continues the comment of the line above it in the right margin."""
    comments = {
        t.start[0]: t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT
    }
    return [r for r, c in sorted(comments.items()) if r - 1 in comments and MARGIN.match(c)]


def test_no_comment_is_continued_in_the_right_margin():
    cases = ("tests/judge_cases/", "tests/wrong/", "tests/box/", "tests/batch/")  # candidates as their authors wrote
    found = [
        f"{name}:{r}"
        for name in _tracked_python()
        if not name.startswith(cases)
        for r in margin_continuations((ROOT / name).read_text())
    ]
    assert not found, "\n".join(found)


def test_the_margin_check_sees_a_continued_comment():
    text = "x = 1  # the first words\n#      and the rest\ny = 2  # one comment\n# a comment of its own\n"
    assert margin_continuations(text) == [2]


def _ruff() -> list[str] | None:
    if shutil.which("ruff"):
        return ["ruff"]
    try:
        import ruff  # noqa: F401

        return [sys.executable, "-m", "ruff"]
    except ImportError:
        return None


def test_the_tree_is_as_the_formatter_leaves_it():
    """`ruff format` (pyproject.toml's [tool.ruff]: line length 120; the judge cases' candidates and references,
    whose line numbers the tests name, left as written) changes nothing: the code is formatted, not squeezed. The
    version is CI's (.ci/run), since another may format some lines otherwise."""
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install ruff): the format check cannot run")
    r = subprocess.run([*ruff, "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, f"run `ruff format .`:\n{r.stdout[-3000:]}{r.stderr[-2000:]}"
