"""The filesystem is the registry: every models/<id>.py is a complete problem, every kernels/<id>/*.cu a variant."""
import inspect

import pytest
import torch

import harness

PROBLEMS = harness.problems()


def test_problems_and_kernel_dirs_match():
    dirs = sorted(p.name for p in harness.KERNELS.iterdir() if p.is_dir() and p.name != "common")
    assert dirs == PROBLEMS


@pytest.mark.parametrize("problem", PROBLEMS)
def test_problem_module_contract(problem):
    mod = harness.problem_module(problem)
    for name in ("Model", "ModelNew", "get_inputs", "get_init_inputs", "CASES", "traffic", "BOUND",
                 "DEFAULT_VARIANT"):
        assert hasattr(mod, name), f"models/{problem}.py lacks {name}"
    assert mod.BOUND in ("memory", "compute")
    # The default is a file variant or a policy the model resolves (rung()) to one.
    assert mod.DEFAULT_VARIANT in harness.variants(problem) or hasattr(mod.ModelNew, "rung")
    assert len(mod.CASES) >= 3
    assert "variant" in inspect.signature(mod.ModelNew).parameters
    # A fresh reference is in training mode, as KernelBench builds it.
    assert mod.Model(*mod.get_init_inputs()).training


@pytest.mark.parametrize("problem", PROBLEMS)
def test_every_variant_exports_and_has_header(problem):
    for v in harness.variants(problem):
        src = (harness.KERNELS / problem / f"{v}.cu").read_text()
        assert src.startswith("//"), f"{problem}/{v}.cu must open with its header comment"
        assert "Measured" in src.split("#include")[0], f"{problem}/{v}.cu header lacks its measured line"
        names = {e.name for e in harness.parse_exports(src, v)}
        assert names, v


@pytest.mark.parametrize("problem", PROBLEMS)
def test_cases_build_on_cpu(problem):
    mod = harness.problem_module(problem)
    for name, fn in mod.CASES.items():
        init, xs = fn(torch.Generator().manual_seed(0), "cpu")
        assert all(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in xs), name
        out = mod.Model(*init)(*xs)  # the reference runs on every declared case
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float32


def test_unknown_problem_and_variant_raise_usage_error():
    with pytest.raises(harness.UsageError, match="problems:"):
        harness.problem_module("nope")
    with pytest.raises(harness.UsageError, match="variants:"):
        harness.Kernel("softmax", "nope")
    from models.softmax import ModelNew
    with pytest.raises(harness.UsageError, match="variants:"):
        ModelNew(variant="nope")  # at construction, not as a KeyError on the first call


def test_softmax_reference_semantics():
    mod = harness.problem_module("softmax")
    x = torch.randn(5, 7, dtype=torch.float64)
    y = mod.Model()(x)
    assert torch.allclose(y, torch.exp(x) / torch.exp(x).sum(1, keepdim=True), rtol=1e-12, atol=0)
    assert mod.traffic(torch.empty(4096, 393216, device="meta"))["bytes"] == 2 * 4096 * 393216 * 4
