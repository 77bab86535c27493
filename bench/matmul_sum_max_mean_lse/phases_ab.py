"""6_phases's configurations against 4_overlap at matmul_sum_max_mean_lse's benchmark shape (1024x8192 @ 8192x8192): P
column phases per tile and XU x rows per W block, each also without any x work (a floor for that way of reading W: wrong
output), with P = 1 also the shared memory for x, where its copy is issued and whether the x rows beyond it are loaded
before the tail's reduction; the two rungs through ModelNew (cache off, as run.py times them) and a plain read of W then
x by the bw probe as the read ceiling; GPU time per call, L2 read-flushed, interleaved
(kp.lib.timing.bench_interleaved). First every configuration's output and column sums are checked against float64 on the
bench operands and on the problem's declared odd cases; last, per-phase globaltimer traces.

  python -m bench.matmul_sum_max_mean_lse.phases_ab
"""

import torch

import harness
import models.matmul_sum_max_mean_lse as lse
from bench.matmul_sum_max_mean_lse.operands import bench_operands, forward_args

CFGS = {
    0: "P1 XU4",
    1: "P2 XU2",
    2: "P2 XU4",
    3: "P4 XU2",
    4: "P4 XU4",
    5: "P1, x smem 192K",
    6: "P1, x smem 192K, early rows",
    7: "P1, x smem 192K, early rows, copy at half",
    8: "P1, early rows",
}
FLOORS = {10: "P1, no x", 12: "P2, no x", 14: "P4, no x"}


def errors(args):
    """Worst relative error of the output (per row) and of the column sums, against float64."""
    w, b, x, _, v, bsum, out = args
    colsum = w.double().sum(0)
    ref = x.double() @ colsum + (b.double().sum() if b.numel() else 0.0)
    e_out = ((out.double().squeeze(1) - ref).abs() / ref.abs().clamp_min(1e-300)).max().item() if x.size(0) else 0.0
    e_v = ((v - colsum).abs().max() / colsum.abs().max().clamp_min(1e-300)).item() if w.size(1) else 0.0
    return e_out, e_v


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    ops = bench_operands()
    k6 = harness.Kernel("matmul_sum_max_mean_lse", "6_phases", experiments=True)
    k4 = harness.Kernel("matmul_sum_max_mean_lse", "4_overlap")
    bw = harness.build_path(harness.PROBES / "bw.cu").ops
    notrace = torch.empty(0, dtype=torch.int64, device="cuda")
    a = ops.args
    # Parity: every configuration with x work, the shipped export, on the bench operands and the declared cases.
    bad, worst = [], {}
    g = torch.Generator().manual_seed(1)
    cases = [("bench", a)]
    for name, make in lse.CASES.items():
        init, (xc,) = make(g, "cuda")
        lin = torch.nn.Linear(*init).cuda()
        xc = xc if xc.stride(-1) == 1 or xc.size(1) <= 1 else xc.contiguous()
        cases.append((name, forward_args(lin.weight.detach(), lin.bias.detach(), xc, ops.nsm)))
    calls = {f"6_phases {n}": (lambda c: lambda args: k6.tune_forward(*args, c, notrace))(c) for c, n in CFGS.items()}
    calls["6_phases (export)"] = lambda args: k6.colsum_gemv_forward(*args)
    calls["4_overlap (export)"] = lambda args: k4.colsum_gemv_forward(*args)
    for cname, args in cases:
        for k, f in calls.items():
            args[6].fill_(float("nan"))
            args[4].fill_(float("nan"))
            f(args)
            e_out, e_v = errors(args)
            worst[k] = max(worst.get(k, 0.0), e_out)
            if not (e_out < 1e-6 and e_v < 1e-12):
                bad.append((k, cname, e_out, e_v))
    print("parity (worst per-row relative error over the bench operands and", len(cases) - 1, "cases):")
    for k, e in worst.items():
        print(f"  {k}: {e:.2e}")
    print("parity failures:", bad or "none")

    models = {}
    for var in ("4_overlap", "6_phases"):
        m = lse.ModelNew(ops.I, ops.O, variant=var, cache=False).cuda()
        m.load_state_dict(ops.lin.state_dict(prefix="linear."), strict=True)
        models[var] = m
    fns = {"4_overlap (export)": lambda: k4.colsum_gemv_forward(*a)}
    for c, n in {**CFGS, **FLOORS}.items():
        fns[f"6_phases {n}"] = lambda c=c: k6.tune_forward(*a, c, notrace)
    for var, m in models.items():
        fns[f"ModelNew {var} cache=False"] = lambda m=m: m(ops.x)
    fns["read W + x (bw probe)"] = lambda: (
        bw.probe_read(ops.w, ops.vb, ops.nsm, 8, True),
        bw.probe_read(ops.x, ops.vb, ops.nsm, 8, True),
    )
    with torch.no_grad():
        t = harness.bench_interleaved(fns, min_reps=20, max_reps=60, budget_s=60)
    nbytes = 4 * (ops.O * ops.I + ops.B * ops.I)
    read = t["read W + x (bw probe)"].median_ms
    print(f"\n{torch.cuda.get_device_name()}\n")
    print("| call | median us | IQR us | GB/s (288 MiB) | read / call |\n|---|---|---|---|---|")
    for k, v in t.items():
        print(
            f"| {k} | {1e3 * v.median_ms:.1f} | {1e3 * v.iqr_ms:.1f} | {nbytes / (v.median_ms * 1e-3) / 1e9:,.0f} | "
            f"{100 * read / v.median_ms:.1f}% |"
        )

    # Where the time goes: per-CTA globaltimer stamps (one L2-flushed call each).
    tiles = -(-ops.I // 64)
    trace = torch.zeros(tiles, 8, dtype=torch.int64, device="cuda")
    flush = harness.L2Flusher()
    ph = ["phase 0 read", "later phases' read", "tail reduction", "smem dots", "DRAM rows"]
    print("\n| config | " + " | ".join(ph) + " | first start -> last end |\n" + "|---" * (len(ph) + 2) + "|")
    for c, n in {**CFGS, **FLOORS}.items():
        trace.zero_()
        flush()
        torch.cuda._sleep(harness.HOLD_CYCLES)
        k6.tune_forward(*a, c, trace)
        torch.cuda.synchronize()
        tr = trace[:, :6].double() / 1e3
        ends = tr[:, 5] if c < 10 else tr[:, 3]
        d = tr[:, 1:] - tr[:, :-1]
        cells = [f"{d[:, j].median():.1f} (max {d[:, j].max():.1f})" if (c < 10 or j < 3) else "-" for j in range(5)]
        print(f"| {n} | " + " | ".join(cells) + f" | {(ends.max() - tr[:, 0].min()):.1f} |")
    print("(us; median over CTAs, max in brackets)")


if __name__ == "__main__":
    main()
