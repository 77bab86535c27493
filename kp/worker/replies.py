"""What a worker answers the judge, and how: a command that raised (its error in one line, out of GPU memory with what
the GPU and the process held, a fault of the call's GPU work named as the fault), and a reply sent whole, with owned
copies of tensors that cannot cross as they are."""

from __future__ import annotations

import pickle
import subprocess

import torch

from kp.errors import KernelBuildError, exception_chain, first_line
from kp.worker.languages import jit_error

FAULTED = "its GPU work faulted"  # how a command's error begins when its call left the CUDA context unusable
ENDED_AFTER_FAULT = "kp worker: the CUDA context is unusable"  # the worker's last words when it ends after one


# What a command's kind of work is, by the worker's command: a raise while importing the file is an import's failure,
# one while making the model a construction's; any other is a call's (kind "raised").
COMMAND_KINDS = {"load": "import", "build": "construct", "prime_build": "construct", "prebuild": "construct"}


def error_kind(e: BaseException, fault: str | None = None) -> str | None:
    """What a command's exception is, where its type says more than the command it interrupted: a fault of the
    call's GPU work or an exit from inside it (crash), a kernel that did not compile (build: a Triton compile error,
    or an extension's compiler run that failed), or GPU memory run out (out_of_memory); None otherwise."""
    if fault or isinstance(e, SystemExit):
        return "crash"
    if isinstance(e, torch.OutOfMemoryError):
        return "out_of_memory"
    compiler_failed = (KernelBuildError, subprocess.CalledProcessError)
    if jit_error(e) or any(isinstance(c, compiler_failed) for c in exception_chain(e)):
        return "build"
    return None


def asks_for_cuda(e: BaseException) -> bool:
    """Whether `e` was raised by torch's start of CUDA (torch.cuda's lazy initialisation) in a process that has none:
    code that asks for the GPU (a tensor made or moved to "cuda") on a CPU-only host. That is the host's lack, not a
    defect of the code."""
    if torch.cuda.is_available():
        return False
    for x in exception_chain(e):
        tb = x.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_name == "_lazy_init" and code.co_filename.replace("\\", "/").endswith("torch/cuda/__init__.py"):
                return True
            tb = tb.tb_next
    return False


def raised_kind(cmd: str, kind: str | None) -> str:
    """The failure kind of a command `cmd` that raised, its exception's kind (error_kind) where it has one."""
    return kind or COMMAND_KINDS.get(cmd, "raised")


def _gpu_memory() -> tuple[int, int] | None:
    return torch.cuda.mem_get_info() if torch.cuda.is_available() else None


def raised(stage: str, error: str, gpu_memory=_gpu_memory) -> str:
    """A call that raised. Out of GPU memory, the reason also says what the GPU has free now (whose doing that was,
    the row's or another process's, the judge decides: kp.judge.plan.memory_taken_by_others)."""
    why = f"{stage}: {error}" if error.startswith(FAULTED) else f"{stage}: raised {error}"
    if "OutOfMemoryError" in error:
        try:
            mem = gpu_memory()
        except RuntimeError:  # a GPU that cannot answer: the reason as it was
            mem = None
        if mem:
            why += f" (the GPU has {mem[0] / 2**30:.1f} of {mem[1] / 2**30:.1f} GiB free now)"
    return why


def error_text(e: BaseException) -> str:
    """What a command that raised answers: 'Type: first line'. Out of GPU memory, also what the raising process's
    allocator holds then (taken here, in that process: a worker's figures, not the judge's), since its own
    tensors are the ones a reader can act on. An exit asked for from inside a command (sys.exit, exit()) says so."""
    if isinstance(e, SystemExit):
        return (
            f"SystemExit: the candidate's code asked its process to exit (sys.exit or exit() with code "
            f"{e.code!r}) in the middle of the judge's command"
        )
    text = jit_error(e) or f"{type(e).__name__}: {first_line(e)}"
    if isinstance(e, torch.OutOfMemoryError) and torch.cuda.is_available() and torch.cuda.is_initialized():
        g = 2**30
        text += (
            f" [the raising process: {torch.cuda.memory_allocated() / g:.1f} GiB allocated, "
            f"{torch.cuda.memory_reserved() / g:.1f} GiB reserved, "
            f"peak {torch.cuda.max_memory_allocated() / g:.1f} GiB]"
        )
    return text


def _tensors_replaced(msg, by):
    """`msg` with every tensor in it (in dicts, tuples and lists, at any depth) replaced by `by(tensor)`."""
    if isinstance(msg, torch.Tensor):
        return by(msg)
    if isinstance(msg, dict):
        return {k: _tensors_replaced(v, by) for k, v in msg.items()}
    if isinstance(msg, (tuple, list)):
        return type(msg)(_tensors_replaced(v, by) for v in msg)
    return msg


def owned_copy(msg):
    """`msg` with every tensor replaced by a detached copy in memory this process owns: what is sent when a tensor
    cannot cross as it is (CUDA-graph pool memory, which CUDA cannot export; a non-leaf tensor that requires
    grad, which pickling refuses)."""
    with torch.no_grad():
        return _tensors_replaced(msg, lambda t: t.detach().clone())


def without_tensors(msg):
    """`msg` with every tensor left out (None in its place): the reply of a call whose thread still works on what
    it returned. Its verdict is that thread; sending its tensors would move their storage under it."""
    return _tensors_replaced(msg, lambda t: None)


def send(conn, msg: dict) -> None:
    """Send `msg` to the judge; where a tensor in it cannot be shared as it is, send owned copies instead. The
    message is pickled whole before anything is written, so a failed first try leaves the channel clean."""
    try:
        conn.send(msg)
    except (RuntimeError, TypeError, pickle.PicklingError):
        msg = owned_copy(msg)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the copies are written before the judge reads them
        conn.send(msg)


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


def gpu_fault(device: str) -> str | None:
    """After a command raised: the CUDA error that left this process's context unusable (an illegal address, a
    launch failure in some kernel), as CUDA reports it now; None while the context still works. Such an error is
    sticky and asynchronous: it surfaces at whatever call comes next (a library's handle creation, a copy), so the
    error a command raised can be a symptom of a fault earlier in the same call."""
    if device != "cuda" or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
        torch.empty(1, device="cuda").fill_(0).item()
        return None
    except Exception as e:
        return first_line(e)


def fault_text(fault: str, raised_error: str) -> str:
    """What a command answers when its call left the context unusable: the fault first, as the defect (the
    candidate's own GPU work faulted in this call), and the error the call raised, where it differs, as where
    the fault surfaced."""
    text = f"{FAULTED} in this call: {fault}"
    if fault.split(":")[-1].strip().lower() not in raised_error.lower():
        text += f" (it surfaced as {raised_error}, a later call's report of that fault)"
    return text + "; CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer names the kernel"
