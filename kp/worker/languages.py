"""Kernels a candidate compiles at run time in a language other than load_inline's C++: Triton (`@triton.jit`, with
or without `@triton.autotune` / `@triton.heuristics`), CuPy (`RawKernel`, `RawModule`, `ElementwiseKernel`,
`ReductionKernel`) and Numba CUDA (`@cuda.jit`). None of them leaves a shared library behind: each loads its
compiled code through the driver, so the own-kernel check cannot find their names in a library the candidate loaded
(kp.worker.profiling) and asks this module instead, in the candidate's process, after the profiled call.

A kernel is the candidate's own when its code came from the candidate: a Triton or Numba function defined in a file
of the candidate's folder (not in torch.compile's generated modules, which are labelled torch.compile's, nor in a
library), a CuPy kernel object the candidate holds (reachable from its module or its models; CuPy's own library
operations hold theirs inside CuPy). Only a kernel the profiler saw run counts: one the source defines and never
launches is not counted, and a name a library's kernel also has is not counted for the candidate either.

Also here: the JIT compilers' time booked as build time (Triton's compile and its autotuner's benchmarking happen at
a kernel's first call), and a JIT compiler's error said in one line at the kernel's file:line."""

from __future__ import annotations

import functools
import gc
import os
import re
import sys
import time
import types
from weakref import ProxyTypes, ReferenceType

from kp.errors import exception_chain

TRITON, CUPY, NUMBA = "Triton", "CuPy", "Numba CUDA"
GPU_JIT_MARKERS = {
    b"triton": TRITON,
    b"cupy": CUPY,
    b"numba": NUMBA,
    b"tilelang": "TileLang",
    b"cutlass.cute": "CuTe DSL",
    b"cutlass import cute": "CuTe DSL",
}
_IMPORTS = {
    TRITON: re.compile(rb"^\s*(import|from)\s+triton\b", re.M),
    CUPY: re.compile(rb"^\s*(import|from)\s+cupy\b", re.M),
    NUMBA: re.compile(rb"^\s*(import|from)\s+numba\b", re.M),
    "TileLang": re.compile(rb"^\s*(import|from)\s+tilelang\b", re.M),
    "CuTe DSL": re.compile(rb"^\s*(import|from)\s+cutlass\b", re.M),
}
WALK_MOST = 200_000  # objects visited from the candidate's roots when looking for the CuPy kernels it holds


def gpu_languages(path) -> list[str]:
    """The GPU kernel languages a candidate file imports (a source scan, nothing imported): on a host without a GPU
    such a candidate cannot run its kernels at all."""
    try:
        src = open(path, "rb").read()
    except (OSError, TypeError):
        return []
    return [lang for lang, rx in _IMPORTS.items() if rx.search(src)]


# ---------------------------------------------------------------------------------------------------------------
# Whose code a file is.


def _real(p: str) -> str:
    try:
        return os.path.realpath(p)
    except (OSError, TypeError, ValueError):
        return str(p)


def _generated_dirs() -> tuple[str, ...]:
    """Folders holding code torch.compile (Inductor) generates: never the candidate's, wherever they are."""
    dirs = [os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get("TRITON_CACHE_DIR")]
    mod = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    try:
        dirs.append(mod.cache_dir() if mod else None)
    except Exception:
        pass
    tmp = os.environ.get("TMPDIR") or "/tmp"
    try:
        dirs += [os.path.join(tmp, d) for d in os.listdir(tmp) if d.startswith("torchinductor")]
    except OSError:
        pass
    return tuple(_real(d) + os.sep for d in dirs if d)


def _library_dirs() -> tuple[str, ...]:
    import site
    import sysconfig

    dirs = {sysconfig.get_paths().get(k) for k in ("purelib", "platlib", "stdlib")}
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:
        pass
    return tuple(_real(d) + os.sep for d in dirs if d)


class Origins:
    """Whose code a source file is: the candidate's (a file under its folder), torch.compile's (Inductor's
    generated modules), PyTorch's, or an installed library's, by its package's name (liger_kernel's); a file
    outside every library folder is "a library's"."""

    def __init__(self, candidate_dir: str):
        self.home = _real(candidate_dir) + os.sep
        self.generated = _generated_dirs()
        self.libraries = _library_dirs()
        import sysconfig

        self.stdlib = _real(sysconfig.get_paths()["stdlib"]) + os.sep
        torch = sys.modules.get("torch")
        self.torch = _real(os.path.dirname(torch.__file__)) + os.sep if torch is not None else None

    def of(self, filename: str) -> str:
        f = _real(filename)
        if f.startswith(self.generated) or "torchinductor" in f or "/_inductor/" in f:
            return "torch.compile's"
        if self.torch and f.startswith(self.torch):
            return "PyTorch's"
        if f.startswith(self.home) and not f.startswith(self.libraries):
            return "own"
        return package_of(f, self.libraries, self.stdlib)


def package_of(path: str, libraries: tuple[str, ...], stdlib: str | None = None) -> str:
    """The package an installed file belongs to, as whose code it is ("liger_kernel's"): the first folder (or
    module) below the innermost library folder holding it; "Python's" for the standard library's own modules, "a
    library's" where it is under no library folder."""
    for lib in sorted(libraries, key=len, reverse=True):
        if path.startswith(lib):
            if lib == stdlib:
                return "Python's"
            top = path[len(lib) :].split(os.sep)[0]
            name = top[:-3] if top.endswith(".py") else top
            return f"{name}'s" if name else "a library's"
    return "a library's"


# ---------------------------------------------------------------------------------------------------------------
# The kernel objects of each language in this process.


def _is(o, kinds: tuple) -> bool:
    """isinstance by the object's own type alone: asking an object its __class__ runs its code (a dead weak proxy
    raises, a deprecated alias warns)."""
    return issubclass(type(o), kinds)


def _instances(types_: tuple) -> list:
    return [o for o in gc.get_objects() if _is(o, types_)] if types_ else []


def _triton_kernels(origins: Origins) -> list[tuple[str, str, str, bool]]:
    """(kernel name, language, whose, compiled) of every Triton JIT function in the process."""
    jit = sys.modules.get("triton.runtime.jit")
    if jit is None or not hasattr(jit, "JITFunction"):
        return []
    out = []
    for f in _instances((jit.JITFunction,)):
        fn = getattr(f, "fn", None)
        code = getattr(fn, "__code__", None)
        if code is None:
            continue
        caches = getattr(f, "device_caches", None) or {}
        compiled = any(isinstance(c, tuple) and c and c[0] for c in list(caches.values())) if caches else True
        out.append((fn.__name__, TRITON, origins.of(code.co_filename), compiled))
    return out


def _numba_kernels(origins: Origins) -> list[tuple[str, str, str, bool]]:
    disp = sys.modules.get("numba.cuda.dispatcher")
    kinds = tuple(t for t in (getattr(disp, "CUDADispatcher", None),) if t is not None) if disp else ()
    out = []
    for d in _instances(kinds):
        fn = getattr(d, "py_func", None)
        code = getattr(fn, "__code__", None)
        if code is not None:
            out.append((fn.__name__, NUMBA, origins.of(code.co_filename), True))
    return out


_GLOBAL_FN = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+)")


def _cupy_kernels(roots: list) -> list[tuple[str, str, str, bool]]:
    """CuPy's kernel objects the candidate holds (reachable from `roots`): its own; those CuPy holds for its own
    operations are not reached from there."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return []
    kinds = tuple(
        t
        for t in (getattr(cupy, n, None) for n in ("RawKernel", "RawModule", "ElementwiseKernel", "ReductionKernel"))
        if isinstance(t, type)
    )
    out = []
    for k in _reachable(roots, kinds):
        names = (
            _GLOBAL_FN.findall(getattr(k, "code", "") or "")
            if isinstance(k, getattr(cupy, "RawModule", ()))
            else [getattr(k, "name", None)]
        )
        out += [(n, CUPY, "own", True) for n in names if n]
    return out


def _reachable(roots: list, kinds: tuple) -> list:
    """Instances of `kinds` reachable from `roots` through containers, objects' attributes, closures, bound methods
    and partials, not through modules (a module reaches everything)."""
    if not kinds:
        return []
    torch = sys.modules.get("torch")
    tensor = (torch.Tensor,) if torch is not None else ()
    seen, found, todo = set(), [], list(roots)
    while todo and len(seen) < WALK_MOST:
        o = todo.pop()
        if (
            id(o) in seen
            or type(o) in ProxyTypes
            or _is(o, (types.ModuleType, str, bytes, int, float, bool, type(None), ReferenceType))
        ):
            continue  # a weak proxy: what it stands for is reached where it is held
        seen.add(id(o))
        if _is(o, kinds):
            found.append(o)
            continue
        if _is(o, tensor):
            continue
        if _is(o, (dict,)):
            todo += list(o.values())
        elif _is(o, (list, tuple, set, frozenset)):
            todo += list(o)
        elif _is(o, (types.FunctionType,)):
            todo += [c.cell_contents for c in (o.__closure__ or ()) if _filled(c)] + list(o.__defaults__ or ())
        elif _is(o, (types.MethodType,)):
            todo += [o.__self__, o.__func__]
        elif _is(o, (functools.partial,)):
            todo += [o.func, *o.args, *o.keywords.values()]
        else:
            try:  # an object's attributes (asking may run its code: whatever it raises, it is passed by)
                d = object.__getattribute__(o, "__dict__")
            except Exception:
                d = None
            if _is(d, (dict,)):
                todo += list(d.values())
    return found


def _filled(cell) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


def jit_kernels(candidate_dir: str, roots: list) -> dict:
    """{"own": {name: language}, "foreign": {name: whose}} of the JIT kernels in this process: own ones compiled from
    the candidate's code, foreign ones (torch.compile's, PyTorch's, a library's) by the name they run under."""
    origins = Origins(candidate_dir)
    own, foreign = {}, {}
    for name, lang, whose, compiled in _triton_kernels(origins) + _numba_kernels(origins) + _cupy_kernels(roots):
        if whose == "own":
            if compiled:
                own[name] = lang
        else:
            foreign.setdefault(name, f"{whose} {lang}")
    return {"own": {k: v for k, v in own.items() if k not in foreign}, "foreign": foreign}


def match(event_name: str, table: dict) -> str | None:
    """The entry of `table` (kernel name -> anything) a profiled kernel's name runs under, or None. Triton's and
    CuPy's `extern "C"` kernels run under their plain names; a C++ kernel under its demangled signature, whose base
    name must then be the entry; Numba's under `cudapy::<module>::<name>[...]`."""
    if not table:
        return None
    if event_name in table:
        return event_name
    if "cudapy::" in event_name:
        m = re.search(r"cudapy::(?:[\w.]+::)*(\w+)", event_name)
        return m.group(1) if m and m.group(1) in table else None
    from kp.observe.profile import kernel_base_name

    base = kernel_base_name(event_name)
    return base if base in table and "(" in event_name else None


NOT_A_LIBRARY = ("PyTorch's", "torch.compile's")  # foreign JIT kernels that are no installed library's


def library_kernels(names: list[str], foreign: dict) -> list[str]:
    """The profiled kernels (names) that are an installed library's JIT kernels, as "name (whose language)", in
    order: a row with no kernel of its own that ran these is not pure PyTorch."""
    out = []
    for n in names:
        hit = match(n, foreign)
        if hit and not foreign[hit].startswith(NOT_A_LIBRARY):
            out.append(f"{hit} ({foreign[hit]})")
    return sorted(set(out))


def label_foreign(names: list[str], foreign: dict) -> list[str]:
    """Kernel names as a rejection lists them: a JIT kernel that is not the candidate's says whose it is."""
    out = []
    for n in names:
        hit = match(n, foreign)
        out.append(f"{n} ({foreign[hit]})" if hit else n)
    return out


# ---------------------------------------------------------------------------------------------------------------
# A JIT's compile booked as build time; its errors in one line.


def watch_jit_builds(path, seconds: list) -> None:
    """Before the candidate's file is imported, where it uses Triton: Triton's compiler and its autotuner's
    benchmarking wrapped so their seconds add up in seconds[0] (the record's build stage), wherever the candidate
    triggers them (its first call, a new shape). A nested compile inside a benchmark is counted once."""
    if TRITON not in gpu_languages(path):
        return
    try:
        import triton.compiler
        from triton.runtime import autotuner
    except Exception:  # not installed here: the candidate's import says so
        return
    depth = [0]

    def timed(fn):
        if getattr(fn, "_kp_build_timed", False):
            return fn

        @functools.wraps(fn)
        def run(*args, **kwargs):
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    seconds[0] += time.perf_counter() - t0

        run._kp_build_timed = True
        return run

    triton.compiler.compile = timed(triton.compiler.compile)
    if hasattr(autotuner, "Autotuner") and hasattr(autotuner.Autotuner, "_bench"):
        autotuner.Autotuner._bench = timed(autotuner.Autotuner._bench)


def jit_error(e: BaseException) -> str | None:
    """A Triton compile error in one line: the kernel, its file:line, and the compiler's own message (its first
    meaningful line), never the excerpt or an IR dump; None for any other error."""
    errs = [
        c
        for c in exception_chain(e)
        if type(c).__module__.startswith("triton") and hasattr(c, "node") and hasattr(c, "src")
    ]
    if not errs:
        return None
    inner = errs[-1]  # the innermost: the kernel and the line where the compiler stopped
    why = getattr(inner, "error_message", None)
    if not why:
        cause = inner.__cause__ or inner.__context__
        why = f"{type(cause).__name__}: {cause}" if cause is not None else type(inner).__name__
    why = next((ln.strip() for ln in str(why).splitlines() if ln.strip()), type(inner).__name__)
    where = _kernel_line(inner)
    return f"Triton compile error{' in ' + where if where else ''}: {why[:240]}"


def _kernel_line(err) -> str | None:
    """'kernel (file.py:LINE)' of a Triton CompilationError: its source is the kernel's (without decorators), its
    node's line counts from the `def`."""
    jit = sys.modules.get("triton.runtime.jit")
    if jit is None:
        return None
    lineno = getattr(err.node, "lineno", None)
    for f in _instances((jit.JITFunction,)):
        if getattr(f, "src", None) != err.src and getattr(f, "_src", None) != err.src:
            continue
        raw = getattr(f, "raw_src", None) or []
        first = getattr(f, "starting_line_number", None)
        defs = next((i for i, ln in enumerate(raw) if re.match(r"\s*def\s", ln)), 0)
        name = f.fn.__name__
        if first is None or lineno is None:
            return name
        return f"{name} ({os.path.basename(f.fn.__code__.co_filename)}:{first + defs + lineno - 1})"
    return None
