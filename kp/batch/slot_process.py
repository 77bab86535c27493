"""What runs inside a slot's process (kp.batch.slots starts it): the job function, a warm judge's command, and the
slot's loop. This module imports nothing heavy at its top: a slot is a fresh interpreter (spawn) that imports only
this module before its loop begins, so it can start its first job's box (kp.box.start, which needs no torch) before
its own imports of torch and the judge and CUDA's start, which take 3-10 s on a busy host; the box's own start,
about as long, then runs beside them instead of after them.
"""

from __future__ import annotations

import gc
import io
import os
import signal
import time
import traceback

from kp.batch.jobfile import Job
from kp.errors import NO_VERDICT, GpuMemoryShort, UsageError, cuda_broken, first_line, is_cuda_error

FIRST_JOB_WAIT_S = 5.0  # how long a slot told its first job is on its way looks for it before its own start


def run_job(job: Job) -> dict:
    """Judge one job in this process; returns its result (verdict line, ok, the judge's full record)."""
    from kp.judge import driver as judge
    from kp.observe import report, verdict
    from kp.errors import KernelBuildError
    from kp.judge.options import JudgeOptions

    log: list[str] = []
    t0 = time.perf_counter()
    opts = dict(job.opts)
    opts.pop("seed_from", None)  # said in the job's line of the results file, not the judge's business
    try:
        rec = judge.judge_job(job.ref, job.candidate, JudgeOptions.from_mapping(opts), log=log.append)
        line = (
            verdict.verdict(rec)
            if job.candidate
            else (
                "ok"
                if rec["ok"]
                else "rejected: "
                + "; ".join(
                    f"{k}: {r['reason']}" for k, r in rec["rows"].items() if not r["accepted"] and not r["peer"]
                )
            )
        )
        out = {
            "ok": bool(rec["ok"]),
            "status": rec["status"],
            "verdict": line,
            "record": rec,
            "table": report.format_record(rec),
        }
    except (UsageError, KernelBuildError) as e:
        out = {
            "ok": False,
            "status": NO_VERDICT,
            "verdict": f"error: {first_line(e)}",
            "record": None,
            "gpu_memory": isinstance(e, GpuMemoryShort),
        }  # with the GPU to itself, the job may get a verdict
    except Exception as e:  # a bug of the judge's own, not the candidate's: said as such
        said = f"the judge raised {type(e).__name__}: {first_line(e)}"
        if is_cuda_error(e):  # asynchronous: the GPU work queued in the judge's process, which is the reference's
            said = (
                f"the reference's GPU work in the judge's process faulted ({type(e).__name__}: {first_line(e)}), "
                f"seen where the judge next waited for the GPU"
            )
        out = {
            "ok": False,
            "status": NO_VERDICT,
            "verdict": f"error: {said}",
            "record": None,
            "traceback": traceback.format_exc(),
        }
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


def run_command(msg: dict, cli, start_early, say=None) -> dict:
    """A warm judge's command (kp.batch.server), in the slot's process: the command line's cli() on it (kp.command
    hands it in, so the library never imports its command line), its output captured (stderr passed on to `say` as
    it is written). The box for the same candidate's next command is started as this one starts (start_early; this
    one takes the box started before it, the oldest): a loop's next command comes within seconds, before a box
    started at the end would be ready (its interpreter, torch and CUDA take 3-4 s); after it, one such box waits,
    the others go."""
    import contextlib
    import sys

    os.chdir(msg["cwd"])
    if not msg.get("ahead_only"):
        start_early(msg["argv"], later=True)
    out, err = io.StringIO(), (_Said(say) if say else io.StringIO())
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = 0 if msg.get("ahead_only") else cli(msg["argv"])  # ahead_only: its box alone, judged elsewhere
        except SystemExit as e:  # argparse's usage errors and --help
            rc = e.code if isinstance(e.code, int) else 2
        except Exception as e:  # the judge's own bug: said, the slot goes on
            traceback.print_exc()
            rc = 2
            print(f"error: the judge raised {type(e).__name__}", file=sys.stderr)
    start_early(msg["argv"], later=True, one_waiting=True)
    return {"rc": rc, "stdout": out.getvalue(), "stderr": "" if say else err.getvalue()}


def _noop() -> None:
    pass


def _warm_up(forkserver_too: bool) -> None:
    """What every job needs and no job should pay for: the judge's imports, the candidates' forkserver where some
    job forks its worker from it (started before CUDA is, so its children may use the GPU) and this slot's CUDA
    context."""
    import importlib
    import multiprocessing.forkserver as forkserver
    import torch
    from kp.judge.runners import _context, start_without_main

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
    """A box started now for a later job of this slot: a new slot's first job, before the slot's own start
    (_first_job), one of its next jobs (_box_ahead), or, after a session's job with none behind it, the same file's
    next version (kp.box.start: a box is its file's, whatever the contents; the next job of another file discards
    it)."""
    from kp.box import start as boxstart

    opts = dict(job.opts)
    boxstart.start_early(
        job.ref, job.candidate, boxed=opts.get("sandbox", True), later=True, cuda=opts.get("device") != "cpu"
    )


_NOTHING = object()  # _first_job: no job came


def _first_job(conn):
    """A new slot's first job, read as soon as it is sent, its box started at once (_start_box_for): in a warm batch
    the first jobs' boxes were started only after the slots' own start, and their jobs' verdicts came 25 s after
    the batch began, 15 s of it each first job's setup, mostly its box starting. _NOTHING where no job came within
    FIRST_JOB_WAIT_S (the slot then starts as before); None where the batch is gone or asks the slot to end."""
    try:
        if not conn.poll(FIRST_JOB_WAIT_S):
            return _NOTHING
        msg = conn.recv()
    except (EOFError, OSError):
        return None
    if isinstance(msg, tuple) and msg[0].candidate:
        _start_box_for(msg[0])
    return msg


def _slot_main(
    conn, gpu: str | None, log_path: str | None, forkserver_too: bool, job_first: bool = False, command=None
) -> None:
    """A slot: its own process group (so the judge, its forkserver and the candidate's worker die together), pinned
    to one GPU before CUDA starts; runs the jobs it is sent, one at a time. job_first: its first job is sent as it
    starts (a batch's slot): that job's box is started before the slot's own imports (_first_job). command: what
    runs a warm judge's command line (kp.command.warm_command), in a warm judge's slot."""
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
    first = _first_job(conn) if job_first else _NOTHING
    _warm_up(forkserver_too)
    import torch
    from kp.lib import gpu_lock
    from kp.box import builds

    for waits in (gpu_lock.GPU_WAITS, builds.OFF_THE_CLOCK):  # for the GPU, for a build ahead: not the job's time
        waits.append(lambda seconds: conn.send({"waited": seconds}))
    gpu_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    while True:
        if first is not _NOTHING:
            msg, first = first, _NOTHING
        else:
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
            say = lambda text: conn.send({"say": text})
            res = (
                command(msg, say)
                if command
                else {"rc": 2, "stdout": "", "stderr": "error: this slot runs jobs, not command lines\n"}
            )
        else:
            job, ahead, spare = msg
            if log_path:  # a batch's slot log: where one job's output ends and the next's begins (a session's
                print(f"=== {job.name}", flush=True)  # slot writes to its caller's stdout: nothing of its own)
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
