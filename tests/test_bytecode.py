"""The bytecode kept in the playground's cache (kp.lib.bytecode) where the host forbids writing it beside the sources:
written by a process that enables it, read from there by its children and by a box, never beside a source."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kp.box import sandbox

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, env: dict, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *flags, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def _env(tmp_path, **more) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", "KP_NO_BYTECODE_CACHE")}
    return {**env, "KP_CACHE_DIR": str(tmp_path / "cache"), "PYTHONDONTWRITEBYTECODE": "1", **more}


def _module(tmp_path) -> Path:
    src = tmp_path / "src" / "kp_bytecode_probe.py"
    src.parent.mkdir()
    src.write_text("VALUE = 42\n")
    return src


ENABLE = (
    "import sys; from kp.lib import bytecode; print(bytecode.enable()); sys.path.insert(0, {!r}); "
    "import kp_bytecode_probe; print(sys.pycache_prefix)"
)


def test_a_host_without_bytecode_gets_it_in_the_cache_and_children_read_it_there(tmp_path):
    src = _module(tmp_path)
    env = _env(tmp_path)
    r = _python(ENABLE.format(str(src.parent)), env)
    assert r.returncode == 0, r.stderr
    on, prefix = r.stdout.split()
    folder = (tmp_path / "cache" / "pycache").resolve()
    assert on == "True" and prefix == str(folder)
    cached = list(folder.rglob("kp_bytecode_probe*.pyc"))
    assert len(cached) == 1 and cached[0].parent == folder / str(src.parent).lstrip("/")
    assert not list(src.parent.rglob("*.pyc"))  # nothing beside the source
    # a child of such a process (PYTHONPYCACHEPREFIX inherited, writing nothing) loads the cached code object
    r = _python(
        f"import sys; sys.path.insert(0, {str(src.parent)!r}); import kp_bytecode_probe",
        {**env, "PYTHONPYCACHEPREFIX": str(folder)},
        "-v",
    )
    assert f"code object from '{cached[0]}'" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("what", ["written beside the sources", "a prefix of the user's own", "turned off"])
def test_nothing_changes_where_the_host_writes_bytecode_or_the_user_chose(tmp_path, what):
    src = _module(tmp_path)
    env = _env(tmp_path)
    if what == "written beside the sources":
        env.pop("PYTHONDONTWRITEBYTECODE")
    elif what == "a prefix of the user's own":
        env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "mine")
    else:
        env["KP_NO_BYTECODE_CACHE"] = "1"
    r = _python(ENABLE.format(str(src.parent)), env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "False"
    assert not (tmp_path / "cache" / "pycache").exists()


def test_a_box_reads_the_cache_bytecode_and_cannot_write_it(tmp_path):
    """A boxed worker is told the folder (PYTHONPYCACHEPREFIX) and keeps PYTHONDONTWRITEBYTECODE; the folder lies in
    the cache, which the box binds read-only."""
    if sandbox.status()[0] is None:
        pytest.skip(f"no sandbox here: {sandbox.status()[1]}")
    code = (
        "import sys; from kp.lib import bytecode; bytecode.enable(); from kp.box import start; "
        "ro, _, env, *_ = start._plan(('problem', 'softmax'), [], False); "
        "print(env.get('PYTHONPYCACHEPREFIX'), env['PYTHONDONTWRITEBYTECODE'], "
        "any(sys.pycache_prefix.startswith(p.rstrip('/') + '/') for p in ro))"
    )
    r = _python(code, _env(tmp_path))
    assert r.returncode == 0, r.stderr
    prefix, dont_write, bound = r.stdout.split()
    assert prefix == str((tmp_path / "cache" / "pycache").resolve()) and dont_write == "1" and bound == "True"
