"""The judge's memory plan: the reference's footprint and flops, the GPU's check before a job (one line), whose
memory it was when a call or the judge ran out of GPU memory (no verdict, or the row's own doing), and on the CPU
the host's budget with the judge's own copies counted and the largest shape of the family that fits it."""

import json

import pytest

import harness
from kp.judge import driver as judge
from kp.judge import expected, memory, plan, timed
from cases import CASES_DIR


def test_footprint_and_flops_from_the_reference():
    fp = judge.Reference.load(("problem", "softmax")).footprint("cpu")
    assert fp == {
        "shapes": "4096x393216",
        "inputs": 4096 * 393216 * 4,
        "outputs": 4096 * 393216 * 4,
        "weights": 0,
        "flops": 0,
        "peak": 2 * 4096 * 393216 * 4,  # the input and its softmax alive at once
        "rows": 4096,  # the batch (dim 0) the float64 reference may be sliced over
        "float_bytes": 4,
    }  # the floating inputs' element size (the float64 copy is twice as large)
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


def test_the_float64_backward_is_planned_with_its_gradients():
    """--backward: the float64 reference's peak is its backward's, the forward's saved tensors and the float64
    upstream, input and weight gradients beside them; the softmax at its benchmark shape (42.1 GiB measured alone)
    then runs its float64 reference on the host where its forward's peak alone (27.6 GiB) would fit the GPU."""
    fp = judge.Reference.load(("problem", "softmax")).footprint("cpu")
    forward, backward = plan.float64_peak(fp), plan.float64_peak(fp, backward=True)
    assert forward / 2**30 == pytest.approx(27.6) and backward / 2**30 == pytest.approx(51.6)
    free = 70 << 30  # the plan's 36 GiB and the forward's peak fit; the backward's does not
    assert plan.float64_on_gpu(fp, 1, free)[0]
    on_gpu, why = plan.float64_on_gpu(fp, 1, free, backward=True)
    assert not on_gpu and "87.6 GiB needed with the float64 backward's peak of 51.6 GiB, 70.0 GiB free" == why
    assert plan.float64_on_gpu(fp, 1, 139 << 30, backward=True)[0]  # the GPU to itself: room for both


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


def test_a_forward_whose_intermediates_outgrow_the_host_is_not_run_on_cpu(tmp_path):
    """Attention over 4,096 positions holds its 4096 x 4096 scores: 64 MiB of scores for 2 MiB of inputs. Where
    the calls' peak (the references', the candidate's) does not fit the host, the benchmark shape is skipped out
    loud, not run into the kernel's out-of-memory killer."""
    (tmp_path / "attn.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, q):\n        return torch.softmax(q @ q.transpose(-1, -2), -1) @ q\n\n\n"
        "def get_inputs():\n    return [torch.randn(4096, 128)]\n\n\ndef get_init_inputs():\n    return []\n"
    )
    fp = judge.Reference.load(("file", str(tmp_path / "attn.py"))).footprint("cpu")
    assert fp["peak"] >= 2 * (4096 * 4096 * 4) and fp["inputs"] == 4096 * 128 * 4
    assert plan.cpu_bench_refusal(fp, 64 << 30) is None
    why = plan.cpu_bench_refusal(fp, 100 << 20)
    assert (
        why.startswith("the benchmark shape needs about 0.")
        and "a forward's peak 0.1 GiB" in why
        and "0.1 GiB planned here" in why
    ), why


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

    def judged(now_free, held, others_held=0, asked=int(12.06 * g), others_at_plan=g // 2, own=1 * g):
        j = judge.Judge(ref, seed=3, device="cpu", sandbox=False, bench=False)
        j._fp = {"inputs": 6 * g, "outputs": 6 * g, "weights": 0}
        j.gpu_at_plan = (70 * g, 1 * g)  # free, the judge's own, when the plan was made
        j.others_at_plan = others_at_plan  # other processes' (and CUDA contexts') then
        monkeypatch.setattr(memory, "gpu_snapshot", lambda: (now_free, own))
        j.runners = [Worker(held, asked, fails=True), Worker(others_held)]
        j.rows = [expected.Row("candidate", j.runners[0]), expected.Row("other", j.runners[1])]
        j._each(lambda row: row.runner.call("trial 2", "forward"))
        return j.rows[0]

    # the GPU lost 67 GiB, the row's process holds 12.7: another process took the rest, no verdict
    with pytest.raises(harness.UsageError) as ei:
        judged(3 * g, int(12.67 * g))
    assert "other processes took 54.3 GiB" in str(ei.value) and "no verdict" in str(ei.value)
    # ... or the judge's other row's worker, holding more than the plan (3 x 12 GiB) allows the judge's side: no
    # verdict either, not the row's doing
    with pytest.raises(harness.UsageError) as ei:
        judged(3 * g, int(12.67 * g), others_held=54 * g)
    assert "other rows' workers held 55.0 GiB, beyond the 36.0 GiB the plan allows them" in str(ei.value)
    # ... or the judge's own process, its cache grown past the plan (a float64 forward's blocks kept) while the row
    # asked for 12 GiB beside the 6 it held
    with pytest.raises(harness.UsageError) as ei:
        judged(3 * g, 6 * g, own=62 * g)
    assert "held 62.0 GiB, beyond the 36.0 GiB" in str(ei.value) and "asked for 18.1 GiB in all" in str(ei.value)
    # within the plan, the judge's other worker's memory is the judge's, not another process's
    row = judged(3 * g, 34 * g, others_held=31 * g, asked=2 * g)
    assert not row.accepted and "no other process took GPU memory" in row.reason and "held 34.0 GiB" in row.reason
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


def test_running_out_of_gpu_memory_while_timing_is_no_verdict(monkeypatch):
    """A row that passed parity and runs out of GPU memory in the timing harness gets no verdict: one line that
    says so (the judge's pool and baselines did not fit), not a rejection of the candidate."""
    from kp.errors import OutOfMemory as Raised

    ref = judge.Reference.load(("file", str(CASES_DIR / "relu" / "ref.py")))
    j = judge.Judge(ref, seed=3, device="cpu", sandbox=False, bench=False)

    class OutOfMemory:
        def __init__(
            self,
            why="timing: raised OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB "
            "(the GPU has 5.8 of 79.2 GiB free now)",
        ):
            self.why = why

        def call(self, stage, cmd, *args):
            if cmd == "time":
                raise Raised(self.why, 60 << 30, 6 << 30)
            return {}

    j.refs = None
    j.runners = [OutOfMemory()]
    j.rows = [expected.Row("candidate", j.runners[0])]
    monkeypatch.setattr(timed, "each_update", lambda *a: None)
    with pytest.raises(harness.UsageError) as ei:
        timed.time_rows(j)
    msg = str(ei.value)
    assert "ran out of memory while timing, after parity passed" in msg and "no verdict" in msg and "\n" not in msg
    assert j.rows[0].accepted

    # torch's own line is long; the worker's figures it carries after it still reach the author
    held = "[the raising process: 60.1 GiB allocated, 66.1 GiB reserved, peak 60.1 GiB]"
    long = "timing: raised OutOfMemoryError: CUDA out of memory. " + "x" * 300 + " " + held
    j.runners = [OutOfMemory(long)]
    j.rows = [expected.Row("candidate", j.runners[0])]
    with pytest.raises(harness.UsageError) as ei:
        timed.time_rows(j)
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
    assert plan.cpu_need(fp, backward=True) == 60 * g + (2 + 2) * 12 * g  # the three models' gradients beside
    why = plan.cpu_bench_refusal(fp, 60 * g, backward=True)
    assert "needs about 108.0 GiB of host memory with the judge's copies and the gradients (inputs" in why


@pytest.mark.parametrize(
    "budget,rows,accepted", [(3 << 27, 512, True), (3 << 28, 1024, False)], ids=["small_host", "larger_host"]
)
def test_a_candidate_wrong_only_when_large_is_judged_at_the_largest_shape_the_host_allows(
    cli, tmp_path, monkeypatch, budget, rows, accepted
):
    """On the CPU the judged shape is the largest of the reference's family that the host's budget holds, and the
    record names it in its own field beside the benchmark shape: a candidate wrong only above 2^23 elements passes
    where the host holds 512 rows and is rejected where it holds 1,024."""
    d = harness.ROOT / "tests" / "data" / "wrong_when_large"
    monkeypatch.setenv("KP_CPU_MEMORY", str(budget))
    r = cli(
        "--ref",
        d / "ref.py",
        "--candidate",
        d / "cand.py",
        "--device",
        "cpu",
        "--allow-torch",
        "--seed",
        "3",
        "--json",
        tmp_path / "rec.json",
    )
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert rec["shape"] == "4096x16384" and rec["judged_shape"] == f"{rows}x16384", rec["judged_shape"]
    assert rec["ok"] is accepted and r.returncode == (0 if accepted else 1), r.stdout[-600:]
    lines = r.stdout.strip().splitlines()  # the verdict's last line, and its notes above it where they do not fit
    assert len(lines[-1]) <= 200 and lines[-1].startswith("accepted" if accepted else "rejected"), lines[-1]
    said = lines[-1] if "(notes above)" not in lines[-1] else "\n".join(lines[-6:])
    assert f"judged at {rows}x16384" in said, lines[-6:]
