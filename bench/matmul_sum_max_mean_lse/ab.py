"""A/B for matmul_sum_max_mean_lse's kernels at the benchmark shape (1024x8192 @ 8192x8192): the tile/unroll
configurations of 2_inflight (tune_forward / tune_gemv), 3_rowband's layouts and 4_overlap's options (prefetch point,
float64 vs fp32 lane sums, grid barrier vs `finish`, dynamic W chunks) next to 1_colsum_gemv, the same kernels through
ModelNew (cache off), a plain read of W and x by the bw probe and torch reductions as read-bandwidth references; GPU
time per call, L2 read-flushed, interleaved (harness.bench_interleaved); then per-phase globaltimer traces of
3_rowband and 4_overlap. Also times a float64 GEMM (cuBLAS DGEMM) against the fp32 one at the Linear problems' shape.

  --no-gemm         skip the DGEMM/SGEMM part
  --with-eager      interleave the reference Model's 2.7 ms fp32 GEMM too (as run.py's table does)
  --rowband-model   ModelNew rows 2_inflight, 3_rowband, 4_overlap (run.py's order); --rowband-first: 3_rowband first
  --placement       only: 2_inflight / 4_overlap / the plain read on six fresh copies of W
  --ncu             one call of each kernel, for `ncu --kernel-name regex:...`
"""

import sys

import torch

import harness

torch.backends.cuda.matmul.allow_tf32 = False
from bench.matmul_sum_max_mean_lse.operands import bench_operands

ops = bench_operands()
B, I, O, nsm = ops.B, ops.I, ops.O, ops.nsm
lin, w, b, x, ref, vb, part, out = ops.lin, ops.w, ops.b, ops.x, ops.ref, ops.vb, ops.part, ops.out
k1, k2 = (harness.Kernel("matmul_sum_max_mean_lse", v, experiments=True) for v in ("1_colsum_gemv", "2_inflight"))
k3 = harness.Kernel("matmul_sum_max_mean_lse", "3_rowband", experiments=True)
k4 = harness.Kernel("matmul_sum_max_mean_lse", "4_overlap", experiments=True)
kp = harness.build_path(harness.PROBES / "bw.cu").ops
PFS = (0.0, 0.25, 0.5, 0.75)
notrace = torch.empty(0, dtype=torch.int64, device="cuda")
fns = {"1_colsum_gemv fwd": lambda: k1.colsum_gemv_forward(w, b, x, part, vb[:-1], vb[-1:], out)}
for cfg, name in enumerate(
    [
        "TC64 XU1",
        "TC64 XU4",
        "TC64 XU8",
        "TC32 XU8",
        "TC32 XU16",
        "TC64 XU8 L2::256B",
        "TC64 XU8 L2::256B CU16",
        "TC32 XU8 L2::256B",
    ]
):
    fns[f"fwd {name}"] = lambda cfg=cfg: k2.tune_forward(w, b, x, part, vb[:-1], vb[-1:], out, cfg)
for cfg, name in enumerate(["band", "interleaved", "band no-prefetch"]):
    fns[f"fwd 3_rowband {name}"] = lambda cfg=cfg: k3.tune_forward(w, b, x, part, vb[:-1], vb[-1:], out, cfg, notrace)
CFG4 = {
    0: "fp32 lane sums",
    1: "float64, grid barrier",
    2: "float64",
    3: "float64, dynamic W chunks",
    4: "float64, dynamic W chunks, grid barrier",
    5: "fp32 lane sums, dynamic W chunks",
}
for pf in PFS:
    for cfg, nm in CFG4.items():
        if pf == 0.5 or cfg == 3:  # every configuration at the chosen point, the default one at each
            fns[f"fwd 4_overlap pf {pf} {nm}"] = lambda pf=pf, cfg=cfg: k4.tune_forward(
                w, b, x, part, vb[:-1], vb[-1:], out, pf, cfg, notrace
            )
fns["fwd ceiling: bw probe read of W then x"] = lambda: (
    kp.probe_read(w, vb, nsm, 8, True),
    kp.probe_read(x, vb, nsm, 8, True),
)
fns["1 gemv (GR1)"] = lambda: k1.gemv_bias(x, vb[:-1], vb[-1:], out)
for cfg, name in enumerate(["GR1 GU2", "GR1 GU4", "GR2 GU2", "GR4 GU2", "GR2 GU4", "GR4 GU1"]):
    fns[f"gemv {name}"] = lambda cfg=cfg: k2.tune_gemv(x, vb[:-1], vb[-1:], out, cfg)
# The same kernels through ModelNew (cache off), as run.py times them
import models.matmul_sum_max_mean_lse as lse_model

MODEL_VARIANTS = ("2_inflight", "4_overlap")
if "--rowband-model" in sys.argv:  # run.py's table order: 3_rowband right before 4_overlap
    MODEL_VARIANTS = ("2_inflight", "3_rowband", "4_overlap")
if "--rowband-first" in sys.argv:
    MODEL_VARIANTS = ("3_rowband", "2_inflight", "4_overlap")
for var in MODEL_VARIANTS:
    mn = lse_model.ModelNew(I, O, variant=var, cache=False).cuda()
    mn.load_state_dict(lin.state_dict(prefix="linear."), strict=True)
    fns[f"fwd ModelNew {var} cache=False"] = lambda mn=mn: mn(x)
if "--with-eager" in sys.argv:  # run.py interleaves the 2.7 ms fp32 GEMM of the reference between these calls
    ref_model = lse_model.Model(I, O).cuda()
    fns["eager Model (fp32 GEMM)"] = lambda: ref_model(x)
if "--order" in sys.argv:
    fns = {}
if "--placement" in sys.argv:  # the same W copied to fresh allocations: does where W lives change the time?
    wcopies = [w.clone() for _ in range(6)]
    fns = {}
    for j, wc in enumerate(wcopies):
        fns[f"fwd 4_overlap W copy {j}"] = lambda wc=wc: k4.colsum_gemv_forward(wc, b, x, part, vb[:-1], vb[-1:], out)
        fns[f"fwd 2_inflight W copy {j}"] = lambda wc=wc: k2.colsum_gemv_forward(wc, b, x, part, vb[:-1], vb[-1:], out)
        fns[f"fwd ceiling read W copy {j}"] = lambda wc=wc: (
            kp.probe_read(wc, vb, nsm, 8, True),
            kp.probe_read(x, vb, nsm, 8, True),
        )
ws = torch.empty((), device="cuda")
fns["torch W.sum() (read 256 MiB)"] = lambda: torch.sum(w.view(-1), dim=0, out=ws)
fns["torch x.sum() (read 32 MiB)"] = lambda: torch.sum(x.view(-1), dim=0, out=ws)
if "--ncu" in sys.argv:  # one call each, for `ncu --kernel-name regex:...`
    k2.tune_forward(w, b, x, part, vb[:-1], vb[-1:], out, 6)
    k3.tune_forward(w, b, x, part, vb[:-1], vb[-1:], out, 0, notrace)
    k3.tune_forward(w, b, x, part, vb[:-1], vb[-1:], out, 2, notrace)
    kp.probe_read(w, vb, nsm, 8, True)
    torch.cuda.synchronize()
    sys.exit(0)
bad = []
for k, f in fns.items():
    if k.startswith("torch") or k.startswith("eager") or "ceiling" in k:
        continue
    if "ModelNew" in k:
        e = harness.rel_error(f(), ref).rel_l2
        if not e < 1e-6:
            bad.append((k, e))
        continue
    out.fill_(float("nan"))
    if "gemv" in k:
        k2.tune_forward(w, b, x, part, vb[:-1], vb[-1:], out, 2)  # valid v for the gemv rows
        out.fill_(float("nan"))
    f()
    e = harness.rel_error(out, ref).rel_l2
    if not e < 1e-6:
        bad.append((k, e))
t = harness.bench_interleaved(fns, min_reps=20, max_reps=60, budget_s=25)
nbytes = {
    "eager": 4 * (O * I + B * I),
    "fwd": 4 * (O * I + B * I),
    "1_c": 4 * (O * I + B * I),
    "gem": 4 * B * I,
    "1 g": 4 * B * I,
    "torch W": 4 * O * I,
    "torch x": 4 * B * I,
}
print("| call | median us | IQR us | GB/s (minimum bytes) |\n|---|---|---|---|")
for k, v in t.items():
    nb = next(n for p, n in nbytes.items() if k.startswith(p))
    print(f"| {k} | {1e3 * v.median_ms:.1f} | {1e3 * v.iqr_ms:.1f} | {nb / (v.median_ms * 1e-3) / 1e9:,.0f} |")
print("parity failures:", bad or "none")

# Where 3_rowband's time goes: per-CTA globaltimer stamps at its phase boundaries (one L2-flushed call per layout).
trace = torch.zeros(nsm, 8, dtype=torch.int64, device="cuda")
phases = ["W bands", "grid.sync 1", "v slice", "x dots", "grid.sync 2", "row sums"]
print(
    "\n| 3_rowband layout | " + " | ".join(phases) + " | first start -> last end |\n" + "|---" * (len(phases) + 2) + "|"
)
flush = harness.L2Flusher()
for cfg, name in enumerate(["band", "interleaved", "band no-prefetch"]):
    flush()
    k3.tune_forward(w, b, x, part, vb[:-1], vb[-1:], out, cfg, trace)
    torch.cuda.synchronize()
    tr = trace[:, :7].double() / 1e3  # us
    d = tr[:, 1:] - tr[:, :-1]
    cells = [f"{d[:, j].median():.1f} (max {d[:, j].max():.1f})" for j in range(len(phases))]
    print(f"| {name} | " + " | ".join(cells) + f" | {tr[:, 6].max() - tr[:, 0].min():.1f} |")
print(
    "(us; median over CTAs, max in brackets; the start spread is "
    f"{(tr[:, 0].max() - tr[:, 0].min()):.1f} us in the last call)"
)

# Where 4_overlap's time goes, per prefetch point.
tiles4 = -(-I // 64)
trace4 = torch.zeros(tiles4, 8, dtype=torch.int64, device="cuda")
ph4 = ["W (+x prefetch)", "column sum", "wait for x", "x dots (smem)", "x rows from DRAM", "grid barrier + rows"]
print(
    "\n| 4_overlap pf (float64, grid barrier) | "
    + " | ".join(ph4)
    + " | first start -> last end |\n"
    + "|---" * (len(ph4) + 2)
    + "|"
)
for pf in PFS:
    flush()
    k4.tune_forward(w, b, x, part, vb[:-1], vb[-1:], out, pf, 1, trace4)
    torch.cuda.synchronize()
    tr = trace4[:, [0, 1, 6, 2, 3, 4, 5]].double() / 1e3  # stamp 6: column sum done, before the wait for x
    d = tr[:, 1:] - tr[:, :-1]
    cells = [f"{d[:, j].median():.1f} (max {d[:, j].max():.1f})" for j in range(len(ph4))]
    print(f"| {pf} | " + " | ".join(cells) + f" | {tr[:, 6].max() - tr[:, 0].min():.1f} |")

# Does the call before change 4_overlap? Trace it right after each neighbour (flush + 1 ms hold in between, as in
# bench_interleaved) and report the SM clock it ran at (slot 7: cycles over stamps 0..4).
if "--order" in sys.argv:
    neighbours = {
        "itself": lambda: k4.tune_forward(w, b, x, part, vb[:-1], vb[-1:], out, 0.5, 2, notrace),
        "2_inflight": lambda: k2.colsum_gemv_forward(w, b, x, part, vb[:-1], vb[-1:], out),
        "3_rowband": lambda: k3.colsum_gemv_forward(w, b, x, part, vb[:-1], vb[-1:], out),
        "plain read": lambda: kp.probe_read(w, vb, nsm, 8, True),
        "4_overlap, cooperative launch": lambda: k4.tune_forward(w, b, x, part, vb[:-1], vb[-1:], out, 0.5, 1, notrace),
        "3_rowband, no x prefetch": lambda: k3.tune_forward(w, b, x, part, vb[:-1], vb[-1:], out, 2, notrace),
        "write 9 MiB (fill_)": lambda: part[: 9 << 17].fill_(1.0),
        "write 1 MiB (fill_)": lambda: part[: 1 << 17].fill_(1.0),
    }
    print("\n| before 4_overlap | span us (median of 10) | SM MHz | W phase us | tail us |\n|---|---|---|---|---|")
    for nm, f in neighbours.items():
        spans, mhz, wph, tail = [], [], [], []
        for _ in range(10):
            f()
            flush()
            torch.cuda._sleep(harness.HOLD_CYCLES)
            k4.tune_forward(w, b, x, part, vb[:-1], vb[-1:], out, 0.5, 2, trace4)
            torch.cuda.synchronize()
            t = trace4.double()
            spans.append(float((t[:, 4].max() - t[:, 0].min()) / 1e3))
            mhz.append(float((t[:, 7] / (t[:, 4] - t[:, 0])).median() * 1e3))
            wph.append(float((t[:, 1] - t[:, 0]).median() / 1e3))
            tail.append(float((t[:, 4] - t[:, 1]).median() / 1e3))
        med = lambda v: sorted(v)[len(v) // 2]
        print(f"| {nm} | {med(spans):.1f} | {med(mhz):.0f} | {med(wph):.1f} | {med(tail):.1f} |")

if "--no-gemm" in sys.argv:
    sys.exit(0)
# DGEMM vs SGEMM at 1024x8192 @ 8192x8192 (what matmul_gelu_softmax / gemm_bn_scale_softmax run)
wt = w.t().contiguous()
xd, wtd = x.double(), wt.double()
y64 = torch.addmm(b.double(), xd, wtd)
g = {
    "sgemm mm(x, Wt)": lambda: torch.mm(x, wt),
    "dgemm mm(xd, Wtd)": lambda: torch.mm(xd, wtd),
    "dgemm incl. x->f64 and y->f32": lambda: torch.mm(x.double(), wtd).float(),
}
tg = harness.bench_interleaved(g, min_reps=10, max_reps=20, budget_s=20)
print("| GEMM 1024x8192x8192 | median ms | TFLOP/s | relL2 of fp32-rounded y vs float64 |\n|---|---|---|---|")
for k, v in tg.items():
    y = (torch.mm(x, wt) + b) if "sgemm" in k else (torch.mm(xd, wtd) + b.double()).float()
    print(
        f"| {k} | {v.median_ms:.3f} | {2 * B * I * O / (v.median_ms * 1e-3) / 1e12:.1f} | "
        f"{harness.rel_error(y, y64).rel_l2:.2e} |"
    )
