"""The judge (judge.py, run.py --ref / --candidate / --problem): host-side logic and the CPU verdicts in CI; on the
GPU every known-wrong candidate is rejected for its stated reason, every reference in tests/judge_cases is judged
with its candidates through run.py from outside the repo, and every shipped variant of every problem is accepted."""
import ast
import importlib.util
import json
import inspect
import re
import shutil
import time
from pathlib import Path

import pytest
import torch

import harness
from kp.judge import driver as judge, escape as stage_escape, timed as stage_timing
from kp.judge import expected, guards, memory, outputs, plan, reference, runners, worker
from kp.observe import profile
from conftest import HAS_GPU, gpu, run_script as run
import batched

WRONG = sorted((harness.ROOT / "tests" / "wrong").glob("*.py"))
CASES_DIR = harness.ROOT / "tests" / "judge_cases"


def meta(path: Path) -> dict:
    """PROBLEM / EXPECT / DEVICES / FLAGS / NEEDS (modules it imports beyond the requirements) of a candidate file,
    read without importing it into the test process."""
    out = {"FLAGS": (), "NEEDS": ()}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("PROBLEM", "EXPECT", "DEVICES", "FLAGS", "NEEDS"):
                out[node.targets[0].id] = ast.literal_eval(node.value)
    return out




# Every (reference folder, candidate file) pair of tests/judge_cases: the kinds of problem at the top, and under
# contract/ what real machine-written candidates showed about KernelBench's contract.
PAIRS = [(str(r.parent.relative_to(CASES_DIR)), c.name) for r in sorted(CASES_DIR.glob("**/ref.py"))
         for c in sorted(r.parent.glob("*.py")) if c.name != "ref.py"]


def outside_repo(tmp_path: Path, folder: str) -> Path:
    dst = tmp_path / folder
    shutil.copytree(CASES_DIR / folder, dst)
    return dst


# ---------------------------------------------------------------------------------------------------------------
# Host-side logic (CI).

def test_every_wrong_case_declares_problem_reason_and_devices():
    assert len(WRONG) >= 8
    for p in WRONG:
        m = meta(p)
        assert m.get("PROBLEM") in harness.problems(), p.name
        re.compile(m["EXPECT"])
        assert set(m["DEVICES"]) <= {"cuda", "cpu"} and m["DEVICES"], p.name


def test_judge_cases_cover_the_kinds_and_declare_verdicts():
    folders = {d for d, _ in PAIRS if "/" not in d}
    assert len(folders) >= 7
    for d, c in PAIRS:
        m = meta(CASES_DIR / d / c)
        assert "EXPECT" in m and m["DEVICES"], (d, c)
        assert m["EXPECT"] is None or re.compile(m["EXPECT"])
    # each reference has a correct own-kernel candidate and a correct pure-PyTorch one
    for d in folders:
        kinds = {c for dd, c in PAIRS if dd == d and meta(CASES_DIR / dd / c)["EXPECT"] is None}
        assert "kernel.py" in kinds and "torch_rewrite.py" in kinds, d
    wrong = " ".join(f"{d}/{c}" for d, c in PAIRS if meta(CASES_DIR / d / c)["EXPECT"])
    for needed in ("stale_weights", "identity", "skip_last"):
        assert needed in wrong


def test_trial_seeds_replay():
    assert reference.trial_seeds(7, 3) == reference.trial_seeds(7, 3) == [7, 8, 9]
    assert reference.trial_seeds(2**32 - 1, 2) == [2**32 - 1, 0]
    ref = judge.Reference.load(("problem", "softmax"))
    a = ref.case("odd_cols", 5, "cpu")[1][0]
    b = ref.case("odd_cols", 5, "cpu")[1][0]
    c = ref.case("odd_cols", 6, "cpu")[1][0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_reference_inputs_follow_the_seed_for_any_file():
    ref = judge.Reference.load(("file", str(CASES_DIR / "embedding" / "ref.py")))
    a, b, c = ref.inputs(3, "cpu")[0], ref.inputs(3, "cpu")[0], ref.inputs(4, "cpu")[0]
    assert a.dtype == torch.int64 and torch.equal(a, b) and not torch.equal(a, c)


def test_same_values():
    a = torch.tensor([1.0, float("nan"), 0.0])
    assert harness.same_values(a, a.clone())
    assert not harness.same_values(a, torch.tensor([1.0, float("nan"), -0.0]))  # sign of zero counts
    assert not harness.same_values(a, torch.tensor([1.0, 2.0, 0.0]))
    assert not harness.same_values(a, a.double())
    base = torch.arange(10.0)
    v1, v2 = base[2:5], base.clone()[2:5]
    v2._base[0] = 99  # outside the view: not compared
    assert harness.same_values(v1, v2)
    big = torch.rand(1000)
    other = big.clone()
    other[999] = 5
    assert harness.same_values(big, big.clone(), chunk=7) and not harness.same_values(big, other, chunk=7)


def test_chunked_error_equals_the_whole_one():
    ref = torch.rand(37, 101, dtype=torch.float64)
    out = (ref + 1e-3 * torch.randn_like(ref)).float()
    out[3, 7] = float("nan")
    whole = harness.rel_error(out, ref)
    for chunk in (5, 64, 101, 202, 1 << 20):  # column blocks, row blocks, both
        part = harness.rel_error(out, ref, chunk=chunk)
        assert part.nonfinite_mismatch == whole.nonfinite_mismatch == 1
        assert part.rel_l2 == pytest.approx(whole.rel_l2, rel=1e-12)
        assert part.worst_row == pytest.approx(whole.worst_row, rel=1e-12)
    one_row = harness.rel_error(out[0], ref[0], chunk=7)
    assert one_row.worst_row == one_row.rel_l2


def test_kernel_base_name():
    f = profile.kernel_base_name
    assert f("void kp::softmax_kernel<8, true>(float const*, float*, long)") == "softmax_kernel"
    assert f("void (anonymous namespace)::regcluster_softmax(float const*, float*, long, long)") == \
        "regcluster_softmax"
    assert f("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32") == \
        "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32"
    assert f("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, float const*, int)") \
        == "cunn_SoftMaxForward"


def test_window_violations():
    ev = lambda n, ts, dur, s=7: {"name": n, "ts": ts, "dur": dur, "stream": s, "kind": "kernel"}
    inside = [ev("mark", 0, 10), ev("k", 12, 100), ev("mark", 120, 10)]
    assert guards.window_violations(inside, "mark") == ([], (10, 120))
    late = [ev("mark", 0, 10), ev("side", 12, 200, s=9), ev("mark", 20, 10)]
    bad, w = guards.window_violations(late, "mark")
    assert [b["name"] for b in bad] == ["side"] and w == (10, 20)
    assert guards.window_violations([ev("k", 0, 1)], "mark")[1] is None  # no markers: caller rejects


def test_host_clock_escape_rule():
    honest = [(3.45, 3.40, 0.05)] * 5  # wall = events + sync latency
    hidden = [(3.45, 0.01, 0.05)] * 5  # the events saw nothing: the work ran elsewhere
    slow_host = [(0.30, 0.02, 0.28)] * 5  # enqueue-bound call: wall follows the host, not an escape
    assert guards.host_clock_excess_ms(honest) < guards.escape_threshold_ms(3.40)
    assert guards.host_clock_excess_ms(hidden) > guards.escape_threshold_ms(0.01)
    assert guards.host_clock_excess_ms(slow_host) < guards.escape_threshold_ms(0.02)


class _EscapeReplies:
    """A runner whose escape measurements come from a list (the window clean, no own kernel needed)."""
    isolated = False

    def __init__(self, sample_sets, control=((0.02, 0.003, 0.001),) * 5):
        self.sets, self.calls, self.control = list(sample_sets), 0, list(control)

    def call(self, stage, cmd, *args, **kw):
        samples = self.sets[min(self.calls, len(self.sets) - 1)]
        self.calls += 1
        mark = lambda ts: {"name": "sleep", "ts": ts, "dur": 1.0, "stream": 7, "kind": "kernel"}
        events = [mark(0.0), {"name": "k", "ts": 10.0, "dur": 5.0, "stream": 7, "kind": "kernel"}, mark(100.0)]
        return {"samples": samples, "control": self.control, "events": events, "marker": "sleep", "own": {}}


def _escape_judge():
    j = object.__new__(judge.Judge)
    j.seed, j.allow_torch = 1, True
    return j


def test_escape_host_clock_retried_when_one_try_was_slowed_by_another_process():
    slowed = [(23.5, 15.5, 0.05)] * 5  # 8 ms the events did not see: another judge's kernels on a shared GPU
    honest = [(15.6, 15.5, 0.05)] * 5
    runner = _EscapeReplies([slowed, honest])
    row = judge.Row("candidate", runner)
    info = _escape_judge()._escape(row)
    assert runner.calls == 2 and info["host_excess_ms"] < info["threshold_ms"]


def test_escape_host_clock_rejects_when_every_try_sees_it():
    hidden = [(3.45, 0.01, 0.05)] * 5
    runner = _EscapeReplies([hidden])
    with pytest.raises(judge.Rejected, match="host clock saw .* work escaped"):
        _escape_judge()._escape(judge.Row("candidate", runner))
    assert runner.calls == 1 + stage_escape.ESCAPE_RETRIES


def test_escape_host_clock_discounts_what_it_sees_around_no_call():
    """A loaded host (many judges on one machine) delays every synchronize by ~0.4 ms: the control measured in the
    same steps around no call sees it too, so a 16 us kernel is not taken for escaped work; 3 ms unseen still is."""
    loaded = [(0.45, 0.003, 0.001)] * 5  # 0.45 ms around no call
    honest = [(0.44, 0.016, 0.05)] * 5
    info = _escape_judge()._escape(judge.Row("candidate", _EscapeReplies([honest], control=loaded)))
    assert info["host_excess_ms"] < info["threshold_ms"]
    hidden = [(3.45, 0.016, 0.05)] * 5
    with pytest.raises(judge.Rejected, match="host clock saw .* work escaped"):
        _escape_judge()._escape(judge.Row("candidate", _EscapeReplies([hidden], control=loaded)))


def test_timing_holds_the_gpu_against_other_judges(monkeypatch, tmp_path):
    """Two judges sharing a GPU time one at a time: the second waits (and says so) until the first lets go."""
    import fcntl
    import os
    from kp.lib import timing
    monkeypatch.setattr(timing, "gpu_lock_path", lambda: str(tmp_path / "gpu.lock"))
    said = []
    with timing.gpu_to_itself(said.append):
        fd = os.open(tmp_path / "gpu.lock", os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # let go on leaving; now held by "another judge"
    import threading
    threading.Timer(0.3, os.close, (fd,)).start()
    with timing.gpu_to_itself(said.append):  # waits until the other lets go
        pass
    assert said[0].startswith("waiting for the GPU") and said[1].startswith("GPU free after")


def test_no_judge_times_while_another_is_in_a_gpu_stage(monkeypatch, tmp_path):
    """Judges sharing a GPU: a judge about to time waits until the stages other judges are in (parity, KernelBench's
    check) end; a stage asked for after it waits until its timing ends, so its times see no other judge's kernels;
    every wait is told (a judge moves its deadline by it, a batch slot its limit)."""
    import threading
    import time
    from kp.lib import timing
    monkeypatch.setattr(timing, "gpu_lock_path", lambda: str(tmp_path / "gpu.lock"))
    told, events = [], []
    monkeypatch.setattr(timing, "GPU_WAITS", [told.append])
    in_stage, leave_stage = threading.Event(), threading.Event()

    def judge_in_parity():
        with timing.gpu_shared():
            events.append("A in parity")
            in_stage.set()
            leave_stage.wait(5)
            events.append("A leaves parity")

    def judge_starting_parity():
        with timing.gpu_shared():
            events.append("C in parity")

    a = threading.Thread(target=judge_in_parity)
    a.start()
    in_stage.wait(5)
    with timing.gpu_shared():  # two judges' stages side by side: no wait
        events.append("D in parity beside A")
    c = threading.Thread(target=judge_starting_parity)
    threading.Timer(0.3, c.start).start()  # asks for its stage while B waits to time
    threading.Timer(0.6, leave_stage.set).start()
    with timing.gpu_to_itself():
        events.append("B times")
        time.sleep(0.3)
        events.append("B done")
    a.join(5)
    c.join(5)
    assert events == ["A in parity", "D in parity beside A", "A leaves parity", "B times", "B done", "C in parity"]
    assert len(told) == 2 and told[0] > 0.4 and told[1] > 0.2  # B waited for A's stage, C for B's timing


def test_a_judge_waiting_for_the_gpu_moves_its_deadline():
    ref = judge.Reference.load(("file", str(CASES_DIR / "relu" / "ref.py")))
    j = judge.Judge(ref, seed=3, device="cpu", sandbox=False, bench=False, timeout_s=100)

    class Runner:
        deadline = 50.0
    j.runners = [Runner(), judge.LocalRunner.__new__(judge.LocalRunner)]
    before = j.deadline
    j._waited_for_gpu(7.5)
    assert j.deadline == before + 7.5 and j.runners[0].deadline == 57.5 and j.gpu_wait_s == 7.5
    assert [s.name for s in judge.STAGES if s.shares_gpu] == ["setup and baselines", "parity", "kernelbench check"]


def test_budget_reason_is_one_line():
    e = harness.Err(0.5, 0.9, 0)
    b = harness.budget_from(harness.Err(1e-8, 2e-8, 0))
    r = expected.budget_reason("trial 1 (seed 3)", e, b)
    assert "\n" not in r and "over budget 1.00e-06" in r and "trial 1 (seed 3)" in r
    assert "NaN/Inf positions differ" in expected.budget_reason("x", harness.Err(0, 0, 5), b)


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


def test_state_map_by_name_then_by_order():
    ref = [("linear.weight", (4, 3)), ("linear.bias", (4,))]
    assert reference.state_map(ref, list(reversed(ref))) == {"linear.weight": "linear.weight",
                                                         "linear.bias": "linear.bias"}
    renamed = [("w", (4, 3)), ("b", (4,))]
    assert reference.state_map(ref, renamed) == {"linear.weight": "w", "linear.bias": "b"}
    assert reference.state_map(ref, [("w", (3, 4)), ("b", (4,))]) is None
    assert reference.state_map(ref, renamed[:1]) is None


@pytest.mark.parametrize("kind", reference.UPDATES)
def test_weight_updates_change_both_sides_alike(kind):
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7))
    b = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7))
    b.load_state_dict(a.state_dict())
    before = {k: v.clone() for k, v in a.state_dict().items()}
    versions = {k: p._version for k, p in b.named_parameters()}
    upd = reference.make_update(kind, a, seed=3)
    reference.apply_update(a, upd)
    reference.apply_update(b, upd)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    changed = [k for k, v in a.state_dict().items() if not torch.equal(v, before[k])]
    assert changed and all(k in dict(a.named_parameters()) for k in changed)
    delta = torch.cat([(a.state_dict()[k] - before[k]).flatten() for k in changed])
    rel = float(delta.norm() / torch.cat([before[k].flatten() for k in changed]).norm())
    assert 1e-3 < rel < 0.1  # a real change, not a rounding one
    # the way training changes weights: the version counter moves (what a correct weight cache keys on)
    assert any(p._version != versions[k] for k, p in b.named_parameters())


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


def test_float64_reference_on_the_gpu_whenever_it_fits():
    """The softmax problem (6 GiB in, 6 GiB out, a forward peak of 12 GiB) keeps its float64 reference on an 80 GB
    GPU that is free, and sends it to the host when other processes leave too little; the reason says both sides."""
    fp = {"inputs": 6 << 30, "outputs": 6 << 30, "weights": 0, "flops": 0, "peak": 12 << 30}
    on, why = plan.float64_on_gpu(fp, 1, 79 << 30)
    assert on and "63.6 GiB needed" in why and "27.6 GiB" in why and "79.0 GiB free" in why
    on, why = plan.float64_on_gpu(fp, 1, 50 << 30)
    assert not on and "50.0 GiB free" in why


def test_float64_reference_in_slices_of_the_batch_where_its_peak_does_not_fit():
    """Where the float64 forward's whole peak does not fit beside the plan, it runs on the GPU in the fewest slices
    of the batch that do (its whole float64 output held); none where no slicing fits or there is no batch."""
    fp = {"inputs": 6 << 30, "outputs": 6 << 30, "weights": 0, "flops": 0, "peak": 24 << 30, "rows": 4096}
    assert not plan.float64_on_gpu(fp, 1, 79 << 30)[0]  # 36 GiB planned + 2.3 x 24 GiB of float64 peak
    n = plan.float64_chunks(fp, 1, 79 << 30)  # 36 GiB planned + 12 GiB of float64 output + 55.2 GiB / n
    assert n == 2
    assert plan.float64_chunks(fp, 1, 52 << 30) == 16 and plan.float64_chunks(fp, 1, 48 << 30) == 0
    assert plan.float64_chunks({**fp, "rows": 1}, 1, 79 << 30) == 0 and plan.float64_chunks({**fp, "rows": 0}, 1,
                                                                                            79 << 30) == 0


def _ref_file(tmp_path, name: str, body: str, inputs: str = "torch.randn(64, 33)", init: str = "[]"):
    (tmp_path / f"{name}.py").write_text(
        f"import torch\nimport torch.nn as nn\n\n\n{body}\n\n\ndef get_inputs():\n    return [{inputs}]\n\n\n"
        f"def get_init_inputs():\n    return {init}\n")
    return judge.Reference.load(("file", str(tmp_path / f"{name}.py")))


@pytest.mark.parametrize("name,body,sliced", [
    ("rows", "class Model(nn.Module):\n    def forward(self, x):\n        return torch.softmax(x * 3, dim=1), x.sum(1)",
     None),
    ("mixes", "class Model(nn.Module):\n    def forward(self, x):\n        return x - x.mean(0)",
     "gives other rows on a slice"),
    ("state", "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.bn = nn.BatchNorm1d(33)\n\n    def forward(self, x):\n        return self.bn(x)",
     "holds buffers"),
    ("scalar", "class Model(nn.Module):\n    def forward(self, x):\n        return x.sum()", "not rows of one batch"),
    ("square", "class Model(nn.Module):\n    def forward(self, a, b):\n        return a @ b",
     "raised RuntimeError on a slice"),
])
def test_float64_reference_in_slices_only_where_rows_are_apart(tmp_path, name, body, sliced):
    """A sliced float64 forward gives the whole one's output; a forward that mixes rows, holds state, returns
    something other than rows or takes a matrix that is not a batch is proved unsliceable on its first call and runs
    whole on the host, said."""
    ref = _ref_file(tmp_path, name, body, "torch.randn(64, 64), torch.randn(64, 64)" if name == "square" else
                    "torch.randn(64, 33)")
    x = ref.inputs(3, "cpu")
    whole = expected._Refs(ref, ref.init(), 0, "cpu", "cpu").expected(x, "fp32")
    refs = expected._Refs(ref, ref.init(), 0, "cpu", "cpu", chunks=4)
    got = refs.expected(x, "fp32")
    assert [torch.equal(a, b) for a, b in zip(got.r64, whole.r64)] == [True] * len(whole.r64)
    if sliced is None:
        assert refs.chunk_proof == "in 4 slices of the batch" and refs.chunks == 4 and refs.moved is None
    else:
        assert sliced in refs.chunk_proof and refs.chunks == 1 and "cannot be sliced" in refs.moved


def test_one_precision_path_for_ceilings(monkeypatch):
    """--precision tf32 measures the TF32 GEMM ceiling (the same code for variants and candidates)."""
    seen = []

    def rates(n=8192, precision="fp32"):
        seen.append(precision)
        sizes.append(n)
        return {"TF32": 400e12, "HGEMM": 700e12} if precision == "tf32" else {"SGEMM": 50e12}

    sizes, said = [], []
    monkeypatch.setattr(stage_timing, "copy_bandwidth", lambda n=4 << 30: sizes.append(n) or 3e12)
    monkeypatch.setattr(stage_timing, "gemm_rates", rates)
    monkeypatch.setattr(stage_timing, "free_gpu_bytes", lambda: 70 << 30)
    monkeypatch.setattr(stage_timing, "_CEILINGS", {})  # measured here, not taken from an earlier test's process
    ref = judge.Reference.load(("problem", "matmul_gelu_softmax"))
    j = judge.Judge.__new__(judge.Judge)
    j.ref, j.precision, j.log = ref, "tf32", said.append
    c = j.ceilings({"bytes": 1e9, "flops": 1e14})
    assert seen == ["tf32"] and c["flops_rate"] == 700e12 and c["bound"] == "compute"
    assert sizes == [4 << 30, 8192] and not said
    monkeypatch.setattr(stage_timing, "free_gpu_bytes", lambda: 3 << 30)  # a GPU other processes fill: smaller probes
    sizes.clear()
    j.ceilings({"bytes": 1e9, "flops": 1e14})
    assert sizes == [1 << 30, 4096] and "3.0 GiB of GPU memory free" in said[-1]
    j.precision = "fp32"
    assert j.ceilings({"bytes": 1e9, "flops": 1e14})["flops_rate"] == 50e12 and seen[-1] == "fp32"
    j.ref = judge.Reference.load(("file", str(CASES_DIR / "relu" / "ref.py")))  # no BOUND: from intensity
    assert j.ceilings({"bytes": 1e9, "flops": 0})["bound"] == "memory"
    n = len(seen)  # a process measures a GPU's ceilings once per probe size and precision (a batch's slot)
    monkeypatch.setattr(stage_timing, "free_gpu_bytes", lambda: 3 << 30)
    j.ceilings({"bytes": 1e9, "flops": 1e14})
    j.precision = "tf32"
    monkeypatch.setattr(stage_timing, "free_gpu_bytes", lambda: 70 << 30)
    assert j.ceilings({"bytes": 1e9, "flops": 1e14})["flops_rate"] == 700e12
    assert len(seen) == n


def test_reference_file_without_the_contract_is_a_usage_error(tmp_path, cli):
    f = tmp_path / "not_kb.py"
    f.write_text("import torch\n\ndef get_inputs():\n    return [torch.rand(3)]\n")
    with pytest.raises(harness.UsageError, match="defines no Model, get_init_inputs"):
        judge.Reference.load(("file", str(f)))
    r = cli("--ref", f, "--candidate", CASES_DIR / "relu" / "torch_rewrite.py", "--device", "cpu")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "defines no Model" in r.stderr


@pytest.mark.parametrize("path", [p for p in WRONG if "cpu" in meta(p)["DEVICES"]], ids=lambda p: p.stem)
def test_wrong_case_rejected_on_cpu(path):
    m = meta(path)
    rec = judge.evaluate(m["PROBLEM"], path, seed=1234, device="cpu")
    r = rec["rows"]["candidate"]
    assert not r["accepted"], f"{path.name} was accepted"
    assert re.search(m["EXPECT"], r["reason"]), f"{path.name}: {r['reason']}"
    assert "\n" not in r["reason"]


def test_timed_call_check_rejects_a_stale_output_and_modified_inputs():
    """What a worker hands over after a checked timed call is judged against the reference for the inputs of the
    seed it reports, computed then; inputs that are not that seed's draw are rejected."""
    ref = judge.Reference.load(("file", str(CASES_DIR / "relu" / "ref.py")))
    j = judge.Judge(ref, seed=1, device="cpu")
    j.refs = expected._Refs(ref, [], 1, "cpu", "cpu")
    rows = {k: judge.Row(k, runner=None) for k in ("good", "stale", "mutated")}
    j.rows = list(rows.values())
    s = 4242
    pristine = ref.inputs(s, "cpu")
    stale = torch.relu(ref.inputs(s - 1, "cpu")[0])  # the answer for other inputs
    mutated = [pristine[0].clone()]
    mutated[0][0, 0] += 1
    for label, out, inputs in (("good", torch.relu(pristine[0]), pristine), ("stale", stale, pristine),
                               ("mutated", torch.relu(pristine[0]), mutated)):
        j._interim({"label": label, "rep": 3, "seed": s, "out": out, "type": "Tensor", "inputs": inputs})
    assert rows["good"].accepted and "timed call (rep 3, inputs seed 4242)" in rows["good"].checks
    assert not rows["stale"].accepted and re.match(r"timed call \(rep 3.*over budget", rows["stale"].reason)
    assert not rows["mutated"].accepted and "input 0 was modified" in rows["mutated"].reason


def test_timed_calls_to_check_are_chosen_in_the_judge_after_each_call():
    """Each row has one checked call at a rep drawn in the judge below the least number of reps (the loop always
    runs that far), and at most a few more at random; the worker learns only after a call whether it is checked."""
    ref = judge.Reference.load(("file", str(CASES_DIR / "relu" / "ref.py")))
    j = judge.Judge(ref, seed=1, device="cpu", bench=False)
    j.rows = [judge.Row("cand", runner=None)]
    picks = [j._interim({"label": "cand", "rep": r, "seed": 0, "ask": True}) for r in range(40)]
    assert 0 <= j.check_at["cand"] < j.reps[0] and picks[j.check_at["cand"]]
    assert 1 <= sum(picks) <= stage_timing.MAX_TIMED_CHECKS + 1 and j.timed_checks["cand"] == sum(picks)


def test_timing_samples_reduced_in_the_judge_and_bounded_by_its_wall_clock():
    honest = {"eager": {"samples": [1.0, 1.2, 1.1], "median_ms": 1.1, "host_us": 20.0},
              "candidate": {"samples": [0.5, 0.6, 0.4], "median_ms": 0.01, "host_us": 15.0}}  # its own summary lies
    t = stage_timing.reduce_samples(honest, wall_ms=50.0)
    assert t["candidate"]["median_ms"] == 0.5 and t["eager"]["median_ms"] == 1.1 and t["candidate"]["n"] == 3
    forged = {"eager": {"samples": [30.0] * 3}, "candidate": {"samples": [1.0] * 3}}  # baselines inflated
    with pytest.raises(judge.Rejected, match="add up to 93.0 ms, more than the 50.0 ms"):
        stage_timing.reduce_samples(forged, wall_ms=50.0)


def test_a_median_below_reading_the_inputs_is_impossible():
    bw = 3e12  # bytes/s
    assert stage_timing.below_floor(0.010, 1 << 30, bw).startswith("timing: median 10.0 us is below 0.25 x")
    assert stage_timing.below_floor(0.400, 1 << 30, bw) is None  # 358 us to read 1 GiB: a quarter of it is 89 us
    assert stage_timing.below_floor(0.0001, 1 << 20, bw) is None  # a floor under the events' resolution is not judged


def test_reference_itself_accepted_with_training_state_on_cpu(tmp_path):
    """A candidate that is the reference (Linear + BatchNorm in training mode) passes the benchmark-shape calls and
    the reference file's own declared cases: every model starts from the reference's state as it was before the
    reference's call, so running statistics are compared like for like."""
    (tmp_path / "bn_ref.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self, i, o):\n"
        "        super().__init__()\n"
        "        self.lin, self.bn = nn.Linear(i, o), nn.BatchNorm1d(o)\n\n"
        "    def forward(self, x):\n"
        "        return self.bn(self.lin(x))\n\n\n"
        "def get_inputs():\n    return [torch.rand(64, 48)]\n\n\n"
        "def get_init_inputs():\n    return [48, 40]\n\n\n"
        "CASES = {\"odd\": lambda g, d: ([5, 7], [torch.rand(3, 5, generator=g).to(d)]),\n"
        "         \"batch2\": lambda g, d: ([9, 4], [torch.rand(2, 9, generator=g).to(d)])}\n")
    (tmp_path / "same.py").write_text("from bn_ref import Model\n\n\nclass ModelNew(Model):\n    pass\n")
    ref = judge.Reference.load(("file", str(tmp_path / "bn_ref.py")))
    rec = judge.evaluate(ref, tmp_path / "same.py", seed=2, device="cpu", allow_torch=True)
    r = rec["rows"]["candidate"]
    assert r["accepted"], r["reason"]
    assert sum(k.startswith("case ") for k in r["checks"]) == 2 * 3 and any(k.startswith("trial 3") for k in r["checks"])


def test_inputs_a_file_cannot_draw_on_the_device_come_from_the_host(tmp_path):
    """A get_inputs() that cannot run with the device as the default (its own CPU generator, say) is drawn on the
    host from then on, the same values for the same seed, and the reference says why; the device is not tried
    again."""
    (tmp_path / "host_ref.py").write_text(
        "import torch\nimport torch.nn as nn\n\nTRIES = []\n\n\n"
        "class Model(nn.Module):\n    def forward(self, x):\n        return x + 1\n\n\n"
        "def get_inputs():\n"
        "    TRIES.append(torch.empty(0).device.type)\n"
        "    if TRIES[-1] != 'cpu':\n"
        "        raise RuntimeError(\"Expected a 'cuda' device type for generator but found 'cpu'\")\n"
        "    return [torch.rand(4, 5)]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    ref = judge.Reference.load(("file", str(tmp_path / "host_ref.py")))
    on_host = ref.inputs(7, "cpu")[0]
    assert ref.host_draw is None
    x = ref.inputs(7, "meta")[0]
    assert x.device.type == "meta" and x.shape == on_host.shape
    assert "raised RuntimeError with meta as the default device" in ref.host_draw
    ref.inputs(8, "meta")
    assert ref.module.TRIES == ["cpu", "meta", "cpu", "cpu"]


def test_kernelbench_check_agrees_with_torch_allclose():
    """KernelBench's check beside the verdict takes the difference once for both tolerances; it must say what
    torch.allclose(atol=rtol=tol) says on every pair of special and ordinary values."""
    import itertools
    vals = [0.0, 1.0, -1.0, 1.005, 1.00001, float("inf"), -float("inf"), float("nan"), 1e30, -2.5]
    for g, w in itertools.product(vals, vals):
        said = outputs._allclose([torch.tensor([g])], [torch.tensor([w])], [1e-4, 1e-2])
        want = [torch.allclose(torch.tensor([g]), torch.tensor([w]), atol=t, rtol=t) for t in (1e-4, 1e-2)]
        assert [x == "pass" for x in said] == want, (g, w, said)
    with pytest.raises(RuntimeError):  # mixed dtypes: torch.allclose raises, so KernelBench's check fails
        torch.allclose(torch.ones(2), torch.ones(2, dtype=torch.bfloat16))
    said = outputs._allclose([torch.ones(2)], [torch.ones(2, dtype=torch.bfloat16)], [1e-2])
    assert said[0].startswith("fail (output torch.float32, expected torch.bfloat16")


def test_kernelbench_check_in_slices_says_what_the_whole_says(monkeypatch):
    """_allclose works in slices of ALLCLOSE_CHUNK elements (a failing 6 GiB output took ~30 GiB of temporaries
    whole): with slices of 7 elements, it says what torch.allclose says, and the largest difference of the whole."""
    monkeypatch.setattr(expected, "ALLCLOSE_CHUNK", 7)
    g = torch.Generator().manual_seed(3)
    for trial in range(200):
        w = torch.randn(5, 9, generator=g) * 10.0 ** torch.randint(-3, 20, (5, 9), generator=g)
        x = w + torch.randn(5, 9, generator=g) * 10.0 ** torch.randint(-9, 2, (5, 9), generator=g)
        if trial % 4 == 0:
            x.view(-1)[trial % 45] = float("nan")
        if trial % 9 == 0:
            x = w.clone()
        said = outputs._allclose([x], [w], [1e-4, 1e-2])
        assert [s == "pass" for s in said] == [torch.allclose(x, w, atol=t, rtol=t) for t in (1e-4, 1e-2)]
        worst = float((x - w).abs().double().nan_to_num(float("inf")).max())
        assert all(s == "pass" or s == f"fail (max difference {worst:.2e})" for s in said), (said, worst)


def test_kernelbench_check_out_of_memory_leaves_the_verdict(monkeypatch):
    """KernelBench's check never decides a verdict: the judge's process out of GPU memory there (as a failing 6 GiB
    output's whole-tensor difference once did on an 80 GB card) says the check was not run and why, and the
    candidate keeps the verdict the judge's own stages gave it."""
    from kp.judge import kernelbench

    def short(got, want, tols):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB")
    monkeypatch.setattr(kernelbench, "_allclose", short)
    rec = judge.evaluate(judge.Reference.load(("file", str(CASES_DIR / "relu" / "ref.py"))),
                         CASES_DIR / "relu" / "torch_rewrite.py", seed=1, device="cpu", allow_torch=True)
    row = rec["rows"]["candidate"]
    assert row["accepted"], row["reason"]
    assert all(v.startswith("not run (the judge's process ran out of GPU memory") for v in row["kernelbench"].values())


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


@pytest.mark.parametrize("folder,cand", [p for p in PAIRS if "cpu" in meta(CASES_DIR / p[0] / p[1])["DEVICES"]],
                         ids=lambda x: str(x))
def test_judge_case_on_cpu(tmp_path, cli, folder, cand):
    """run.py --ref FILE --candidate FILE --device cpu, both files outside the repo."""
    d = outside_repo(tmp_path, folder)
    m = meta(d / cand)
    r = cli("--ref", d / "ref.py", "--candidate", d / cand, "--device", "cpu", "--seed", "11", "--json",
            tmp_path / "r.json", *m["FLAGS"])
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr
    if m["EXPECT"] is None:
        assert r.returncode == 0 and last.startswith("accepted (parity only on cpu"), r.stdout + r.stderr
    else:  # the reason as the record keeps it: what the verdict line adds (notes, the box) is not the reason
        assert r.returncode == 1 and last.startswith("rejected: "), r.stdout + r.stderr
        reason = json.loads((tmp_path / "r.json").read_text())["rows"]["candidate"]["reason"]
        assert re.search(m["EXPECT"], reason), reason


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
    assert r.stdout.strip().splitlines()[-1].startswith("rejected: case ")
    assert "seed 77" in r.stderr and "replay with --seed 77" in r.stderr
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert rec["trial_seeds"] == [77, 78, 79] and rec["rows"]["candidate"]["accepted"] is False
    outside = tmp_path / "my_softmax.py"  # a candidate outside the repo
    outside.write_text((harness.ROOT / "tests" / "wrong" / "torch_only.py").read_text())
    r = cli("--problem", "softmax", "--candidate", outside, "--device", "cpu", "--seed", "77", "--json",
            tmp_path / "ok.json")
    assert r.returncode == 0, r.stdout + r.stderr
    v = r.stdout.strip().splitlines()[-1]  # an honest torch candidate on the CPU: says which checks were not run
    assert v.startswith("accepted (parity only on cpu") and "timing" in v and "own kernel" in v
    row = json.loads((tmp_path / "ok.json").read_text())["rows"]["candidate"]
    assert len(row["checks"]) == 3 * len(harness.problem_module("softmax").CASES)
    assert all(c["rel_l2"] <= c["budget"] for c in row["checks"].values())


# ---------------------------------------------------------------------------------------------------------------
# GPU: the verdicts that need the NaN-filled allocator, timing and the profiler.

def shipped_candidate(tmp_path: Path, problem: str, variant: str, opts: dict) -> Path:
    """A KernelBench-format file outside the repo that wraps a shipped variant (imports the playground)."""
    f = tmp_path / f"cand_{problem}_{variant}.py"
    f.write_text(f"from models.{problem} import ModelNew as _Shipped\n\n\n"
                 f"class ModelNew(_Shipped):\n"
                 f"    def __init__(self, *args):\n"
                 f"        super().__init__(*args, variant={variant!r}, **{opts!r})\n")
    return f


# The GPU judge cases and GPU known-wrong cases of this pytest process (its shard), judged in one batch: three warm
# slots on the visible GPU (tests/batched.py; a slot's job runs as the single command it stands for would, and a
# job left without a verdict for GPU memory the other slots held is judged again with the GPU to itself).
GPU_BATCHED = batched.GPU_BATCHED
SLOTS_PER_GPU = 3


def _gpu_case_argv(test: str, p: dict, base: Path) -> list | None:
    """The single command a batched GPU test (its function's name, its parameters) stands for; None for a judge case
    whose modules are missing (the test skips). Judge cases are copied outside the repo first, once per folder."""
    if test == "test_wrong_case_rejected_on_gpu":
        return ["--problem", meta(p["path"])["PROBLEM"], "--candidate", p["path"], "--no-bench"]
    d = base / p["folder"] if (base / p["folder"]).exists() else outside_repo(base, p["folder"])
    m = meta(d / p["cand"])
    if any(importlib.util.find_spec(n) is None for n in m["NEEDS"]):
        return None
    return ["--ref", d / "ref.py", "--candidate", d / p["cand"], "--no-compile", *m["FLAGS"]]


@pytest.fixture(scope="session")
def gpu_batch(request, tmp_path_factory):
    from kp.batch.backends import gpu_list
    base = tmp_path_factory.mktemp("gpu_cases")
    argvs = {it.nodeid: argv for it in request.session.items if getattr(it, "originalname", "") in GPU_BATCHED
             for argv in [_gpu_case_argv(it.originalname, it.callspec.params, base)] if argv is not None}
    return batched.judge_batch(argvs, gpu_list(",".join(["0"] * SLOTS_PER_GPU)), base / "batch")


@gpu
@pytest.mark.parametrize("path", [p for p in WRONG if "cuda" in meta(p)["DEVICES"]], ids=lambda p: p.stem)
def test_wrong_case_rejected_on_gpu(path, gpu_batch, request):
    """`run.py --problem P --candidate FILE --no-bench`, judged in the shard's batch (gpu_batch)."""
    m = meta(path)
    line = gpu_batch.get(request.node.nodeid)
    assert line is not None and batched.exit_code(line) == 1, f"{path.name}: {batched.said(line)}"
    r = line["record"]["rows"]["candidate"]
    assert not r["accepted"], f"{path.name} was accepted"
    assert re.search(m["EXPECT"], r["reason"]), f"{path.name}: {r['reason']}"


@gpu
@pytest.mark.parametrize("folder,cand", [p for p in PAIRS if "cuda" in meta(CASES_DIR / p[0] / p[1])["DEVICES"]],
                         ids=lambda x: str(x))
def test_judge_case_on_gpu(folder, cand, gpu_batch, request):
    """`run.py --ref FILE --candidate FILE --no-compile` on the GPU, both files outside the repo, the full stages,
    judged in the shard's batch (gpu_batch)."""
    m = meta(CASES_DIR / folder / cand)
    missing = [n for n in m["NEEDS"] if importlib.util.find_spec(n) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    line = gpu_batch.get(request.node.nodeid)
    if m["EXPECT"] is None:
        assert line is not None and batched.exit_code(line) == 0 and line["verdict"].startswith("accepted"), \
            batched.said(line)
        rec = line["record"]
        row = rec["rows"]["candidate"]
        assert row["own_kernels"] or ("--allow-torch" in m["FLAGS"] and row["pure_torch"]), row
        timed = [k for k in row["checks"] if k.startswith("timed call")]
        assert len(timed) >= 1, row["checks"].keys()
        if "--no-bench" not in m["FLAGS"]:  # a case judged as a search loop judges: no table, no baselines
            assert rec["peak_gpu_bytes"] > 0 and "candidate" in rec["timing"]
    else:
        assert line is not None and batched.exit_code(line) == 1 and line["verdict"].startswith("rejected: "), \
            batched.said(line)
        reason = line["record"]["rows"]["candidate"]["reason"]
        assert re.search(m["EXPECT"], reason), reason


def test_every_batched_gpu_case_is_a_command_run_py_takes(tmp_path):
    """Every GPU judge case and GPU known-wrong case, as its test hands it to the batch: run.py's parser takes the
    command, and the job it makes has the case's options (no CPU, the case's flags)."""
    cases = [("test_wrong_case_rejected_on_gpu", {"path": p}) for p in WRONG if "cuda" in meta(p)["DEVICES"]] + \
            [("test_judge_case_on_gpu", {"folder": f, "cand": c}) for f, c in PAIRS
             if "cuda" in meta(CASES_DIR / f / c)["DEVICES"]]
    assert len(cases) >= 90
    for test, params in cases:
        argv = _gpu_case_argv(test, params, tmp_path)
        if argv is None:
            continue
        job = batched.job_of(argv)
        opts = dict(job.opts)
        assert opts["device"] is None and Path(job.candidate).is_file() and job.key(), (test, params)
        assert opts["allow_torch"] == ("--allow-torch" in argv), (test, params)
        assert opts["bench"] == (test == "test_judge_case_on_gpu" and "--no-bench" not in argv)
        assert not (test == "test_judge_case_on_gpu" and opts["bench"] and opts["compile_baseline"])


def test_batched_cases_keep_each_commands_verdict(tmp_path, cli):
    """tests/batched.py, as the GPU tests use it, on two CPU slots: each case's result is found by its name, with the
    verdict, the record and the exit code that the same command gives run alone (here, in this process)."""
    d = outside_repo(tmp_path, "relu")
    cases = {"right": ["--ref", d / "ref.py", "--candidate", d / "torch_rewrite.py", "--allow-torch"],
             "wrong": ["--ref", d / "ref.py", "--candidate", d / "wrong_identity.py", "--allow-torch"]}
    cases = {k: [*v, "--device", "cpu", "--seed", "11"] for k, v in cases.items()}
    got = batched.judge_batch(cases, [None, None], tmp_path / "batch")
    assert set(got) == set(cases) and all(got.values()), got
    for name, argv in cases.items():
        alone = cli(*argv, "--json", tmp_path / f"{name}.json")
        line = got[name]
        assert batched.exit_code(line) == alone.returncode == (0 if name == "right" else 1), batched.said(line)
        took = re.compile(r" in [0-9.]+ s$")  # the verdict line ends with the job's wall time
        assert took.sub("", line["verdict"]) == took.sub("", alone.stdout.strip().splitlines()[-1])
        rec = json.loads((tmp_path / f"{name}.json").read_text())
        assert line["record"]["rows"]["candidate"]["reason"] == rec["rows"]["candidate"]["reason"]
        assert line["record"]["seed"] == rec["seed"] == 11
    assert re.search(meta(d / "wrong_identity.py")["EXPECT"], got["wrong"]["record"]["rows"]["candidate"]["reason"])


def _problem_rows():
    return [(p, prec) for p in harness.problems()
            for prec in getattr(harness.problem_module(p), "PRECISIONS", ("fp32",))]


@gpu
@pytest.mark.parametrize("problem,precision", _problem_rows(), ids=lambda x: str(x))
def test_every_shipped_variant_accepted(problem, precision):
    """Every variant this GPU runs (records included), the dispatching default and every ROW_OPTIONS row through the judge's stages (the weight
    changes included), as run.py --problem runs them. Peer rows (somebody else's GEMM) are measured, not gated."""
    ref = judge.Reference.load(("problem", problem))
    rows = judge.default_variants(problem, include_records=True, precision=precision)
    rec = judge.evaluate(ref, None, rows, bench=False, precision=precision)
    bad = {k: r["reason"] for k, r in rec["rows"].items() if not r["accepted"] and not r["peer"]}
    assert not bad, bad
    for k, r in rec["rows"].items():
        if r["accepted"] and not r["peer"]:
            assert r["own_kernels"], (k, r["kernels"])
            assert any(c.startswith("trial 3") for c in r["checks"]), k


@gpu
def test_ref_alone_times_eager_and_compile(tmp_path):
    d = outside_repo(tmp_path, "relu")
    r = run("--ref", d / "ref.py", "--json", tmp_path / "r.json")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    rec = json.loads((tmp_path / "r.json").read_text())
    assert set(rec["timing"]) == {"eager", "torch.compile"} and rec["bound"] == "memory"
    assert "eager" in r.stdout and "peak GPU memory" in r.stdout
    assert "no parity to check (the reference alone" in r.stderr and "0/0 rows" not in r.stderr, r.stderr[-2000:]


@gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_ref_alone_untimed_checks_the_reference_on_gpu(tmp_path, precision):
    """`--ref` alone with nothing timed (what a corpus run of references does): the reference's own Model against
    float64, every parity stage, and no own kernel asked of it (it is PyTorch by definition)."""
    d = outside_repo(tmp_path, "relu")
    r = run("--ref", d / "ref.py", "--no-bench", "--no-compile", "--precision", precision, "--json", tmp_path / "r.json")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    row = json.loads((tmp_path / "r.json").read_text())["rows"]["eager"]
    assert row["accepted"] and not row["pure_torch"] and len(row["checks"]) >= 3, row


@gpu
def test_cli_candidate_outside_repo_accepted(tmp_path):
    f = shipped_candidate(tmp_path, "softmax", "auto", {})
    r = run("--problem", "softmax", "--candidate", f, "--no-compile", "--json", tmp_path / "r.json")
    assert r.returncode == 0, r.stdout + r.stderr
    last = r.stdout.strip().splitlines()[-1]  # on a host without bubblewrap the verdict also says it ran unboxed;
    #                                           KernelBench's own check on the same candidate is always said
    assert re.fullmatch(r"accepted \((ran unsandboxed: [^;]*; )?KernelBench's own check \(torch.allclose, atol = "
                        r"rtol\): \w+ at 1e-4, \w+ at 1e-2\) in \d+\.\d s", last), last
    assert "peak GPU memory" in r.stdout and "own kernels" in r.stdout


@gpu
def test_tf32_candidate_uses_tf32_ceiling_and_budget(tmp_path):
    f = shipped_candidate(tmp_path, "matmul_gelu_softmax", "2_split_wgmma", {"precision": "tf32"})
    rec = judge.evaluate("matmul_gelu_softmax", f, precision="tf32", compile_baseline=False, min_reps=3,
                         max_reps=5, budget_s=5)
    r = rec["rows"]["candidate"]
    assert r["accepted"], r["reason"]
    assert "TF32" in rec["rates"] and rec["flops_rate"] == max(rec["rates"].values())
    trial = next(c for k, c in r["checks"].items() if k.startswith("trial 1"))
    assert trial["torch_rel_l2"] > 1e-5  # PyTorch's own error with TF32 on: the budget is the TF32 one
    assert trial["budget"] == pytest.approx(4 * trial["torch_rel_l2"])


@gpu
def test_nan_fill_makes_unwritten_memory_nan():
    a = torch.randn(1 << 22, device="cuda")
    del a
    worker.nan_fill_cached_free(0)
    b = torch.empty(1 << 22, device="cuda")
    assert bool(torch.isnan(b).all())


def test_flusher_refuses_a_host_buffer():
    with pytest.raises(ValueError, match="GPU"):
        harness.L2Flusher(device="cpu")


@gpu
def test_harness_timer_agrees_with_plain_event_loop():
    """bench_interleaved (sleep-held stream) vs the plainest honest timer: flush, events around the call, sync."""
    x = torch.rand(4096, 393216, device="cuda")
    f = lambda: torch.softmax(x, dim=1)
    flush = harness.L2Flusher()
    h = harness.bench_interleaved({"eager": f}, min_reps=20, max_reps=30)["eager"].median_ms
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    plain = []
    for _ in range(30):
        flush()
        s.record()
        f()
        e.record()
        e.synchronize()
        plain.append(s.elapsed_time(e))
    p = sorted(plain)[len(plain) // 2]
    print(f"eager softmax: harness {h:.3f} ms, plain event loop {p:.3f} ms ({100 * (h / p - 1):+.2f}%)")
    assert abs(h / p - 1) < 0.03


@gpu
def test_inputs_refilled_in_place_are_complete_before_the_worker_reads_them():
    """The judge refills one input buffer per layout and the worker keeps it mapped, so torch's IPC cache hands the
    worker the same storage again without waiting on the judge's event: the runner must finish the judge's writes
    before it sends. Each refill here is queued behind a ~25 ms sleep kernel on the judge's stream."""
    from kp.judge.reference import Reference
    ref = Reference.load(("file", str(CASES_DIR / "relu" / "ref.py")))
    runner = runners.ProcessRunner(ref.spec, "cuda", "fp32", lambda msg: None)
    try:
        runner.call("import", "load", str(CASES_DIR / "relu" / "torch_rewrite.py"))
        runner.call("construct", "build", "candidate", [], 0)
        buf = torch.zeros(1024, 1024, device="cuda")
        for value in (1.0, 2.0, 3.0):
            torch.cuda._sleep(50_000_000)
            buf.fill_(value)
            out = runner.call("call", "forward", "candidate", [buf], 0)["out"]
            assert bool((out == value).all()), f"the worker read a buffer the judge had not finished writing ({value})"
    finally:
        runner.close()


def _timed_on_cpu(cand: Path):
    """Parity then the timing stage for one candidate in a worker process of its own, on the CPU (the host clock
    stands in for CUDA events): the same protocol of fresh seeds and after-the-fact checks as on the GPU."""
    ref = judge.Reference.load(("file", str(CASES_DIR / "relu" / "ref.py")))
    j = judge.Judge(ref, seed=3, device="cpu", sandbox=False, bench=False)
    row = j.add_candidate(cand)
    try:
        assert row.runner.call("import", "load", str(cand))["has_model_new"]
        j._parity_bench(ref.init())
        j._drop_input_buffers()
        assert row.accepted, row.reason
        res = j._timing()
    finally:
        row.runner.close()
    return row, res


def _frame_walker(path: Path, local: str, action: str, result: str) -> None:
    """A candidate whose forward walks up its callers' frames to the first that holds `local`, runs `action` on it
    (`f` is that frame, None where there is none) and returns `result`."""
    path.write_text("import sys\nimport torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                    "    def forward(self, x):\n        f = sys._getframe(1)\n"
                    f"        while f is not None and {local!r} not in f.f_locals:\n            f = f.f_back\n"
                    f"        if f is not None:\n            {action}\n"
                    f"        return {result}\n")


def test_timing_protocol_checks_a_secret_timed_call_on_cpu(tmp_path):
    row, res = _timed_on_cpu(CASES_DIR / "relu" / "torch_rewrite.py")
    assert row.accepted, row.reason
    timed = [k for k in row.checks if k.startswith("timed call")]
    assert 1 <= len(timed) <= stage_timing.MAX_TIMED_CHECKS + 1
    seeds = {int(re.search(r"seed (\d+)", k)[1]) for k in timed}
    assert len(seeds) == len(timed)  # every call drew its own seed
    assert res["timing"]["candidate"]["n"] == len(res["timing"]["candidate"]["samples"]) >= 3
    # a model right in the parity calls and wrong once it is timed: caught at whichever call the judge picked
    (tmp_path / "wrong_when_timed.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    calls = 0\n\n"
        "    def forward(self, x):\n        ModelNew.calls += 1\n"
        "        return x.clamp_min(0) if ModelNew.calls <= 6 else torch.zeros_like(x)\n")
    row, _ = _timed_on_cpu(tmp_path / "wrong_when_timed.py")
    assert not row.accepted and re.match(r"timed call \(rep \d+, inputs seed \d+\): relL2 1\.00e\+00", row.reason)
    # one that walks up to the worker's timing loop and drops its timed output before the hand-over, so that no
    # timed call is ever offered for a check: the judge holds the samples it was told of, call by call
    _frame_walker(tmp_path / "hides_timed_calls.py", "st", "f.f_locals['st']['timed'] = None",
                  "torch.zeros_like(x) if f is not None else x.clamp_min(0)")
    row, _ = _timed_on_cpu(tmp_path / "hides_timed_calls.py")
    assert not row.accepted and re.match(r"timing: the 3 samples of candidate returned at the end differ from the 0 "
                                         r"told to the judge after each call", row.reason), row.reason


def test_a_forward_whose_intermediates_outgrow_the_host_is_not_run_on_cpu(tmp_path):
    """Attention over 4,096 positions holds its 4096 x 4096 scores: 64 MiB of scores for 2 MiB of inputs. Where
    three times that peak does not fit the host, the benchmark shape is skipped out loud, not run into the kernel's
    out-of-memory killer."""
    (tmp_path / "attn.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, q):\n        return torch.softmax(q @ q.transpose(-1, -2), -1) @ q\n\n\n"
        "def get_inputs():\n    return [torch.randn(4096, 128)]\n\n\ndef get_init_inputs():\n    return []\n")
    fp = judge.Reference.load(("file", str(tmp_path / "attn.py"))).footprint("cpu")
    assert fp["peak"] >= 2 * (4096 * 4096 * 4) and fp["inputs"] == 4096 * 128 * 4
    assert plan.cpu_bench_refusal(fp, available=64 << 30) is None
    why = plan.cpu_bench_refusal(fp, available=100 << 20)
    assert why.startswith("the benchmark shape was not run on the CPU: its forward holds 0.1 GiB at its peak")


def test_samples_rewritten_from_the_candidate_frame_are_caught(tmp_path):
    """A candidate that walks up from its forward into the timer's frame and halves the samples already taken of
    itself: right outputs, a flattering median, a smaller sum that the wall-clock bound does not see. Each sample
    reached the judge right after its call, before the candidate ran again."""
    _frame_walker(tmp_path / "halves_its_samples.py", "samples",
                  "f.f_locals['samples'].get('candidate', [])[:] = [v / 2 for v in "
                  "f.f_locals['samples'].get('candidate', [])]", "x.clamp_min(0)")
    row, _ = _timed_on_cpu(tmp_path / "halves_its_samples.py")
    assert not row.accepted and re.match(r"timing: the \d+ samples of candidate returned at the end differ from the "
                                         r"\d+ told to the judge after each call: changed in the worker's process",
                                         row.reason), row.reason


def test_a_zero_pattern_survives_stray_zeros_of_single_draws():
    """The pattern is what every draw has: a triangular input whose draws each hold an exact zero of their own in
    the upper half (large torch.randn draws do) keeps its premise, so the shifted input is skipped."""
    from kp.judge.premises import Premises
    p = Premises()
    for stray in (5, 9, 14):
        a = torch.triu(torch.randn(8, 8)) + torch.triu(torch.ones(8, 8))  # no accidental zeros above the diagonal
        a.view(-1)[stray] = 0.0  # positions 5, 9, 14 lie on or above the diagonal
        p.see([a])
    assert p.broken("shifted -3") == "breaks the upper-triangular zero pattern every draw of input 0 has"
    assert p.broken("negated") is None
    q = Premises()
    for _ in range(3):
        q.see([torch.randn(8, 8) + 10])
    assert q.broken("shifted -3") is None


def test_timing_stops_once_the_median_is_known_to_one_percent():
    """A tight distribution is known at ten samples; one whose IQR is 5% of the median needs about 60."""
    from kp.lib.timing import median_known, summarize
    tight = summarize([1.0 + 0.001 * (i % 5) for i in range(10)])
    assert median_known(tight, 0.01)
    noisy = [1.0 + 0.1 * ((i * 7) % 11) / 10 for i in range(10)]
    assert not median_known(summarize(noisy), 0.01)
    assert median_known(summarize(noisy * 40), 0.01)


def test_float64_reference_falls_back_to_the_host_when_the_gpu_runs_out(monkeypatch):
    """A float64 forward that runs out of GPU memory is repeated on the host and the record's note says so; a
    reference already on the host passes the error on (the judge's own one-line out-of-memory verdict)."""
    ref = judge.Reference.load(("file", str(CASES_DIR / "layernorm" / "ref.py")))
    refs = expected._Refs(ref, ref.init(), 0, "cpu", "cpu")
    x = ref.inputs(1, "cpu")
    want = refs.expected(x, "fp32").r64[0]
    refs.f64_device = "gpu that ran out"  # as if the plan had put it on the GPU
    real, tries = expected._Refs._float64_try, []

    def short_of_memory(self, pristine, device):
        tries.append(device)
        if device != "cpu":
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(self, pristine, device)
    as64 = expected.as_float64
    monkeypatch.setattr(expected, "as_float64", lambda xs, device: as64(xs, "cpu"))  # no such device to copy to
    monkeypatch.setattr(expected._Refs, "_float64_try", short_of_memory)
    got = refs.expected(x, "fp32").r64[0]
    assert tries == ["gpu that ran out", "cpu"] and refs.f64_device == "cpu" and "ran out of memory" in refs.moved
    assert not refs.to_host()  # already there
    monkeypatch.setattr(expected._Refs, "_float64_try", lambda self, xs, device: (_ for _ in ()).throw(
        torch.OutOfMemoryError("host")))
    with pytest.raises(torch.OutOfMemoryError):
        refs.expected(x, "fp32")
    assert torch.equal(got, want)


def test_a_median_under_half_the_profiled_busy_time_is_not_the_calls_time():
    """The escape stage's profile of one call (activities inside the marker window: gaps between launches left out,
    overlapping streams counted once) bounds what the timed events may report for the same call."""
    ev = lambda name, ts, dur: {"name": name, "ts": ts, "dur": dur}
    events = [ev("mark", 0, 10), ev("a", 20, 100), ev("b", 50, 100), ev("c", 400, 50), ev("mark", 1000, 10)]
    window = guards.window_violations(events, "mark")[1]
    assert guards.busy_ms(events, "mark", window) == pytest.approx((150 - 20 + 50) / 1e3)  # 180 us, the gap not
    assert guards.busy_ms(events, "mark", None) == 0.0
    assert stage_timing.below_busy(0.170, 0.180) is None  # within noise of the profiled time
    why = stage_timing.below_busy(0.060, 0.180)  # a start event re-recorded two thirds of the way in
    assert why.startswith("timing: median 60.0 us is under 0.5 x the 180.0 us") and "did not bound" in why
    assert stage_timing.below_busy(0.001, 0.004) is None  # within the events' own resolution
    assert stage_timing.below_busy(0.05, None) is None  # no escape profile (a CPU run)


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
        monkeypatch.setattr(judge, "gpu_snapshot", lambda: (now_free, 1 * g))
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


def test_a_stateful_reference_is_followed_through_every_timed_call():
    """KernelBench's vanilla RNN keeps its hidden state in a plain attribute: the judge finds that on the first call,
    says so, and judges a checked timed call against the reference advanced through every call the row made before
    it (warm-ups and untimed calls included). Run on the CPU through the timing stage itself: the rewrite is
    accepted with a timed call checked (judged against a reference that saw only parity's calls it was rejected
    there, relL2 0.4); one that never keeps its new state is rejected at its second call, for that reason."""
    folder = CASES_DIR / "contract" / "stateful_rnn"
    ref = judge.Reference.load(("file", str(folder / "ref.py")))
    for name in ("two_matmuls.py", "wrong_stale_state.py"):
        j = judge.Judge(ref, seed=5, device="cpu", sandbox=False, min_reps=4, max_reps=6, budget_s=5.0)
        row = j.add_candidate(folder / name)
        rec, init = j._record_head(False), ref.init()
        try:
            for stage in ("stage_setup", "stage_import", "stage_parity"):
                getattr(j, stage)(rec, init)
            assert j.refs.state_attrs == ["hidden"]
            assert any("carries state from call to call (hidden)" in n for n in j.notes)
            if name.startswith("wrong"):
                assert not row.accepted and "trial 2" in row.reason and "does not follow it" in row.reason
                continue
            assert row.accepted, row.reason
            j.t_gpu_stages = time.perf_counter()  # what the escape stage, GPU-only, starts
            j.stage_timing(rec, init)
        finally:
            for runner in j.runners:
                runner.close()
        assert row.accepted, row.reason
        assert [k for k in row.checks if k.startswith("timed call")], row.checks


def test_no_row_is_accepted_on_fewer_than_the_minimum_checked_calls():
    """Whatever the device and however a stage went, the driver gives no verdict (exit 2) to a row that would be
    accepted after fewer than MIN_CHECKED checked calls, and says why; rejections and enough checks pass through."""
    from kp.errors import NoVerdict
    ref = judge.Reference.load(("file", str(CASES_DIR / "relu" / "ref.py")))
    for device in ("cpu", "cuda"):
        j = judge.Judge.__new__(judge.Judge)
        j.ref, j.device = ref, device
        checks = {f"trial {i}": {} for i in range(judge.MIN_CHECKED - 1)}
        j.rows = [expected.Row("candidate", None, checks=dict(checks))]
        with pytest.raises(NoVerdict, match=r"no verdict: candidate passed 2 checked calls, fewer than the 3 .*"
                                            r"declared cases only"):
            j._enough_checks({"notes": "the benchmark shape (12,288 MiB) was not run on the CPU; declared cases only"})
        j.rows[0].checks["trial 9"] = {}
        j._enough_checks({})  # enough
        j.rows = [expected.Row("candidate", None, accepted=False, reason="trial 1: relL2 ...")]
        j._enough_checks({})  # a rejection needs no count


def test_a_shape_too_large_for_the_cpu_is_judged_at_a_smaller_one_of_its_family():
    """On the CPU a reference whose benchmark shape does not fit is judged at a smaller shape of its own family: the
    batch halved until it fits, the model's sizes and every matrix input's rows kept; where nothing may shrink
    (a size the model reads, or only the rows), nothing changes and the caller gives no verdict."""
    scaled = CASES_DIR / "contract" / "scaled"
    fits = lambda fp: plan.cpu_bench_refusal(fp, 64 << 30) is None
    gelu = judge.Reference.load(("file", str(scaled / "gelu" / "ref.py")))
    assert gelu.scale_to_fit(fits) == {"batch_size": (4096, 64)}
    assert gelu.module.dim == 393216
    ce = judge.Reference.load(("file", str(scaled / "cross_entropy" / "ref.py")))
    assert ce.scale_to_fit(fits) == {"batch_size": (32768, 8192)}  # targets (N,) follow the logits' batch
    ln = judge.Reference.load(("file", str(scaled / "layernorm" / "ref.py")))
    assert ln.scale_to_fit(fits) == {"batch_size": (16, 8)}  # features, dim1, dim2 are the model's
    assert ln.init() == [(64, 256, 256)]
    tiny = lambda fp: fp["inputs"] < 1024  # nothing but a change of the model or the rows would fit this
    assert ln.scale_to_fit(tiny) == {} and ln.module.batch_size == 8


def test_an_error_that_announces_a_list_keeps_the_list():
    """load_state_dict's error opens with "Error(s) in loading state_dict for ModelNew:" and lists the keys on the
    lines after it: the one-line reason carries them, so the author sees which keys."""
    from kp.errors import first_line
    m = torch.nn.Linear(4, 3)
    with pytest.raises(RuntimeError) as ei:
        m.load_state_dict({"weight": torch.zeros(3, 5), "bias": torch.zeros(3), "extra": torch.zeros(1)})
    line = first_line(ei.value)
    assert "\n" not in line and line.startswith("Error(s) in loading state_dict for Linear: ")
    assert "extra" in line and "size mismatch for weight" in line
    assert first_line(RuntimeError("one line\nand a second")) == "one line"


def test_a_value_a_reference_builds_once_is_not_state(tmp_path):
    """A reference that keeps a value it builds on its first call (a lazily made cache) has no state between calls:
    only what its second call still changes counts; an RNN's hidden state changes at every call."""
    lazy = ("class Model(nn.Module):\n    def forward(self, x):\n        if not hasattr(self, 'scale'):\n"
            "            self.scale = torch.full((x.shape[-1],), 2.0)\n        return x * self.scale\n")
    cell = ("class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.h = torch.zeros(3)\n\n    def forward(self, x):\n        self.h = torch.tanh(x + self.h)\n"
            "        return self.h\n")
    for name, body, want in (("lazy", lazy, []), ("cell", cell, ["h"])):
        f = tmp_path / f"{name}.py"
        f.write_text("import torch\nimport torch.nn as nn\n\n\n" + body +
                     "\n\ndef get_inputs():\n    return [torch.randn(4, 3)]\n\n\ndef get_init_inputs():\n    return []\n")
        ref = judge.Reference.load(("file", str(f)))
        refs = expected._Refs(ref, [], 1, "cpu", "cpu")
        for s in range(3):
            refs.expected(ref.inputs(s, "cpu"), "fp32")
        assert refs.state_attrs == want, name
