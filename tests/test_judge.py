"""The judge's driver and what it watches (run.py --ref / --candidate): the namespace fingerprint and threads left
working in a candidate's process, the stage table and its record, the command line's usage errors and CPU verdicts.
Its cases are test_judge_cases.py, its memory plan test_memory_plan.py, its parity and timing stages test_parity.py
and test_escape_timing.py."""

import json
import inspect
import time

import pytest
import torch

import harness
from kp.judge import driver as judge
from kp.judge import runners
from kp.worker import guards
from kp.judge.stages import Stage
from conftest import HAS_GPU
from cases import CASES_DIR

# ---------------------------------------------------------------------------------------------------------------
# Host-side logic (CI).


def test_fingerprint_sees_a_patched_torch_function():
    before = guards.namespace_fingerprint()
    orig = torch.softmax
    try:
        torch.softmax = lambda *a, **k: orig(*a, **k)
        assert "torch.softmax" in guards.fingerprint_changes(before)
    finally:
        torch.softmax = orig
    assert guards.fingerprint_changes(before) == []


def test_fingerprint_sees_code_swapped_in_place_and_a_changed_constant():
    from kp.lib import timing

    before = guards.namespace_fingerprint()
    code, hold = timing.summarize.__code__, timing.HOLD_CYCLES
    try:
        timing.summarize.__code__ = (lambda samples: None).__code__  # same object, new behaviour
        assert (
            "kp.lib.timing.summarize (in place: its code, defaults, closure or contents)"
            in guards.fingerprint_changes(before)
        )
    finally:
        timing.summarize.__code__ = code
    try:
        timing.HOLD_CYCLES = 1
        assert "kp.lib.timing.HOLD_CYCLES" in guards.fingerprint_changes(before)
    finally:
        timing.HOLD_CYCLES = hold
    assert guards.fingerprint_changes(before) == []


def test_torchs_own_rebinding_is_told_apart_from_a_candidates():
    """A worker on the CPU imports torch._dynamo only where its candidate may compile, so the import can come after
    the fingerprint (a FLOP counter, an optimizer): torch's own rebindings, torch._disable_dynamo(torch.manual_seed)
    and the first optimizer's wrapping of its step, are not changes; a wrapper of the candidate's, even one that looks
    like them or wraps torch's, is."""
    import functools
    from torch._compile import _disable_dynamo

    before = guards.namespace_fingerprint()
    orig = torch.manual_seed

    @functools.wraps(orig)
    def evil(seed):
        return orig(seed + 1)

    try:
        for replacement, judged in (
            (_disable_dynamo(orig), []),
            (evil, ["torch.manual_seed"]),
            (_disable_dynamo(evil), ["torch.manual_seed"]),
        ):
            torch.manual_seed = replacement
            assert guards.fingerprint_changes(before) == judged
    finally:
        torch.manual_seed = orig
    step = torch.optim.SGD.__dict__["step"]  # the first SGD's own wrapping of its class's step: not a change
    try:
        torch.optim.SGD.step = torch.optim.Optimizer.profile_hook_step(step)
        assert guards.fingerprint_changes(before) == []
        torch.optim.SGD.step = functools.wraps(step)(lambda *a, **k: None)
        assert guards.fingerprint_changes(before) == ["torch.optim.SGD.step"]
    finally:
        torch.optim.SGD.step = step


def test_a_cpu_candidate_that_imports_dynamo_late_or_compiles_is_accepted(tmp_path, cli):
    """On the CPU the box leaves torch._dynamo out: a candidate whose call imports it (torch's FLOP counter, an
    optimizer) is not taken for one that replaced torch.manual_seed, and one that compiles gets torch.compile's
    first-use patches made before its import, as on a GPU."""
    ref = CASES_DIR / "relu" / "ref.py"
    (tmp_path / "late.py").write_text(
        "import torch\nimport torch.nn as nn\nfrom torch.utils.flop_counter import FlopCounterMode\n\n\n"
        "class ModelNew(nn.Module):\n    def forward(self, x):\n"
        "        torch.optim.SGD([torch.zeros(1, requires_grad=True)])\n"
        "        with FlopCounterMode(display=False):\n            return torch.relu(x)\n"
    )
    (tmp_path / "compiles.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.f = torch.compile(torch.relu, backend='eager')\n\n"
        "    def forward(self, x):\n        return self.f(x)\n"
    )
    for name in ("late.py", "compiles.py"):
        r = cli("--ref", ref, "--candidate", tmp_path / name, "--device", "cpu", "--allow-torch", "--seed", "3")
        assert r.returncode == 0, r.stdout[-600:] + r.stderr[-600:]


def test_late_threads_are_those_the_candidate_left_working(tmp_path):
    """A Timer yet to fire, a thread sleeping in the candidate's own code, a builtin target running: counted. A
    thread the judge's machinery started, and a thread pool parked between work items: not."""
    import concurrent.futures
    import importlib.util
    import threading
    import time

    (tmp_path / "cand_threads.py").write_text(
        "import threading, time\n"
        "def sleepy(ev):\n    ev.wait(30)\n"
        "def timer(ev):\n    t = threading.Timer(30, ev.set); t.start(); return t\n"
        "def own_thread(ev):\n    t = threading.Thread(target=sleepy, args=(ev,)); t.start(); return t\n"
        "def builtin_thread(ev):\n    t = threading.Thread(target=time.sleep, args=(3,)); t.start(); return t\n"
        "def pool():\n    p = __import__('concurrent.futures').futures.ThreadPoolExecutor(1)\n"
        "    p.submit(int).result(); return p\n"
    )
    spec = importlib.util.spec_from_file_location("cand_threads", tmp_path / "cand_threads.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    orig_start = threading.Thread.start
    guards.watch_thread_starts(str(tmp_path))
    before = {t.ident for t in threading.enumerate()}
    ev = threading.Event()
    try:
        ours = threading.Thread(target=ev.wait, args=(30,))  # started by the judge's code: not the candidate's
        ours.start()
        p = mod.pool()
        time.sleep(0.05)
        assert guards.late_threads(before, str(tmp_path)) == []

        started = [mod.timer(ev), mod.own_thread(ev), mod.builtin_thread(ev)]
        time.sleep(0.05)
        late = guards.late_threads(before, str(tmp_path))
        assert len(late) == 3, late
        assert any("Timer yet to fire" in x for x in late) and any("cand_threads.py:sleepy" in x for x in late)
    finally:
        ev.set()
        for t in started + [ours]:
            getattr(t, "cancel", lambda: None)()
            t.join(5)
        p.shutdown()
        threading.Thread.start = orig_start
    assert guards.late_threads(before, str(tmp_path)) == []


def test_late_threads_keeps_no_caller_alive(tmp_path):
    """The check runs before every timed call: it must not tie its callers' frames into a reference cycle, or each
    call's input draw (6 GiB at KernelBench's GELU shape) stays allocated until the next garbage collection."""
    import gc
    import weakref

    class Draw:
        pass

    def caller():
        draw = Draw()
        guards.late_threads(set(), str(tmp_path))
        return weakref.ref(draw)

    gc.disable()
    try:
        gone = caller()
        assert gone() is None, "the caller's local outlived its frame: a reference cycle holds it"
    finally:
        gc.enable()


def test_reference_file_without_the_contract_is_a_usage_error(tmp_path, cli):
    f = tmp_path / "not_kb.py"
    f.write_text("import torch\n\ndef get_inputs():\n    return [torch.rand(3)]\n")
    with pytest.raises(harness.UsageError, match="defines no Model, get_init_inputs"):
        judge.Reference.load(("file", str(f)))
    r = cli("--ref", f, "--candidate", CASES_DIR / "relu" / "torch_rewrite.py", "--device", "cpu")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "defines no Model" in r.stderr


def test_the_driver_runs_its_stage_table_in_order(monkeypatch):
    """The judge is its stage table: each entry a function of the judge's run with one signature, run in order
    where it applies, its seconds in the record under its name; a stage added to the table runs with no other edit."""
    stages = judge.STAGES + judge.AFTER_WORKERS
    assert len({s.name for s in stages}) == len(stages)
    for s in stages:
        assert list(inspect.signature(s.run).parameters) == ["run", "rec", "init"], s
    seen = []

    def stage_seen(run, rec, init):
        seen.append(list(rec))

    monkeypatch.setattr(judge, "STAGES", judge.STAGES[:3] + (Stage("seen", stage_seen),) + judge.STAGES[3:])
    ref = judge.Reference.load(("file", str(harness.ROOT / "tests" / "batch" / "ref.py")))
    rec = judge.evaluate(ref, harness.ROOT / "tests" / "batch" / "good.py", seed=2, device="cpu", allow_torch=True)
    assert rec["rows"]["candidate"]["accepted"] and len(seen) == 1
    assert list(rec["stage_seconds"]) == [
        "judge start",
        "footprint",
        "setup and baselines",
        "import",
        "parity",
        "seen",
        "kernelbench check",
    ]
    assert rec["process_s_before_judge"] > 0  # this test process's age when the judge started


def test_the_stage_table_books_waits_and_builds_apart(monkeypatch):
    """A stage's wait for other judges on its GPU and the candidate's own extension builds inside it (the worker
    counts its load/load_inline seconds) are rows of their own in the record's stage table, taken out of the stage."""

    def stage_waits_and_builds(run, rec, init):
        time.sleep(0.3)
        run._waited_for_gpu(0.1)  # as timing.gpu_shared tells it
        run.runners[0].build_s += 0.15  # as a worker's reply tells it

    monkeypatch.setattr(judge, "STAGES", judge.STAGES + (Stage("wb", stage_waits_and_builds),))
    ref = judge.Reference.load(("file", str(harness.ROOT / "tests" / "batch" / "ref.py")))
    rec = judge.evaluate(ref, harness.ROOT / "tests" / "batch" / "good.py", seed=2, device="cpu", allow_torch=True)
    st = rec["stage_seconds"]
    assert st[judge.WAIT_STAGE] == 0.1 and st[judge.BUILD_STAGE] == 0.15 and 0.03 <= st["wb"] < 0.3, st
    assert rec["gpu_wait_s"] == 0.1


@pytest.mark.parametrize("judges", ["SCALAR", None], ids=["instruction_set", "threads"])
def test_a_worker_on_other_cpu_kernels_is_said(tmp_path, monkeypatch, judges):
    """PyTorch picks its CPU kernels per process from what the machine says of its CPU: where the candidate's
    process picked another instruction set than the judge's, a fresh worker is started (told the judge's choice),
    and where that still differs, or the thread counts alone differ, the record says so beside the verdict (its
    rounding may differ)."""
    from kp.judge import construct
    import torch

    judges = judges or torch.backends.cpu.get_cpu_capability()  # the same instruction set, other threads
    workers = 2 if judges == "SCALAR" else 1
    kernels = (judges, 1 if judges == "SCALAR" else 999)
    mine = f"{kernels[0]} CPU kernels on {kernels[1]} threads"
    monkeypatch.setattr(construct, "cpu_kernels", lambda: kernels)
    started = []
    real = runners.ProcessRunner.__init__
    monkeypatch.setattr(
        runners.ProcessRunner, "__init__", lambda self, *a, **k: started.append(1) or real(self, *a, **k)
    )
    ref = judge.Reference.load(("file", str(harness.ROOT / "tests" / "batch" / "ref.py")))
    rec = judge.evaluate(ref, harness.ROOT / "tests" / "batch" / "good.py", seed=2, device="cpu", allow_torch=True)
    assert rec["rows"]["candidate"]["accepted"]
    assert any(f"the judge's its {mine}" in n for n in rec["notes_list"]), rec["notes_list"]
    assert len(started) == workers  # the first worker, and a fresh one for another instruction set only


def test_cli_candidate_usage_errors(tmp_path, cli):
    assert cli("--problem", "softmax", "--candidate", tmp_path / "missing.py", "--device", "cpu").returncode == 2
    f = harness.ROOT / "tests" / "wrong" / "zeros.py"
    for extra in (["--trials", "2"], ["--precision", "bf17"], ["--variant", "2_online"], ["--device", "tpu"]):
        r = cli(
            "--problem", "softmax", "--candidate", f, *extra, *(["--device", "cpu"] if extra[0] != "--device" else [])
        )
        assert r.returncode == 2 and "Traceback" not in r.stderr, (extra, r.stderr)
    r = cli("--problem", "softmax", "--ref", CASES_DIR / "relu" / "ref.py")
    assert r.returncode == 2 and "not allowed with" in r.stderr


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_cli_without_gpu_is_usage_error(cli):
    for args in (
        ("--problem", "softmax", "--candidate", harness.ROOT / "tests" / "wrong" / "zeros.py"),
        ("--ref", CASES_DIR / "relu" / "ref.py"),
    ):
        r = cli(*args)
        assert r.returncode == 2 and "--device cpu" in r.stderr and "Traceback" not in r.stderr


def test_cli_candidate_cpu_verdicts_and_seed_replay(tmp_path, cli):
    r = cli(
        "--problem",
        "softmax",
        "--candidate",
        harness.ROOT / "tests" / "wrong" / "zeros.py",
        "--device",
        "cpu",
        "--seed",
        "77",
        "--json",
        tmp_path / "rec.json",
    )
    assert r.returncode == 1, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("rejected: trial 1 (seed 77)")  # at a smaller shape
    assert "drawn from --seed 77" in r.stderr
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert rec["trial_seeds"] == [77, 78, 79] and rec["rows"]["candidate"]["accepted"] is False
    assert rec["shape"] == "4096x393216" and rec["judged_shape"].endswith("x393216")  # its batch, the family's size
    assert harness.problem_module("softmax").batch_size == 4096  # put back after the run
    outside = tmp_path / "my_softmax.py"  # a candidate outside the repo
    outside.write_text((harness.ROOT / "tests" / "wrong" / "torch_only.py").read_text())
    r = cli(
        "--problem",
        "softmax",
        "--candidate",
        outside,
        "--device",
        "cpu",
        "--seed",
        "77",
        "--json",
        tmp_path / "ok.json",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    v = r.stdout.strip().splitlines()[-1]  # an honest torch candidate on the CPU: says which checks were not run
    assert v.startswith("accepted (parity only on cpu") and "timing" in v and "own kernel" in v
    row = json.loads((tmp_path / "ok.json").read_text())["rows"]["candidate"]
    assert len(row["checks"]) == 6 + 3 * len(harness.problem_module("softmax").CASES)  # 3 fresh, 3 derived
    assert all(c["rel_l2"] <= c["budget"] for c in row["checks"].values())


def test_cli_a_file_that_is_not_python_is_a_usage_error(cli):
    """Python imports no other name: such a file was a rejection at import with a loader's AttributeError."""
    for args in (
        ("--ref", CASES_DIR / "relu" / "ref.py", "--candidate", harness.ROOT / "README.md"),
        ("--ref", harness.ROOT / "README.md"),
    ):
        r = cli(*args, "--device", "cpu")
        assert r.returncode == 2 and "is not a Python file" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.skipif(torch.version.cuda is not None, reason="a torch built with CUDA builds the extension")
def test_a_candidate_whose_extension_compiles_cuda_code_gets_no_verdict_on_the_cpu(cli):
    """A host without CUDA can neither build nor run the candidate's kernel: turned away at its import ("rejected:
    import: ... CUDA_HOME ..."), the candidate was blamed for the host. No verdict, and where to judge it."""
    r = cli("--ref", CASES_DIR / "relu" / "ref.py", "--candidate", CASES_DIR / "relu" / "kernel.py", "--device", "cpu")
    assert r.returncode == 2, r.stdout + r.stderr
    assert (
        "no verdict on the CPU" in r.stderr
        and "'judge_case_relu' compiles CUDA code" in r.stderr
        and "judge it on a GPU" in r.stderr
    ), r.stderr


def test_a_build_that_compiles_cuda_code_is_told_from_one_that_does_not():
    from kp.worker.guards import builds_cuda

    assert builds_cuda("load_inline", ("x", "int f();", "__global__ void k() {}"), {})
    assert builds_cuda("load_inline", ("x",), {"cpp_sources": "", "cuda_sources": ["__global__ void k() {}"]})
    assert not builds_cuda("load_inline", ("x", "int f();"), {"functions": ["f"]})
    assert builds_cuda("load", ("x", ["a.cpp", "k.cu"]), {})
    assert builds_cuda("load", ("x",), {"sources": "a.cpp", "with_cuda": True})
    assert not builds_cuda("load", ("x",), {"sources": ["a.cpp"]})
    assert not builds_cuda("load", (), {"sources": object()})  # unreadable: not said to be CUDA
