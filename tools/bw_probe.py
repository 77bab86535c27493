"""Memory ceilings of the H200 as a kernel sees them (tools/probes/bw.cu), side by side with torch's own copy
(a cudaMemcpyAsync, i.e. the copy engines, for a contiguous same-dtype copy_) and torch's elementwise kernels:
read-only vs copy, plain loads vs TMA bulk copies, one CTA per SM vs several, all SMs vs the 120 that 8-CTA clusters
can use, and the column-tile read pattern of lse's colsum. GPU time, L2 read-flushed, interleaved
(harness.bench_interleaved). Usage: python -m tools.bw_probe [--only WORD ...]"""

import sys

import torch

import harness

k = harness.build_path(harness.PROBES / "bw.cu").ops
nsm = torch.cuda.get_device_properties(0).multi_processor_count
out = torch.zeros((), dtype=torch.float64, device="cuda")
outf = torch.zeros((), device="cuda")
big = 1 << 30  # floats: 4 GiB each way for copies
src = torch.rand(big, device="cuda")
dst = torch.empty_like(src)
wx = torch.rand(8192 * 8192 + 1024 * 8192, device="cuda")  # lse's W and x together: 288 MiB
w = wx[: 8192 * 8192]
fns, nbytes = {}, {}


def add(name, nb, f):
    fns[name], nbytes[name] = f, nb


C = 8 * big
add("torch copy_ (memcpy) 4 GiB", C, lambda: dst.copy_(src))
add("torch mul(x, 1) 4 GiB", C, lambda: torch.mul(src, 1.0, out=dst))
add("copy_ld U1 classic grid", C, lambda: k.probe_copy(src, dst, big // 4 // 512, 1, False))
add("copy_ld U4 1 CTA/SM", C, lambda: k.probe_copy(src, dst, nsm, 4, True))
add("copy_ld U4 4 CTA/SM", C, lambda: k.probe_copy(src, dst, 4 * nsm, 4, False))
add("copy_ld U8 2 CTA/SM", C, lambda: k.probe_copy(src, dst, 2 * nsm, 8, False))
add("copy_ld U4 1 CTA/SM 120 SMs", C, lambda: k.probe_copy(src, dst, 120, 4, True))
add("copy_ld U4 4 CTA/SM 120x4 CTAs", C, lambda: k.probe_copy(src, dst, 480, 4, False))
add("copy_tma 4x32K 1 CTA/SM", C, lambda: k.probe_tma(src, dst, out, nsm, 4, 32768, True, True))
add("copy_tma 3x32K 2 CTA/SM", C, lambda: k.probe_tma(src, dst, out, 2 * nsm, 3, 32768, True, False))
add("copy_tma 2x16K 4 CTA/SM", C, lambda: k.probe_tma(src, dst, out, 4 * nsm, 2, 16384, True, False))
R = 4 * wx.numel()
cntr = torch.zeros(1, dtype=torch.int32, device="cuda")
add("torch sum 288 MiB", R, lambda: torch.sum(wx, dim=0, out=outf))
add("read_ld U8 1 CTA/SM 288 MiB", R, lambda: k.probe_read(wx, out, nsm, 8, True))
add("read_ld U8 2 CTA/SM 288 MiB", R, lambda: k.probe_read(wx, out, 2 * nsm, 8, False))
add("read_ld U4 4 CTA/SM 288 MiB", R, lambda: k.probe_read(wx, out, 4 * nsm, 4, False))
add("read_ld U16 1 CTA/SM 288 MiB", R, lambda: k.probe_read(wx, out, nsm, 16, True))
add("read_tma 3x64K 288 MiB", R, lambda: k.probe_tma(wx, wx, out, nsm, 3, 65536, False, True))
add("read_tma 3x32K 2 CTA/SM 288 MiB", R, lambda: k.probe_tma(wx, wx, out, 2 * nsm, 3, 32768, False, False))
for u in (8, 16):
    add(
        f"read_ticket U{u} 1 CTA/SM 288 MiB (persistent, atomic chunk order)",
        R,
        lambda u=u: k.probe_read_ticket(wx, out, cntr, nsm, u),
    )
add("read_ld U8 1 CTA/SM 4 GiB", 4 * big, lambda: k.probe_read(src, out, nsm, 8, True))
add("read_ld U4 4 CTA/SM 4 GiB", 4 * big, lambda: k.probe_read(src, out, 4 * nsm, 4, False))
add("read_cols TC64 (128 CTAs) 256 MiB", 4 * w.numel(), lambda: k.probe_cols(w, out, 8192, 64, nsm))
for tc in (64, 256, 512, 1024, 2048):
    add(
        f"read_tiles TC{tc} x {128 * 64 // tc} row parts (128 CTAs) 256 MiB",
        4 * w.numel(),
        lambda tc=tc: k.probe_tiles(w, out, 8192, tc, 128),
    )
add("copy torch-like (128 thr, 4 float4, 1 chunk/CTA)", C, lambda: k.probe_copy_torchlike(src, dst))
cnt = torch.zeros(1 << 20, dtype=torch.int32, device="cuda")
for u in (4, 8):
    add(
        f"copy_ticket U{u} 1 CTA/SM (persistent, atomic chunk order)",
        C,
        lambda u=u: k.probe_copy_ticket(src, dst, cnt, nsm, u),
    )
    add(f"copy_ticket U{u} 1 CTA/SM 120 SMs", C, lambda u=u: k.probe_copy_ticket(src, dst, cnt, 120, u))
for th, u in ((256, 8), (256, 16), (512, 8), (128, 16)):  # groups of 393216 floats = one softmax row
    cpr = 393216 // (4 * th * u)
    for c in (1, cpr):
        add(
            f"rowsync {th} thr x {u} float4, {c} chunk(s) per group",
            C,
            lambda th=th, u=u, c=c: k.probe_copy_rowsync(src, dst, cnt, th, u, c),
        )

if len(sys.argv) > 2 and sys.argv[1] == "--only":  # a subset: names containing any of the given words
    fns = {n: f for n, f in fns.items() if any(wd in n for wd in sys.argv[2:])}
for n, f in fns.items():  # the row-synchronised copies must copy (and not hang)
    if n.startswith(("rowsync", "copy_ticket")):
        dst.zero_()
        f()
        if not torch.equal(dst, src):
            raise SystemExit(f"{n}: wrong copy")
torch.cuda.synchronize()
t = harness.bench_interleaved(fns, min_reps=15, max_reps=40, budget_s=60)
print(f"| probe ({nsm} SMs on the device) | median us | IQR us | GB/s |\n|---|---|---|---|")
for name, v in t.items():
    print(
        f"| {name} | {1e3 * v.median_ms:,.1f} | {1e3 * v.iqr_ms:.1f} | "
        f"{nbytes[name] / (v.median_ms * 1e-3) / 1e9:,.0f} |"
    )
