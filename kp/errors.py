"""The errors the playground raises on purpose (a usage mistake, a kernel that does not compile, a rejection), how
they are said, and how a stop from outside (Ctrl-C, SIGTERM) becomes one."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time


class UsageError(ValueError):
    """Bad request from a user (unknown problem or variant, bad shapes, no GPU). run.py maps it to exit 2."""


class ReferenceRaised(UsageError):
    """The reference itself raised on its own inputs (`where`: how it was called); `cause`, its exception's type and
    first line, for a judge that skips that shape and says why in the exception's own words."""

    def __init__(self, where: str, cause: BaseException | str):
        self.where = where
        self.cause = cause if isinstance(cause, str) else f"{type(cause).__name__}: {first_line(cause)}"
        super().__init__(f"{where}: {self.cause}")

    def __reduce__(self):  # across processes as it was made (a batch's slot, Ray)
        return type(self), (self.where, self.cause)


class GpuMemoryShort(UsageError):
    """No verdict for want of GPU memory: the plan found too little free, or other processes took memory during the
    run. With the GPU to itself the same job may get a verdict (a batch judges it again so)."""


class NoVerdict(UsageError):
    """The judge could not check enough to give a verdict (too few checked calls); exit 2 with what was missing."""


class KernelBuildError(RuntimeError):
    """A kernel failed to compile; the message names the .cu file and line with the compiler's own words."""


# A verdict's status: what a loop reads first (the record's, a batch line's, JudgeSession's result's, the exit code's).
ACCEPTED, REJECTED, NO_VERDICT = "accepted", "rejected", "no_verdict"
STATUSES = (ACCEPTED, REJECTED, NO_VERDICT)
EXIT_CODES = {ACCEPTED: 0, REJECTED: 1, NO_VERDICT: 2}

# What a rejection is, in a word a search loop or a reward can branch on (the record's failure.kind; docs/judge.md
# lists them with an example each). The reason says the same in English, for a person; nothing reads it back.
FAILURE_KINDS = {
    "build": "a kernel of the candidate's did not compile (CUDA C++, Triton or CuPy)",
    "import": "the candidate's file did not import, or defines no ModelNew",
    "construct": "ModelNew(*get_init_inputs()) raised, or the reference's weights could not be given to it",
    "raised": "a call of the candidate's model raised",
    "crash": "the candidate's process died, or its GPU work faulted",
    "timeout": "the candidate's job ran past its time limit, or a command got no answer",
    "out_of_memory": "the candidate's own work ran out of GPU memory",
    "wrong_output": "an output's values are over the error budget against the float64 reference",
    "wrong_shape": "an output's type, shape or dtype is not the reference's",
    "non_finite": "NaN or Inf where the reference has finite values (or the reverse)",
    "input_modified": "the candidate changed an input in place",
    "stale_inputs": "an output fits an earlier call's inputs, not this call's",
    "wrong_state": "a buffer the reference carries between calls (BatchNorm's statistics) differs",
    "gradient": "a gradient is missing or differs from the reference's",
    "own_kernel": "no kernel of the candidate's own ran (a PyTorch rewrite, without --allow-torch)",
    "escape": "GPU work outside the timed window, or host time the CUDA events did not see",
    "timing": "the timed calls do not add up: samples that contradict the wall clock or the checked call",
    "tampering": "the candidate changed the judge's process, its replies or PyTorch's settings",
    "memory_error": "compute-sanitizer saw a kernel of the candidate's read or write out of bounds, or read memory "
    "never written (--sanitize)",
    "race": "compute-sanitizer saw threads of a kernel of the candidate's race on shared memory, or misuse a barrier "
    "(--sanitize)",
}


class Rejected(Exception):
    """A judged row failed a check; str() is the one-line reason, `kind` what failed (FAILURE_KINDS). figures: the
    failed check's own numbers (its label, the error, the budget), kept in the record beside the reason."""

    def __init__(
        self, reason: str = "", figures: dict | None = None, kind: str = "wrong_output", check: str | None = None
    ):
        super().__init__(reason)
        if kind not in FAILURE_KINDS:
            raise ValueError(f"failure kind {kind!r} is not one of {', '.join(FAILURE_KINDS)}")
        self.figures = figures
        self.kind = kind
        self.check = check or (figures or {}).get("check")  # the label of the check or call that failed

    def __reduce__(self):  # across processes as it was made: its reason and every attribute (kind, figures, ...)
        return _rejected, (type(self), str(self), dict(self.__dict__))


def _rejected(cls, reason, state):
    e = Exception.__new__(cls)
    Exception.__init__(e, reason)
    e.__dict__.update(state)
    return e


def exception_chain(e: BaseException | None, most: int = 20) -> list[BaseException]:
    """`e` and the exceptions it was raised from or while handling, innermost last (at most `most`): a reason
    extended with a hint is raised anew, from None, and Python keeps the first as its context."""
    out = []
    while e is not None and len(out) < most:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def failure_record(kind: str, stage: str | None = None, check: str | None = None, figures: dict | None = None) -> dict:
    """A rejection as the record keeps it (a row's, a result line's failure): its kind, the stage it came in, the
    check that failed and that check's figures (kp/record.schema.json, $defs.failure)."""
    return {"kind": kind, "stage": stage, "check": check, "figures": figures}


def failure_kind(e: BaseException | None) -> str | None:
    """The kind of the rejection `e` is, or the kind of the one it was raised while handling."""
    return next((x.kind for x in exception_chain(e) if isinstance(x, Rejected)), None)


def failed_check(e: BaseException | None) -> str | None:
    """The label of the check a rejection names (its own, or that of the rejection it was raised while handling)."""
    return next((x.check for x in exception_chain(e) if getattr(x, "check", None)), None)


def failed_figures(e: BaseException | None) -> dict | None:
    """The figures of the check a rejection comes from: its own, or those of the rejection it was raised while
    handling."""
    return next((x.figures for x in exception_chain(e) if getattr(x, "figures", None)), None)


class OutOfMemory(Rejected):
    """A judged row's call ran out of GPU memory. held: the bytes the raising process's allocator held then (0 for
    the judge's own process, whose memory the judge reads itself); asked: the bytes the failed request wanted (0 if
    not known). Whether that is the row's doing or another process's is decided by the judge, not here."""

    def __init__(self, reason: str, held: int = 0, asked: int = 0):
        super().__init__(reason, kind="out_of_memory")
        self.held, self.asked = held, asked


def oom_request_bytes(message: str) -> int:
    """The bytes a PyTorch out-of-memory error says the request wanted ('Tried to allocate 12.06 GiB'), or 0."""
    import re

    m = re.search(r"Tried to allocate ([0-9.]+) (GiB|MiB|KiB|bytes|B)\b", message)
    if not m:
        return 0
    return int(float(m.group(1)) * {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10}.get(m.group(2), 1))


def first_line(e: BaseException, limit: int = 300) -> str:
    """An error's message on one line: its first line, and where that line only announces a list (it ends with a
    colon, as load_state_dict's "Error(s) in loading state_dict for ModelNew:" does), the lines of the list after
    it joined with "; ", so the missing and unexpected keys are part of the reason."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    text = lines[0]
    if text.endswith(":") and len(lines) > 1:
        text += " " + "; ".join(lines[1:])
        limit = max(limit, 900)
    return text[:limit] + ("..." if len(text) > limit else "")


def cuda_broken() -> str | None:
    """Why this process's CUDA context can no longer be used (a sticky error: a device-side assert or an illegal
    address in work run here, such as the reference's own), or None. A candidate's fault stays in its worker's
    process; the reference runs in the judge's."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
    except Exception as e:
        return f"{type(e).__name__}: {first_line(e)}"
    return None


def raised_by_judge(e: BaseException) -> bool:
    """Whether an exception was raised in the judge's own code (its innermost frame in the kp package), not in the
    reference's forward or the torch operators it calls: a bug to report as one, not a reference that raises on
    its inputs. An operator that raises inside one of the judge's dispatch modes (counting FLOPs, rounding at
    random) has that mode's __torch_dispatch__ as its innermost Python frame: the operator's, not the judge's. A
    CUDA error is asynchronous: raised at whatever line next waits for the GPU, the judge's or not, it is the work
    queued before it (in the judge's process, the reference's), whatever its frame."""
    import os

    tb = e.__traceback__
    if tb is None or is_cuda_error(e):
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    if code.co_name in ("__torch_dispatch__", "__torch_function__"):
        return False
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.abspath(code.co_filename).startswith(here + os.sep)


def is_cuda_error(e: BaseException) -> bool:
    """A CUDA runtime error raised by torch (a device-side assert, an illegal address, a launch failure)."""
    return type(e).__name__ == "AcceleratorError" or (isinstance(e, RuntimeError) and "CUDA error" in str(e))


# the same signal again this soon is the same stop: `timeout` sends its signal to the command and then to the command's
# process group, so a run under `timeout -s INT` got it twice, and the second, while the run wrote its table, killed it
# without one
SAME_STOP_S = 1.0


class Stopped(KeyboardInterrupt):
    """A stop from outside, as stopped_by_signals raises it: Ctrl-C's SIGINT or a SIGTERM (`signum`)."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


def stop_signal(e: KeyboardInterrupt) -> int:
    """The signal behind an interruption: a Stopped's own, else Ctrl-C's."""
    return getattr(e, "signum", signal.SIGINT)


@contextlib.contextmanager
def stopped_by_signals():
    """SIGINT (Ctrl-C) and SIGTERM (`timeout`'s default, a scheduler's stop) both raised as Stopped (a
    KeyboardInterrupt with the signal's number), so that a run ends the same way on either: one judgement says it
    has no verdict, a batch kills its slots and prints the table and throughput line of what it judged. SIGINT is
    taken back where the run was started with it ignored, as a shell without job control starts a background command
    (`run.py ... &` in a script): a time limit's SIGINT then did nothing, and the run went on judging until its
    SIGKILL, which left no table. A second signal while the run ends kills it at once, as signals do by default,
    unless it is the first one's repeat (`SAME_STOP_S`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = []

    def stop(signum, frame):
        if stopping:
            first, at = stopping[0]
            if signum == first and time.monotonic() - at < SAME_STOP_S:
                return
            for s in old:
                signal.signal(s, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        stopping.append((signum, time.monotonic()))
        raise Stopped(signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
