"""A candidate's own extension builds, kept between judgements: the folder they are kept in, the marks a build
ahead of the job leaves there (kp.batch.ahead), and a job's wait for such a build, which is not the job's time. A box
never writes the folder: its job is lent a copy (kp.box.start.Box.lend) and what it built goes back when it ends."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import shutil
import sys
import time
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("KP_CACHE_DIR") or Path.home() / ".cache" / "kernel_playground")


@functools.lru_cache(maxsize=1)
def torch_version() -> str:
    """torch's version, without importing it: the installed package's own, the same before and after this process
    imports torch (a box's plan holds keys made of it, and one started before the import must fit a job planned
    after it); torch's own where the package has no metadata."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        t = sys.modules.get("torch")
        return t.__version__ if t is not None else "none"


def candidate_build_dir(path: str | Path) -> Path:
    """Where a candidate file's own extension builds (its load_inline's TORCH_EXTENSIONS_DIR) are kept between
    judgements: keyed on the file's contents, torch's version and the Python ABI, so a re-judged candidate loads
    its build instead of compiling again, and no other file shares (or can poison) the folder. A box never sees it:
    its job is lent a copy (Box.lend) and what it built is put back when the box ends (BoxProcess.cleanup)."""
    h = hashlib.sha256(Path(path).read_bytes())
    h.update(f"{torch_version()}|{sys.version_info[:2]}".encode())
    d = cache_root() / "candidates" / h.hexdigest()[:24]
    d.mkdir(parents=True, exist_ok=True)
    _carry_jit_cache(Path(path), d)
    return d


JIT_CACHE = "triton"  # in a candidate's build folder: its Triton cache (the box's TRITON_CACHE_DIR, kp.box.start)


JIT_MANIFEST = "triton.sha256"  # beside a candidate's Triton cache: each file's sha256 when it was put back


def seal_jit_cache(home: Path) -> None:
    """The candidate's Triton cache as put back after its box ended: each file's sha256, recorded by the judge."""
    cache = home / JIT_CACHE
    if not cache.is_dir():
        return
    sums = {
        str(p.relative_to(cache)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(cache.rglob("*"))
        if p.is_file()
    }
    tmp = home / f".{JIT_MANIFEST}.{os.getpid()}"
    tmp.write_text("".join(f"{h}  {name}\n" for name, h in sums.items()))
    os.replace(tmp, home / JIT_MANIFEST)


def verify_jit_cache(home: Path, lent: Path) -> int:
    """The Triton cache lent to a box checked against what was recorded when it was put back: a file missing from
    the record, or whose contents changed since, is removed from the box's copy (Triton compiles that kernel
    again). Returns how many were removed."""
    cache = lent / JIT_CACHE
    if not cache.is_dir():
        return 0
    try:
        sums = dict(reversed(ln.split("  ", 1)) for ln in (home / JIT_MANIFEST).read_text().splitlines() if ln)
    except (OSError, ValueError):
        sums = {}
    removed = 0
    for p in [p for p in cache.rglob("*") if p.is_file()]:
        if sums.get(str(p.relative_to(cache))) != hashlib.sha256(p.read_bytes()).hexdigest():
            p.unlink()
            removed += 1
    return removed


def _carry_jit_cache(path: Path, home: Path) -> None:
    """A new version of a file starts with the Triton cache its last judged version left: Triton keys each kernel on
    its source and options, so a loop's next version recompiles only the kernels it changed. Only the same file's
    folders are read (another file's never), and the copy is this version's own."""
    last = cache_root() / "candidates" / "by_path" / hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    try:
        prev = last.read_text().strip()
    except OSError:
        prev = ""
    if prev and prev != home.name and not (home / JIT_CACHE).exists() and (home.parent / prev / JIT_CACHE).is_dir():
        copy_builds(home.parent / prev / JIT_CACHE, home / JIT_CACHE)
        try:
            shutil.copy2(home.parent / prev / JIT_MANIFEST, home / JIT_MANIFEST)
        except OSError:
            pass
    if prev != home.name:
        try:
            last.parent.mkdir(parents=True, exist_ok=True)
            tmp = last.with_name(f".{last.name}.{os.getpid()}")
            tmp.write_text(home.name)
            os.replace(tmp, last)
        except OSError:
            pass


def alive(pid: int) -> bool:
    """Whether a process of this pid runs (one of another user's counts; a zombie, dead but not yet reaped by its
    parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


BUILDING = "kp_building"  # in a candidate's cache folder while its build runs ahead of its job: the builder's pid
# in a candidate's cache folder once a build ahead imported it cleanly and its builds were put back: a later batch's
# builds ahead pass it by (its judging's import still loads it through torch's own up-to-date check, which rebuilds
# whatever is missing or stale)
BUILT = "kp_built"


def building_elsewhere(home: Path) -> bool:
    """Whether another process of the run is building this candidate ahead (kp.batch.ahead) right now."""
    try:
        pid = int((home / BUILDING).read_text())
    except (OSError, ValueError):
        return False
    return pid != os.getpid() and alive(pid)


def copy_builds(src: Path, dst: Path) -> None:
    """One build folder's files copied over another's, each file whole or not at all (written aside, then renamed
    over: a process reading the destination meanwhile sees the old file or the new one); unchanged files (same size
    and time) and torch's lock files (a build interrupted leaves one, which would stall the next) are skipped."""
    for root, dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            if name in ("lock", BUILDING, BUILT):
                continue
            a, b = Path(root) / name, dst / rel / name
            try:
                sa = a.stat()
                sb = b.stat() if b.exists() else None
                if sb is not None and sb.st_size == sa.st_size and int(sb.st_mtime) == int(sa.st_mtime):
                    continue
                tmp = b.with_name(f".{name}.{os.getpid()}.part")
                shutil.copy2(a, tmp)
                os.replace(tmp, b)
            except OSError:
                continue


# Told the seconds a job waited for its candidate's build ahead (wait_for_build), as they pass: like a wait for the
# GPU (kp.lib.gpu_lock.GPU_WAITS), not the job's time. A batch slot tells its parent, which moves the limit it kills
# the job at; the build ahead has a limit of its own (kp.batch.ahead.build_ahead).
OFF_THE_CLOCK: list = []


def wait_for_build(home: Path, tell_every_s: float = 1.0) -> float:
    """Wait while another process builds this candidate ahead of its job (building_elsewhere); returns the seconds
    waited, told to OFF_THE_CLOCK as they pass (a wait of minutes must not outlast a limit that is only moved once
    it ends)."""
    t0 = told = time.monotonic()
    waited = False
    while building_elsewhere(home):
        time.sleep(0.2)
        waited = True
        now = time.monotonic()
        if now - told >= tell_every_s:
            _tell(now - told)
            told = now
    if waited:
        _tell(time.monotonic() - told)
    return time.monotonic() - t0 if waited else 0.0


def _tell(seconds: float) -> None:
    for told in list(OFF_THE_CLOCK):
        told(seconds)
