"""A/B and parity of the split-precision wgmma GEMM (kernels/common/split_gemm.cuh) against cuBLAS.

  python -m bench.matmul_gelu_softmax.split_gemm_check [--quick] [--configs]

Prints relL2 vs float64 for odd shapes (tails in M, N, K; strided x; NaN/Inf/tiny rows through the fallback), then
times, interleaved with the L2 flushed, at 1024x8192x8192: split x3 (fp32 mode) and x1 (tf32 mode) end to end
(x split per call, W split cached), the GEMM kernel alone, cuBLAS SGEMM / DGEMM / TF32.
--configs: the GEMM kernel under each configuration -- cluster shape (CM m-blocks sharing W's tile x CN n-blocks
sharing x's, TMA multicast) and one or two accumulator sets per consumer -- each checked bit for bit against the
shipped one on every shape it tiles, then timed side by side.
"""

import argparse

import torch

import harness


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--configs", action="store_true")
    args = ap.parse_args()
    if args.configs:
        return configs()
    torch.manual_seed(0)
    k = harness.Kernel("matmul_gelu_softmax", "2_split_wgmma", experiments=True)
    g3 = harness.LinearGemm("split", k, "fp32")
    g1 = harness.LinearGemm("split", k, "tf32")
    shapes = [
        (1, 1, 1),
        (5, 53, 37),
        (17, 1031, 130),
        (129, 77, 9),
        (300, 260, 200),
        (128, 128, 64),
        (1024, 8192, 8192),
    ]
    print(f"{'M x N x K':>20} {'split3':>9} {'split1':>9} {'sgemm':>9} {'tf32':>9}")
    for m, n, kk in shapes:
        x = torch.rand(m, kk, device="cuda")
        w = (torch.rand(n, kk, device="cuda") * 2 - 1) / kk**0.5
        ref = x.double() @ w.double().t()
        with harness.ieee_fp32():
            s = x @ w.t()
        with harness.tf32_matmul():
            t = x @ w.t()
        print(
            f"{f'{m}x{n}x{kk}':>20} {rel(g3(x, w), ref):9.2e} {rel(g1(x, w), ref):9.2e} {rel(s, ref):9.2e} "
            f"{rel(t, ref):9.2e}",
            flush=True,
        )
    # strided x, wide dynamic range, special rows (fallback)
    xs = torch.randn(300, 64, device="cuda").t()  # 64 x 300 non-contiguous
    w = torch.randn(96, 300, device="cuda") * torch.logspace(-20, 20, 300, device="cuda")
    ref = xs.double() @ w.double().t()
    print(f"strided x, W columns 1e-20..1e20: split3 {rel(g3(xs, w), ref):.2e}")
    x = torch.rand(8, 64, device="cuda")
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    x[3] = 1e-35
    x[4] = 0
    w = torch.randn(40, 64, device="cuda")
    w[7, 1] = float("inf")
    ref = (x.double() @ w.double().t()).float()
    y = g3(x, w)
    same_nf = torch.equal(torch.isnan(y), torch.isnan(ref)) and torch.equal(torch.isinf(y), torch.isinf(ref))
    fin = torch.isfinite(ref)
    print(
        f"special rows: NaN/Inf pattern equal {same_nf}; finite relL2 {rel(y[fin], ref[fin]):.2e}; "
        f"tiny row relL2 {rel(y[3], ref[3]):.2e}"
    )
    if args.quick:
        return
    m = n = kk = 8192
    m = 1024
    x = torch.rand(m, kk, device="cuda")
    w = (torch.rand(n, kk, device="cuda") * 2 - 1) / kk**0.5
    wt = w.t()
    wd = w.t().contiguous().double()
    a = g3._split(x)
    b = g3.wsplit(w)
    y = torch.empty(m, n, device="cuda")
    fns = {
        "split3 (x split + GEMM)": lambda: g3(x, w),
        "split1 (x split + GEMM)": lambda: g1(x, w),
        "split3 GEMM kernel": lambda: k.split_gemm(*a, *b, x, w, y, 3),
        "split1 GEMM kernel": lambda: k.split_gemm(*a, *b, x, w, y, 1),
        "x split": lambda: g3._split(x),
        "cuBLAS SGEMM": lambda: harness.mm_fp32(x, wt),
        "cuBLAS DGEMM (x conv)": lambda: torch.mm(x.double(), wd).float(),
    }
    torch.backends.cuda.matmul.allow_tf32 = False
    t = harness.bench_interleaved(fns, min_reps=10, max_reps=30, budget_s=20)
    with harness.tf32_matmul():
        t.update(harness.bench_interleaved({"cuBLAS TF32": lambda: x @ wt}, min_reps=10, max_reps=30, budget_s=5))
    fl = 2 * m * n * kk
    for name, v in t.items():
        mult = 3 if "split3 GEMM" in name else 1
        print(
            f"{name:28} {v.median_ms:8.3f} ms  IQR {v.q3_ms - v.q1_ms:6.3f}  {mult * fl / v.median_ms / 1e9:7.1f} "
            f"TFLOP/s{' (3 products)' if mult == 3 else ''}"
        )


CONFIGS = [(1, 1, 0), (1, 1, 1), (2, 1, 0), (2, 1, 1), (4, 1, 0), (8, 1, 0), (2, 2, 0)]  # (CM, CN, two acc sets)


def configs():
    torch.manual_seed(0)
    k = harness.Kernel("matmul_gelu_softmax", "2_split_wgmma", experiments=True)
    g3 = harness.LinearGemm("split", k, "fp32")
    for m, n, kk in [(1024, 1024, 200), (1000, 300, 136), (256, 520, 72), (2048, 256, 1000), (1024, 8192, 8192)]:
        x = torch.rand(m, kk, device="cuda")
        w = (torch.rand(n, kk, device="cuda") * 2 - 1) / kk**0.5
        a, b = g3._split(x), g3.wsplit(w)
        ys = {}
        for cfg in CONFIGS:
            if ((m + 127) // 128) % cfg[0] or ((n + 127) // 128) % cfg[1]:
                continue
            for nprod in (3, 1):
                y = torch.full((m, n), float("nan"), device="cuda")
                k.split_gemm_config(*a, *b, x, w, y, nprod, *cfg)
                ys[(cfg, nprod)] = y
        for (cfg, nprod), y in ys.items():
            assert torch.equal(y, ys[(CONFIGS[0], nprod)]), f"{m}x{n}x{kk} config {cfg} nprod {nprod} differs"
        print(f"{m}x{n}x{kk}: {sorted({c[0] for c in ys})} bit for bit equal to {CONFIGS[0]}", flush=True)
    # timed at the last (the bench) shape
    y = torch.empty(x.shape[0], w.shape[0], device="cuda")
    fns = {
        f"{cm}x{cn}{' two acc sets' if db else ''}": (
            lambda c=(cm, cn, db): k.split_gemm_config(*a, *b, x, w, y, 3, *c)
        )
        for cm, cn, db in CONFIGS
    }
    fns["cuBLAS fp16 x1 (times 3)"] = lambda: torch.mm(a[0], b[0].t(), out_dtype=torch.float32)
    t = harness.bench_interleaved(fns, min_reps=15, max_reps=40, budget_s=30)
    fl = 3 * 2 * x.shape[0] * w.shape[0] * x.shape[1]
    print("| CM x CN cluster | ms | IQR | TFLOP/s (3 products) |\n|---|---|---|---|")
    for name, v in t.items():
        ms = v.median_ms * (3 if name.startswith("cuBLAS") else 1)
        print(f"| {name} | {ms:.4f} | {v.iqr_ms:.4f} | {fl / ms / 1e9:.0f} |")


if __name__ == "__main__":
    main()
