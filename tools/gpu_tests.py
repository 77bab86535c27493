"""The GPU tests over every GPU of the host: one pytest per GPU (CUDA_VISIBLE_DEVICES set to it), or several (lanes),
each running its share of the tests that need a GPU (`--only gpu --shard K/N`, tests/conftest.py); prints one line
per GPU (and its three slowest tests) and exits with the worst exit code. With --cpu-tests, the other tests follow
in one pytest over every core with the GPUs hidden, exactly as CI runs them on a host without a GPU.

    python -m tools.gpu_tests                      every GPU nvidia-smi lists
    python -m tools.gpu_tests --cpu-tests          and then the tests that need no GPU: the whole suite
    python -m tools.gpu_tests --gpus 0,1 -- -k judge_case     pytest's own arguments after --
    python -m tools.gpu_tests --no-prebuild        without building every kernel first
    python -m tools.gpu_tests --store-durations    and record each GPU test's seconds for the next runs' deal

Every kernel is built first, all cores at once (`run.py --build`, the largest source first; beside it, below its
priority, the non-Hopper path's, KP_CAPABILITY=8.0), into the cache the tests use; otherwise the first GPU test to
need a kernel builds it (on a fresh 4 x H100 host: the softmax sweep of 6_regcluster 97 s, the non-Hopper paths
130-173 s each, with the builds inside).

Each GPU's pytest runs its tests one at a time (one xdist worker), with its share of the cores as threads; its judge
cases and known-wrong cases (141 of the 250 GPU tests) are judged together first, in one batch over three or four
warm slots of its GPU (tests/batched.py: 1-6 s a case instead of the 15-25 s of a judge process started for each).
The batched cases and the tests that are slow beside the batch (tests/batched.py's AFTER_BATCH) are dealt among the
GPUs' first lanes by their recorded seconds (tests/gpu_test_seconds.json). Every lane starts beside the kernel build;
a first lane's batch builds its candidates' own extensions at once and starts its slots once the kernels are built
(its boxed candidates read the kernel cache and cannot add to it; KP_KERNELS_BUILT names the file written then):
from a cold cache its candidates' builds (about 360 s of its slots' time on one H100) used to begin only after the
kernels' 90 s. Every other GPU test is taken, not dealt: every lane lists them and runs each that no lane has
claimed before it (--claims), the other lanes from the start, the first lanes after their batch; so the lanes end
together, within a test. The tests that need no GPU are not run beside them: they are CI's, and on a GPU host
several of them judge on the GPU when one is there, beside a GPU test's 36-64 GiB softmax judge. --cpu-tests runs
them after, with the GPUs hidden, one xdist worker per two cores (a CPU test is a judge process and its candidate's
worker), each process with two threads (OMP_NUM_THREADS / MKL_NUM_THREADS, unless set: left to torch's default, each
of 64 processes ran a thread per core of the host and judge cases of 40-60 s took 100-240 s).

Ctrl-C, or a time limit's SIGTERM, is passed on to each pytest as Ctrl-C (each runs in a session of its own): each
ends with its summary line, and with -v every test it ran is named; the runner exits with 128 + the signal.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# tests/batched.py's: the file a first lane's batch waits for before its slots
KERNELS_BUILT = "KP_KERNELS_BUILT"


def host_gpus() -> list[str]:
    """The GPUs to use, found without starting CUDA: CUDA_VISIBLE_DEVICES's list where it is set, else one per GPU
    nvidia-smi lists."""
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if seen is not None:
        return [d.strip() for d in seen.split(",") if d.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, ln in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))]


def start_prebuild(gpu: str, logs: Path) -> list:
    """`run.py --build` on one GPU: every rung of every problem for this GPU and, at the same time and below its
    priority (nice PREBUILD_SM80_NICE: its rungs are needed later, by fewer tests), for the non-Hopper path. The
    first's wall time is its last rung's, softmax/6_regcluster, which takes most of it on one core. Returns the
    started builds for wait_prebuild."""
    started = []
    for cap in (None, "8.0"):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu, **({"KP_CAPABILITY": cap} if cap else {})}
        name = "prebuild" + (f"_sm{cap.replace('.', '')}" if cap else "")
        log = open(logs / f"{name}.log", "w")
        nice = ["nice", "-n", str(PREBUILD_SM80_NICE)] if cap and shutil.which("nice") else []
        proc = subprocess.Popen(
            [*nice, sys.executable, str(ROOT / "run.py"), "--build"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        started.append((name, proc, log, time.perf_counter()))
    return started


PREBUILD_SM80_NICE = 5


def wait_prebuild(started: list, logs: Path) -> None:
    """Waits for the builds of start_prebuild, one line each (a build that fails is said here and again by the
    tests that need it)."""
    while started:
        time.sleep(0.2)
        for name, proc, log, t in [s for s in started if s[1].poll() is not None]:
            started.remove((name, proc, log, t))
            log.close()
            tail = [ln for ln in (logs / f"{name}.log").read_text(errors="replace").splitlines() if ln.strip()]
            print(
                f"{name}: exit {proc.returncode} in {time.perf_counter() - t:.0f} s: "
                f"{tail[-1] if tail else 'no output'}",
                flush=True,
            )


def lane_args(k: int, shares: int, lanes: int, claims: Path) -> list[str]:
    """The pytest options of share K: its GPU tests, its lanes, the folder of claims. Each a single `--opt=value`
    word: pytest takes its root (and so its conftest and options) from the arguments that are existing paths, and
    the claims' folder exists once a lane has claimed a test (its root became the folder's parent, and the later
    lanes' options were unknown)."""
    return ["-n", "1", "--only=gpu", f"--shard={k}/{shares}", f"--lanes={lanes}", f"--claims={claims}"]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default=None, help="comma-separated GPU ids (default: every GPU)")
    ap.add_argument("--logs", default=None, help="folder for each GPU's pytest output (default: a temporary one)")
    ap.add_argument("--no-prebuild", action="store_true", help="do not build every kernel before the tests")
    ap.add_argument(
        "--store-durations",
        action="store_true",
        help="record every GPU test's seconds (setup, call and teardown) in tests/gpu_test_seconds.json, "
        "which deals the shares of later runs so that they end together (tests/conftest.py)",
    )
    ap.add_argument(
        "--lanes",
        type=int,
        default=None,
        metavar="L",
        help="pytest processes a GPU, started together, each with its share of that GPU's tests: the "
        "first judges the GPU's judge cases in its batch, the others run the rest meanwhile (a "
        "test that times holds the GPU against them, as a judge's timing does; default: 2 where "
        "the host has 12 cores a GPU or more, else 1)",
    )
    ap.add_argument(
        "--cpu-tests",
        action="store_true",
        help="then the tests that need no GPU, over every core with the GPUs hidden (as CI runs them)",
    )
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    gpus = [g.strip() for g in args.gpus.split(",")] if args.gpus else host_gpus()
    if not gpus:
        print("no GPU found (nvidia-smi -L lists none): run `python -m pytest -q -rs`", file=sys.stderr)
        return 2
    import tempfile

    logs = Path(args.logs or tempfile.mkdtemp(prefix="kp-gpu-tests-"))
    logs.mkdir(parents=True, exist_ok=True)
    cpus = os.cpu_count() or 1

    def threads(n):
        return {k: os.environ.get(k, str(max(1, n))) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}

    t0 = time.perf_counter()
    stop = Stop()
    lanes = args.lanes or (2 if cpus // len(gpus) >= 12 else 1)
    shares = len(gpus) * lanes
    builds = [] if args.no_prebuild else start_prebuild(gpus[0], logs)
    # Every lane starts at once: a first lane's batch waits for the kernels before its slots (tests/batched.py), the
    # other lanes' tests build what they need, waiting for the prebuild's build of the same rung. Dealt by seconds
    # measured alone, a lane beside the batch took a third longer than its deal: the tests that may run on any lane
    # are claimed at run time instead.
    claims = logs / "claims"
    shutil.rmtree(claims, ignore_errors=True)
    verbose = any(re.fullmatch(r"-v+|--verbose", a) for a in extra)  # pytest's -q would cancel it
    pytest = [sys.executable, "-m", "pytest", *([] if verbose else ["-q"]), "-rfEs", "-p", "no:cacheprovider"]
    if args.store_durations:  # every test's phases, listed
        pytest += ["--durations=0", "--durations-min=0"]
    elif not any(a.startswith("--durations") for a in extra):  # each GPU's line names its slowest tests
        pytest.append("--durations=3")

    # written once the build has ended: a first lane's batch starts its slots then
    built = logs / "kernels_built"
    built.unlink(missing_ok=True)

    def start(k):
        g, lane = gpus[k // lanes], k % lanes
        env = {**os.environ, **threads(cpus // shares), "CUDA_VISIBLE_DEVICES": g}
        if builds and lane == 0:
            env[KERNELS_BUILT] = str(built)
        name = f"gpu{g}" + (f"-{lane}" if lanes > 1 else "")
        log = open(logs / f"{name}.log", "w")
        cmd = [*pytest, *lane_args(k, shares, lanes, claims), *extra]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return (f"GPU {g}" + (f" lane {lane}" if lanes > 1 else ""), f"{name}.log", stop.started(proc), log)

    procs = {k: start(k) for k in range(shares)}
    if builds:
        wait_prebuild(builds, logs)
        built.write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")
    if stop.signum:
        print(f"stopped by signal {stop.signum} while the kernels were built", flush=True)
    procs = [procs[k] for k in sorted(procs)]
    worst = _finish(procs, logs, stop)
    print(
        f"{len(gpus)} GPUs, {lanes} lane{'s' * (lanes > 1)} each, {time.perf_counter() - t0:.0f} s in all; each "
        f"lane's output: {logs}/",
        flush=True,
    )
    if args.store_durations:
        n = store_durations([logs / name for _, name, _, _ in procs], GPU_SECONDS, _gpu_name())
        print(f"{n} GPU tests' seconds recorded in {GPU_SECONDS.relative_to(ROOT)}", flush=True)
    if stop.signum:
        return 128 + stop.signum
    if args.cpu_tests:
        t1 = time.perf_counter()
        env = {**os.environ, **threads(2), "CUDA_VISIBLE_DEVICES": ""}
        log = open(logs / "cpu.log", "w")
        cmd = [*pytest, "-n", str(max(1, cpus // 2)), "--only", "cpu", *extra]
        worst = max(
            worst,
            _finish(
                [
                    (
                        "CPU tests",
                        "cpu.log",
                        stop.started(
                            subprocess.Popen(
                                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                            )
                        ),
                        log,
                    )
                ],
                logs,
                stop,
            ),
        )
        print(
            f"the tests that need no GPU: {time.perf_counter() - t1:.0f} s; {time.perf_counter() - t0:.0f} s in all",
            flush=True,
        )
    return 128 + stop.signum if stop.signum else worst


GPU_SECONDS = ROOT / "tests" / "gpu_test_seconds.json"


def _gpu_name() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        out = []
    return out[0].strip() if out else "an unnamed GPU"


def _listed(lines: list[str]):
    """(seconds, phase, node id) for each entry of pytest's --durations list in its output."""
    for ln in lines:
        m = re.match(r"^(\d+(?:\.\d+)?)s (call|setup|teardown)\s+(\S+)", ln)
        if m:
            yield m[1], m[2], m[3]


def durations(lines: list[str]) -> dict[str, float]:
    """Seconds per test from pytest's --durations list (setup, call and teardown added), by node id without xdist's
    "@group" suffix."""
    out: dict[str, float] = {}
    for sec, _, node in _listed(lines):
        name = node.split("@")[0]
        out[name] = round(out.get(name, 0.0) + float(sec), 2)
    return out


def store_durations(logs: list[Path], path: Path, gpu: str) -> int:
    """The GPU tests' seconds of these pytest logs into the record at path (tests a run did not include keep their
    earlier figures); returns how many this run recorded."""
    import json

    found: dict[str, float] = {}
    for log in logs:
        if log.exists():
            found.update(durations(log.read_text(errors="replace").splitlines()))
    try:
        old = json.loads(path.read_text()).get("seconds", {})
    except (OSError, ValueError, AttributeError):
        old = {}
    rec = {
        "measured": f"python -m tools.gpu_tests --store-durations, {time.strftime('%Y-%m-%d')}, on {gpu}; each "
        f"test's setup, call and teardown",
        "seconds": dict(sorted({**old, **found}.items())),
    }
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return len(found)


def slowest(lines: list[str], n: int = 3) -> list[str]:
    """The n slowest entries of pytest's --durations list in its output, as 'SECONDSs test' (setup and teardown
    named as such), slowest first."""
    found = [
        (float(sec), f"{sec}s {node}" + ("" if phase == "call" else f" ({phase})"))
        for sec, phase, node in _listed(lines)
    ]
    return [t for _, t in sorted(found, key=lambda f: -f[0])[:n]]


STOP_GRACE_S = 120  # a pytest told to stop (as by Ctrl-C) has this long to print its summary before it is killed


class Stop:
    """SIGINT, or SIGTERM (a time limit's), passed on to every pytest as Ctrl-C (each runs in a session of its own,
    out of reach of a signal sent to the runner's group), so that each ends with its summary line, the tests it ran
    listed, rather than dying with the runner and leaving a log of dots."""

    def __init__(self, install: bool = True):
        self.signum, self.at, self.procs = None, 0.0, []
        for s in (signal.SIGINT, signal.SIGTERM) if install else ():
            signal.signal(s, self)

    def started(self, proc: subprocess.Popen) -> subprocess.Popen:
        self.procs.append(proc)
        if self.signum:
            self._pass_on(proc)
        return proc

    def __call__(self, signum, frame) -> None:
        if self.signum is None:
            self.signum, self.at = signum, time.monotonic()
            print(f"signal {signum}: the tests are told to stop ({STOP_GRACE_S} s to say what they ran)", flush=True)
            for proc in self.procs:
                self._pass_on(proc)

    @staticmethod
    def _pass_on(proc: subprocess.Popen, sig: int = signal.SIGINT) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, proc: subprocess.Popen) -> int:
        while True:
            try:
                return proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                if self.signum and time.monotonic() - self.at > STOP_GRACE_S:
                    self._pass_on(proc, signal.SIGKILL)


def _finish(procs, logs: Path, stop: Stop) -> int:
    """Waits for each (name, log file, process, open log), killing one that outlasts a stop's grace; one line each:
    its exit code and pytest's last line, then its slowest tests where pytest listed them."""
    worst = 0
    for name, fname, proc, log in procs:
        rc = stop.wait(proc)
        log.close()
        tail = [ln for ln in (logs / fname).read_text(errors="replace").splitlines() if ln.strip()]
        print(f"{name}: exit {rc}: {tail[-1] if tail else 'no output'}", flush=True)
        slow = slowest(tail)
        if slow:
            print(f"  slowest: {'; '.join(slow)}", flush=True)
        worst = max(worst, rc if rc >= 0 else 128 - rc)  # killed by a signal: not a pass
    return worst


if __name__ == "__main__":
    sys.exit(main())
