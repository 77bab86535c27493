"""The three Linear problems: ModelNew mirrors Model (parameters, buffers, state_dict), the weight-derived caches
invalidate on every kind of weight change, BatchNorm's running statistics follow nn.BatchNorm1d, bad input is a
clear error. CPU parts run in CI; the GPU parts need the H200."""
import copy

import pytest
import torch
import torch.nn as nn

import harness
from conftest import gpu

LINEAR = ["matmul_gelu_softmax", "gemm_bn_scale_softmax", "matmul_sum_max_mean_lse"]
SMALL_INIT = {"matmul_gelu_softmax": [48, 40], "gemm_bn_scale_softmax": [48, 40, 1e-5, 0.1, (1,)],
              "matmul_sum_max_mean_lse": [48, 40]}


@pytest.mark.parametrize("problem", LINEAR)
def test_model_new_mirrors_model(problem):
    """Built after the same seed, ModelNew holds bit-identical parameters and buffers under the same keys, and
    state_dicts load both ways."""
    mod = harness.problem_module(problem)
    init = SMALL_INIT[problem]
    torch.manual_seed(7)
    ref = mod.Model(*init)
    torch.manual_seed(7)
    new = mod.ModelNew(*init)
    sr, sn = ref.state_dict(), new.state_dict()
    assert list(sr) == list(sn)
    for k in sr:
        assert torch.equal(sr[k], sn[k]), k
    assert new.training  # a fresh module is in training mode, as the reference
    new.load_state_dict(sr)
    ref.load_state_dict(new.state_dict())


def test_lse_reference_is_x_times_colsum_plus_bsum():
    """The identity the kernel relies on, in float64 on the CPU."""
    mod = harness.problem_module("matmul_sum_max_mean_lse")
    torch.manual_seed(0)
    m = mod.Model(64, 33).double()
    x = torch.rand(9, 64, dtype=torch.float64)
    direct = x @ m.linear.weight.sum(0) + m.linear.bias.sum()
    assert torch.allclose(m(x).squeeze(1), direct, rtol=1e-12, atol=1e-12)


class _Counted:
    def __init__(self):
        self.calls = 0

    def __call__(self, w, b):
        self.calls += 1
        return w.sum(0) + b.sum()


def _lin():
    torch.manual_seed(0)
    lin = nn.Linear(6, 5)
    f = _Counted()
    return lin, harness.DerivedCache(f), f


def test_derived_cache_hits_when_nothing_changed():
    lin, cache, f = _lin()
    v1 = cache(lin.weight, lin.bias)
    v2 = cache(lin.weight, lin.bias)
    assert f.calls == 1 and v1 is v2


@pytest.mark.parametrize("change", ["inplace_weight", "inplace_bias", "optimizer_step", "load_state_dict",
                                    "to_dtype_and_back", "replace_parameter", "copy_into"])
def test_derived_cache_invalidates(change):
    lin, cache, f = _lin()
    stale = cache(lin.weight, lin.bias).clone()
    if change == "inplace_weight":
        with torch.no_grad():
            lin.weight.mul_(2)
    elif change == "inplace_bias":
        with torch.no_grad():
            lin.bias.add_(1)
    elif change == "optimizer_step":
        opt = torch.optim.SGD(lin.parameters(), lr=0.5)
        for p in lin.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
    elif change == "load_state_dict":
        other = nn.Linear(6, 5)
        lin.load_state_dict(other.state_dict())
    elif change == "to_dtype_and_back":
        lin.double().float()
        with torch.no_grad():
            lin.weight.mul_(3)  # new storage after .to(); also prove the new storage is tracked
    elif change == "replace_parameter":
        lin.weight = nn.Parameter(torch.randn(5, 6))
    elif change == "copy_into":
        with torch.no_grad():
            lin.weight.copy_(torch.randn(5, 6))
    fresh = cache(lin.weight, lin.bias)
    assert f.calls == 2
    assert torch.allclose(fresh, lin.weight.sum(0) + lin.bias.sum())
    assert not torch.allclose(fresh, stale)


def test_derived_cache_deepcopy_starts_empty():
    lin, cache, f = _lin()
    cache(lin.weight, lin.bias)
    c2 = copy.deepcopy(cache)
    lin2 = copy.deepcopy(lin)
    c2(lin2.weight, lin2.bias)
    assert c2.misses == 1 and f.calls == 2  # the copy computed its own value instead of inheriting one


def test_ieee_fp32_restores_the_callers_setting():
    prev = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        with harness.ieee_fp32():
            assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


@pytest.mark.parametrize("problem", LINEAR)
def test_bad_input_is_value_error_on_cpu_side(problem):
    mod = harness.problem_module(problem)
    m = mod.ModelNew(*SMALL_INIT[problem])
    with pytest.raises(ValueError, match="CUDA"):
        m(torch.rand(4, 48))
    with pytest.raises(ValueError, match="float32"):
        m(torch.rand(4, 48, dtype=torch.float64))
    with pytest.raises(ValueError, match="2-D"):
        m(torch.rand(2, 4, 48))


# ------------------------------------------------------------------------------------------------ GPU

def _rel(a, b):
    return harness.rel_error(a, b)


@gpu
@pytest.mark.parametrize("problem", LINEAR)
def test_gpu_bad_input(problem):
    mod = harness.problem_module(problem)
    m = mod.ModelNew(*SMALL_INIT[problem]).cuda()
    with pytest.raises(ValueError, match="features"):
        m(torch.rand(4, 47, device="cuda"))
    with pytest.raises(ValueError, match="float32"):
        m(torch.rand(4, 48, device="cuda", dtype=torch.float16))
    if problem == "gemm_bn_scale_softmax":
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            m(torch.rand(1, 48, device="cuda"))
        m.eval()
        assert m(torch.rand(1, 48, device="cuda")).shape == (1, 40)  # eval mode takes a batch of one
    else:
        assert m(torch.rand(1, 48, device="cuda")).shape[0] == 1


@gpu
@pytest.mark.parametrize("problem", LINEAR)
def test_gpu_fp32_even_when_the_caller_enabled_tf32(problem):
    mod = harness.problem_module(problem)
    init = [256, 200] + SMALL_INIT[problem][2:]
    x = torch.rand(64, 256, device="cuda")
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        torch.manual_seed(3)
        new = mod.ModelNew(*init).cuda()
        out = new(x)
        assert torch.backends.cuda.matmul.allow_tf32 is True  # the caller's setting is left alone
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    torch.manual_seed(3)
    ref64 = mod.Model(*init).cuda().double()
    torch.manual_seed(3)
    ref32 = mod.Model(*init).cuda()
    r64, r32 = ref64(x.double()), ref32(x)
    assert _rel(out, r64).within(harness.budget_from(_rel(r32, r64)))


def _perturbed_bn_pair(momentum, n_in=96, n_out=72, seed=5):
    mod = harness.problem_module("gemm_bn_scale_softmax")
    init = [n_in, n_out, 1e-5, momentum, (1,)]
    torch.manual_seed(seed)
    ref = mod.Model(*init).cuda()
    with torch.no_grad():  # non-trivial gamma, beta, scale, running stats
        ref.bn.weight.uniform_(0.5, 1.5)
        ref.bn.bias.uniform_(-0.3, 0.3)
        ref.scale.fill_(1.7)
        ref.bn.running_mean.uniform_(-0.1, 0.1)
        ref.bn.running_var.uniform_(0.8, 1.2)
    new = mod.ModelNew(*init).cuda()
    new.load_state_dict(ref.state_dict())
    ref64 = copy.deepcopy(ref).double()
    return ref, ref64, new


@gpu
@pytest.mark.parametrize("momentum", [0.1, None])
def test_gpu_batchnorm_state_parity(momentum):
    """Several training-mode calls: outputs within budget and running stats / num_batches_tracked as the reference's;
    then eval mode uses them and updates nothing."""
    ref, ref64, new = _perturbed_bn_pair(momentum)
    g = torch.Generator().manual_seed(11)
    for step in range(4):
        x = torch.rand(33, 96, generator=g).cuda()
        out, r32, r64 = new(x), ref(x), ref64(x.double())
        assert _rel(out, r64).within(harness.budget_from(_rel(r32, r64))), step
        for name in ("running_mean", "running_var"):
            b_new, b_32, b_64 = (getattr(m.bn, name) for m in (new, ref, ref64))
            assert _rel(b_new, b_64).within(harness.budget_from(_rel(b_32, b_64))), (step, name)
        assert int(new.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked) == step + 1
    for m in (new, ref, ref64):
        m.eval()
    before = {k: v.clone() for k, v in new.state_dict().items()}
    x = torch.rand(5, 96, generator=g).cuda()
    out, r32, r64 = new(x), ref(x), ref64(x.double())
    assert _rel(out, r64).within(harness.budget_from(_rel(r32, r64)))
    for k, v in new.state_dict().items():
        assert torch.equal(v, before[k]), f"eval mode changed {k}"


def _lse_fresh(new, x):
    w, b = new.linear.weight.double(), new.linear.bias.double()
    return (x.double() @ w.sum(0) + b.sum()).unsqueeze(1)


@gpu
@pytest.mark.parametrize("change", ["inplace_weight", "inplace_bias", "optimizer_step", "load_state_dict",
                                    "cpu_then_cuda", "replace_parameter"])
def test_gpu_lse_cache_invalidation(change):
    mod = harness.problem_module("matmul_sum_max_mean_lse")
    torch.manual_seed(2)
    new = mod.ModelNew(256, 300).cuda()
    x = torch.rand(16, 256, device="cuda")
    stale = new(x).clone()
    # the second call is served from the cache (a different kernel, float64 sums in another order: ~1 ulp)
    assert torch.allclose(new(x), stale, rtol=1e-6, atol=0) and new.colsum.misses == 1
    lin = new.linear
    if change == "inplace_weight":
        with torch.no_grad():
            lin.weight[3, 7] += 5.0
    elif change == "inplace_bias":
        with torch.no_grad():
            lin.bias[0] -= 2.0
    elif change == "optimizer_step":
        opt = torch.optim.Adam(new.parameters(), lr=0.1)
        for p in new.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    elif change == "load_state_dict":
        torch.manual_seed(99)
        new.load_state_dict(mod.Model(256, 300).state_dict())
    elif change == "cpu_then_cuda":
        new.cpu()
        with torch.no_grad():
            new.linear.weight.mul_(-1)
        new.cuda()
    elif change == "replace_parameter":
        lin.weight = nn.Parameter(torch.rand(300, 256, device="cuda"))
    out = new(x)
    ref = _lse_fresh(new, x)
    assert harness.rel_error(out, ref).rel_l2 < 1e-6
    assert harness.rel_error(stale, ref).rel_l2 > 1e-4, "the change did not change the answer: test is void"
    assert new.colsum.misses == 2


@gpu
def test_gpu_lse_uncached_matches_cached():
    mod = harness.problem_module("matmul_sum_max_mean_lse")
    torch.manual_seed(4)
    a = mod.ModelNew(512, 640).cuda()
    b = mod.ModelNew(512, 640, cache=False).cuda()
    b.load_state_dict(a.state_dict())
    x = torch.rand(8, 512, device="cuda")
    first, again, uncached = a(x), a(x), b(x)
    assert torch.equal(first, uncached)  # the same fused kernel
    assert torch.allclose(again, uncached, rtol=1e-6, atol=0)  # the cached GEMV
    assert a.colsum.misses == 1 and b.colsum.misses == 0
