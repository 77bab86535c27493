"""Two versions of the judge over one job file, side by side on halves of one host, cold and then warm: how many
verdicts an hour each gives, where its job-seconds went, and which verdicts differ.

    git worktree add /tmp/before <commit>
    python -m bench.judge.corpus_pair --jobs jobs.csv --before /tmp/before --gpus 0,1/2,3 --limit 1150,300 --out pair/
    python -m bench.judge.corpus_pair --jobs jobs.csv --before /tmp/before --device cpu --out pair/    (2 slots each)

Each version runs its own `run.py --jobs JOBS --out OUT/<phase>_<name>.jsonl ARGS` at once: on its GPUs (`--slots`
per GPU), pinned to its half of the cores this process may use, with a build cache of its own (OUT/cache_<name>:
two versions may lay a candidate's build folder out differently, and neither must find the other's builds), under a
time limit that stops it as Ctrl-C does (the records so far are kept; a stopped run's throughput line is its own).
The phases: cold (its cache emptied first), then warm (the same again, the cache as the cold run left it, into new
results files). The after version is this checkout unless --after names another.

Prints each run's last lines (its verdicts an hour and GPU utilisation), the table of where each run's job-seconds
went (tools.judge_corpus pace) and the verdicts that differ between the two versions in each phase and between the
two phases of each version (tools.judge_corpus compare). A job file whose pairs build nothing of their own has no
build to warm: its cold and warm differ only by the boxes and kernels each run starts. Not a test: nothing is
asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("before", "after")


def halves(cores: list[int]) -> list[set[int]]:
    """This process's cores in two halves (a one-core host: the same core for both)."""
    mid = max(1, len(cores) // 2)
    return [set(cores[:mid]), set(cores[mid:] or cores[:mid])]


def command(tree: Path, jobs: Path, res: Path, gpus: list[str], slots: int, device: str, extra: list[str]) -> list[str]:
    """The version's run.py command. Its slots a GPU: --slots where its run.py takes it (a GPU listed once would
    otherwise get its default), else each GPU listed that many times (a version before --slots)."""
    cmd = [sys.executable, "run.py", "--jobs", str(jobs), "--out", str(res), *extra]
    if device == "cpu":
        return cmd + ["--device", "cpu"]
    if '"--slots"' in (tree / "run.py").read_text():
        return cmd + ["--gpus", ",".join(gpus), "--slots", str(slots)]
    return cmd + ["--gpus", ",".join(g for g in gpus for _ in range(slots))]


def start(tree: Path, cmd: list[str], cache: Path, cores: set[int], log: Path) -> subprocess.Popen:
    env = {**os.environ, "KP_CACHE_DIR": str(cache)}
    return subprocess.Popen(
        cmd,
        cwd=tree,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: os.sched_setaffinity(0, cores),
    )


def stop_by(procs: list[subprocess.Popen], deadline: float) -> list[int | None]:
    """Wait for each run until the deadline; one still running then is stopped as Ctrl-C stops it."""
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGINT)
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [p.returncode for p in procs]


def last_lines(log: Path, n: int = 3) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return "\n".join("    " + ln[:300] for ln in lines[-n:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=Path, required=True)
    ap.add_argument("--before", type=Path, required=True, help="the other version's checkout")
    ap.add_argument("--after", type=Path, default=ROOT)
    ap.add_argument("--gpus", default="0/1", help="before's GPUs / after's, e.g. 0,1/2,3")
    ap.add_argument("--slots", type=int, default=3, help="slots per GPU")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument(
        "--limit",
        default="1800",
        help="seconds each phase may take: one figure for every phase, or one per phase (600,250)",
    )
    ap.add_argument("--phases", default="cold,warm")
    ap.add_argument(
        "--args",
        default="--allow-torch --no-compile --no-bench --timeout 300",
        help="run.py's other arguments, the same for both",
    )
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    from tools.judge_corpus import compare, pace

    a.out.mkdir(parents=True, exist_ok=True)
    trees = [a.before.resolve(), a.after.resolve()]
    gpus = [g.split(",") for g in a.gpus.split("/")]
    if len(gpus) != 2:
        ap.error("--gpus: before's and after's, separated by /")
    cores = halves(sorted(os.sched_getaffinity(0)))
    phases = a.phases.split(",")
    limits = [float(x) for x in a.limit.split(",")]
    if len(limits) not in (1, len(phases)):
        ap.error(f"--limit: one figure, or one for each of the {len(phases)} phases")
    runs = []
    for phase, limit in zip(phases, limits * len(phases) if len(limits) == 1 else limits):
        procs, logs = [], []
        for name, tree, g, c in zip(NAMES, trees, gpus, cores):
            cache, res, log = a.out / f"cache_{name}", a.out / f"{phase}_{name}.jsonl", a.out / f"{phase}_{name}.log"
            if phase == "cold":
                shutil.rmtree(cache, ignore_errors=True)
            res.unlink(missing_ok=True)
            procs.append(
                start(tree, command(tree, a.jobs.resolve(), res, g, a.slots, a.device, a.args.split()), cache, c, log)
            )
            logs.append(log)
            runs.append(res)
        t0 = time.monotonic()
        codes = stop_by(procs, t0 + limit)
        print(f"{phase}: {time.monotonic() - t0:.0f} s", flush=True)
        for name, code, log in zip(NAMES, codes, logs):
            print(f"  {name} (exit code {code}):\n{last_lines(log)}", flush=True)
    done = [r for r in runs if r.exists()]
    print(pace(done))
    for x, y in [(runs[i], runs[i + 1]) for i in range(0, len(runs), 2)] + [
        (runs[i], runs[i + 2]) for i in range(len(runs) - 2)
    ]:
        if x.exists() and y.exists():
            print(f"{x.stem} -> {y.stem}: {compare(x, y)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
