"""Evaluate a bring-your-own ModelNew file (``run.py --problem P --candidate FILE``) so that a green result is true.

Two processes. This one (the checker) owns the inputs, the float64 and fp32 references, every comparison and the
verdict; it never imports the candidate. A spawned worker imports the candidate, builds ``ModelNew(*init)``, runs it
on inputs it receives (CUDA IPC / shared memory, so the checker sees exactly what the candidate saw afterwards) and
times it. The candidate can therefore not patch the comparisons or the reference. Inside its own process it could
patch torch; the worker binds nothing lazily that matters and fingerprints the torch/time namespaces before the
import, and every reply says whether any entry changed (a change rejects). Out of scope: a candidate that reaches
past Python (ctypes into the driver, patching C internals).

Stages, each able to reject with a one-line reason (``rejected: input 0 was modified``):
 1. import + construct: ModelNew must exist; weights come from the reference's state_dict when the keys match
    (else from the same torch.manual_seed, as KernelBench does).
 2. parity: >= 3 trials on fresh benchmark-shape inputs (seeds printed; ``--seed`` replays them) with training-mode
    state carried across the trials, then every declared small odd case. Per call: the allocator's cached free
    memory is filled with NaN first (an output element that is never written shows up), the candidate runs on its
    own copy, its inputs are compared bit for bit with the originals, then the references run on pristine copies.
    Output: plain torch.Tensor of the reference's shape/dtype/device; relL2 vs float64 overall and worst row within
    max(4 x PyTorch's own error in the chosen precision, 1e-6); NaN/Inf positions must match. Buffers (BatchNorm
    running stats) must match the reference's after the trials.
 3. timing: eager, torch.compile and the candidate interleaved in the worker (harness.bench_interleaved: L2 read
    flush, sleep-held stream, CUDA events, median/IQR). Every candidate call gets freshly generated inputs (a pool
    refilled from new seeds before each call), and the outputs of the first and last timed calls are re-checked
    against the reference here, so caching results by pointer or content cannot pass.
 4. escape: one call inside a profiler window bounded by marker kernels on the timed stream; any GPU work
    (kernel, memcpy, memset, any stream) outside the window means work escaped the timer. Host clock vs events with
    a device-wide synchronize is recorded beside it.
 5. own kernel: the profiled call must launch at least one kernel found in a shared object the candidate loaded
    (its load_inline build or the playground's kernel cache), not only torch/cuBLAS kernels; they are listed.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

import torch

import harness
from harness import UsageError, clone_layout, rel_error, budget_from

PRECISIONS = harness.PRECISIONS
MIN_TRIALS = 3
REPLY_TIMEOUT_S = 900  # one worker step (a cold kernel build plus a torch.compile fit well inside)


class Rejected(Exception):
    """The candidate failed a check; str() is the one-line reason."""


# ---------------------------------------------------------------------------------------------------------------
# Pure helpers (no GPU, unit-tested in CI).

def trial_seeds(seed: int, n: int) -> list[int]:
    """Trial i draws its inputs from seed + i: `--seed S` replays every trial of a run that printed S."""
    return [(seed + i) % 2**32 for i in range(n)]


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise-equal values through the views (NaN equals NaN; what lies outside the view is not compared)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all()) and bool(
            (torch.signbit(a) == torch.signbit(b)).all())
    return bool(torch.equal(a, b))


def describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{type(x).__name__} {tuple(x.shape)} {x.dtype} {x.device}"
    return type(x).__name__


def kernel_base_name(name: str) -> str:
    """'void kp::softmax_kernel<8>(float const*, ...)' -> 'softmax_kernel' (what a symbol table contains)."""
    s = name.strip().replace("(anonymous namespace)", "anon")
    for prefix in ("void ", "__global__ "):
        if s.startswith(prefix):
            s = s[len(prefix):]
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):  # first '(' or '<' outside template brackets ends the qualified name
        if ch in "(<" and depth == 0:
            cut = i
            break
    s = s[:cut]
    return s.split("::")[-1].strip()


def window_violations(events: list[dict], marker: str) -> tuple[list[dict], tuple[float, float] | None]:
    """GPU activities outside the window between the first and the last `marker` kernel (trace microseconds).
    Returns (violations, window); window None when the markers are missing (that itself is a failure)."""
    marks = [e for e in events if e["name"] == marker]
    if len(marks) < 2:
        return [], None
    lo = marks[0]["ts"] + marks[0]["dur"]
    hi = marks[-1]["ts"]
    inside = [e for e in events if e is not marks[0] and e is not marks[-1]]
    bad = [e for e in inside if e["ts"] < lo - 1.0 or e["ts"] + e["dur"] > hi + 1.0]  # 1 us: trace rounding
    return bad, (lo, hi)


def host_clock_excess_ms(samples: list[tuple[float, float, float]]) -> float:
    """samples: (wall ms from before the start event to after a device-wide synchronize, event ms, enqueue ms).
    Work on the timed stream finishes within max(enqueue, event) plus a synchronize's latency; the median excess
    beyond that is time the events did not see."""
    ex = sorted(w - max(ev, enq) for w, ev, enq in samples)
    return ex[len(ex) // 2] if ex else 0.0


def escape_threshold_ms(event_ms: float) -> float:
    """Excess over which the host clock says work escaped: 0.2 ms (synchronize + Python latency seen on the H200 is
    tens of us) plus 20% of the call."""
    return 0.2 + 0.2 * event_ms


def budget_reason(label: str, err, budget) -> str:
    if err.nonfinite_mismatch:
        return (f"{label}: {err.nonfinite_mismatch} NaN/Inf positions differ from the reference "
                f"(elements never written read as NaN)")
    return (f"{label}: relL2 {err.rel_l2:.2e} (worst row {err.worst_row:.2e}) over budget {budget.rel_l2:.2e} "
            f"({budget.worst_row:.2e})")


def set_precision(precision: str) -> None:
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


# ---------------------------------------------------------------------------------------------------------------
# Worker side (runs in the spawned process; imports the candidate).

def _namespaces():
    import time as time_mod
    import torch.nn.functional as F
    return {"torch": torch, "torch.nn.functional": F, "torch.Tensor": torch.Tensor,
            "torch._C.TensorBase": torch._C.TensorBase, "torch.nn.Module": torch.nn.Module,
            "torch.cuda": torch.cuda, "torch.cuda.Event": torch.cuda.Event, "torch.cuda.Stream": torch.cuda.Stream,
            "torch.profiler": torch.profiler, "torch.special": torch.special, "torch.linalg": torch.linalg,
            "time": time_mod, "harness": harness}


def namespace_fingerprint() -> dict[str, object]:
    """Every callable the checker, the timer and the baselines can reach by attribute lookup, by identity."""
    snap = {}
    for ns_name, ns in _namespaces().items():
        for k, v in list(vars(ns).items()):
            if callable(v) and not isinstance(v, types.ModuleType):
                snap[f"{ns_name}.{k}"] = v
    return snap


def fingerprint_changes(before: dict[str, object]) -> list[str]:
    now = namespace_fingerprint()
    return sorted(k for k, v in before.items() if now.get(k) is not v)


def nan_fill_cached_free(reserve_bytes: int) -> None:
    """Fill the caching allocator's free blocks (and at least reserve_bytes of them) with 0xFF bytes = NaN, so
    memory a candidate allocates and never writes reads as NaN instead of stale, plausible values."""
    if not torch.cuda.is_available():
        return
    held = []
    if reserve_bytes > 0:
        held.append(torch.empty(reserve_bytes, dtype=torch.uint8, device="cuda"))
    small = 1 << 20  # requests up to 1 MiB come from the small pool
    last_free = None
    for _ in range(512):
        free = [(b["size"], seg.get("segment_type", "large")) for seg in torch.cuda.memory_snapshot()
                for b in seg["blocks"] if b["state"] == "inactive"]
        total = sum(s for s, _ in free)
        if not free or total == last_free:
            break
        last_free = total
        size, kind = max(free)
        held.append(torch.empty(min(size, small) if kind == "small" else size, dtype=torch.uint8, device="cuda"))
    for t in held:
        t.fill_(0xFF)
    del held


def _loaded_objects() -> set[str]:
    try:
        with open("/proc/self/maps") as f:
            return {ln.split(None, 5)[5].strip() for ln in f if ln.count(" ") >= 5 and ".so" in ln}
    except OSError:
        return set()


def _system_prefixes() -> list[str]:
    import site
    from torch.utils.cpp_extension import CUDA_HOME
    pre = [os.path.dirname(torch.__file__), sys.prefix, sys.base_prefix, "/usr/lib", "/lib", "/usr/local/lib",
           "/usr/local/nvidia", "/usr/local/cuda"]
    pre += site.getsitepackages() + [site.getusersitepackages()]
    if CUDA_HOME:
        pre.append(CUDA_HOME)
    return [p for p in pre if p]


class Worker:
    def __init__(self, conn, problem: str, device: str, precision: str):
        self.conn, self.device, self.precision = conn, device, precision
        self.mod = harness.problem_module(problem)
        self.cand = None
        self.model = None
        self.baselines = {}
        self.fingerprint = None
        self.objects_before = _loaded_objects()

    def loop(self):
        while True:
            try:
                msg = self.conn.recv()
            except EOFError:
                return
            cmd, args = msg[0], msg[1:]
            if cmd == "quit":
                self.conn.send({"ok": True})
                return
            try:
                reply = getattr(self, "cmd_" + cmd)(*args)
                reply["ok"] = True
            except Exception as e:  # the candidate's failure is data for the checker, not a crash of the worker
                reply = {"ok": False, "error": f"{type(e).__name__}: {_first_line(e)}",
                         "traceback": traceback.format_exc(limit=8)}
            if self.fingerprint is not None:
                reply["patched"] = fingerprint_changes(self.fingerprint)
            self.conn.send(reply)
            if not reply["ok"] and self.device == "cuda" and _cuda_broken():
                return  # a sticky CUDA error: this context is gone; the checker sees the pipe close

    # -- setup --------------------------------------------------------------------------------------------------
    def cmd_baselines(self, init, seed, state, compile_baseline: bool, example_seed: int):
        """Eager and torch.compile references for the timing table, built and run once before the candidate
        exists (the fingerprint is taken after their first calls, so their own lazy setup is not a change)."""
        torch.manual_seed(seed)
        eager = self.mod.Model(*init).to(self.device)
        eager.load_state_dict(state)
        self.baselines = {"eager": eager}
        if compile_baseline:
            import copy
            self.baselines["torch.compile"] = torch.compile(copy.deepcopy(eager))
        x = harness.bench_inputs(self.mod, example_seed, self.device)
        set_precision(self.precision)
        with torch.no_grad():
            for m in self.baselines.values():
                m(*x)
        torch.cuda.synchronize()
        return {}

    def cmd_load(self, path: str):
        # Everything the checker's own stages import or initialise happens before the snapshot: importing
        # torch._dynamo (the profiler does) rebinds torch.manual_seed, which is torch's doing, not the candidate's.
        import torch._dynamo  # noqa: F401
        from torch.profiler import ProfilerActivity, profile
        if self.device == "cuda":
            harness.L2Flusher()
            e = torch.cuda.Event(enable_timing=True)
            with profile(activities=[ProfilerActivity.CUDA]):
                e.record()
                torch.cuda._sleep(10)
                torch.cuda.synchronize()
        self.fingerprint = namespace_fingerprint()
        p = Path(path).resolve()
        sys.path.insert(0, str(p.parent))
        spec = importlib.util.spec_from_file_location("kp_candidate", p)
        module = importlib.util.module_from_spec(spec)
        sys.modules["kp_candidate"] = module
        spec.loader.exec_module(module)
        self.cand = module
        if not isinstance(getattr(module, "ModelNew", None), type):
            return {"has_model_new": False}
        return {"has_model_new": True}

    def cmd_build(self, init, seed, state):
        self.model = None
        torch.manual_seed(seed)
        m = self.cand.ModelNew(*init)
        m = m.to(self.device) if isinstance(m, torch.nn.Module) else m
        weights = "seed"
        if isinstance(m, torch.nn.Module) and set(m.state_dict()) == set(state):
            m.load_state_dict(state)
            weights = "state_dict"
        self.model = m
        return {"weights": weights}

    # -- parity -------------------------------------------------------------------------------------------------
    def cmd_forward(self, inputs, reserve_bytes: int):
        if self.device == "cuda":
            torch.cuda.ipc_collect()
            nan_fill_cached_free(reserve_bytes)
        set_precision(self.precision)
        with torch.no_grad():
            out = self.model(*inputs)
        if self.device == "cuda":
            torch.cuda.synchronize()  # device-wide: side-stream work finishes before the output leaves
        rep = {"type": describe(out), "tf32_after": torch.backends.cuda.matmul.allow_tf32}
        rep["out"] = out if type(out) is torch.Tensor else None
        return rep

    def cmd_buffers(self):
        m = self.model
        if not isinstance(m, torch.nn.Module):
            return {"buffers": {}}
        return {"buffers": {k: v.detach().clone() for k, v in m.state_dict().items()}}

    # -- timing -------------------------------------------------------------------------------------------------
    def cmd_time(self, seed0: int, pool_size: int, min_reps: int, max_reps: int, budget_s: float):
        mod, dev = self.mod, self.device
        pool = [harness.bench_inputs(mod, seed0 + i, dev) for i in range(pool_size)]
        seeds = [seed0 + i for i in range(pool_size)]
        st = {"calls": 0, "slot": 0, "first": None, "last": None}
        next_seed = seed0 + pool_size

        def before(name, rep):
            if name != "candidate":
                return
            slot = st["calls"] % pool_size
            s = next_seed + st["calls"]
            for dst, src in zip(pool[slot], harness.bench_inputs(mod, s, dev)):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
            seeds[slot], st["slot"], st["rep"] = s, slot, rep
            st["calls"] += 1

        def candidate():
            slot = st["slot"]
            out = self.model(*pool[slot])
            rec = (seeds[slot], out, slot)
            if st["rep"] >= 0 and st["first"] is None:
                st["first"] = rec
            st["last"] = rec

        fns = {k: (lambda m=m: m(*pool[st["slot"]])) for k, m in self.baselines.items()}
        fns["candidate"] = candidate
        set_precision(self.precision)
        with torch.no_grad():
            times = harness.bench_interleaved(fns, min_reps=min_reps, max_reps=max_reps, budget_s=budget_s,
                                              before=before)
        torch.cuda.synchronize()
        first_seed, first_out, _ = st["first"]
        last_seed, last_out, last_slot = st["last"]
        return {"timing": {k: dataclasses.asdict(t) for k, t in times.items()}, "calls": st["calls"],
                "first": (first_seed, first_out if type(first_out) is torch.Tensor else None),
                "last": (last_seed, last_out if type(last_out) is torch.Tensor else None),
                "last_inputs": pool[last_slot]}

    # -- escape + own kernel --------------------------------------------------------------------------------------
    def cmd_escape(self, seed: int):
        from torch.profiler import ProfilerActivity, profile
        x = harness.bench_inputs(self.mod, seed, self.device)
        f = lambda: self.model(*x)
        flush = harness.L2Flusher()
        set_precision(self.precision)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        with torch.no_grad():
            f()
            torch.cuda.synchronize()
            for _ in range(5):
                flush()
                torch.cuda.synchronize()
                h0 = time.perf_counter()
                start.record()
                e0 = time.perf_counter()
                f()
                e1 = time.perf_counter()
                stop.record()
                torch.cuda.synchronize()
                h1 = time.perf_counter()
                samples.append(((h1 - h0) * 1e3, start.elapsed_time(stop), (e1 - e0) * 1e3))
            # the marker kernel's name, from a profile of the marker alone
            marker = None
            with profile(activities=[ProfilerActivity.CUDA]) as p0:
                torch.cuda._sleep(1000)
                torch.cuda.synchronize()
            evs = _gpu_events(p0)
            if evs:
                marker = evs[0]["name"]
            flush()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                torch.cuda._sleep(20000)
                f()
                torch.cuda._sleep(20000)
                torch.cuda.synchronize()
                time.sleep(0.05)  # work a thread defers by up to 50 ms still lands in the trace
                torch.cuda.synchronize()
        events = _gpu_events(prof)
        libs = sorted(p for p in _loaded_objects() - self.objects_before
                      if not any(p.startswith(pre) for pre in _system_prefixes()))
        own = {}
        blobs = {}
        for p in libs:
            try:
                blobs[p] = Path(p).read_bytes()
            except OSError:
                pass
        for e in events:
            if e["kind"] != "kernel" or e["name"] == marker:
                continue
            base = kernel_base_name(e["name"]).encode()
            hit = next((p for p, b in blobs.items() if base and base in b), None)
            if hit:
                own.setdefault(e["name"], os.path.basename(hit))
        return {"samples": samples, "events": events, "marker": marker, "own": own, "libs": libs}


def _gpu_events(prof) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    kinds = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
    out = []
    for e in trace.get("traceEvents", []):
        k = kinds.get(str(e.get("cat", "")).lower())
        if k and e.get("ph") == "X":
            args = e.get("args", {})
            out.append({"name": e.get("name", ""), "kind": k, "ts": float(e["ts"]), "dur": float(e.get("dur", 0)),
                        "stream": args.get("stream")})
    out.sort(key=lambda e: e["ts"])
    return out


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else ""


def _cuda_broken() -> bool:
    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True


def worker_main(conn, problem: str, device: str, precision: str, root: str):
    import warnings
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    sys.path.insert(0, root)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    Worker(conn, problem, device, precision).loop()


# ---------------------------------------------------------------------------------------------------------------
# Checker side.

class _Session:
    """The spawned worker and the request/reply protocol; a dead worker or a timeout becomes a rejection."""

    def __init__(self, problem: str, device: str, precision: str):
        import torch.multiprocessing as tmp
        ctx = tmp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, problem, device, precision, str(harness.ROOT)),
                                daemon=True)
        self.proc.start()
        child.close()

    def call(self, stage: str, *msg, timeout: float = REPLY_TIMEOUT_S) -> dict:
        try:
            self.conn.send(msg)
            deadline = time.monotonic() + timeout
            while not self.conn.poll(1.0):
                if not self.proc.is_alive():
                    raise Rejected(f"{stage}: the candidate's process died (exit code {self.proc.exitcode})")
                if time.monotonic() > deadline:
                    raise Rejected(f"{stage}: no answer within {timeout:.0f} s")
            reply = self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self.proc.join(5)
            raise Rejected(f"{stage}: the candidate's process died (exit code {self.proc.exitcode})") from None
        if reply.get("patched"):
            raise Rejected(f"{stage}: the candidate replaced {', '.join(reply['patched'][:4])} in its process "
                           f"(checker, timer and baselines depend on them)")
        if not reply.get("ok"):
            raise Rejected(f"{stage}: raised {reply.get('error')}")
        return reply

    def close(self):
        try:
            if self.proc.is_alive():
                self.conn.send(("quit",))
                self.proc.join(10)
        except (OSError, EOFError, BrokenPipeError):
            pass
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


@dataclasses.dataclass
class _Ref:
    """fp32 and float64 references carrying state (BatchNorm running stats) across calls like the candidate."""
    r32: torch.nn.Module
    r64: torch.nn.Module

    @classmethod
    def build(cls, mod, init, seed, device):
        import copy
        torch.manual_seed(seed)
        r32 = mod.Model(*init).to(device)
        return cls(r32, copy.deepcopy(r32).double())


def _reference(ref: _Ref, pristine: list, precision: str):
    set_precision(precision)
    with torch.no_grad():
        r32 = ref.r32(*[clone_layout(x) for x in pristine])
        r64 = ref.r64(*[clone_layout(x).double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                        for x in pristine])
    set_precision("fp32")
    return r32, r64


def _judge_output(label: str, out, out_type: str, r32, r64) -> dict:
    if out is None or out.shape != r32.shape or out.dtype != r32.dtype or out.device != r32.device:
        raise Rejected(f"{label}: output is {out_type}, expected torch.Tensor {tuple(r32.shape)} {r32.dtype} "
                       f"{r32.device}")
    e_ref, e = rel_error(r32, r64), rel_error(out, r64)
    budget = budget_from(e_ref)
    if not e.within(budget):
        raise Rejected(budget_reason(label, e, budget))
    return {"rel_l2": e.rel_l2, "worst_row": e.worst_row, "torch_rel_l2": e_ref.rel_l2, "budget": budget.rel_l2}


def _check_call(sess: _Session, label: str, pristine: list, ref: _Ref, precision: str) -> dict:
    """One forward of the candidate on its own copy of `pristine`, then the references on pristine copies."""
    cand_inputs = [clone_layout(x) for x in pristine]
    reply = sess.call(label, "forward", cand_inputs, _out_bytes_hint(pristine))
    if precision == "fp32" and reply["tf32_after"]:
        raise Rejected(f"{label}: the candidate switched TF32 on in fp32 mode")
    for i, (a, b) in enumerate(zip(cand_inputs, pristine)):
        if isinstance(b, torch.Tensor) and not same_values(a, b):
            raise Rejected(f"{label}: input {i} was modified")
    r32, r64 = _reference(ref, pristine, precision)
    res = _judge_output(label, reply["out"], reply["type"], r32, r64)
    del reply, cand_inputs, r32, r64
    _release()
    return res


def _release():
    """Hand the checker's cached GPU memory back: the worker shares the device and needs room for its own."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _out_bytes_hint(pristine: list) -> int:
    """NaN-filled headroom the worker keeps in its allocator: twice the largest input (outputs here are no larger
    than the inputs' largest tensor times the feature ratio, and a bigger request just gets fresh memory)."""
    sizes = [x.numel() * x.element_size() for x in pristine if isinstance(x, torch.Tensor)]
    return 2 * max(sizes, default=0) + (64 << 20)


def _check_buffers(label: str, cand: dict, ref: _Ref) -> None:
    b32 = dict(ref.r32.named_buffers())
    b64 = dict(ref.r64.named_buffers())
    for k, v in b32.items():
        if k not in cand:
            raise Rejected(f"{label}: the candidate has no buffer {k!r} (the reference's training-mode state "
                           f"cannot be checked)")
        c = cand[k]
        if not v.is_floating_point():
            if not torch.equal(c.cpu(), v.cpu()):
                raise Rejected(f"{label}: buffer {k} is {c.tolist()}, the reference's {v.tolist()}")
            continue
        e_ref, e = rel_error(v, b64[k]), rel_error(c.to(v.device), b64[k])
        budget = budget_from(e_ref)
        if c.shape != v.shape or not e.within(budget):
            raise Rejected(f"{label}: buffer {k} differs from the reference's (relL2 {e.rel_l2:.2e}, budget "
                           f"{budget.rel_l2:.2e})")


def evaluate(problem: str, path: str | Path, *, seed: int | None = None, trials: int = MIN_TRIALS,
             precision: str = "fp32", device: str | None = None, bench: bool = True, compile_baseline: bool = True,
             min_reps: int = 10, max_reps: int = 100, budget_s: float = 20.0, log=harness._progress) -> dict:
    """Judge the candidate file; returns the record. rec['accepted'] and rec['reason'] carry the verdict."""
    mod = harness.problem_module(problem)
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"candidate file {str(path)!r} does not exist")
    if precision not in PRECISIONS:
        raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if trials < MIN_TRIALS:
        raise UsageError(f"at least {MIN_TRIALS} trials, got {trials}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else None
    if device is None:
        raise UsageError("no CUDA device visible: use a GPU machine (or --device cpu for the host-side parity "
                         "checks of a pure-torch candidate on the declared cases)")
    if device not in ("cuda", "cpu"):
        raise UsageError(f"device must be cuda or cpu, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("no CUDA device visible")
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    seeds = trial_seeds(seed, trials)
    log(f"{problem}: candidate {path}; seed {seed} (trials {', '.join(map(str, seeds))}; replay with --seed {seed})")
    rec = {"problem": problem, "candidate": str(path), "seed": seed, "trial_seeds": seeds, "precision": precision,
           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "checks": {}, "accepted": False, "reason": ""}
    gpu = device == "cuda"
    init = mod.get_init_inputs()
    sess = _Session(problem, device, precision)
    try:
        ref = _Ref.build(mod, init, seed, device)
        state = ref.r32.state_dict()
        if gpu and bench:
            log(f"{problem}: building the eager{' and torch.compile' if compile_baseline else ''} baselines")
            sess.call("baselines", "baselines", init, seed, state, compile_baseline, seeds[0])
        r = sess.call("import", "load", str(path.resolve()))
        if not r["has_model_new"]:
            raise Rejected("import: the file defines no class ModelNew")

        # -- parity: trials on the benchmark shape (GPU) with state carried across, then the declared cases ----------
        if gpu:
            rec["weights"] = sess.call("construct", "build", init, seed, state)["weights"]
            for i, s in enumerate(seeds):
                pristine = harness.bench_inputs(mod, s, device)
                rec["checks"][f"trial {i + 1} (seed {s})"] = _check_call(sess, f"trial {i + 1} (seed {s})",
                                                                         pristine, ref, precision)
                del pristine
            _check_buffers(f"after {trials} trials", sess.call("buffers", "buffers")["buffers"], ref)
        for name in mod.CASES:
            for s in (seeds if not gpu else [seed]):
                c_init, c_inputs = harness.case_inputs(mod, name, s, device)
                c_ref = _Ref.build(mod, c_init, s, device)
                sess.call(f"case {name}", "build", c_init, s, c_ref.r32.state_dict())
                label = f"case {name} (seed {s})"
                rec["checks"][label] = _check_call(sess, label, c_inputs, c_ref, precision)
                _check_buffers(label, sess.call("buffers", "buffers")["buffers"], c_ref)
                del c_ref, c_inputs
        log(f"{problem}: parity passed ({len(rec['checks'])} calls)")
        if not gpu:
            rec["notes"] = "device cpu: timing, escape and own-kernel checks need a GPU and were not run"
            rec["accepted"] = True
            return rec

        # -- timing, with fresh inputs per call and the first/last timed outputs re-checked ------------------------
        sess.call("construct", "build", init, seed, state)
        ref = _Ref.build(mod, init, seed, device)
        reps = (min_reps, max_reps, budget_s) if bench else (3, 3, 5.0)
        log(f"{problem}: timing {'eager, torch.compile and ' if bench and compile_baseline else ''}the candidate "
            f"(fresh inputs per call, L2 flushed before each)")
        t = sess.call("timing", "time", (seed + 1000) % 2**32, 2, *reps)
        last_seed = t["last"][0]
        pristine = harness.bench_inputs(mod, last_seed, device)
        for i, (a, b) in enumerate(zip(t["last_inputs"], pristine)):
            if isinstance(b, torch.Tensor) and not same_values(a, b):
                raise Rejected(f"timed call {t['calls']}: input {i} was modified")
        for which, (s, out) in (("first", t["first"]), ("last", t["last"])):
            label = f"{which} timed call (inputs seed {s})"
            p = pristine if s == last_seed else harness.bench_inputs(mod, s, device)
            r32, r64 = _reference(ref, p, precision)
            rec["checks"][label] = _judge_output(label, out, "not a plain torch.Tensor" if out is None else
                                                 describe(out), r32, r64)
        del pristine, t["first"], t["last"], t["last_inputs"], p, r32, r64
        _release()
        rec["timing"] = t["timing"]
        rec["timed_calls"] = t["calls"]

        # -- escape + own kernel -------------------------------------------------------------------------------------
        e = sess.call("escape", "escape", (seed + 2000) % 2**32)
        ev_ms = sorted(s[1] for s in e["samples"])[len(e["samples"]) // 2]
        excess = host_clock_excess_ms(e["samples"])
        bad, window = window_violations(e["events"], e["marker"])
        rec["escape"] = {"host_excess_ms": excess, "threshold_ms": escape_threshold_ms(ev_ms), "event_ms": ev_ms,
                         "streams": sorted({str(x["stream"]) for x in e["events"] if x["name"] != e["marker"]}),
                         "outside_window": [(x["name"][:80], x["stream"]) for x in bad]}
        if window is None:
            raise Rejected("escape: the profiler saw no marker kernels (is the profiler working here?)")
        if bad:
            x = bad[0]
            where = "after" if x["ts"] + x["dur"] > window[1] else "before"
            raise Rejected(f"escape: GPU work outside the timed window ({len(bad)} activities, e.g. "
                           f"{kernel_base_name(x['name'])[:60]} on stream {x['stream']} ending {where} the window): "
                           f"work escaped the timed stream")
        if excess > escape_threshold_ms(ev_ms):
            raise Rejected(f"escape: the host clock saw {excess:.3f} ms more than the CUDA events per call "
                           f"(events {ev_ms:.3f} ms): work escaped the timed stream")
        rec["own_kernels"] = e["own"]
        rec["kernels"] = sorted({x["name"][:120] for x in e["events"] if x["name"] != e["marker"]})
        if not e["own"]:
            raise Rejected(f"own kernel: no kernel from the candidate's own build ran (kernels seen: "
                           f"{', '.join(kernel_base_name(k) for k in rec['kernels'][:4]) or 'none'})")
        if bench:
            if mod.BOUND == "memory":
                rec["ceiling"], rec["unit"] = harness.copy_bandwidth(), "GB/s"
            else:
                rec["ceiling"], rec["unit"] = max(harness.gemm_rates().values()), "TFLOP/s"
            x = harness.bench_inputs(mod, seed, device)
            rec["traffic"] = mod.traffic(*x, init=init)
            rec["shape"] = harness._shape_str(x)
            del x
        rec["accepted"] = True
        return rec
    except Rejected as e:
        rec["reason"] = str(e)
        return rec
    finally:
        sess.close()


def format_record(rec: dict) -> str:
    lines = [f"{rec['problem']} candidate {rec['candidate']} seed {rec['seed']} precision {rec['precision']} on "
             f"{rec['device']}, torch {rec['torch']}"]
    for label, c in rec["checks"].items():
        lines.append(f"  {label:44} relL2 {c['rel_l2']:.1e} (worst row {c['worst_row']:.1e}) budget "
                     f"{c['budget']:.1e}")
    if rec.get("own_kernels"):
        lines.append("  own kernels: " + "; ".join(f"{kernel_base_name(k)} ({lib})" for k, lib in
                                                  rec["own_kernels"].items()))
    if "timing" in rec and "ceiling" in rec:
        scale = 1e9 if rec["unit"] == "GB/s" else 1e12
        what = "bytes" if rec["unit"] == "GB/s" else "flops"
        t = rec["timing"]
        lines.append(f"  [{rec['shape']}] ceiling {rec['ceiling'] / scale:,.0f} {rec['unit']} (measured now); "
                     f"{rec['timed_calls']} timed candidate calls, each on fresh inputs")
        lines.append(f"  {'':14} {'median ms':>9} {'IQR ms':>7} {rec['unit']:>8} {'%ceil':>6} {'vs eager':>8} "
                     f"{'vs comp':>7} {'host us':>7}")
        for k, x in t.items():
            rate = rec["traffic"][what] / (x["median_ms"] * 1e-3)
            ve = t["eager"]["median_ms"] / x["median_ms"] if "eager" in t else float("nan")
            vc = f"{t['torch.compile']['median_ms'] / x['median_ms']:.2f}x" if "torch.compile" in t else "-"
            lines.append(f"  {k:14} {x['median_ms']:9.3f} {x['q3_ms'] - x['q1_ms']:7.3f} {rate / scale:8,.0f} "
                         f"{100 * rate / rec['ceiling']:5.1f}% {ve:7.2f}x {vc:>7} {x['host_us']:7.0f}")
    if rec.get("escape"):
        e = rec["escape"]
        lines.append(f"  escape check: no GPU work outside the timed window (streams {', '.join(e['streams'])}); "
                     f"host clock excess {e['host_excess_ms']:.3f} ms (threshold {e['threshold_ms']:.3f})")
    lines.append("accepted" if rec["accepted"] else f"rejected: {rec['reason']}")
    return "\n".join(lines)
