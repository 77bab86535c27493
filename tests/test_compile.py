"""Every .cu compiles with nvcc for every architecture it claims (its `// Requires:` line: a portable rung for
sm_80, sm_89 and sm_90a, a Hopper-only one for sm_90a), and its generated binding type-checks with g++. No GPU."""

import functools
import shutil
import tempfile
from pathlib import Path

import pytest

import harness

SOURCES = harness.kernel_sources()
IDS = [f"{p.parent.name}/{p.stem}" for p in SOURCES]
# Sources with A/B hooks (`#if KP_EXPERIMENTS`, in the file or a header): the bench scripts build them with the hooks
# in, a build no GPU-less check would otherwise see.
AB_SOURCES = [p for p in SOURCES if harness.has_experiments(p)]
AB_IDS = [f"{p.parent.name}/{p.stem}" for p in AB_SOURCES]
# The judge cases' candidates build their own .cu with load_inline, on the GPU only: compiled here as load_inline
# compiles them (its prelude, then the file), so a case that would fail to build fails here, not as a wrong verdict.
CASE_SOURCES = sorted((Path(__file__).parent / "judge_cases").rglob("*.cu"))
CASE_IDS = [str(p.relative_to(Path(__file__).parent / "judge_cases")) for p in CASE_SOURCES]
LOAD_INLINE_PRELUDE = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc on PATH (the CUDA toolkit)")


@needs_nvcc
@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_nvcc_compiles_for_claimed_archs(path, tmp_path):
    archs = harness.read_rung(path).claimed_archs()
    ok, log = harness.compile_check(path, tmp_path, archs)
    assert ok, f"{' '.join(archs)}:\n{log[-4000:]}"


@needs_nvcc
@pytest.mark.parametrize("path", AB_SOURCES, ids=AB_IDS)
def test_nvcc_compiles_with_ab_hooks(path, tmp_path):
    """The bench scripts' build (KP_EXPERIMENTS=1) for the newest architecture the source claims, the GPU they run on;
    device side only, unoptimised: the hooks are parsed, type-checked (host wrappers included) and assembled for that
    target; the shipped build's host pass is the test above's, and the bench scripts build the hooks optimised on
    the GPU, where they run."""
    arch = harness.read_rung(path).claimed_archs()[-1]
    ok, log = harness.compile_check(path, tmp_path, [arch], experiments=True, optimise=False, host=False)
    assert ok, f"{arch} with KP_EXPERIMENTS=1:\n{log[-4000:]}"


def test_ab_hook_bindings_compile(tmp_path):
    res = harness.binding_check_many(AB_SOURCES, tmp_path, experiments=True)
    bad = {f"{p.parent.name}/{p.stem}": log[-2000:] for p, (ok, log) in res.items() if not ok}
    assert AB_SOURCES and not bad, bad


@needs_nvcc
@pytest.mark.parametrize("path", CASE_SOURCES, ids=CASE_IDS)
def test_judge_case_sources_compile(path, tmp_path):
    src = tmp_path / path.name
    src.write_text(LOAD_INLINE_PRELUDE + path.read_text())
    ok, log = harness.compile_check(src, tmp_path, ["sm_90a"])
    assert ok, log[-4000:]


@functools.lru_cache(maxsize=None)
def _bindings():
    """Every source's generated binding through g++ once per test process (the torch headers parsed once)."""
    return harness.binding_check_many(SOURCES, Path(tempfile.mkdtemp(prefix="kp_bindings_")))


@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_binding_compiles(path):
    ok, log = _bindings()[path]
    assert ok, log[-4000:]


def test_binding_check_names_the_bad_source(tmp_path):
    good, bad = tmp_path / "1_good.cu", tmp_path / "2_bad.cu"
    good.write_text("KP_EXPORT void f(const at::TensorBase& x, int64_t n) {}\n")
    bad.write_text("KP_EXPORT void g(const at::TensorBase& x, bool b) {}\n")
    (tmp_path / "out").mkdir()
    res = harness.binding_check_many([good, bad], tmp_path / "out")
    assert res[good][0] and res[bad][0]
    bad.write_text("KP_EXPORT void g(const at::TensorBase& x, float* p) {}\n")
    res = harness.binding_check_many([good, bad], tmp_path / "out")
    assert res[good][0] and not res[bad][0] and "unsupported parameter" in res[bad][1]


@needs_nvcc
def test_device_only_check_still_sees_host_code(tmp_path):
    """The device-only check the A/B hooks get: a launch wrapper's error fails it, as it fails the full build."""
    src = tmp_path / "1_bad_host.cu"
    src.write_text(
        "__global__ void k(float* x) { x[threadIdx.x] = 1.f; }\n"
        "void launch(float* x) { int y = no_such_name; k<<<1, 32>>>(x); }\n"
    )
    ok, log = harness.compile_check(src, tmp_path, ["sm_90a"], optimise=False, host=False)
    assert not ok and "no_such_name" in log, log[-2000:]
