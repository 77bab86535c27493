"""Every .cu compiles with nvcc (no GPU needed) and its generated binding type-checks with g++."""
import shutil

import pytest

import harness

SOURCES = harness.kernel_sources()
IDS = [f"{p.parent.name}/{p.stem}" for p in SOURCES]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


@needs_nvcc
@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_nvcc_compiles(path, tmp_path):
    ok, log = harness.compile_check(path, tmp_path)
    assert ok, log[-4000:]


@pytest.mark.parametrize("path", SOURCES, ids=IDS)
def test_binding_compiles(path, tmp_path):
    ok, log = harness.binding_check(path, tmp_path)
    assert ok, log[-4000:]
