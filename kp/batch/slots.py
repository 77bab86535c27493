"""Many judgements at once: the slot a job runs in. A *job* is one reference with one candidate (judged exactly as
`run.py --candidate` judges it) or a built-in problem's own ladder (as `run.py --problem` runs it). A slot is a
process of its own pinned to one GPU (CUDA_VISIBLE_DEVICES) that runs one job at a time, and its own process group:
a job that hangs past its time limit, or whose process dies, gets that reason, the group is killed (the candidate's
worker with it) and a fresh slot takes the GPU. Here the batch's side of a slot; what runs in its process is
kp.batch.slot_process's. Which slots run which jobs, and the results file, are kp.batch.backends'.
"""

from __future__ import annotations

import os
import signal
import time

from kp.errors import NO_VERDICT, REJECTED, failure_record
from kp.judge.runners import exit_status, start_without_main
from kp.judge.options import JOB_TIMEOUT_S
from kp.batch.jobfile import Job
from kp.batch.slot_process import _slot_main

DEFAULT_TIMEOUT_S = JOB_TIMEOUT_S  # per job: a cold build of every kernel it uses, parity and timing fit well inside
KILL_GRACE_S = 30  # the judge itself rejects a job at its limit, naming the stage; past this grace the slot is killed
STARTUP_S = 120  # a slot's own start (imports) before its first job; not charged to the job
END_WAIT_S = 10.0  # how long slots asked to end (or killed) are waited for, all of them together


def _forks_workers(jobs: list[Job]) -> bool:
    """Whether any job judges a candidate outside the sandbox, in a worker forked from the forkserver (a boxed
    candidate gets a fresh interpreter; a ladder job judges in the slot itself)."""
    from kp.box import sandbox

    return any(j.candidate and not sandbox.choice(dict(j.opts).get("sandbox", True))[0] for j in jobs)


class Slot:
    """One slot process and the job it runs; `poll` turns its answer, its death or its time running out into a
    result, and a fresh process replaces a dead or killed one."""

    def __init__(
        self,
        gpu: str | None,
        log_path: str | None,
        forkserver_too: bool = True,
        job_first: bool = False,
        main=_slot_main,
    ):
        """job_first: a job is submitted as soon as the slot is made, and again as soon as a fresh process replaces a
        dead or killed one (a batch's slots), so the slot's process starts that job's box before its own imports
        (kp.batch.slot_process)."""
        self.gpu, self.log_path, self.forkserver_too = gpu, log_path, forkserver_too
        self.main = main  # the slot process's function (a warm judge's runs command lines: kp.command)
        self.job_first = job_first
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
        self.proc = ctx.Process(
            target=self.main, args=(child, self.gpu, self.log_path, self.forkserver_too, self.job_first)
        )
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
                # for other judges on its GPU, for its build ahead: the limit moves with it, as the judge's does
                elif "waited" in res:
                    self.t0, self.waited, res = self.t0 + res["waited"], self.waited + res["waited"], None
        except (EOFError, OSError):
            pass
        if res is None and not self.proc.is_alive():
            self.proc.join(1)
            # killed from outside (the host's memory, most likely), or a fault below Python in the judge's own
            # process: no verdict on the candidate, whose own process is a worker apart
            res = {
                "ok": False,
                "status": NO_VERDICT,
                "died": exit_status(self.proc.exitcode),
                "verdict": f"error: the judge's process died ({exit_status(self.proc.exitcode)})",
                "record": None,
            }
            self.kill()
            self._start()
        elif res is None and time.monotonic() - self.t0 > timeout_s + KILL_GRACE_S + (0 if self.started else STARTUP_S):
            self.kill()
            res = {
                "ok": False,
                "verdict": f"rejected: timeout after {timeout_s:.0f} s (the job was killed from "
                f"outside: its judge reached no verdict {KILL_GRACE_S} s past the limit)",
                "status": REJECTED,
                "failure": failure_record("timeout"),
                "record": None,
            }
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
    slot = Slot(gpu, None, _forks_workers([job]), job_first=True)
    try:
        slot.submit(job)
        while True:
            res = slot.poll(timeout_s)
            if res is not None:
                return res
            time.sleep(0.2)
    finally:
        slot.close()
