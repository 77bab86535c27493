"""Runners: the judge's side of a worker. The same commands, to a worker in a process of its own (a candidate file:
forked from a forkserver, or in its box) with the request/reply protocol, or to one in this process (the
playground's own variants). A worker that dies, hangs or answers out of turn becomes a rejection here."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import traceback
import types
from pathlib import Path

from kp.box import pch
from kp.box.builds import candidate_build_dir
from kp.box.start import FORKSERVER_PRELOAD, candidate_paths, start_wrapped
from kp.errors import FAILURE_KINDS, OutOfMemory, Rejected, oom_request_bytes
from kp.worker.guards import late_message
from kp.worker.replies import (
    ENDED_AFTER_FAULT,
    _settle_before_sending,
    asks_for_cuda,
    error_kind,
    error_text,
    raised,
    raised_kind,
)
from kp.worker.loop import REPLY_TIMEOUT_S, Worker, cut_middle, worker_main
from kp.lib import gpu_lock
from kp.lib.registry import ROOT


def _context():
    """forkserver where the platform has it (Linux, macOS): each candidate gets a fresh process, forked from a
    server that has imported torch and the judge but has run no candidate and initialised no GPU; else spawn."""
    import multiprocessing as mp
    import torch.multiprocessing as tmp

    if "forkserver" in mp.get_all_start_methods():
        ctx = tmp.get_context("forkserver")
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        return ctx
    return tmp.get_context("spawn")


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


FOREIGN = (
    "an answer that is not the worker's reply to this command came back: something in the candidate's "
    "process wrote to the judge's channel (a forged reply)"
)


class Reply(dict):
    """A worker's answer to the command of `stage`: a key the judge needs that it lacks is a rejection (a reply
    forged or cut short in the candidate's process), not an error of the judge."""

    def __init__(self, stage: str, reply: dict):
        super().__init__(reply)
        self.stage = stage

    def __missing__(self, key):
        raise Rejected(f"{self.stage}: {FOREIGN}: its reply has no {key!r}", kind="tampering", check=self.stage)


def candidate_runner(
    ref_spec,
    path: str | Path,
    device: str,
    precision: str,
    on_interim,
    *,
    boxed: bool,
    train: bool,
    deadline: float | None,
    limit_s: float | None,
    wrap: tuple = (),
    env: dict | None = None,
) -> "ProcessRunner":
    """A candidate file's worker as the judge starts it: its folder and file readable, its own build folder
    (kept per file contents) writable, in a box where boxed; under a tool (`wrap`, with `env`), in a box of its
    own (ProcessRunner)."""
    return ProcessRunner(
        ref_spec,
        device,
        precision,
        on_interim,
        sandbox=boxed or bool(wrap),
        read_only=candidate_paths(path),
        train=train,
        deadline=deadline,
        limit_s=limit_s,
        build_dir=str(candidate_build_dir(path)),
        wrap=wrap,
        env=env,
    )


class ProcessRunner:
    """A worker in a fresh process and the request/reply protocol; a dead worker or a timeout becomes a rejection.
    The worker runs in a scratch working directory of its own (fresh, writable, removed with it) and its stderr is
    kept in a file, whose last lines a verdict on its death carries (and which is echoed to this process's stderr
    when the worker closes)."""

    isolated = True

    def __init__(
        self,
        ref_spec,
        device: str,
        precision: str,
        on_interim,
        sandbox: bool = False,
        read_only: list[str] = (),
        train: bool = True,
        deadline: float | None = None,
        limit_s: float | None = None,
        build_dir: str | None = None,
        wrap: tuple = (),
        env: dict | None = None,
    ):
        """sandbox: run the worker in a box (kp.box.sandbox) that can read read_only and the judge's own files.
        deadline: time.monotonic() by which the whole job must be done (limit_s: its length, for the message).
        build_dir: the candidate's own extension folder (kp.box.builds.candidate_build_dir), writable in the box.
        wrap: a tool's command line the boxed worker runs under, in a box of its own with `env` added to its
        environment (kp.box.start.start_wrapped; compute-sanitizer for --sanitize)."""
        import tempfile

        self.on_interim, self.sandboxed, self.device = on_interim, sandbox, device
        self.deadline, self.limit_s = deadline, limit_s
        self.passed: dict = {}  # the judged row's passed checks (what a timeout's verdict lists)
        self.seq = 0  # commands sent: each answer must carry its command's number
        self.answered = True  # the last command's answer came (a worker stopped mid-call is killed, not asked)
        self.build_failures: list[dict] = []
        self.build_s = 0.0  # seconds the worker has spent in the candidate's load/load_inline calls (its reply says)
        self.build_wait_s = 0.0
        self.primed: tuple | None = None  # the reference's run in its box ahead of the job (ran_ahead, made_ahead)
        if sandbox:
            self.scratch = None  # the box's private /tmp holds its working directory
            if wrap:
                box = start_wrapped(ref_spec, list(read_only), build_dir, (device, precision, train), wrap, env or {})
            else:
                box = _start_boxed(ref_spec, device, precision, list(read_only), train, build_dir, deadline)
            self.conn, self.proc, self.stderr = box.conn, box.proc, box.stderr
            # waiting for its build ahead: the build's time, not the job's (its judge moves the deadlines by it)
            self.build_s = self.build_wait_s = box.build_wait_s
            self.box_ahead = box.ahead
            self.box_missed = box.missed
            self.seq, self.primed = box.seq, box.primed  # what its worker answered before the job (kp.batch.prime)
            return
        self.stderr = tempfile.NamedTemporaryFile(prefix="kp-worker-", suffix=".stderr", delete=False)
        self.scratch = tempfile.mkdtemp(prefix="kp-cwd-")
        ctx = _context()
        self.conn, child = ctx.Pipe()
        env = pch.env({**os.environ, **({"TORCH_EXTENSIONS_DIR": build_dir} if build_dir else {})})
        # the last: this judge's pid, which the worker ends with (kp.worker.loop.end_with_judge)
        self.proc = ctx.Process(
            target=worker_main,
            args=(
                child,
                ref_spec,
                device,
                precision,
                str(ROOT),
                env,
                self.scratch,
                train,
                self.stderr.name,
                os.getpid(),
            ),
            daemon=True,
        )
        start_without_main(self.proc)
        child.close()

    def _died(self, stage: str) -> Rejected:
        self.proc.join(5)
        return died(stage, self.proc.exitcode, stderr_tail(self.stderr.name))

    def _timed_out(self, stage: str) -> Rejected:
        self.proc.kill()
        passed = ", ".join(self.passed) or "nothing yet"
        return Rejected(
            f"{stage}: timeout after {self.limit_s:.0f} s, in this stage (passed before it: {passed})",
            kind="timeout",
            check=stage,
        )

    def call(self, stage: str, *msg, timeout: float = REPLY_TIMEOUT_S) -> dict:
        gpu_lock.pulse()  # a judge waiting to time on this GPU goes first (kp.lib.gpu_lock); waits move deadlines
        limit = time.monotonic() + timeout
        if self.deadline is not None and self.deadline < limit:
            limit = self.deadline
        _settle_before_sending(self.device)
        self.seq += 1
        self.answered = False
        try:
            self.conn.send(msg)
            while True:
                while not self.conn.poll(1.0):
                    if not self.proc.is_alive():
                        raise self._died(stage)
                    if time.monotonic() > limit:
                        if self.deadline is not None and limit == self.deadline:
                            raise self._timed_out(stage)
                        raise Rejected(f"{stage}: no answer within {timeout:.0f} s", kind="timeout", check=stage)
                reply = self.conn.recv()
                if not isinstance(reply, dict):
                    raise Rejected(f"{stage}: {FOREIGN} (a {type(reply).__name__})", kind="tampering", check=stage)
                if not reply.get("interim"):
                    break
                self.conn.send(("ack", self.on_interim(reply)))
        except (EOFError, BrokenPipeError, ConnectionResetError):
            raise self._died(stage) from None
        self.answered = True
        if reply.get("seq") != self.seq:
            raise Rejected(
                f"{stage}: {FOREIGN} (numbered {reply.get('seq')!r}, the command was {self.seq})",
                kind="tampering",
                check=stage,
            )
        reply = Reply(stage, reply)
        self.build_failures = reply.get("build_failures") or self.build_failures
        if isinstance(reply.get("build_s"), (int, float)):
            self.build_s = self.build_wait_s + float(reply["build_s"])
        if reply.get("patched"):
            raise Rejected(
                f"{stage}: the candidate replaced {', '.join(reply['patched'][:4])} in its process "
                f"(judge, timer and baselines depend on them)",
                kind="tampering",
                check=stage,
            )
        if reply.get("late_threads"):
            raise Rejected(f"{stage}: {late_message(reply['late_threads'])}", kind="tampering", check=stage)
        if not reply.get("ok"):
            why = raised(stage, str(reply.get("error")))
            held, asked = reply.get("gpu_held"), reply.get("gpu_asked")
            kind = reply.get("error_kind") if reply.get("error_kind") in FAILURE_KINDS else raised_kind(msg[0], None)
            e = (
                OutOfMemory(why, held, asked)
                if isinstance(held, int) and isinstance(asked, int)
                else Rejected(why, kind=kind, check=stage)
            )
            e.check = e.check or stage
            e.asks_for_cuda = bool(reply.get("asks_for_cuda"))
            e.traceback = reply.get("traceback") if isinstance(reply.get("traceback"), str) else None
            raise e
        return reply

    def _ahead(self, prime_args: tuple) -> tuple[dict | None, dict | None]:
        """What the run ahead of its job (kp.batch.prime) answered, making the model on the host and running it,
        where it had these arguments; (None, None) otherwise."""
        if self.primed is None:
            return None, None
        key, built, ran = self.primed
        try:
            same = pickle.dumps(prime_args) == key
        except Exception:
            return None, None
        return (built, ran) if same else (None, None)

    def ran_ahead(self, prime_args: tuple) -> dict | None:
        """The answer of the reference's run in this worker ahead of its job, where it ran, with these arguments;
        else None (then the judge runs it now, and says so if it fails then too)."""
        ran = self._ahead(prime_args)[1]
        return ran if isinstance(ran, dict) and ran.get("ok") and ran.get("primed") else None

    def made_ahead(self, prime_args: tuple) -> bool:
        """Whether the run ahead made the reference's model and inputs on the host with these arguments (the
        judge's own run then moves them to the device instead of making them there: kp.worker.setup's cmd_prime,
        built)."""
        built = self._ahead(prime_args)[0]
        return isinstance(built, dict) and bool(built.get("ok")) and bool(built.get("built"))

    def close(self, wait_s: float = 0.0, echo: bool = True):
        """Quit the worker: once it has answered (nothing of the job is left in it), its process is killed rather
        than waited for while its interpreter and torch tear down (seconds per job); with wait_s, given that long
        to end by itself first (a tool it runs under writes its summary as it ends). echo: the candidate's output
        written to this process's stderr (not for a second worker of the same candidate, whose output the first
        showed)."""
        quit = False
        try:
            if self.proc.is_alive() and self.answered:  # not one stopped (Ctrl-C, a timeout) mid-call
                self.conn.send(("quit",))
                if self.conn.poll(10):
                    self.conn.recv()
                    quit = True
        except (OSError, EOFError, BrokenPipeError):
            pass
        if quit and wait_s:
            self.proc.join(wait_s)
        if hasattr(self.proc, "keep_builds"):  # a box killed or dead mid-job may hold a build cut short: not kept
            self.proc.keep_builds = quit
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        getattr(self.proc, "cleanup", lambda: None)()
        self.stderr.close()
        try:
            text = cut_middle(Path(self.stderr.name).read_bytes()).decode(errors="replace")
            if text.strip() and echo:  # said as the candidate's, apart from the judge's own lines around it
                sys.stderr.write(
                    "[kp] the candidate's output (its process's stdout and stderr):\n"
                    f"{text.rstrip(chr(10))}\n[kp] end of the candidate's output\n"
                )
            os.unlink(self.stderr.name)
        except OSError:
            pass
        if self.scratch:
            import shutil

            shutil.rmtree(self.scratch, ignore_errors=True)


def died(stage: str, code: int | None, tail: str) -> Rejected:
    """The rejection for a worker that ended during `stage` with exit code `code`, its stderr ending in `tail`: a
    worker that answered a faulted command and then ended on purpose (ENDED_AFTER_FAULT) says so; one that exited
    0 without a Python error exited below Python; any other, its exit status."""
    why = f"{stage}: the candidate's process died ({exit_status(code)})"
    if code == 0 and ENDED_AFTER_FAULT in tail:
        return Rejected(
            f"{stage}: the candidate's process had ended after its GPU work faulted in an earlier "
            f"call (its CUDA context unusable); its stderr ended: {tail}",
            kind="crash",
            check=stage,
        )
    if code == 0:  # the worker answers every command, a Python exit included: this ended below Python
        why += (
            " in the middle of the judge's command, without a Python error: code that exits the process "
            "directly (os._exit, or exit() from native code or a library)"
        )
    return Rejected(
        why + (f"; its stderr ended: {tail}" if tail else "; nothing on its stderr"), kind="crash", check=stage
    )


def stderr_tail(path: str, lines: int = 3, chars: int = 400) -> str:
    """The last non-empty lines of a worker's stderr, joined with ' | ' (what a verdict on its death quotes)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    if "Fatal Python error:" in text:  # faulthandler's report of a crash: the error and where it happened, not the
        crash = text[text.rindex("Fatal Python error:") :].splitlines()  # module list it ends with
        frames = [ln.strip() for ln in crash if ln.strip().startswith("File ")]
        return " | ".join([crash[0].strip(), *frames[:lines]])[:chars]
    tail = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
    return " | ".join(tail)[-chars:]


def _start_boxed(
    ref_spec,
    device: str,
    precision: str,
    read_only: list[str],
    train: bool,
    build_dir: str | None = None,
    deadline: float | None = None,
):
    """The candidate's box (the one started ahead for it, if it matches) given its job."""
    from kp.box import start as boxstart

    return boxstart.take(
        ref_spec, read_only, build_dir, gpu=device != "cpu", deadline=deadline, worker=(device, precision, train)
    )


class LocalRunner:
    """The Worker in this process: for the playground's own variants (trusted code, same stages)."""

    isolated = False

    def __init__(self, ref_spec, device: str, precision: str, on_interim, factories: dict, train: bool = True):
        self.worker = Worker(ref_spec, device, precision, factories=factories, train=train, interim=on_interim)

    def call(self, stage: str, cmd: str, *args, **_) -> dict:
        gpu_lock.pulse()  # a judge waiting to time on this GPU goes first (kp.lib.gpu_lock)
        try:
            return self.worker.run(cmd, *args)
        except Rejected:
            raise
        except Exception as e:
            import torch

            why = raised(stage, error_text(e))
            err = (
                OutOfMemory(why, 0, oom_request_bytes(str(e)))
                if isinstance(e, torch.OutOfMemoryError)
                else Rejected(why, kind=raised_kind(cmd, error_kind(e)), check=stage)
            )
            err.check = err.check or stage
            err.asks_for_cuda = asks_for_cuda(e)
            err.traceback = traceback.format_exc(limit=-40)
            raise err from None

    def close(self):
        self.worker.state.models.clear()
        self.worker.state.baselines.clear()
