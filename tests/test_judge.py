"""The judge's driver and what it watches (run.py --ref / --candidate): the namespace fingerprint and threads left
working in a candidate's process, the footprint and the memory plan, out of GPU memory and whose doing it was, the
stage table and its record, the command line's usage errors and CPU verdicts. Its cases are test_judge_cases.py,
its parity and timing stages test_parity.py and test_escape_timing.py."""
import json
import inspect
import re
import time

import pytest
import torch

import harness
from kp.judge import driver as judge
from kp.judge import expected, guards, memory, plan, runners
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
        assert "kp.lib.timing.summarize (in place: its code, defaults, closure or contents)" in \
            guards.fingerprint_changes(before)
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
        for replacement, judged in ((_disable_dynamo(orig), []), (evil, ["torch.manual_seed"]),
                                    (_disable_dynamo(evil), ["torch.manual_seed"])):
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
        "class ModelNew(nn.Module):\n    def forward(self, x):\n        torch.optim.SGD([torch.zeros(1, requires_grad=True)])\n"
        "        with FlopCounterMode(display=False):\n            return torch.relu(x)\n")
    (tmp_path / "compiles.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.f = torch.compile(torch.relu, backend='eager')\n\n"
        "    def forward(self, x):\n        return self.f(x)\n")
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
        "    p.submit(int).result(); return p\n")
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


def test_footprint_and_flops_from_the_reference():
    fp = judge.Reference.load(("problem", "softmax")).footprint("cpu")
    assert fp == {"shapes": "4096x393216", "inputs": 4096 * 393216 * 4, "outputs": 4096 * 393216 * 4, "weights": 0,
                  "flops": 0, "peak": 2 * 4096 * 393216 * 4,  # the input and its softmax alive at once
                  "rows": 4096,  # the batch (dim 0) the float64 reference may be sliced over
                  "float_bytes": 4}  # the floating inputs' element size (the float64 copy is twice as large)
    lin = judge.Reference.load(("problem", "matmul_gelu_softmax")).footprint("cpu")
    assert lin["flops"] == 2 * 1024 * 8192 * 8192  # FlopCounterMode on the reference, not a hand count
    assert lin["weights"] == (8192 * 8192 + 8192) * 4


def test_memory_check_is_one_line():
    fp = {"inputs": 6 << 30, "outputs": 6 << 30, "weights": 0, "flops": 0}
    plan.check_memory("p", fp, 8, 40 << 30)
    with pytest.raises(harness.UsageError) as ei:
        plan.check_memory("softmax", fp, 1, 30 << 30)
    msg = str(ei.value)
    assert "\n" not in msg and "36.0 GiB" in msg and "30.0 GiB are free" in msg
    heavy = {"inputs": 1 << 30, "outputs": 1 << 30, "weights": 1 << 30, "flops": 0}
    assert plan.memory_need(heavy, 4) == (9 + 3) << 30  # one weight copy per further row
    with pytest.raises(harness.UsageError, match="the weights of 4 models"):
        plan.check_memory("w", heavy, 4, 10 << 30)


def test_the_judges_own_out_of_memory_says_whose_memory_it_was():
    """The judge's own process out of GPU memory is no verdict either way, and the line says what was measured:
    memory other processes took (judge again alone), or none taken by others (the judge's and its workers' own:
    alone would not help), or nothing measured; never 'another process' without the measurement."""
    g = 2**30
    args = ("softmax", ["judge start", "parity"], 7 * g, 36 * g)
    taken = memory.own_oom_reason(*args, 12 * g, 3 * g, "CUDA out of memory. Tried to allocate 12.00 GiB")
    assert "other processes took 12.0 GiB" in taken and "after judge start, parity" in taken
    own = memory.own_oom_reason(*args, 1 * g, 14 * g, "CUDA out of memory")
    assert "no other process took GPU memory" in own and "(14.0 GiB) held more than the plan allows" in own
    assert "not measured" in memory.own_oom_reason(*args, None, 0, "x") and "\n" not in own
    from tools import judge_corpus  # each is the batch's and the corpus tool's "no verdict: GPU memory"
    assert all(re.search(judge_corpus.NO_VERDICT_GPU_MEMORY, "error: " + m) for m in (taken, own))


def test_reference_file_without_the_contract_is_a_usage_error(tmp_path, cli):
    f = tmp_path / "not_kb.py"
    f.write_text("import torch\n\ndef get_inputs():\n    return [torch.rand(3)]\n")
    with pytest.raises(harness.UsageError, match="defines no Model, get_init_inputs"):
        judge.Reference.load(("file", str(f)))
    r = cli("--ref", f, "--candidate", CASES_DIR / "relu" / "torch_rewrite.py", "--device", "cpu")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "defines no Model" in r.stderr


def test_the_driver_runs_its_stage_table_in_order(monkeypatch):
    """The judge is its stage table: each entry a Judge method with one signature, run in order where it applies,
    its seconds in the record under its name; a stage added to the table runs with no other edit."""
    stages = judge.STAGES + judge.AFTER_WORKERS
    assert len({s.name for s in stages}) == len(stages)
    for s in stages:
        assert list(inspect.signature(getattr(judge.Judge, s.method)).parameters) == ["self", "rec", "init"], s
    seen = []
    monkeypatch.setattr(judge.Judge, "stage_seen", lambda self, rec, init: seen.append(list(rec)), raising=False)
    monkeypatch.setattr(judge, "STAGES", judge.STAGES[:3] + (judge.Stage("seen", "stage_seen"),) + judge.STAGES[3:])
    ref = judge.Reference.load(("file", str(harness.ROOT / "tests" / "batch" / "ref.py")))
    rec = judge.evaluate(ref, harness.ROOT / "tests" / "batch" / "good.py", seed=2, device="cpu", allow_torch=True)
    assert rec["rows"]["candidate"]["accepted"] and len(seen) == 1
    assert list(rec["stage_seconds"]) == ["judge start", "footprint", "setup and baselines", "import", "parity",
                                          "seen", "kernelbench check"]
    assert rec["process_s_before_judge"] > 0  # this test process's age when the judge started


def test_the_stage_table_books_waits_and_builds_apart(monkeypatch):
    """A stage's wait for other judges on its GPU and the candidate's own extension builds inside it (the worker
    counts its load/load_inline seconds) are rows of their own in the record's stage table, taken out of the stage."""
    def stage_waits_and_builds(self, rec, init):
        time.sleep(0.3)
        self._waited_for_gpu(0.1)  # as timing.gpu_shared tells it
        self.runners[0].build_s += 0.15  # as a worker's reply tells it
    monkeypatch.setattr(judge.Judge, "stage_wb", stage_waits_and_builds, raising=False)
    monkeypatch.setattr(judge, "STAGES", judge.STAGES + (judge.Stage("wb", "stage_wb"),))
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
    monkeypatch.setattr(runners.ProcessRunner, "__init__", lambda self, *a, **k: started.append(1) or real(self, *a,
                                                                                                           **k))
    ref = judge.Reference.load(("file", str(harness.ROOT / "tests" / "batch" / "ref.py")))
    rec = judge.evaluate(ref, harness.ROOT / "tests" / "batch" / "good.py", seed=2, device="cpu", allow_torch=True)
    assert rec["rows"]["candidate"]["accepted"]
    assert any(f"the judge's its {mine}" in n for n in rec["notes_list"]), rec["notes_list"]
    assert len(started) == workers  # the first worker, and a fresh one for another instruction set only


def test_cli_candidate_usage_errors(tmp_path, cli):
    assert cli("--problem", "softmax", "--candidate", tmp_path / "missing.py", "--device", "cpu").returncode == 2
    f = harness.ROOT / "tests" / "wrong" / "zeros.py"
    for extra in (["--trials", "2"], ["--precision", "bf17"], ["--variant", "2_online"], ["--device", "tpu"]):
        r = cli("--problem", "softmax", "--candidate", f, *extra, *(["--device", "cpu"] if extra[0] != "--device"
                                                                      else []))
        assert r.returncode == 2 and "Traceback" not in r.stderr, (extra, r.stderr)
    r = cli("--problem", "softmax", "--ref", CASES_DIR / "relu" / "ref.py")
    assert r.returncode == 2 and "not allowed with" in r.stderr


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_cli_without_gpu_is_usage_error(cli):
    for args in (("--problem", "softmax", "--candidate", harness.ROOT / "tests" / "wrong" / "zeros.py"),
                 ("--ref", CASES_DIR / "relu" / "ref.py")):
        r = cli(*args)
        assert r.returncode == 2 and "--device cpu" in r.stderr and "Traceback" not in r.stderr


def test_cli_candidate_cpu_verdicts_and_seed_replay(tmp_path, cli):
    r = cli("--problem", "softmax", "--candidate", harness.ROOT / "tests" / "wrong" / "zeros.py",
            "--device", "cpu", "--seed", "77", "--json", tmp_path / "rec.json")
    assert r.returncode == 1, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("rejected: trial 1 (seed 77)")  # at a smaller shape
    assert "drawn from --seed 77" in r.stderr
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert rec["trial_seeds"] == [77, 78, 79] and rec["rows"]["candidate"]["accepted"] is False
    assert rec["shape"] == "4096x393216" and rec["judged_shape"].endswith("x393216")  # its batch, the family's size
    assert harness.problem_module("softmax").batch_size == 4096  # put back after the run
    outside = tmp_path / "my_softmax.py"  # a candidate outside the repo
    outside.write_text((harness.ROOT / "tests" / "wrong" / "torch_only.py").read_text())
    r = cli("--problem", "softmax", "--candidate", outside, "--device", "cpu", "--seed", "77", "--json",
            tmp_path / "ok.json")
    assert r.returncode == 0, r.stdout + r.stderr
    v = r.stdout.strip().splitlines()[-1]  # an honest torch candidate on the CPU: says which checks were not run
    assert v.startswith("accepted (parity only on cpu") and "timing" in v and "own kernel" in v
    row = json.loads((tmp_path / "ok.json").read_text())["rows"]["candidate"]
    assert len(row["checks"]) == 6 + 3 * len(harness.problem_module("softmax").CASES)  # 3 fresh, 3 derived
    assert all(c["rel_l2"] <= c["budget"] for c in row["checks"].values())


# ---------------------------------------------------------------------------------------------------------------
# GPU: the verdicts that need the NaN-filled allocator, timing and the profiler.


def test_a_forward_whose_intermediates_outgrow_the_host_is_not_run_on_cpu(tmp_path):
    """Attention over 4,096 positions holds its 4096 x 4096 scores: 64 MiB of scores for 2 MiB of inputs. Where
    the calls' peak (the references', the candidate's) does not fit the host, the benchmark shape is skipped out
    loud, not run into the kernel's out-of-memory killer."""
    (tmp_path / "attn.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, q):\n        return torch.softmax(q @ q.transpose(-1, -2), -1) @ q\n\n\n"
        "def get_inputs():\n    return [torch.randn(4096, 128)]\n\n\ndef get_init_inputs():\n    return []\n")
    fp = judge.Reference.load(("file", str(tmp_path / "attn.py"))).footprint("cpu")
    assert fp["peak"] >= 2 * (4096 * 4096 * 4) and fp["inputs"] == 4096 * 128 * 4
    assert plan.cpu_bench_refusal(fp, 64 << 30) is None
    why = plan.cpu_bench_refusal(fp, 100 << 20)
    assert why.startswith("the benchmark shape needs about 0.") and "a forward's peak 0.1 GiB" in why and \
        "0.1 GiB planned here" in why, why


def test_a_call_out_of_gpu_memory_is_judged_by_whose_memory_filled_the_gpu(monkeypatch):
    """A row's call that runs out of GPU memory: no verdict when other processes took the memory since the plan
    (on a shared GPU a right kernel would be turned away), a rejection that says so when the row's own process
    filled what the plan left or asked for more than the GPU had free; the other workers' memory is the judge's."""
    from kp.errors import OutOfMemory, oom_request_bytes
    ref = judge.Reference.load(("file", str(CASES_DIR / "relu" / "ref.py")))
    g = 2**30
    why = "trial 2: raised OutOfMemoryError: CUDA out of memory. Tried to allocate 12.06 GiB."
    assert oom_request_bytes(why) == int(12.06 * g)

    class Worker:
        isolated = True

        def __init__(self, held, asked=0, fails=False):
            self.held, self.asked, self.fails = held, asked, fails

        def call(self, stage, cmd, *args):
            if cmd == "memory":
                return {"peak": self.held, "held": self.held}
            if self.fails:
                raise OutOfMemory(why, self.held, self.asked)
            return {}

    def judged(now_free, held, others_held=0, asked=int(12.06 * g), others_at_plan=g // 2):
        j = judge.Judge(ref, seed=3, device="cpu", sandbox=False, bench=False)
        j._fp = {"inputs": 6 * g, "outputs": 6 * g, "weights": 0}
        j.gpu_at_plan = (70 * g, 1 * g)  # free, the judge's own, when the plan was made
        j.others_at_plan = others_at_plan  # other processes' (and CUDA contexts') then
        monkeypatch.setattr(memory, "gpu_snapshot", lambda: (now_free, 1 * g))
        j.runners = [Worker(held, asked, fails=True), Worker(others_held)]
        j.rows = [expected.Row("candidate", j.runners[0]), expected.Row("other", j.runners[1])]
        j._each(lambda row: row.runner.call("trial 2", "forward"))
        return j.rows[0]

    # the GPU lost 67 GiB, the row's process holds 12.7: another process took the rest, no verdict
    with pytest.raises(harness.UsageError) as ei:
        judged(3 * g, int(12.67 * g))
    assert "other processes took 54.3 GiB" in str(ei.value) and "no verdict" in str(ei.value)
    # ... unless that was the judge's other worker
    row = judged(3 * g, int(12.67 * g), others_held=54 * g)
    assert not row.accepted and "no other process took GPU memory" in row.reason and "held 12.7 GiB" in row.reason
    # the row's own process filled it
    row = judged(3 * g, 66 * g, asked=2 * g)
    assert not row.accepted and "no other process took GPU memory" in row.reason and "held 66.0 GiB" in row.reason
    # the same inside what the GPU had free, but beside other processes that held 10 GiB at the start (other slots
    # of a batch): what was left beside them is theirs to decide, so no verdict, judged again alone
    with pytest.raises(harness.UsageError) as ei:
        judged(3 * g, 66 * g, asked=2 * g, others_at_plan=10 * g)
    assert "other processes held 10.0 GiB" in str(ei.value) and "judge again with the GPU to itself" in str(ei.value)
    # ... but the CUDA contexts of the judge and its two workers (about a GiB each) are the judge's own
    row = judged(3 * g, 66 * g, asked=2 * g, others_at_plan=int(4.5 * g))
    assert not row.accepted and "held 66.0 GiB" in row.reason
    # a request beyond what the GPU had free at the start is the row's, whatever else came
    row = judged(3 * g, 1 * g, asked=80 * g)
    assert not row.accepted and "more than the 70.0 GiB the GPU had free" in row.reason
    # a plain rejection is untouched
    j = judge.Judge(ref, seed=3, device="cpu", sandbox=False, bench=False)
    j.rows = [expected.Row("candidate", Worker(0))]
    j._each(lambda row: (_ for _ in ()).throw(judge.Rejected("trial 1: wrong")))
    assert j.rows[0].reason == "trial 1: wrong"


def test_running_out_of_gpu_memory_while_timing_is_no_verdict():
    """A row that passed parity and runs out of GPU memory in the timing harness gets no verdict: one line that
    says so (the judge's pool and baselines did not fit), not a rejection of the candidate."""
    from kp.errors import OutOfMemory as Raised
    ref = judge.Reference.load(("file", str(CASES_DIR / "relu" / "ref.py")))
    j = judge.Judge(ref, seed=3, device="cpu", sandbox=False, bench=False)

    class OutOfMemory:
        def __init__(self, why="timing: raised OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB "
                               "(the GPU has 5.8 of 79.2 GiB free now)"):
            self.why = why

        def call(self, stage, cmd, *args):
            if cmd == "time":
                raise Raised(self.why, 60 << 30, 6 << 30)
            return {}
    j.refs = None
    j.runners = [OutOfMemory()]
    j.rows = [expected.Row("candidate", j.runners[0])]
    j._each_update = lambda *a: None
    with pytest.raises(harness.UsageError) as ei:
        j._timing()
    msg = str(ei.value)
    assert "ran out of memory while timing, after parity passed" in msg and "no verdict" in msg and "\n" not in msg
    assert j.rows[0].accepted

    # torch's own line is long; the worker's figures it carries after it still reach the author
    held = "[the raising process: 60.1 GiB allocated, 66.1 GiB reserved, peak 60.1 GiB]"
    long = "timing: raised OutOfMemoryError: CUDA out of memory. " + "x" * 300 + " " + held
    j.runners = [OutOfMemory(long)]
    j.rows = [expected.Row("candidate", j.runners[0])]
    with pytest.raises(harness.UsageError) as ei:
        j._timing()
    assert str(ei.value).endswith(f"... {held})") and len(str(ei.value)) < 700




def test_the_cpu_plans_in_the_hosts_free_memory_with_the_judges_copies_counted(monkeypatch):
    """On the CPU the benchmark shape runs where its calls fit three quarters of the memory the host has available
    (KP_CPU_MEMORY overrides): the two references' forwards (fp32 and float64), the candidate's, its inputs' copy and
    its output; a refusal says the figures."""
    monkeypatch.delenv("KP_CPU_MEMORY", raising=False)
    monkeypatch.setattr(plan, "host_available", lambda: 24 << 30)
    assert plan.host_budget() == 18 << 30
    monkeypatch.setenv("KP_CPU_MEMORY", str(1 << 30))
    assert plan.host_budget() == 1 << 30
    g = 1 << 30
    fp = {"inputs": 6 * g, "outputs": 6 * g, "weights": 0, "peak": 12 * g}
    assert plan.cpu_need(fp) == (2 + 2) * 12 * g + 12 * g
    assert plan.cpu_bench_refusal(fp, 60 * g) is None
    why = plan.cpu_bench_refusal(fp, 40 * g)
    assert "needs about 60.0 GiB" in why and "inputs and outputs 12.0 GiB" in why and "40.0 GiB planned" in why


@pytest.mark.parametrize("budget,rows,accepted", [(3 << 27, 512, True), (3 << 28, 1024, False)],
                         ids=["small_host", "larger_host"])
def test_a_candidate_wrong_only_when_large_is_judged_at_the_largest_shape_the_host_allows(cli, tmp_path, monkeypatch,
                                                                                          budget, rows, accepted):
    """On the CPU the judged shape is the largest of the reference's family that the host's budget holds, and the
    record names it in its own field beside the benchmark shape: a candidate wrong only above 2^23 elements passes
    where the host holds 512 rows and is rejected where it holds 1,024."""
    d = harness.ROOT / "tests" / "data" / "wrong_when_large"
    monkeypatch.setenv("KP_CPU_MEMORY", str(budget))
    r = cli("--ref", d / "ref.py", "--candidate", d / "cand.py", "--device", "cpu", "--allow-torch", "--seed", "3",
            "--json", tmp_path / "rec.json")
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert rec["shape"] == "4096x16384" and rec["judged_shape"] == f"{rows}x16384", rec["judged_shape"]
    assert rec["ok"] is accepted and r.returncode == (0 if accepted else 1), r.stdout[-600:]
    last = r.stdout.strip().splitlines()[-1]  # under 200 characters where the box ran (without it, a note more)
    assert f"judged at {rows}x16384" in last and len(re.sub(r"; unboxed: [^;)]*", "", last)) < 200, last
