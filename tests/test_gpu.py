"""GPU: the softmax shape sweep for every variant; bad input gets a clear error; the compile cache behaves (warm load,
stale lock, compile errors); the timer's call order. (Parity of every variant on every declared case and the
benchmark shape goes through the judge: tests/test_judge_cases.py.)"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import harness
import kp.lib.registry
from conftest import gpu


def _variants(p):
    """Every rung file (records too) and auto; a rung this GPU cannot run skips with what it needs."""
    return harness.variants(p) + ["auto"]


def _skip_unless_runs_here(problem, variant):
    if variant != "auto" and not harness.runs_here(problem, variant):
        pytest.skip(harness.rung(problem, variant).why_not(harness.capability()))


# Rows 1..4096 and columns 1..2^20, odd and prime counts, both sides of every dispatch threshold.
SWEEP = [
    (1, 1),
    (4096, 1),
    (4096, 3),
    (1, 1 << 20),
    (2, 1048573),
    (7, 1009),
    (33, 8191),
    (5, 8193),
    (5, 16383),
    (5, 16385),
    (3, 65521),
    (2, 131071),
    (3, 393217),
    (129, 127),
    (1000, 33),
    (17, 4099),
    (64, 1024),
    (40, 200003),
    (64, 393216),
]  # more rows than 2 x the resident clusters: 6_regcluster's ticketed rows


@gpu
@pytest.mark.parametrize("variant", _variants("softmax"))
def test_softmax_shape_sweep(variant):
    from models.softmax import ModelNew

    _skip_unless_runs_here("softmax", variant)
    m = ModelNew(variant=variant)
    g = torch.Generator().manual_seed(5)
    bad = []
    for rows, cols in SWEEP:
        x = (torch.randn(rows, cols, generator=g) * 3).cuda()
        out = m(x)
        ref = torch.softmax(x.double(), 1)
        e = harness.rel_error(out, ref)
        if not e.within(harness.budget_from(harness.rel_error(torch.softmax(x, 1), ref))):
            bad.append(((rows, cols), e))
    assert not bad, bad


def _layouts(rows, cols, dtype, g):
    """x contiguous; one element past an aligned start (every row out of 16-byte phase: the window path where y's
    rows share it, direct loads where they do not); rows cut from a wider matrix (row stride cols + 11)."""
    base = (torch.randn(rows * cols + 1, generator=g) * 3).to(dtype).cuda()
    wide = (torch.randn(rows, cols + 11, generator=g) * 3).to(dtype).cuda()
    return {
        "contiguous": base[: rows * cols].view(rows, cols),
        "offset1": base[1:].view(rows, cols),
        "row_strided": wide[:, 5 : cols + 5],
    }


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_softmax_sixteen_bit_rows(dtype):
    """bf16 and fp16 rows (auto sends them to 6_regcluster, fp32 inside): the bulk copies, the window around rows
    that are not a multiple of 8 elements, direct loads, the one-block-per-row kernel past 16 slices, more rows than
    the resident clusters, against float64 on the same 16-bit values, within the judge's budget from PyTorch's own
    error in that dtype (per row too); the output keeps x's dtype."""
    from models.softmax import ModelNew

    _skip_unless_runs_here("softmax", "6_regcluster")
    m = ModelNew()
    g = torch.Generator().manual_seed(7)
    bad = []
    for rows, cols in SWEEP + [(70, 196612), (5, 98303), (3, 786440), (3, 1 << 21)]:
        for name, x in _layouts(rows, cols, dtype, g).items():
            out = m(x)
            assert out.dtype == dtype
            ref = torch.softmax(x.double(), 1)
            e = harness.rel_error(out, ref)
            if not e.within(harness.budget_from(harness.rel_error(torch.softmax(x, 1), ref), cols, dtype)):
                bad.append(((rows, cols), name, e))
            del x, out, ref
    assert not bad, bad


# One CTA a row (1..24576 columns) up to 16-CTA clusters (393216), rows from 1 to more than twice the resident
# clusters (the ticketed rows), lengths no cluster path takes (not a multiple of 4, past 16 slices).
BACKWARD_SWEEP = [
    (1, 4),
    (3, 24576),
    (300, 1024),
    (40, 24580),
    (20, 98304),
    (33, 196608),
    (40, 393216),
    (5, 393220),
    (7, 1001),
    (1000, 4),
    (2, 1),
]


@gpu
@pytest.mark.parametrize("variant", _variants("softmax_backward"))
def test_softmax_backward_shape_sweep(variant):
    """dx = y * (dy - rowsum(dy * y)) against float64, within the judge's budget from PyTorch's own fp32 backward,
    for y and dy contiguous, dy one element off 16-byte alignment, and both cut from wider rows (row stride)."""
    from models.softmax_backward import ModelNew

    _skip_unless_runs_here("softmax_backward", variant)
    m = ModelNew(variant=variant)
    g = torch.Generator().manual_seed(5)
    bad = []
    for rows, cols in BACKWARD_SWEEP:
        y = torch.softmax(torch.randn(rows, cols, generator=g) * 3, 1).cuda()
        flat = torch.randn(rows * cols + 1, generator=g).cuda()
        wide_y = torch.zeros(rows, cols + 4, device="cuda")
        wide_y[:, 4:] = y
        wide_g = torch.randn(rows, cols + 8, generator=g).cuda()
        layouts = {
            "contiguous": (y, flat[: rows * cols].view(rows, cols)),
            "offset1": (y, flat[1:].view(rows, cols)),
            "row_strided": (wide_y[:, 4:], wide_g[:, 8:]),
        }
        for name, (yy, gg) in layouts.items():
            out = m(yy, gg)
            yd, gd = yy.double(), gg.double()
            ref = yd * (gd - (yd * gd).sum(1, keepdim=True))
            e = harness.rel_error(out, ref)
            own = harness.rel_error(torch._softmax_backward_data(gg, yy, 1, yy.dtype), ref)
            if not e.within(harness.budget_from(own)):
                bad.append(((rows, cols, name), e))
    assert not bad, bad


@gpu
@pytest.mark.parametrize("variant", _variants("softmax"))
def test_softmax_bad_input_is_a_clear_error(variant):
    from models.softmax import ModelNew

    _skip_unless_runs_here("softmax", variant)
    m = ModelNew(variant=variant)
    with pytest.raises(RuntimeError, match="float32"):
        m(torch.rand(4, 4, device="cuda", dtype=torch.float64))
    with pytest.raises(RuntimeError, match="2-D"):
        m(torch.rand(2, 3, 4, device="cuda"))
    with pytest.raises(RuntimeError, match="CUDA"):
        m(torch.rand(4, 4))
    assert m(torch.rand(0, 5, device="cuda")).shape == (0, 5)


def _scratch_tree(tmp_path, body):
    k = tmp_path / "kernels"
    shutil.copytree(harness.KERNELS / "common", k / "common")
    (k / "zz").mkdir()
    (k / "zz" / "1_k.cu").write_text(body)
    return k


@gpu
def test_compile_error_names_file_and_line(tmp_path, monkeypatch):
    src = (
        (harness.KERNELS / "softmax" / "1_rowblock.cu")
        .read_text()
        .replace("m = kp::block_max(m, scratch);", "m = kp::block_max(m, scrach);")
    )
    k = _scratch_tree(tmp_path, src)
    bad_line = src.splitlines().index(next(l for l in src.splitlines() if "scrach" in l)) + 1
    monkeypatch.setattr(kp.lib.registry, "KERNELS", k)
    monkeypatch.setenv("KP_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(harness.KernelBuildError) as ei:
        harness.build("zz", "1_k", quiet=True)
    msg = str(ei.value)
    assert f"1_k.cu:{bad_line}: error:" in msg and "scrach" in msg and len(msg.splitlines()) < 10


@gpu
def test_stale_torch_lock_does_not_hang_and_warm_load_is_fast(tmp_path):
    """A killed build leaves torch's `lock` file; the next build must clear it. Then a new process loads warm."""
    env = {**os.environ, "KP_CACHE_DIR": str(tmp_path / "cache")}
    cap = torch.cuda.get_device_capability()
    key = harness.cache_key(harness.KERNELS / "softmax" / "1_rowblock.cu", cap)
    bdir = tmp_path / "cache" / f"kp_softmax_1_rowblock_{key[:16]}"
    bdir.mkdir(parents=True)
    (bdir / "lock").write_text("")  # what a build killed mid-way leaves behind
    code = textwrap.dedent("""
        import time, torch, harness
        torch.cuda.init()
        t0 = time.perf_counter(); b = harness.build("softmax", "1_rowblock", quiet=True)
        x = torch.rand(3, 5, device="cuda"); y = torch.empty_like(x); b.ops.softmax_forward(x, y)
        assert torch.allclose(y, torch.softmax(x, 1))
        print(b.built_now, time.perf_counter() - t0)
    """)
    outs = []
    for _ in range(2):
        r = subprocess.run(
            [sys.executable, "-c", code], cwd=harness.ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, r.stderr[-2000:]
        built, secs = r.stdout.split()
        outs.append((built == "True", float(secs)))
    assert outs[0][0] and not outs[1][0], outs
    assert outs[1][1] < 1.0, f"warm load took {outs[1][1]:.2f} s"


@gpu
def test_bench_times_each_call_after_a_call_of_itself(gpu_alone):
    """bench_interleaved(precede=True): every timed call directly follows an untimed call of the same entry (whose
    `before` gets rep -1), so no entry's time includes the write-back of a neighbour's dirty L2 lines (README,
    "Order sensitivity")."""
    log = []
    x = torch.zeros(1024, device="cuda")

    def make(name):
        def f():
            log.append(name)
            x.add_(1.0)

        return f

    reps = []
    harness.bench_interleaved(
        {"a": make("a"), "b": make("b"), "c": make("c")},
        min_reps=3,
        max_reps=3,
        warmup=1,
        before=lambda name, rep: reps.append((name, rep)),
    )
    timed = log[3:]  # after one warm-up round of a, b, c
    assert timed == [n for _ in range(3) for n in ("a", "a", "b", "b", "c", "c")]
    assert reps[3:] == [(n, k) for r in range(3) for n in ("a", "b", "c") for k in (-1, r)]


@gpu
def test_flush_empties_the_gpu_l2(gpu_alone):
    """A read of 16 MiB (inside the L2) timed after the flush must come from DRAM, not from the L2 where the call
    before left it: the flush has to act on the GPU (an earlier version put its buffer in host memory). H200: 12.5
    us flushed, 10.7 L2-hot (torch.sum's fixed cost is most of both)."""
    assert harness.L2Flusher().buf.is_cuda
    x = torch.rand(4 << 20, device="cuda")
    out = torch.empty((), device="cuda")
    rows = {"sum": lambda: torch.sum(x, dim=0, out=out)}
    flushed = harness.bench_interleaved(rows, min_reps=20, max_reps=40, budget_s=10)["sum"].median_ms
    hot = harness.bench_interleaved(rows, min_reps=20, max_reps=40, budget_s=10, flush=lambda: None)["sum"].median_ms
    print(f"16 MiB read: after the flush {1e3 * flushed:.1f} us, L2-hot {1e3 * hot:.1f} us")
    assert flushed > 1.08 * hot, (flushed, hot)


@gpu
def test_inputs_rewritten_before_the_flush_cost_the_timed_call_nothing(gpu_alone):
    """The judge refills every timed call's inputs just before the flush; the dirty lines that leaves must be
    written back by the flush, not by the timed call."""
    big = torch.rand(64 << 20, device="cuda")  # 256 MiB, read by the timed call
    inp, src = torch.empty(16 << 20, device="cuda"), torch.rand(16 << 20, device="cuda")  # 64 MiB rewritten
    out = torch.empty((), device="cuda")
    rows = {"sum": lambda: torch.sum(big, dim=0, out=out)}
    t = {
        bn: harness.bench_interleaved(rows, min_reps=20, max_reps=40, budget_s=10, before=b)["sum"].median_ms
        for bn, b in {"-": None, "rewritten": lambda name, rep: inp.copy_(src)}.items()
    }
    print({k: round(1e3 * v, 1) for k, v in t.items()}, "us")
    assert t["rewritten"] < 1.03 * t["-"], t
