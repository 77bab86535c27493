"""Starting a candidate's box ahead of its job and handing it over (kp.box.start): a box is adopted only by a job
it was made for (the same reference, folders, environment and file, whatever the file's contents now), is lent the
builds cached for the contents it judges, waits for a build running ahead, and leaves no process when discarded."""

import contextlib
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

from conftest import ROOT
from kp.box import builds
from kp.box import sandbox

REF = ROOT / "tests" / "judge_cases" / "relu" / "ref.py"

needs_box = pytest.mark.skipif(sandbox.status()[0] is None, reason=f"no sandbox here: {sandbox.status()[1]}")


@needs_box
def test_a_box_started_early_is_adopted_by_the_same_job_only(tmp_path):
    """The command line starts the candidate's box before torch is imported; the judge adopts it when the job it
    sets up is the one the box was made for (same folders and environment), and starts a fresh one otherwise."""
    from kp.box import start as boxstart

    cand = tmp_path / "cand.py"
    cand.write_text((ROOT / "tests" / "batch" / "good.py").read_text())
    spec = ("file", str(REF))
    boxstart.start_early(spec, str(cand))
    (early,) = boxstart.waiting()
    assert early.proc.is_alive()
    paths, build = boxstart.candidate_paths(cand), str(builds.candidate_build_dir(cand))
    box = boxstart.take(spec, paths, build)
    try:
        assert box is early and not boxstart.waiting()
    finally:
        box.discard()
    boxstart.start_early(spec, str(cand))
    (early,) = boxstart.waiting()
    other = boxstart.take(("file", str(ROOT / "tests" / "judge_cases" / "sum_dim" / "ref.py")), paths, build)
    try:
        assert other is not early and not early.proc.is_alive()  # another reference: the early box is killed
        assert other.missed == ["made to another plan: folders read"]  # and the job says why
    finally:
        other.discard()


@needs_box
def test_a_box_passed_over_says_why(tmp_path, monkeypatch):
    """A box started ahead that does not serve its job is named in the job's record with the reason: the names of
    the environment's variables set since it started, or its exit and its last line of stderr."""
    from kp.box import start as boxstart

    cand = tmp_path / "cand.py"
    cand.write_text((ROOT / "tests" / "batch" / "good.py").read_text())
    spec, paths = ("file", str(REF)), boxstart.candidate_paths(cand)
    build = str(builds.candidate_build_dir(cand))
    boxstart.start_early(spec, str(cand))
    monkeypatch.setenv("KP_SET_AFTER_THE_BOX", "1")
    box = boxstart.take(spec, paths, build)
    try:
        assert box.missed == ["made to another plan: environment (KP_SET_AFTER_THE_BOX)"] and not box.ahead
    finally:
        box.discard()
    boxstart.start_early(spec, str(cand))
    (early,) = boxstart.waiting()
    early.proc.kill()
    early.proc.popen.wait()
    box = boxstart.take(spec, paths, build)
    try:
        assert len(box.missed) == 1 and box.missed[0].startswith("it had exited (") and not box.ahead
    finally:
        box.discard()


@needs_box
def test_a_single_commands_box_started_before_its_torch_import_is_adopted(tmp_path):
    """run.py starts the candidate's box before it imports torch, so the box is not told torch's choice of CPU
    kernels; the judge still adopts it (its record's boxes_started_ahead) rather than starting a second box."""
    import json
    import subprocess

    out = tmp_path / "rec.json"
    r = subprocess.run(
        [
            sys.executable,
            "run.py",
            "--ref",
            str(ROOT / "tests" / "batch" / "ref.py"),
            "--candidate",
            str(ROOT / "tests" / "batch" / "good.py"),
            "--device",
            "cpu",
            "--allow-torch",
            "--no-bench",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert json.loads(out.read_text())["boxes_started_ahead"] == [True]


@needs_box
def test_a_box_started_for_a_file_serves_its_next_version_and_is_lent_its_builds(tmp_path, monkeypatch):
    """A loop edits its candidate between commands: the box started for the file's last version is adopted by the
    next (same file, new contents), and lent that version's own cached builds, never the last version's; what the
    box builds goes back under the version it judged, torch's lock files left out. A file replaced by another (a new
    inode) does not take a box started for the old one."""
    from kp.box import start as boxstart

    monkeypatch.setenv("KP_CACHE_DIR", str(tmp_path / "cache"))
    cand = tmp_path / "cands" / "cand.py"
    cand.parent.mkdir()
    cand.write_text((ROOT / "tests" / "batch" / "good.py").read_text())
    spec = ("file", str(REF))
    old_builds = builds.candidate_build_dir(cand)
    (old_builds / "ext").mkdir()
    (old_builds / "ext" / "old.so").write_text("the last version's build")
    boxstart.start_early(spec, str(cand))
    (early,) = boxstart.waiting()
    cand.write_text(cand.read_text() + "# edited\n")  # in place: the same inode
    new_builds = builds.candidate_build_dir(cand)
    assert new_builds != old_builds
    (new_builds / "ext").mkdir()
    (new_builds / "ext" / "new.so").write_text("this version's build")
    (new_builds / "ext" / "lock").write_text("")
    box = boxstart.take(spec, boxstart.candidate_paths(cand), str(new_builds))
    own = Path(box.proc.builds)
    try:
        assert box is early and box.env["TORCH_EXTENSIONS_DIR"] == boxstart.BOX_BUILDS
        assert sorted(p.name for p in (own / "ext").iterdir()) == ["new.so"]  # no lock, nothing of the last version
        (own / "ext" / "more.o").write_text("built in the box")
        (own / "ext" / "lock").write_text("")
    finally:
        box.discard()
    assert not own.exists()
    assert sorted(p.name for p in (new_builds / "ext").iterdir()) == ["lock", "more.o", "new.so"]
    assert sorted(p.name for p in (old_builds / "ext").iterdir()) == ["old.so"]
    cut = boxstart.take(spec, boxstart.candidate_paths(cand), str(new_builds))
    (Path(cut.proc.builds) / "ext" / "half.so").write_text("a link cut short")
    cut.proc.keep_builds = False  # its worker killed mid-job (kp.judge.runners.ProcessRunner.close says so)
    cut.discard()
    assert not (new_builds / "ext" / "half.so").exists()
    boxstart.start_early(spec, str(cand))
    (early,) = boxstart.waiting()
    replaced = tmp_path / "other.py"
    replaced.write_text(cand.read_text())
    os.replace(replaced, cand)  # a new inode at the same path: the box holds the old file where it binds it alone
    other = boxstart.take(spec, boxstart.candidate_paths(cand), str(builds.candidate_build_dir(cand)))
    try:
        assert other is not early
    finally:
        other.discard()


def test_a_job_lent_a_build_running_ahead_waits_for_it(tmp_path):
    """A candidate's build running ahead of its job in another process of the run (its cache folder marked with
    that process's pid, kp.batch.ahead) is waited for before the job's box is lent the folder, and the wait is the
    build's time, told as it passes to what moves the job's limits (not the job's time); a mark left by a process
    that is gone is not waited for."""
    import subprocess
    import time
    from kp.box import start as boxstart

    home, own = tmp_path / "cache", tmp_path / "own"
    home.mkdir()
    own.mkdir()
    builder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    told: list[float] = []
    try:
        (home / builds.BUILDING).write_text(str(builder.pid))

        def finish():
            time.sleep(1.6)
            (home / "ext.so").write_text("built")
            (home / builds.BUILDING).unlink()

        threading.Thread(target=finish).start()
        builds.OFF_THE_CLOCK.append(told.append)
        box = boxstart.Box(None, boxstart.BoxProcess(None, None, str(own)), None, ())
        box.lend(str(home))
        assert box.build_wait_s >= 1.5 and (own / "ext.so").read_text() == "built"
        assert len(told) >= 2 and abs(sum(told) - box.build_wait_s) < 0.05, told  # one a second, and the rest
    finally:
        builds.OFF_THE_CLOCK.remove(told.append)
        builder.kill()
        builder.wait()
    (home / builds.BUILDING).write_text(str(builder.pid))  # its builder gone
    box = boxstart.Box(None, boxstart.BoxProcess(None, None, str(own)), None, ())
    box.lend(str(home))  # a wait would never end
    assert box.build_wait_s < 0.2  # not one turn of the wait's 0.2 s poll


@needs_box
def test_a_box_started_for_a_later_job_waits_for_it(tmp_path):
    """A batch's slot starts its next job's box while the job before runs: the job before does not discard it, the
    job it was made for takes it, and a slot whose next job went elsewhere discards it."""
    from kp.box import start as boxstart

    cands = []
    for name in ("a.py", "b.py"):
        cands.append(tmp_path / name)
        cands[-1].write_text((ROOT / "tests" / "batch" / "good.py").read_text() + f"# {name}\n")
    spec = ("file", str(REF))
    boxstart.start_early(spec, str(cands[1]), later=True)
    (later,) = boxstart.waiting()
    now = boxstart.take(spec, boxstart.candidate_paths(cands[0]), str(builds.candidate_build_dir(cands[0])))
    try:
        assert now is not later and boxstart.waiting() == [later] and later.proc.is_alive()
        taken = boxstart.take(spec, boxstart.candidate_paths(cands[1]), str(builds.candidate_build_dir(cands[1])))
        assert taken is later and not boxstart.waiting()
        taken.discard()
        boxstart.start_early(spec, str(cands[1]), later=True)
        (gone,) = boxstart.waiting()
        boxstart.discard_early()
        assert not boxstart.waiting() and not gone.proc.is_alive()
    finally:
        now.discard()


@needs_box
def test_a_discarded_box_leaves_no_process(tmp_path, monkeypatch):
    """A box killed right after its start (an early box the judge does not adopt, a timeout) takes its init with
    it: bwrap inside the box's pid namespace sits in a session of its own, and killed that early on a loaded host it
    outlived bwrap outside (7 of 20 boxes left one, sleeping, orphaned)."""
    import time
    from kp.box import start as boxstart

    mark = f"kp-box-mark-{os.getpid()}-{tmp_path.name}"  # on each box's command line (its environment), so its
    monkeypatch.setenv("KP_TEST_MARK", mark)  # processes are told from other tests' boxes
    plan = boxstart._plan(
        ("file", str(REF)), boxstart.candidate_paths(ROOT / "tests" / "batch" / "good.py"), builds=False
    )

    def ours() -> list[str]:
        out = []
        for d in Path("/proc").iterdir():
            try:
                if (
                    d.name.isdigit()
                    and mark.encode() in (d / "cmdline").read_bytes()
                    and (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
                ):  # a zombie is gone
                    out.append(d.name)
            except OSError:
                pass
        return out

    box = boxstart._start(plan)
    assert ours()  # the mark finds a box's processes
    box.discard()
    import subprocess

    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3 * (os.cpu_count() or 1))]
    try:  # a loaded host: the race the init lost showed there (7 of 20 boxes)
        for _ in range(20):
            boxstart._start(plan).discard()
    finally:
        for p in busy:
            p.kill()
            p.wait()
    deadline = time.monotonic() + 5
    while ours() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not ours()


CPU_EXTENSION = """import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

mod = load_inline(name="kp_test_relu_ext", cpp_sources=["#include <torch/extension.h>\\n"
                  "torch::Tensor relu_cpu(torch::Tensor x) { return x.clamp_min(0); }\\n"], functions=["relu_cpu"])


class ModelNew(nn.Module):
    def forward(self, x):
        return mod.relu_cpu(x)
"""


@needs_box
@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")), reason="no C++ compiler here")
def test_a_real_build_goes_back_to_the_cache_and_is_loaded_next_time(tmp_path):
    """A candidate's own extension, really built by torch (C++ only, so on any host) in its box's lent folder: the
    build goes back to the cache under the file's contents, and the next judgement of the same file loads it
    without building again (the library in the cache is the one the first judgement made)."""
    from conftest import run_script

    cand = tmp_path / "cand.py"
    cand.write_text(CPU_EXTENSION)
    env = {"KP_CACHE_DIR": str(tmp_path / "cache")}
    args = ("--ref", ROOT / "tests" / "batch" / "ref.py", "--candidate", cand, "--device", "cpu", "--allow-torch")
    first = run_script(*args, env=env)
    assert first.returncode == 0 and "accepted" in first.stdout, first.stdout[-2000:] + first.stderr[-2000:]
    (built,) = (tmp_path / "cache" / "candidates").glob("*/kp_test_relu_ext/*.so")
    made = built.stat().st_mtime_ns
    again = run_script(*args, env=env)
    assert again.returncode == 0 and "accepted" in again.stdout, again.stdout[-2000:] + again.stderr[-2000:]
    assert built.stat().st_mtime_ns == made  # loaded, not built again
    assert not list((tmp_path / "cache" / "boxes").iterdir())


@contextlib.contextmanager
def built_ahead_for(cand: Path, seconds: float):
    """The candidate's cache folder marked as building ahead (kp.batch.ahead) by a live process, for `seconds`."""
    import subprocess
    import time

    home = builds.candidate_build_dir(cand)
    builder = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds + 30})"])
    try:
        (home / builds.BUILDING).write_text(str(builder.pid))
        threading.Thread(target=lambda: (time.sleep(seconds), (home / builds.BUILDING).unlink())).start()
        yield
    finally:
        builder.kill()
        builder.wait()


@needs_box
def test_the_wait_for_a_build_running_ahead_is_booked_as_the_build(tmp_path, cli):
    """A job whose candidate is still building ahead of it (kp.batch.ahead) waits for that build before its box is
    lent the folder: the record books that wait as "build", not as the judge's start, and a build longer than the
    job's own time limit does not time the job out (the build ahead has a limit of its own)."""
    import json

    cand = tmp_path / "cand.py"
    cand.write_text((ROOT / "tests" / "batch" / "good.py").read_text() + f"\n# {tmp_path}\n")
    out = tmp_path / "r.jsonl"
    with built_ahead_for(cand, 20.0):
        r = cli(
            "--ref",
            ROOT / "tests" / "batch" / "ref.py",
            "--candidate",
            cand,
            "--device",
            "cpu",
            "--allow-torch",
            "--no-compile",
            "--timeout",
            "15",
            "--out",
            out,
        )
    assert r.returncode == 0, r.stderr[-2000:]
    seconds = json.loads(out.read_text().splitlines()[0])["record"]["stage_seconds"]
    # the mark goes 20 s after the test starts; the judge gets to the box in 1-3 s here, 9 s on a 2-core host whose
    # cores other tests kept busy
    assert seconds["build"] >= 2.0 and seconds["judge start"] < 2.0, seconds


@needs_box
def test_a_batch_slot_does_not_time_out_a_job_waiting_for_its_build_ahead(tmp_path, cli):
    """In a batch the slot's parent kills a job that outlasts its limit; a job waiting for its candidate's build
    ahead is told to it as the wait goes (kp.box.builds.OFF_THE_CLOCK), so a build longer than the job's limit
    moves that limit too, and the job gets its verdict, the wait booked as its build."""
    import json

    cand = tmp_path / "cand.py"
    cand.write_text((ROOT / "tests" / "batch" / "good.py").read_text() + f"\n# batch {tmp_path}\n")
    jobs = tmp_path / "jobs.csv"
    jobs.write_text(f"reference,candidate\n{ROOT / 'tests' / 'batch' / 'ref.py'},{cand}\n")
    out = tmp_path / "r.jsonl"
    with built_ahead_for(cand, 55.0):  # the slot kills a job 8 + 30 s (its limit and a grace) after it starts
        r = cli("--jobs", jobs, "--device", "cpu", "--allow-torch", "--no-compile", "--timeout", "8", "--out", out)
    line = json.loads(out.read_text().splitlines()[0])
    assert r.returncode == 0 and line["ok"], line["verdict"]
    assert line["record"]["stage_seconds"]["build"] >= 20.0, line["record"]["stage_seconds"]


def test_cudas_early_start_without_a_driver_ends_quietly(monkeypatch):
    """A box started ahead with `cuda` starts CUDA's driver beside torch's import (kp.lib.cuda_early); on a host with
    no driver or no GPU the thread ends without a word and torch meets CUDA as before; KP_CUDA_EARLY=0 starts none."""
    import ctypes.util
    import time
    from kp.lib import cuda_early

    t0 = time.monotonic()
    t = cuda_early.start()
    cuda_early.wait(t, 60)
    assert t is not None and not t.is_alive() and time.monotonic() - t0 < 60
    if ctypes.util.find_library("cuda") is None:
        assert cuda_early._make() is False
    monkeypatch.setenv("KP_CUDA_EARLY", "0")
    assert cuda_early.start() is None


@needs_box
def test_a_box_started_ahead_with_cuda_serves_its_job_where_there_is_no_gpu(tmp_path):
    """The `cuda` box's early driver thread and its warm-up find no GPU on a CPU host; the box still takes its job."""
    from kp.box import start as boxstart

    cand = tmp_path / "cand.py"
    cand.write_text((ROOT / "tests" / "batch" / "good.py").read_text())
    spec = ("file", str(REF))
    import time
    from kp.judge.runners import candidate_runner

    boxstart.start_early(spec, str(cand), cuda=True)
    (early,) = boxstart.waiting()
    runner = candidate_runner(
        spec,
        cand,
        "cpu",
        "fp32",
        lambda msg: False,
        boxed=True,
        train=True,
        deadline=time.monotonic() + 120,
        limit_s=120,
    )
    try:
        assert runner.proc is early.proc  # the box started ahead took the job
        assert runner.call("import", "load", str(cand))["has_model_new"]
    finally:
        runner.close()
