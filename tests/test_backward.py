"""Gradients judged (--backward, kp.judge.backward): the judge cases of tests/judge_cases/contract/backward each run
through the judge cases' own tests with their FLAGS (--backward among them); here, what they must show besides."""

import pytest

from cases import CASES_DIR, meta
from kp.judge.backward import Grads

BACKWARD = CASES_DIR / "contract" / "backward"
WRONG_GRADS = [p.name for p in sorted(BACKWARD.glob("wrong_*.py"))]


def test_the_backward_cases_cover_each_defect():
    names = " ".join(WRONG_GRADS)
    for needed in (
        "derivative",
        "no_bias_grad",
        "no_grad_forward",
        "stale_saved",
        "assigns_grad",
        "cuda_no_backward",
        "side_stream",
    ):
        assert needed in names
    assert {"autograd_rewrite.py", "function_rewrite.py"} <= {p.name for p in BACKWARD.glob("*.py")}


@pytest.mark.parametrize("name", WRONG_GRADS)
def test_a_wrong_gradient_with_a_right_forward_is_accepted_without_backward(cli, tmp_path, name):
    """Each wrong-gradient case's forward is right: judged as KernelBench judges (no --backward) it is accepted."""
    m = meta(BACKWARD / name)
    if "cpu" not in m["DEVICES"]:
        pytest.skip("judged on a GPU only")
    flags = [f for f in m["FLAGS"] if f != "--backward"]
    r = cli(
        "--ref",
        BACKWARD / "ref.py",
        "--candidate",
        BACKWARD / name,
        "--device",
        "cpu",
        "--seed",
        "5",
        "--no-sandbox",
        *flags,
    )
    last = r.stdout.strip().splitlines()[-1]
    assert r.returncode == 0 and last.startswith("accepted"), r.stdout + r.stderr


def test_accumulated_expectations_add_the_call_befores_parameter_gradients():
    import torch

    a = Grads(upstream=[], seed=1, inputs={}, params={"w": (torch.ones(2), torch.ones(2, dtype=torch.float64), 4.0)})
    b = Grads(
        upstream=[],
        seed=2,
        inputs={},
        params={"w": (torch.full((2,), 2.0), torch.full((2,), 2.0, dtype=torch.float64), 4.0)},
    )
    s = b.plus(a)
    assert not s.zero and s.request()["zero"] is False
    assert torch.equal(s.params["w"][0], torch.full((2,), 3.0)) and s.params["w"][1].dtype == torch.float64
    assert b.plus(None) is b


def test_training_steps_are_timed_side_by_side_with_every_sample_told():
    """--backward's timing (the worker's time command with backward): each baseline and row is timed as a training step,
    its forward and a backward pass from an upstream gradient drawn with the inputs, the parameters' .grad cleared
    before each call; every sample is told as taken and none is offered for a check (parity judged the gradients)."""
    import torch
    from kp.worker.measuring import TimingCommands
    from kp.worker.state import WorkerState

    class Counted(torch.nn.Linear):
        backwards = 0

        def forward(self, x):
            y = super().forward(x)
            if y.requires_grad:
                y.register_hook(lambda g: setattr(Counted, "backwards", Counted.backwards + 1))
            return y

    class Ref:
        def inputs(self, seed, device):
            return [torch.randn(4, 3, generator=torch.Generator().manual_seed(seed))]

    told = []

    def interim(msg):
        told.append(msg)
        return False

    st = WorkerState(Ref(), "cpu", "fp32", interim=interim)
    st.baselines = {"eager": Counted(3, 2)}
    st.models = {"candidate": Counted(3, 2)}
    reply = TimingCommands(st).cmd_time(["candidate"], 2, 3, 3, 5.0, False, True)
    assert set(reply["timing"]) == {"eager", "candidate"}
    for k, t in reply["timing"].items():
        samples = [m["ms"] for m in told if m["label"] == k]
        assert samples == t["samples"] and len(samples) == 3
    assert not any(m["ask"] for m in told)
    assert Counted.backwards >= 2 * (3 + 3 + 3)  # warm-up, the calls before each timed call, the timed calls
    assert all(p.grad is not None for m in (st.baselines["eager"], st.models["candidate"]) for p in m.parameters())


def test_the_training_steps_have_rows_of_their_own_under_the_forwards_table():
    from kp.observe.report import backward_lines

    t = lambda ms: {"median_ms": ms, "q1_ms": ms - 0.1, "q3_ms": ms + 0.1}  # noqa: E731
    rec = {
        "rows": {"candidate": {}},
        "timing": {"eager": t(2.0), "torch.compile": t(1.5), "candidate": t(1.0)},
        "timing_backward": {"eager": t(6.0), "torch.compile": t(4.0), "candidate": t(3.0)},
    }
    lines = backward_lines(rec)
    assert lines[0].split()[:3] == ["forward+backward", "median", "ms"]
    assert [ln.split()[0] for ln in lines[1:]] == ["eager", "torch.compile", "candidate"]
    assert lines[3].split()[1:] == ["3.000", "0.200", "2.00x", "1.33x"]
    assert backward_lines({"rows": {}, "timing": {}}) == []


def test_a_calls_gradients_and_their_widener_are_freed_without_waiting_for_the_garbage_collector():
    """A call's expected gradients hold the function that widens them; that function must not hold them back (a
    reference cycle): at the largest shapes the gradients of each call are tens of GiB of GPU memory."""
    import gc
    import weakref
    from kp.judge import driver
    from kp.judge.backward import GradientCheck
    from kp.judge.clock import StageClock
    from kp.judge.expected import _Refs

    ref = driver.Reference.load(("file", str(BACKWARD / "ref.py")))
    refs = _Refs(ref, ref.init(), 3, "cpu", "cpu")
    pristine = ref.inputs(3, "cpu")
    check = GradientCheck([], lambda msg: None, ref.name, StageClock())
    grads = check.expected(refs, pristine, 3, "fp32")
    grads.widen = check.widener(refs, pristine, grads, None)
    assert grads.widen() and all(e.rel_l2 >= 0 for e in grads.widen().values())  # it runs, and gives its spreads
    gone, upstream = weakref.ref(grads), weakref.ref(grads.upstream[0])
    gc.disable()
    try:
        del grads
        assert gone() is None, "the call's gradients are kept alive by a reference cycle"
    finally:
        gc.enable()
    assert upstream() is None  # and with them the widener and what it held


def test_a_float64_backward_short_of_gpu_memory_is_tried_again_after_the_judges_cache_is_handed_back(monkeypatch):
    """The float64 backward runs beside the judge's cached blocks (the float64 forward's of the call before): where it
    runs out of memory, the cache is handed back and it runs once more, from the references' state before the call;
    short again, a float64 reference on the GPU moves to the host and makes them there; only one on the host already
    leaves the call's gradients unchecked, said in a note."""
    import torch
    from kp.judge import backward, driver
    from kp.judge.backward import GradientCheck
    from kp.judge.clock import StageClock
    from kp.judge.expected import _Refs

    ref = driver.Reference.load(("file", str(BACKWARD / "ref.py")))
    refs = _Refs(ref, ref.init(), 3, "cpu", "cpu")
    pristine = ref.inputs(3, "cpu")
    check = GradientCheck([], lambda msg: None, ref.name, StageClock())
    real, runs, released = backward._float64_grads, [], []

    def short(times):
        def run(*a, **k):
            runs.append(1)
            if len(runs) <= times:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
            return real(*a, **k)

        return run

    monkeypatch.setattr(backward, "_float64_grads", short(1))
    monkeypatch.setattr(backward, "release_cached", lambda *a, **k: released.append(k))
    g = check.expected(refs, pristine, 3, "fp32")
    assert len(runs) == 2 and released == [{"collect": True}] and not check.notes  # garbage cycles freed too
    assert set(g.params) == {"fc.weight", "fc.bias"} and g.params["fc.weight"][1].dtype == torch.float64

    runs.clear()
    monkeypatch.setattr(backward, "_float64_grads", short(2))
    assert check.expected(refs, pristine, 3, "fp32", "trial 1 (seed 3)") is None and len(runs) == 2
    assert check.notes == [
        "gradients not checked at 1 call (trial 1): the float64 backward did not fit the GPU's memory"
    ]
    runs.clear()  # a second call short too: the same note, naming both calls, not a second note
    check.notes.append("another note")
    assert check.expected(refs, pristine, 3, "fp32", "trial 2 (seed 4, after an optimizer step)") is None
    assert check.notes == [
        "gradients not checked at 2 calls (trial 1, trial 2): the float64 backward did not fit the GPU's memory",
        "another note",
    ]
    runs.clear()  # a float64 reference on the GPU short twice: the gradients made on the host, and said
    monkeypatch.setattr(refs, "f64_device", "cuda")
    monkeypatch.setattr(refs, "to_host", lambda why: refs.__dict__.update(f64_device="cpu", moved=why))
    g = check.expected(refs, pristine, 3, "fp32", "trial 3 (seed 5)")
    assert len(runs) == 3 and refs.f64_device == "cpu" and g.params["fc.weight"][1].dtype == torch.float64
    assert refs.moved == "moved to the host after the GPU ran out of memory in its backward"
    assert len(check.notes) == 2  # no note of gradients unchecked: the reference's notes say where it moved
