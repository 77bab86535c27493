"""Compile and cache: a variant is built at first use with ``torch.utils.cpp_extension.load_inline`` into a
directory named by a sha256 over everything that can change the binary (``cache_key``); a warm load is one dlopen.
What a source exports and includes is read in kp/lib/sources.py; the CPU-side checks CI runs are in kp/lib/checks.py."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import torch

from kp.box.builds import cache_root
from kp.errors import KernelBuildError, UsageError, first_line
from kp.lib.registry import KERNELS, ROOT, capability, default_rung, problems, rung, runnable_variants, variants
from kp.lib.sources import Export, binding_source, local_headers, parse_exports

KEY_VERSION = "kp-cache-1"  # bump when the build recipe below changes in a way the key would not see

# ---------------------------------------------------------------------------------------------------------------
# Cache key.


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = Path(CUDA_HOME or "/usr/local/cuda") / "bin" / "nvcc"
    if not nvcc.exists():
        nvcc = Path(shutil.which("nvcc") or "nvcc")
    try:
        return subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "nvcc-unavailable"


def arch_flag(capability: tuple[int, int] | None) -> str:
    """sm_90 gets the 'a' target so wgmma/setmaxnreg are available; other GPUs their plain target, with its PTX
    embedded (so a build for a lower capability than the GPU's, KP_CAPABILITY, still runs: the driver JITs it)."""
    if capability is None:
        capability = (9, 0)
    major, minor = capability
    if (major, minor) == (9, 0):
        return "-gencode=arch=compute_90a,code=sm_90a"
    return f"-gencode=arch=compute_{major}{minor},code=[sm_{major}{minor},compute_{major}{minor}]"


def parse_arch(arch: str) -> tuple[int, int]:
    """'sm_89' / 'sm_90a' -> (8, 9) / (9, 0)."""
    m = re.fullmatch(r"sm_(\d+)(\d)a?", arch)
    if not m:
        raise UsageError(f"not an architecture: {arch!r} (e.g. sm_80, sm_90a)")
    return int(m.group(1)), int(m.group(2))


def cxx_std() -> str:
    # torch 2.11 builds extensions as C++17, 2.13's headers need C++20; both accept the newer one
    # only from 2.13 on, so pick by version rather than guess.
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    return "-std=c++20" if (major, minor) >= (2, 13) else "-std=c++17"


def build_flags(capability: tuple[int, int] | None, experiments: bool = False) -> dict[str, list[str]]:
    std = cxx_std()
    return {
        "cflags": ["-O2", std],
        "cuda_cflags": [
            "-O3",
            std,
            arch_flag(capability),
            "-lineinfo",
            "--expt-relaxed-constexpr",
            "-diag-suppress=3306",
        ]  # 3306: C++20 bit-field initialisers in torch headers
        + (["-DKP_EXPERIMENTS=1"] if experiments else []),
        "include_paths": [str(KERNELS)],
    }


def cache_key(path: Path, capability: tuple[int, int] | None, experiments: bool = False) -> str:
    """sha256 over: the source, every local header it includes (transitively), the generated binding, the flags,
    torch and CUDA versions, the nvcc banner, the GPU arch and the Python ABI."""
    h = hashlib.sha256()

    def feed(tag: str, data: str | bytes) -> None:
        data = data.encode() if isinstance(data, str) else data
        h.update(f"{tag}:{len(data)}:".encode())
        h.update(data)

    feed("version", KEY_VERSION)
    feed("source", path.read_bytes())
    for hdr in local_headers(path):
        feed("header:" + _rel(hdr), hdr.read_bytes())
    feed("flags", repr(sorted(build_flags(capability, experiments).items(), key=lambda kv: kv[0])))
    feed("torch", torch.__version__)
    feed("torch.cuda", str(torch.version.cuda))
    feed("nvcc", nvcc_version())
    feed("arch", repr(capability))
    feed("python", f"{sys.implementation.cache_tag}-{sysconfig.get_config_var('SOABI')}")
    return h.hexdigest()


def shared_cache() -> Path | None:
    """A read-only cache looked in first (KP_CACHE_SHARED): inside the sandbox, the judge's own, so a boxed
    candidate loads the playground's kernels as built and verified there and builds only what it lacks, privately."""
    p = os.environ.get("KP_CACHE_SHARED")
    return Path(p) if p else None


def _load_shared(module: str, key: str) -> Path | None:
    root = shared_cache()
    if root is None:
        return None
    so = root / module / f"{module}.so"
    if verify_entry(so.parent, so, key) != "ok":
        return None
    try:
        torch.ops.load_library(str(so))
    except OSError:
        return None
    return so


# ---------------------------------------------------------------------------------------------------------------
# Build and load.


@contextlib.contextmanager
def _flock(path: Path):
    """An OS lock that dies with its process: a build killed mid-way can never leave the next run waiting."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


_COMPILER_ERR = [
    re.compile(r"^(?P<file>[^\s:()]+)\((?P<line>\d+)\): (?:catastrophic )?error[^:]*: (?P<msg>.*)$"),  # nvcc
    re.compile(r"^(?P<file>[^\s:()]+):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<msg>.*)$"),  # gcc/clang
]


def _rel(path: Path) -> str:
    """A path relative to the repo when it is inside it, else as given (messages stay short but never fail)."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def summarize_build_error(log: str, max_lines: int = 5) -> str:
    """Pull `file:line: message` out of a compiler log; paths inside the repo are shown relative to it."""
    found = []
    for line in log.splitlines():
        for rx in _COMPILER_ERR:
            m = rx.match(line.strip())
            if m:
                f = _rel(m.group("file"))
                item = f"{f}:{m.group('line')}: error: {m.group('msg')}"
                if item not in found:
                    found.append(item)
                break
    if not found:
        tail = [ln for ln in log.splitlines() if ln.strip()][-8:]
        return "\n".join(tail)
    return "\n".join(found[:max_lines]) + (f"\n(+{len(found) - max_lines} more)" if len(found) > max_lines else "")


@dataclasses.dataclass
class Built:
    problem: str
    variant: str
    module: str  # torch.ops namespace
    so_path: Path
    exports: list[Export]
    built_now: bool
    seconds: float

    @property
    def ops(self):
        return getattr(torch.ops, self.module)


_LOADED: dict[str, Built] = {}


def progress(msg: str) -> None:
    print(f"[kp] {msg}", file=sys.stderr, flush=True)


def build(problem: str, variant: str, quiet: bool = False, experiments: bool = False) -> Built:
    """Compile (or find in the cache) and load one variant. Raises KernelBuildError with `file:line: msg`, and
    UsageError in one line when the rung cannot run on this GPU."""
    r = rung(problem, variant)
    require_gpu()
    if not r.runs_on(capability()):
        raise UsageError(r.why_not(capability()))
    return build_path(r.path, problem, variant, quiet, experiments)


def require_gpu() -> None:
    if not torch.cuda.is_available():
        raise UsageError(
            "no CUDA GPU: kernels are built and run on a machine with an NVIDIA GPU (compute "
            "capability 8.0 or newer) and a CUDA build of torch; this one has torch "
            f"{torch.__version__} and no usable GPU"
        )


def build_path(
    path: Path, problem: str = "probe", variant: str | None = None, quiet: bool = False, experiments: bool = False
) -> Built:
    """Build any .cu with KP_EXPORTs (a variant, or a measurement probe under tools/probes) through the same cache.
    experiments: also compile the `#if KP_EXPERIMENTS` A/B hooks and traces (the bench scripts' build)."""
    path = Path(path).resolve()
    variant = (variant or path.stem) + ("_experiments" if experiments else "")
    require_gpu()
    cap = capability()
    key = cache_key(path, cap, experiments)
    module = re.sub(r"\W", "_", f"kp_{problem}_{variant}_{key[:16]}")
    if module in _LOADED:
        return _LOADED[module]
    t0 = time.perf_counter()
    exports = parse_exports(path.read_text(), _rel(path), experiments)
    shared = _load_shared(module, key)
    if shared is not None:
        b = _LOADED[module] = Built(problem, variant, module, shared, exports, False, time.perf_counter() - t0)
        return b
    bdir = cache_root() / module
    so = bdir / f"{module}.so"
    built_now = False
    with _flock(cache_root() / "locks" / f"{module}.lock"):
        state = verify_entry(bdir, so, key)
        if state == "ok":
            try:
                torch.ops.load_library(str(so))
            except OSError as e:
                state = f"does not load ({first_line(e)})"
        if state != "ok":
            built_now = True
            if state != "missing":
                progress(f"cached {so.name} {state}: rebuilding it")
            elif not quiet:
                progress(f"building {problem}/{variant} (first use of this source; a cold build takes ~10-30 s)")
            _build_and_publish(path, module, key, bdir, build_flags(cap, experiments), exports, problem, variant)
    b = Built(problem, variant, module, so, exports, built_now, time.perf_counter() - t0)
    _LOADED[module] = b
    if built_now and not quiet:
        progress(f"built {problem}/{variant} in {b.seconds:.1f} s")
    return b


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_entry(bdir: Path, so: Path, key: str) -> str:
    """'ok' when the cached library is the one that was built for this key (its sha256 as recorded when it was
    published), 'missing' when there is none, else what is wrong with it (the caller rebuilds)."""
    done = bdir / "kp_complete"
    if not done.exists():
        return "missing"
    try:
        rec = json.loads(done.read_text())
        want = rec["sha256"], rec["bytes"], rec["key"]
    except (OSError, ValueError, KeyError, TypeError):
        return "has no checksum (written by an older playground, or damaged)"
    if want[2] != key:
        return "belongs to another source"
    try:
        size = so.stat().st_size
    except OSError:
        return "is missing its library"
    if size != want[1]:
        return f"is {size:,} bytes, {want[1]:,} when built (truncated or altered)"
    if sha256_file(so) != want[0]:
        return "does not match its checksum (altered)"
    return "ok"


def publish_entry(tmp: Path, bdir: Path, so_name: str, key: str) -> None:
    """Record the library's checksum, then move the finished folder into place in one rename: a reader sees the
    old entry or the whole new one, never a half-written library."""
    so = tmp / so_name
    (tmp / "kp_complete").write_text(json.dumps({"key": key, "sha256": sha256_file(so), "bytes": so.stat().st_size}))
    _replace_dir(tmp, bdir)


def _replace_dir(src: Path, dst: Path) -> None:
    if dst.exists():
        old = dst.with_name(f".old-{dst.name}-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(dst, old)
        shutil.rmtree(old, ignore_errors=True)
    os.rename(src, dst)


def _build_and_publish(
    path: Path, module: str, key: str, bdir: Path, flags: dict, exports, problem: str, variant: str
) -> None:
    """Build in a private folder beside the entry (same filesystem, so the publishing rename is atomic)."""
    tmp = bdir.with_name(f".build-{module}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    from torch.utils.cpp_extension import load_inline

    try:
        load_inline(
            name=module,
            # Include by absolute path so compiler messages name the real file and line.
            cpp_sources=[binding_source(module, exports)],
            cuda_sources=[f'#include "{path}"\n'],
            extra_cflags=flags["cflags"],
            extra_cuda_cflags=flags["cuda_cflags"],
            extra_include_paths=flags["include_paths"],
            build_directory=str(tmp),
            is_python_module=False,
            no_implicit_headers=True,
            verbose=False,
        )
    except RuntimeError as e:
        log = str(e)
        (tmp / "build_error.log").write_text(log)
        _replace_dir(tmp, bdir)  # no kp_complete: the next use builds again; the log stays where it is said to be
        raise KernelBuildError(
            f"{problem}/{variant} failed to compile:\n{summarize_build_error(log)}\n"
            f"(full log: {bdir / 'build_error.log'})"
        ) from None
    publish_entry(tmp, bdir, f"{module}.so", key)


def build_all(jobs: int | None = None, items: list[tuple[str, str]] | None = None) -> list[tuple[str, str, float, str]]:
    """Build every variant of every problem in parallel processes; returns (problem, variant, seconds, error).

    The wall time is the longest build's, and a rung's own source is a fair proxy for it (the shared headers are
    compiled by every rung alike; softmax's 6_regcluster, three times any other's bytes, a sweep of template
    instances, took 66 s beside the others' 23-27 s on an H200's 16-core host, every build started at once). So the
    largest source starts first, at the host's priority, and the others below it (nice BUILD_NICE): the cores they
    share go to it first."""
    import concurrent.futures as cf
    import multiprocessing as mp

    items = items or [(p, v) for p in problems() for v in runnable_variants(p, include_records=True)]
    items = sorted(items, key=lambda it: -rung(*it).path.stat().st_size)
    jobs = jobs or min(len(items), os.cpu_count() or 1)
    results = []
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
        futs = {ex.submit(_build_worker, p, v, BUILD_NICE * (i > 0)): (p, v) for i, (p, v) in enumerate(items)}
        for f in cf.as_completed(futs):
            p, v = futs[f]
            secs, err = f.result()
            progress(f"{p}/{v}: " + (f"ok ({secs:.1f} s)" if not err else "FAILED"))
            results.append((p, v, secs, err))
    return sorted(results)


def prebuild(problem: str, rows: list[str]) -> None:
    """Build the rung files among a problem's rows in parallel before they are judged (first use would build them
    one after another); a failure raises KernelBuildError naming every rung that failed."""
    files = [(problem, v) for v in rows if v in variants(problem)]
    if len(files) > 1:
        errs = [r[3] for r in build_all(items=files) if r[3]]
        if errs:
            raise KernelBuildError("\n".join(errs))


BUILD_NICE = 5


def _build_worker(problem: str, variant: str, nice: int = 0) -> tuple[float, str]:
    os.environ.setdefault("MAX_JOBS", "2")  # two translation units per kernel
    if nice > os.nice(0):  # a pool's process is reused: it takes the niceness once; the compilers inherit it
        os.nice(nice - os.nice(0))
    t0 = time.perf_counter()
    try:
        build(problem, variant, quiet=True)
        return time.perf_counter() - t0, ""
    except (KernelBuildError, UsageError) as e:
        return time.perf_counter() - t0, str(e)


class Kernel:
    """A lazily built variant: attribute access returns its torch op, building on first use."""

    def __init__(self, problem: str, variant: str = "default", experiments: bool = False):
        if variant == "default":
            variant = default_rung(problem)
        r = rung(problem, variant)  # an unknown name: UsageError with the list of variants
        cap = capability()
        if cap is not None and not r.runs_on(cap):  # an explicit rung this GPU cannot run: one line, now
            raise UsageError(r.why_not(cap))
        self.problem, self.variant, self.experiments = problem, variant, experiments
        self._built: Built | None = None

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._built is None:
            self._built = build(self.problem, self.variant, experiments=self.experiments)
        return getattr(self._built.ops, name)

    def exports(self) -> list[str]:
        """Names the variant's .cu exports, read from the source (nothing is built)."""
        path = KERNELS / self.problem / f"{self.variant}.cu"
        return [e.name for e in parse_exports(path.read_text(), str(path), self.experiments)]

    def __repr__(self) -> str:
        return f"Kernel({self.problem}/{self.variant})"
