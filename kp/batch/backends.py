"""Where a batch's jobs run: the slots of this host (kp.batch.slots), one or more per GPU, or Ray tasks that each
ask for one GPU; the progress bar, and each finished job appended to the results file at once."""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from pathlib import Path

from kp.errors import ACCEPTED, EXIT_CODES, NO_VERDICT, REJECTED, STATUSES, UsageError, first_line, stop_signal
from kp.batch.ahead import build_ahead_of_slots
from kp.batch.gpus import cpu_slot_list, slot_list
from kp.batch import jobfile
from kp.judge.options import JudgeOptions
from kp.batch.jobfile import Job, append_result, read_results, summary, with_reference_seeds
from kp.batch.slots import DEFAULT_TIMEOUT_S, Slot, _forks_workers, end_all, isolated_job
from kp.batch.usage import CpuUse, GpuUse
from kp.lib.registry import ROOT


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
        self.bar = tqdm(total=total, unit="job", disable=None if enabled else True, dynamic_ncols=True, file=sys.stderr)
        self.counts = dict.fromkeys(STATUSES, 0)
        self.activity: dict[str, str] = {}

    def set(self, where: str, what: str) -> None:
        self.activity[where] = what
        self._post()

    def done(self, status: str, line: str) -> None:
        self.counts[status] += 1
        self.bar.write(line, file=sys.stderr)
        self.bar.update(1)
        self._post()

    def _post(self) -> None:
        act = " ".join(f"[{k}: {v}]" for k, v in self.activity.items())
        said = " ".join(f"{k.replace('_', ' ')} {n}" for k, n in self.counts.items() if n or k != NO_VERDICT)
        self.bar.set_postfix_str(f"{said} {act}", refresh=False)

    def close(self) -> None:
        self.bar.close()


def short_verdict(line: dict) -> str:
    """A result as the progress line says it while the batch runs: its status, what failed (the check's label, else
    its stage, and the failure's kind) and the job's seconds; the whole verdict is in the table at the end and in
    the results file."""
    status, failure = jobfile.status_of(line), line.get("failure") or {}
    secs = f" in {line['elapsed_s']:.1f} s" if isinstance(line.get("elapsed_s"), (int, float)) else ""
    if status == ACCEPTED:
        return f"accepted{secs}"
    if status == NO_VERDICT:
        return f"{jobfile.said_verdict(line)[:102]}{secs}"
    where = failure.get("check") or failure.get("stage")
    kind = failure.get("kind")
    said = f"{where} ({kind})" if where and kind else where or kind or "rejected"
    return f"rejected: {said[:100]}{secs}"


def _record(
    out: Path | None,
    job: Job,
    key: str,
    res: dict,
    where: str,
    results: list,
    progress: Progress,
    twins: dict | None = None,
) -> None:
    """The job's result line, written to `out` at once; then one for each file of the run identical to it (same
    contents and options: `twins`), the same verdict with `same_as` naming the file judged."""
    status = jobfile.status_of(res)
    failure = (res.get("record") or {}).get("failure") or res.get("failure")
    line = {
        "key": key,
        "job": {"name": job.name, **job.as_dict()},
        "gpu": where,
        "status": status,
        "failure": failure,
        "ok": res["ok"],
        "verdict": res["verdict"],
        "elapsed_s": res.get("elapsed_s"),
        "gpu_name": res.get("gpu_name"),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "summary": summary(res),
        "log": res.get("log", []),
        "record": res.get("record"),
    }
    # slot_broken: the job left its slot's GPU context unusable (restarted); gpu_memory: no verdict for want of GPU
    # memory (kp.errors.GpuMemoryShort), the same job may get one with the GPU to itself
    for k in ("traceback", "slot_broken", "gpu_memory"):
        if res.get(k):
            line[k] = res[k]
    if out is not None:
        append_result(out, line)
    results.append(line)
    progress.done(status, f"{where:>4}  {job.name}: {short_verdict(line)}")
    for twin in (twins or {}).pop(key, []):
        copy = {**line, "job": {"name": twin.name, **twin.as_dict()}, "same_as": job.name}
        if out is not None:
            append_result(out, copy)
        results.append(copy)


def throughput(results: list[dict], wall_s: float, slots: int | None) -> str:
    """What a user plans with: the verdicts this run gave, per hour, and how busy its slots were (slots: None on
    Ray, whose tasks are not this host's slots)."""
    results = [d for d in results if not d.get("same_as")]  # a copy for an identical file was not judged again
    n = len(results)
    busy = sum(float(d.get("elapsed_s") or 0.0) for d in results)
    per_hour = n / wall_s * 3600 if wall_s > 0 else 0.0
    if not slots:
        return f"{n} verdicts in {wall_s:.0f} s: {per_hour:.0f} verdicts per hour"
    return (
        f"{n} verdicts in {wall_s:.0f} s: {per_hour:.0f} verdicts per hour on {slots} slot{'s' * (slots != 1)}; "
        f"the slots were judging {100 * busy / max(wall_s * slots, 1e-9):.0f}% of the time"
    )


SANITIZE_WEIGHT = 4  # a --sanitize job's judging against a plain one's: four tools' passes of its calls beside parity


def judging_weight(job: Job) -> int:
    """How long a job's judging is expected to take against a plain job's: the batch starts the heaviest first
    (stable among equals), the longest-first rule, so that its end waits on no long job begun last: in the GPU
    suite's batch on one H100 the six --sanitize jobs took 21-62 s each where most others took 1-15 s."""
    return SANITIZE_WEIGHT if dict(job.opts).get("sanitize") else 1


def run_local(
    jobs: list[Job],
    gpus: list[str | None],
    out: Path | None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: bool = True,
    log_dir: Path | None = None,
    build_jobs: int | None = None,
    before_slots=None,
) -> list[dict]:
    """Every job on the slots of this host, one per entry of `gpus` (None: a CPU slot). Returns the result lines
    of this run (jobs already in `out` are skipped). build_jobs: candidates built ahead at once (None: one per core,
    kp.batch.ahead.builders). A job that got no verdict for want of GPU memory (beside the
    GPU's other slots, the boxes its slot started ahead, or other processes) is judged once more at the end, with its
    GPU to itself, and recorded then; so is one whose judge's process died (killed from outside: the host's memory,
    most likely), with its GPU (or the host's CPU) to itself. before_slots: called once the candidates' builds
    ahead have begun and before any slot starts, for a caller whose slots need something not there yet (the GPU
    suite's batch waits there for the playground's kernels while its candidates build)."""
    todo, results, twins = _todo(jobs, out)
    todo = sorted(todo, key=lambda jk: -judging_weight(jk[0]))  # stable: the batch's order among equals
    keyed = {id(job): (job, key) for job, key in todo}
    # the candidates' own builds, beside the slots from the start
    order, builds = build_ahead_of_slots([job for job, _ in todo], gpus, timeout_s, procs=build_jobs)
    todo = [keyed[id(job)] for job in order]
    if before_slots is not None:  # what the slots need and is not there yet, waited for while the candidates build
        before_slots()
    bar = Progress(len(todo), progress)
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    forks = _forks_workers([job for job, _ in todo])
    slots = [
        Slot(g, str(log_dir / f"slot{i}.log") if log_dir else None, forks, job_first=i < len(todo))
        for i, g in enumerate(gpus)
    ]
    names = [f"gpu{g}" if g is not None else f"cpu{i}" for i, g in enumerate(gpus)]
    shared = {g for g in gpus if g is not None and gpus.count(g) > 1}
    again: list[tuple[Job, str]] = []

    def record(slot: Slot, name: str, job: Job, key: str, res: dict) -> None:
        _record(out, job, key, res, name, results, bar, twins)

    def first_try(slot: Slot, name: str, job: Job, key: str, res: dict) -> None:
        # A GPU of its own slot is shared too: with the boxes the slot starts ahead for its next jobs
        if res.get("gpu_memory") and slot.gpu is not None:
            again.append((job, key))
            bar.bar.write(
                f"{name:>4}  {job.name}: no verdict for want of GPU memory beside other "
                f"{'slots' if slot.gpu in shared else 'processes'}; judged again at the end with the GPU to "
                f"itself",
                file=sys.stderr,
            )
        elif res.get("died") and len(slots) > 1:  # killed from outside (the host's memory, most likely): no verdict
            again.append((job, key))
            bar.bar.write(
                f"{name:>4}  {job.name}: no verdict: the judge's process died ({res['died']}); judged "
                f"again at the end, alone",
                file=sys.stderr,
            )
        else:
            record(slot, name, job, key, res)

    try:
        _drain(deque(todo), list(zip(slots, names)), timeout_s, bar, first_try)
        if again:
            alone = {}
            for s, name in zip(slots, names):
                alone.setdefault(s.gpu, (s, name))
            # The GPU to itself: the other slots of its GPU go (idle, two slots held 76 of an H100's 80 GiB: what
            # their last jobs left in their allocators, their CUDA contexts, the boxes they had started ahead), and
            # no box is started ahead meanwhile (boxes' CUDA contexts took the 2.8 GiB a softmax job found missing
            # mid-run).
            kept = {id(s) for s, _ in alone.values()}
            end_all([s for s in slots if id(s) not in kept])
            _drain(deque(again), list(alone.values()), timeout_s, bar, record, most=0)
        if builds is not None:
            builds.join()
    except KeyboardInterrupt as e:  # Ctrl-C, or a time limit's signal: the jobs judged so far are what the run gave
        end_all(slots, kill=True)
        raise Interrupted(results, stop_signal(e)) from None
    finally:
        end_all(slots)
        bar.close()
    return results


class Interrupted(Exception):
    """A batch stopped from outside (SIGINT, SIGTERM: `signum`): `results`, the jobs it judged before; the slots are
    gone."""

    def __init__(self, results: list[dict], signum: int):
        super().__init__(f"interrupted after {len(results)} verdicts")
        self.results, self.signum = results, signum


# jobs a slot holds beyond the one it runs, their boxes started (torch imported, CUDA's context made): a box takes about
# 5-7 s to be ready on a busy host and a small job 1-2 s, so one is not enough
AHEAD_MOST = 3


def ahead(slots: int) -> int:
    """Boxes a slot starts ahead: up to AHEAD_MOST, one per two cores the slot has to itself (each box's start is
    about 3 CPU-seconds of imports, run beside the job being judged), at least one."""
    return max(1, min(AHEAD_MOST, (os.cpu_count() or 1) // (2 * max(slots, 1))))


def _drain(
    queue: deque,
    slots: list[tuple[Slot, str]],
    timeout_s: float,
    bar: Progress,
    finished,
    most: int | None = None,
    spare: bool = False,
) -> None:
    """Run the queue's jobs on these slots until every one has finished; finished(slot, name, job, key, result).
    most: jobs a slot holds ahead, their boxes started (None: ahead(), by the cores). spare: a slot left with no
    job ahead starts a box for the file it just judged, and a job goes first to the slot that judged its file last
    (a search loop's session: its next version of a file finds a box ready)."""
    most = ahead(len(slots)) if most is None else most
    while queue or any(s.job or s.reserved for s, _ in slots):
        head = queue[0][0].candidate if queue and spare else None
        for s, name in sorted(slots, key=lambda sn: head is None or sn[0].last_candidate != head):
            if s.job is not None:
                continue
            if s.reserved:
                nxt = s.reserved.pop(0)
            elif queue:
                nxt = queue.popleft()
            else:  # the queue is empty: another slot's last next job, rather than waiting for that slot
                other = max((o for o, _ in slots if o.reserved), key=lambda o: len(o.reserved), default=None)
                if other is None:
                    continue
                nxt = other.reserved.pop()
            # each slot holds its next jobs, so that their boxes start while this one runs (kp.batch.slots)
            while queue and len(s.reserved) < most:
                s.reserved.append(queue.popleft())
            s.submit(*nxt, ahead=[j for j, _ in s.reserved], spare=spare)
            bar.set(name, nxt[0].name)
        time.sleep(0.2)
        for s, name in slots:
            job, key = s.job, s.key
            res = s.poll(timeout_s)
            if res is not None:
                finished(s, name, job, key, res)
                bar.set(name, "idle")


def run_ray(
    jobs: list[Job], address: str, out: Path | None, timeout_s: float = DEFAULT_TIMEOUT_S, progress: bool = True
) -> list[dict]:
    """Every job as a Ray task asking for one GPU (one CPU for --device cpu jobs); each task runs the job in a fresh
    slot with the same time limit and death handling. Ray does the scheduling across hosts."""
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install ray") from None
    todo, results, twins = _todo(jobs, out)
    if not todo:
        return results
    ray.init(
        address=None if address == "local" else address,
        ignore_reinit_error=True,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
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
                    res, where = (
                        {
                            "ok": False,
                            "status": NO_VERDICT,
                            "verdict": f"error: ray task failed: {type(e).__name__}: {first_line(e)}",
                            "record": None,
                        },
                        "ray",
                    )
                _record(out, job, key, res, where, results, bar, twins)
    finally:
        bar.close()
    return results


def _ray_task(job: Job, timeout_s: float):
    import socket

    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")  # what Ray gave this task
    where = f"{socket.gethostname()}:{gpus}" if gpus else socket.gethostname()
    return isolated_job(job, timeout_s, gpus or None), where


def _todo(jobs: list[Job], out: Path | None) -> tuple[list[tuple[Job, str]], list[dict], dict]:
    """The jobs to judge, the lines written now for files identical to one already recorded, and the files
    identical to a job of this run (key -> jobs: recorded with its verdict when it has one, _record). A job is its
    contents and options (Job.key): identical files are judged once and recorded for each, said so."""
    earlier = read_results(out) if out is not None else []
    recorded = {(d["key"], (d.get("job") or {}).get("candidate")) for d in earlier}
    by_key = {d["key"]: d for d in earlier}
    todo, seen, twins, copies, already = [], set(), {}, [], 0
    for job in jobs:
        key = job.key()
        if (key, job.candidate) in recorded:
            already += 1
        elif key in by_key:  # identical to a file an earlier run judged: its verdict, recorded for this file too
            judged = by_key[key].get("same_as") or by_key[key]["job"]["name"]
            copy = {**by_key[key], "job": {"name": job.name, **job.as_dict()}, "same_as": judged}
            append_result(out, copy)
            copies.append(copy)
        elif key in seen:
            twins.setdefault(key, []).append(job)
        else:
            seen.add(key)
            todo.append((job, key))
    todo = list(zip(with_reference_seeds([job for job, _ in todo], earlier), [key for _, key in todo]))
    said = [
        f"{already} of {len(jobs)} jobs already recorded" if already else "",
        f"{len(copies) + sum(map(len, twins.values()))} identical to another file (judged once, recorded for each)"
        if copies or twins
        else "",
    ]
    if any(said):
        print(
            f"[kp] {out or 'jobs'}: {', '.join(x for x in said if x)}, {len(todo)} to run", file=sys.stderr, flush=True
        )
    return todo, copies, twins


def _own_results_file(out: Path):
    """One run writes a results file at a time: an OS lock on `<out>.lock` (released when the process ends, however
    it ends); a second run on the same file is refused at once, naming the first, rather than judging every job
    again beside it."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    f = open(out.with_name(out.name + ".lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        who = f.read().strip() or "another process"
        f.close()
        raise UsageError(f"{out} is being written by another run ({who}); wait for it to end, or give another --out")
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}")
    f.flush()
    return f


def run_batch(args, opts: JudgeOptions) -> int:
    """`run.py`'s many jobs (its parsed arguments and the judge's options): on the GPUs of this host (--gpus), on a
    Ray cluster (--ray), or one after another here; the table, the throughput line, the exit code."""
    if args.jobs:
        jobs = jobfile.read_job_file(args.jobs, opts)
    else:
        refs = [("file", args.ref)] if args.ref else [("problem", p) for p in args.problem]
        for c in args.candidate or []:
            if not Path(c).is_file():
                raise UsageError(f"candidate file {c!r} does not exist")
        jobs = [jobfile.make_job(r, c, opts) for r in refs for c in (args.candidate or [None])]
    out = Path(args.out) if args.out else None
    held = _own_results_file(out) if out is not None else None  # noqa: F841 (held until this function returns)
    timeout = opts.timeout_s or DEFAULT_TIMEOUT_S
    log_dir = out.with_name(out.name + ".logs") if out else None
    t0, stopped = time.perf_counter(), 0
    if args.ray:
        results = run_ray(jobs, args.ray, out, timeout)
        use, slots = None, None
    else:
        gpus = cpu_slot_list(args.slots) if args.device == "cpu" else slot_list(args.gpus or "1", args.slots)
        use, cpu, slots = GpuUse(gpus), CpuUse(), len(gpus)
        try:  # SIGINT and SIGTERM come as a KeyboardInterrupt (run.py: kp.errors.stopped_by_signals)
            results = run_local(jobs, gpus, out, timeout, log_dir=log_dir, build_jobs=args.build_jobs)
        except Interrupted as e:
            results, stopped = e.results, 128 + e.signum
    wall = time.perf_counter() - t0
    if out is not None:  # the table covers every job asked for, those recorded by an earlier run too
        keys = {j.key() for j in jobs}
        lines = [d for d in jobfile.read_results(out) if d["key"] in keys]
    else:
        lines = results
    print(jobfile.format_table(lines))
    if results:
        print(throughput(results, wall, slots) + (f"; {use.line()}; {cpu.line()}" if use else ""))
    if out is not None:
        print(f"records: {out}" + (f"; the judges' own output: {log_dir}/" if log_dir and log_dir.exists() else ""))
    if stopped:
        print(
            f"interrupted: {len(lines)} of {len(jobs)} jobs have a verdict"
            + ("; the same command again judges only the others" if out is not None else ""),
            file=sys.stderr,
        )
        return stopped
    return batch_exit_code([jobfile.status_of(d) for d in lines])


def batch_exit_code(statuses: list[str]) -> int:
    """A batch's exit code: 1 if a job was rejected, else 2 if one got no verdict (or none ran), else 0."""
    if REJECTED in statuses:
        return EXIT_CODES[REJECTED]
    return EXIT_CODES[NO_VERDICT] if NO_VERDICT in statuses or not statuses else EXIT_CODES[ACCEPTED]
