"""torch/extension.h precompiled once, for every candidate's own build to parse it in a fraction of the time.

A candidate's `load_inline` compiles two sources: nvcc on cuda.cu, and g++ on main.cpp, whose first line is
`#include <torch/extension.h>` (torch puts it there). That header is most of main.cpp's time: 32 s of g++ on the
CPU host, 11 s with the header precompiled, the object's code the same to the byte. A corpus's builds are bound by
the host's cores: on the CPU host this is a third of a candidate's core-seconds (about 84: the other 52 are nvcc's,
which parses torch's headers again in cudafe++, cicc and g++ and cannot take a precompiled header); on an H200 host
main.cpp goes from 14-19 s to 6-7 s of about 150, the rest nvcc's.

How a build finds it without a flag of its own changed: GCC looks for `name.gch` in each folder it searches for
`name`, and CPATH adds a folder searched before torch's own (torch names its include folders with -isystem). So a
build's environment gets CPATH=<root>, where <root>/torch/extension.h.gch is a folder of variants, one per set of
flags; GCC takes the first that is valid for the compilation (same compiler, same flags that matter, the same macros
where the header reads them) and otherwise reads the header as always. The sources, flags and ninja commands are the
candidate's own; a build made without CPATH is the same build (ninja's commands do not hold the environment).

Trust: the variants are written only by the judge's own process (`start`, `build`), never in a box, and boxes read
the cache read-only, so no candidate can put code into another's build. GCC does not check that the headers a
variant was made from are unchanged, so <root> is keyed on torch's version and place, the compiler and Python.

Which flags: torch's own for an extension that includes CUDA where torch has it, with each candidate's literal
`extra_cflags` (the main.cpp flags that matter: -O3 makes a variant of its own), as torch's ninja writer puts them.
"""

from __future__ import annotations

import ast
import collections
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kp.box.builds import alive, cache_root, torch_version

HEADER = "torch/extension.h"
VARIANTS_MOST = 4  # variants built for one batch: the default and the commonest literal extra_cflags
SAFE_FLAG = re.compile(
    r"-O[0-3sgz]?|-Ofast|-ffast-math|-funroll-loops|-march=native|-mtune=native|-DNDEBUG"
    r"|-std=(c|gnu)\+\+\d\d|-w|-W[\w=-]*|-fopenmp|-g[0-3]?|-fno-[\w-]+|-fPIC"
)
BUILD_TIMEOUT_S = 600
ROOTS_KEPT = 2  # roots of variants kept, this one among them (sweep)


def compiler() -> str:
    """The C++ compiler torch's extension builder runs (its CXX, else c++), as a real path where found."""
    cxx = os.environ.get("CXX", "c++")
    found = shutil.which(cxx)
    return os.path.realpath(found) if found else cxx


def root() -> Path:
    """The folder a build's CPATH names: keyed on what a variant's contents depend on beyond its flags. Found
    without importing torch (a box is planned before torch is imported), and the same for a job's whole life,
    whether the variants exist yet or not (a box's plan holds it)."""
    spec = importlib.util.find_spec("torch")
    cxx = compiler()
    try:
        st = os.stat(cxx)
        cxx_id = f"{cxx}|{st.st_size}|{int(st.st_mtime)}"
    except OSError:
        cxx_id = cxx
    key = f"{torch_version()}|{spec.origin if spec else ''}|{cxx_id}|{sys.version_info[:2]}|{sys.platform}"
    return cache_root().resolve() / "pch" / hashlib.sha256(key.encode()).hexdigest()[:16]


def variant_dir() -> Path:
    return root() / (HEADER + ".gch")


def enabled() -> bool:
    """KP_PCH=0: no variants built, no CPATH set; every build parses the header itself."""
    return os.environ.get("KP_PCH", "1") != "0"


def env(environ: dict) -> dict:
    """`environ` with the variants' folder first on CPATH."""
    if not enabled():
        return environ
    old = environ.get("CPATH")
    return {**environ, "CPATH": str(root()) + (os.pathsep + old if old else "")}


def literal_cflags(path: str | Path) -> list[list[str]]:
    """The `extra_cflags` lists a candidate file passes as literals (each call's), empty strings dropped; only
    lists of flags from SAFE_FLAG: the judge's own process runs the compiler with them."""
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.keyword) or node.arg != "extra_cflags":
            continue
        try:
            flags = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(flags, str):
            flags = [flags]
        if not isinstance(flags, (list, tuple)) or not all(isinstance(f, str) for f in flags):
            continue
        flags = [f for f in flags if f.strip()]
        if all(SAFE_FLAG.fullmatch(f) for f in flags):
            out.append(flags)
    return out


def variants(candidates) -> list[list[str]]:
    """The extra_cflags to precompile the header for, for these candidate files: none (torch's defaults) first,
    then the commonest literal lists, VARIANTS_MOST in all."""
    seen = collections.Counter()
    for c in candidates:
        for flags in literal_cflags(c):
            seen[tuple(flags)] += 1
    seen.pop((), None)
    return [[]] + [list(f) for f, _ in seen.most_common(VARIANTS_MOST - 1)]


def name_of(flags: list[str]) -> str:
    return hashlib.sha256(json.dumps(flags).encode()).hexdigest()[:16] + ".pch"


def missing(flag_sets: list[list[str]]) -> list[list[str]]:
    """The variants neither built nor failed before (a variant that failed is not tried again for this root: a
    loop's every call would spend a core's minute on it)."""
    d = variant_dir()
    return [f for f in flag_sets if not (d / name_of(f)).is_file() and not _failed_mark(f).is_file()]


def _failed_mark(flags: list[str]) -> Path:
    return root() / (name_of(flags) + ".failed")


def start(flag_sets: list[list[str]]) -> subprocess.Popen | None:
    """Build the missing variants in a process of their own, beside whatever runs now (builds that start before a
    variant is there read the header as always). None where nothing is missing."""
    todo = missing(flag_sets) if enabled() else []
    if not todo:
        return None
    sweep()
    here = str(Path(__file__).resolve().parents[2])
    e = {
        **os.environ,
        "PYTHONPATH": here + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
    }
    log = open(root().parent / "build.log", "ab") if _mkdir(root().parent) else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "kp.box.pch", json.dumps(todo)],
            env=e,
            cwd=here,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    finally:
        if log is not subprocess.DEVNULL:
            log.close()


def sweep(keep: int = ROOTS_KEPT) -> list[Path]:
    """The variants of other torch installs, compilers or Pythons (other roots) removed, all but the `keep` newest
    (each root is 1.5-3 GB): a root is made only when its variants are first built, so the newest are the installs
    in use. Returns what was removed."""
    here = root()
    others = sorted(
        (p for p in here.parent.glob("*") if p.is_dir() and p != here), key=lambda p: p.stat().st_mtime, reverse=True
    )
    gone = others[max(0, keep - 1) :]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def _mkdir(p: Path) -> bool:
    try:
        p.mkdir(parents=True, exist_ok=True)
        return True
    except OSError:
        return False


def command(flags: list[str], out: str) -> list[str]:
    """The compiler's command that precompiles the header with torch's own flags for a main.cpp built with
    extra_cflags=`flags` (torch's ninja writer says them), less the extension's name: the header does not read it,
    and a variant made with one name would not serve another."""
    import torch
    from torch.utils import cpp_extension as ce

    with_cuda = torch.version.cuda is not None and ce.CUDA_HOME is not None
    with tempfile.TemporaryDirectory(prefix="kp-pch-") as d:
        main = os.path.join(d, "main.cpp")
        Path(main).write_text(f"#include <{HEADER}>\n")
        ce._write_ninja_file_to_build_library(
            path=os.path.join(d, "build.ninja"),
            name="kp_pch",
            sources=[main],
            extra_cflags=list(flags),
            extra_cuda_cflags=[],
            extra_sycl_cflags=[],
            extra_ldflags=[],
            extra_include_paths=[],
            with_cuda=with_cuda,
            with_sycl=False,
            is_standalone=False,
        )
        ninja = Path(d, "build.ninja").read_text()
    var = dict(re.findall(r"^(\w+) = (.*)$", ninja, re.M))
    cflags = [f for f in shlex.split(var.get("cflags", "")) if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    header = os.path.join(ce.include_paths()[0], HEADER)
    return [
        *shlex.split(var["cxx"]),
        "-x",
        "c++-header",
        header,
        "-o",
        out,
        *cflags,
        *shlex.split(var.get("post_cflags", "")),
    ]


def build(flags: list[str]) -> str:
    """One variant, unless there or being built: written aside, then renamed into the variants' folder (GCC tries
    every file there, so none may be seen half written). Returns what happened, for the log."""
    if not all(SAFE_FLAG.fullmatch(f) for f in flags):
        return f"{flags}: not built (a flag outside those the judge runs the compiler with)"
    d = variant_dir()
    final = d / name_of(flags)
    if final.is_file():
        return f"{flags}: there"
    d.mkdir(parents=True, exist_ok=True)
    lock = root() / (final.name + ".lock")
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            if alive(int(lock.read_text() or 0)):
                return f"{flags}: being built by another process"
        except (OSError, ValueError):
            pass
        lock.unlink(missing_ok=True)
        return build(flags)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    tmp = root() / f".{final.name}.{os.getpid()}.part"
    try:
        t0 = time.monotonic()
        r = subprocess.run(command(flags, str(tmp)), capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if r.returncode:
            return _failed(flags, f"failed ({r.stderr.strip().splitlines()[-1:] or r.returncode})")
        os.replace(tmp, final)
        return f"{flags}: built in {time.monotonic() - t0:.0f} s"
    except (OSError, subprocess.SubprocessError, ImportError, AttributeError, TypeError, KeyError) as e:
        return _failed(flags, f"not built ({type(e).__name__}: {e})")
    finally:
        tmp.unlink(missing_ok=True)
        lock.unlink(missing_ok=True)


def _failed(flags: list[str], why: str) -> str:
    """A variant's failure, marked (`missing` passes it by) and said."""
    try:
        _failed_mark(flags).write_text(why + "\n")
    except OSError:
        pass
    return f"{flags}: {why}"


def main(argv: list[str]) -> int:
    from concurrent.futures import ThreadPoolExecutor

    flag_sets = json.loads(argv[0]) if argv else [[]]
    with ThreadPoolExecutor(max_workers=max(1, len(flag_sets))) as pool:
        for line in pool.map(build, flag_sets):
            print(f"[kp] {time.strftime('%Y-%m-%dT%H:%M:%S')} precompiled {HEADER}, {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
