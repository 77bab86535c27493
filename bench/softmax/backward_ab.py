"""A/B of the softmax backward's rungs at the benchmark shape (4096x393216 fp32), next to copy_, PyTorch's own
backward (eager) and torch.compile of it, interleaved and L2-flushed in one process; 3_bulk also at other start
staggers (its A/B hook). Each path is first checked against float64 on ~40 rows. GB/s counts the floor's bytes
(y and dy read once, dx written once); copy_'s counts its read and write.

    python -m bench.softmax.backward_ab [--rows 4096] [--cols 393216] [--staggers 0,2246]
"""

import argparse

import torch

import harness
from models.softmax_backward import Model

ap = argparse.ArgumentParser()
ap.add_argument("--rows", type=int, default=4096)
ap.add_argument("--cols", type=int, default=393216)
ap.add_argument("--staggers", default="0,2246,4492", help="3_bulk's other start staggers (SM cycles a cluster)")
ap.add_argument("--variants", default="2_cluster,3_bulk")
args = ap.parse_args()

g = torch.Generator(device="cuda").manual_seed(1)
y = torch.softmax(torch.rand(args.rows, args.cols, device="cuda", generator=g), dim=1)
dy = torch.randn(args.rows, args.cols, device="cuda", generator=g)
dx = torch.empty_like(y)
pick = slice(0, args.rows, max(1, args.rows // 40))
yd, gd = y[pick].double(), dy[pick].double()
ref = yd * (gd - (yd * gd).sum(1, keepdim=True))
paths = {
    v: (lambda k=harness.Kernel("softmax_backward", v): k.softmax_backward(y, dy, dx)) for v in args.variants.split(",")
}
if "3_bulk" in paths:
    ab = harness.Kernel("softmax_backward", "3_bulk", experiments=True)
    for s in (int(v) for v in args.staggers.split(",") if v):
        paths[f"3_bulk stagger {s}"] = lambda s=s: ab.softmax_backward_stagger(y, dy, dx, s)
for name, f in paths.items():
    dx.zero_()
    f()
    e = harness.rel_error(dx[pick], ref)
    assert e.rel_l2 < 1e-5 and e.worst_row < 1e-5, (name, e)
    print(f"{name}: relL2 {e.rel_l2:.1e}, worst row {e.worst_row:.1e}", flush=True)
model = Model()
compiled = torch.compile(model, dynamic=False)
src = torch.empty_like(y)
with torch.no_grad():
    t = harness.bench_interleaved(
        {"copy_": lambda: dx.copy_(src), "eager": lambda: model(y, dy), "compile": lambda: compiled(y, dy), **paths},
        min_reps=8,
        max_reps=20,
        budget_s=40,
    )
floor = 3 * y.numel() * 4
copy = 2 * y.numel() * 4 / (t["copy_"].median_ms * 1e-3) / 1e9
print(
    f"\n{args.rows}x{args.cols} fp32, {torch.cuda.get_device_name()}, copy_ {copy:,.0f} GB/s\n"
    "| path | median ms | IQR ms | GB/s of the floor | % of copy_ | vs eager | vs compile |\n"
    "|---|---|---|---|---|---|---|"
)
for k, v in t.items():
    if k == "copy_":
        continue
    gbs = floor / (v.median_ms * 1e-3) / 1e9
    print(
        f"| {k} | {v.median_ms:.3f} | {v.iqr_ms:.3f} | {gbs:,.0f} | {100 * gbs / copy:.1f}% | "
        f"{t['eager'].median_ms / v.median_ms:.2f}x | {t['compile'].median_ms / v.median_ms:.2f}x |"
    )
