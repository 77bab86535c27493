"""A/B of the cuBLAS fp32 call behind the Linear problems: F.linear (what the reference runs) vs mm / addmm on a
contiguous W^T (what ModelNew runs): time (L2 flushed, interleaved) and relL2 of y vs float64, at the benchmark shape
and on the large-values case of matmul_gelu_softmax."""

import torch
import torch.nn.functional as F

import harness

torch.backends.cuda.matmul.allow_tf32 = False
for name, (m, k, n, scale) in {"bench": (1024, 8192, 8192, 1.0), "large_values": (8, 256, 512, 40.0)}.items():
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n).cuda()
    x = (torch.randn(m, k, device="cuda") * scale) if scale != 1.0 else torch.rand(m, k, device="cuda")
    w, b = lin.weight.detach(), lin.bias.detach()
    wt = w.t().contiguous()
    fns = {
        "F.linear": lambda: F.linear(x, w, b),
        "mm(x,Wt)+b": lambda: torch.mm(x, wt) + b,
        "addmm(b,x,Wt)": lambda: torch.addmm(b, x, wt),
        "mm(x,Wt)": lambda: torch.mm(x, wt),
    }
    ref = F.linear(x.double(), w.double(), b.double())
    for k_, f in fns.items():
        if k_ == "mm(x,Wt)":
            continue
        y = f()
        e = harness.rel_error(y, ref)
        zs = torch.softmax(F.gelu(y), 1)
        ez = harness.rel_error(zs, torch.softmax(F.gelu(ref), 1))
        print(
            f"{name} {k_:14s} y relL2 {e.rel_l2:.2e} worst row {e.worst_row:.2e} | "
            f"gelu+softmax relL2 {ez.rel_l2:.2e} worst row {ez.worst_row:.2e} | "
            f"equal to F.linear: {torch.equal(y, F.linear(x, w, b))}"
        )
    if name == "bench":
        t = harness.bench_interleaved(fns, min_reps=10, max_reps=30, budget_s=15)
        for k_, v in t.items():
            print(f"  {k_:14s} {v.median_ms:.3f} ms (IQR {v.iqr_ms:.3f})")
