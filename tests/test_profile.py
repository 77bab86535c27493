"""run.py --profile: one call of each row under PyTorch's profiler, grouped by kernel (on the CPU: by operator),
in the process that holds the row (a candidate's own boxed worker)."""

import json

import pytest

from conftest import ROOT
from kp.observe import profile

REF, GOOD = ROOT / "tests" / "batch" / "ref.py", ROOT / "tests" / "batch" / "good.py"

# The shape of a Chrome trace as torch.profiler exports it for a CUDA call (names shortened): CPU-side events
# (cat cpu_op, cuda_runtime) are not GPU work and must be left out; kernels, copies and sets are kept.
TRACE = {
    "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::softmax", "ts": 100.0, "dur": 30.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 101.0, "dur": 5.0},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "void softmax_kernel<float>(float*, float const*, int)",
            "ts": 120.0,
            "dur": 300.0,
            "args": {"stream": 7},
        },
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 110.0, "dur": 2.0, "args": {"stream": 7}},
        {
            "ph": "X",
            "cat": "Kernel",
            "name": "void softmax_kernel<float>(float*, float const*, int)",
            "ts": 430.0,
            "dur": 100.0,
            "args": {"stream": 7},
        },
        {"ph": "i", "cat": "kernel", "name": "an instant, not an activity", "ts": 500.0},
    ]
}


def test_trace_keeps_gpu_activities_in_time_order():
    ev = profile.trace_events(TRACE)
    assert [(e["kind"], e["dur"]) for e in ev] == [("memset", 2.0), ("kernel", 300.0), ("kernel", 100.0)]
    assert all(e["stream"] == 7 for e in ev)


def test_summary_groups_by_name_longest_first():
    s = profile.summarize(profile.trace_events(TRACE))
    assert s["total_us"] == 402.0
    top = s["items"][0]
    assert top["count"] == 2 and top["us"] == 400.0 and top["share"] == pytest.approx(400 / 402)
    assert sum(i["share"] for i in s["items"]) == pytest.approx(1.0)
    lines = profile.format_profile({"eager": s})
    assert lines[0] == "  profile eager: 2 distinct, 3 launched, 0.402 ms GPU" and "softmax_kernel" in lines[1]


def test_cli_profile_on_cpu(cli, tmp_path):
    out = tmp_path / "rec.json"
    r = cli("--ref", REF, "--candidate", GOOD, "--device", "cpu", "--allow-torch", "--profile", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "profile candidate:" in r.stdout and "clamp_min" in r.stdout, r.stdout
    rec = json.loads(out.read_text())
    items = rec["profile"]["candidate"]["items"]
    assert items and all(i["kind"] == "cpu op" for i in items)
    assert any("clamp_min" in i["name"] for i in items)
