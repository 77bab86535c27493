"""Half precision (`--precision bf16` / `fp16`): what is cast to the dtype, the budget's floor there, and a derived
input that leaves the dtype's range. The verdicts on right and wrong half-precision kernels are judge cases
(tests/judge_cases/half/)."""

import json
from pathlib import Path

import pytest
import torch

from kp.judge import expected, float64, outputs
from kp.judge.reference import Reference
from kp.lib import numerics

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "judge_cases"


def _floats(ts):
    return [t for t in ts if isinstance(t, torch.Tensor) and t.is_floating_point()]


def test_half_precision_casts_inputs_weights_buffers_and_cases():
    """bf16/fp16: every floating input, init input, parameter and buffer (BatchNorm's running statistics included,
    as KernelBench's Model.to(dtype) casts them) in the dtype; integer buffers as they are; fp32 leaves all as is."""
    ref = Reference.load(("file", str(CASES / "batchnorm" / "ref.py"))).use_precision("bf16")
    assert {t.dtype for t in _floats(ref.inputs(3, "cpu"))} == {torch.bfloat16}
    m = ref.model(ref.init(), 3, "cpu")
    assert {t.dtype for t in _floats(list(m.parameters()) + list(m.buffers()))} == {torch.bfloat16}
    assert any(b.dtype == torch.int64 for b in m.buffers())  # num_batches_tracked
    stats = [b for n, b in m.named_buffers() if n.endswith("running_mean")]
    assert stats and all(b.dtype == torch.bfloat16 for b in stats)
    plain = Reference.load(("file", str(CASES / "batchnorm" / "ref.py"))).use_precision("fp32")
    assert {t.dtype for t in _floats(plain.inputs(3, "cpu"))} == {torch.float32}
    assert {p.dtype for p in plain.model(plain.init(), 3, "cpu").parameters()} == {torch.float32}
    sm = Reference.load(("problem", "softmax")).use_precision("fp16")
    _, xs = sm.case("odd_cols", 1, "cpu")
    assert xs[0].dtype == torch.float16
    fp = sm.footprint("cpu")  # the plan's bytes are the dtype's
    assert fp["inputs"] == 4096 * 393216 * 2


def test_half_precision_budget_floor_and_fairness():
    """The budget's floor in a 16-bit dtype is one rounding of the output (u), with fp32's accumulation term (PyTorch
    accumulates half-precision GEMMs and reductions in fp32); PyTorch counts as fair on a derived input up to 16 u."""
    assert numerics.unit_roundoff(torch.bfloat16) == 2.0**-8 and numerics.unit_roundoff(torch.float16) == 2.0**-11
    assert numerics.dtype_floor(torch.float32) == numerics.ABS_FLOOR == numerics.dtype_floor(torch.int64)
    assert outputs.torch_fair_max(torch.int64) == outputs.TORCH_FAIR_MAX  # an index output (argmax)
    assert numerics.accumulation_floor(1, torch.bfloat16) == 2.0**-8
    assert numerics.accumulation_floor(2**30, torch.float16) == pytest.approx(2 * 2.0**-24 * 2**15)
    assert numerics.accumulation_floor(4096, torch.float32) == numerics.accumulation_floor(4096)
    b = numerics.budget_from(numerics.Err(5e-4, 2e-3, 0), 1, torch.bfloat16)
    assert b.rel_l2 == 2.0**-8 and b.worst_row == 8e-3
    assert outputs.torch_fair_max(torch.float32) == outputs.TORCH_FAIR_MAX
    assert outputs.torch_fair_max(torch.bfloat16) == 16 * 2.0**-8
    assert float64.fp32_only_budget(torch.float32) == float64.FP32_ONLY_BUDGET
    assert float64.fp32_only_budget(torch.bfloat16) == 2 * 2.0**-7
    from kp.judge.reference import UPDATE_SIZE, update_size  # a weight change stays far above the dtype's rounding

    assert update_size(torch.float32) == update_size(torch.float16) == UPDATE_SIZE
    assert update_size(torch.bfloat16) == 8 * 2.0**-8


def test_a_derived_input_beyond_the_dtypes_range_is_skipped_with_the_reason(tmp_path, cli):
    """x100 of values in the thousands overflows fp16 before any kernel runs: that call is skipped and says why, the
    others judged (the candidate accepted on five checked calls)."""
    d = CASES / "half" / "large_values"
    r = cli(
        "--ref",
        d / "ref.py",
        "--candidate",
        d / "fp32_inside_fp16.py",
        "--device",
        "cpu",
        "--seed",
        "11",
        "--allow-torch",
        "--precision",
        "fp16",
        "--json",
        tmp_path / "r.json",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rec = json.loads((tmp_path / "r.json").read_text())
    assert rec["precision"] == "fp16" and len(rec["rows"]["candidate"]["checks"]) == 5
    assert any(
        "scaled x100" in s and "overflows torch.float16 (its largest finite value is 65504)" in s
        for s in rec["skipped"]
    )


def test_the_float64_plan_counts_the_same_bytes_in_every_precision():
    """The float64 reference of a problem is the same size whichever dtype is judged: the plan widens a 16-bit
    footprint four times where it widens fp32's twice (on the host, beside a run of the judged dtype's own size)."""
    from kp.judge import plan

    fp32 = Reference.load(("problem", "softmax")).use_precision("fp32").footprint("cpu")
    bf16 = Reference.load(("problem", "softmax")).use_precision("bf16").footprint("cpu")
    assert bf16["inputs"] * 2 == fp32["inputs"] and (plan.widen(fp32), plan.widen(bf16)) == (2, 4)
    f64 = lambda fp: plan.float64_on_gpu(fp, 1, 1 << 50)[1].split(" GiB needed with the float64 forward's peak of ")[1]
    assert f64(fp32).split()[0] == f64(bf16).split()[0]
    host = lambda fp: float(plan.cpu_bench_refusal({**fp, "inputs": 0, "outputs": 0}, 1).split("about ")[1].split()[0])
    # the same float64 copy, half-size fp32 and candidate's runs: (2 + 4) x half the peak against (2 + 2) x the peak
    assert host(bf16) == pytest.approx(host(fp32) * 3 / 4, rel=0.05)
