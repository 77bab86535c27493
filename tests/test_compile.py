"""Every .cu compiles with nvcc for every architecture it claims (its `// Requires:` line: a portable rung for
sm_80, sm_89 and sm_90a, a Hopper-only one for sm_90a), and its generated binding type-checks with g++. No GPU."""
import shutil

import pytest

import harness

SOURCES = harness.kernel_sources()
IDS = [f"{p.parent.name}/{p.stem}" for p in SOURCES]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc on PATH (the CUDA toolkit)")


@needs_nvcc
@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_nvcc_compiles_for_claimed_archs(path, tmp_path):
    archs = harness.read_rung(path).claimed_archs()
    ok, log = harness.compile_check(path, tmp_path, archs)
    assert ok, f"{' '.join(archs)}:\n{log[-4000:]}"


@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_binding_compiles(path, tmp_path):
    ok, log = harness.binding_check(path, tmp_path)
    assert ok, log[-4000:]
