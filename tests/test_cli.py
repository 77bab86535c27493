"""run.py's usage errors and exit codes (no GPU needed): `python run.py --list` as a script, the rest through the
same command-line entry in this process."""

import json
import os
import re
import shutil
import subprocess
import sys

import harness
from conftest import HAS_GPU, ROOT, gpu, run_script

import pytest


def test_list():
    r = run_script("--list")
    assert r.returncode == 0
    for p in harness.problems():
        assert sum(line.startswith(p + ":") for line in r.stdout.splitlines()) == 1
    assert "6_regcluster (sm_90a)" in r.stdout and "5_queue (sm_80, record)" in r.stdout
    assert "auto (default" in r.stdout and "2_split_wgmma (sm_90a, default)" in r.stdout


def test_help_and_a_bad_flag_are_said_once():
    """The script parses its arguments before importing torch (to start a candidate's box early) and again in main:
    the first parse says nothing."""
    r = run_script("--help")
    assert r.returncode == 0 and r.stdout.count("usage:") == 1
    shown = subprocess.run(
        [sys.executable, "-X", "importtime", "run.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )  # the usage without torch's import first (seconds)
    assert shown.returncode == 0 and "usage:" in shown.stdout and " torch\n" not in shown.stderr
    r = run_script("--no-such-flag")
    assert r.returncode == 2 and r.stderr.count("usage:") == 1 and "--no-such-flag" in r.stderr


def test_unknown_problem_lists_problems_exit_2(cli):
    r = cli("--problem", "nope")
    assert r.returncode == 2
    assert "unknown problem 'nope'" in r.stderr and "softmax" in r.stderr and "Traceback" not in r.stderr


def test_unknown_variant_exit_2(cli):
    r = cli("--problem", "softmax", "--variant", "9_nope")
    assert r.returncode == 2 and "2_online" in r.stderr


def test_no_problem_exit_2(cli):
    r = cli()
    assert r.returncode == 2 and "--problem" in r.stderr


def test_slots_outside_a_batch_is_a_usage_error_and_on_the_cpu_a_batch_takes_them(cli, tmp_path):
    for args in (
        ("--problem", "softmax", "--slots", "2"),
        ("--ref", "r.py", "--candidate", "c.py", "--device", "cpu", "--slots", "2"),
    ):
        r = cli(*args)
        assert r.returncode == 2 and "--slots" in r.stderr and "Traceback" not in r.stderr
    d = ROOT / "tests" / "judge_cases" / "relu"
    r = cli(
        "--ref",
        d / "ref.py",
        "--candidate",
        d / "torch_rewrite.py",
        d / "wrong_identity.py",
        "--device",
        "cpu",
        "--allow-torch",
        "--slots",
        "2",
        "--seed",
        "4",
        "--out",
        tmp_path / "o.jsonl",
    )
    assert r.returncode == 1 and "1 accepted, 1 rejected" in r.stdout, r.stdout + r.stderr
    assert {d["gpu"] for d in map(json.loads, (tmp_path / "o.jsonl").read_text().splitlines())} <= {"cpu0", "cpu1"}


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_no_cuda_is_one_line_exit_2(cli):
    r = cli("--problem", "softmax")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "no CUDA device" in r.stderr and "Traceback" not in r.stderr


def test_rung_this_gpu_cannot_run_is_one_line_exit_2(cli, monkeypatch):
    monkeypatch.setenv("KP_CAPABILITY", "8.0")
    harness.capability.cache_clear()
    try:
        r = cli("--problem", "softmax", "--variant", "6_regcluster")
    finally:
        monkeypatch.delenv("KP_CAPABILITY")
        harness.capability.cache_clear()
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "softmax/6_regcluster needs sm_90a" in r.stderr and "8.0" in r.stderr


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_notebook_inputs_without_gpu_is_one_line():
    """harness.inputs() says what is missing before drawing anything (not 25 s and 6 GB of host RAM first)."""
    code = "import harness\nharness.inputs('softmax')\n"
    r = subprocess.run([sys.executable, "-c", code], cwd=harness.ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "UsageError: no CUDA GPU" in r.stderr.strip().splitlines()[-1]


@gpu
@pytest.mark.parametrize("problem", harness.problems())
def test_non_hopper_default_path(problem):
    """As on a GPU of compute capability 8.0 (KP_CAPABILITY; the real GPU JITs the sm_80 PTX): the ladder is the
    portable rungs, every row is accepted; at the problem's test shape (its rows as long as the benchmark's: the
    same rungs run)."""
    r = run_script("--problem", problem, "--no-bench", "--no-compile", "--at", "test", env={"KP_CAPABILITY": "8.0"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "sm_90a" not in r.stdout


@pytest.mark.skipif(HAS_GPU, reason="checks what a machine without a GPU does")
def test_every_built_in_problem_alike_on_the_cpu(cli):
    """Without a GPU a built-in problem's kernels cannot run: every problem judges its reference's own Model against
    float64 (exit 0), none rejects its rows for want of a GPU; asking for a variant there is a usage error."""
    for p in ("softmax", "matmul_gelu_softmax"):
        r = cli("--problem", p, "--device", "cpu", "--seed", "3")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "the reference's own Model" in r.stderr and "\neager " in r.stdout and "accepted" in r.stdout
    r = cli("--problem", "softmax", "--variant", "2_online", "--device", "cpu")
    assert r.returncode == 2 and "need a GPU" in r.stderr


@pytest.mark.skipif(HAS_GPU or shutil.which("nvcc") is None, reason="needs nvcc and no GPU")
def test_build_without_a_gpu_compile_checks_the_rungs(cli):
    r = cli("--build", "--problem", "softmax", "--variant", "1_rowblock", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "softmax/1_rowblock (sm_80 sm_89 sm_90a): ok" in r.stderr and "compile-checked 1/1 rungs" in r.stdout


def test_a_raise_in_forward_shows_the_candidates_own_lines(cli, tmp_path):
    """An exception inside the candidate's forward: its own frames (file:line and code) under the table, the whole
    traceback in the record."""
    import json

    f = tmp_path / "raises.py"
    f.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
        "        return self.shape_it(x)\n\n    def shape_it(self, x):\n"
        "        return torch.relu(x).view(-1, 7)\n"
    )
    ref = harness.ROOT / "tests" / "judge_cases" / "relu" / "ref.py"
    r = cli("--ref", ref, "--candidate", f, "--device", "cpu", "--allow-torch", "--json", tmp_path / "r.json")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "raises.py:7 in forward: return self.shape_it(x)" in r.stdout
    assert "raises.py:10 in shape_it: return torch.relu(x).view(-1, 7)" in r.stdout
    assert r.stdout.strip().splitlines()[-1].startswith("rejected: trial 1")
    row = json.loads((tmp_path / "r.json").read_text())["rows"]["candidate"]
    assert "Traceback" in row["traceback"] and "raises.py" in row["traceback"]


def test_shards_cover_every_test_once_and_deal_the_gpu_tests_evenly():
    """N pytest processes, one per GPU, each with --shard K/N: every test runs in exactly one of them, and the GPU
    tests are dealt round-robin, so each GPU gets its share of the heavy ones that sit together in the order."""
    from conftest import shard_of

    names = [f"t{i}" for i in range(23)]
    gpu_names = {f"t{i}" for i in range(5, 17)}
    shares = [shard_of(names, gpu_names, k, 4) for k in range(4)]
    assert sorted(x for s in shares for x in s) == sorted(names)
    assert [len([x for x in s if x in gpu_names]) for s in shares] == [3, 3, 3, 3]
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert shard_of(names, gpu_names, 0, 1) == names


def test_shards_dealt_by_recorded_seconds_end_together(tmp_path):
    """With a record of each GPU test's seconds, the shares are dealt longest first to the least-loaded share: a test
    as long as ten others gets a share with fewer of them, and the batched judge cases, whose batch's time the record
    puts on one of them, are spread evenly as an even part each. Every test still runs exactly once."""
    from conftest import gpu_test_seconds, shard_of

    names = [f"tests/a.py::t{i}" for i in range(40)] + [
        f"tests/test_judge.py::test_judge_case_on_gpu[c{i}]" for i in range(12)
    ]
    gpu_names = set(names[:30]) | set(names[40:])
    seconds = {names[0]: 100.0, **{x: 10.0 for x in names[1:30]}, names[40]: 120.0}  # c0 set up the batch
    shares = [shard_of(names, gpu_names, k, 4, seconds) for k in range(4)]
    assert sorted(x for s in shares for x in s) == sorted(names)
    cost = {**seconds, **{x: 10.0 for x in names[40:]}}  # the batch's 120 s over its 12 cases
    loads = [sum(cost[x] for x in s if x in gpu_names) for s in shares]
    assert max(loads) - min(loads) <= 10, loads
    rr = [sum(cost[x] for x in shard_of(names, gpu_names, k, 4) if x in gpu_names) for k in range(4)]
    assert max(loads) < max(rr), (loads, rr)
    heavy = next(s for s in shares if names[0] in s)
    assert len([x for x in heavy if x in gpu_names]) < min(
        len([x for x in s if x in gpu_names]) for s in shares if s is not heavy
    )
    assert [len([x for x in s if "judge_case" in x]) for s in shares] == [3, 3, 3, 3]
    # the committed record reads; a broken one deals round-robin
    assert gpu_test_seconds() and all(v >= 0 for v in gpu_test_seconds().values())
    (tmp_path / "bad.json").write_text("{not json")
    assert gpu_test_seconds(tmp_path / "bad.json") == {}


def test_lanes_put_the_batch_and_what_follows_it_on_each_gpus_first_lane():
    """Two lanes a GPU on two GPUs (four shares): the batched judge cases and the tests that run after the batch
    (AFTER_BATCH) go only to shares 0 and 2, each GPU's first lane, which runs its batched cases before anything
    else; the other tests fill all four shares by their seconds. Every test runs exactly once."""
    from conftest import batch_first, shard_of

    cases = [f"tests/test_judge_cases.py::test_judge_case_on_gpu[c{i}]" for i in range(8)]
    after = [f"tests/test_judge_cases.py::test_every_shipped_variant_accepted[p{i}]" for i in range(2)]
    other = [f"tests/test_a.py::t{i}" for i in range(12)]
    names = other[:6] + after + cases + other[6:]
    seconds = {cases[0]: 80.0, **{x: 20.0 for x in after}, **{x: 10.0 for x in other}}
    shares = [shard_of(names, set(names), k, 4, seconds, lanes=2) for k in range(4)]
    assert sorted(x for s in shares for x in s) == sorted(names)
    for k in (1, 3):
        assert not set(shares[k]) & set(cases + after), shares[k]
    assert all(shares[k] for k in range(4))
    for k in (0, 2):
        ran = batch_first(shares[k])
        mine = [x for x in ran if x in cases]
        assert mine and ran[: len(mine)] == mine, ran
        assert [x for x in ran if x not in cases] == [x for x in shares[k] if x not in cases]


def test_pooled_gpu_tests_are_listed_by_every_lane_and_the_batch_lanes_own_dealt():
    """With --claims (tools/gpu_tests.py), the GPU tests that may run on any lane are in every share, to be claimed
    at run time; the batched cases and AFTER_BATCH still go only to the first lanes, dealt among them, in the order
    batch, AFTER_BATCH, the rest."""
    from conftest import batch_first, shard_of

    cases = [f"tests/test_judge_cases.py::test_judge_case_on_gpu[c{i}]" for i in range(6)]
    after = [f"tests/test_judge_cases.py::test_every_shipped_variant_accepted[p{i}]" for i in range(2)]
    free = [f"tests/test_a.py::t{i}" for i in range(5)]
    names = free[:3] + after + cases + free[3:]
    shares = [shard_of(names, set(names), k, 4, {cases[0]: 60.0}, lanes=2, pooled=True) for k in range(4)]
    assert all(set(free) <= set(s) for s in shares)
    assert not set(shares[1] + shares[3]) - set(free)
    assert sorted(x for k in (0, 2) for x in shares[k] if x not in free) == sorted(cases + after)
    for k in (0, 2):
        ran = batch_first(shares[k])
        mine = [x for x in ran if x not in free]
        assert ran[: len(mine)] == sorted(mine, key=lambda x: x not in cases), ran


def test_a_pooled_gpu_test_runs_in_the_lane_that_claims_it_first(tmp_path):
    """Two lanes' pytests as tools.gpu_tests starts them, one --claims folder: the first runs (here: skips, no GPU)
    the pooled tests it lists, the second, started once the folder exists and listing the same, runs none of them;
    each claim is a file naming its test."""
    from tools.gpu_tests import lane_args

    claims = tmp_path / "claims"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}

    def lane(k):
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *lane_args(k, 2, 2, claims)]
        argv += ["-k", "test_gpu_split_gemm_odd_shapes"]
        return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)

    first = lane(1)
    second = lane(0)
    ran = re.search(r"(\d+) skipped", first.stdout)
    assert ran and int(ran[1]) > 1, first.stdout[-2000:]
    assert second.returncode in (0, 5) and "no tests ran" in second.stdout, (
        second.stdout[-2000:] + second.stderr[-2000:]
    )
    made = sorted(f.read_text().split(" ", 1)[1].strip() for f in claims.iterdir())
    assert len(made) == int(ran[1]) and all("test_gpu_split_gemm_odd_shapes[" in x for x in made), made


def test_a_test_claimed_elsewhere_tears_down_what_the_test_before_it_kept(tmp_path):
    """A test claimed by another lane, between two tests that run here: the module the test before it kept set up
    for it is torn down, and the next module's test sets up and passes (not "previous item was not torn down")."""
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.conftest import CLAIMED, pytest_addoption, pytest_runtest_protocol  # noqa: F401\n\n\n"
        "def pytest_collection_modifyitems(config, items):\n"
        "    for it in items:\n"
        "        it.stash[CLAIMED] = True\n"
    )
    fixture = "import pytest\n\n\n@pytest.fixture(scope='module')\ndef kept():\n    yield 1\n\n\n"
    (tmp_path / "test_a.py").write_text(fixture + "def test_1(kept):\n    pass\n\n\ndef test_2(kept):\n    pass\n")
    (tmp_path / "test_b.py").write_text(fixture + "def test_3(kept):\n    pass\n")
    from tests.conftest import claim

    claims = tmp_path / "claims"
    assert claim(claims, "test_a.py::test_2")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--claims={claims}", str(tmp_path)]
    got = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0 and "2 passed" in got.stdout and "error" not in got.stdout, got.stdout[-3000:]


def test_gpu_tests_store_durations_merges_the_record(tmp_path):
    """tools/gpu_tests.py --store-durations: each GPU test's setup, call and teardown added from pytest's durations
    list, xdist's group suffix dropped, tests this run did not include keep their earlier figures."""
    import json
    from tools import gpu_tests

    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"measured": "earlier", "seconds": {"tests/a.py::old": 5.0, "tests/a.py::t[x]": 99.0}}))
    log = tmp_path / "gpu0.log"
    log.write_text(
        "..\n12.50s setup    tests/a.py::t[x]@gpu\n1.50s call     tests/a.py::t[x]@gpu\n"
        "0.10s teardown tests/a.py::u@gpu\n1 passed\n"
    )
    assert gpu_tests.store_durations([log, tmp_path / "gpu1.log"], rec, "NVIDIA X") == 2
    got = json.loads(rec.read_text())
    assert got["seconds"] == {"tests/a.py::old": 5.0, "tests/a.py::t[x]": 14.0, "tests/a.py::u": 0.1}
    assert "NVIDIA X" in got["measured"]


def test_gpu_tests_line_names_each_gpus_slowest_tests(tmp_path, capsys):
    """tools/gpu_tests.py: each GPU's line gives pytest's exit code and last line, then the slowest tests of that
    GPU's pytest (its --durations list), so the share that sets the suite's time says what it spent it on."""
    from tools import gpu_tests

    (tmp_path / "gpu0.log").write_text(
        "....\n============ slowest 3 durations ============\n"
        "117.90s call     tests/test_batch.py::test_sixteen@gpu\n"
        "77.09s setup    tests/test_judge.py::test_case[a]@gpu\n"
        "36.52s call     tests/test_sandbox.py::test_box[b]@gpu\n46 passed in 413.98s (0:06:53)\n"
    )

    class Done:
        def wait(self, timeout=None):
            return 0

    log = open(tmp_path / "other.log", "w")
    assert gpu_tests._finish([("GPU 0", "gpu0.log", Done(), log)], tmp_path, gpu_tests.Stop(install=False)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "GPU 0: exit 0: 46 passed in 413.98s (0:06:53)"
    assert out[1] == (
        "  slowest: 117.90s tests/test_batch.py::test_sixteen@gpu; 77.09s "
        "tests/test_judge.py::test_case[a]@gpu (setup); 36.52s tests/test_sandbox.py::test_box[b]@gpu"
    )
    assert gpu_tests.slowest(["1 passed"]) == []


def test_only_gpu_and_only_cpu_split_the_suite():
    """`--only gpu` and `--only cpu` (tools/gpu_tests.py: the GPU tests over the GPUs, then the rest with the GPUs
    hidden) collect disjoint sets that together are the whole suite, the GPU share being the tests marked @gpu."""

    def collected(*opt):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "--collect-only",
                "-p",
                "no:cacheprovider",
                "-n",
                "0",
                *opt,
                "tests/test_cli.py",
                "tests/test_gpu.py",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        return {ln for ln in r.stdout.splitlines() if "::" in ln}

    every, on_gpu, on_cpu = collected(), collected("--only", "gpu"), collected("--only", "cpu")
    assert on_gpu and on_cpu and not on_gpu & on_cpu and on_gpu | on_cpu == every
    assert "tests/test_gpu.py::test_compile_error_names_file_and_line" in on_gpu
    assert "tests/test_cli.py::test_only_gpu_and_only_cpu_split_the_suite" in on_cpu


def test_a_reference_that_raises_on_its_own_inputs_is_one_usage_line(tmp_path, cli):
    """Bad input: a reference whose forward always raises (where the meta device cannot run it either) gets one
    line naming it and exit 2, not the judge's traceback."""
    ref = tmp_path / "raises.py"
    ref.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        raise IndexError('index 11 is out of bounds')\n\n\ndef get_inputs():\n"
        "    return [torch.randn(8, 8)]\n\n\ndef get_init_inputs():\n    return []\n"
    )
    r = cli("--ref", ref, "--candidate", ROOT / "tests" / "batch" / "good.py", "--device", "cpu", "--allow-torch")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "the reference itself raised on its own inputs" in r.stderr and "IndexError" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_stopped_gpu_test_run_lets_each_pytest_say_what_it_ran(tmp_path, monkeypatch):
    """tools.gpu_tests passes a time limit's SIGTERM on to each pytest as Ctrl-C (each in a session of its own): each
    ends with its own summary; one that has not ended when the grace is over is killed, and a killed one is no pass."""
    import signal
    import time
    from tools import gpu_tests

    # The polite stand-in takes Ctrl-C as a pytest the runner starts does: the runner's own handler (Stop) leaves
    # SIGINT at its default in its children, also where the runner was started with it ignored (`... &` in a script)
    polite = (
        "import signal, sys, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\ntry:\n"
        "    print('up', flush=True)\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
        "    print('3 passed (interrupted)', flush=True)\n    sys.exit(2)\n"
    )
    stubborn = (
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)\n"
    )
    monkeypatch.setattr(gpu_tests, "STOP_GRACE_S", 2)
    stop = gpu_tests.Stop(install=False)
    procs = []
    for name, src in (("polite", polite), ("stubborn", stubborn)):
        log = open(tmp_path / f"{name}.log", "w")
        procs.append(
            (
                name,
                f"{name}.log",
                stop.started(
                    subprocess.Popen(
                        [sys.executable, "-c", src], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    )
                ),
                log,
            )
        )
    up = time.monotonic() + 60  # both started and waiting (a loaded host starts Python slowly): each says so
    while not all((tmp_path / f"{n}.log").read_text().startswith("up") for n in ("polite", "stubborn")):
        assert time.monotonic() < up, "the stand-in pytests did not start"
        time.sleep(0.05)
    t = time.monotonic()
    stop(signal.SIGTERM, None)
    assert gpu_tests._finish(procs, tmp_path, stop) == 128 + signal.SIGKILL
    assert time.monotonic() - t < 10
    assert "3 passed (interrupted)" in (tmp_path / "polite.log").read_text()
    assert procs[0][2].returncode == 2 and procs[1][2].returncode == -signal.SIGKILL


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM --no-sandbox"])
def test_ctrl_c_on_one_judgement_is_one_line_and_leaves_nothing_running(how):
    """Ctrl-C (or a time limit's SIGTERM) while the candidate's call hangs: `interrupted: no verdict`, exit 128 + the
    signal, no traceback, at once (the worker stopped mid-call is killed, not asked to quit and waited for), and no
    process of the job left: an unboxed worker, which a forkserver started, ends with its judge too."""
    import signal
    import time

    batch = ROOT / "tests" / "batch"
    sig = signal.SIGTERM if how.startswith("SIGTERM") else signal.SIGINT
    p = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "--ref",
            str(batch / "ref.py"),
            "--candidate",
            str(batch / "hang.py"),
            "--device",
            "cpu",
            "--allow-torch",
            "--timeout",
            "120",
            *how.split()[1:],
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    seen = ""
    while time.monotonic() < deadline and "drawn from --seed" not in seen:  # the judge has reached its calls
        seen += p.stderr.readline()
    time.sleep(4.0)
    t = time.monotonic()
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    took = time.monotonic() - t
    assert p.returncode == 128 + sig and "interrupted: no verdict" in err and "Traceback" not in err, err[-3000:]
    assert took < 6.0, took
    time.sleep(2.5)  # an unboxed worker looks for its judge every second
    left = [
        ps
        for ps in subprocess.run(
            ["ps", "-o", "stat=,args=", "-s", str(p.pid)], capture_output=True, text=True
        ).stdout.splitlines()
        if not ps.strip().startswith("Z")
    ]
    assert not left, left  # its session (the judge, the box, the worker) holds nothing but the dead


def test_json_into_a_folder_not_made_yet_is_made_before_the_judging(cli, tmp_path):
    """--json into folders that do not exist: made before the judging, the record written, exit 0; a path whose
    folder cannot be made is a usage error before any judging (exit 2), never a traceback after the verdict."""
    d = ROOT / "tests" / "judge_cases" / "relu"
    out = tmp_path / "new" / "deeper" / "r.json"
    r = cli(
        "--ref",
        d / "ref.py",
        "--candidate",
        d / "torch_rewrite.py",
        "--allow-torch",
        "--device",
        "cpu",
        "--seed",
        "3",
        "--json",
        out,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rec = json.loads(out.read_text())
    assert rec["status"] == "accepted" and rec["failure"] is None and rec["schema_version"] == 1
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    r = cli(
        "--ref",
        d / "ref.py",
        "--candidate",
        d / "torch_rewrite.py",
        "--allow-torch",
        "--device",
        "cpu",
        "--json",
        blocker / "r.json",
    )
    assert r.returncode == 2 and "its folder cannot be made" in r.stderr and "Traceback" not in r.stderr, r.stderr
