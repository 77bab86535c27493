"""What the worker watches in a candidate's process besides its outputs: whether anything the judge, the timer or
the baselines reach was replaced or changed in place (the namespace fingerprint), threads the candidate left
working after a call, extension builds that failed before the candidate fell back to PyTorch, the libraries it
loaded, and its modules' train/eval sensitivity. The escape check's arithmetic is kp.judge.window's."""

from __future__ import annotations

import os
import sys
import threading
import types
from pathlib import Path

import torch


def _namespaces():
    import time as time_mod
    import torch.nn.functional as F

    own = [(name, mod) for name, mod in list(sys.modules.items()) if mod is not None and _own_module(name)]
    return {
        "torch": torch,
        "torch.nn.functional": F,
        "torch.Tensor": torch.Tensor,
        "torch._C.TensorBase": torch._C.TensorBase,
        "torch.nn.Module": torch.nn.Module,
        "torch.cuda": torch.cuda,
        "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.Stream": torch.cuda.Stream,
        "torch.profiler": torch.profiler,
        "torch.autograd.profiler": torch.autograd.profiler,
        "torch.autograd.profiler.profile": torch.autograd.profiler.profile,  # what the escape check profiles with
        "torch.special": torch.special,
        "torch.linalg": torch.linalg,
        "torch.optim.SGD": torch.optim.SGD,
        "time": time_mod,
        "threading.Thread": threading.Thread,
        "os": os,
        # the playground's own modules a candidate could patch (the façade and everything behind it), and the
        # classes they define (kp.lib.timing.L2Flusher, Timing, the Worker itself)
        **{name: mod for name, mod in own},
        **{
            f"{name}.{k}": c
            for name, mod in own
            for k, c in list(vars(mod).items())
            if isinstance(c, type) and c.__module__ == name
        },
    }


def _behaviour(v) -> tuple:
    """What a callable's behaviour rests on besides its identity, each part by identity: a Python function's code
    object, defaults, keyword defaults and closure cells with their contents (a function can be given new code in
    place, `f.__code__ = g.__code__`, and keep its identity); a class's own attributes (its methods, each the same
    way, as a namespace of its own: an attribute torch adds lazily is not a change). Builtins have none of these and
    cannot be changed in place."""
    f = getattr(v, "__func__", v)  # a bound method or classmethod: the function behind it
    if isinstance(v, type):  # by identity here; the classes the timer uses are namespaces of their own
        return ()
    if isinstance(f, (staticmethod, classmethod)):
        f = f.__func__
    if isinstance(f, property):
        return tuple(_behaviour(x) for x in (f.fget, f.fset, f.fdel))
    code = getattr(f, "__code__", None)
    if code is None:
        return ()
    cells = tuple((c, c.cell_contents if _filled(c) else None) for c in (f.__closure__ or ()))
    kwd = tuple(f.__kwdefaults__.items()) if f.__kwdefaults__ else ()
    return (code, f.__defaults__, tuple((k, x) for k, x in kwd), cells)


def _filled(cell) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:  # an empty cell
        return False


def _own_module(name: str) -> bool:
    return name == "harness" or name == "kp" or name.startswith("kp.")


def namespace_fingerprint() -> dict[str, tuple]:
    """Every callable the judge, the timer and the baselines can reach by attribute lookup: its identity and what
    its behaviour rests on (_behaviour); and every other global of the playground's own modules (the timer's
    constants), by identity, with a shallow copy of the contents of a constant (an UPPER_CASE list, dict or set;
    private caches such as the kernel cache's table of loaded builds fill as they are used)."""
    snap = {}
    for ns_name, ns in _namespaces().items():
        own = _own_module(ns_name)
        for k, v in list(vars(ns).items()):
            if isinstance(v, types.ModuleType):
                continue
            if callable(v):
                snap[f"{ns_name}.{k}"] = (v, *_behaviour(v))
            elif own and not (k.startswith("__") and k.endswith("__")):  # not __doc__, __spec__, ...
                const = k.isupper() and not k.startswith("_")
                contents = (
                    ()
                    if not const
                    else tuple(v.items())
                    if isinstance(v, dict)
                    else tuple(v)
                    if isinstance(v, (list, set))
                    else ()
                )
                snap[f"{ns_name}.{k}"] = (v, *contents)
    return snap


def torchs_own_rebinding(old, new) -> bool:
    """Whether `new` is exactly what torch itself makes of `old` on a first use the worker may no longer make before
    the fingerprint (on the CPU it skips torch._dynamo where the candidate does not compile): importing torch._dynamo
    sets torch.manual_seed = torch._disable_dynamo(torch.manual_seed), and the first optimizer of a class wraps its
    step in Optimizer.profile_hook_step. The wrapper's code is that factory's own (no other function has that code
    object) and the function it wraps and calls is the very object that was there, so it behaves as `old`."""
    try:
        from torch._compile import _disable_dynamo

        codes = (_disable_dynamo(_noop).__code__, torch.optim.Optimizer.profile_hook_step(_noop).__code__)
    except (ImportError, AttributeError, TypeError):
        return False
    cells = [c.cell_contents for c in (getattr(new, "__closure__", None) or ()) if _filled(c)]
    return (
        any(getattr(new, "__code__", None) is code for code in codes)
        and getattr(new, "__wrapped__", None) is old
        and any(c is old for c in cells)
    )


def _noop():
    return None


def fingerprint_changes(before: dict[str, tuple]) -> list[str]:
    """The names whose object was replaced ('torch.softmax'), or kept but changed in place ('kp.lib.timing.summarize
    (its code, defaults or closure)'), since `before`; torch's own rebinding on a first use is not a change
    (torchs_own_rebinding)."""
    now = namespace_fingerprint()
    out = []
    for k, old in before.items():
        new = now.get(k)
        if new is not None and new[0] is not old[0] and torchs_own_rebinding(old[0], new[0]):
            continue
        if new is None or new[0] is not old[0]:
            out.append(k)
        elif len(new) != len(old) or any(a is not b for a, b in zip(_flat(new), _flat(old))):
            out.append(f"{k} (in place: its code, defaults, closure or contents)")
    return sorted(out)


def _flat(t):
    for x in t:
        if isinstance(x, tuple):
            yield from _flat(x)
        else:
            yield x


def loaded_objects() -> set[str]:
    try:
        with open("/proc/self/maps") as f:
            return {ln.split(None, 5)[5].strip() for ln in f if ln.count(" ") >= 5 and ".so" in ln}
    except OSError:
        return set()


def system_prefixes() -> list[str]:
    import site
    from torch.utils.cpp_extension import CUDA_HOME

    pre = [
        os.path.dirname(torch.__file__),
        sys.prefix,
        sys.base_prefix,
        "/usr/lib",
        "/lib",
        "/usr/local/lib",
        "/usr/local/nvidia",
        "/usr/local/cuda",
    ]
    pre += site.getsitepackages() + [site.getusersitepackages()]
    if CUDA_HOME:
        pre.append(CUDA_HOME)
    return [p for p in pre if p]


def first_compiler_error(text: str) -> str:
    """The compiler's first error line in a failed extension build's message (nvcc, gcc and ninja alike)."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    for ln in lines:
        if (
            "error" in ln.lower()
            and not ln.lower().startswith(("ninja: build stopped", "["))
            and "Error building extension" not in ln
        ):
            return ln[:240]
    return lines[0][:240] if lines else ""


BUILD_FAILED = "kp_build_failed.txt"  # in an extension's build folder: the compiler's first error of a failed build


def _failure_note(ext, name: str, kwargs: dict):
    """Where a failed build of extension `name` leaves its compiler error for the next process that loads it."""
    from pathlib import Path

    try:
        return Path(kwargs.get("build_directory") or ext._get_build_directory(name, False)) / BUILD_FAILED
    except Exception:
        return None


def builds_cuda(fn_name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a load/load_inline call compiles CUDA code: CUDA sources given (load_inline's cuda_sources, a .cu
    among load's sources) or with_cuda asked for. False where the call's arguments cannot be read so."""
    try:
        if kwargs.get("with_cuda"):
            return True
        if fn_name == "load_inline":
            return bool(kwargs.get("cuda_sources", args[2] if len(args) > 2 else None))
        srcs = kwargs.get("sources", args[1] if len(args) > 1 else [])
        return any(str(src).endswith(".cu") for src in ([srcs] if isinstance(srcs, str) else srcs or []))
    except Exception:
        return False


def record_build_failures(sink: list, seconds: list | None = None) -> None:
    """Wrap torch.utils.cpp_extension's load and load_inline so a build that fails is recorded (extension name,
    the compiler's first error) before the exception reaches the candidate, which may catch it and fall back to
    PyTorch: the verdict then says its kernel never ran. The seconds spent inside them (a build, or finding one
    built) add up in seconds[0], wherever the candidate calls them (import, __init__, its first call), for the
    record's stage table. Installed before the namespace fingerprint is taken."""
    import functools
    import time
    from torch.utils import cpp_extension as ext

    def wrap(fn, attr: str):
        if getattr(fn, "_kp_records_failures", False):
            return fn

        @functools.wraps(fn)
        def recorded(*args, **kwargs):
            t0 = time.perf_counter()
            if kwargs.get("verbose"):  # torch prints a verbose build's compiler output and raises a bare "Error
                kwargs["verbose"] = False  # building extension": quiet, the output is in the error, said in the verdict
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                name = str(kwargs.get("name", args[0] if args else "?"))
                error = first_compiler_error(e) or type(e).__name__
                note = _failure_note(ext, name, kwargs)
                lost = isinstance(e, ImportError) and "cannot open shared object" in str(e)
                for _ in range(20 if lost and note else 0):  # that build's process writes it just after its lock
                    if note.is_file():
                        break
                    time.sleep(0.1)
                if lost and note and note.is_file():
                    # another process's build of it failed (a batch's build ahead): torch waited for its lock and
                    # found no library; the compiler's error is what this process would have met building it
                    error = note.read_text(errors="replace")[:240]
                    sink.append({"extension": name, "error": error, "cuda": builds_cuda(attr, args, kwargs)})
                    raise RuntimeError(
                        f"Error building extension '{name}' (built in another process): {error}"
                    ) from None
                if note and not isinstance(e, ImportError):
                    try:
                        note.write_text(error)
                    except OSError:
                        pass
                sink.append({"extension": name, "error": error, "cuda": builds_cuda(attr, args, kwargs)})
                raise
            finally:
                if seconds is not None:
                    seconds[0] += time.perf_counter() - t0

        recorded._kp_records_failures = True
        return recorded

    for attr in ("load", "load_inline"):
        setattr(ext, attr, wrap(getattr(ext, attr), attr))


def settle_torch() -> None:
    """What torch itself installs the first time it compiles (torch.compile wraps nn.Module.__init__/__setstate__
    and every optimizer's _init_group), done before the fingerprint so that a candidate using torch.compile is
    not mistaken for one that patches torch."""
    try:
        from torch._dynamo.mutation_guard import install_generation_tagging_init

        install_generation_tagging_init()
    except (ImportError, AttributeError):
        pass
    try:
        from torch._dynamo.eval_frame import TorchPatcher

        TorchPatcher.patch()
    except (ImportError, AttributeError):
        pass


def late_message(threads: list[str]) -> str:
    return (
        f"a thread the candidate started is still working after the call returned ({'; '.join(threads[:3])}):"
        f" work finished outside the call escapes the timer"
    )


_POOL = os.path.join("concurrent", "futures", "thread.py")


def _in(folder: str, code) -> bool:
    return code.co_filename.startswith(folder + os.sep)


def watch_thread_starts(folder: str) -> None:
    """Mark every thread started from code in the candidate's folder (the starting call's stack holds one of its
    frames, also where it starts a thread through a library such as torch.compile's pools), so that threads the
    judge's own machinery starts (multiprocessing's resource sharer) are not held against it. Installed before the
    namespace fingerprint, which covers threading.Thread."""
    orig = threading.Thread.start
    if getattr(orig, "_kp_watch", False):
        return

    def start(self, *args, **kwargs):
        f = sys._getframe(1)
        while f is not None:
            if _in(folder, f.f_code):
                self._kp_by_candidate = True
                break
            f = f.f_back
        return orig(self, *args, **kwargs)

    start._kp_watch = True
    threading.Thread.start = start


def late_threads(before: set, folder: str) -> list[str]:
    """Threads the candidate left working after a call: alive, not alive before its import, started by its code
    (watch_thread_starts) or running its code, and now running its code, running a thread pool's work item, running
    a target that is not Python code (a builtin, a functools.partial), or a Timer yet to fire. A thread that finishes
    the work after the call returns hides that work from the timer. Threads parked in library code (torch.compile's
    pools, a progress bar's monitor) are not counted."""
    # Not this thread's frame: kept in a local, it would make a cycle (frame -> locals -> dict -> frame) that holds
    # its callers' frames and their locals -- a timing loop's 6 GiB input draw per call -- until the next collection.
    me = threading.get_ident()
    frames = {k: v for k, v in sys._current_frames().items() if k != me}
    out = []
    for t in threading.enumerate():
        if t.ident in before or t is threading.current_thread() or not t.is_alive():
            continue
        stack, f = [], frames.get(t.ident)
        while f is not None:
            stack.append(f.f_code)
            f = f.f_back
        own = next((c for c in stack if _in(folder, c)), None)
        if own is None and not getattr(t, "_kp_by_candidate", False):
            continue
        target = getattr(t, "_target", None)
        if own:
            out.append(f"{t.name} in {Path(own.co_filename).name}:{own.co_name}")
        elif any(c.co_name == "run" and c.co_filename.endswith(_POOL) for c in stack):
            out.append(f"{t.name} running a thread pool's work item")
        elif isinstance(t, threading.Timer) and not t.finished.is_set():
            out.append(f"{t.name}, a Timer yet to fire")
        elif target is not None and not hasattr(getattr(target, "__func__", target), "__code__"):
            out.append(f"{t.name} running {getattr(target, '__name__', type(target).__name__)}")
    return out


TRAIN_SENSITIVE = ("BatchNorm", "InstanceNorm", "Dropout", "SyncBatchNorm")


def train_sensitive(model) -> list[str]:
    """Module types in `model` whose forward differs between training and eval mode."""
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd
    from torch.nn.modules.instancenorm import _InstanceNorm

    out = []
    for m in model.modules() if isinstance(model, torch.nn.Module) else []:
        if (
            isinstance(m, _BatchNorm)
            or (isinstance(m, _InstanceNorm) and m.track_running_stats)
            or (isinstance(m, _DropoutNd) and m.p > 0)
        ):
            out.append(type(m).__name__)
    return list(dict.fromkeys(out))
