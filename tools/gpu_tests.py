"""The test suite over every GPU of the host: one pytest per GPU (CUDA_VISIBLE_DEVICES set to it), each running its
share of the tests (`--shard K/N`, tests/conftest.py: the GPU tests dealt round-robin, the CPU tests too), started
together; prints one line per GPU and exits with the worst exit code.

    python -m tools.gpu_tests                      every GPU nvidia-smi lists
    python -m tools.gpu_tests --gpus 0,1 -- -k judge_case     pytest's own arguments after --
    python -m tools.gpu_tests --no-prebuild        without building every kernel first

Every kernel is built first, all cores at once (`run.py --build`, and again as the non-Hopper path builds them,
KP_CAPABILITY=8.0), into the cache the tests use; otherwise the first GPU test to need a kernel builds it while
holding its GPU's one-at-a-time group (on a fresh 4 x H100 host: the softmax sweep of 6_regcluster 97 s, the
non-Hopper paths 130-173 s each, with the builds inside).

Each pytest runs its GPU tests one at a time on its GPU and its CPU tests over its share of the cores: one xdist
worker per two cores (a CPU test is a judge process and its candidate's worker), each process with as many threads
as its worker's share of the cores (OMP_NUM_THREADS / MKL_NUM_THREADS, unless set). Left to torch's default, every
one of the 64 processes of a 64-core, 4-GPU host ran as many threads as the host has cores: judge cases of 40-60 s
on a 2-core host took 100-240 s, and jobs overran their per-stage limits.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def prebuild(gpu: str, logs: Path) -> None:
    """`run.py --build` on one GPU: every rung of every problem for this GPU, then for the non-Hopper path; a build
    that fails is said here and again by the tests that need it."""
    for cap in (None, "8.0"):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu, **({"KP_CAPABILITY": cap} if cap else {})}
        t = time.perf_counter()
        name = "prebuild" + (f"_sm{cap.replace('.', '')}" if cap else "")
        with open(logs / f"{name}.log", "w") as log:
            rc = subprocess.run([sys.executable, str(ROOT / "run.py"), "--build"], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT).returncode
        tail = [ln for ln in (logs / f"{name}.log").read_text(errors="replace").splitlines() if ln.strip()]
        print(f"{name}: exit {rc} in {time.perf_counter() - t:.0f} s: {tail[-1] if tail else 'no output'}", flush=True)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default=None, help="comma-separated GPU ids (default: every GPU)")
    ap.add_argument("--logs", default=None, help="folder for each GPU's pytest output (default: a temporary one)")
    ap.add_argument("--no-prebuild", action="store_true", help="do not build every kernel before the tests")
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    gpus = [g.strip() for g in args.gpus.split(",")] if args.gpus else host_gpus()
    if not gpus:
        print("no GPU found (nvidia-smi -L lists none): run `python -m pytest -q -rs`", file=sys.stderr)
        return 2
    import tempfile
    logs = Path(args.logs or tempfile.mkdtemp(prefix="kp-gpu-tests-"))
    logs.mkdir(parents=True, exist_ok=True)
    cpus = os.cpu_count() or 1
    workers = max(1, cpus // (2 * len(gpus)))
    share = str(max(1, cpus // (len(gpus) * workers)))
    threads = {k: os.environ.get(k, share) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    procs = []
    t0 = time.perf_counter()
    if not args.no_prebuild:
        prebuild(gpus[0], logs)
    for k, g in enumerate(gpus):
        env = {**os.environ, **threads, "CUDA_VISIBLE_DEVICES": g}
        log = open(logs / f"gpu{g}.log", "w")
        cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "-n", str(workers),
               "--shard", f"{k}/{len(gpus)}", *extra]
        procs.append((g, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    worst = 0
    for g, proc, log in procs:
        rc = proc.wait()
        log.close()
        tail = [ln for ln in (logs / f"gpu{g}.log").read_text(errors="replace").splitlines() if ln.strip()]
        print(f"GPU {g}: exit {rc}: {tail[-1] if tail else 'no output'}")
        worst = max(worst, rc)
    print(f"{len(gpus)} GPUs, {time.perf_counter() - t0:.0f} s in all; each GPU's output: {logs}/")
    return worst


if __name__ == "__main__":
    sys.exit(main())
