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
        pytest.skip(
            "running as root on a kernel before 6.14 with no pids cgroup to make: the box's process count "
            "is not bounded here (the record says 'process limit by none')"
        )


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


# What the judge itself writes into the cache, never the box: the reference's footprint (kp.judge.reference), the
# last judged version of each candidate file (kp.box.builds: its Triton cache's predecessor)
JUDGES_OWN = ("footprints", "by_path")


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
    after = {p: p.read_bytes() for p in cache.rglob("*") if p.is_file() and p.parent.name not in JUDGES_OWN}
    assert after == lis.before, "the kernel cache changed"


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
        r = cli("--ref", REF, "--candidate", ROOT / "tests" / "batch" / "good.py", "--device", "cpu", "--allow-torch")
    finally:
        sandbox.status.cache_clear()
    assert r.returncode == 0
    assert "[kp] building" not in r.stderr, r.stderr[-3000:]  # each loaded from the judge's cache, none rebuilt
    assert "unboxed: no bwrap found" in r.stdout.strip().splitlines()[-1]


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
    assert r.returncode == 0 and verdict.startswith("accepted") and "unsandboxed" not in verdict, (
        r.stdout[-2000:] + r.stderr[-2000:]
    )


@needs_box
def test_box_scrubs_the_environment_and_hides_home(tmp_path, monkeypatch):
    """What a boxed process sees: no secrets from the environment, the project read-only, a private /tmp."""
    import subprocess

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    env = sandbox.box_env(dict(os.environ), str(ROOT))
    mine = f"kp-box-probe-{os.getpid()}-{tmp_path.name}"
    code = (
        "import os, pathlib; print(sorted(k for k in os.environ if 'SECRET' in k)); "
        f"p = pathlib.Path({str(ROOT)!r}) / 'x'\n"
        "try:\n p.write_text('x'); print('project writable')\nexcept OSError as e: print('project', e.strerror)\n"
        f"pathlib.Path('/tmp/{mine}').write_text('ok'); print('tmp ok')"
    )
    argv = sandbox.command(
        [sys.executable, "-c", code], read_only=[str(ROOT)], cwd="/tmp", env=env, limits=sandbox.Limits()
    )
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout.splitlines()
    assert out == ["[]", "project Read-only file system", "tmp ok"], out
    assert not Path("/tmp", mine).exists()  # written to the box's own /tmp, not the host's


@needs_box
def test_box_runs_the_cpu_kernels_its_reference_runs():
    """Torch picks its CPU vector code (and thread count) from what the machine says of its CPU: a boxed candidate
    must pick the same as the judge's reference, or a pure-PyTorch candidate differs from its own reference."""
    import subprocess

    # the vector code shows in an elementwise result, compared bit for bit: tanh's values, not their sum (a sum's
    # order over threads is not promised: plain torch outside any box printed two sums across runs)
    code = (
        "import hashlib, torch; x = torch.linspace(-4, 4, 4099); "
        "print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(), "
        "hashlib.sha256(torch.tanh(x).numpy().tobytes()).hexdigest()[:16])"
    )
    env = sandbox.box_env(dict(os.environ), str(ROOT))
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    # the same environment outside the box: what the box itself changes (its view of /proc, /sys, the CPU), apart
    # from what this test process's environment holds
    outside = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd="/tmp"
    ).stdout
    argv = sandbox.command(
        [sys.executable, "-c", code], read_only=[str(ROOT)], cwd="/tmp", env=env, limits=sandbox.Limits()
    )
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
    for k, v in {
        "CXX": "/opt/gcc/bin/g++",
        "CC": "/opt/gcc/bin/gcc",
        "PYTORCH_NVCC": "nvcc",
        "TORCH_CUDA_ARCH_LIST": "9.0a",
    }.items():
        monkeypatch.setenv(k, v)
    env = sandbox.box_env(dict(os.environ), str(ROOT))
    assert (env["CXX"], env["CC"], env["PYTORCH_NVCC"], env["TORCH_CUDA_ARCH_LIST"]) == (
        "/opt/gcc/bin/g++",
        "/opt/gcc/bin/gcc",
        "nvcc",
        "9.0a",
    )


@gpu
@needs_box
@pytest.mark.parametrize("name", CASES)
def test_attempt_fails_inside_the_box_on_gpu(name, tmp_path):
    bounded(name)
    secret = tmp_path / "secret.txt"
    secret.write_text("outside the box")
    lis = Listener()
    (tmp_path / "cache").mkdir()
    env = {
        "KP_PROBE_SECRET": str(secret),
        "KP_PROBE_PORT": str(lis.port),
        "KP_SANDBOX_MEM_GB": "16",
        "KP_CACHE_DIR": str(tmp_path / "cache"),
    }
    r = run_script("--ref", REF, "--candidate", BOX / f"{name}.py", "--allow-torch", "--no-bench", env=env)
    lis.close()
    verdict = r.stdout.strip().splitlines()[-1]
    assert r.returncode == 1 and re.search(expect(name), verdict), r.stdout[-3000:] + r.stderr[-3000:]
    assert not lis.connected


def _load(cache: Path, problem: str = "softmax", variant: str = "1_rowblock"):
    """Build or load one playground kernel in a fresh process; (built now?, library path, stderr)."""
    import subprocess

    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); from kp.lib.build import build; "
        f"b = build({problem!r}, {variant!r}); print(b.built_now, b.so_path)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "KP_CACHE_DIR": str(cache)},
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    built, so = r.stdout.split()
    return built == "True", Path(so), r.stderr


@gpu
@needs_box
def test_cache_survives_a_boxed_writer_and_a_truncated_library_is_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    built, so, _ = _load(cache)
    assert built
    r = run_script(
        "--ref",
        REF,
        "--candidate",
        BOX / "writes_cache.py",
        "--allow-torch",
        "--no-bench",
        env={"KP_CACHE_DIR": str(cache)},
    )
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
        ["auto"] if registry.picks_per_call(problem) else []
    )


@gpu
@needs_box
def test_every_shipped_variant_is_accepted_in_the_box(tmp_path):
    """The playground's own kernels judged as boxed candidates, every rung of every problem: each loads from the
    (read-only) kernel cache and passes every check from inside the box. One batch over three slots (a job file of
    every problem's rungs): judged problem by problem, one slot each, they took 100 s of the GPU suite on one H200,
    most of it five judges' starts and one job at a time."""
    problems = [p.stem for p in sorted((ROOT / "models").glob("[!_]*.py"))]
    jobs, files = tmp_path / "jobs.csv", []
    for problem in problems:
        for v in _shipped(problem):
            f = tmp_path / f"{problem}__{v}.py"
            f.write_text(
                f"import models.{problem} as m\n\n\nclass ModelNew(m.ModelNew):\n"
                f"    def __init__(self, *init):\n        super().__init__(*init, variant={v!r})\n"
            )
            files.append((problem, f))
    jobs.write_text("reference,candidate\n" + "".join(f"{p},{f}\n" for p, f in files))
    build = run_script("--build")  # the box reads the cache; it cannot add to it
    assert build.returncode == 0, build.stderr[-3000:]
    out = tmp_path / "out.jsonl"
    # at each problem's test shape: what is tested is the box (the cache read, every check run inside it); every
    # rung at its benchmark shape is tests/test_gpu.py's and the timing table's
    r = run_script("--jobs", jobs, "--gpus", "0,0,0", "--no-bench", "--no-compile", "--at", "test", "--out", out)
    recs = {Path(d["job"]["candidate"]).name: d for d in map(json.loads, out.read_text().splitlines())}
    assert sorted(recs) == sorted(f.name for _, f in files), r.stdout[-3000:] + r.stderr[-3000:]
    for name, d in recs.items():
        assert d["ok"] and d["verdict"].startswith("accepted"), (name, d["verdict"])
        assert "unsandboxed" not in d["verdict"], (name, d["verdict"])
    assert {d["job"]["ref"][1] for d in recs.values()} == set(problems)
    assert r.returncode == 0
    assert "[kp] building" not in r.stderr, r.stderr[-3000:]  # each loaded from the judge's cache, none rebuilt
