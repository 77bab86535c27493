"""A/B for matmul_sum_max_mean_lse's 5_queue at the benchmark shape (1024x8192 @ 8192x8192): its configurations
(tune_forward cfg: tile columns, W loads in flight, CTAs per SM) next to 4_overlap, both through ModelNew (cache off),
a plain one-kernel read of the same 288 MiB (bw probe read_ticket) and torch's W.sum(); GPU time per call, L2
read-flushed, interleaved (harness.bench_interleaved). Every kernel is checked first (relL2 vs float64, and two calls
bit-identical). Then one traced call of the chosen configuration: when the W units, the dot units and the whole
queue end, relative to the first item's start (--trace-lag3: of the configuration with dots 3 tiles behind).
"""

import sys

import torch

import harness
import models.matmul_sum_max_mean_lse as lse_model

from bench.matmul_sum_max_mean_lse.operands import bench_operands

ops = bench_operands()
B, I, O, nsm, f64 = ops.B, ops.I, ops.O, ops.nsm, ops.f64
lin, w, x, ref, out, args = ops.lin, ops.w, ops.x, ops.ref, ops.out, ops.args
k4 = harness.Kernel("matmul_sum_max_mean_lse", "4_overlap", experiments=True)
k5 = harness.Kernel("matmul_sum_max_mean_lse", "5_queue", experiments=True)
probe = harness.build_path(harness.PROBES / "bw.cu").ops
notrace = torch.empty(0, dtype=torch.int64, device="cuda")
CFG5 = {
    0: "TC512 lag3 UR256",
    1: "TC512 lag3 UR512",
    2: "TC256 lag4 UR256",
    3: "TC512 dots last UR256",
    4: "TC256 CU8 2/SM lag4 UR256",
    5: "TC512 lag6 UR256",
}
fns = {"4_overlap": lambda: k4.colsum_gemv_forward(*args)}
for cfg, nm in CFG5.items():
    fns[f"5_queue {nm}"] = lambda cfg=cfg: k5.tune_forward(*args, cfg, notrace)
for var in ("4_overlap", "5_queue"):
    mn = lse_model.ModelNew(I, O, variant=var, cache=False).cuda()
    mn.load_state_dict(lin.state_dict(prefix="linear."), strict=True)
    fns[f"ModelNew {var} cache=False"] = lambda mn=mn: mn(x)
both = torch.cat([w.reshape(-1), x.reshape(-1)])  # one buffer: a single kernel reads all 288 MiB
sink = torch.zeros((), **f64)
cntr = torch.zeros(1, dtype=torch.int32, device="cuda")
fns["ceiling: read_ld U8 of W+x (one kernel)"] = lambda: probe.probe_read(both, sink, nsm, 8, True)
fns["ceiling: read_ticket U8 of W+x (one kernel)"] = lambda: probe.probe_read_ticket(both, sink, cntr, nsm, 8)
ws = torch.empty((), device="cuda")
fns["torch W.sum() (256 MiB)"] = lambda: torch.sum(w.view(-1), dim=0, out=ws)

bad = []
for k, f in fns.items():
    if k.startswith("torch") or "ceiling" in k:
        continue
    out.fill_(float("nan"))
    y1 = f()
    y1 = (out if y1 is None else y1).clone()
    out.fill_(float("nan"))
    y2 = f()
    y2 = out if y2 is None else y2
    e = harness.rel_error(y1, ref).rel_l2
    if not e < 1e-6 or not torch.equal(y1, y2):
        bad.append((k, e, torch.equal(y1, y2)))
    print(f"{k}: relL2 {e:.2e}, deterministic {torch.equal(y1, y2)}", flush=True)
t = harness.bench_interleaved(fns, min_reps=20, max_reps=60, budget_s=25)
nb = 4 * (O * I + B * I)
print("| call | median us | IQR us | GB/s (288 MiB) |\n|---|---|---|---|")
for k, v in t.items():
    n = 4 * O * I if k.startswith("torch") else nb
    print(f"| {k} | {1e3 * v.median_ms:.1f} | {1e3 * v.iqr_ms:.1f} | {n / (v.median_ms * 1e-3) / 1e9:,.0f} |")
print("parity/determinism failures:", bad or "none")

# Timeline of single traced calls of cfg TRACE_CFG (TC 512, UR 256, lag LAG): item 0 is b.sum(), then blocks of the W
# units of tile k followed by the dot units of tile k - lag (the kernel's decode(), repeated here).
TRACE_CFG, TRACE_LAG = (0, 3) if "--trace-lag3" in sys.argv else (3, 1 << 40)
TC, T, D = 512, -(-I // 512), -(-B // 64)
LAG = min(TRACE_LAG, T)
U = min(32, -(-O // 256))
nitems = 1 + T * U + T * D
kind, tile = ["b"], [-1]
for k in range(T + LAG):
    if k < T:
        kind += ["w"] * U
        tile += [k] * U
    if 0 <= k - LAG < T:
        kind += ["d"] * D
        tile += [k - LAG] * D
assert len(kind) == nitems
kind, tile = torch.tensor([ord(c) for c in kind]), torch.tensor(tile)
trace = torch.zeros(2 * nitems + 64, dtype=torch.int64, device="cuda")
flush = harness.L2Flusher()
print(
    "\n| call | W units end | dots end | queue end | W unit median / max us | dot unit median / max us | "
    "last tile's dots start after W end |\n|---|---|---|---|---|---|---|"
)
for rep in range(3):
    trace.zero_()
    flush()
    k5.tune_forward(*args, TRACE_CFG, trace)
    torch.cuda.synchronize()
    tr = trace[: 2 * nitems].view(nitems, 2).double().cpu() / 1e3
    tr -= tr[:, 0].min()
    wi, di = kind == ord("w"), kind == ord("d")
    wend, dend = tr[wi, 1].max(), tr[di, 1].max()
    wd, dd = tr[wi, 1] - tr[wi, 0], tr[di, 1] - tr[di, 0]
    last = tr[di & (tile == T - 1), 0].min() - wend
    print(
        f"| {rep} | {wend:.1f} | {dend:.1f} | {tr[:, 1].max():.1f} | {wd.median():.2f} / {wd.max():.2f} | "
        f"{dd.median():.2f} / {dd.max():.2f} | {last:.1f} |"
    )
