"""Kernel playground harness: compile-and-cache, the problem registry, parity against float64, and timing.

Registry: a problem exists because ``models/<id>.py`` exists; its variants are the ``kernels/<id>/*.cu`` files.
Compile: a variant is built at first use with ``torch.utils.cpp_extension.load_inline`` into a directory named by a
sha256 over everything that can change the binary (see ``cache_key``); a warm load is one dlopen.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import importlib
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
KERNELS = ROOT / "kernels"
MODELS = ROOT / "models"
KEY_VERSION = "kp-cache-1"  # bump when the build recipe below changes in a way the key would not see


class UsageError(ValueError):
    """Bad request from a user (unknown problem or variant, bad shapes, no GPU). run.py maps it to exit 2."""


class KernelBuildError(RuntimeError):
    """A kernel failed to compile; the message names the .cu file and line with the compiler's own words."""


# ---------------------------------------------------------------------------------------------------------------
# Registry: the filesystem is the list.

def problems() -> list[str]:
    return sorted(p.stem for p in MODELS.glob("*.py") if not p.stem.startswith("_"))


def variants(problem: str) -> list[str]:
    return sorted(p.stem for p in (KERNELS / problem).glob("*.cu"))


PROBES = ROOT / "scripts" / "probes"


def kernel_sources() -> list[Path]:
    """Every .cu of every problem, and the measurement probes (CI compiles each of them)."""
    return sorted(KERNELS.glob("*/*.cu")) + sorted(PROBES.glob("*.cu"))


def problem_module(problem: str):
    if problem not in problems():
        raise UsageError(f"unknown problem {problem!r}; problems: {', '.join(problems())}")
    return importlib.import_module(f"models.{problem}")


# ---------------------------------------------------------------------------------------------------------------
# Exports: `KP_EXPORT void name(params)` in a .cu becomes torch.ops.<module>.<name>.

_EXPORT_RE = re.compile(r"^KP_EXPORT\s+void\s+(\w+)\s*\(([^)]*)\)", re.M)
_PARAM_TYPES = {  # C++ parameter type in the .cu -> type in the generated wrapper (what the dispatcher accepts)
    "const at::TensorBase&": "const at::Tensor&",
    "int64_t": "int64_t",
    "double": "double",
    "bool": "bool",
}


@dataclasses.dataclass(frozen=True)
class Export:
    name: str
    params: tuple[tuple[str, str], ...]  # (C++ type, name)


def parse_exports(src: str, where: str = "<source>") -> list[Export]:
    out = []
    for m in _EXPORT_RE.finditer(src):
        params = []
        for raw in filter(None, (p.strip() for p in m.group(2).split(","))):
            pm = re.fullmatch(r"(.+?)\s*(\w+)", raw)
            ctype = re.sub(r"\s+", " ", pm.group(1)).replace(" &", "&").strip() if pm else raw
            if not pm or ctype not in _PARAM_TYPES:
                raise KernelBuildError(f"{where}: KP_EXPORT {m.group(1)}: unsupported parameter {raw!r} "
                                       f"(allowed types: {', '.join(_PARAM_TYPES)})")
            params.append((ctype, pm.group(2)))
        out.append(Export(m.group(1), tuple(params)))
    if not out:
        raise KernelBuildError(f"{where}: no `KP_EXPORT void name(...)` function found")
    return out


def binding_source(module: str, exports: list[Export]) -> str:
    """The host-side registration, compiled by g++ with only <torch/library.h> (~6 s)."""
    lines = ["#include <torch/library.h>", "#include <ATen/core/TensorBase.h>", ""]
    for e in exports:
        decl = ", ".join(f"{t} {n}" for t, n in e.params)
        wrap = ", ".join(f"{_PARAM_TYPES[t]} {n}" for t, n in e.params)
        args = ", ".join(n for _, n in e.params)
        lines += [f"void {e.name}({decl});",
                  f"static void {e.name}__kp({wrap}) {{ {e.name}({args}); }}"]
    lines += ["", f"TORCH_LIBRARY({module}, m) {{"]
    lines += [f'  m.def("{e.name}", &{e.name}__kp);' for e in exports]
    lines += ["}", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Cache key.

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def local_headers(path: Path) -> list[Path]:
    """Every quoted include reachable from `path` that resolves to a file in this repo, transitively."""
    seen: dict[Path, None] = {}
    todo = [path.resolve()]
    while todo:
        cur = todo.pop()
        for inc in _INCLUDE_RE.findall(cur.read_text()):
            for base in (cur.parent, KERNELS):
                cand = (base / inc).resolve()
                if cand.is_file():
                    if cand not in seen and cand != path.resolve():
                        seen[cand] = None
                        todo.append(cand)
                    break
    return sorted(seen)


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
    """sm_90 gets the 'a' target so wgmma/setmaxnreg are available; other GPUs their plain target."""
    if capability is None:
        capability = (9, 0)
    major, minor = capability
    suffix = "a" if (major, minor) == (9, 0) else ""
    return f"-gencode=arch=compute_{major}{minor}{suffix},code=sm_{major}{minor}{suffix}"


def cxx_std() -> str:
    # torch 2.11 builds extensions as C++17, 2.13's headers need C++20; both accept the newer one
    # only from 2.13 on, so pick by version rather than guess.
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    return "-std=c++20" if (major, minor) >= (2, 13) else "-std=c++17"


def build_flags(capability: tuple[int, int] | None) -> dict[str, list[str]]:
    std = cxx_std()
    return {
        "cflags": ["-O2", std],
        "cuda_cflags": ["-O3", std, arch_flag(capability), "-lineinfo", "--expt-relaxed-constexpr",
                        "-diag-suppress=3306"],  # 3306: C++20 bit-field initialisers in torch headers
        "include_paths": [str(KERNELS)],
    }


def cache_key(path: Path, capability: tuple[int, int] | None) -> str:
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
    feed("flags", repr(sorted(build_flags(capability).items(), key=lambda kv: kv[0])))
    feed("torch", torch.__version__)
    feed("torch.cuda", str(torch.version.cuda))
    feed("nvcc", nvcc_version())
    feed("arch", repr(capability))
    feed("python", f"{sys.implementation.cache_tag}-{sysconfig.get_config_var('SOABI')}")
    return h.hexdigest()


def cache_root() -> Path:
    return Path(os.environ.get("KP_CACHE_DIR") or Path.home() / ".cache" / "kernel_playground")


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


def _progress(msg: str) -> None:
    print(f"[kp] {msg}", file=sys.stderr, flush=True)


def build(problem: str, variant: str, quiet: bool = False) -> Built:
    """Compile (or find in the cache) and load one variant. Raises KernelBuildError with `file:line: msg`."""
    path = KERNELS / problem / f"{variant}.cu"
    if not path.is_file():
        raise UsageError(f"no variant {variant!r} for {problem!r}; variants: {', '.join(variants(problem))}")
    return build_path(path, problem, variant, quiet)


def build_path(path: Path, problem: str = "probe", variant: str | None = None, quiet: bool = False) -> Built:
    """Build any .cu with KP_EXPORTs (a variant, or a measurement probe under scripts/probes) through the same cache."""
    path = Path(path).resolve()
    variant = variant or path.stem
    if not torch.cuda.is_available():
        raise UsageError("no CUDA device: kernels can only be built and run on a machine with an NVIDIA GPU")
    cap = torch.cuda.get_device_capability()
    key = cache_key(path, cap)
    module = re.sub(r"\W", "_", f"kp_{problem}_{variant}_{key[:16]}")
    if module in _LOADED:
        return _LOADED[module]
    t0 = time.perf_counter()
    exports = parse_exports(path.read_text(), _rel(path))
    bdir = cache_root() / module
    so = bdir / f"{module}.so"
    done = bdir / "kp_complete"
    built_now = False
    with _flock(cache_root() / "locks" / f"{module}.lock"):
        if not (done.exists() and so.exists()):
            built_now = True
            if not quiet:
                _progress(f"building {problem}/{variant} (first use of this source; a cold build takes ~10-30 s)")
            shutil.rmtree(bdir, ignore_errors=True)  # also clears torch's own `lock` left by a killed build
            bdir.mkdir(parents=True)
            flags = build_flags(cap)
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
                    build_directory=str(bdir),
                    is_python_module=False,
                    no_implicit_headers=True,
                    verbose=False,
                )
            except RuntimeError as e:
                log = str(e)
                (bdir / "build_error.log").write_text(log)
                raise KernelBuildError(f"{problem}/{variant} failed to compile:\n{summarize_build_error(log)}\n"
                                       f"(full log: {bdir / 'build_error.log'})") from None
            done.write_text(key)
        else:
            torch.ops.load_library(str(so))
    b = Built(problem, variant, module, so, exports, built_now, time.perf_counter() - t0)
    _LOADED[module] = b
    if built_now and not quiet:
        _progress(f"built {problem}/{variant} in {b.seconds:.1f} s")
    return b


def build_all(jobs: int | None = None, items: list[tuple[str, str]] | None = None) -> list[tuple[str, str, float, str]]:
    """Build every variant of every problem in parallel processes; returns (problem, variant, seconds, error)."""
    import concurrent.futures as cf
    import multiprocessing as mp
    items = items or [(p, v) for p in problems() for v in variants(p)]
    jobs = jobs or min(len(items), os.cpu_count() or 1)
    results = []
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
        futs = {ex.submit(_build_worker, p, v): (p, v) for p, v in items}
        for f in cf.as_completed(futs):
            p, v = futs[f]
            secs, err = f.result()
            _progress(f"{p}/{v}: " + (f"ok ({secs:.1f} s)" if not err else "FAILED"))
            results.append((p, v, secs, err))
    return sorted(results)


def _build_worker(problem: str, variant: str) -> tuple[float, str]:
    os.environ.setdefault("MAX_JOBS", "2")  # two translation units per kernel
    t0 = time.perf_counter()
    try:
        build(problem, variant, quiet=True)
        return time.perf_counter() - t0, ""
    except (KernelBuildError, UsageError) as e:
        return time.perf_counter() - t0, str(e)


class Kernel:
    """A lazily built variant: attribute access returns its torch op, building on first use."""

    def __init__(self, problem: str, variant: str):
        if variant not in variants(problem):
            raise UsageError(f"no variant {variant!r} for {problem!r}; variants: {', '.join(variants(problem))}")
        self.problem, self.variant = problem, variant
        self._built: Built | None = None

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._built is None:
            self._built = build(self.problem, self.variant)
        return getattr(self._built.ops, name)

    def exports(self) -> list[str]:
        """Names the variant's .cu exports, read from the source (nothing is built)."""
        path = KERNELS / self.problem / f"{self.variant}.cu"
        return [e.name for e in parse_exports(path.read_text(), str(path))]

    def __repr__(self) -> str:
        return f"Kernel({self.problem}/{self.variant})"


# ---------------------------------------------------------------------------------------------------------------
# Helpers ModelNew classes share: weight-derived caches, IEEE fp32 GEMMs, input checks.

class DerivedCache:
    """A value computed from some tensors (e.g. W^T or W.sum(0)), recomputed whenever any of them may have changed.

    The key is (data_ptr, version counter, dtype, device, shape, strides) of each tensor: in-place edits (including
    optimizer steps and load_state_dict, which copy into the parameter under no_grad) bump the version counter;
    .to()/.cuda() and replacing the Parameter change the storage. The tensors seen last are kept alive (`_pins`),
    so their addresses cannot be reused by a different tensor while the cached value is held. Not seen: writes
    through `.data` (a separate version counter) or raw pointers; call `invalidate()` after those.
    """

    def __init__(self, fn):
        self.fn = fn
        self.misses = 0
        self.invalidate()

    def invalidate(self) -> None:
        self._key, self._val, self._pins = None, None, None

    @staticmethod
    def _key_of(t):
        if t is None:
            return None
        return (t.data_ptr(), t._version, t.dtype, t.device, tuple(t.shape), tuple(t.stride()))

    def get(self, *tensors):
        """The cached value if it was computed from exactly these tensors in their current state, else None."""
        if self._val is not None and tuple(self._key_of(t) for t in tensors) == self._key:
            return self._val
        return None

    def put(self, val, *tensors):
        """Store a value computed from these tensors (a kernel may produce it as a by-product)."""
        self._key, self._val = tuple(self._key_of(t) for t in tensors), val
        self._pins = [None if t is None else t.detach() for t in tensors]
        self.misses += 1
        return val

    def __call__(self, *tensors):
        val = self.get(*tensors)
        if val is None:
            with torch.no_grad():
                val = self.put(self.fn(*tensors), *tensors)
        return val

    def __deepcopy__(self, memo):  # a copied module owns different tensors: start empty
        return DerivedCache(self.fn)


@contextlib.contextmanager
def ieee_fp32():
    """TF32 off for the enclosed GEMMs whatever the caller's global setting: fp32 mode means fp32 arithmetic."""
    prev = torch.backends.cuda.matmul.allow_tf32
    if not prev:  # the common case: nothing to change (setting it costs a few us per call)
        yield
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def check_input(x, name: str, features: int, dims: int = 2) -> None:
    """ValueError (not a crash, not a kernel-side error) for inputs a ModelNew cannot take."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(x.shape)}")
    if x.dtype != torch.float32:
        raise ValueError(f"{name} must be float32, got {x.dtype}")
    if not x.is_cuda:
        raise ValueError(f"{name} must be a CUDA tensor, got device {x.device}")
    if x.size(-1) != features:
        raise ValueError(f"{name} has {x.size(-1)} features, the module expects {features}")


def mm_fp32(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
    """x @ wt on cuBLAS in IEEE fp32 (TF32 off for this call only)."""
    with ieee_fp32():
        return torch.mm(x, wt)


GEMM_MODES = ("auto", "fp64", "fp32", "split", "triton")
PRECISIONS = ("fp32", "tf32")


@contextlib.contextmanager
def tf32_matmul():
    """TF32 on for the enclosed cuBLAS GEMMs (the opt-in reduced-precision mode), restored afterwards."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


class LinearGemm:
    """y = x @ W^T as float32 for the Linear problems.

    "split" (the default where the rung's .cu exports split_gemm, i.e. 2_split_wgmma): fp16 tensor cores, three
    products of the per-row power-of-two-scaled hi/lo split (kernels/common/split_gemm.cuh). W's split is a property
    of the weight: cached in a DerivedCache (recomputed after any in-place edit, optimizer step, load_state_dict,
    .to(), or a replaced Parameter); x is split per call. precision="tf32" keeps one product (TF32-like error).
    "fp64": cuBLAS DGEMM on float64 copies (FP64 tensor cores on Hopper), rounded to fp32 once at the end. On the
    H200 (scripts/lse_ab.py) the 1024x8192x8192 DGEMM took 2.185 ms against 2.660 ms for the fp32 SIMT SGEMM, with
    relL2 2.5e-8 against 1.6e-6: faster and ~60x closer to the float64 reference. Costs: x converted per call
    (~25 us), y rounded (~25 us), W^T cached in float64 (2x the weight's memory).
    "fp32": cuBLAS SGEMM with TF32 off on W^T as a view: the same TN kernel, hence the same rounding, as the
    reference's F.linear. (A cached contiguous W^T made cuBLAS pick its NN kernel, 2% faster at the bench shape but
    rounding differently: on a small large-magnitude case its worst softmax row was 5.2x PyTorch's own error.)
    With precision="tf32" the cuBLAS modes run with TF32 on (what PyTorch's TF32 mode does).
    "triton": the peer (peers/triton_gemm.py), tl.dot tf32x3 with per-k-block promotion; "tf32" in the tf32 mode.
    "auto": "split" if the kernel exports split_gemm, else "fp64".
    """

    def __init__(self, mode: str = "auto", kernel: "Kernel | None" = None, precision: str = "fp32"):
        if mode not in GEMM_MODES:
            raise UsageError(f"gemm must be one of {', '.join(GEMM_MODES)}, got {mode!r}")
        if precision not in PRECISIONS:
            raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        has_split = kernel is not None and "split_gemm" in kernel.exports()
        if mode == "auto":  # the rung's own GEMM; cuBLAS: DGEMM at fp32 accuracy, TF32 in the tf32 mode
            mode = "split" if has_split else ("fp32" if precision == "tf32" else "fp64")
        if mode == "split" and not has_split:
            raise UsageError(f"gemm='split' needs a rung that exports split_gemm; {kernel!r} does not")
        self.mode, self.precision, self.k = mode, precision, kernel
        if mode == "fp64":
            self.wt = DerivedCache(lambda w: w.t().contiguous().double())
        elif mode == "split":
            self.wsplit = DerivedCache(self._split)

    def _split(self, t: torch.Tensor, with_lo: bool = True):
        r, k = t.shape
        kp = (k + 7) // 8 * 8
        hi = torch.empty(r, kp, dtype=torch.float16, device=t.device)
        lo = torch.empty_like(hi) if with_lo else hi.new_empty(0)  # one-product calls read hi only
        inv = torch.empty(r, dtype=torch.float32, device=t.device)
        flag = torch.empty(r, dtype=torch.uint8, device=t.device)
        self.k.split_rows(t, hi, lo, inv, flag)
        return hi, lo, inv, flag

    # tf32 mode keeps one product only from this many FLOPs on (1024x2048x2048 is 2^32). Below it the three-product
    # path costs microseconds and stays fp32-accurate, and cuBLAS often is not TF32 there either (on the H200 a
    # 3x70001x16 GEMM with TF32 on gave relL2 ~1e-7; one fp16 product gives ~6e-5: 4x PyTorch's own error is then
    # out of reach). More exact than asked is allowed; less is not.
    TF32_MIN_FLOPS = 1 << 32

    def nprod(self, m: int, n: int, k: int) -> int:
        return 1 if self.precision == "tf32" and 2 * m * n * k >= self.TF32_MIN_FLOPS else 3

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.mode == "split":
            y = torch.empty(x.size(0), w.size(0), dtype=torch.float32, device=x.device)
            n = self.nprod(x.size(0), w.size(0), x.size(1))
            self.k.split_gemm(*self._split(x, n == 3), *self.wsplit(w), x, w, y, n)  # W's split keeps lo: cached
            return y
        if self.mode == "fp64":
            return torch.mm(x.double(), self.wt(w)).float()
        if self.mode == "triton":
            from peers import triton_gemm
            return triton_gemm.linear(x, w, self.precision)
        if self.precision == "tf32":
            with tf32_matmul():
                return torch.mm(x, w.t())
        return mm_fp32(x, w.t())


# ---------------------------------------------------------------------------------------------------------------
# CPU-side compile check (CI): nvcc -c each .cu with the same flags, against the installed torch headers.

def compile_check(path: Path, out_dir: Path, capability: tuple[int, int] = (9, 0)) -> tuple[bool, str]:
    from torch.utils.cpp_extension import include_paths
    flags = build_flags(capability)
    py_inc = sysconfig.get_paths()["include"]
    incs = [f"-I{p}" for p in include_paths()] + [f"-I{py_inc}"] + [f"-I{p}" for p in flags["include_paths"]]
    obj = out_dir / (path.parent.name + "__" + path.stem + ".o")
    cmd = (["nvcc", "-c", str(path), "-o", str(obj), "-Xcompiler", "-fPIC", "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE"]
           + flags["cuda_cflags"] + incs)
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode == 0, (r.stdout + r.stderr)


def binding_check(path: Path, out_dir: Path) -> tuple[bool, str]:
    """g++ -fsyntax-only on the generated binding: the KP_EXPORT signature and the registration agree."""
    from torch.utils.cpp_extension import include_paths
    src = out_dir / (path.parent.name + "__" + path.stem + "_binding.cpp")
    src.write_text(binding_source("kp_check", parse_exports(path.read_text(), str(path))))
    cmd = ["g++", "-fsyntax-only", build_flags(None)["cflags"][1], str(src)] + [f"-I{p}" for p in include_paths()]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------------------------
# Numerics.

@dataclasses.dataclass
class Err:
    rel_l2: float  # ||out - ref|| / ||ref|| over elements where both are finite
    worst_row: float  # max over rows of the same (row ops); equals rel_l2 for non-row outputs
    nonfinite_mismatch: int  # positions where NaN/±Inf patterns differ

    def within(self, budget: "Err") -> bool:
        return (self.nonfinite_mismatch == 0 and self.rel_l2 <= budget.rel_l2
                and self.worst_row <= budget.worst_row)


CHUNK_ELEMS = 1 << 25  # elements per step of the error measure (256 MiB in float64): large outputs never need a
#                         full float64 copy on the device


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """The rows the worst-row error is taken over: slices along the last dimension (a 1-D or 0-D tensor is one)."""
    if t.dim() <= 1:
        return t.reshape(1, -1)
    return t.reshape(-1, t.shape[-1])


def rel_error(out: torch.Tensor, ref: torch.Tensor, chunk: int = CHUNK_ELEMS) -> Err:
    """Relative L2 error of `out` against a float64 `ref` (which may live on the host while `out` is on the GPU).
    Non-finite values must match exactly (NaN where the reference has NaN, the same infinities); they are then
    excluded from the L2 norms. Worked in blocks of rows and columns moved to out's device, so the peak extra memory
    is a few chunks, not a float64 copy of the output."""
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"shapes differ: {tuple(out.shape)} vs {tuple(ref.shape)}")
    if out.numel() == 0:
        return Err(0.0, 0.0, 0)
    o2, r2 = as_rows(out.detach()), as_rows(ref.detach())
    dev = out.device
    rows, cols = o2.shape
    cstep = max(1, min(cols, chunk))
    rstep = max(1, chunk // cstep)
    num2 = torch.zeros((), dtype=torch.float64, device=dev)
    den2 = torch.zeros((), dtype=torch.float64, device=dev)
    mism = torch.zeros((), dtype=torch.int64, device=dev)
    worst = torch.zeros((), dtype=torch.float64, device=dev)
    for r0 in range(0, rows, rstep):
        rn = torch.zeros(min(rstep, rows - r0), dtype=torch.float64, device=dev)
        rd = torch.zeros_like(rn)
        for c0 in range(0, cols, cstep):
            o = o2[r0:r0 + rstep, c0:c0 + cstep].to(dev, torch.float64)
            r = r2[r0:r0 + rstep, c0:c0 + cstep].to(dev, torch.float64)
            nan_o, nan_r = torch.isnan(o), torch.isnan(r)
            inf_o, inf_r = torch.isinf(o), torch.isinf(r)
            mism += ((nan_o != nan_r) | (inf_o != inf_r) | (inf_r & (o != r))).sum()
            fin = torch.isfinite(r) & torch.isfinite(o)
            d = torch.where(fin, o - r, 0.0)
            rr = torch.where(fin, r, 0.0)
            rn += (d * d).sum(1)
            rd += (rr * rr).sum(1)
        num2 += rn.sum()
        den2 += rd.sum()
        per_row = torch.where(rd > 0, (rn / torch.where(rd > 0, rd, 1.0)).sqrt(), rn.sqrt())
        worst = torch.maximum(worst, per_row.max())
    num, den = float(num2.sqrt()), float(den2.sqrt())
    rl2 = num / den if den > 0 else num
    return Err(rl2, float(worst) if rows > 1 else rl2, int(mism))


def same_values(a: torch.Tensor, b: torch.Tensor, chunk: int = CHUNK_ELEMS) -> bool:
    """Bitwise-equal values through the views (NaN equals NaN, the sign of zero counts; what lies outside the views
    is not compared). `b` may live on another device than `a`; compared in chunks on a's device."""
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        return False
    fa, fb = a.reshape(-1), b.reshape(-1)
    for i in range(0, fa.numel(), chunk):
        x, y = fa[i:i + chunk], fb[i:i + chunk].to(a.device)
        if a.is_floating_point():
            if not bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all()):
                return False
            if not bool((torch.signbit(x) == torch.signbit(y)).all()):
                return False
        elif not torch.equal(x, y):
            return False
    return True


ABS_FLOOR = 1e-6  # measured on an H200: PyTorch-fp32's own relL2 can be ~1e-9 on fresh modules, so a pure multiple is
#                   meaningless there; 1e-6 is ~1/10 of a single-ulp-everywhere error in fp32 (1.2e-7 * ~8).
REF_MULTIPLE = 4.0  # candidates may be up to 4x PyTorch-fp32's own error on the same inputs


def budget_from(ref_err: Err) -> Err:
    return Err(max(REF_MULTIPLE * ref_err.rel_l2, ABS_FLOOR), max(REF_MULTIPLE * ref_err.worst_row, ABS_FLOOR), 0)


# ---------------------------------------------------------------------------------------------------------------
# Timing.

@dataclasses.dataclass
class Timing:
    median_ms: float
    q1_ms: float
    q3_ms: float
    n: int
    host_us: float = float("nan")  # median host time to enqueue one call (Python + launches), not in median_ms

    @property
    def iqr_ms(self) -> float:
        return self.q3_ms - self.q1_ms


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(samples: list[float]) -> Timing:
    return Timing(_quantile(samples, 0.5), _quantile(samples, 0.25), _quantile(samples, 0.75), len(samples))


class L2Flusher:
    """Reads a buffer of twice the L2 size before each timed call, so no call starts with its data in L2.

    A read, not a write: writing the buffer would leave the L2 full of dirty lines, and the timed call would pay
    for writing them back (on the H200 the 32 MiB cached GEMV of matmul_sum_max_mean_lse timed 34 us after a write
    flush; see README for the figure after this read flush). Streaming 2x the L2
    through it evicts everything (dirty lines of earlier calls are written back during the flush itself) and leaves
    clean lines of an unrelated buffer.
    """

    def __init__(self, device=None):
        props = torch.cuda.get_device_properties(device)
        l2 = getattr(props, "L2_cache_size", 0) or 64 << 20
        self.buf = torch.ones(2 * l2 // 4, dtype=torch.float32, device=device)
        self.out = torch.empty((), dtype=torch.float32, device=device)

    def __call__(self):
        torch.sum(self.buf, dim=0, out=self.out)


HOLD_CYCLES = 2_000_000  # ~1 ms at H200 clocks: longer than any call here takes to enqueue (host_us shows it)


def bench_interleaved(fns: dict[str, callable], min_reps: int = 10, max_reps: int = 100, budget_s: float = 20.0,
                      target_rel_iqr: float = 0.02, warmup: int = 3, before=None,
                      precede: bool = True) -> dict[str, Timing]:
    """Time several callables side by side: each round runs each once; rounds repeat until every IQR/median <
    target or the wall budget is spent.

    Per sample: the L2 is flushed, then a sleep kernel holds the stream while the host enqueues the start event,
    the call and the stop event (nvbench's 'blocking kernel' idea), so the events measure the GPU time of the work
    the call enqueued on the stream, not Python or launch latency. Host enqueue time is measured separately
    (host_us); a call whose enqueue outlasts the hold would show up as a host_us near or above the hold.
    `before(name, rep)` (rep -1 in warm-up) runs before each call, outside the timed region (checker.py refills
    the candidate's inputs there).
    precede: each timed call is preceded by one untimed call of the same callable (before it: `before(name, -1)`),
    so every sample follows its own kind of call, as in repeated use, whatever the other entries are. Measured
    (README, "Order sensitivity"): lines a call leaves dirty in L2 survive the read flush (even a 6x-L2 one) and are
    written back during the next timed call: 4_overlap of matmul_sum_max_mean_lse streamed W in 62.5 us after
    itself and 67.6-68.1 us after 9 MiB of writes (3_rowband, or a plain fill_), at the same SM clock. With precede
    each row pays for its own previous output, as in repeated use, never for a neighbour's.
    """
    before = before or (lambda name, rep: None)
    flush = L2Flusher()
    for _ in range(warmup):
        for k, f in fns.items():
            before(k, -1)
            f()
    torch.cuda.synchronize()
    samples = {k: [] for k in fns}
    host = {k: [] for k in fns}
    t_end = time.perf_counter() + budget_s
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for rep in range(max_reps):
        for k, f in fns.items():
            if precede:
                before(k, -1)
                f()
            before(k, rep)
            flush()
            torch.cuda._sleep(HOLD_CYCLES)
            start.record()
            h0 = time.perf_counter()
            f()
            host[k].append((time.perf_counter() - h0) * 1e6)
            stop.record()
            stop.synchronize()
            samples[k].append(start.elapsed_time(stop))
        if rep + 1 >= min_reps:
            t = {k: summarize(v) for k, v in samples.items()}
            if all(x.iqr_ms <= target_rel_iqr * x.median_ms for x in t.values()) or time.perf_counter() > t_end:
                break
    out = {k: summarize(v) for k, v in samples.items()}
    for k in out:
        out[k].host_us = _quantile(host[k], 0.5)
    return out


def copy_bandwidth(nbytes: int = 4 << 30) -> float:
    """Device-to-device copy speed in bytes/s (read + write counted), the memory ceiling used for '% of ceiling'."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    t = bench_interleaved({"copy": lambda: dst.copy_(src)}, min_reps=10, max_reps=30, budget_s=5)["copy"]
    del src, dst
    return 2 * nbytes / (t.median_ms * 1e-3)


# ---------------------------------------------------------------------------------------------------------------
# Inputs.

def clone_layout(x):
    """A copy that keeps shape, strides and storage offset (plain .clone() drops the offset)."""
    if not isinstance(x, torch.Tensor):
        return x
    n = x.untyped_storage().nbytes() // x.element_size()
    buf = torch.empty(n, dtype=x.dtype, device=x.device)
    view = buf.as_strided(x.shape, x.stride(), x.storage_offset())
    view.copy_(x)
    return view


# ---------------------------------------------------------------------------------------------------------------
# Compute ceilings.

def gemm_rates(n: int = 8192, precision: str = "fp32") -> dict[str, float]:
    """FLOP/s on n^3, measured now, of what bounds a GEMM at the given precision; the compute ceiling for
    '% of ceiling' is the fastest of them.
    fp32: cuBLAS SGEMM (TF32 off), DGEMM (float64; on Hopper its FP64 tensor cores beat the SIMT SGEMM), and
      cuBLAS HGEMM (fp16 tensor cores, fp32 accumulate) / 3: a split-precision GEMM does three fp16 products per
      fp32-accurate one, so HGEMM/3 is its tensor-core roofline at the library's efficiency.
    tf32: cuBLAS with TF32 on, and HGEMM (one fp16 product per output: the tf32 mode's split)."""
    a = torch.rand(n, n, device="cuda")
    b = torch.rand(n, n, device="cuda")
    ah, bh = a.half(), b.half()
    fns = {"HGEMM": lambda: ah @ bh}
    if precision == "tf32":
        def tf32():
            with tf32_matmul():
                return a @ b
        fns["TF32"] = tf32
    else:
        ad, bd = a.double(), b.double()
        fns.update({"SGEMM": lambda: mm_fp32(a, b), "DGEMM": lambda: ad @ bd})
    t = bench_interleaved(fns, min_reps=5, max_reps=15, budget_s=8)
    rates = {k: 2 * n ** 3 / (v.median_ms * 1e-3) for k, v in t.items()}
    if precision != "tf32":
        rates["HGEMM/3"] = rates.pop("HGEMM") / 3
    return rates
