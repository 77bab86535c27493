"""The worker: holds the judged models and runs the judge's commands on them, in a process of its own for a candidate
file or in the judge's own process for the playground's variants."""
from __future__ import annotations

import importlib
import os
import sys
import threading
import time
import traceback
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import torch

from kp.box.builds import alive
from kp.box.start import needs_dynamo
from kp.errors import oom_request_bytes
from kp.worker.guards import (fingerprint_changes, late_threads, loaded_objects, namespace_fingerprint,
                             record_build_failures, settle_torch, train_sensitive, watch_thread_starts)
from kp.judge.family import same_value
from kp.judge.float64 import _convert, hold_on
from kp.worker.parity_calls import CallCommands
from kp.worker.languages import watch_jit_builds
from kp.worker.measuring import MeasureCommands
from kp.worker.replies import (ENDED_AFTER_FAULT, _settle_before_sending, asks_for_cuda, error_kind, error_text,
                               fault_text, gpu_fault, raised_kind, send, without_tensors)
from kp.judge.reference import Reference, apply_update
from kp.lib.layers import set_precision
from kp.lib.numerics import cpu_kernels
from kp.lib.timing import L2Flusher
from kp.observe.profile import profiler

REPLY_TIMEOUT_S = 900  # one worker step (a cold kernel build plus a torch.compile fit well inside)
# a build ahead of judging yields the cores to the judges beside it (their host clocks, their timed calls): it is
# throughput, they are latency; it still gets every core they leave idle
BUILD_AHEAD_NICE = 10
# commands after which no thread the candidate started may be working
RUNS_CANDIDATE = ("build", "update", "forward", "time", "escape", "profile")

# ---------------------------------------------------------------------------------------------------------------
# Worker: holds the judged models; runs in a process of its own for a candidate file, in this process for variants.

_WARM: set[str] = set()
COMPILED_SHAPES = 64  # shapes the torch.compile baseline compiles for, each statically (the benchmark's, the family's)
def warm_up(device: str, dynamo: bool = True) -> None:
    """Everything the judge's own stages import or initialise, done before the candidate's file is imported (and
    before the snapshot its changes are found against): on the GPU, CUDA's context, the L2 flush's buffer and the
    profiler's first use; torch._dynamo and torch.compile's first-use patches only where the candidate may compile
    (`dynamo`, kp.box.start.needs_dynamo). Once per process: a box started ahead of its job does it while it waits."""
    if dynamo and "dynamo" not in _WARM:
        # torch wraps SGD.step on first use (and its __init__ imports torch._dynamo)
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        importlib.import_module("torch._dynamo")
        _WARM.add("dynamo")
    if device == "cuda" and device not in _WARM:
        torch.zeros(1, device="cuda")
        L2Flusher()
        e = torch.cuda.Event(enable_timing=True)
        with profiler():
            e.record()
            torch.cuda._sleep(10)
            torch.cuda.synchronize()
        _WARM.add(device)


class Worker(MeasureCommands, CallCommands):
    """Models under judgement ("rows", by label), the eager/torch.compile baselines, and the commands the judge
    sends. `interim` is how a timed call's output reaches the judge for checking (a pipe round trip from a candidate's
    worker, a plain call in-process)."""

    def __init__(self, ref_spec, device: str, precision: str, factories: dict | None = None, conn=None,
                 train: bool = True):
        self.ref = Reference.load(ref_spec).use_precision(precision)
        self.device, self.precision, self.conn, self.train = device, precision, conn, train
        self.build_failures: list[dict] = []
        self.build_seconds = [0.0]  # in the candidate's load/load_inline calls (guards.record_build_failures)
        self.factories = dict(factories or {})
        self.held_inputs = None
        self.models: dict[str, object] = {}
        self.baselines = {}
        self.prime_built = None  # cmd_prime_build's model and inputs, until cmd_prime
        self.fingerprint = None
        self.candidate_dir: str | None = None  # the candidate file's folder, once imported
        self.threads_before: set = set()  # thread idents alive before the candidate's import
        self.objects_before = loaded_objects()
        self.interim = self._interim_pipe

    def loop(self):
        seq = 0
        while True:
            fault = None
            try:
                raw = self.conn.recv_bytes()
            except EOFError:  # said, so that an end with exit code 0 is never a silent one
                print("kp worker: the judge's channel closed; this process ends", file=sys.stderr, flush=True)
                return
            t_recv = time.perf_counter()
            msg = ForkingPickler.loads(raw)  # a GPU tensor's handle is opened here (IPC)
            del raw
            t_recv = time.perf_counter() - t_recv
            cmd, args = msg[0], msg[1:]
            seq += 1
            if cmd == "quit":
                self.conn.send({"ok": True})
                return
            try:
                reply = getattr(self, "cmd_" + cmd)(*args)
                reply["ok"] = True
            # the candidate's failure is data for the judge, not a crash of the worker: sys.exit() inside a forward too,
            # which would end this process with exit code 0 and nothing said
            except BaseException as e:
                fault = gpu_fault(self.device)
                reply = {"ok": False, "error": fault_text(fault, error_text(e)) if fault else error_text(e),
                         "error_kind": raised_kind(cmd, error_kind(e, fault)), "asks_for_cuda": asks_for_cuda(e),
                         "traceback": traceback.format_exc(limit=-40)}  # the innermost frames: the raise
                if isinstance(e, torch.OutOfMemoryError) and torch.cuda.is_initialized():
                    reply["gpu_held"] = torch.cuda.memory_reserved()  # what this process held: see OutOfMemory
                    reply["gpu_asked"] = oom_request_bytes(str(e))
            t_after = time.perf_counter()
            if self.fingerprint is not None:
                reply["patched"] = fingerprint_changes(self.fingerprint)
            if self.candidate_dir and cmd in RUNS_CANDIDATE:
                reply["late_threads"] = late_threads(self.threads_before, self.candidate_dir)
                if reply["late_threads"]:
                    reply = without_tensors(reply)
            if isinstance(reply.get("seconds"), dict):  # where a command's time went, for the record's stage detail
                reply["seconds"].update({"the command received": t_recv,
                                         "its checks after the call": time.perf_counter() - t_after})
            reply["build_failures"] = self.build_failures
            reply["build_s"] = self.build_seconds[0]
            reply["seq"] = seq  # which command this answers: anything else on the channel is not this loop's
            _settle_before_sending(self.device)
            send(self.conn, reply)
            if not reply["ok"] and fault:
                print(f"{ENDED_AFTER_FAULT} after {cmd!r} ({fault}); this process ends here",
                      file=sys.stderr, flush=True)
                return  # a sticky CUDA error: this context is gone; the judge has the reply that says so

    def _interim_pipe(self, msg: dict):
        """Hand `msg` to the judge and return its answer."""
        send(self.conn, {"interim": True, **msg})
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
        # shares eager's weights: one copy of them on the device. Static at every shape it is timed at (--shapes times
        # several), as a user compiling for that shape gets it; by default dynamo would go dynamic at the second shape
        # and, past its recompile limit, fall back to eager without a word
        if compile_baseline:
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, COMPILED_SHAPES)
            self.baselines["torch.compile"] = torch.compile(eager, dynamic=False)
        x = self.ref.inputs(example_seed, self.device)
        set_precision(self.precision)
        with torch.no_grad():
            for m in self.baselines.values():
                m(*x)
        torch.cuda.synchronize()
        return {}

    def cmd_ready(self):
        """Nothing: its answer says the worker is up and serving (a slot's run of the reference ahead of the job,
        kp.batch.prime, waits for it before it takes the GPU's gate)."""
        return {}

    def cmd_prime_build(self, init, seed: int, example_seed: int):
        """cmd_prime's model and inputs made on the host and kept: a run ahead of the job (kp.batch.prime) does the
        host's part before it takes the GPU's gate, and holds the gate only while they are moved and called."""
        self.prime_built = None
        try:
            self.prime_built = (self.ref.model(init, seed, "cpu", self.train), self.ref.inputs(example_seed, "cpu"))
            return {"built": True}
        except Exception as e:  # cmd_prime makes them on the device instead
            return {"built": False, "why": error_text(e)}

    def cmd_prime(self, init, seed: int, example_seed: int, built: bool = False):
        """The reference's Model built and called once on benchmark inputs, then dropped, before the candidate's file
        is imported: the process is then in the state a user's is in when it calls a candidate after its reference
        (cuBLAS's and cuDNN's handles and workspaces made, the kernels' modules loaded), which a candidate that
        captures a CUDA graph at its first call relies on (a library's first use inside a capture fails). Only the
        reference's code runs. The timing stage's baselines (cmd_baselines) do the same and stay. built: the model
        and inputs cmd_prime_build made are moved to the device (else made there). Returns whether it ran, and why
        not where it did not."""
        ahead, self.prime_built = self.prime_built, None
        try:
            if built and ahead is not None:
                m, x = hold_on(ahead[0], self.device, self.ref.dtype), _convert(ahead[1], self.device, None)
            else:
                with torch.device(self.device):  # the values do not matter: made where they run, not copied there
                    m = self.ref.model(init, seed, self.device, self.train)
                    x = self.ref.inputs(example_seed, self.device)
            ahead = None
            set_precision(self.precision)
            with torch.no_grad():
                m(*x)
            if self.device == "cuda":
                torch.cuda.synchronize()
            return {"primed": True}
        except Exception as e:  # the judge's own run of the reference reports a broken reference; here: said
            return {"primed": False, "why": error_text(e)}
        finally:
            m = x = None
            if self.device == "cuda":
                torch.cuda.empty_cache()

    def cmd_load(self, path: str):
        dynamo = needs_dynamo(path)
        warm_up(self.device, dynamo)
        if dynamo:
            settle_torch()
        record_build_failures(self.build_failures, self.build_seconds)
        watch_jit_builds(path, self.build_seconds)  # Triton's compile and autotuning: build time, not the call's
        cpu = cpu_kernels()  # before the candidate's code runs: what torch here picked, for the judge to compare
        p = Path(path).resolve()
        watch_thread_starts(str(p.parent))
        self.fingerprint = namespace_fingerprint()
        self.objects_before = loaded_objects()
        self.threads_before = {t.ident for t in threading.enumerate()}
        self.candidate_dir = str(p.parent)
        return {"has_model_new": self._import(p), "cpu": cpu}

    def _import(self, p: Path) -> bool:
        """The candidate's file imported as `kp_candidate`; whether it has a ModelNew class (the factory then)."""
        sys.path.insert(0, str(p.parent))
        spec = importlib.util.spec_from_file_location("kp_candidate", p)
        module = importlib.util.module_from_spec(spec)
        sys.modules["kp_candidate"] = module
        spec.loader.exec_module(module)
        if not isinstance(getattr(module, "ModelNew", None), type):
            return False
        self.factories["candidate"] = module.ModelNew
        return True

    def cmd_prebuild(self, path: str):
        """Ahead of judging (kp.batch.ahead): the candidate's file imported, then, for an extension built later
        than its import (in __init__ or at the first call), ModelNew built and called on the meta device, where
        nothing is allocated or computed and a call that needs real data fails at once, after the build it starts.
        Whatever the candidate's code raises here is ignored: its judging runs it again and says. Returns the
        seconds spent in its load/load_inline calls."""
        try:  # this worker's compilers inherit it (the worker runs nothing else: it ends after this command)
            os.nice(BUILD_AHEAD_NICE)
        except OSError:
            pass
        record_build_failures(self.build_failures, self.build_seconds)
        if self._import(Path(path).resolve()):
            steps = (lambda: self.factories["candidate"](*self.ref.init()),
                     lambda: self.models["ahead"](*self.ref.module.get_inputs()))
            for step in steps:
                try:
                    with torch.device("meta"), torch.no_grad():
                        self.models["ahead"] = step()
                except BaseException:  # noqa: B036 - sys.exit() in a candidate's call ends nothing here
                    break
            self.models.pop("ahead", None)
        return {"build_s": self.build_seconds[0]}

    def cmd_build(self, label: str, init, seed: int, source: str | None = None, train: bool | None = None):
        """The model `label` from the factory `source` (default: the same name) after the seed; in eval mode when
        the judge asks for inference semantics. Returns its state_dict keys and the train-sensitive modules
        (BatchNorm, Dropout) it has in eval mode."""
        self.models.pop(label, None)
        torch.manual_seed(seed)
        m = self.factories[source or label](*init)
        is_module = isinstance(m, torch.nn.Module)
        if is_module:  # in fp16 and bf16 cast as the reference is (Reference.model), plain tensor attributes too
            m = m.to(self.device) if self.ref.dtype is None else hold_on(m, self.device, self.ref.dtype)
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

    def cmd_scale(self, sizes: dict):
        """The judge checks another shape of the reference's family (the CPU's room, --shapes): the same module-level
        sizes of the candidate's file, where it has them with the benchmark's values, take the new ones too, so a
        ModelNew written against the file's own sizes meets the shapes it is given; this process's reference, which
        draws the timing's inputs, takes them all."""
        module = sys.modules.get("kp_candidate")
        changed = []
        for name, (old, new) in sizes.items():  # a size, or a global the file computes from sizes (a tuple)
            if module is not None and same_value(getattr(module, name, None), old):
                setattr(module, name, new)
                changed.append(name)
            ref = vars(self.ref.module)  # this process's reference draws the timing's inputs: at the same sizes
            if same_value(ref.get(name), old):  # (a module shared with the judge: set already)
                ref[name] = new
        return {"changed": changed}


OUTPUT_HEAD, OUTPUT_TAIL = 256 << 10, 64 << 10  # bytes of a candidate's output kept: its start and its end
OUTPUT_CHECK_S = 0.05  # how often the worker's output file is brought back to its start and its end


def cut_line(n: int) -> bytes:
    """What stands where output was cut ('at least': a write that lands while the worker cuts is not counted)."""
    return f"\n[... at least {n:,} bytes of the candidate's output cut ...]\n".encode()


def cut_middle(data: bytes, head: int = OUTPUT_HEAD, tail: int = OUTPUT_TAIL) -> bytes:
    """`data` as shown: about its first `head` and last `tail` bytes, cut at line ends (a line longer than either is
    cut where it must be), the cut said between them (the judge's side of cap_output: what it shows of a worker's
    output, whatever the worker's own cap left in the file)."""
    if len(data) <= head + 2 * tail + len(cut_line(len(data))):  # what the worker's own cap leaves, whole
        return data
    end = data.rfind(b"\n", 0, head) + 1 or head  # after the last whole line of the head
    start = data.find(b"\n", len(data) - tail) + 1 or len(data) - tail  # at the first whole line of the tail
    return data[:end] + cut_line(start - end).lstrip(b"\n") + data[start:]


def cap_output(head: int = OUTPUT_HEAD, tail: int = OUTPUT_TAIL, every_s: float = OUTPUT_CHECK_S):
    """The worker's stdout and stderr (the candidate's prints, its libraries' warnings) into the file its stderr is
    (the judge reads it, and shows it when the worker ends), kept to `head` bytes of the start and `tail` of the
    end with a line saying how much was cut between them: a candidate that prints megabytes a call fills neither the
    terminal nor a batch's slot log nor the disk. Every write goes straight into the file (appended): a candidate's
    last words before os._exit or a crash are there, and so is faulthandler's report; a thread checks the file's
    size every `every_s` and replaces its middle, through a descriptor of its own, once it outgrows head + 2 x
    tail (a write that lands while it does so may be cut with the middle). Returns the file, for faulthandler."""
    import fcntl
    fcntl.fcntl(2, fcntl.F_SETFL, fcntl.fcntl(2, fcntl.F_GETFL) | os.O_APPEND)
    os.dup2(2, 1)
    try:
        own = os.open("/proc/self/fd/2", os.O_RDWR)  # not appending: its writes go where it says
    except OSError:  # no /proc here: the judge's own cap (cut_middle) still bounds what it shows
        return os.fdopen(os.dup(2), "w")
    start = os.fstat(own).st_size
    state = {"cut": 0, "mark": 0}

    def watch():
        while True:
            time.sleep(every_s)
            try:
                size = os.fstat(own).st_size
                if size - start <= head + 2 * tail + state["mark"]:
                    continue
                keep = os.pread(own, tail, size - tail)
                state["cut"] += size - tail - (start + head + state["mark"])
                body = cut_line(state["cut"]) + keep
                os.pwrite(own, body, start + head)
                os.ftruncate(own, start + head + len(body))
                state["mark"] = len(body) - len(keep)
            except OSError:
                return
    threading.Thread(target=watch, name="kp-output-cap", daemon=True).start()
    return os.fdopen(os.dup(2), "w")


def end_with_judge(pid: int, every_s: float = 1.0) -> None:
    """An unboxed worker ends when its judge does (a boxed one by bwrap's --die-with-parent): one forked by
    multiprocessing's forkserver is not the judge's child, and a daemon child is not ended when its judge is killed
    (SIGTERM, a time limit), so a hanging candidate would otherwise hold its cores, its GPU memory and the judge's
    terminal for good. A thread of the judge's, started before the candidate's file is imported (not one of its
    threads)."""
    def watch():
        while alive(pid):
            time.sleep(every_s)
        os._exit(1)
    threading.Thread(target=watch, name="kp-end-with-judge", daemon=True).start()


def worker_main(conn, ref_spec, device: str, precision: str, root: str, env: dict, cwd: str, train: bool = True,
                stderr_path: str | None = None, judge_pid: int | None = None):
    import warnings
    if stderr_path:  # the judge reads its last lines when this process dies
        fd = os.open(stderr_path, os.O_WRONLY)
        os.dup2(fd, 2)
        os.close(fd)
    import faulthandler
    # a crash in native code (a signal) leaves its Python stack in the file, for the verdict
    faulthandler.enable(cap_output())
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    # A forkserver child has the environment and directory of the server's start; the judge's are the ones that
    # count (CUDA_VISIBLE_DEVICES, KP_CAPABILITY, the candidate's relative paths). CUDA reads them at its first
    # use, which happens here, after the fork.
    os.environ.clear()
    os.environ.update(env)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    os.chdir(cwd)
    sys.path.insert(0, root)
    if judge_pid:  # unboxed (a box's pids are its own; bwrap ends it with its judge)
        end_with_judge(judge_pid)
    if device == "cuda":  # the CUDA context now (a second or two), while the judge measures the footprint and plans,
        try:              # not on its first command; a failure here is left for that command to report
            torch.zeros(1, device="cuda")
        except Exception:
            pass
    Worker(ref_spec, device, precision, conn=conn, train=train).loop()
