"""The sandbox a candidate's worker runs in: each attempt of tests/box/ to leave it fails inside it, the judge
rejects the candidate with what it tried, and the playground's kernel cache is intact afterwards. Without the box
the same attempts succeed (where that is safe to show). On the CPU (--device cpu); on the GPU where there is one."""
import json
import os
import re
import socket
import sys
import threading
from pathlib import Path

import pytest

from conftest import ROOT, gpu, run_script
from kp.box import sandbox

BOX = ROOT / "tests" / "box"
REF = ROOT / "tests" / "judge_cases" / "relu" / "ref.py"
CASES = sorted(p.stem for p in BOX.glob("*.py"))
HOG_GB = "4"  # the host-memory limit the hog meets: far above what a CPU worker needs (about 1.5 GiB)

needs_box = pytest.mark.skipif(sandbox.status()[0] is None, reason=f"no sandbox here: {sandbox.status()[1]}")


def bounded(name: str) -> None:
    """The kernel exempts root from RLIMIT_NPROC: as root, the box's own pid_max (Linux 6.14 on) or a pids cgroup
    bounds its processes."""
    if name == "fork_bomb" and sandbox.process_limit() == "none":
        pytest.skip("running as root on a kernel before 6.14 with no pids cgroup to make: the box's process count "
                    "is not bounded here (the record says 'process limit by none')")


def expect(name: str) -> str:
    return re.search(r'^EXPECT = r"(.*)"$', (BOX / f"{name}.py").read_text(), re.M).group(1)


class Listener:
    """A TCP listener on 127.0.0.1 that records whether anyone connected."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connected = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        try:
            conn, _ = self.sock.accept()
            self.connected = True
            conn.close()
        except OSError:
            pass

    def close(self):
        self.sock.close()


@pytest.fixture
def outside(tmp_path, monkeypatch):
    """A private kernel cache with one library in it, a secret file and a listener, all outside the box; after
    the test, the cache must hold exactly what it held before."""
    cache = tmp_path / "cache"
    so = cache / "kp_probe_0" / "kp_probe_0.so"
    so.parent.mkdir(parents=True)
    so.write_bytes(b"\x7fELF" + os.urandom(4096))
    secret = tmp_path / "secret.txt"
    secret.write_text("outside the box")
    lis = Listener()
    lis.cache = cache
    lis.before = {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()}
    monkeypatch.setenv("KP_CACHE_DIR", str(cache))
    monkeypatch.setenv("KP_PROBE_SECRET", str(secret))
    monkeypatch.setenv("KP_PROBE_PORT", str(lis.port))
    monkeypatch.setenv("KP_SANDBOX_MEM_GB", HOG_GB)
    yield lis
    lis.close()
    after = {p: p.read_bytes() for p in cache.rglob("*") if p.is_file() and p.parent.name != "footprints"}
    assert after == lis.before, "the kernel cache changed"  # (the judge's own record of the reference's footprint
    #                                                          aside: kp.judge.reference)


@needs_box
@pytest.mark.parametrize("name", CASES)
def test_attempt_fails_inside_the_box(name, outside, cli):
    bounded(name)
    r = cli("--ref", REF, "--candidate", BOX / f"{name}.py", "--device", "cpu", "--allow-torch")
    verdict = r.stdout.strip().splitlines()[-1]
    assert r.returncode == 1 and verdict.startswith("rejected") and re.search(expect(name), verdict), verdict
    assert not outside.connected


@pytest.mark.parametrize("name", ["reads_outside", "connects_out", "writes_cache"])
def test_attempt_succeeds_without_the_box(name, outside, cli):
    """The attempts are real: unboxed, the candidate gets what it went for (its own test-made targets)."""
    r = cli("--ref", REF, "--candidate", BOX / f"{name}.py", "--device", "cpu", "--allow-torch", "--no-sandbox")
    assert r.returncode == 0, r.stdout[-2000:]
    assert "unsandboxed" not in r.stdout  # asked for: not flagged as missing
    if name == "connects_out":
        assert outside.connected
        outside.connected = False
    if name == "writes_cache":  # the test's own private cache: truncated and marked; put back for the fixture
        assert (outside.cache / "left_by_a_candidate").exists()
        assert all(so.stat().st_size == 0 for so in outside.cache.rglob("*.so"))
        (outside.cache / "left_by_a_candidate").unlink()
        for p, b in outside.before.items():
            p.write_bytes(b)


def test_verdict_says_when_no_sandbox_was_available(cli, monkeypatch):
    monkeypatch.delenv("KP_BWRAP", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    sandbox.status.cache_clear()
    try:
        r = cli("--ref", REF, "--candidate", ROOT / "tests" / "batch" / "good.py", "--device", "cpu",
                "--allow-torch")
    finally:
        sandbox.status.cache_clear()
    assert r.returncode == 0
    assert "[kp] building" not in r.stderr, r.stderr[-3000:]  # each loaded from the judge's cache, none rebuilt
    assert "unboxed: no bwrap found" in r.stdout.strip().splitlines()[-1]


@needs_box
def test_a_box_started_early_is_adopted_by_the_same_job_only(tmp_path):
    """The command line starts the candidate's box before torch is imported; the judge adopts it when the job it
    sets up is the one the box was made for (same folders and environment), and starts a fresh one otherwise."""
    from kp.box import start as boxstart
    cand = tmp_path / "cand.py"
    cand.write_text((ROOT / "tests" / "batch" / "good.py").read_text())
    spec = ("file", str(REF))
    boxstart.start_early(spec, str(cand))
    early, = boxstart.waiting()
    assert early.proc.is_alive()
    paths, build = boxstart.candidate_paths(cand), str(boxstart.candidate_build_dir(cand))
    box = boxstart.take(spec, paths, build)
    try:
        assert box is early and not boxstart.waiting()
    finally:
        box.discard()
    boxstart.start_early(spec, str(cand))
    early, = boxstart.waiting()
    other = boxstart.take(("file", str(ROOT / "tests" / "judge_cases" / "sum_dim" / "ref.py")), paths, build)
    try:
        assert other is not early and not early.proc.is_alive()  # another reference: the early box is killed
    finally:
        other.discard()


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
    old_builds = boxstart.candidate_build_dir(cand)
    (old_builds / "ext").mkdir()
    (old_builds / "ext" / "old.so").write_text("the last version's build")
    boxstart.start_early(spec, str(cand))
    early, = boxstart.waiting()
    cand.write_text(cand.read_text() + "# edited\n")  # in place: the same inode
    new_builds = boxstart.candidate_build_dir(cand)
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
    boxstart.start_early(spec, str(cand))
    early, = boxstart.waiting()
    replaced = tmp_path / "other.py"
    replaced.write_text(cand.read_text())
    os.replace(replaced, cand)  # a new inode at the same path: the box holds the old file where it binds it alone
    other = boxstart.take(spec, boxstart.candidate_paths(cand), str(boxstart.candidate_build_dir(cand)))
    try:
        assert other is not early
    finally:
        other.discard()


def test_a_job_lent_a_build_running_ahead_waits_for_it(tmp_path):
    """A candidate's build running ahead of its job in another process of the run (its cache folder marked with
    that process's pid, kp.batch.ahead) is waited for before the job's box is lent the folder, and the wait is the
    build's time; a mark left by a process that is gone is not waited for."""
    import subprocess
    import time
    from kp.box import start as boxstart
    home, own = tmp_path / "cache", tmp_path / "own"
    home.mkdir()
    own.mkdir()
    builder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (home / boxstart.BUILDING).write_text(str(builder.pid))

        def finish():
            time.sleep(0.6)
            (home / "ext.so").write_text("built")
            (home / boxstart.BUILDING).unlink()
        threading.Thread(target=finish).start()
        box = boxstart.Box(None, boxstart.BoxProcess(None, None, str(own)), None, ())
        box.lend(str(home), deadline=time.monotonic() + 20)
        assert box.build_wait_s >= 0.5 and (own / "ext.so").read_text() == "built"
    finally:
        builder.kill()
        builder.wait()
    (home / boxstart.BUILDING).write_text(str(builder.pid))  # its builder gone
    t0 = time.monotonic()
    boxstart.Box(None, boxstart.BoxProcess(None, None, str(own)), None, ()).lend(str(home))
    assert time.monotonic() - t0 < 0.5


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
    later, = boxstart.waiting()
    now = boxstart.take(spec, boxstart.candidate_paths(cands[0]), str(boxstart.candidate_build_dir(cands[0])))
    try:
        assert now is not later and boxstart.waiting() == [later] and later.proc.is_alive()
        taken = boxstart.take(spec, boxstart.candidate_paths(cands[1]), str(boxstart.candidate_build_dir(cands[1])))
        assert taken is later and not boxstart.waiting()
        taken.discard()
        boxstart.start_early(spec, str(cands[1]), later=True)
        gone, = boxstart.waiting()
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
    plan = boxstart._plan(("file", str(REF)), boxstart.candidate_paths(ROOT / "tests" / "batch" / "good.py"), None)

    def ours() -> list[str]:
        out = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and mark.encode() in (d / "cmdline").read_bytes() and \
                        (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":  # a zombie is gone
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


def test_a_script_run_from_tmp_leaves_the_box_its_own_tmp(monkeypatch):
    """A judging script saved in /tmp puts /tmp on sys.path: bound read-only, it would be the box's /tmp, and the
    box could not make its working directory there (the worker dies before it starts)."""
    monkeypatch.setattr(sys, "path", ["/tmp", *sys.path])
    paths = sandbox._ro_paths(["/tmp/some-folder/cand.py"])
    assert not any(p == "/tmp" or p in ("/dev", "/proc") for p in paths), paths
    assert "/tmp/some-folder/cand.py" in paths or not os.path.exists("/tmp/some-folder/cand.py")


@needs_box
def test_files_saved_straight_in_tmp_are_judged_in_the_box(cli):
    """A reference and a candidate whose folder is /tmp itself: binding that folder read-only would hide the box's
    private /tmp (torch writes its caches there); the two files are bound instead."""
    mine = Path("/tmp", f"kp-straight-{os.getpid()}")
    ref, cand = mine.with_name(mine.name + "-ref.py"), mine.with_name(mine.name + "-cand.py")
    ref.write_text(REF.read_text())
    cand.write_text((ROOT / "tests" / "batch" / "good.py").read_text())
    try:
        r = cli("--ref", ref, "--candidate", cand, "--device", "cpu", "--allow-torch")
    finally:
        ref.unlink()
        cand.unlink()
    verdict = r.stdout.strip().splitlines()[-1]
    assert r.returncode == 0 and verdict.startswith("accepted") and "unsandboxed" not in verdict, \
        r.stdout[-2000:] + r.stderr[-2000:]


@needs_box
def test_box_scrubs_the_environment_and_hides_home(tmp_path, monkeypatch):
    """What a boxed process sees: no secrets from the environment, the project read-only, a private /tmp."""
    import subprocess
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    env = sandbox.box_env(dict(os.environ), str(ROOT))
    mine = f"kp-box-probe-{os.getpid()}-{tmp_path.name}"
    code = ("import os, pathlib; print(sorted(k for k in os.environ if 'SECRET' in k)); "
            f"p = pathlib.Path({str(ROOT)!r}) / 'x'\n"
            "try:\n p.write_text('x'); print('project writable')\nexcept OSError as e: print('project', e.strerror)\n"
            f"pathlib.Path('/tmp/{mine}').write_text('ok'); print('tmp ok')")
    argv = sandbox.command([sys.executable, "-c", code], read_only=[str(ROOT)], cwd="/tmp", env=env,
                           limits=sandbox.Limits())
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout.splitlines()
    assert out == ["[]", "project Read-only file system", "tmp ok"], out
    assert not Path("/tmp", mine).exists()  # written to the box's own /tmp, not the host's


@needs_box
def test_box_runs_the_cpu_kernels_its_reference_runs():
    """Torch picks its CPU vector code (and thread count) from what the machine says of its CPU: a boxed candidate
    must pick the same as the judge's reference, or a pure-PyTorch candidate differs from its own reference."""
    import subprocess
    code = ("import torch; x = torch.linspace(-4, 4, 4099); "
            "print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(), torch.tanh(x).sum().item())")
    env = sandbox.box_env(dict(os.environ), str(ROOT))
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    # the same environment outside the box: what the box itself changes (its view of /proc, /sys, the CPU), apart
    # from what this test process's environment holds (once, in a full parallel run, a process started with it
    # computed another tanh sum on the same kernels and threads)
    outside = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                             cwd="/tmp").stdout
    argv = sandbox.command([sys.executable, "-c", code], read_only=[str(ROOT)], cwd="/tmp", env=env,
                           limits=sandbox.Limits())
    inside = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert inside.stdout == outside and outside, (outside, inside.stdout, inside.stderr[-2000:])
    assert inside.stdout.split()[:2] == plain.split()[:2], (plain, inside.stdout)  # instruction set and threads
    # started after this process imported torch, a box is told the kernels this process picked; a choice of the
    # user's own is kept
    import torch
    assert sandbox.box_env({}, str(ROOT))["ATEN_CPU_CAPABILITY"] == torch.backends.cpu.get_cpu_capability().lower()
    assert sandbox.box_env({"ATEN_CPU_CAPABILITY": "default"}, str(ROOT))["ATEN_CPU_CAPABILITY"] == "default"


def test_box_keeps_what_an_extension_build_reads(monkeypatch):
    """The compilers and nvcc settings torch.utils.cpp_extension puts into a build's command line reach the box, so
    a candidate's extension built outside it is not rebuilt inside it."""
    for k, v in {"CXX": "/opt/gcc/bin/g++", "CC": "/opt/gcc/bin/gcc", "PYTORCH_NVCC": "nvcc",
                 "TORCH_CUDA_ARCH_LIST": "9.0a"}.items():
        monkeypatch.setenv(k, v)
    env = sandbox.box_env(dict(os.environ), str(ROOT))
    assert (env["CXX"], env["CC"], env["PYTORCH_NVCC"], env["TORCH_CUDA_ARCH_LIST"]) == \
        ("/opt/gcc/bin/g++", "/opt/gcc/bin/gcc", "nvcc", "9.0a")


@gpu
@needs_box
@pytest.mark.parametrize("name", CASES)
def test_attempt_fails_inside_the_box_on_gpu(name, tmp_path):
    bounded(name)
    secret = tmp_path / "secret.txt"
    secret.write_text("outside the box")
    lis = Listener()
    (tmp_path / "cache").mkdir()
    env = {"KP_PROBE_SECRET": str(secret), "KP_PROBE_PORT": str(lis.port), "KP_SANDBOX_MEM_GB": "16",
           "KP_CACHE_DIR": str(tmp_path / "cache")}
    r = run_script("--ref", REF, "--candidate", BOX / f"{name}.py", "--allow-torch", "--no-bench", env=env)
    lis.close()
    verdict = r.stdout.strip().splitlines()[-1]
    assert r.returncode == 1 and re.search(expect(name), verdict), r.stdout[-3000:] + r.stderr[-3000:]
    assert not lis.connected


def _load(cache: Path, problem: str = "softmax", variant: str = "1_rowblock"):
    """Build or load one playground kernel in a fresh process; (built now?, library path, stderr)."""
    import subprocess
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from kp.lib.build import build; "
            f"b = build({problem!r}, {variant!r}); print(b.built_now, b.so_path)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "KP_CACHE_DIR": str(cache)})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    built, so = r.stdout.split()
    return built == "True", Path(so), r.stderr


@gpu
@needs_box
def test_cache_survives_a_boxed_writer_and_a_truncated_library_is_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    built, so, _ = _load(cache)
    assert built
    r = run_script("--ref", REF, "--candidate", BOX / "writes_cache.py", "--allow-torch", "--no-bench",
                   env={"KP_CACHE_DIR": str(cache)})
    assert r.returncode == 1 and re.search(expect("writes_cache"), r.stdout), r.stdout[-2000:]
    assert not (cache / "left_by_a_candidate").exists()
    assert _load(cache)[0] is False  # intact: loaded, checksum and all
    so.write_bytes(so.read_bytes()[:4096])  # a killed copy, a full disk, or a candidate run without the box
    built, _, err = _load(cache)
    assert built and "truncated or altered): rebuilding it" in err, err
    assert _load(cache)[0] is False


def _shipped(problem: str) -> list[str]:
    """Every rung of a built-in problem that runs on this GPU, records included, and auto where the model has it."""
    from kp.lib import registry
    return registry.runnable_variants(problem, include_records=True) + (
        ["auto"] if registry.picks_per_call(problem) else [])


@gpu
@needs_box
@pytest.mark.parametrize("problem", [p.stem for p in sorted((ROOT / "models").glob("[!_]*.py"))])
def test_every_shipped_variant_is_accepted_in_the_box(problem, tmp_path):
    """The playground's own kernels judged as boxed candidates: each loads from the (read-only) kernel cache and
    passes every check from inside the box."""
    files = []
    for v in _shipped(problem):
        f = tmp_path / f"{problem}__{v}.py"
        f.write_text(f"import models.{problem} as m\n\n\nclass ModelNew(m.ModelNew):\n"
                     f"    def __init__(self, *init):\n        super().__init__(*init, variant={v!r})\n")
        files.append(f)
    build = run_script("--problem", problem, "--build")  # the box reads the cache; it cannot add to it
    assert build.returncode == 0, build.stderr[-3000:]
    out = tmp_path / "out.jsonl"
    r = run_script("--problem", problem, "--candidate", *files, "--no-bench", "--no-compile", "--out", out)
    recs = {Path(d["job"]["candidate"]).name: d for d in map(json.loads, out.read_text().splitlines())}
    assert sorted(recs) == sorted(f.name for f in files), r.stdout[-3000:] + r.stderr[-3000:]
    for name, d in recs.items():
        assert d["ok"] and d["verdict"].startswith("accepted"), (name, d["verdict"])
        assert "unsandboxed" not in d["verdict"], (name, d["verdict"])
    assert r.returncode == 0
    assert "[kp] building" not in r.stderr, r.stderr[-3000:]  # each loaded from the judge's cache, none rebuilt
