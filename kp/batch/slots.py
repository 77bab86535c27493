"""Many judgements at once. A *job* is one reference with one candidate (judged exactly as `run.py --candidate`
judges it) or a built-in problem's own ladder (as `run.py --problem` runs it). Jobs run in slot processes, one per
GPU of this host (pinned with CUDA_VISIBLE_DEVICES, one job at a time, so no two timings share a GPU), or as Ray tasks
that each ask for one GPU. A slot is its own process group: a job that hangs past its time limit, or whose process
dies, is recorded with that reason, the group is killed (the candidate's worker with it) and a fresh slot takes the
GPU. Each finished job is appended to a JSON-lines file at once; a re-run skips the jobs recorded there for the same
file contents and options.
"""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections import deque
from pathlib import Path

from kp.errors import UsageError, first_line
from kp.judge.runners import exit_status, start_without_main
from kp.judge.worker import JOB_TIMEOUT_S
from kp.batch.ahead import build_ahead_of_slots
from kp.batch.jobfile import Job, append_result, read_results, summary, with_reference_seeds
from kp.lib.registry import ROOT

DEFAULT_TIMEOUT_S = JOB_TIMEOUT_S  # per job: a cold build of every kernel it uses, parity and timing fit well inside
KILL_GRACE_S = 30  # the judge itself rejects a job at its limit, naming the stage; past this grace the slot is killed
STARTUP_S = 120  # a slot's own start (imports) before its first job; not charged to the job


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
            variants = judge.default_variants(ref.problem)
            if opts.get("device") != "cpu":
                prebuild(ref.problem, variants)
        rec = judge.evaluate(ref, job.candidate, variants, log=log.append, **opts)
        line = report.verdict(rec) if job.candidate else \
            ("ok" if rec["ok"] else "rejected: " + "; ".join(f"{k}: {r['reason']}" for k, r in rec["rows"].items()
                                                               if not r["accepted"] and not r["peer"]))
        out = {"ok": bool(rec["ok"]), "verdict": line, "record": rec, "table": report.format_record(rec)}
    except (UsageError, KernelBuildError) as e:
        out = {"ok": False, "verdict": f"error: {first_line(e)}", "record": None}
    except Exception as e:  # a bug of the judge's own, not the candidate's: said as such
        out = {"ok": False, "verdict": f"error: the judge raised {type(e).__name__}: {first_line(e)}",
               "record": None, "traceback": traceback.format_exc()}
    out.update(log=log, elapsed_s=round(time.perf_counter() - t0, 1))
    return out


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
    gpu_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        # the job's clock starts now, not while the slot was starting up; the GPU's name stays with a job the slot
        # does not finish (killed at its time limit, or dead)
        conn.send({"started": True, "gpu_name": gpu_name})
        print(f"=== {job.name}", flush=True)
        res = run_job(job)
        res["gpu_name"] = gpu_name
        conn.send(res)


class Slot:
    """One slot process and the job it runs; `poll` turns its answer, its death or its time running out into a
    result, and a fresh process replaces a dead or killed one."""

    def __init__(self, gpu: str | None, log_path: str | None, forkserver_too: bool = True):
        self.gpu, self.log_path, self.forkserver_too = gpu, log_path, forkserver_too
        self.job: Job | None = None
        self.key: str | None = None
        self.t0, self.started, self.gpu_name = 0.0, False, None
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

    def submit(self, job: Job, key: str | None = None) -> None:
        self.job, self.key, self.t0, self.started = job, key, time.monotonic(), False
        self.conn.send(job)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.kill()
        self.proc.join(10)

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
        res.setdefault("elapsed_s", round(time.monotonic() - self.t0, 1))
        res.setdefault("gpu_name", self.gpu_name)
        self.job = None
        return res

    def close(self) -> None:
        try:
            self.conn.send(None)
            self.proc.join(10)
        except (OSError, BrokenPipeError):
            pass
        if self.proc.is_alive():
            self.kill()


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


# ---------------------------------------------------------------------------------------------------------------
# Backends: the slots of this host, or a Ray cluster.

def gpu_list(spec: str) -> list[str]:
    """'all' -> every visible GPU; '0,1' -> those; a number N -> the first N."""
    import torch
    n = torch.cuda.device_count()
    if spec == "all":
        ids = [str(i) for i in range(n)]
    elif spec.isdigit() and "," not in spec and int(spec) > 0 and spec != "0":
        ids = [str(i) for i in range(int(spec))]
    else:
        ids = [s.strip() for s in spec.split(",") if s.strip()]
    if not ids:
        raise UsageError("--gpus: no GPU visible")
    bad = [i for i in ids if not i.isdigit() or int(i) >= n]
    if bad:
        raise UsageError(f"--gpus: no GPU {', '.join(bad)} here ({n} visible)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:  # indices are of the visible devices; slots pin the real ones
        real = [v.strip() for v in visible.split(",")]
        ids = [real[int(i)] for i in ids]
    return ids


class _NoBar:
    def __init__(self, **_):
        pass

    def write(self, line, file=None):
        print(line, file=file or sys.stderr, flush=True)

    def update(self, n):
        pass

    def set_postfix_str(self, s, refresh=False):
        pass

    def close(self):
        pass


class Progress:
    """A progress bar (tqdm) with accepted/rejected counts and what each slot is doing."""

    def __init__(self, total: int, enabled: bool = True):
        try:
            from tqdm import tqdm
        except ImportError:  # in requirements.txt; without it, the one line per finished job only
            enabled, tqdm = False, _NoBar
        # a bar on a terminal; elsewhere (a log, a pipe) only the one line per finished job
        self.bar = tqdm(total=total, unit="job", disable=None if enabled else True, dynamic_ncols=True,
                        file=sys.stderr)
        self.ok = self.bad = 0
        self.activity: dict[str, str] = {}

    def set(self, where: str, what: str) -> None:
        self.activity[where] = what
        self._post()

    def done(self, ok: bool, line: str) -> None:
        self.ok += ok
        self.bad += not ok
        self.bar.write(line, file=sys.stderr)
        self.bar.update(1)
        self._post()

    def _post(self) -> None:
        act = " ".join(f"[{k}: {v}]" for k, v in self.activity.items())
        self.bar.set_postfix_str(f"accepted {self.ok} rejected {self.bad} {act}", refresh=False)

    def close(self) -> None:
        self.bar.close()


def _record(out: Path | None, job: Job, key: str, res: dict, where: str, results: list, progress: Progress) -> None:
    line = {"key": key, "job": {"name": job.name, **job.as_dict()}, "gpu": where, "ok": res["ok"],
            "verdict": res["verdict"], "elapsed_s": res.get("elapsed_s"), "gpu_name": res.get("gpu_name"),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "summary": summary(res), "log": res.get("log", []), "record": res.get("record")}
    if res.get("traceback"):
        line["traceback"] = res["traceback"]
    if out is not None:
        append_result(out, line)
    results.append(line)
    progress.done(res["ok"], f"{where:>4}  {job.name}: {res['verdict']}")


def run_local(jobs: list[Job], gpus: list[str | None], out: Path | None, timeout_s: float = DEFAULT_TIMEOUT_S,
              progress: bool = True, log_dir: Path | None = None) -> list[dict]:
    """Every job on the slots of this host, one per entry of `gpus` (None: a CPU slot). Returns the result lines
    of this run (jobs already in `out` are skipped)."""
    todo, results = _todo(jobs, out)
    build_ahead_of_slots([job for job, _ in todo], gpus, timeout_s)
    bar = Progress(len(todo), progress)
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    forks = _forks_workers([job for job, _ in todo])
    slots = [Slot(g, str(log_dir / f"slot{i}.log") if log_dir else None, forks) for i, g in enumerate(gpus)]
    names = [f"gpu{g}" if g is not None else f"cpu{i}" for i, g in enumerate(gpus)]
    queue = deque(todo)
    try:
        while queue or any(s.job for s in slots):
            for s, name in zip(slots, names):
                if s.job is None and queue:
                    job, key = queue.popleft()
                    s.submit(job, key)
                    bar.set(name, job.name)
            time.sleep(0.2)
            for s, name in zip(slots, names):
                job, key = s.job, s.key
                res = s.poll(timeout_s)
                if res is not None:
                    _record(out, job, key, res, name, results, bar)
                    bar.set(name, "idle")
    finally:
        for s in slots:
            s.close()
        bar.close()
    return results


def run_ray(jobs: list[Job], address: str, out: Path | None, timeout_s: float = DEFAULT_TIMEOUT_S,
            progress: bool = True) -> list[dict]:
    """Every job as a Ray task asking for one GPU (one CPU for --device cpu jobs); each task runs the job in a fresh
    slot with the same time limit and death handling. Ray does the scheduling across hosts."""
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install ray") from None
    todo, results = _todo(jobs, out)
    if not todo:
        return results
    ray.init(address=None if address == "local" else address, ignore_reinit_error=True, include_dashboard=False,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    bar = Progress(len(todo), progress)
    tasks = {cpu: ray.remote(num_gpus=0 if cpu else 1, num_cpus=1, max_retries=0)(_ray_task) for cpu in (False, True)}
    pending = {tasks[dict(job.opts).get("device") == "cpu"].remote(job, timeout_s): (job, key) for job, key in todo}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in done:
                job, key = pending.pop(ref)
                try:
                    res, where = ray.get(ref)
                except Exception as e:  # the task's own process died (the job's slot would have said why)
                    res, where = {"ok": False, "verdict": f"rejected: ray task failed: {type(e).__name__}: "
                                                          f"{first_line(e)}", "record": None}, "ray"
                _record(out, job, key, res, where, results, bar)
    finally:
        bar.close()
    return results


def _ray_task(job: Job, timeout_s: float):
    import socket
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")  # what Ray gave this task
    where = f"{socket.gethostname()}:{gpus}" if gpus else socket.gethostname()
    return isolated_job(job, timeout_s, gpus or None), where


def _todo(jobs: list[Job], out: Path | None) -> tuple[list[tuple[Job, str]], list[dict]]:
    earlier = read_results(out) if out is not None else []
    done = {d["key"] for d in earlier}
    todo, seen = [], set()
    for job in jobs:
        key = job.key()
        if key in done or key in seen:
            continue
        seen.add(key)
        todo.append((job, key))
    todo = list(zip(with_reference_seeds([job for job, _ in todo], earlier), [key for _, key in todo]))
    if out is not None and len(todo) < len(jobs):
        print(f"[kp] {out}: {len(jobs) - len(todo)} of {len(jobs)} jobs already recorded, {len(todo)} to run",
              file=sys.stderr, flush=True)
    return todo, []
