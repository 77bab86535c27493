"""Starting a candidate's boxed worker, without torch. The box's own start-up (bwrap, Python, torch's import:
about two seconds) is most of a small job's time to verdict, so the command line starts the box before it imports
torch itself (`start_early`), and the judge adopts it when it adds the candidate (`take`); a box that does not
match the job the judge then sets up is killed and a new one started here. What the box reads and writes and the
environment it gets are decided here once, early or not (kp.box.sandbox says how the box is made; kp.box.entry is its
entry point; kp.worker.loop talks to it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kp.box.builds import JIT_CACHE, alive, cache_root, copy_builds, seal_jit_cache, verify_jit_cache, wait_for_build

ROOT = Path(__file__).resolve().parents[2]
BOX_CWD = "/tmp/work"  # the candidate's working directory in the box: on its private /tmp, gone with the box
# the candidate's own extension builds in the box (its TORCH_EXTENSIONS_DIR): a folder of the box's own, lent the
# candidate's cached builds when its job takes the box
BOX_BUILDS = "/tmp/kp_builds"


class BoxProcess:
    """A boxed worker's process, with the part of multiprocessing.Process's interface the runner uses."""

    def __init__(self, popen, cgroup, builds: str | None = None):
        self.popen, self.cgroup = popen, cgroup
        self.builds = builds  # the box's own build folder (bound at BOX_BUILDS), or None
        self.home: Path | None = None  # the candidate's cached builds it was lent, where its builds go back
        self.keep_builds = True  # False: its worker did not end its job cleanly, what it built is not kept

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        rc = self.popen.poll()
        if rc is not None and rc > 128:  # bwrap passes a signal's death on as 128 + its number
            try:
                return -signal.Signals(rc - 128).value
            except ValueError:
                pass
        return rc

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        """The box's init first (bwrap inside the box's pid namespace, a session of its own: killing it ends every
        process in the box), then bwrap outside, stopped beforehand so it forks no init while its children are
        read. The init's parent-death signal alone does not end it: killed right after their start on a loaded
        host, boxes left their init sleeping, orphaned."""
        pid = self.popen.pid
        try:
            os.kill(pid, signal.SIGSTOP)
            for _ in range(1000):  # until it has stopped: a stop signal arrives on its way back from the kernel
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "TtZX":
                    break
                time.sleep(0.001)
            inits = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except (OSError, IndexError):
            inits = []
        for child in inits:
            try:
                os.kill(int(child), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        try:
            self.popen.kill()
        except OSError:
            pass

    def cleanup(self) -> None:
        """After the box ended: its processes reaped, its builds put back into the candidate's cache (a build the
        next judgement loads) unless its worker did not end cleanly (killed mid-build, a library cut short would be
        loaded next time), its own folder removed."""
        self.popen.wait()
        self.cgroup.remove()
        if self.builds:
            if self.home is not None and self.keep_builds:
                copy_builds(Path(self.builds), self.home)
                seal_jit_cache(self.home)
            shutil.rmtree(self.builds, ignore_errors=True)
            self.builds = None


class Box:
    """A started box waiting for its job: the connection, the process, its stderr file, and what it was made with
    (`plan`: the folders it reads and writes, its environment), which a job must match to adopt it."""

    def __init__(self, conn, proc: BoxProcess, stderr, plan: tuple):
        self.conn, self.proc, self.stderr, self.plan = conn, proc, stderr, plan
        self.build_wait_s = 0.0  # seconds its job waited for the candidate's build ahead (lend)
        self.ahead = False  # started ahead of the job that took it (take)
        # kp.batch.prime: the worker arguments a slot sent ahead (only a job with the same ones takes the box), the
        # run ahead; once taken, the commands its worker answered and the run's (pickled arguments, replies)
        self.sent, self.early, self.seq, self.primed = None, None, 0, None
        self.missed: list[str] = []  # why the boxes started ahead of its job did not serve it (take)

    @property
    def env(self) -> dict:
        return self.plan[2]

    def lend(self, build_dir: str | None) -> None:
        """The candidate's cached builds copied into the box's own build folder before its job (a build still
        running ahead of the job, kp.batch.ahead, waited for first: not the job's time, kp.box.builds.wait_for_build);
        they go back when the box ends. The box's folder is not the cache: what one judgement writes there reaches
        the cache only under its own file's contents."""
        if not (self.proc.builds and build_dir):
            return
        home = Path(build_dir)
        self.build_wait_s = wait_for_build(home)  # no build ahead: no build's time
        copy_builds(home, Path(self.proc.builds))
        verify_jit_cache(home, Path(self.proc.builds))  # a Triton file changed since it was put back: not lent
        self.proc.home = home

    def discard(self) -> None:
        self.proc.kill()
        self.proc.join(5)
        self.proc.cleanup()
        self.stderr.close()
        try:
            os.unlink(self.stderr.name)
        except OSError:
            pass


def _plan(ref_spec, read_only: list[str], builds: bool) -> tuple:
    """What the box reads, what it writes, its environment, whether it preloads torch._dynamo, whether it has a
    build folder of its own, and the candidate file's identity (device and inode: a file bound alone, outside a
    bound folder, is the inode it was when the box started). Nothing of the file's contents: a box started for one
    version of a candidate serves the next version of the same file (a loop's edit), its builds lent at its job."""
    from multiprocessing import util
    from kp.box import pch, sandbox
    from kp.lib import bytecode

    ro = [str(ROOT), *read_only]
    if ref_spec[0] == "file":
        ro += [str(Path(ref_spec[1]).resolve().parent), str(Path(ref_spec[1]).resolve())]
    env = pch.env(sandbox.box_env(dict(os.environ), str(ROOT)))  # what the cache holds precompiled, read-only
    env["KP_CACHE_DIR"] = "/tmp/kp_cache"  # what the candidate builds, privately
    env.pop("KP_CACHE_SHARED", None)
    if cache_root().is_dir():  # the playground's kernels as built and verified here, read-only
        ro.append(str(cache_root().resolve()))
        env["KP_CACHE_SHARED"] = ro[-1]
        if bytecode.active():  # the judge's bytecode, read from there (kp.lib.bytecode); the box writes none
            env["PYTHONPYCACHEPREFIX"] = bytecode.active()
    writable = [util.get_temp_dir()]  # this process's multiprocessing folder (kp.box.entry says why the box shares it)
    if builds:  # the candidate's own extension builds: the box's own folder, lent its cached ones at its job; its
        env["TORCH_EXTENSIONS_DIR"] = BOX_BUILDS  # Triton cache lives there too, and goes back with them
        env["TRITON_CACHE_DIR"] = f"{BOX_BUILDS}/{JIT_CACHE}"
    cand = next((p for p in read_only if p.endswith(".py")), None)
    try:
        st = os.stat(cand) if cand else None
    except OSError:
        st = None
    ident = (st.st_dev, st.st_ino) if st else None
    return ro, writable, env, needs_dynamo(cand), builds, ident


def _start(plan: tuple, warm_cuda: bool = False, gpu: bool = True, wrap: tuple = ()) -> Box:
    """Start a box made to `plan` (_plan): bwrap runs kp.box.entry, which confines itself, takes the judge's key,
    imports what every job needs (and with warm_cuda starts CUDA and the judge's GPU tools; gpu=False: a job on the
    CPU's, CPU_PRELOAD) and waits for its job (kp.worker.loop sends it). wrap: a tool's command line the worker runs
    under inside the box (compute-sanitizer: start_wrapped)."""
    import multiprocessing
    from multiprocessing.connection import Connection
    from kp.box import sandbox

    ro, writable, env, dynamo, builds, _ = plan
    limits = sandbox.Limits()
    stderr = tempfile.NamedTemporaryFile(prefix="kp-worker-", suffix=".stderr", delete=False)
    ours, theirs = socket.socketpair()
    inside = [
        *wrap,
        sys.executable,
        "-m",
        "kp.box.entry",
        str(theirs.fileno()),
        json.dumps(limits.settings()),
        writable[0],
        "cuda" if warm_cuda else "gpu" if gpu else "-",
        "dynamo" if dynamo else "-",
    ]
    own = None
    if builds:  # the box's own build folder, beside the cache (a copy within one file system)
        (cache_root() / "boxes").mkdir(parents=True, exist_ok=True)
        _sweep_boxes()
        own = tempfile.mkdtemp(prefix=f"box-{os.getpid()}-", dir=cache_root() / "boxes")
    argv = sandbox.command(
        inside,
        read_only=ro,
        writable=[*writable, *([(own, BOX_BUILDS)] if own else [])],
        cwd=BOX_CWD,
        env=env,
        limits=limits,
    )
    cgroup = sandbox.PidsCgroup(limits.nproc if sandbox.process_limit() == "cgroup" else 0)
    popen = subprocess.Popen(
        argv, pass_fds=[theirs.fileno()], preexec_fn=cgroup.enter, stdin=subprocess.DEVNULL, stderr=stderr
    )
    theirs.close()
    conn = Connection(ours.detach())
    conn.send_bytes(bytes(multiprocessing.current_process().authkey))
    return Box(conn, BoxProcess(popen, cgroup, own), stderr, plan)


def _sweep_boxes() -> None:
    """The build folders of boxes whose judge is gone (killed before it could remove them)."""
    for d in (cache_root() / "boxes").glob("box-*-*"):
        pid = d.name.split("-")[1]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


# Boxes started ahead of their job: (box, later). A box the command line started for its one job is discarded by a
# job it does not match; one a slot started for its next job (later=True) waits for that job.
_early: list[tuple[Box, bool]] = []


def candidate_paths(candidate: str | Path) -> list[str]:
    """The candidate's own folder and file, as the box reads them."""
    p = Path(candidate).resolve()
    return [str(p.parent), str(p)]


# What a candidate's worker imports before its job: the box while the judge gets ready, the forkserver an unboxed
# worker is forked from once for all (about 3 s of imports per candidate otherwise). Neither touches CUDA there.
# torch._dynamo (2.5-3 s on two cores, 4.3 s on an H200 host) only where the candidate's file asks for it
# (needs_dynamo): the judge's own stages do not use it. torch.utils.cpp_extension (and setuptools under it: 0.17-0.19 s
# on two cores) because every candidate's import first wraps its load and load_inline (guards.record_build_failures):
# imported here, that is off the job's path. The forkserver imports the judge's worker only: with torch 2.11's CUDA
# build, importing torch.utils.cpp_extension marks the process as having started CUDA, and every worker forked from
# it then fails at its first CUDA call ("Cannot re-initialize CUDA in forked subprocess"); a box imports it in the
# worker's own process, which forks nothing.
FORKSERVER_PRELOAD = ["kp.worker.loop"]
WORKER_PRELOAD = [*FORKSERVER_PRELOAD, "torch.utils.cpp_extension"]
DYNAMO_PRELOAD = ["torch._dynamo"]
DYNAMO_MARKERS = (b"compile", b"dynamo", b"inductor")  # what a file that may start torch.compile mentions


def needs_dynamo(path: str | Path | None) -> bool:
    """Whether a candidate needs torch._dynamo imported and torch.compile's first-use patches made before its import
    (kp.worker.loop.settle_torch): a file that mentions compiling (an unreadable one: assumed to). Elsewhere torch's
    own rebinding of torch.manual_seed at dynamo's import is told apart from a candidate's
    (kp.worker.guards.torchs_own_rebinding)."""
    try:
        src = Path(path).read_bytes()
    except (OSError, TypeError):
        return True
    return any(m in src for m in DYNAMO_MARKERS)


def start_forkserver_early() -> None:
    """Unboxed, a candidate's worker is a fork of multiprocessing's forkserver once that has imported torch and the
    judge: started now, its imports run beside this process's own instead of after them (about 1.8 s of a small job
    on two cores). Where there is no forkserver, or it cannot start, the judge starts its worker as usual."""
    try:
        import multiprocessing as mp
        from multiprocessing import forkserver

        if "forkserver" in mp.get_all_start_methods():
            forkserver.set_forkserver_preload(FORKSERVER_PRELOAD)
            forkserver.ensure_running()
    except Exception:
        pass


def start_early(
    ref_spec, candidate: str, boxed: bool = True, later: bool = False, cuda: bool = False, one_waiting: bool = False
) -> None:
    """Start the box for one candidate now, before its job is set up; the judge adopts it (`take`). The command line
    starts its one candidate's box before torch is imported there; a batch's slot starts its next job's box while
    the job before it runs (later=True: kept until that job takes it or `discard_early`). cuda: the box starts CUDA
    and the judge's GPU tools too, before its job. Unboxed (no bwrap, or boxed=False), the forkserver its worker will
    come from instead. Any failure leaves nothing started: the judge then starts its box or worker as usual, and says
    why if it cannot. one_waiting: a warm judge's box for its candidate's next command: the boxes of other plans
    go, and none is started where one for this plan waits already."""
    try:
        from kp.box import sandbox

        if not Path(candidate).is_file():
            return
        if not boxed or sandbox.status()[0] is None:
            start_forkserver_early()
            return
        plan = plan_for(ref_spec, candidate)
        if one_waiting:
            discard_early({id(b) for b in waiting() if fits(b, plan) and b.proc.is_alive()})
            if waiting():
                return
        box = _start(plan, cuda, gpu=cuda)
        _early.append((box, later))
    except Exception:
        pass


def waiting() -> list[Box]:
    """The boxes started ahead that no job has taken yet."""
    return [box for box, _ in _early]


def discard_early(keep: set[int] = frozenset()) -> None:
    """Every box started ahead and not taken, but those whose id() is in `keep`: gone (a slot's next job went
    elsewhere, or the batch ends)."""
    for box, later in list(_early):
        if id(box) not in keep:
            _early.remove((box, later))
            box.discard()


def fits(box: Box, plan: tuple) -> bool:
    """Whether a box serves a job made to `plan` (_plan): made to the same plan, or made before this process imported
    torch, and so not told torch's choice of CPU kernels (sandbox.box_env), and otherwise the same. Such a box's
    worker picks its own, on this machine the same; where it picked others, the judge starts a fresh worker told this
    process's choice (kp.judge.parity). Both the command line's box, started before its torch import, and a new
    slot's first box are such boxes."""
    unpinned = {k: v for k, v in plan[2].items() if k != "ATEN_CPU_CAPABILITY"}
    return box.plan == plan or (
        "ATEN_CPU_CAPABILITY" not in box.plan[2] and box.plan == (*plan[:2], unpinned, *plan[3:])
    )


def passed_over(box: Box, plan: tuple) -> str:
    """Why a box started ahead does not serve a job made to `plan`: it has exited (its stderr's last line), it was
    made to another plan (what differs: folders, or the names of the environment's variables that differ), or it
    was sent another job's worker arguments."""
    code = box.proc.popen.poll()
    if code is not None:
        try:
            tail = [ln for ln in Path(box.stderr.name).read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            tail = []
        return f"it had exited ({code})" + (f": {tail[-1][:160]}" if tail else "")
    if not fits(box, plan):
        names = (
            "folders read",
            "folders written",
            "environment",
            "compile preload",
            "own build folder",
            "candidate file",
        )
        what = [n for n, a, b in zip(names, box.plan, plan) if a != b and n != "environment"]
        env_a, env_b = box.plan[2], plan[2]
        keys = sorted(k for k in set(env_a) | set(env_b) if env_a.get(k) != env_b.get(k) and k != "ATEN_CPU_CAPABILITY")
        if keys:
            what.append("environment (" + ", ".join(keys) + ")")
        return "made to another plan: " + ("; ".join(what) or "its CPU kernels")
    return "it was sent another job's worker arguments"


def plan_for(ref_spec, candidate: str | Path) -> tuple:
    """The plan (_plan) of the box that judges `candidate` against the reference: its folder and file readable, a
    build folder of its own writable."""
    return _plan(ref_spec, candidate_paths(candidate), builds=True)


def worker_args(ref_spec, device: str, precision: str, env: dict, train: bool) -> tuple:
    """What a boxed worker is told of its job before its first command (kp.worker.loop.worker_main)."""
    return ref_spec, device, precision, str(ROOT), env, BOX_CWD, train


def start_wrapped(ref_spec, read_only: list[str], build_dir: str | None, worker: tuple, wrap: tuple, env: dict) -> Box:
    """A box of its own for a worker that runs under a tool (`wrap`: the tool's command line before the worker's;
    compute-sanitizer for --sanitize), with `env` beside the plan's environment and the tool's folder readable;
    lent the candidate's cached builds and sent its worker arguments (worker: device, precision, train). Never a box
    started ahead: those run no tool."""
    tool_dir = os.path.dirname(os.path.realpath(wrap[0]))
    ro, writable, plan_env, *rest = _plan(ref_spec, [*read_only, tool_dir], bool(build_dir))
    plan = (ro, writable, {**plan_env, **env}, *rest)
    box = _start(plan, gpu=True, wrap=tuple(wrap))
    box.lend(build_dir)
    box.sent = worker_args(ref_spec, worker[0], worker[1], plan[2], worker[2])
    box.conn.send(box.sent)
    return box


def take(
    ref_spec,
    read_only: list[str],
    build_dir: str | None,
    gpu: bool = True,
    deadline: float | None = None,
    worker: tuple | None = None,
) -> Box:
    """A box for a candidate (read_only: its folder and file) against a reference: one started ahead for the same
    plan (folders, environment, the same file, whatever its contents now) that still runs and was sent no other
    worker arguments than its job's, else a new one (gpu=False: for a job on the CPU), lent the candidate's cached
    builds (Box.lend) and, given the job's `worker` (device, precision, train), sent its worker arguments where no
    slot sent them ahead. A box the command line started for another job is discarded; one a slot keeps for a later
    job stays. A box whose worker ran the reference ahead of its job (kp.batch.prime) is taken once that run has
    ended or been called off (its `seq` and `primed` say what it answered); one whose run ahead went wrong is not
    used."""
    plan = _plan(ref_spec, read_only, bool(build_dir))
    args = worker_args(ref_spec, worker[0], worker[1], plan[2], worker[2]) if worker else None
    found, missed = None, []
    for box, later in list(_early):
        if found is None and fits(box, plan) and box.proc.is_alive() and box.sent in (None, args):
            found = box
            _early.remove((box, later))
            continue
        if found is None:
            missed.append(passed_over(box, plan))
        if not later or not box.proc.is_alive():
            _early.remove((box, later))
            box.discard()
    if found is not None and found.early is not None and not found.early.claim(deadline):
        found.discard()
        found, missed = None, missed + ["its reference's run ahead did not end in time"]
    box = found if found is not None else _start(plan, gpu=gpu)
    box.ahead = found is not None
    box.missed = missed  # why each box started ahead did not serve this job (the record says it)
    box.lend(build_dir)
    if args is not None and box.sent is None:
        box.conn.send(args)
        box.sent = args
    return box
