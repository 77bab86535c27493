"""Candidates' own extensions built before many jobs are judged, over the host's cores.

A candidate that calls torch's `load_inline` or `load` compiles its extension when its file is imported: about 80
CPU-seconds for the usual pair of sources that include `torch/extension.h`. In a batch each slot judges one job at a
time, so with one slot per GPU those builds would queue behind each other while most of the host's cores sit idle.
Here every such candidate is imported once beforehand, as the judge's import stage imports it (the same box, the
same build folder kept per file contents, the same device, the same GPUs visible), several at a time; the judging's
import then loads the build. A failure here is left for the judging to report: an import that raises here raises
there, with its reason. A candidate a build ahead has imported cleanly before (its cache folder's mark, BUILT) is
not imported again: on a corpus judged a second time its 200 imports, 16 at a time, took 270 s of the cores beside
the slots for builds that were all there.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kp.batch.jobfile import Job
from kp.errors import Rejected

MARKERS = (b"cpp_extension", b"load_inline")  # what a file that builds its own extension mentions
LIMITS_MOST = 3  # a build ahead's limit: the job's once per extension the file builds, up to this many (build_ahead)


def own_sources(path: str | Path) -> list[bytes]:
    """The candidate file's text and that of every module of its own folder it imports, and they import, each once:
    a candidate that keeps its `load_inline` in a helper beside it builds at its import as one that holds the call
    (five judge cases sharing one such helper each built their extension inside their job, 35 s a slot, where the
    builds ahead would have taken them). Read as text, never imported; a file that does not parse gives its own
    text alone."""
    import ast

    path = Path(path)
    home, out, seen, todo = path.parent, [], {path.resolve()}, [path]
    while todo:
        f = todo.pop()
        try:
            src = f.read_bytes()
        except OSError:
            continue
        out.append(src)
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError):
            continue
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and n.level <= 1]
        for name in names:
            first = home / name.split(".")[0]
            for mod in (first.with_suffix(".py"), first / "__init__.py"):
                if mod.is_file() and mod.resolve() not in seen:
                    seen.add(mod.resolve())
                    todo.append(mod)
    return out


def builds_own_extension(path: str | Path) -> bool:
    return any(m in src for src in own_sources(path) for m in MARKERS)


# the calls that start a build: load_inline(...), cpp_extension.load(...), or load(...) where the file imports it
_INLINE = re.compile(rb"\bload_inline\s*\(")
_LOAD = re.compile(rb"\bcpp_extension\.load\s*\(")
_BARE = re.compile(rb"(?<![\w.])load\s*\(")
_IMPORTS_LOAD = re.compile(rb"from\s+torch\.utils\.cpp_extension\s+import[^\n]*\bload\b(?!_)")


def builds_in(path: str | Path) -> int:
    """How many extensions a candidate file builds, as its text and its own helpers' say (`own_sources`; at least
    one): the calls that start a build.
    A file's builds run one after another in its import, so a file of three takes about three times one's time;
    started last, it alone would hold up the batch's end (a level 3 candidate with two builds began its second
    round 90 s in and ended 180 s after the others)."""
    n = 0
    for src in own_sources(path):  # the file and its own helpers beside it
        n += len(_INLINE.findall(src)) + len(_LOAD.findall(src))
        if _IMPORTS_LOAD.search(src):
            n += len(_BARE.findall(src))
    return max(1, n)


def schedule(jobs: list[Job], procs: int) -> tuple[list[Job], dict[str, float]]:
    """The order to start the builds of `jobs` (one per candidate) on `procs` builders, and when each is expected
    to end, in units of one build: the longest first (a file's builds counted by `builds_in`), each on the
    builder free first. Longest first keeps a long file from starting in the last round; the expected ends order
    the judging, so a slot meets the candidates as their builds end."""
    cost = {j.candidate: builds_in(j.candidate) for j in jobs}
    order = sorted(jobs, key=lambda j: -cost[j.candidate])  # stable: ties keep the batch's order
    free = [0.0] * max(1, procs)
    ends = {}
    for j in order:
        start = heapq.heappop(free)
        ends[j.candidate] = start + cost[j.candidate]
        heapq.heappush(free, ends[j.candidate])
    return order, ends


def own_builders(jobs: list[Job]) -> list[Job]:
    """One job per candidate file that builds its own extension."""
    seen, out = set(), []
    for job in jobs:
        if job.candidate and job.candidate not in seen and builds_own_extension(job.candidate):
            seen.add(job.candidate)
            out.append(job)
    return out


def built_before(path: str | Path) -> bool:
    """Whether a build ahead imported this candidate file (these contents, this torch) cleanly before."""
    from kp.box.builds import BUILT, candidate_build_dir

    return (candidate_build_dir(path) / BUILT).exists()


def own_and_unbuilt(jobs: list[Job]) -> tuple[list[Job], list[Job]]:
    """`own_builders`, and those of them no build ahead imported cleanly before."""
    own = own_builders(jobs)
    return own, [j for j in own if not built_before(j.candidate)]


def to_build(jobs: list[Job]) -> list[Job]:
    """`own_builders` less those a build ahead imported cleanly before."""
    return own_and_unbuilt(jobs)[1]


def worth_it(jobs: list[Job], slots: int, procs: int) -> list[Job]:
    """The jobs whose candidates to build ahead (`to_build`): none unless there are more of them than slots and
    more builders than slots (otherwise the slots build as fast themselves)."""
    return enough(to_build(jobs), slots, procs)


def enough(todo: list[Job], slots: int, procs: int) -> list[Job]:
    """`todo` where building it ahead is worth it (`worth_it`), else none."""
    return todo if len(todo) > slots and procs > slots else []


def build_one(job: Job, timeout_s: float) -> str | None:
    """One candidate's builds, wherever it starts them (the worker's prebuild command: its import, then its ModelNew
    built and called on the meta device), in the box its judging uses, with the GPUs visible (torch reads them for its
    architecture flags) but no CUDA context made, so a hundred builds beside the slots take none of a GPU's memory.
    None, or why it did not import. Where it imported and its builds were put back, its cache folder is marked (BUILT)
    for later batches."""
    from kp.box import sandbox
    from kp.box.builds import BUILDING, BUILT, candidate_build_dir
    from kp.judge.runners import candidate_runner

    opts = dict(job.opts)
    try:  # a slot whose job reaches the candidate meanwhile waits for this build (kp.box.start.Box.lend)
        mark = candidate_build_dir(job.candidate) / BUILDING
        mark.write_text(str(os.getpid()))
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    try:
        why, kept = _build_in_box(job, opts, timeout_s, sandbox, candidate_runner)
        if why is None and kept:
            (mark.parent / BUILT).write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        return why
    finally:
        mark.unlink(missing_ok=True)


def _build_in_box(job: Job, opts: dict, timeout_s: float, sandbox, candidate_runner) -> tuple[str | None, bool]:
    """(None, or why it did not import; whether what it built is in its cache folder now)."""
    try:
        runner = candidate_runner(
            job.ref,
            job.candidate,
            "cpu",
            opts.get("precision") or "fp32",
            lambda msg: False,
            boxed=sandbox.choice(opts.get("sandbox", True))[0],
            train=opts.get("mode", "train") == "train",
            deadline=time.monotonic() + timeout_s,
            limit_s=timeout_s,
        )
    except Exception as e:
        return f"{type(e).__name__}: {e}", False
    why = None
    try:
        runner.call("import", "prebuild", str(Path(job.candidate).resolve()))
    except Rejected as e:
        why = str(e)
    finally:
        runner.close()
    return why, getattr(runner.proc, "keep_builds", True)  # a box's builds go back only where its worker quit cleanly


def build_ahead(jobs: list[Job], procs: int, timeout_s: float, log=print) -> dict[str, str | None]:
    """Import every job's candidate, `procs` at a time; returns per candidate file None or why it failed. Each may
    take `timeout_s` per extension it builds (`builds_in`): a file's builds run one after another, and beside a
    core's worth of others each takes longer than alone (a file of three took over 300 s on a host building 32 at
    once; stopped, its builds were lost and its jobs built them again inside their own time). At most LIMITS_MOST
    limits: a job waits for its build ahead off its own clock, so a file that hangs at import keeps its slot for
    these limits and then its own."""
    if not jobs:
        return {}
    from kp.batch.usage import CpuUse
    from kp.box import pch

    t0, cpu = time.perf_counter(), CpuUse()
    try:  # torch's header precompiled beside the first builds, for all that start after it is there
        pch.start(pch.variants(j.candidate for j in jobs))
    except OSError as e:
        log(f"[kp] torch's header not precompiled ({type(e).__name__}: {e}): the builds parse it each")
    log(f"[kp] building {len(jobs)} candidates' own extensions ahead of judging, {procs} at a time")
    with ThreadPoolExecutor(max_workers=procs) as pool:
        res = dict(
            zip(
                (j.candidate for j in jobs),
                pool.map(lambda j: build_one(j, timeout_s * min(builds_in(j.candidate), LIMITS_MOST)), jobs),
            )
        )
    bad = sum(v is not None for v in res.values())
    busy = cpu.busy()  # near 100%: the builds are bound by the cores (with the slots' judging beside them)
    log(
        f"[kp] built ahead in {time.perf_counter() - t0:.0f} s"
        + (f", its {len(cpu.cores)} cores {100 * busy:.0f}% busy meanwhile" if busy is not None else "")
        + (f"; {bad} did not import (the judging says why)" if bad else "")
    )
    return res


def builders() -> int:
    """How many candidates build at once: one per core this process may use. A build runs two compilers only for
    its first quarter (g++ on main.cpp beside nvcc on cuda.cu, whose steps run one after another), so half the cores'
    worth left cores idle: on two cores, two leaderboard candidates built one at a time took 116 s, both at once 85 s.
    The builds run at a lower priority than the slots' judging (kp.worker.setup.BUILD_AHEAD_NICE)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return max(1, n)


def build_ahead_of_slots(jobs: list[Job], gpus: list[str | None], timeout_s: float, procs: int | None = None):
    """A batch's builds ahead, where worth it (`worth_it`), beside the slots' judging from its start: a background
    thread builds `procs` at a time, longest first, and the slots meet the candidates as their builds are expected to
    end (`schedule`); a slot that reaches one still building waits for that build (the mark build_one leaves in its
    cache folder, kp.box.start.Box.lend), never builds it twice. The GPUs visible to the builds are the first
    slot's (the kind the builds target: torch reads them for its architecture flags).
    Returns the jobs in the order to judge them (the candidates that build nothing first, so the builds get ahead)
    and the thread (join it to wait for the builds). procs: builds at once (None: `builders`)."""
    procs = procs or builders()
    own, todo = own_and_unbuilt(jobs)
    ahead = enough(todo, len(gpus), procs)
    found = len(own) - len(todo)
    if found:
        print(
            f"[kp] {found} candidates' own extensions found built by an earlier batch: not built ahead again",
            file=sys.stderr,
            flush=True,
        )
    if not ahead:
        return jobs, None
    import threading

    starts, ends = schedule(ahead, procs)
    # the candidates that build nothing first, then the rest as their builds are expected to end
    order = [j for j in jobs if j.candidate not in ends] + sorted(
        (j for j in jobs if j.candidate in ends), key=lambda j: ends[j.candidate]
    )
    env = {"CUDA_VISIBLE_DEVICES": gpus[0]} if gpus[0] is not None else {}

    def run() -> None:
        with _environment(env):
            build_ahead(starts, procs, timeout_s, log=lambda s: print(s, file=sys.stderr, flush=True))

    thread = threading.Thread(target=run, name="kp-build-ahead", daemon=True)
    thread.start()
    return order, thread


@contextlib.contextmanager
def _environment(env: dict):
    """os.environ with `env` set, for the builds' boxes (each takes the environment at its start); the slots set
    their own GPU in their own processes."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
