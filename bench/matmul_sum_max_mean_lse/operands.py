"""The benchmark operands and buffers that bench/matmul_sum_max_mean_lse/ab.py, flush_ab.py and phases_ab.py share: the
Linear at the problem's bench shape (1024x8192 @ 8192x8192, seeded), x, the float64 reference x @ W.sum(0) + b.sum(),
and the v / bsum / scratch / out buffers a rung's colsum_gemv_forward takes, sized as ModelNew sizes them."""

from types import SimpleNamespace

import torch

import models.matmul_sum_max_mean_lse as lse_model


def buffers(w, x, nsm: int):
    """The float64 v + bsum buffer (one of I + 1), the scratch and the output a rung's colsum_gemv_forward takes,
    sized as ModelNew sizes them."""
    f64 = dict(device=w.device, dtype=torch.float64)
    vb = torch.empty(w.size(1) + 1, **f64)
    part = torch.empty(lse_model.scratch_doubles(*x.shape, nsm), **f64)
    return vb, part, torch.empty(x.size(0), 1, device=w.device)


def forward_args(w, b, x, nsm: int) -> tuple:
    """(w, b, x, partial, v, bsum, out) for a rung's colsum_gemv_forward."""
    vb, part, out = buffers(w, x, nsm)
    return (w, b, x, part, vb[:-1], vb[-1:], out)


def bench_operands(seed: int = 0) -> SimpleNamespace:
    torch.manual_seed(seed)
    B, I, O = 1024, 8192, 8192
    lin = torch.nn.Linear(I, O).cuda()
    w, b = lin.weight.detach(), lin.bias.detach()
    x = torch.rand(B, I, device="cuda")
    ref = (x.double() @ w.double().sum(0) + b.double().sum()).unsqueeze(1)
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    vb, part, out = buffers(w, x, nsm)
    return SimpleNamespace(
        B=B,
        I=I,
        O=O,
        lin=lin,
        w=w,
        b=b,
        x=x,
        ref=ref,
        nsm=nsm,
        f64=dict(device="cuda", dtype=torch.float64),
        vb=vb,
        part=part,
        out=out,
        args=(w, b, x, part, vb[:-1], vb[-1:], out),
    )
