"""The worker: holds the judged models and runs the judge's commands on them, in a process of its own for a candidate
file or in the judge's own process for the playground's variants."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from multiprocessing.reduction import ForkingPickler

import torch

from kp.box.builds import alive
from kp.errors import oom_request_bytes
from kp.judge.reference import Reference
from kp.worker.guards import fingerprint_changes, late_threads
from kp.worker.measuring import TimingCommands
from kp.worker.parity_calls import CallCommands
from kp.worker.profiling import ProfileCommands
from kp.worker.replies import (
    ENDED_AFTER_FAULT,
    _settle_before_sending,
    asks_for_cuda,
    error_kind,
    error_text,
    fault_text,
    gpu_fault,
    raised_kind,
    send,
    without_tensors,
)
from kp.worker.sanitized import SanitizeCommands
from kp.worker.setup import SetupCommands
from kp.worker.state import WorkerState

REPLY_TIMEOUT_S = 900  # one worker step (a cold kernel build plus a torch.compile fit well inside)
# commands after which no thread the candidate started may be working
RUNS_CANDIDATE = ("build", "update", "load_weights", "forward", "time", "escape", "profile", "sanitized_call")


class Worker:
    """A worker: its one state (kp.worker.state.WorkerState) and the commands the judge sends, each served by the
    part that owns it (setup, the parity calls, timing, profiling, the call under compute-sanitizer); `run` serves
    one, `loop` serves a judge's channel until it says quit."""

    def __init__(
        self,
        ref_spec,
        device: str,
        precision: str,
        factories: dict | None = None,
        conn=None,
        train: bool = True,
        interim=None,
    ):
        ref = Reference.load(ref_spec).use_precision(precision)
        self.state = WorkerState(ref, device, precision, factories, conn, train, interim)
        self.commands: dict = {}
        parts = (SetupCommands, CallCommands, TimingCommands, ProfileCommands, SanitizeCommands)
        for part in (make(self.state) for make in parts):
            for name in (n for n in dir(part) if n.startswith("cmd_")):
                assert name[len("cmd_") :] not in self.commands, f"two parts serve {name}"
                self.commands[name[len("cmd_") :]] = getattr(part, name)

    def run(self, cmd: str, *args) -> dict:
        """The command `cmd` on its arguments; its reply."""
        return self.commands[cmd](*args)

    def loop(self):
        st = self.state
        seq = 0
        while True:
            fault = None
            try:
                raw = st.conn.recv_bytes()
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
                st.conn.send({"ok": True})
                return
            try:
                reply = self.run(cmd, *args)
                reply["ok"] = True
            # the candidate's failure is data for the judge, not a crash of the worker: sys.exit() inside a forward too,
            # which would end this process with exit code 0 and nothing said
            except BaseException as e:
                fault = gpu_fault(st.device)
                reply = {
                    "ok": False,
                    "error": fault_text(fault, error_text(e)) if fault else error_text(e),
                    "error_kind": raised_kind(cmd, error_kind(e, fault)),
                    "asks_for_cuda": asks_for_cuda(e),
                    "traceback": traceback.format_exc(limit=-40),
                }  # the innermost frames: the raise
                if isinstance(e, torch.OutOfMemoryError) and torch.cuda.is_initialized():
                    reply["gpu_held"] = torch.cuda.memory_reserved()  # what this process held: see OutOfMemory
                    reply["gpu_asked"] = oom_request_bytes(str(e))
            t_after = time.perf_counter()
            if st.fingerprint is not None:
                reply["patched"] = fingerprint_changes(st.fingerprint)
            if st.candidate_dir and cmd in RUNS_CANDIDATE:
                reply["late_threads"] = late_threads(st.threads_before, st.candidate_dir)
                if reply["late_threads"]:
                    reply = without_tensors(reply)
            if isinstance(reply.get("seconds"), dict):  # where a command's time went, for the record's stage detail
                reply["seconds"].update(
                    {"the command received": t_recv, "its checks after the call": time.perf_counter() - t_after}
                )
            reply["build_failures"] = st.build_failures
            reply["build_s"] = st.build_seconds[0]
            reply["seq"] = seq  # which command this answers: anything else on the channel is not this loop's
            _settle_before_sending(st.device)
            send(st.conn, reply)
            if not reply["ok"] and fault:
                print(
                    f"{ENDED_AFTER_FAULT} after {cmd!r} ({fault}); this process ends here", file=sys.stderr, flush=True
                )
                return  # a sticky CUDA error: this context is gone; the judge has the reply that says so


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


def worker_main(
    conn,
    ref_spec,
    device: str,
    precision: str,
    root: str,
    env: dict,
    cwd: str,
    train: bool = True,
    stderr_path: str | None = None,
    judge_pid: int | None = None,
):
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
        try:  # not on its first command; a failure here is left for that command to report
            torch.zeros(1, device="cuda")
        except Exception:
            pass
    Worker(ref_spec, device, precision, conn=conn, train=train).loop()
