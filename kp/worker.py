"""The worker: holds the judged models and runs the judge's commands on them, in a process of its own for a candidate
file or in the judge's own process for the playground's variants."""
from __future__ import annotations

import dataclasses
import importlib
import os
import signal
import sys
import threading
import time
import traceback
import types
from pathlib import Path

import torch

from kp.boxstart import WORKER_PRELOAD
from kp.build import cache_root, shared_cache
from kp.errors import Rejected, first_line
from kp.guards import (fingerprint_changes, late_message, late_threads, loaded_objects, namespace_fingerprint,
                       record_build_failures, settle_torch, system_prefixes, train_sensitive, watch_thread_starts)
from kp.reference import Reference, apply_update, describe
from kp.registry import ROOT
from kp.layers import set_precision
from kp.profile import cpu_ops, gpu_events, kernel_base_name, summarize
from kp.timing import L2Flusher, bench_interleaved

REPLY_TIMEOUT_S = 900  # one worker step (a cold kernel build plus a torch.compile fit well inside)
JOB_TIMEOUT_S = 600  # a candidate's whole job, single run or batch (--timeout): its builds, parity and timing
RUNS_CANDIDATE = ("build", "update", "forward", "time", "escape", "profile")  # commands after which no thread
#                                                                            the candidate started may be working
WARMUP = 3  # untimed calls of each row before timing

# ---------------------------------------------------------------------------------------------------------------
# Worker: holds the judged models; runs in a process of its own for a candidate file, in this process for variants.

def _gpu_memory() -> tuple[int, int] | None:
    import torch
    return torch.cuda.mem_get_info() if torch.cuda.is_available() else None


def raised(stage: str, error: str, gpu_memory=_gpu_memory) -> str:
    """A call that raised. Out of GPU memory, the reason also says what the GPU has free now: on a GPU other
    processes share, their memory counts against the call, and the author should know before changing the kernel."""
    why = f"{stage}: raised {error}"
    if "OutOfMemoryError" in error:
        try:
            mem = gpu_memory()
        except RuntimeError:  # a GPU that cannot answer: the reason as it was
            mem = None
        if mem:
            why += (f" (the GPU has {mem[0] / 2**30:.1f} of {mem[1] / 2**30:.1f} GiB free now; memory that other "
                    f"processes on this GPU hold counts against the call: judge again with the GPU to itself to tell)")
        own = _own_gpu_memory()
        if own:
            why += f" [this process: {own}]"
    return why


def _own_gpu_memory() -> str:
    """This process's share of the GPU as its allocator sees it, for an out-of-memory reason: what it holds, what it
    reserves, and its peak since the command began."""
    import torch
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return ""
    g = 2**30
    return (f"{torch.cuda.memory_allocated() / g:.1f} GiB allocated, {torch.cuda.memory_reserved() / g:.1f} GiB "
            f"reserved, peak {torch.cuda.max_memory_allocated() / g:.1f} GiB")


def nan_fill_cached_free(reserve_bytes: int) -> None:
    """Fill the caching allocator's free blocks (and at least reserve_bytes of them) with 0xFF bytes = NaN, so
    memory a model allocates and never writes reads as NaN instead of stale, plausible values."""
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


def export_output(out, inputs=()):
    """What leaves the worker: plain tensors and Python numbers, element by element for a tuple; anything else
    as its description (the judge rejects it). An output that is, or is a view of, one of the judge's inputs (an
    in-place activation) leaves as a copy: a tensor received from another process cannot be sent back through it."""
    if type(out) is torch.Tensor:
        ptrs = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
        return out.clone() if out.numel() and out.untyped_storage().data_ptr() in ptrs else out
    if isinstance(out, (int, float, bool)):
        return out
    if isinstance(out, (tuple, list)):
        return tuple(export_output(o, inputs) for o in out)
    return describe(out)


def fresh_seed() -> int:
    """A timed call's input seed, drawn from the OS just before the call: nothing in the process knows it earlier."""
    return int.from_bytes(os.urandom(4), "little")


class Worker:
    """Models under judgement ("rows", by label), the eager/torch.compile baselines, and the commands the judge
    sends. `interim` is how a timed call's output reaches the judge for checking (a pipe round trip from a candidate's
    worker, a plain call in-process)."""

    def __init__(self, ref_spec, device: str, precision: str, factories: dict | None = None, conn=None,
                 train: bool = True):
        self.ref = Reference.load(ref_spec)
        self.device, self.precision, self.conn, self.train = device, precision, conn, train
        self.build_failures: list[dict] = []
        self.factories = dict(factories or {})
        self.held_inputs = None
        self.models: dict[str, object] = {}
        self.baselines = {}
        self.fingerprint = None
        self.candidate_dir: str | None = None  # the candidate file's folder, once imported
        self.threads_before: set = set()  # thread idents alive before the candidate's import
        self.objects_before = loaded_objects()
        self.interim = self._interim_pipe

    def loop(self):
        seq = 0
        while True:
            try:
                msg = self.conn.recv()
            except EOFError:
                return
            cmd, args = msg[0], msg[1:]
            seq += 1
            if cmd == "quit":
                self.conn.send({"ok": True})
                return
            try:
                reply = getattr(self, "cmd_" + cmd)(*args)
                reply["ok"] = True
            except Exception as e:  # the candidate's failure is data for the judge, not a crash of the worker
                reply = {"ok": False, "error": f"{type(e).__name__}: {first_line(e)}",
                         "traceback": traceback.format_exc(limit=8)}
            if self.fingerprint is not None:
                reply["patched"] = fingerprint_changes(self.fingerprint)
            if self.candidate_dir and cmd in RUNS_CANDIDATE:
                reply["late_threads"] = late_threads(self.threads_before, self.candidate_dir)
            reply["build_failures"] = self.build_failures
            reply["seq"] = seq  # which command this answers: anything else on the channel is not this loop's
            _settle_before_sending(self.device)
            self.conn.send(reply)
            if not reply["ok"] and self.device == "cuda" and _cuda_broken():
                return  # a sticky CUDA error: this context is gone; the judge sees the pipe close

    def _interim_pipe(self, msg: dict):
        """Hand `msg` to the judge and return its answer."""
        self.conn.send({"interim": True, **msg})
        return self.conn.recv()[1]

    def _with_baselines(self, labels: list[str]) -> dict:
        """The baselines, then the rows of `labels`: what the timer and the profiler run, in the table's order."""
        return {**self.baselines, **{k: self.models[k] for k in labels}}

    # -- setup --------------------------------------------------------------------------------------------------
    def cmd_baselines(self, init, seed, state, compile_baseline: bool, example_seed: int):
        """Eager and torch.compile references for the timing table, built and run once before any judged model
        exists (the fingerprint is taken after their first calls, so their own lazy setup is not a change)."""
        eager = self.ref.model(init, seed, self.device, self.train)
        eager.load_state_dict(state)
        self.baselines = {"eager": eager}
        if compile_baseline:  # shares eager's weights: one copy of them on the device
            self.baselines["torch.compile"] = torch.compile(eager)
        x = self.ref.inputs(example_seed, self.device)
        set_precision(self.precision)
        with torch.no_grad():
            for m in self.baselines.values():
                m(*x)
        torch.cuda.synchronize()
        return {}

    def cmd_load(self, path: str):
        # Everything the judge's own stages import or initialise happens before the snapshot: importing
        # torch._dynamo (the profiler does) rebinds torch.manual_seed, which is torch's doing, not the candidate's.
        import torch._dynamo  # noqa: F401
        from torch.profiler import ProfilerActivity, profile
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # torch wraps SGD.step on first use
        settle_torch()
        record_build_failures(self.build_failures)
        if self.device == "cuda":
            L2Flusher()
            e = torch.cuda.Event(enable_timing=True)
            with profile(activities=[ProfilerActivity.CUDA]):
                e.record()
                torch.cuda._sleep(10)
                torch.cuda.synchronize()
        p = Path(path).resolve()
        watch_thread_starts(str(p.parent))
        self.fingerprint = namespace_fingerprint()
        self.objects_before = loaded_objects()
        self.threads_before = {t.ident for t in threading.enumerate()}
        self.candidate_dir = str(p.parent)
        sys.path.insert(0, str(p.parent))
        spec = importlib.util.spec_from_file_location("kp_candidate", p)
        module = importlib.util.module_from_spec(spec)
        sys.modules["kp_candidate"] = module
        spec.loader.exec_module(module)
        if not isinstance(getattr(module, "ModelNew", None), type):
            return {"has_model_new": False}
        self.factories["candidate"] = module.ModelNew
        return {"has_model_new": True}

    def cmd_build(self, label: str, init, seed: int, source: str | None = None, train: bool | None = None):
        """The model `label` from the factory `source` (default: the same name) after the seed; in eval mode when
        the judge asks for inference semantics. Returns its state_dict keys and the train-sensitive modules
        (BatchNorm, Dropout) it has in eval mode."""
        self.models.pop(label, None)
        torch.manual_seed(seed)
        m = self.factories[source or label](*init)
        is_module = isinstance(m, torch.nn.Module)
        if is_module:
            m = m.to(self.device)
            if not (self.train if train is None else train):
                m.eval()
        self.models[label] = m
        keys = [(k, tuple(v.shape)) for k, v in m.state_dict().items()] if is_module else []
        frozen = train_sensitive(m) if is_module and not all(x.training for x in m.modules()) else []
        return {"keys": keys, "eval_modules": frozen}

    def cmd_update(self, label: str, update: dict):
        apply_update(self.models[label], update)
        return {}

    def cmd_drop(self, label: str):
        self.models.pop(label, None)
        return {}

    # -- parity -------------------------------------------------------------------------------------------------
    def cmd_forward(self, label: str, inputs, reserve_bytes: int):
        # Held until the next call's inputs have arrived: a buffer the judge refills then maps to the same address.
        self.held_inputs = inputs
        if self.device == "cuda":
            torch.cuda.ipc_collect()
            nan_fill_cached_free(reserve_bytes)
        set_precision(self.precision)
        with torch.no_grad():
            out = self.models[label](*inputs)
        if self.device == "cuda":
            torch.cuda.synchronize()  # device-wide: side-stream work finishes before the output leaves
        return {"out": export_output(out, inputs), "type": describe(out),
                "tf32_after": torch.backends.cuda.matmul.allow_tf32}

    def cmd_release_inputs(self):
        self.held_inputs = None
        return {}

    def cmd_buffers(self, label: str):
        m = self.models[label]
        if not isinstance(m, torch.nn.Module):
            return {"buffers": {}}
        return {"buffers": {k: v.detach().clone() for k, v in m.state_dict().items()}}

    # -- timing -------------------------------------------------------------------------------------------------
    def cmd_time(self, labels: list[str], pool_size: int, min_reps: int, max_reps: int, budget_s: float):
        """Baselines and rows interleaved; every call gets inputs drawn just before it from a seed drawn from the
        OS then (a pool slot refilled outside the timed region), so no input can be known before its call. After each
        timed call, outside the timed region and before any other code of the models runs, the judge is told its
        sample (`interim`), and for a judged row its seed, and answers whether it checks that call; only then does the
        output cross, so which calls are checked is decided in the judge's process after the fact. Returns every
        sample too; the judge keeps its own and takes the median itself."""
        dev = self.device
        self.held_inputs = None  # parity's last inputs: the timing pool replaces them
        if dev == "cuda":
            torch.cuda.ipc_collect()
            torch.cuda.reset_peak_memory_stats()
            mem = {"start_allocated": torch.cuda.memory_allocated()}
        fns_models = self._with_baselines(labels)
        pool = [self.ref.inputs(fresh_seed(), dev) for _ in range(pool_size)]
        st = {"n": {k: 0 for k in fns_models}, "slot": 0, "calls": 0, "kept": None, "timed": None}
        rungs = {k: m.rung(*pool[0]) for k, m in fns_models.items() if hasattr(m, "rung")}

        def hand_over():
            """The last timed call, told to the judge before any other code of the models runs: its sample, and for
            a judged row its seed; the output crosses only if the judge asks for it."""
            if st["kept"] is not None:
                label, rep, seed, out, slot, ms = st["kept"]
                st["kept"] = None
                if dev == "cuda":
                    torch.cuda.synchronize()  # device-wide, as for parity: work a row left elsewhere is the
                    #                           escape check's to catch, with its own reason
                if self.interim({"label": label, "rep": rep, "seed": seed, "ms": ms, "ask": label in labels}):
                    self.interim({"label": label, "rep": rep, "seed": seed, "out": export_output(out, pool[slot]),
                                  "type": describe(out), "inputs": pool[slot]})
                    del out
                    if dev == "cuda":  # the judge has let go of the output it checked: its memory comes back now,
                        torch.cuda.ipc_collect()  # not when the allocator next runs short

        def before(name, rep):
            hand_over()
            late = late_threads(self.threads_before, self.candidate_dir) if self.candidate_dir else []
            if late:
                raise RuntimeError(late_message(late))
            slot = st["calls"] % pool_size
            s = fresh_seed()
            fresh = self.ref.inputs(s, dev)
            for dst, src in zip(pool[slot], fresh):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
            del fresh, src  # a draw as large as the inputs: gone before the call, whatever holds this frame
            st["n"][name] += 1
            st["calls"] += 1
            st["slot"] = slot
            st["timed"] = (name, rep, s, slot) if rep >= 0 else None

        def call(name, m):
            def f():
                out = m(*pool[st["slot"]])
                if st["timed"] is not None:  # a baseline's output is not kept: only its sample is told
                    st["kept"] = [*st["timed"][:3], out if name in labels else None, st["timed"][3], None]
                    st["timed"] = None
            return f

        def after(name, rep, ms):
            if st["kept"] is not None and st["kept"][0] == name and st["kept"][1] == rep:
                st["kept"][5] = ms

        fns = {k: call(k, m) for k, m in fns_models.items()}
        set_precision(self.precision)
        with torch.no_grad():
            times = bench_interleaved(fns, min_reps=min_reps, max_reps=max_reps, budget_s=budget_s,
                                      warmup=WARMUP, before=before, clock="cuda" if dev == "cuda" else "host",
                                      after=after)
            hand_over()
        reply = {"timing": {k: dataclasses.asdict(t) for k, t in times.items()}, "calls": dict(st["n"]),
                 "rungs": rungs}
        if dev == "cuda":
            torch.cuda.synchronize()
            reply["memory"] = {**mem, "peak_allocated": torch.cuda.max_memory_allocated()}
        return reply

    # -- escape + own kernel --------------------------------------------------------------------------------------
    def cmd_escape(self, label: str, seed: int):
        from torch.profiler import ProfilerActivity, profile
        x = self.ref.inputs(seed, self.device)
        model = self.models[label]
        f = lambda: model(*x)
        flush = L2Flusher()
        set_precision(self.precision)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples, control = [], []
        nothing = lambda: None
        with torch.no_grad():
            f()
            torch.cuda.synchronize()
            for _ in range(5):
                for g, out in ((nothing, control), (f, samples)):  # the control: the same steps around no call,
                    flush()  #                                        so a loaded host or a shared GPU shows there too
                    torch.cuda.synchronize()
                    h0 = time.perf_counter()
                    start.record()
                    e0 = time.perf_counter()
                    g()
                    e1 = time.perf_counter()
                    stop.record()
                    torch.cuda.synchronize()
                    h1 = time.perf_counter()
                    out.append(((h1 - h0) * 1e3, start.elapsed_time(stop), (e1 - e0) * 1e3))
            marker = None  # the marker kernel's name, from a profile of the marker alone
            with profile(activities=[ProfilerActivity.CUDA]) as p0:
                torch.cuda._sleep(1000)
                torch.cuda.synchronize()
            evs = gpu_events(p0)
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
        events = gpu_events(prof)
        caches = tuple(str(c) for c in (cache_root(), shared_cache()) if c)
        libs = sorted(p for p in loaded_objects()
                      if p.startswith(caches) or (p not in self.objects_before
                                                 and not any(p.startswith(pre) for pre in system_prefixes())))
        own, blobs = {}, {}
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
        return {"samples": samples, "control": control, "events": events, "marker": marker, "own": own}

    def cmd_profile(self, labels: list[str], seed: int):
        """One call of each baseline and row under PyTorch's profiler, after a warm call (and on the GPU an L2
        flush): its kernels (on the CPU: operators) grouped by name."""
        from torch.profiler import ProfilerActivity, profile
        x = self.ref.inputs(seed, self.device)
        gpu = self.device == "cuda"
        flush = L2Flusher() if gpu else None
        set_precision(self.precision)
        out = {}
        with torch.no_grad():
            for label, model in self._with_baselines(labels).items():
                model(*x)
                if gpu:
                    flush()
                    torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
                    model(*x)
                    if gpu:
                        torch.cuda.synchronize()
                out[label] = summarize(gpu_events(prof) if gpu else cpu_ops(prof))
        return {"profile": out}

    def cmd_memory(self):
        return {"peak": torch.cuda.max_memory_reserved() if torch.cuda.is_available() else 0}


def _settle_before_sending(device: str) -> None:
    """Finish this process's GPU work before a message with GPU tensors leaves it. A storage the receiver already
    maps (the judge refills one input buffer per layout, so the worker keeps mapping the same one) is taken from
    torch's IPC cache without waiting on the sender's event: unsynchronised, the receiver can read a buffer that is
    still being written (seen as a correct kernel reading the previous call's inputs while other jobs kept the GPU
    busy)."""
    if device == "cuda" and torch.cuda.is_initialized():
        try:
            torch.cuda.synchronize()
        except Exception:
            pass  # a broken context: the reply says what failed


def _cuda_broken() -> bool:
    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True


def worker_main(conn, ref_spec, device: str, precision: str, root: str, env: dict, cwd: str, train: bool = True,
                stderr_path: str | None = None):
    import warnings
    if stderr_path:  # the judge reads its last lines when this process dies
        fd = os.open(stderr_path, os.O_WRONLY | os.O_APPEND)
        os.dup2(fd, 2)
        os.close(fd)
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    # A forkserver child has the environment and directory of the server's start; the judge's are the ones that
    # count (CUDA_VISIBLE_DEVICES, KP_CAPABILITY, the candidate's relative paths). CUDA reads them at its first
    # use, which happens here, after the fork.
    os.environ.clear()
    os.environ.update(env)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    os.chdir(cwd)
    sys.path.insert(0, root)
    Worker(ref_spec, device, precision, conn=conn, train=train).loop()


def _context():
    """forkserver where the platform has it (Linux, macOS): each candidate gets a fresh process, forked from a
    server that has imported torch and the judge but has run no candidate and initialised no GPU; else spawn."""
    import multiprocessing as mp
    import torch.multiprocessing as tmp
    if "forkserver" in mp.get_all_start_methods():
        ctx = tmp.get_context("forkserver")
        ctx.set_forkserver_preload(WORKER_PRELOAD)
        return ctx
    return tmp.get_context("spawn")


# ---------------------------------------------------------------------------------------------------------------
# Runners: the same commands, in a process of their own or in this one.

def start_without_main(proc) -> None:
    """Start a multiprocessing Process whose target needs nothing from __main__: multiprocessing would otherwise
    re-run the caller's script in the child (a script without a __main__ guard would judge again) or fail where
    there is none (a script read from stdin)."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        proc.start()
    finally:
        sys.modules["__main__"] = main


def exit_status(exitcode: int | None) -> str:
    """'signal 11, SIGSEGV' for a process a signal killed, else 'exit code N'."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"signal {-exitcode}, {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


FOREIGN = ("an answer that is not the worker's reply to this command came back: something in the candidate's "
           "process wrote to the judge's channel (a forged reply)")


class Reply(dict):
    """A worker's answer to the command of `stage`: a key the judge needs that it lacks is a rejection (a reply
    forged or cut short in the candidate's process), not an error of the judge."""

    def __init__(self, stage: str, reply: dict):
        super().__init__(reply)
        self.stage = stage

    def __missing__(self, key):
        raise Rejected(f"{self.stage}: {FOREIGN}: its reply has no {key!r}")


class ProcessRunner:
    """A worker in a fresh process and the request/reply protocol; a dead worker or a timeout becomes a rejection.
    The worker runs in a scratch working directory of its own (fresh, writable, removed with it) and its stderr is
    kept in a file, whose last lines a verdict on its death carries (and which is echoed to this process's stderr
    when the worker closes)."""
    isolated = True

    def __init__(self, ref_spec, device: str, precision: str, on_interim, sandbox: bool = False,
                 read_only: list[str] = (), train: bool = True, deadline: float | None = None,
                 limit_s: float | None = None, build_dir: str | None = None):
        """sandbox: run the worker in a box (kp.sandbox) that can read read_only and the judge's own files.
        deadline: time.monotonic() by which the whole job must be done (limit_s: its length, for the message).
        build_dir: the candidate's own extension folder (kp.boxstart.candidate_build_dir), writable in the box."""
        import tempfile
        self.on_interim, self.sandboxed, self.device = on_interim, sandbox, device
        self.deadline, self.limit_s = deadline, limit_s
        self.passed: dict = {}  # the judged row's passed checks (what a timeout's verdict lists)
        self.seq = 0  # commands sent: each answer must carry its command's number
        self.build_failures: list[dict] = []
        if sandbox:
            self.scratch = None  # the box's private /tmp holds its working directory
            box = _start_boxed(ref_spec, device, precision, list(read_only), train, build_dir)
            self.conn, self.proc, self.stderr = box.conn, box.proc, box.stderr
            return
        self.stderr = tempfile.NamedTemporaryFile(prefix="kp-worker-", suffix=".stderr", delete=False)
        self.scratch = tempfile.mkdtemp(prefix="kp-cwd-")
        ctx = _context()
        self.conn, child = ctx.Pipe()
        env = {**os.environ, **({"TORCH_EXTENSIONS_DIR": build_dir} if build_dir else {})}
        self.proc = ctx.Process(target=worker_main, args=(child, ref_spec, device, precision, str(ROOT),
                                                          env, self.scratch, train, self.stderr.name),
                                daemon=True)
        start_without_main(self.proc)
        child.close()

    def _died(self, stage: str) -> Rejected:
        self.proc.join(5)
        tail = stderr_tail(self.stderr.name)
        return Rejected(f"{stage}: the candidate's process died ({exit_status(self.proc.exitcode)})"
                        + (f"; its stderr ended: {tail}" if tail else ""))

    def _timed_out(self, stage: str) -> Rejected:
        self.proc.kill()
        passed = ", ".join(self.passed) or "nothing yet"
        return Rejected(f"{stage}: timeout after {self.limit_s:.0f} s, in this stage (passed before it: {passed})")

    def call(self, stage: str, *msg, timeout: float = REPLY_TIMEOUT_S) -> dict:
        limit = time.monotonic() + timeout
        if self.deadline is not None and self.deadline < limit:
            limit = self.deadline
        _settle_before_sending(self.device)
        self.seq += 1
        try:
            self.conn.send(msg)
            while True:
                while not self.conn.poll(1.0):
                    if not self.proc.is_alive():
                        raise self._died(stage)
                    if time.monotonic() > limit:
                        if self.deadline is not None and limit == self.deadline:
                            raise self._timed_out(stage)
                        raise Rejected(f"{stage}: no answer within {timeout:.0f} s")
                reply = self.conn.recv()
                if not isinstance(reply, dict):
                    raise Rejected(f"{stage}: {FOREIGN} (a {type(reply).__name__})")
                if not reply.get("interim"):
                    break
                self.conn.send(("ack", self.on_interim(reply)))
        except (EOFError, BrokenPipeError, ConnectionResetError):
            raise self._died(stage) from None
        if reply.get("seq") != self.seq:
            raise Rejected(f"{stage}: {FOREIGN} (numbered {reply.get('seq')!r}, the command was {self.seq})")
        reply = Reply(stage, reply)
        self.build_failures = reply.get("build_failures") or self.build_failures
        if reply.get("patched"):
            raise Rejected(f"{stage}: the candidate replaced {', '.join(reply['patched'][:4])} in its process "
                           f"(judge, timer and baselines depend on them)")
        if reply.get("late_threads"):
            raise Rejected(f"{stage}: {late_message(reply['late_threads'])}")
        if not reply.get("ok"):
            raise Rejected(raised(stage, str(reply.get("error"))))
        return reply

    def close(self):
        """Quit the worker: once it has answered (nothing of the job is left in it), its process is killed rather
        than waited for while its interpreter and torch tear down (seconds per job)."""
        try:
            if self.proc.is_alive():
                self.conn.send(("quit",))
                if self.conn.poll(10):
                    self.conn.recv()
        except (OSError, EOFError, BrokenPipeError):
            pass
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        getattr(self.proc, "cleanup", lambda: None)()
        self.stderr.close()
        try:
            text = Path(self.stderr.name).read_text(errors="replace")
            if text:
                sys.stderr.write(text)
            os.unlink(self.stderr.name)
        except OSError:
            pass
        if self.scratch:
            import shutil
            shutil.rmtree(self.scratch, ignore_errors=True)


def stderr_tail(path: str, lines: int = 3, chars: int = 400) -> str:
    """The last non-empty lines of a worker's stderr, joined with ' | ' (what a verdict on its death quotes)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    tail = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
    return " | ".join(tail)[-chars:]


def _start_boxed(ref_spec, device: str, precision: str, read_only: list[str], train: bool,
                 build_dir: str | None = None):
    """The candidate's box (the one the command line started early, if it matches) given its job."""
    from kp import boxstart
    box = boxstart.take(ref_spec, read_only, build_dir)
    box.conn.send((ref_spec, device, precision, str(ROOT), box.env, boxstart.BOX_CWD, train))
    return box


class LocalRunner:
    """The Worker in this process: for the playground's own variants (trusted code, same stages)."""
    isolated = False

    def __init__(self, ref_spec, device: str, precision: str, on_interim, factories: dict, train: bool = True):
        self.worker = Worker(ref_spec, device, precision, factories=factories, train=train)
        self.worker.interim = on_interim

    def call(self, stage: str, cmd: str, *args, **_) -> dict:
        try:
            return getattr(self.worker, "cmd_" + cmd)(*args)
        except Rejected:
            raise
        except Exception as e:
            raise Rejected(raised(stage, f"{type(e).__name__}: {first_line(e)}")) from None

    def close(self):
        self.worker.models.clear()
        self.worker.baselines.clear()


