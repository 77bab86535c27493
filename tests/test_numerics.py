"""Host-side parity logic: the error measure, NaN/Inf matching, budgets. No GPU needed."""

from pathlib import Path

import pytest
import torch

import harness


def test_rel_error_catches_constant_softmax():
    # The classic fooling case: a constant 1/N "softmax" passes allclose(atol=1e-4) but not relL2.
    x = torch.rand(8, 65536, dtype=torch.float64)
    ref = torch.softmax(x, 1)
    const = torch.full_like(ref, 1 / 65536)
    assert torch.allclose(const, ref, atol=1e-4)
    e = harness.rel_error(const, ref)
    assert e.rel_l2 > 0.1
    assert not e.within(harness.budget_from(harness.Err(1e-8, 1e-8, 0)))


def test_nan_pattern_must_match():
    ref = torch.tensor([[1.0, 2.0], [float("nan"), float("nan")]], dtype=torch.float64)
    good = ref.clone().float()
    assert harness.rel_error(good, ref).nonfinite_mismatch == 0
    bad = good.clone()
    bad[1] = 0.5
    assert harness.rel_error(bad, ref).nonfinite_mismatch == 2
    bad2 = good.clone()
    bad2[0, 0] = float("inf")
    assert harness.rel_error(bad2, ref).nonfinite_mismatch == 1


def test_worst_row_sees_one_bad_row():
    ref = torch.rand(1000, 100, dtype=torch.float64)
    out = ref.clone()
    out[7] *= 1.01
    e = harness.rel_error(out, ref)
    assert e.worst_row > 0.009 and e.rel_l2 < 0.001


def test_budget_floor_and_multiple():
    assert harness.budget_from(harness.Err(1e-9, 1e-9, 0)).rel_l2 == harness.ABS_FLOOR
    assert harness.budget_from(harness.Err(1e-5, 2e-5, 0)).worst_row == 4 * 2e-5


def test_clone_layout_keeps_offset_and_strides():
    base = torch.arange(100.0)
    x = base[3:].view(97, 1)[:90].t()
    c = harness.clone_layout(x)
    assert c.storage_offset() == x.storage_offset() and c.stride() == x.stride() and torch.equal(c, x)
    assert c.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_quantiles():
    t = harness.summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (t.median_ms, t.q1_ms, t.q3_ms) == (3.0, 2.0, 4.0)


def test_budget_floor_follows_the_longest_reduction_of_any_operator():
    """A softmax, a norm or a prefix sum keeps its input's shape, yet each output sums a whole row: an honest kernel
    summing in another order must get the floor of that length (2 u sqrt(K)), and pure elementwise work none."""
    from kp.lib.numerics import accumulation_floor
    from kp.lib.op_modes import ReductionLength

    F = torch.nn.functional
    x = torch.randn(4, 4096)
    cases = {
        "softmax": (lambda: torch.softmax(x, 1), 4096),
        "row norm": (lambda: x / torch.norm(x, p=2, dim=1, keepdim=True), 4096),
        "whole-tensor norm": (lambda: x / torch.norm(x, p="fro"), 4 * 4096),
        "prefix sum": (lambda: torch.cumsum(x, 1), 4096),
        "instance norm": (lambda: F.instance_norm(x.view(4, 8, 16, 32)), 16 * 32),
        "batch norm, training": (lambda: F.batch_norm(x.view(4, 8, 16, 32), None, None, training=True), 4 * 16 * 32),
        "batch norm, eval": (lambda: F.batch_norm(x.view(4, 8, 16, 32), torch.zeros(8), torch.ones(8)), 1),
        "layer norm": (lambda: F.layer_norm(x, (4096,)), 4096),
        "group norm": (lambda: F.group_norm(x.view(4, 8, 16, 32), 2), 4 * 16 * 32),
        "matrix product": (lambda: x @ torch.randn(4096, 3), 4096),
        "linear layer": (lambda: F.linear(x, torch.randn(5, 4096), torch.randn(5)), 4096),
        "batched product": (lambda: torch.bmm(x.view(2, 2, 4096), torch.randn(2, 4096, 3)), 4096),
        "convolution": (lambda: F.conv2d(x.view(4, 8, 16, 32), torch.randn(6, 4, 3, 3), groups=2), 4 * 9),
        "transposed convolution": (lambda: F.conv_transpose2d(x.view(4, 8, 16, 32), torch.randn(8, 3, 3, 3)), 8 * 9),
        "softmax's backward": (lambda: torch._softmax_backward_data(x, torch.softmax(x, 1), 1, x.dtype), 4096),
        "log-softmax's backward": (lambda: torch._log_softmax_backward_data(x, x.log_softmax(1), 1, x.dtype), 4096),
        "max (rounds nothing)": (lambda: x.amax(1), 1),
        "relu": (lambda: torch.relu(x), 1),
    }
    for name, (f, k) in cases.items():
        m = ReductionLength()
        with torch.no_grad(), m:
            f()
        assert m.k == k, name
    assert accumulation_floor(4096) > 5 * accumulation_floor(1)


def test_honest_roundings_of_a_softmax_backward_show_its_cancellation():
    """dx = y * (dy - rowsum(dy * y)) cancels at the peak of a nearly one-hot row: the rounding mode rounds the sum
    before the difference (as a kernel does), so such a row moves far more than one rounding of the fused operator's
    result would move it, and a spread row moves by about the floor of its 4096-long sum."""
    from kp.lib.numerics import accumulation_floor
    from kp.lib.op_modes import RoundingNoise

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4096, generator=g, dtype=torch.float64)
    logits[0, 7] += 30.0  # row 0: y ~ 1 at column 7
    y, dy = torch.softmax(logits, 1), torch.randn(2, 4096, generator=g, dtype=torch.float64)
    ref = torch._softmax_backward_data(dy, y, 1, torch.float64)
    with RoundingNoise(0):
        moved = torch._softmax_backward_data(dy, y, 1, torch.float64)
    row = ((moved - ref).norm(dim=1) / ref.norm(dim=1)).tolist()
    assert row[0] > 100 * accumulation_floor(4096) and row[1] < 3 * accumulation_floor(4096), row


def test_flop_count_agrees_with_torchs_flop_counter():
    """The judge's FLOP count (its own dispatch mode, which does not import torch._dynamo) gives what torch's
    FlopCounterMode gives: the same formulas, the same decompositions."""
    from torch.utils.flop_counter import FlopCounterMode
    from kp.lib.op_modes import FlopCount

    torch.manual_seed(0)
    conv, lin = torch.nn.Conv2d(3, 8, 3), torch.nn.Linear(64, 32)
    x, a, b = torch.randn(2, 3, 16, 16), torch.randn(4, 64), torch.randn(5, 7, 9)

    def forward():
        y = conv(x).relu().sum() + lin(a).softmax(-1).sum()
        return (
            y
            + torch.bmm(b, b.transpose(1, 2)).sum()
            + torch.nn.functional.scaled_dot_product_attention(b[None], b[None], b[None]).sum()
        )

    theirs, ours = FlopCounterMode(display=False), FlopCount()
    with torch.no_grad():
        with theirs:
            forward()
        with ours:
            forward()
    assert ours.get_total_flops() == theirs.get_total_flops() > 0


def test_a_footprint_is_kept_per_file_and_sizes(monkeypatch, tmp_path):
    """The reference's footprint is kept between runs (a meta-device run costs a process seconds of imports): the
    same file at the same module-level sizes reads it back without running the model; other sizes measure again."""
    from kp.judge.reference import Reference

    monkeypatch.setenv("KP_CACHE_DIR", str(tmp_path))
    ref = Reference.load(("file", str(Path(__file__).parent / "batch" / "ref.py")))
    first = ref.footprint("cpu")
    monkeypatch.setattr(Reference, "_footprint", lambda self, device, train=True: pytest.fail("measured again"))
    assert ref.footprint("cpu") == first and len(list((tmp_path / "footprints").iterdir())) == 1
    monkeypatch.setattr(Reference, "_footprint", lambda self, device, train=True: {"measured": train})
    assert ref.footprint("cpu", train=False) == {"measured": False}  # the mode is part of what is kept
    monkeypatch.setattr(ref.module, "COLS", 999, raising=False)
    assert ref.footprint("cpu") == {"measured": True}


def test_a_members_output_of_a_few_elements_has_its_floor_against_the_benchmarks_magnitude():
    """A batch of one reduces to a few outputs: an honest fp32 dot product whose sum cancels is far off relative to
    its own value, not to a typical one. Its floor is taken against the benchmark's RMS output there; a large
    output, or one at least as large as the benchmark's, keeps the plain floor."""
    import numpy as np
    import torch
    from kp.judge.outputs import Expected, few_scale, rms
    from kp.lib.numerics import accumulation_floor

    k = 131072
    rng = np.random.default_rng(7)
    a, b = (rng.standard_normal(k).astype(np.float32) for _ in range(2))
    exact = float(np.dot(a.astype(np.float64), b.astype(np.float64)))
    typical = k**0.5  # a sum of k products of two standard normals
    small = torch.tensor([[exact * 0.05]], dtype=torch.float64)  # the same sum, cancelling more
    assert few_scale(small, typical) == typical / abs(exact * 0.05)
    assert few_scale(torch.full((64, 1), 0.1, dtype=torch.float64), typical) == 1.0  # not a few elements
    assert few_scale(torch.tensor([2 * typical], dtype=torch.float64), typical) == 1.0
    assert few_scale(small, None) == 1.0  # the benchmark itself
    r32 = small.float()
    plain = Expected.of(r32, small, k=k).errs[0].limit.rel_l2
    scaled = Expected.of(r32, small, k=k, scale=[rms(torch.full((4, 1), typical))]).errs[0].limit.rel_l2
    assert plain == accumulation_floor(k) and abs(scaled / plain / few_scale(small, typical) - 1) < 1e-6


def test_a_row_is_not_measured_finer_than_fp32_resolves_the_typical_row():
    """A row of values at 1e-40 beside rows at 1e2 (underflowed to zero by the candidate, a denormal in float64)
    is no error; a typical row off by 1%, or garbage where the reference is zero, still is."""
    import torch
    from kp.lib.numerics import rel_error

    torch.manual_seed(0)
    ref = torch.randn(64, 14, dtype=torch.float64) * 1e2
    ref[5] = torch.randn(14, dtype=torch.float64) * 1e-40
    out = ref.float()
    out[5] = 0
    assert rel_error(out, ref).worst_row < 1e-6
    out = ref.float()
    out[7] *= 1.01
    assert abs(rel_error(out, ref).worst_row - 0.01) < 1e-6
    ref[9] = 0
    out = ref.float()
    out[9] = 0.1  # a thousandth of the typical value, where the reference is zero: far over a row budget (~1e-5)
    assert rel_error(out, ref).worst_row > 1e-3


def test_a_row_of_tail_values_is_measured_at_the_typical_rows_resolution():
    """Mish twice after a convolution of inputs scaled x100, as an honest fp32 kernel writes it (log(1 + exp(x)),
    which keeps only a few bits where exp(x) is near fp32's epsilon, x around -12): rows whose values all lie in
    that tail are off by a few percent of their own tiny size, a fiftieth of an ulp of the typical row. That is
    within the least budget; the tail row set to zero (a quarter-millionth of the typical row) is not."""
    import torch
    from kp.lib.numerics import ABS_FLOOR, rel_error

    torch.manual_seed(0)

    def mish(x):  # the kernel's formula, in the dtype of x
        return x * torch.tanh(torch.log(1 + torch.exp(x)))

    pre = torch.randn(256, 14, dtype=torch.float64) * 1e2
    pre[3] = -12 - torch.rand(14, dtype=torch.float64) * 3  # a row of the tail: its outputs ~1e-5 down to ~1e-6
    ref = torch.nn.functional.mish(torch.nn.functional.mish(pre))
    out = mish(mish(pre.float()))
    own = (out[3].double() - ref[3]).norm() / ref[3].norm()
    assert own > 1e-3  # off by more than a budget relative to the row's own size
    assert rel_error(out, ref).worst_row < ABS_FLOOR
    out[3] = 0
    assert rel_error(out, ref).worst_row > ABS_FLOOR


def test_an_error_of_the_judges_own_code_is_told_from_the_references():
    """A reference raising on its inputs is a usage error or a skipped member; the judge's own bug (here a
    ValueError of kp's error measure) must not pass for one. An operator raising inside the judge's dispatch mode
    is the operator's."""
    import pytest
    import torch
    from kp.errors import raised_by_judge
    from kp.lib.numerics import rel_error
    from kp.lib.op_modes import ReductionLength

    with pytest.raises(IndexError) as ref:
        torch.zeros(2)[5]
    assert not raised_by_judge(ref.value)
    with pytest.raises(IndexError) as op, ReductionLength():
        torch.nn.functional.cross_entropy(torch.randn(4, 3), torch.tensor([0, 1, 2, 7]))
    assert not raised_by_judge(op.value)
    with pytest.raises(ValueError) as own:
        rel_error(torch.zeros(2), torch.zeros(3))
    assert raised_by_judge(own.value)
    import kp.errors  # a CUDA error is asynchronous: met at a line of the judge's, it is the work queued before it

    at_judge_line = lambda text: exec(compile(f"raise RuntimeError({text!r})", kp.errors.__file__, "exec"))
    with pytest.raises(RuntimeError) as sticky:
        at_judge_line("CUDA error: device-side assert triggered")
    assert not raised_by_judge(sticky.value)
    with pytest.raises(RuntimeError) as other:
        at_judge_line("a judge's own error")
    assert raised_by_judge(other.value)


def test_handing_back_gpu_memory_after_a_sticky_fault_leaves_the_fault_to_be_said_where_it_was_met(monkeypatch):
    """The reference's device-side assert leaves the judge's CUDA context unusable; the tidying on the way out (a
    `finally` that hands cached memory back) met it again in mem_get_info and raised, and that error took the place
    of the one naming the member where the reference faulted. The hand-back passes over a CUDA error, not others."""
    import pytest
    import torch
    from kp.judge.release import release_cached

    def broken():
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", broken)
    monkeypatch.setattr(torch.cuda, "empty_cache", broken)
    release_cached(1 << 30)
    release_cached()

    def other():
        raise ValueError("not a CUDA error")

    monkeypatch.setattr(torch.cuda, "mem_get_info", other)
    with pytest.raises(ValueError):
        release_cached(1 << 30)


def test_an_output_below_the_smallest_normal_number_is_measured_at_that_size():
    """A product of 256 normals (KernelBench's l1_p50) lies below fp32's smallest normal number whole, where a
    value keeps fewer bits the smaller it is: one in order and one by pairs of partial products, both honest fp32,
    differ from each other and from the float64 reference by up to 100% of their own size (a seed was rejected at
    the benchmark's shape so). Measured against that smallest size, both are within the least budget; values of
    1e-30 there are not. A reference of zeros is measured as before: by the error's own size."""
    import torch
    from kp.lib.numerics import ABS_FLOOR, rel_error

    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.randn(16, 256, 64)
        ref = torch.prod(x.double(), dim=1)
        assert float(ref.abs().max()) < torch.finfo(torch.float32).tiny
        in_order = torch.ones(16, 64)
        for i in range(256):
            in_order = in_order * x[:, i]
        by_pairs = x
        while by_pairs.shape[1] > 1:
            by_pairs = by_pairs[:, 0::2] * by_pairs[:, 1::2]
        by_pairs = by_pairs[:, 0]
        for out in (in_order, by_pairs):
            err = rel_error(out, ref)
            assert err.rel_l2 < ABS_FLOOR and err.worst_row < ABS_FLOOR, (seed, err)
        assert rel_error(torch.full_like(in_order, 1e-30), ref).rel_l2 > 1.0
    zeros = torch.zeros(16, 64, dtype=torch.float64)  # a reference of zeros: the error's own size, as before
    assert rel_error(torch.full((16, 64), 1e-40), zeros).rel_l2 < 1e-30
    assert rel_error(torch.full((16, 64), 1e-3), zeros).worst_row > 1e-3
