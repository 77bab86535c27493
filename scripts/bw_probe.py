#!/usr/bin/env python3
"""Memory ceilings of the H200 as a kernel sees them (scripts/probes/bw.cu), side by side with torch's own copy:
read-only vs copy, plain loads vs TMA bulk copies, all 132 SMs vs the 120 that 8-CTA clusters can use, and the
narrow column-tile read pattern of lse's colsum. GPU time, L2 read-flushed, interleaved (harness.bench_interleaved).
Usage: python3 scripts/bw_probe.py [--quick]"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402

k = harness.build_path(harness.PROBES / "bw.cu").ops
nsm = torch.cuda.get_device_properties(0).multi_processor_count
out = torch.zeros((), dtype=torch.float64, device="cuda")
outf = torch.zeros((), device="cuda")
big = 1 << 30  # floats: 4 GiB each way for copies
src = torch.rand(big, device="cuda")
dst = torch.empty_like(src)
w = torch.rand(8192 * 8192, device="cuda")       # lse's W: 256 MiB
wx = torch.rand(8192 * 8192 + 1024 * 8192, device="cuda")  # W and x together: 288 MiB
fns, nbytes = {}, {}


def add(name, nb, f):
    fns[name], nbytes[name] = f, nb


add("torch copy_ 4 GiB", 8 * big, lambda: dst.copy_(src))
for sms in (nsm, 120):
    for u in (4, 8):
        add(f"copy_ld U{u} {sms} SMs", 8 * big, lambda sms=sms, u=u: k.probe_copy(src, dst, sms, u))
    add(f"copy_tma 4x32K {sms} SMs", 8 * big, lambda sms=sms: k.probe_tma(src, dst, out, sms, 4, 32768, True))
    add(f"copy_tma 6x32K {sms} SMs", 8 * big, lambda sms=sms: k.probe_tma(src, dst, out, sms, 6, 32768, True))
add("read_ld U8 4 GiB", 4 * big, lambda: k.probe_read(src, out, nsm, 8))
add("torch sum 256 MiB", 4 * w.numel(), lambda: torch.sum(w, dim=0, out=outf))
for u in (4, 8, 16):
    add(f"read_ld U{u} 288 MiB", 4 * wx.numel(), lambda u=u: k.probe_read(wx, out, nsm, u))
for s, ch in ((4, 32768), (6, 32768), (3, 65536), (12, 16384)):
    add(f"read_tma {s}x{ch // 1024}K 288 MiB", 4 * wx.numel(), lambda s=s, ch=ch: k.probe_tma(wx, wx, out, nsm, s, ch, False))
for tc in (64, 256, 1024):
    add(f"read_cols TC{tc} 256 MiB", 4 * w.numel(), lambda tc=tc: k.probe_cols(w, out, 8192, tc, nsm))

torch.cuda.synchronize()
t = harness.bench_interleaved(fns, min_reps=15, max_reps=40, budget_s=40)
print(f"| probe ({nsm} SMs on the device) | median us | IQR us | GB/s |\n|---|---|---|---|")
for name, v in t.items():
    print(f"| {name} | {1e3 * v.median_ms:,.1f} | {1e3 * v.iqr_ms:.1f} | {nbytes[name] / (v.median_ms * 1e-3) / 1e9:,.0f} |")
