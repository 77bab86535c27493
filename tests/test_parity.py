"""Parity: seeds and inputs, the references run as the judge runs them (where the float64 one runs:
test_float64_reference.py), weight updates, the error budget, KernelBench's own check beside the verdict, shapes
judged on the CPU."""

import json

import pytest
import torch

import harness
from kp.errors import Rejected
from kp.judge import driver as judge
from kp.judge import expected, family, outputs, plan, reference, runners
from kp.worker import parity_calls
from kp.lib import numerics
from conftest import gpu, run_script as run
from cases import CASES_DIR, outside_repo


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
    # NaNs of other payloads are equal values (their bits differ: not the one-pass path); -0.0 is not 0.0 in any
    # precision
    quiet, payload = torch.tensor([0x7FC00000, 0x7FC00001], dtype=torch.int32).view(torch.float32).chunk(2)
    assert harness.same_values(torch.cat([quiet, big[:5]]), torch.cat([payload, big[:5]]))
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        z = torch.zeros(4, dtype=dt)
        assert harness.same_values(z, z.clone()) and not harness.same_values(z, -z)


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
    # outputs of other dtypes are measured as their values: a mask, integers, half precision
    ones = torch.tensor([[1.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    for got in (
        torch.tensor([[True, False, True, False]]),
        torch.tensor([[1, 0, 1, 0]]),
        torch.tensor([[1.0, 0.0, 1.0, 0.0]], dtype=torch.bfloat16),
    ):
        assert harness.rel_error(got, ones).rel_l2 == pytest.approx(3**-0.5, rel=1e-12), got.dtype


def test_budget_reason_is_one_line():
    e = harness.Err(0.5, 0.9, 0)
    b = harness.budget_from(harness.Err(1e-8, 2e-8, 0))
    r = numerics.budget_reason("trial 1 (seed 3)", e, b)
    assert "\n" not in r and "over budget 1.00e-06" in r and "trial 1 (seed 3)" in r
    assert "NaN/Inf positions differ" in numerics.budget_reason("x", harness.Err(0, 0, 5), b)


def test_a_row_over_its_budget_in_an_output_within_its_own_is_said_as_the_row():
    """relL2 within the budget and one row over it: the reason leads with the row, and never says a relL2 under its
    budget is over it ("relL2 4.35e-05 over budget 4.06e-04" was a real verdict's line)."""
    b = harness.Err(4.06e-4, 4.06e-4, 0)
    e = harness.Err(4.35e-5, 1.44e-3, 0)
    r = numerics.budget_reason("inputs shifted -10 (seed 7)", e, b)
    assert r == (
        "inputs shifted -10 (seed 7): worst row 1.44e-03 over budget 4.06e-04 (relL2 4.35e-05, within its "
        "budget 4.06e-04)"
    )


def test_a_cache_is_named_only_where_the_output_after_the_weights_changed_is_over_its_budget():
    """A row alone a hair over its budget after the weights changed is rounding near the margin, not a value kept from
    the old weights: the two reasons the judge gave one leaderboard candidate at two draws."""
    from kp.errors import Rejected
    from kp.judge.compare import error_figures
    from kp.judge.parity import stale_cache_shaped

    def over(label, e, b):
        return Rejected(numerics.budget_reason(label, e, b), figures=error_figures(label, e, b), kind="wrong_output")

    e, b = numerics.Err(1.38e-06, 2.75e-06, 0), numerics.Err(2.70e-06, 2.70e-06, 0)
    assert not stale_cache_shaped(over("trial 3 (after an load_state_dict)", e, b))
    e = numerics.Err(0.31, 0.52, 0)
    assert stale_cache_shaped(over("trial 2 (after an optimizer step)", e, b))
    assert stale_cache_shaped(Rejected("trial 2: output 0 has shape (4, 8), expected (4, 9)", kind="wrong_shape"))


def test_an_output_over_its_budget_is_judged_again_against_a_widened_one():
    """judge_output asks for the widened budgets only where an element is over its own (and its NaN/Inf agree), says
    so in its result, and rejects what is over the widened budget too, naming that budget."""
    ref = torch.randn(4, 64, dtype=torch.float64)
    exp = outputs.Expected.of(ref.float(), ref)
    asked = []

    def widen(by):
        asked.append(by)
        return {0: numerics.Err(by, by, 0)}

    near = (ref * (1 + 1e-4)).float()
    assert "widened" not in outputs.judge_output("x", ref.float(), "t", exp, lambda: widen(1e-3)) and not asked
    assert outputs.judge_output("x", near, "t", exp, lambda: widen(1e-3))["widened"] and asked == [1e-3]
    with pytest.raises(Rejected, match="budget 1.00e-05"):
        outputs.judge_output("x", near, "t", exp, lambda: widen(1e-5))
    nan = near.clone()
    nan[0, 0] = float("nan")
    with pytest.raises(Rejected, match="NaN/Inf positions"):
        outputs.judge_output("x", nan, "t", exp, lambda: widen(1.0))
    assert asked == [1e-3, 1e-5]


def test_state_map_by_name_then_by_order_then_by_shape():
    ref = [("linear.weight", (4, 3)), ("linear.bias", (4,))]
    assert reference.state_map(ref, list(reversed(ref))) == {
        "linear.weight": "linear.weight",
        "linear.bias": "linear.bias",
    }
    renamed = [("w", (4, 3)), ("b", (4,))]
    assert reference.state_map(ref, renamed) == {"linear.weight": "w", "linear.bias": "b"}
    assert reference.state_map(ref, [("w", (3, 4)), ("b", (4,))]) is None
    assert reference.state_map(ref, renamed[:1]) is None
    # a conv's weight and bias kept under other names and registered after the model's own bias: the name that
    # agrees by name, the rest by shape (in order among equal shapes)
    conv = [("conv.weight", (16, 3, 3, 3)), ("conv.bias", (16,)), ("bias", (16, 1, 1)), ("scale", (16,))]
    cand = [("bias", (16, 1, 1)), ("weight", (16, 3, 3, 3)), ("conv_bias", (16,)), ("gain", (16,))]
    assert reference.state_map(conv, cand) == {
        "conv.weight": "weight",
        "conv.bias": "conv_bias",
        "bias": "bias",
        "scale": "gain",
    }
    assert reference.state_map(conv, cand[:3] + [("gain", (8,))]) is None


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
        'CASES = {"odd": lambda g, d: ([5, 7], [torch.rand(3, 5, generator=g).to(d)]),\n'
        '         "batch2": lambda g, d: ([9, 4], [torch.rand(2, 9, generator=g).to(d)])}\n'
    )
    (tmp_path / "same.py").write_text("from bn_ref import Model\n\n\nclass ModelNew(Model):\n    pass\n")
    ref = judge.Reference.load(("file", str(tmp_path / "bn_ref.py")))
    rec = judge.evaluate(ref, tmp_path / "same.py", seed=2, device="cpu", allow_torch=True)
    r = rec["rows"]["candidate"]
    assert r["accepted"], r["reason"]
    assert sum(k.startswith("case ") for k in r["checks"]) == 2 * 3
    assert any(k.startswith("trial 3") for k in r["checks"])


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
        "def get_init_inputs():\n    return []\n"
    )
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
    monkeypatch.setattr(outputs, "ALLCLOSE_CHUNK", 7)
    monkeypatch.setattr(outputs, "ALLCLOSE_CPU_CHUNK", 7)
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
    rec = judge.evaluate(
        judge.Reference.load(("file", str(CASES_DIR / "relu" / "ref.py"))),
        CASES_DIR / "relu" / "torch_rewrite.py",
        seed=1,
        device="cpu",
        allow_torch=True,
    )
    row = rec["rows"]["candidate"]
    assert row["accepted"], row["reason"]
    assert all(v.startswith("not run (the judge's process ran out of GPU memory") for v in row["kernelbench"].values())


@gpu
def test_nan_fill_makes_unwritten_memory_nan():
    a = torch.randn(1 << 22, device="cuda")
    del a
    parity_calls.nan_fill_cached_free(0)
    b = torch.empty(1 << 22, device="cuda")
    assert bool(torch.isnan(b).all())


def test_nan_fill_headroom_without_room_is_filled_in_part_never_raised(monkeypatch):
    """The worker's NaN-filled headroom is the judge's, not the candidate's: where the GPU has no room for it (a
    judge holding a large float64 forward beside it), the most of it that fits is filled and the call goes on; the
    shortfall is returned for the judge's note, and an out-of-memory error there never becomes the candidate's."""
    asked = []

    def empty(size, dtype=None, device=None):
        asked.append(size)
        if size > 1 << 24:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return torch.zeros(size, dtype=dtype)  # on the host: the fill is what is tested, not the device

    monkeypatch.setattr(parity_calls.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(parity_calls.torch.cuda, "memory_snapshot", lambda: [])
    monkeypatch.setattr(parity_calls.torch, "empty", empty)
    assert parity_calls.nan_fill_cached_free(1 << 26) == (1 << 26) - (1 << 24)
    assert asked == [1 << 26, 1 << 25, 1 << 24]  # halved until it fits
    asked.clear()
    assert parity_calls.nan_fill_cached_free(1 << 30) == 1 << 30  # not even a sixteenth fits: nothing, and no raise
    assert asked == [1 << 30, 1 << 29, 1 << 28, 1 << 27, 1 << 26]
    assert parity_calls.nan_fill_cached_free(1 << 20) == 0


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


def test_a_zero_pattern_survives_stray_zeros_of_single_draws():
    """The pattern is what every draw has: a triangular input whose draws each hold an exact zero of their own in
    the upper half (large torch.randn draws do) keeps its premise, so the shifted input is skipped."""
    from kp.judge.premises import Premises

    p = Premises()
    for stray in (5, 9, 14):
        a = torch.triu(torch.randn(8, 8)) + torch.triu(torch.ones(8, 8))  # no accidental zeros above the diagonal
        a.view(-1)[stray] = 0.0  # positions 5, 9, 14 lie on or above the diagonal
        p.see([a])
    assert p.broken("shifted -10") == "breaks the upper-triangular zero pattern every draw of input 0 has"
    assert p.broken("negated") is None
    q = Premises()
    for _ in range(3):
        q.see([torch.randn(8, 8) + 10])
    assert q.broken("shifted -10") is None


def test_no_row_is_accepted_on_fewer_than_the_minimum_checked_calls():
    """Whatever the device and however a stage went, the driver gives no verdict (exit 2) to a row that would be
    accepted after fewer than MIN_CHECKED checked calls, and says why; rejections and enough checks pass through."""
    from kp.errors import NoVerdict

    said = []
    checks = {f"trial {i}": {} for i in range(judge.MIN_CHECKED - 1)}
    rows = [expected.Row("candidate", None, checks=dict(checks))]
    with pytest.raises(
        NoVerdict,
        match=r"no verdict: candidate passed 2 of the 3 checked calls it needs "
        r"\(the benchmark shape needs about 60.0 GiB",
    ):
        judge.enough_checks(
            rows, {"notes": "the benchmark shape needs about 60.0 GiB of host memory"}, None, "relu", said.append
        )
    assert said == ["relu: the benchmark shape needs about 60.0 GiB of host memory"]
    rows[0].checks["trial 9"] = {}
    judge.enough_checks(rows, {}, None, "relu", said.append)  # enough
    rows = [expected.Row("candidate", None, accepted=False, reason="trial 1: relL2 ...")]
    judge.enough_checks(rows, {}, None, "relu", said.append)  # a rejection needs no count


def test_a_shape_too_large_for_the_cpu_is_judged_at_a_smaller_one_of_its_family():
    """On the CPU a reference whose benchmark shape does not fit is judged at a smaller shape of its own family: the
    batch halved until it fits, the model's sizes and every matrix input's rows kept; where nothing may shrink
    (a size the model reads, or only the rows), nothing changes and the caller gives no verdict."""
    scaled = CASES_DIR / "contract" / "scaled"
    fits = lambda fp: plan.cpu_bench_refusal(fp, 3 << 29) is None  # a 1.5 GiB host budget, as the suite's
    gelu = judge.Reference.load(("file", str(scaled / "gelu" / "ref.py")))
    assert family.scale_to_fit(gelu, fits) == {"batch_size": (4096, 64)}
    assert gelu.module.dim == 393216
    ce = judge.Reference.load(("file", str(scaled / "cross_entropy" / "ref.py")))
    assert family.scale_to_fit(ce, fits) == {"batch_size": (32768, 8192)}  # targets (N,) follow the logits' batch
    ln = judge.Reference.load(("file", str(scaled / "layernorm" / "ref.py")))
    assert family.scale_to_fit(ln, fits) == {"batch_size": (16, 8)}  # features, dim1, dim2 are the model's
    assert ln.init() == [(64, 256, 256)]
    tiny = lambda fp: fp["inputs"] < 1024  # nothing but a change of the model or the rows would fit this
    assert family.scale_to_fit(ln, tiny) == {} and ln.module.batch_size == 8


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
    lazy = (
        "class Model(nn.Module):\n    def forward(self, x):\n        if not hasattr(self, 'scale'):\n"
        "            self.scale = torch.full((x.shape[-1],), 2.0)\n        return x * self.scale\n"
    )
    cell = (
        "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.h = torch.zeros(3)\n\n    def forward(self, x):\n        self.h = torch.tanh(x + self.h)\n"
        "        return self.h\n"
    )
    for name, body, want in (("lazy", lazy, []), ("cell", cell, ["h"])):
        f = tmp_path / f"{name}.py"
        f.write_text(
            "import torch\nimport torch.nn as nn\n\n\n"
            + body
            + "\n\ndef get_inputs():\n    return [torch.randn(4, 3)]\n\n\n"
            "def get_init_inputs():\n    return []\n"
        )
        ref = judge.Reference.load(("file", str(f)))
        refs = expected._Refs(ref, [], 1, "cpu", "cpu")
        for s in range(3):
            refs.expected(ref.inputs(s, "cpu"), "fp32")
        assert refs.state_attrs == want, name


@gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_ref_alone_untimed_checks_the_reference_on_gpu(tmp_path, precision):
    """`--ref` alone with nothing timed (what a corpus run of references does): the reference's own Model against
    float64, every parity stage, and no own kernel asked of it (it is PyTorch by definition)."""
    d = outside_repo(tmp_path, "relu")
    r = run(
        "--ref", d / "ref.py", "--no-bench", "--no-compile", "--precision", precision, "--json", tmp_path / "r.json"
    )
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    row = json.loads((tmp_path / "r.json").read_text())["rows"]["eager"]
    assert row["accepted"] and not row["pure_torch"] and len(row["checks"]) >= 3, row
