"""Compiled bytecode kept in the playground's cache, for hosts that forbid writing it beside the sources.

Some images set PYTHONDONTWRITEBYTECODE and ship their packages without .pyc files: every process then compiles
torch's Python again at its import (on an H200 host, `import torch` took 3.7-6.4 s that way and 1.8-2.3 s with the
bytecode kept). A judgement runs two such processes before its first check (the judge and the candidate's worker),
so the command line keeps the bytecode in a folder of the playground's cache (`sys.pycache_prefix`) instead: written
by the judge's own processes, read by the others (a box binds the cache read-only, so a candidate can read it and
never write it). Nothing is written beside any source. Where bytecode is written as usual, or the user set a prefix
of their own, nothing changes; KP_NO_BYTECODE_CACHE=1 turns it off."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from kp.box.builds import cache_root


def folder() -> Path:
    return (cache_root() / "pycache").resolve()


def enable() -> bool:
    """Keep this process's bytecode in the cache's folder (written there from now on, and read from there by this
    process's children, who inherit PYTHONPYCACHEPREFIX). Whether it is on."""
    if os.environ.get("KP_NO_BYTECODE_CACHE") or not sys.dont_write_bytecode:
        return False
    d = folder()
    if sys.pycache_prefix not in (None, str(d)):  # a prefix of the user's own
        return False
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:  # a cache that cannot be written: the import compiles as it would have
        return False
    sys.pycache_prefix = str(d)
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = str(d)
    return True


def active() -> str | None:
    """The cache's bytecode folder, where this process reads its bytecode from there (else None)."""
    return sys.pycache_prefix if sys.pycache_prefix == str(folder()) else None
