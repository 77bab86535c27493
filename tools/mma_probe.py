"""The fp16 tensor-core rate this GPU sustains (tools/probes/mma.cu: wgmma from shared memory, nothing else), side by
side with cuBLAS's fp16 GEMM and the split GEMM kernel at the Linear problems' shape (1024 x 8192 x 8192), with the
SM clock and board power sampled by nvidia-smi while each one runs back to back for a while. Every row is scaled to
the fp16 work of one fp32-accurate product of that shape (three fp16 products), so its ms columns are directly the
floor that row sets for the split-precision GEMM: once as the judge times (GPU time, L2 flushed, a pause before each
call, interleaved: harness.bench_interleaved) and once sustained, at the power-limited clock sampled in those calls.
Usage: python -m tools.mma_probe [--seconds S]"""

import argparse
import statistics
import subprocess
import time

import torch

import harness

M, N, K = 1024, 8192, 8192
FMA3 = 3 * M * N * K  # fp16 multiply-adds of one fp32-accurate product (x_hi W_hi + x_hi W_lo + x_lo W_hi)
QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"


def sustained(fn, seconds):
    """Run fn back to back for `seconds` while nvidia-smi samples every 50 ms. Over the second half (the clock has
    settled under the power limit): ms per call from CUDA events around those calls, and the medians of the sampled
    SM clock (MHz) and board power (W), with the set of clock-event reasons seen. The clock and the time come from
    the same calls, so % of the pipe at that clock is consistent (the interleaved timing, with an L2 flush and a
    pause before each call, runs at a higher clock than a sustained load does)."""
    try:
        p = subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-i", "0", "-lms", "50"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    except FileNotFoundError:
        p = None
    t0 = time.time()
    start = stop = None
    calls = 0
    while time.time() - t0 < seconds:
        if start is None and time.time() - t0 > seconds / 2:
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        for _ in range(10):
            fn()
        if start is not None:
            calls += 10
        torch.cuda.synchronize()
    stop.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(stop) / calls
    if p is None:
        return ms, None, None, ""
    p.terminate()
    out = p.communicate()[0].strip().splitlines()
    rows = [[v.strip() for v in line.split(",")] for line in out if line.count(",") == 2]
    rows = rows[len(rows) // 2 :]
    clk = [float(r[0]) for r in rows if r[0].replace(".", "").isdigit()]
    pw = [float(r[1]) for r in rows if r[1].replace(".", "").isdigit()]
    reasons = sorted({r[2] for r in rows})
    return (ms, statistics.median(clk) if clk else None, statistics.median(pw) if pw else None, " ".join(reasons))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0, help="how long each row runs while the clock is sampled")
    args = ap.parse_args()
    torch.manual_seed(0)
    probe = harness.build_path(harness.PROBES / "mma.cu").ops
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    v = torch.rand(96 * 1024, device="cuda") * 2**15  # fp16 values up to 2^15, as the split's scaled rows
    hi = v.half()
    lo = (v - hi.float()).half()
    src = torch.cat([hi[: 48 * 1024], lo[: 48 * 1024]]).contiguous()
    out = torch.empty(nsm * 256, device="cuda")
    # The probe must do the work it is credited with: with every operand 1.0 a k-block of 4 x k16 steps leaves 64
    # in each accumulator, so out (the sum of a thread's accumulators) is 64 * iters * N / 2 (pipelined: one
    # accumulation; promote: each k-block's partial added up). Twice the iterations must take ~twice as long.
    ones = torch.ones(96 * 1024, device="cuda", dtype=torch.half)
    for n, promote, iters in ((256, False, 3), (128, False, 3), (128, True, 3)):
        out.zero_()
        probe.probe_mma(ones, out, nsm, iters, n, promote)
        want = 64 * n // 2 * iters
        if not torch.all(out == want):
            raise SystemExit(f"probe_mma n={n} promote={promote}: out {out.unique()[:4].tolist()}, expected {want}")
    rows, fma = {}, {}
    for n, promote in ((256, False), (128, False), (128, True)):
        per = 2 * nsm * 4 * 64 * n * 16  # FMAs per iteration over the grid
        iters = -(-FMA3 // per)
        name = f"wgmma only, m64n{n}k16, {'promote every k-block' if promote else 'pipelined'}"
        rows[name] = lambda n=n, promote=promote, iters=iters: probe.probe_mma(src, out, nsm, iters, n, promote)
        fma[name] = iters * per
    k = harness.Kernel("matmul_gelu_softmax", "2_split_wgmma")
    g3 = harness.LinearGemm("split_wgmma", k, "fp32")
    x = torch.rand(M, K, device="cuda")
    w = (torch.rand(N, K, device="cuda") * 2 - 1) / K**0.5
    a, b = g3._split(x), g3.wsplit(w)
    y = torch.empty(M, N, device="cuda")
    rows["split GEMM kernel (3 products)"] = lambda: k.split_gemm(*a, *b, x, w, y, 3)
    fma["split GEMM kernel (3 products)"] = FMA3
    xh, wh = a[0], b[0]
    rows["cuBLAS fp16 GEMM x3 (one timed, times 3)"] = lambda: torch.mm(xh, wh.t())
    fma["cuBLAS fp16 GEMM x3 (one timed, times 3)"] = M * N * xh.shape[1]
    for f in rows.values():
        f()
    torch.cuda.synchronize()
    scal = harness.bench_interleaved(
        {i: (lambda i=i: probe.probe_mma(src, out, nsm, i, 256, False)) for i in (500, 1000, 2000)},
        min_reps=5,
        max_reps=10,
        budget_s=5,
    )
    print(
        "pipelined m64n256k16, ms for 500 / 1000 / 2000 k-blocks per warpgroup: "
        + " / ".join(f"{v.median_ms:.4f}" for v in scal.values())
    )
    t = harness.bench_interleaved(rows, min_reps=10, max_reps=30, budget_s=30)
    lim = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,power.limit,clocks.max.sm", "--format=csv,noheader", "-i", "0"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"device: {lim}; {nsm} SMs; dense fp16 = 2048 FMA per clock per SM (989 TFLOP/s at 1.83 GHz)")
    print(
        "| row | ms for 3 products' FMAs (interleaved) | IQR ms | sustained ms | TFLOP/s sustained | SM MHz | "
        "board W | % of the pipe at that clock | clock-event reasons |\n|---|---|---|---|---|---|---|---|---|"
    )
    for name, tv in t.items():
        scale = FMA3 / fma[name]
        ms, iqr = tv.median_ms * scale, tv.iqr_ms * scale
        sms, clk, pw, why = sustained(rows[name], args.seconds)
        sms *= scale
        rate = 2 * FMA3 / (sms * 1e-3) / 1e12
        pipe = f"{100 * FMA3 / (sms * 1e-3) / (nsm * 2048 * clk * 1e6):.1f}%" if clk else "-"
        print(
            f"| {name} | {ms:.4f} | {iqr:.4f} | {sms:.4f} | {rate:,.0f} | {clk or '-'} | "
            f"{f'{pw:.0f}' if pw else '-'} | {pipe} | {why} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
