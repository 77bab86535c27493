"""Judges that share a GPU (batch slots, two users on one host): their checks run side by side, and a judge that
times has the GPU to itself, for as short as its timing lasts and never behind another judge's long stage.

Two lock files per GPU (its UUID names them), held with flock (released by the kernel when a process dies):
- the turn: taken exclusively by a judge that is about to time (gpu_to_itself); a judge entering a shared stretch
  takes it shared only for the moment it takes to enter the gate, so once a judge asks to time, no new shared stretch
  starts before it;
- the gate: held shared by every judge in a shared stretch (GpuShare), exclusively by the judge that times.
A shared stretch is not a whole stage: a judge in one calls pulse() before each command it sends its workers (a
checked call, a construct, a weight change) and, if a judge is waiting to time, finishes its GPU work, lets go and
queues behind that judge. A judge waiting to time therefore waits for at most one call of each other judge on its GPU.

What needs the GPU to itself is what reads a clock that another process's kernels lengthen: the timing stage (its
samples, the copy bandwidth and GEMM rates it is set against, the profiled busy time a median must not undercut)
and the host clock of the escape check. The escape check's other evidence (the profiler's kernels, which it sees
for its own process only) does not; without timing the escape check runs shared and asks for the GPU alone only for
a try whose host clock objects (kp.judge.escape).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
import time

# Told the seconds each wait for the GPU took: a judge moves its job's deadline by them, and a batch slot tells its
# parent, which moves the limit it kills the job at, so waiting for other judges costs no job its time.
GPU_WAITS: list = []
_HELD = threading.local()  # a thread's shared stretches now held (pulse() serves them); whether it has the GPU alone


def _shared() -> list["GpuShare"]:
    if not hasattr(_HELD, "shares"):
        _HELD.shares = []
    return _HELD.shares


def gpu_lock_path() -> str:
    import torch

    try:
        uid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    except Exception:  # no such property on this build: the index, which slots pin to a physical GPU
        uid = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] + f"-{torch.cuda.current_device()}"
    return os.path.join(tempfile.gettempdir(), f"kp-gpu-{uid}.lock")


def _flock(fd: int, mode: int, log, why: str) -> float:
    """Take the lock, saying so when it must wait; returns the seconds waited."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return 0.0
    except BlockingIOError:
        pass
    if log:
        log(f"waiting for the GPU: {why}")
    t0 = time.perf_counter()
    fcntl.flock(fd, mode)
    waited = time.perf_counter() - t0
    if log:
        log(f"GPU free after {waited:.1f} s")
    return waited


def _open(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)


def _waited(seconds: float) -> None:
    if seconds > 0:
        for told in list(GPU_WAITS):
            told(seconds)


@contextlib.contextmanager
def gpu_to_itself(log=None):
    """Hold the current GPU against every other judge on this host (module doc): the turn, then the gate, both
    exclusively. A shared stretch this thread holds is left for the time (and entered again after), so a judge in
    one can take the GPU alone for a moment; inside a hold of its own, a thread already has the GPU alone."""
    if getattr(_HELD, "alone", 0):
        _HELD.alone += 1
        try:
            yield
        finally:
            _HELD.alone -= 1
        return
    mine = list(_shared())
    for share in mine:
        share._leave()
    path = gpu_lock_path()
    turn, gate = _open(path), _open(path + ".gate")
    try:
        waited = _flock(turn, fcntl.LOCK_EX, log, "another judge on this host is timing on it")
        waited += _flock(gate, fcntl.LOCK_EX, log, "other judges on this host are running a call on it")
        _waited(waited)
        _HELD.alone = 1
        yield
    finally:
        _HELD.alone = 0
        os.close(gate)  # closing releases the locks
        os.close(turn)
        for share in mine:
            share._enter()


class GpuShare:
    """A judge's shared stretch on its GPU (module doc): entered, pulsed before each command, left."""

    def __init__(self, log=None):
        self.log, self.path, self.gate = log, None, -1

    def __enter__(self) -> "GpuShare":
        self.path = gpu_lock_path()
        self._enter()
        _shared().append(self)
        return self

    def __exit__(self, *exc) -> None:
        _shared().remove(self)
        self._leave()

    def _enter(self) -> None:
        turn, self.gate = _open(self.path), _open(self.path + ".gate")
        try:
            waited = _flock(turn, fcntl.LOCK_SH, self.log, "another judge on this host is timing on it")
            waited += _flock(self.gate, fcntl.LOCK_SH, self.log, "another judge on this host is timing on it")
        finally:
            os.close(turn)
        _waited(waited)

    def _leave(self) -> None:
        if self.gate >= 0:
            os.close(self.gate)
            self.gate = -1

    def pulse(self) -> None:
        """Between two commands: if a judge holds the turn (it waits to time, or times), this one's GPU work is
        finished and the gate let go, then taken again after that judge. Inside this thread's own hold of the GPU
        (gpu_to_itself) the turn is its own: nothing to wait for (flock would make it wait for itself)."""
        if getattr(_HELD, "alone", 0):
            return
        turn = _open(self.path)
        try:
            fcntl.flock(turn, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return  # no judge waits to time on this GPU
        except BlockingIOError:
            pass
        finally:
            os.close(turn)
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        self._leave()
        self._enter()


@contextlib.contextmanager
def shared_unless(stop, path: str) -> "contextlib.AbstractContextManager[bool]":
    """A shared stretch for GPU work done ahead of the job it serves (kp.batch.prime: a slot's next box running the
    reference once while this job judges): entered as GpuShare enters, behind any judge waiting to time, but polled
    rather than waited for, given up once stop() says so (its job has come and does the work itself), and its waits
    told to no one (no job of this process waits for it). Yields whether it holds the gate."""
    turn, gate = _open(path), _open(path + ".gate")
    held = False
    try:
        while not held and not stop():
            try:
                fcntl.flock(turn, fcntl.LOCK_SH | fcntl.LOCK_NB)
                try:
                    fcntl.flock(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    held = True
                finally:
                    fcntl.flock(turn, fcntl.LOCK_UN)
            except BlockingIOError:
                time.sleep(0.05)
        yield held
    finally:
        os.close(gate)  # closing releases the lock
        os.close(turn)


def gpu_shared(log=None) -> GpuShare:
    """A judge's stretch of GPU work beside other judges' (parity, its reference, KernelBench's check; the escape
    check without timing)."""
    return GpuShare(log)


def pulse() -> None:
    """Called before each command a judge sends its workers: every shared stretch this thread holds pulses."""
    for share in list(_shared()):
        share.pulse()
