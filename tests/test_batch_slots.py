"""How a batch keeps its slots fed: the candidates' own builds run ahead (at import, in __init__ or at the first
call), each slot told its next job so its box starts while the job before it runs, boxes ahead as far as the cores
allow, a wait for the GPU not charged to the job, and the throughput line a batch ends with."""

import re
import time
from pathlib import Path

import pytest

from conftest import ROOT
from kp.batch import jobfile
from kp.box import sandbox

CASES = ROOT / "tests" / "batch"
CANDS = sorted(p for p in CASES.glob("*.py") if p.name != "ref.py")


def test_candidates_that_build_their_own_extension_are_built_ahead(tmp_path):
    """Where a batch has more candidates that build an extension than slots, and the host more cores: each is
    imported once beforehand in its box with its build folder, and the judging's import finds what that left.
    Here the 'build' is a file the import writes into its build folder; the candidate is right only when it finds
    it there at its import (a judged import that had to build gives the identity instead of the ReLU). The build
    ahead runs at a lower CPU priority than the judges beside it (it writes its niceness into the file)."""
    import os
    from kp.box.builds import candidate_build_dir
    from kp.batch import ahead, slot_process

    src = (
        "import os\nimport pathlib\n\nimport torch\nimport torch.nn as nn\nfrom torch.utils import cpp_extension  "
        "# noqa: F401\n\n# {tag}\nmark = pathlib.Path(os.environ['TORCH_EXTENSIONS_DIR']) / 'built'\n"
        "AHEAD = mark.exists()\nmark.write_text(str(os.nice(0)))\n\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        return torch.relu(x) if AHEAD else x\n"
    )
    opts = {"device": "cpu", "allow_torch": True, "compile_baseline": False, "seed": 5}
    jobs = []
    for name in ("cold", "ahead"):  # contents of their own: build folders of their own
        (tmp_path / f"{name}.py").write_text(src.format(tag=f"{name} {tmp_path}"))
        jobs.append(jobfile.make_job(("file", str(CASES / "ref.py")), tmp_path / f"{name}.py", opts))
    pure = jobfile.make_job(("file", str(CASES / "ref.py")), CASES / "good.py", opts)
    assert ahead.worth_it(jobs + [pure], slots=1, procs=4) == jobs  # good.py builds nothing
    assert ahead.worth_it(jobs + [pure], slots=1, procs=1) == [] and ahead.worth_it(jobs, slots=2, procs=8) == []
    said = []
    assert ahead.build_ahead(jobs[1:], procs=2, timeout_s=120, log=said.append) == {jobs[1].candidate: None}
    assert "building 1 candidates' own extensions ahead" in said[0] and said[-1].startswith("[kp] built ahead in")
    assert int((candidate_build_dir(jobs[1].candidate) / "built").read_text()) == min(19, os.nice(0) + 10)
    cold, warm = slot_process.run_job(jobs[0]), slot_process.run_job(jobs[1])
    assert not cold["ok"] and "trial 1" in cold["verdict"], cold["verdict"]
    assert warm["ok"], warm["verdict"]


def test_a_candidate_built_ahead_once_is_not_built_ahead_again(tmp_path, capsys):
    """A build ahead that imported its candidate cleanly marks the candidate's cache folder; a later batch's builds
    ahead pass that candidate by (its judging's import still loads the build), while one that failed to import is
    tried again, and an edited file (other contents, another folder) is built again."""
    from kp.batch import ahead
    from kp.box.builds import BUILT, candidate_build_dir

    ok = (
        "import torch\nimport torch.nn as nn\nfrom torch.utils import cpp_extension  # noqa: F401\n# {tag}\n\n\n"
        "class ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
    )
    opts = {"device": "cpu", "allow_torch": True, "compile_baseline": False, "seed": 5}
    jobs = []
    for name, src in (("ok", ok), ("bad", ok + "raise RuntimeError('no build')\n")):
        (tmp_path / f"{name}.py").write_text(src.format(tag=f"{name} {tmp_path}"))
        jobs.append(jobfile.make_job(("file", str(CASES / "ref.py")), tmp_path / f"{name}.py", opts))
    res = ahead.build_ahead(jobs, procs=2, timeout_s=120, log=lambda s: None)
    assert res[jobs[0].candidate] is None and "no build" in res[jobs[1].candidate], res
    assert (candidate_build_dir(jobs[0].candidate) / BUILT).exists()
    assert not (candidate_build_dir(jobs[1].candidate) / BUILT).exists()
    assert ahead.to_build(jobs) == [jobs[1]] and ahead.worth_it(jobs, slots=1, procs=4) == []
    order, builds = ahead.build_ahead_of_slots(jobs, [None], timeout_s=120, procs=4)
    assert builds is None and "1 candidates' own extensions found built" in capsys.readouterr().err
    (tmp_path / "ok.py").write_text(ok.format(tag="edited"))
    assert ahead.to_build(jobs) == jobs


def test_a_build_kept_in_a_helper_beside_the_candidate_is_the_candidates(tmp_path):
    """A candidate whose `load_inline` sits in a module of its own folder that it imports (directly or through
    another) builds at its import all the same: it is built ahead, one build per call there; an import of an
    installed package, or of a helper that builds nothing, is not a build."""
    from kp.batch import ahead

    d = tmp_path
    (d / "_ext.py").write_text("from torch.utils.cpp_extension import load_inline\next = load_inline(name='e')\n")
    (d / "_via.py").write_text("from _ext import ext  # noqa: F401\n")
    (d / "_plain.py").write_text("import math\n")
    (d / "direct.py").write_text("import torch\nfrom _ext import ext\n")
    (d / "through.py").write_text("import _via\n")
    (d / "plain.py").write_text("import torch\nimport _plain\nimport os.path\n")
    (d / "broken.py").write_text("import _ext\ndef (:\n")
    assert [ahead.builds_own_extension(d / f"{n}.py") for n in ("direct", "through", "plain")] == [True, True, False]
    assert ahead.builds_in(d / "direct.py") == 1 and ahead.builds_in(d / "plain.py") == 1
    assert not ahead.builds_own_extension(d / "broken.py")  # its own text only: no import is read from it
    (d / "_ext.py").write_text((d / "_ext.py").read_text() + "two = load_inline(name='f')\n")
    assert ahead.builds_in(d / "through.py") == 2


def test_builds_start_longest_first_and_are_judged_as_they_are_expected_to_end(tmp_path, monkeypatch):
    """A file that builds two extensions (one after the other in its import) starts building first, so it does not
    begin in the builds' last round and hold up the batch's end, and has twice the time; the slots meet the
    candidates in the order their builds are expected to end, the files that build nothing first."""
    from kp.batch import ahead

    one = "from torch.utils.cpp_extension import load_inline\nm = load_inline(name='a{i}', cpp_sources='')\n"
    two = one + "n = load_inline(name='b', cpp_sources='')\n"
    bare = (
        "from torch.utils.cpp_extension import load, load_inline\nm = load(name='c', sources=[])\n"
        "n = torch.load('w.pt')\no = load(name='d', sources=[])\n"
    )
    files = {"s0": one, "s1": one, "s2": one, "long": two, "bare": bare}
    opts = {"device": "cpu", "allow_torch": True, "compile_baseline": False, "seed": 5}
    jobs = []
    for i, (name, text) in enumerate(files.items()):
        (tmp_path / f"{name}.py").write_text(text.format(i=i))
        for mode in ("train", "eval"):
            jobs.append(
                jobfile.make_job(("file", str(CASES / "ref.py")), tmp_path / f"{name}.py", dict(opts, mode=mode))
            )
    pure = jobfile.make_job(("file", str(CASES / "ref.py")), CASES / "good.py", opts)
    assert [ahead.builds_in(tmp_path / f"{n}.py") for n in files] == [1, 1, 1, 2, 2]  # torch.load is no build
    starts, ends = ahead.schedule(jobs[::2], procs=2)
    stem = lambda j: Path(j.candidate).stem  # noqa: E731
    assert [stem(j) for j in starts] == ["long", "bare", "s0", "s1", "s2"]
    assert [ends[j.candidate] for j in starts] == [2.0, 2.0, 3.0, 3.0, 4.0]
    limits = {}  # each build ahead may take the job's limit once per extension it builds, one after another
    monkeypatch.setattr(ahead, "build_one", lambda job, timeout_s: limits.update({stem(job): timeout_s}))
    ahead.build_ahead(starts, procs=2, timeout_s=100, log=lambda s: None)
    assert limits == {"long": 200, "bare": 200, "s0": 100, "s1": 100, "s2": 100}
    monkeypatch.setattr(ahead, "LIMITS_MOST", 1)  # and no more than LIMITS_MOST of them
    ahead.build_ahead(starts[:1], procs=2, timeout_s=100, log=lambda s: None)
    assert limits["long"] == 100
    started = []
    monkeypatch.setattr(ahead, "build_ahead", lambda todo, procs, timeout_s, log: started.extend(todo))
    order, thread = ahead.build_ahead_of_slots(jobs + [pure], [None], timeout_s=60, procs=2)
    thread.join()
    assert [stem(j) for j in started] == ["long", "bare", "s0", "s1", "s2"]
    assert [(stem(j), dict(j.opts).get("mode")) for j in order] == [("good", "train")] + [
        (n, m) for n in ("long", "bare", "s0", "s1", "s2") for m in ("train", "eval")
    ]


def test_builds_started_in_init_or_at_the_first_call_are_built_ahead_too(tmp_path):
    """A candidate that builds in its ModelNew's __init__ or at its first call is built ahead as well: its ModelNew
    made and called on the meta device, where the build runs and nothing else does. The 'build' is a file written
    into its build folder; each candidate is right only when it finds the file there when its judging reaches the
    build (a judging that had to build gives the identity instead of the ReLU). A batch judges the candidates that
    build nothing first, while the builds run beside it."""
    from kp.batch import ahead, slot_process

    head = (
        "import os\nimport pathlib\n\nimport torch\nimport torch.nn as nn\nfrom torch.utils import cpp_extension  "
        "# noqa: F401\n\n# {tag}\n\n\ndef build():\n    mark = pathlib.Path(os.environ['TORCH_EXTENSIONS_DIR']) "
        "/ 'built'\n    ahead = mark.exists()\n    mark.write_text('x')\n    return ahead\n\n\n"
    )
    in_init = (
        "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.ahead = build()\n\n    def forward(self, x):\n"
        "        return torch.relu(x) if self.ahead else x\n"
    )
    first_call = (
        "class ModelNew(nn.Module):\n    ahead = None\n\n    def forward(self, x):\n"
        "        if self.ahead is None:\n            self.ahead = build()\n"
        "        return torch.relu(x).clone() if self.ahead else x\n"
    )
    opts = {"device": "cpu", "allow_torch": True, "compile_baseline": False, "seed": 5}
    jobs = []
    for name, body in (("init", in_init), ("first_call", first_call)):
        (tmp_path / f"{name}.py").write_text(head.format(tag=f"{name} {tmp_path}") + body)
        jobs.append(jobfile.make_job(("file", str(CASES / "ref.py")), tmp_path / f"{name}.py", opts))
    pure = jobfile.make_job(("file", str(CASES / "ref.py")), CASES / "good.py", opts)
    order, builds = ahead.build_ahead_of_slots(jobs + [pure], [None], timeout_s=120, procs=2)
    assert order == [pure] + jobs and builds is not None  # what builds nothing is judged first
    builds.join(120)
    for job in jobs:
        res = slot_process.run_job(job)
        assert res["ok"], (job.candidate, res["verdict"])


def test_each_slot_is_told_its_next_job_and_every_job_runs_once(monkeypatch):
    """A slot holds the job it runs next (its box is started while the job before it runs): each job is run once,
    a slot's next job is the one it was told of, and at the end of the queue an idle slot takes another slot's next
    job rather than wait for that slot."""
    from collections import deque
    from kp.batch import backends

    runs, told = [], {}

    class FakeSlot:
        def __init__(self, polls_per_job):
            self.job, self.key, self.reserved, self.per = None, None, [], polls_per_job
            self.last_candidate = None

        def submit(self, job, key=None, ahead=(), spare=False):
            told.setdefault(id(self), []).append((key, [key_of[j] for j in ahead]))
            self.job, self.key, self.polls = job, key, 0
            runs.append(key)

        def poll(self, timeout_s):
            self.polls += 1
            if self.job is None or self.polls < self.per:
                return None
            self.job = None
            return {"ok": True, "verdict": "accepted", "record": None}

    monkeypatch.setattr(backends.time, "sleep", lambda s: None)
    monkeypatch.setattr(backends.os, "cpu_count", lambda: 64)  # cores enough for every box ahead
    jobs = [
        (jobfile.make_job(("file", CASES / "ref.py"), CANDS[i % len(CANDS)], {"seed": i}), f"k{i}") for i in range(12)
    ]
    key_of = {j: k for j, k in jobs}
    fast, slow = FakeSlot(1), FakeSlot(80)
    finished = []
    backends._drain(
        deque(jobs),
        [(fast, "a"), (slow, "b")],
        60,
        backends.Progress(12, False),
        lambda s, n, j, k, r: finished.append(k),
    )
    assert sorted(runs) == sorted(k for _, k in jobs) and sorted(finished) == sorted(runs)
    for slot, other in ((fast, slow), (slow, fast)):  # a slot's next job is the first it was told of, or went
        seq, elsewhere = told[id(slot)], {k for k, _ in told[id(other)]}  # to the other slot
        for (_, ahead), (nxt, _) in zip(seq, seq[1:]):
            assert not ahead or ahead[0] == nxt or ahead[0] in elsewhere
        assert all(len(a) <= backends.AHEAD_MOST for _, a in seq)
    assert max(len(a) for _, a in told[id(fast)]) == backends.AHEAD_MOST  # a full queue: that many told ahead
    slow_told = {k for _, a in told[id(slow)] for k in a}
    assert slow_told & {k for k, _ in told[id(fast)]}  # the idle fast slot took the slow one's next jobs


def test_boxes_ahead_follow_the_cores_a_slot_has():
    """A slot starts boxes ahead only as far as its share of the cores allows: one on a 2-core host, more where each
    slot has cores to spare for the boxes' imports beside the job it runs."""
    from kp.batch import backends
    import unittest.mock as mock

    with mock.patch.object(backends.os, "cpu_count", lambda: 2):
        assert backends.ahead(1) == 1 and backends.ahead(4) == 1
    with mock.patch.object(backends.os, "cpu_count", lambda: 64):
        assert backends.ahead(12) == 2 and backends.ahead(4) == backends.AHEAD_MOST


def test_a_slots_process_imports_nothing_heavy_before_its_first_jobs_box():
    """What a slot's fresh interpreter imports before its loop (the module its process runs) pulls in neither torch
    nor the judge, so the first job's box starts before them."""
    import subprocess
    import sys

    code = (
        "import sys, kp.batch.slot_process\nprint(sorted(m for m in ('torch', 'kp.judge.driver') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


@pytest.mark.skipif(sandbox.status()[0] is None, reason=f"no sandbox here: {sandbox.status()[1]}")
def test_a_slots_first_job_takes_the_box_started_before_the_slots_own_start():
    """A batch's slot reads its first job as it starts and starts that job's box before its own imports: the job
    takes that box (its record's boxes_started_ahead), rather than starting one when it begins."""
    from kp.batch import backends

    opts = {"device": "cpu", "allow_torch": True, "compile_baseline": False, "seed": 5}
    job = jobfile.make_job(("file", str(CASES / "ref.py")), CASES / "good.py", opts)
    (res,) = backends.run_local([job], [None], None, timeout_s=120, progress=False)
    assert res["ok"], res["verdict"]
    assert res["record"]["boxes_started_ahead"] == [True]


def test_a_slot_does_not_charge_waiting_for_the_gpu_to_its_job():
    """The judge in a slot tells each wait for other judges on its GPU; the slot moves the limit it kills the job at
    by it, and the job's elapsed time still counts it."""
    import multiprocessing as mp
    from kp.batch import slots

    s = slots.Slot.__new__(slots.Slot)
    s.conn, child = mp.Pipe()
    s.proc = type("Alive", (), {"is_alive": lambda self: True})()
    s.job, s.key, s.t0, s.started, s.waited, s.gpu_name = "job", "k", time.monotonic() - 140, True, 0.0, "gpu"
    child.send({"waited": 40.0})
    time.sleep(0.1)
    assert s.poll(timeout_s=90) is None  # 140 s in, 40 of them waiting: 100 s of its own, under 90 + 30 s grace
    assert s.waited == 40.0
    child.send({"ok": True, "verdict": "accepted"})
    time.sleep(0.1)
    res = s.poll(timeout_s=90)
    assert res["verdict"] == "accepted" and 139 < res["elapsed_s"] < 150


def test_a_batch_ends_with_its_throughput(monkeypatch):
    """The line a user plans with: verdicts per hour, how busy the slots were, each GPU's utilisation from
    nvidia-smi's samples (a GPU named by index or by UUID), or why it was not measured, and how busy the run's cores
    were."""
    import shutil
    import subprocess
    import types
    from kp.batch import backends

    assert (
        backends.throughput([{"elapsed_s": 2}, {"elapsed_s": 3}], 10, 1)
        == "2 verdicts in 10 s: 720 verdicts per hour on 1 slot; the slots were judging 50% of the time"
    )
    assert backends.throughput([{"elapsed_s": 2}], 10, None) == "1 verdicts in 10 s: 360 verdicts per hour"
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    out = "0, GPU-aaa, 40\n1, GPU-bbb, 80\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: types.SimpleNamespace(stdout=out))
    use = backends.GpuUse(["0", "GPU-bbb", "0"], every_s=0.01)
    time.sleep(0.2)
    assert use.line() == "GPU utilisation (nvidia-smi, mean over the run): GPU 0 40%, GPU GPU-bbb 80%"
    assert backends.GpuUse([None]).line() == "GPU utilisation: no GPU in this run"
    cpu = backends.CpuUse()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:  # this process keeps one of its cores busy
        pass
    assert 0 < cpu.busy() <= 1
    assert re.fullmatch(rf"CPU \(its {len(cpu.cores)} cores, /proc/stat\): \d+% busy", cpu.line())


class _SlowToDie:
    """A slot (its own process stand-in) that ends `dies_s` after it is killed, or after it is asked to end where it
    is idle: a process that held a CUDA context, whose driver tears the context down before it is gone."""

    def __init__(self, dies_s: float, busy: bool = False):
        self.dies_s, self.busy, self.end_at, self.kills = dies_s, busy, None, 0
        self.proc = self

    def ask_to_end(self):
        if not self.busy:
            self.end_at = self.end_at or time.monotonic() + self.dies_s

    def kill(self, wait_s):
        self.kills += 1
        self.end_at = self.end_at or time.monotonic() + self.dies_s
        self.join(wait_s)

    def is_alive(self):
        return self.end_at is None or time.monotonic() < self.end_at

    def join(self, timeout):
        left = timeout if self.end_at is None else min(timeout, self.end_at - time.monotonic())
        time.sleep(max(0.0, left))


def test_slots_are_ended_together_not_one_after_another():
    """A stopped batch (Ctrl-C, a time limit's signal) kills its slots and waits for all of them at once: twelve
    slots that take a second each to die end in about a second, not twelve. A busy slot asked to end is killed once
    the shared wait is over."""
    from kp.batch.slots import end_all

    many = [_SlowToDie(1.0) for _ in range(12)]
    t = time.monotonic()
    end_all(many, kill=True, wait_s=5.0)
    took = time.monotonic() - t
    assert not any(s.is_alive() for s in many) and took < 3.0, took
    idle, busy = _SlowToDie(0.5), _SlowToDie(0.5, busy=True)
    t = time.monotonic()
    end_all([idle, busy], wait_s=1.0)
    took = time.monotonic() - t
    assert not idle.is_alive() and idle.kills == 0  # it ended when asked
    assert not busy.is_alive() and busy.kills == 1 and 1.4 < took < 3.0, took  # killed after the shared wait


def test_each_gpu_gets_slots_by_the_cores_unless_the_list_counts_its_own(monkeypatch):
    """--gpus all on a host of 16 cores a GPU: three slots a GPU (the measured default); fewer where each slot would
    have under 5 cores; --slots N sets the count; a list that names a GPU more than once is its own count, and
    --slots beside it is a usage error, as is a count that is not one."""
    import os
    import pytest
    from kp.batch import gpus
    from kp.errors import UsageError

    monkeypatch.setattr(gpus, "gpu_list", lambda spec: spec.split(","))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)))
    assert gpus.slot_list("0,1") == ["0", "0", "0", "1", "1", "1"]
    assert gpus.slot_list("0,1", "auto") == ["0", "0", "0", "1", "1", "1"]
    assert gpus.slot_list("0,1", "2") == ["0", "0", "1", "1"]
    assert gpus.slot_list("0,0,1") == ["0", "0", "1"]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)))
    assert gpus.slot_list("0,1") == ["0", "1"]
    for spec, slots in (("0,0,1", "2"), ("0", "many"), ("0", "0")):
        with pytest.raises(UsageError, match="--slots"):
            gpus.slot_list(spec, slots)


def test_the_heaviest_jobs_are_judged_first(tmp_path, monkeypatch):
    """A batch starts its --sanitize jobs (several times a plain job's judging) before the others, the others in the
    order given, so that its end waits on no long job begun last."""
    from kp.batch import backends

    seen = []

    def stop_here(jobs, gpus, timeout_s, procs=None):
        seen.extend(Path(j.candidate).stem + ("+sanitize" if dict(j.opts).get("sanitize") else "") for j in jobs)
        raise KeyboardInterrupt

    monkeypatch.setattr(backends, "build_ahead_of_slots", stop_here)
    opts = {"device": "cpu", "allow_torch": True, "compile_baseline": False, "seed": 5}
    jobs = []
    for i, flag in enumerate((False, True, False, True)):
        f = tmp_path / f"c{i}.py"
        f.write_text(f"# {i}\n" + (CASES / "good.py").read_text())
        jobs.append(jobfile.make_job(("file", str(CASES / "ref.py")), f, dict(opts, sanitize=True) if flag else opts))
    with pytest.raises(KeyboardInterrupt):
        backends.run_local(jobs, [None], None, progress=False)
    assert seen == ["c1+sanitize", "c3+sanitize", "c0", "c2"]
    assert [backends.judging_weight(j) for j in jobs] == [1, backends.SANITIZE_WEIGHT, 1, backends.SANITIZE_WEIGHT]
