"""Many jobs at once (run.py --candidate A B ..., --jobs CSV, --gpus, --ray, --out): every verdict as a single run
gives it, a crash and a hang cost only their own job, results survive a killed run, and a re-run finishes only what
is missing. On the CPU (--device cpu jobs); the GPU path is the same code with one slot per GPU."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, gpu, run_script
from kp.batch import jobfile

CASES = ROOT / "tests" / "batch"
CANDS = sorted(p for p in CASES.glob("*.py") if p.name != "ref.py")


def expect(path: Path):
    m = re.search(r'^EXPECT = (None|r"(.*)")$', path.read_text(), re.M)
    return None if m.group(1) == "None" else m.group(2)


def lines(out: Path) -> list[dict]:
    return [json.loads(x) for x in out.read_text().splitlines()]


def check_verdicts(recs: list[dict]) -> None:
    for d in recs:
        want = expect(Path(d["job"]["candidate"]))
        if want is None:
            assert d["ok"] and d["verdict"].startswith("accepted"), d["verdict"]
        else:
            assert not d["ok"] and re.search(want, d["verdict"]), (d["job"]["name"], d["verdict"])


def test_many_candidates_crash_and_hang_cost_only_their_job(tmp_path, cli):
    out = tmp_path / "results.jsonl"
    # The timeout has to outlast a good job on a loaded machine (on a GPU host under pytest-xdist, with the box and
    # a CPU torch.compile baseline, a good job took over 10 s); the compile baseline is not what this test is about.
    r = cli(
        "--ref",
        CASES / "ref.py",
        "--candidate",
        *CANDS,
        "--device",
        "cpu",
        "--allow-torch",
        "--no-compile",
        "--timeout",
        "30",
        "--out",
        out,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    recs = lines(out)
    assert sorted(Path(d["job"]["candidate"]).name for d in recs) == sorted(p.name for p in CANDS)
    check_verdicts(recs)
    assert all(d["gpu_name"] for d in recs)  # the hang's too: the slot named its device when the job started
    assert len({d["key"] for d in recs}) == len(CANDS)
    # no --seed: one seed drawn for the reference, every candidate judged on it, each record saying it
    assert len({d["job"]["opts"]["seed"] for d in recs}) == 1 and all(
        d["job"]["opts"]["seed_from"] == "reference" for d in recs
    )
    assert {d["record"]["seed"] for d in recs if d["record"]} == {recs[0]["job"]["opts"]["seed"]}
    table = r.stdout.strip().splitlines()
    n_ok = sum(expect(p) is None for p in CANDS)
    assert f"{n_ok} accepted, {len(CANDS) - n_ok} rejected" in table
    assert table[1].split()[1] == "good.py"  # accepted first, then the rejected with their reasons
    # the same command again: everything is recorded, nothing runs, the table is the same
    r2 = cli(
        "--ref",
        CASES / "ref.py",
        "--candidate",
        *CANDS,
        "--device",
        "cpu",
        "--allow-torch",
        "--no-compile",
        "--out",
        out,
    )
    assert len(lines(out)) == len(CANDS) and f"{len(CANDS)} of {len(CANDS)} jobs already recorded" in r2.stderr


def test_killed_run_resumes_with_only_the_missing_jobs(tmp_path):
    """Kill the whole run while the hanging job is in flight; the re-run judges that job alone."""
    out = tmp_path / "results.jsonl"
    args = [
        sys.executable,
        str(ROOT / "run.py"),
        "--ref",
        str(CASES / "ref.py"),
        "--device",
        "cpu",
        "--allow-torch",
        "--out",
        str(out),
        "--candidate",
    ] + [str(CASES / n) for n in ("good.py", "wrong.py", "hang.py")]
    p = subprocess.Popen(
        args + ["--timeout", "300"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 300  # two small CPU jobs: seconds alone, over 120 s on a host of 64 busy processes
    while time.monotonic() < deadline and not (out.exists() and len(out.read_text().splitlines()) >= 2):
        time.sleep(0.5)
    os.kill(p.pid, signal.SIGKILL)  # the run, not its slots: they notice and end themselves
    p.wait()
    assert out.exists(), f"no job recorded within 300 s: {p.stderr.read().decode(errors='replace')[-2000:]}"
    first = lines(out)
    assert len(first) == 2 and {Path(d["job"]["candidate"]).name for d in first} == {"good.py", "wrong.py"}
    r = subprocess.run(args + ["--timeout", "5"], capture_output=True, text=True, timeout=300)
    assert "2 of 3 jobs already recorded, 1 to run" in r.stderr, r.stderr
    recs = lines(out)
    assert len(recs) == 3 and recs[:2] == first and Path(recs[2]["job"]["candidate"]).name == "hang.py"
    assert len({d["job"]["opts"]["seed"] for d in recs}) == 1  # the resumed job keeps the reference's seed
    check_verdicts(recs)


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGINT, started ignoring it", "SIGINT as timeout sends it"])
def test_an_interrupted_run_ends_with_the_table_and_throughput_of_what_it_judged(tmp_path, how):
    """Ctrl-C, or a time limit's SIGINT or SIGTERM, while the hanging job is in flight: no traceback; the table, the
    throughput line and how many jobs are left, exit 128 + the signal; the slots are gone. Also for a run started
    with SIGINT ignored, as a script's background command is, and for `timeout -s INT`'s two deliveries (to the
    command, then to its process group, the slots' processes with it), the second here after the first was taken."""
    sig = signal.SIGTERM if how == "SIGTERM" else signal.SIGINT

    def ignoring():
        if "ignoring" in how:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    out = tmp_path / "results.jsonl"
    args = [
        sys.executable,
        str(ROOT / "run.py"),
        "--ref",
        str(CASES / "ref.py"),
        "--device",
        "cpu",
        "--allow-torch",
        "--out",
        str(out),
        "--timeout",
        "300",
        "--candidate",
    ] + [str(CASES / n) for n in ("good.py", "wrong.py", "hang.py")]
    p = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=ignoring
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (out.exists() and len(out.read_text().splitlines()) >= 2):
        time.sleep(0.5)
    time.sleep(1.0)
    os.kill(p.pid, sig)
    if "timeout" in how:
        time.sleep(0.01)
        os.killpg(p.pid, sig)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, stdout[-2000:] + stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "2 verdicts in" in stdout and "interrupted: 2 of 3 jobs have a verdict" in stderr, stdout + stderr
    assert len(lines(out)) == 2


def test_job_file(tmp_path, cli):
    (tmp_path / "cands").mkdir()
    (tmp_path / "cands" / "a.py").write_text((CASES / "good.py").read_text())
    (tmp_path / "ref.py").write_text((CASES / "ref.py").read_text())
    f = tmp_path / "jobs.csv"
    f.write_text("reference,candidate\nref.py,cands/a.py\nsoftmax,\nsoftmax,cands/a.py\n")
    jobs = jobfile.read_job_file(f, {"device": "cpu"})
    assert [j.name for j in jobs] == ["ref: a.py", "softmax (ladder)", "softmax: a.py"]
    assert jobs[0].ref == ("file", str(tmp_path / "ref.py")) and jobs[2].ref == ("problem", "softmax")
    k = jobs[0].key()
    assert k == jobfile.read_job_file(f, {"device": "cpu"})[0].key()  # same contents, same key
    assert k == jobfile.read_job_file(f, {"device": "cpu", "timeout_s": 5})[0].key()  # a limit is not the job
    (tmp_path / "cands" / "a.py").write_text((CASES / "good.py").read_text() + "\n# edited\n")
    assert jobfile.read_job_file(f, {"device": "cpu"})[0].key() != k  # an edited file is a new job
    assert jobfile.read_job_file(f, {"device": "cpu", "seed": 3})[1].key() != jobs[1].key()
    f.write_text("reference,candidate,mode\nref.py,cands/a.py,eval\nref.py,cands/a.py,\n")
    both = jobfile.read_job_file(f, {"device": "cpu", "mode": "train"})  # a row's mode overrides the run's
    assert [dict(j.opts)["mode"] for j in both] == ["eval", "train"] and both[0].key() != both[1].key()
    for bad, msg in (
        ("reference,candidate\nnope.py,cands/a.py\n", "neither a file nor a built-in problem"),
        ("reference,candidate,mode\nref.py,cands/a.py,infer\n", "neither train nor eval"),
        ("reference,candidate\nref.py,\n", "needs a candidate"),
        ("reference,candidate\nref.py,cands/missing.py\n", "does not exist"),
        ("ref,cand\nref.py,cands/a.py\n", "header must be"),
    ):
        f.write_text(bad)
        with pytest.raises(jobfile.UsageError, match=msg):
            jobfile.read_job_file(f, {})
    r = cli("--jobs", tmp_path / "missing.csv", "--device", "cpu")
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr


def test_torn_last_line_is_ignored(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps({"key": "a", "ok": True}) + "\n" + '{"key": "b", "o')
    assert {d["key"] for d in jobfile.read_results(out)} == {"a"}


@pytest.mark.skipif(not __import__("importlib").util.find_spec("ray"), reason="needs ray (pip install ray)")
def test_ray_backend_same_verdicts(tmp_path, cli):
    """The same jobs as Ray tasks on a local Ray cluster: same verdicts, same records, the same resume."""
    out = tmp_path / "ray.jsonl"
    r = cli(
        "--ref",
        CASES / "ref.py",
        "--candidate",
        *CANDS,
        "--device",
        "cpu",
        "--allow-torch",
        "--no-compile",
        "--timeout",
        "30",
        "--ray",
        "local",
        "--out",
        out,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    recs = lines(out)
    assert len(recs) == len(CANDS)
    check_verdicts(recs)
    r2 = cli(
        "--ref",
        CASES / "ref.py",
        "--candidate",
        *CANDS,
        "--device",
        "cpu",
        "--allow-torch",
        "--no-compile",
        "--ray",
        "local",
        "--out",
        out,
    )
    assert f"{len(CANDS)} of {len(CANDS)} jobs already recorded" in r2.stderr and len(lines(out)) == len(CANDS)


@gpu
def test_sixteen_own_kernel_candidates_over_every_gpu(tmp_path):
    """tests/batch/lse: eight right and eight wrong candidates (a hang and a crash among them), boxed, three slots a
    GPU (a search loop's setting; one slot a GPU took 160 s on one H200, the hang's 45 s among them): every verdict
    as its file expects, each job once, on the GPUs there are; the reference run ahead in some job's box."""
    import torch

    cands = sorted((CASES / "lse").glob("*.py"))
    out = tmp_path / "results.jsonl"
    build = run_script("--problem", "matmul_sum_max_mean_lse", "--build")
    assert build.returncode == 0, build.stderr[-3000:]
    slots = ",".join(str(i) for i in range(torch.cuda.device_count()) for _ in range(3))
    r = run_script(
        "--problem",
        "matmul_sum_max_mean_lse",
        "--candidate",
        *cands,
        "--gpus",
        slots,
        "--no-bench",
        "--timeout",
        "45",
        "--out",
        out,
    )
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    recs = lines(out)
    assert sorted(Path(d["job"]["candidate"]).name for d in recs) == sorted(p.name for p in cands)
    check_verdicts(recs)
    # a slot's next box runs the reference while the job before it judges (kp.batch.prime): some job found it done
    details = [(d["record"] or {}).get("stage_detail", {}) for d in recs]
    assert any(k.endswith("ahead of the job") for d in details for k in d), [sorted(d) for d in details][:3]
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")  # slots are named by the real GPU ids (a pinned test worker's)
    ids = [d.strip() for d in seen.split(",")] if seen else [str(i) for i in range(torch.cuda.device_count())]
    assert {d["gpu"] for d in recs} == {f"gpu{i}" for i in ids}


@gpu
def test_a_reference_that_faults_on_the_gpu_costs_only_its_own_job(tmp_path):
    """A reference whose own kernel fails a device-side assert in the slot's judge (at a member of its shape family,
    --shapes): that job says so, and the slot is started afresh, so the jobs after it on the same slot (one slot
    here) get their verdicts, not the sticky error."""
    fault = CASES / "ref_fault"
    jobs = tmp_path / "jobs.csv"
    jobs.write_text(
        "reference,candidate,mode\n"
        + f"{fault / 'ref.py'},{fault / 'candidate.py'},train\n"
        + "".join(f"{CASES / 'ref.py'},{CASES / 'good.py'},{mode}\n" for mode in ("train", "eval"))
    )
    out = tmp_path / "results.jsonl"
    r = run_script(
        "--jobs",
        jobs,
        "--gpus",
        "0",
        "--slots",
        "1",
        "--allow-torch",
        "--no-bench",
        "--no-compile",
        "--shapes",
        "odd",
        "--out",
        out,
    )
    recs = lines(out)
    assert [Path(d["job"]["candidate"]).name for d in recs] == ["candidate.py", "good.py", "good.py"], (
        r.stdout[-2000:] + r.stderr[-2000:]
    )
    assert re.match(
        r"error: at .+ \(odd sizes\) the reference raised a CUDA error that leaves the judge's GPU "
        r"context unusable",
        recs[0]["verdict"],
    ), recs[0]["verdict"]
    assert recs[0]["slot_broken"]
    assert all(d["ok"] and d["verdict"].startswith("accepted") for d in recs[1:]), [d["verdict"] for d in recs]


def test_a_job_short_of_gpu_memory_beside_other_slots_is_judged_again_alone(tmp_path, monkeypatch):
    """A job that got no verdict for want of GPU memory (the plan found too little free, or other processes took or
    held memory) is judged once more at the end with the GPU to itself (its other slots closed, no box started
    ahead), and only that verdict is recorded; on a CPU slot, no verdict is recorded as it is."""
    from kp.batch import backends

    busy = {"now": 0, "most": 0, "most_again": 0, "ahead_again": 0}

    class FakeSlot:  # in this process: answers each job's first try with no verdict for memory, its second accepted
        tries: dict = {}
        made: list = []

        def __init__(self, gpu, log_path, forks, job_first=False):
            self.gpu, self.job, self.key, self.reserved, self.closed = gpu, None, None, [], False
            self.last_candidate = None
            FakeSlot.made.append(self)

        def submit(self, job, key=None, ahead=(), spare=False):
            assert not self.closed
            self.job, self.key, self.polls = job, key, 0
            busy["now"] += 1
            which = "most_again" if key in FakeSlot.tries else "most"
            busy[which] = max(busy[which], busy["now"])
            if key in FakeSlot.tries:  # the second try: the GPU's other slots are gone and no box starts ahead
                assert all(s.closed for s in FakeSlot.made if s is not self and s.gpu == self.gpu)
                busy["ahead_again"] = max(busy["ahead_again"], len(ahead))

        def poll(self, timeout_s):
            self.polls += 1
            if self.job is None or self.polls < 3:
                return None
            n = FakeSlot.tries[self.key] = FakeSlot.tries.get(self.key, 0) + 1
            self.job, busy["now"] = None, busy["now"] - 1
            if n == 1:
                return {
                    "ok": False,
                    "verdict": "error: softmax needs about 36.0 GiB; 9.4 GiB are free",
                    "record": None,
                    "gpu_memory": True,
                }
            return {"ok": True, "verdict": "accepted", "record": None}

        def ask_to_end(self):  # kp.batch.slots.end_all's side of a slot: asked (or killed), then its process joined
            self.closed = True

        kill = close = lambda self, wait_s=0: self.ask_to_end()

        class proc:  # noqa: N801 (a process that has ended)
            join = staticmethod(lambda timeout=None: None)
            is_alive = staticmethod(lambda: False)

    monkeypatch.setattr(backends, "Slot", FakeSlot)
    monkeypatch.setattr(backends, "build_ahead_of_slots", lambda jobs, gpus, timeout_s, procs=None: (jobs, None))
    monkeypatch.setattr(backends, "_forks_workers", lambda jobs: False)
    jobs = [jobfile.make_job(("file", CASES / "ref.py"), c, {"device": "cuda", "seed": 1}) for c in CANDS[:4]]
    out = tmp_path / "r.jsonl"
    res = backends.run_local(jobs, ["0", "0", "0"], out, progress=False)
    assert [d["verdict"] for d in res] == ["accepted"] * 4 and len(lines(out)) == 4
    assert busy["most"] == 3 and busy["most_again"] == 1 and busy["now"] == 0  # the second tries one at a time
    assert busy["ahead_again"] == 0
    FakeSlot.tries.clear()
    busy["most"] = 0
    # each GPU to one slot: shared still, with the boxes the slot starts ahead (a CUDA context each), so judged
    # again too; a CPU slot's no-verdict is recorded as it is (nothing to give it to itself)
    res = backends.run_local(jobs, ["0", "1"], tmp_path / "r2.jsonl", progress=False)
    assert [d["verdict"] for d in res] == ["accepted"] * 4
    FakeSlot.tries.clear()
    res = backends.run_local(jobs, [None], tmp_path / "r3.jsonl", progress=False)
    assert all(d["verdict"].startswith("error: softmax needs") for d in res) and len(res) == 4
    # what marks such a job: the judge's GpuMemoryShort, not any usage error
    from kp.batch import slot_process
    from kp.errors import GpuMemoryShort, UsageError
    from kp.judge import driver

    for error, marked in ((GpuMemoryShort("softmax needs about 36.0 GiB"), True), (UsageError("no such file"), False)):
        monkeypatch.setattr(driver, "evaluate", lambda *a, error=error, **k: (_ for _ in ()).throw(error))
        r = slot_process.run_job(jobs[0])
        assert r["verdict"].startswith("error: ") and r["gpu_memory"] is marked


def test_the_batch_table_leaves_out_empty_columns_and_says_where_a_candidate_raised(tmp_path):
    """Nothing timed (the CPU, --no-bench): no timing columns; a rejection whose call raised in the candidate's own
    code names its file and line; the progress line while the batch runs is the verdict's head and its seconds."""
    from kp.batch.backends import short_verdict
    from kp.batch.jobfile import format_table

    cand = tmp_path / "raises.py"
    tb = f'Traceback (most recent call last):\n  File "{cand}", line 4, in forward\n    return x.view(-1, 7)\n'
    lines = [
        {
            "job": {"name": "ref: good.py"},
            "gpu": "cpu0",
            "ok": True,
            "elapsed_s": 9.0,
            "summary": {},
            "verdict": "accepted (parity only on cpu) in 9.0 s",
        },
        {
            "job": {"name": "ref: raises.py"},
            "gpu": "cpu0",
            "ok": False,
            "status": "rejected",
            "elapsed_s": 0.5,
            "summary": {},
            "verdict": "rejected: trial 1 (seed 5): raised RuntimeError: shape in 0.5 s",
            "record": {"rows": {"candidate": {"traceback": tb, "path": str(cand)}}},
        },
    ]
    table = format_table(lines)
    assert table.splitlines()[0].split() == ["job", "gpu", "s", "verdict"], table
    assert table.splitlines()[2].endswith("in 0.5 s [at raises.py:4]"), table
    lines[1]["failure"] = {"kind": "raised", "stage": "parity", "check": "trial 1 (seed 5)", "figures": None}
    assert short_verdict(lines[1]) == "rejected: trial 1 (seed 5) (raised) in 0.5 s"
    assert short_verdict(lines[0]) == "accepted in 9.0 s"
    assert table.splitlines()[-1] == "1 accepted, 1 rejected"
    lines[1]["verdict"] = "rejected: shapes: right at 64x1000 only, wrong at 63x999 (odd sizes): trial 1 (seed 5)"
    lines[1]["failure"]["member"] = {"name": "odd", "shape": "63x999"}
    assert (
        format_table(lines).splitlines()[-1] == "1 accepted, 1 rejected (1 of them right at the benchmark's shape only)"
    )
    lines.append(
        {
            "job": {"name": "ref: cuda_only.py"},
            "gpu": "cpu0",
            "ok": False,
            "status": "no_verdict",
            "elapsed_s": 1.0,
            "summary": {},
            "verdict": "error: it needs a GPU",
        }
    )
    assert format_table(lines).splitlines()[-1].endswith(", 1 no verdict"), format_table(lines)
    assert short_verdict(lines[2]) == "no verdict: it needs a GPU in 1.0 s"
    row = next(ln for ln in format_table(lines).splitlines() if ln.startswith("ref: cuda_only.py"))
    assert row.endswith("  no verdict: it needs a GPU") and "error" not in row, row
    # two jobs of one reference that a probe passed (kp.judge.probes): the reference counted once
    weak = {"probes": {"shape": "4096x1", "probes": {}, "weak": ["constant"]}, "rows": {}}
    for d in lines[:2]:
        d["job"]["ref"], d["record"] = ["file", "/x/ref.py"], {**(d.get("record") or {}), **weak}
    assert (
        format_table(lines)
        .splitlines()[-1]
        .endswith("; 1 reference that cannot tell a right kernel from a probe (their notes say which)")
    ), format_table(lines)


def test_build_jobs_sets_how_many_candidates_a_batch_builds_ahead_at_once(tmp_path, monkeypatch, cli):
    """`--build-jobs N` reaches the batch's builds ahead (by default one per core), so a host's best count can be
    measured; fewer than one is a usage error."""
    from kp.batch import backends

    seen = []

    def builds(jobs, gpus, timeout_s, procs=None):
        seen.append(procs)
        return jobs, None

    monkeypatch.setattr(backends, "build_ahead_of_slots", builds)
    jobs = tmp_path / "jobs.csv"
    jobs.write_text(f"reference,candidate\n{CASES / 'ref.py'},{CASES / 'good.py'}\n")
    r = cli("--jobs", jobs, "--device", "cpu", "--allow-torch", "--build-jobs", "7", "--out", tmp_path / "r.jsonl")
    assert r.returncode == 0 and seen == [7], (seen, r.stdout[-2000:], r.stderr[-2000:])
    assert cli("--jobs", jobs, "--device", "cpu", "--build-jobs", "0").returncode == 2


def test_identical_files_are_judged_once_and_recorded_for_each(cli, tmp_path):
    """Three copies of one candidate and a fourth file: two judgements, four records (each copy's names the file
    judged in `same_as`), said so; a second run on the same --out judges nothing, and a further copy made since is
    recorded from the verdict already there."""
    for n in ("a", "b", "c"):
        (tmp_path / f"{n}.py").write_text((CASES / "good.py").read_text())
    (tmp_path / "d.py").write_text((CASES / "wrong.py").read_text())
    out = tmp_path / "r.jsonl"
    base = ["--ref", CASES / "ref.py", "--device", "cpu", "--allow-torch", "--no-sandbox", "--out", out]
    r = cli(*base, "--candidate", *sorted(tmp_path.glob("?.py")))
    assert "2 identical to another file (judged once, recorded for each), 2 to run" in r.stderr, r.stderr
    recs = lines(out)
    assert sorted(Path(d["job"]["candidate"]).name for d in recs) == ["a.py", "b.py", "c.py", "d.py"]
    assert sorted(d.get("same_as", "") for d in recs) == ["", "", "ref: a.py", "ref: a.py"]
    assert {d["verdict"] for d in recs if Path(d["job"]["candidate"]).name in "a.py b.py c.py"} == {
        next(d["verdict"] for d in recs if d["job"]["candidate"].endswith("a.py"))
    }
    (tmp_path / "e.py").write_text((CASES / "good.py").read_text())
    r = cli(*base, "--candidate", *sorted(tmp_path.glob("?.py")))
    assert "4 of 5 jobs already recorded, 1 identical to another file" in r.stderr, r.stderr
    assert len(lines(out)) == 5 and lines(out)[-1]["same_as"] == "ref: a.py"


def test_one_run_at_a_time_writes_a_results_file(tmp_path):
    """A second run on the --out another run is writing is refused at once, naming it (exit 2), instead of judging
    every job a second time beside it."""
    import fcntl

    out = tmp_path / "r.jsonl"
    with open(tmp_path / "r.jsonl.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("pid 1234")
        lock.flush()
        r = run_script(
            "--ref",
            CASES / "ref.py",
            "--candidate",
            CASES / "good.py",
            "--device",
            "cpu",
            "--allow-torch",
            "--out",
            out,
        )
    assert r.returncode == 2 and "is being written by another run (pid 1234)" in r.stderr, r.stderr
    assert not out.exists()


def test_a_batch_tables_row_is_at_most_200_characters_the_record_keeping_the_whole_verdict():
    """A row whose whole verdict would pass 200 characters says it without its notes (the record and the results
    file keep them), a rejection's reason shortened as a command's last line is."""
    from kp.batch.jobfile import format_table
    from kp.observe.verdict import verdict

    def rec(accepted, reason=""):
        row = {
            "accepted": accepted,
            "reason": reason,
            "checks": {},
            "peer": False,
            "pure_torch": False,
            "own_kernels": {},
        }
        return {"rows": {"candidate": row}, "elapsed_s": 2.1, "notes_list": ["a note " * 30], "device": "cpu"}

    ok, bad = (
        rec(True),
        rec(
            False,
            "trial 1 (seed 203155838): relL2 1.00e+00 over budget 1.00e-06 (worst row "
            "1.13e+00, row budget 1.00e-06); an explanation " + "x" * 40,
        ),
    )
    lines = [
        {
            "job": {"name": f"ref: {k}.py"},
            "gpu": "cpu0",
            "ok": r["rows"]["candidate"]["accepted"],
            "elapsed_s": 2.0,
            "summary": {},
            "verdict": verdict(r),
            "record": r,
        }
        for k, r in (("ok", ok), ("bad", bad))
    ]
    rows = format_table(lines).splitlines()[1:3]
    assert all(len(r) <= 200 for r in rows), rows
    assert rows[0].endswith("accepted in 2.1 s (notes in the record)")
    assert rows[1].endswith(
        "rejected: trial 1 (seed 203155838): relL2 1.00e+00 over budget 1.00e-06 (worst row "
        "1.13e+00, row budget 1.00e-06) in 2.1 s"
    )


# A candidate that, the first time it is imported, kills the slot's judge: the nearest ancestor of its worker that
# multiprocessing spawned (the worker's own parent is the slot's forkserver).
KILLED_ONCE = """import os
import signal
from pathlib import Path

import torch.nn as nn

_mark = Path(__file__).with_suffix(".killed")
if not _mark.exists():
    _mark.write_text("once")
    pid = os.getppid()
    while pid > 1 and b"spawn_main" not in Path(f"/proc/{pid}/cmdline").read_bytes():
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(pid, signal.SIGKILL)


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0)
"""


def test_a_judge_killed_from_outside_is_no_verdict_and_judged_again_alone(tmp_path):
    """A job whose judge's process is killed (here by the candidate itself, unboxed, the first time it is imported:
    as the host's memory killer would) gets no verdict, not a rejection, and is judged again at the end on its own;
    judged again, it gets its verdict."""
    killer = tmp_path / "killed_once.py"
    killer.write_text(KILLED_ONCE)
    out = tmp_path / "results.jsonl"
    r = run_script(
        "--ref",
        CASES / "ref.py",
        "--candidate",
        killer,
        CASES / "good.py",
        "--device",
        "cpu",
        "--slots",
        "2",
        "--allow-torch",
        "--no-sandbox",
        "--seed",
        "5",
        "--out",
        out,
    )
    assert (
        "killed_once.py: no verdict: the judge's process died (signal 9, SIGKILL); judged again at the end, "
        "alone" in r.stderr
    ), r.stderr[-3000:]
    recs = {Path(d["job"]["candidate"]).name: d for d in lines(out)}
    assert set(recs) == {"killed_once.py", "good.py"}, r.stdout[-2000:]
    assert recs["killed_once.py"]["status"] == "accepted", recs["killed_once.py"]["verdict"]
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_a_line_written_before_lines_had_a_status_is_counted_by_its_data():
    """A results file of an earlier version (no status): ok is accepted, a failure or a failed row rejected, a line
    without a record no verdict; its verdict's words are not read."""
    from kp.batch.jobfile import status_of

    assert status_of({"ok": True, "verdict": "error: words are not read"}) == "accepted"
    assert status_of({"ok": False, "verdict": "error: x", "failure": {"kind": "timeout"}}) == "rejected"
    row = {"rows": {"candidate": {"accepted": False, "reason": "relL2 1.0"}}}
    assert status_of({"ok": False, "verdict": "error: x", "record": row}) == "rejected"
    assert status_of({"ok": False, "verdict": "rejected: words are not read", "record": None}) == "no_verdict"
    assert status_of({"ok": False, "status": "rejected", "verdict": ""}) == "rejected"
