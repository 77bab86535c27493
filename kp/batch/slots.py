"""Many judgements at once: the slot a job runs in. A *job* is one reference with one candidate (judged exactly as
`run.py --candidate` judges it) or a built-in problem's own ladder (as `run.py --problem` runs it). A slot is a
process of its own pinned to one GPU (CUDA_VISIBLE_DEVICES) that runs one job at a time, and its own process group:
a job that hangs past its time limit, or whose process dies, gets that reason, the group is killed (the candidate's
worker with it) and a fresh slot takes the GPU. Which slots run which jobs, and the results file, are
kp.batch.backends'.
"""
from __future__ import annotations

import gc
import io
import os
import signal
import time
import traceback

from kp.errors import GpuMemoryShort, UsageError, cuda_broken, first_line, is_cuda_error
from kp.judge.runners import exit_status, start_without_main
from kp.judge.worker import JOB_TIMEOUT_S
from kp.batch.jobfile import Job

DEFAULT_TIMEOUT_S = JOB_TIMEOUT_S  # per job: a cold build of every kernel it uses, parity and timing fit well inside
KILL_GRACE_S = 30  # the judge itself rejects a job at its limit, naming the stage; past this grace the slot is killed
STARTUP_S = 120  # a slot's own start (imports) before its first job; not charged to the job
END_WAIT_S = 10.0  # how long slots asked to end (or killed) are waited for, all of them together


# ---------------------------------------------------------------------------------------------------------------
# The job function: the same in a slot of this host and in a Ray task.

def run_job(job: Job) -> dict:
    """Judge one job in this process; returns its result (verdict line, ok, the judge's full record)."""
    from kp.judge import driver as judge
    from kp.observe import report
    from kp.lib.build import prebuild
    from kp.errors import KernelBuildError
    log: list[str] = []
    t0 = time.perf_counter()
    opts = dict(job.opts)
    opts.pop("seed_from", None)  # said in the job's line of the results file, not the judge's business
    try:
        ref = judge.Reference.load(job.ref)
        variants = None
        if job.candidate is None:
            variants = judge.default_variants(ref.problem, precision=opts.get("precision") or "fp32")
            if opts.get("device") != "cpu":
                prebuild(ref.problem, variants)
        rec = judge.evaluate(ref, job.candidate, variants, log=log.append, **opts)
        line = report.verdict(rec) if job.candidate else \
            ("ok" if rec["ok"] else "rejected: " + "; ".join(f"{k}: {r['reason']}" for k, r in rec["rows"].items()
                                                               if not r["accepted"] and not r["peer"]))
        out = {"ok": bool(rec["ok"]), "verdict": line, "record": rec, "table": report.format_record(rec)}
    except (UsageError, KernelBuildError) as e:
        out = {"ok": False, "verdict": f"error: {first_line(e)}", "record": None,
               "gpu_memory": isinstance(e, GpuMemoryShort)}  # with the GPU to itself, the job may get a verdict
    except Exception as e:  # a bug of the judge's own, not the candidate's: said as such
        said = f"the judge raised {type(e).__name__}: {first_line(e)}"
        if is_cuda_error(e):  # asynchronous: the GPU work queued in the judge's process, which is the reference's
            said = (f"the reference's GPU work in the judge's process faulted ({type(e).__name__}: {first_line(e)}), "
                    f"seen where the judge next waited for the GPU")
        out = {"ok": False, "verdict": f"error: {said}", "record": None, "traceback": traceback.format_exc()}
    out.update(log=log, elapsed_s=round(time.perf_counter() - t0, 1))
    return out


class _Said(io.StringIO):
    """A command's stderr: kept, and each write passed on as it comes (the judge's progress lines)."""

    def __init__(self, say):
        super().__init__()
        self.say = say

    def write(self, text: str) -> int:
        if text:
            self.say(text)
        return super().write(text)


def run_command(msg: dict, say=None) -> dict:
    """A warm judge's command (kp.batch.server), in the slot's process: `run.py`'s main() on the command line, its
    output captured (stderr passed on to `say` as it is written). The box for the same candidate's next command
    is started as this one starts (this one takes the box started before it, the oldest): a loop's next command
    comes within seconds, before a box started at the end would be ready (its interpreter, torch and CUDA take
    3-4 s); after it, one such box waits, the others go."""
    import contextlib
    import sys
    from kp.lib.registry import ROOT
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import run
    os.chdir(msg["cwd"])
    if not msg.get("ahead_only"):
        run.start_box_early(msg["argv"], later=True)
    out, err = io.StringIO(), (_Said(say) if say else io.StringIO())
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = 0 if msg.get("ahead_only") else run.cli(msg["argv"])  # ahead_only: its box alone, judged elsewhere
        except SystemExit as e:  # argparse's usage errors and --help
            rc = e.code if isinstance(e.code, int) else 2
        except Exception as e:  # the judge's own bug: said, the slot goes on
            traceback.print_exc()
            rc = 2
            print(f"error: the judge raised {type(e).__name__}", file=sys.stderr)
    run.start_box_early(msg["argv"], later=True, one_waiting=True)
    return {"rc": rc, "stdout": out.getvalue(), "stderr": "" if say else err.getvalue()}


def _noop() -> None:
    pass


def _forks_workers(jobs: list[Job]) -> bool:
    """Whether any job judges a candidate outside the sandbox, in a worker forked from the forkserver (a boxed
    candidate gets a fresh interpreter; a ladder job judges in the slot itself)."""
    from kp.box import sandbox
    return any(j.candidate and not sandbox.choice(dict(j.opts).get("sandbox", True))[0] for j in jobs)


def _warm_up(forkserver_too: bool) -> None:
    """What every job needs and no job should pay for: the judge's imports, the candidates' forkserver where some
    job forks its worker from it (started before CUDA is, so its children may use the GPU) and this slot's CUDA
    context."""
    import importlib
    import multiprocessing.forkserver as forkserver
    import torch
    from kp.judge.runners import _context
    importlib.import_module("kp.judge.driver")
    ctx = _context()
    if forkserver_too and ctx.get_start_method() == "forkserver":
        forkserver.ensure_running()
        # The server imports torch and the judge before it forks anything: a first child waits for that, here
        # rather than inside the first job's time limit and elapsed time.
        p = ctx.Process(target=_noop)
        start_without_main(p)
        p.join()
    if torch.cuda.is_available():
        torch.cuda.init()
    # a footprint not kept yet is a meta-device run, whose first operators import sympy (and some torch._dynamo:
    # 2-5 s in all): here, not in the first job (kp.judge.reference)
    from kp.lib.op_modes import FlopCount
    with FlopCount():
        torch.ones(2, 2, device="meta") @ torch.ones(2, 2, device="meta")


def _box_ahead(job: Job, ahead: list[Job]) -> None:
    """The boxes of the jobs this slot runs next, started while this one runs (their interpreter, torch, CUDA's
    context and the judge's GPU tools ready when each job starts), the next one's also running the reference once
    for its job (kp.batch.prime). Boxes started ahead for jobs no longer among them (taken by another slot
    meanwhile) go; this job's own stays for it to take."""
    from kp.batch import prime
    from kp.box import start as boxstart
    free, kept, missing, nxt = list(boxstart.waiting()), [], [], None
    for j in [job, *ahead]:  # a box per job (two versions of one file have one plan: one box each)
        if j.candidate is None:
            continue
        p = boxstart.plan_for(j.ref, j.candidate)  # a file gone meanwhile has one too: its job says it is gone
        b = prime.pick(free, p, j)  # plans hold lists and dicts: compared, not hashed
        if b is not None:
            free.remove(b)
            kept.append(b)
        elif j is not job:
            missing.append(j)
        if ahead and j is ahead[0]:
            nxt = b
    boxstart.discard_early({id(b) for b in kept})
    for j in missing:
        before = len(boxstart.waiting())
        _start_box_for(j)
        if j is ahead[0] and len(boxstart.waiting()) > before:
            nxt = boxstart.waiting()[-1]
    if nxt is not None and nxt.proc.is_alive():
        prime.run_ahead(ahead[0], nxt)


def _start_box_for(job: Job) -> None:
    """A box started now for a later job of this slot: one of its next jobs (_box_ahead), or, after a session's
    job with none behind it, the same file's next version (kp.box.start: a box is its file's, whatever the
    contents; the next job of another file discards it)."""
    from kp.box import start as boxstart
    opts = dict(job.opts)
    boxstart.start_early(job.ref, job.candidate, boxed=opts.get("sandbox", True), later=True,
                         cuda=opts.get("device") != "cpu")


def _slot_main(conn, gpu: str | None, log_path: str | None, forkserver_too: bool) -> None:
    """A slot: its own process group (so the judge, its forkserver and the candidate's worker die together), pinned
    to one GPU before CUDA starts; runs the jobs it is sent, one at a time."""
    os.setsid()
    parent = os.getppid()

    def orphaned():  # the batch was killed: so is this slot's group, the candidate hanging in it included
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os.killpg(0, signal.SIGKILL)
    import threading
    threading.Thread(target=orphaned, daemon=True).start()
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    if log_path:  # the candidate's and the judge's own output go to the slot's log, not over the progress line
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    _warm_up(forkserver_too)
    import torch
    from kp.lib import gpu_lock
    from kp.box import builds
    for waits in (gpu_lock.GPU_WAITS, builds.OFF_THE_CLOCK):  # for the GPU, for a build ahead: not the job's time
        waits.append(lambda seconds: conn.send({"waited": seconds}))
    gpu_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            from kp.box import start as boxstart
            boxstart.discard_early()
            return
        # the job's clock starts now, not while the slot was starting up; the GPU's name stays with a job the slot
        # does not finish (killed at its time limit, or dead)
        conn.send({"started": True, "gpu_name": gpu_name})
        if isinstance(msg, dict):  # a warm judge's command line (kp.batch.server), run as run.py runs it
            res = run_command(msg, say=lambda text: conn.send({"say": text}))
        else:
            job, ahead, spare = msg
            print(f"=== {job.name}", flush=True)
            _box_ahead(job, ahead)
            res = run_job(job)
            if spare and not ahead and job.candidate:  # a loop's next version of the same file finds its box ready
                _start_box_for(job)
        res["gpu_name"] = gpu_name
        # what the job's judge left in this process's allocator goes back before the next job (or another slot's)
        # asks for the GPU's memory
        gc.collect()
        broken = cuda_broken()
        if broken:  # a sticky CUDA error (a reference's device-side assert): no later job may run in this process
            res["slot_broken"] = broken
        elif torch.cuda.is_available():
            torch.cuda.empty_cache()
        conn.send(res)
        if broken:
            return


class Slot:
    """One slot process and the job it runs; `poll` turns its answer, its death or its time running out into a
    result, and a fresh process replaces a dead or killed one."""

    def __init__(self, gpu: str | None, log_path: str | None, forkserver_too: bool = True):
        self.gpu, self.log_path, self.forkserver_too = gpu, log_path, forkserver_too
        self.job: Job | None = None
        self.key: str | None = None
        self.reserved: list[tuple[Job, str]] = []  # the jobs it runs next (their boxes started ahead), not yet begun
        self.last_candidate: str | None = None  # the file of the job it ran last (a box for it may wait there)
        self.t0, self.started, self.gpu_name, self.waited = 0.0, False, None, 0.0
        self.said: list[str] = []  # a warm judge's command's stderr, not yet passed on
        self._start()

    def _start(self) -> None:
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        # not a daemon: the judge in it starts the candidate's worker. A slot whose parent is gone ends at the
        # closed pipe.
        self.proc = ctx.Process(target=_slot_main, args=(child, self.gpu, self.log_path, self.forkserver_too))
        start_without_main(self.proc)
        child.close()

    def submit(self, job: Job, key: str | None = None, ahead: list[Job] = (), spare: bool = False) -> None:
        """Run `job`; `ahead`, the jobs this slot will run next, get their boxes started meanwhile. spare: with none
        ahead, a box for the same file is started after the job (a loop that edits its candidate judges it next)."""
        self.job, self.key, self.t0, self.started, self.waited = job, key, time.monotonic(), False, 0.0
        self.last_candidate = job.candidate
        self.conn.send((job, list(ahead), spare))

    def submit_command(self, msg: dict) -> None:
        """Run a command line as run.py would (kp.batch.server); poll() gives its output and exit code."""
        self.job, self.key, self.t0, self.started, self.waited = msg, None, time.monotonic(), False, 0.0
        self.conn.send(msg)

    def kill(self, wait_s: float = END_WAIT_S) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.kill()
        self.proc.join(wait_s)

    def poll(self, timeout_s: float) -> dict | None:
        """The finished job's result, or None while it runs."""
        if self.job is None:
            return None
        res = None
        try:
            while res is None and self.conn.poll(0):
                res = self.conn.recv()
                if res.get("started"):
                    self.t0, self.started, self.gpu_name, res = time.monotonic(), True, res["gpu_name"], None
                elif "say" in res:  # a warm judge's command's stderr, as it is written (kp.batch.server)
                    self.said.append(res["say"])
                    res = None
                elif "waited" in res:  # for other judges on its GPU, for its build ahead: the limit moves with it,
                    #                    as the judge's does
                    self.t0, self.waited, res = self.t0 + res["waited"], self.waited + res["waited"], None
        except (EOFError, OSError):
            pass
        if res is None and not self.proc.is_alive():
            self.proc.join(1)
            res = {"ok": False, "verdict": f"rejected: the judge's process died ({exit_status(self.proc.exitcode)})",
                   "record": None}
            self.kill()
            self._start()
        elif res is None and time.monotonic() - self.t0 > timeout_s + KILL_GRACE_S + (0 if self.started else
                                                                                       STARTUP_S):
            self.kill()
            res = {"ok": False, "verdict": f"rejected: timeout after {timeout_s:.0f} s (the job was killed from "
                                           f"outside: its judge reached no verdict {KILL_GRACE_S} s past the limit)",
                   "record": None}
            self._start()
        if res is None:
            return None
        if res.get("slot_broken"):  # its job's result stands; the next job gets a fresh process
            self.proc.join(10)
            self.kill()
            self._start()
        res.setdefault("elapsed_s", round(time.monotonic() - self.t0 + self.waited, 1))
        res.setdefault("gpu_name", self.gpu_name)
        self.job = None
        return res

    def close(self) -> None:
        end_all([self])

    def ask_to_end(self) -> None:
        """An idle slot ends at this (a busy one when its job is done); end_all waits for it."""
        try:
            self.conn.send(None)
        except (OSError, ValueError):  # its process is gone already, or the pipe was closed
            pass


def end_all(slots: list[Slot], kill: bool = False, wait_s: float = END_WAIT_S) -> None:
    """Every slot ended together: asked to end (kill: killed, with its process group), then all waited for within one
    `wait_s`, and what is still alive then killed and waited for once more. A process that held a CUDA context can
    take a while to die (the driver tears its context down): waited for one after another, up to ten seconds each,
    a stopped run of twelve slots would wait for the sum of their deaths where the longest one is enough."""
    for s in slots:
        if kill:
            s.kill(wait_s=0)
        else:
            s.ask_to_end()
    for last in (False, True):
        deadline = time.monotonic() + wait_s
        for s in slots:
            s.proc.join(max(0.0, deadline - time.monotonic()))
        alive = [s for s in slots if s.proc.is_alive()]
        if not alive or last:
            return
        for s in alive:
            s.kill(wait_s=0)


def isolated_job(job: Job, timeout_s: float = DEFAULT_TIMEOUT_S, gpu: str | None = None) -> dict:
    """One job in a fresh slot with the same time limit and death handling: what a Ray task runs."""
    slot = Slot(gpu, None, _forks_workers([job]))
    try:
        slot.submit(job)
        while True:
            res = slot.poll(timeout_s)
            if res is not None:
                return res
            time.sleep(0.2)
    finally:
        slot.close()
