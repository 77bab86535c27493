"""checker.py (run.py --candidate): host-side logic in CI; on the GPU every known-wrong candidate in tests/wrong/
is rejected for its stated reason and every shipped variant, wrapped as a candidate file outside the repo, is
accepted."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import checker
import harness
from conftest import HAS_GPU, gpu

WRONG = sorted((harness.ROOT / "tests" / "wrong").glob("*.py"))


def meta(path: Path) -> dict:
    """PROBLEM / EXPECT / DEVICES of a wrong case, read without importing it into the test process."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("PROBLEM", "EXPECT", "DEVICES"):
                out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


def run(*args):
    return subprocess.run([sys.executable, "run.py", *args], cwd=harness.ROOT, capture_output=True, text=True)


# ---------------------------------------------------------------------------------------------------------------
# Host-side logic (CI).

def test_every_wrong_case_declares_problem_reason_and_devices():
    assert len(WRONG) >= 8
    for p in WRONG:
        m = meta(p)
        assert m.get("PROBLEM") in harness.problems(), p.name
        re.compile(m["EXPECT"])
        assert set(m["DEVICES"]) <= {"cuda", "cpu"} and m["DEVICES"], p.name


def test_trial_seeds_replay():
    assert checker.trial_seeds(7, 3) == checker.trial_seeds(7, 3) == [7, 8, 9]
    assert checker.trial_seeds(2**32 - 1, 2) == [2**32 - 1, 0]
    mod = harness.problem_module("softmax")
    a = harness.case_inputs(mod, "odd_cols", 5, "cpu")[1][0]
    b = harness.case_inputs(mod, "odd_cols", 5, "cpu")[1][0]
    c = harness.case_inputs(mod, "odd_cols", 6, "cpu")[1][0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_same_values():
    a = torch.tensor([1.0, float("nan"), 0.0])
    assert checker.same_values(a, a.clone())
    assert not checker.same_values(a, torch.tensor([1.0, float("nan"), -0.0]))  # sign of zero counts
    assert not checker.same_values(a, torch.tensor([1.0, 2.0, 0.0]))
    assert not checker.same_values(a, a.double())
    base = torch.arange(10.0)
    v1, v2 = base[2:5], base.clone()[2:5]
    v2._base[0] = 99  # outside the view: not compared
    assert checker.same_values(v1, v2)


def test_kernel_base_name():
    f = checker.kernel_base_name
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
    assert checker.window_violations(inside, "mark") == ([], (10, 120))
    late = [ev("mark", 0, 10), ev("side", 12, 200, s=9), ev("mark", 20, 10)]
    bad, w = checker.window_violations(late, "mark")
    assert [b["name"] for b in bad] == ["side"] and w == (10, 20)
    assert checker.window_violations([ev("k", 0, 1)], "mark")[1] is None  # no markers: caller rejects


def test_host_clock_escape_rule():
    honest = [(3.45, 3.40, 0.05)] * 5  # wall = events + sync latency
    hidden = [(3.45, 0.01, 0.05)] * 5  # the events saw nothing: the work ran elsewhere
    slow_host = [(0.30, 0.02, 0.28)] * 5  # enqueue-bound call: wall follows the host, not an escape
    assert checker.host_clock_excess_ms(honest) < checker.escape_threshold_ms(3.40)
    assert checker.host_clock_excess_ms(hidden) > checker.escape_threshold_ms(0.01)
    assert checker.host_clock_excess_ms(slow_host) < checker.escape_threshold_ms(0.02)


def test_budget_reason_is_one_line():
    e = harness.Err(0.5, 0.9, 0)
    b = harness.budget_from(harness.Err(1e-8, 2e-8, 0))
    r = checker.budget_reason("trial 1 (seed 3)", e, b)
    assert "\n" not in r and "over budget 1.00e-06" in r and "trial 1 (seed 3)" in r
    assert "NaN/Inf positions differ" in checker.budget_reason("x", harness.Err(0, 0, 5), b)


def test_fingerprint_sees_a_patched_torch_function():
    before = checker.namespace_fingerprint()
    orig = torch.softmax
    try:
        torch.softmax = lambda *a, **k: orig(*a, **k)
        assert "torch.softmax" in checker.fingerprint_changes(before)
    finally:
        torch.softmax = orig
    assert checker.fingerprint_changes(before) == []


@pytest.mark.parametrize("path", [p for p in WRONG if "cpu" in meta(p)["DEVICES"]], ids=lambda p: p.stem)
def test_wrong_case_rejected_on_cpu(path):
    m = meta(path)
    rec = checker.evaluate(m["PROBLEM"], path, seed=1234, device="cpu")
    assert not rec["accepted"], f"{path.name} was accepted"
    assert re.search(m["EXPECT"], rec["reason"]), f"{path.name}: {rec['reason']}"
    assert "\n" not in rec["reason"]


def test_honest_torch_candidate_accepted_on_cpu():
    rec = checker.evaluate("softmax", harness.ROOT / "tests" / "wrong" / "torch_only.py", seed=5, device="cpu")
    assert rec["accepted"], rec["reason"]
    assert len(rec["checks"]) == 3 * len(harness.problem_module("softmax").CASES)
    assert all(c["rel_l2"] <= c["budget"] for c in rec["checks"].values())


def test_cli_candidate_usage_errors(tmp_path):
    assert run("--problem", "softmax", "--candidate", str(tmp_path / "missing.py")).returncode == 2
    f = harness.ROOT / "tests" / "wrong" / "zeros.py"
    for extra in (["--trials", "2"], ["--precision", "bf17"], ["--variant", "2_online"], ["--device", "tpu"]):
        r = run("--problem", "softmax", "--candidate", str(f), "--device", "cpu", *extra) if extra[0] != "--device" \
            else run("--problem", "softmax", "--candidate", str(f), *extra)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (extra, r.stderr)


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_cli_candidate_without_gpu_is_usage_error():
    r = run("--problem", "softmax", "--candidate", str(harness.ROOT / "tests" / "wrong" / "zeros.py"))
    assert r.returncode == 2 and "--device cpu" in r.stderr and "Traceback" not in r.stderr


def test_cli_candidate_cpu_verdicts_and_seed_replay(tmp_path):
    r = run("--problem", "softmax", "--candidate", str(harness.ROOT / "tests" / "wrong" / "zeros.py"),
            "--device", "cpu", "--seed", "77", "--json", str(tmp_path / "rec.json"))
    assert r.returncode == 1, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("rejected: case ")
    assert "seed 77" in r.stderr and "replay with --seed 77" in r.stderr
    import json
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert rec["trial_seeds"] == [77, 78, 79] and rec["accepted"] is False
    outside = tmp_path / "my_softmax.py"  # a candidate outside the repo
    outside.write_text((harness.ROOT / "tests" / "wrong" / "torch_only.py").read_text())
    r = run("--problem", "softmax", "--candidate", str(outside), "--device", "cpu", "--seed", "77")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "accepted"


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


@gpu
@pytest.mark.parametrize("path", [p for p in WRONG if "cuda" in meta(p)["DEVICES"]], ids=lambda p: p.stem)
def test_wrong_case_rejected_on_gpu(path):
    m = meta(path)
    rec = checker.evaluate(m["PROBLEM"], path, bench=False)
    assert not rec["accepted"], f"{path.name} was accepted"
    assert re.search(m["EXPECT"], rec["reason"]), f"{path.name}: {rec['reason']}"


def _shipped():
    out = []
    for p in harness.problems():
        mod = harness.problem_module(p)
        vs = harness.variants(p) + ([mod.DEFAULT_VARIANT] if mod.DEFAULT_VARIANT not in harness.variants(p) else [])
        out += [(p, label, v, opts) for label, v, opts in harness.row_specs(mod, vs)]
    return out


@gpu
@pytest.mark.parametrize("problem,label,variant,opts", _shipped(), ids=lambda x: str(x))
def test_shipped_variant_accepted(tmp_path, problem, label, variant, opts):
    rec = checker.evaluate(problem, shipped_candidate(tmp_path, problem, variant, opts), bench=False)
    assert rec["accepted"], rec["reason"]
    assert rec["own_kernels"], rec.get("kernels")
    assert rec["weights"] == "state_dict"


@gpu
def test_cli_candidate_outside_repo_accepted(tmp_path):
    f = shipped_candidate(tmp_path, "softmax", "auto", {})
    r = run("--problem", "softmax", "--candidate", str(f), "--no-compile", "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "accepted"
    assert "candidate" in r.stdout and "own kernels:" in r.stdout


@gpu
def test_nan_fill_makes_unwritten_memory_nan():
    a = torch.randn(1 << 22, device="cuda")
    del a
    checker.nan_fill_cached_free(0)
    b = torch.empty(1 << 22, device="cuda")
    assert bool(torch.isnan(b).all())


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
