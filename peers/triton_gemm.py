"""Triton peer for the Linear problems' GEMM: y = x @ W^T with tl.dot(input_precision="tf32x3") (fp32 mode) or
"tf32" (tf32 mode), each BK-wide k-block's tensor-core partial added into a separate fp32 accumulator (the same
promotion as kernels/common/split_gemm.cuh). harness.LinearGemm("triton") calls it; the problem's own epilogue
follows, so the run.py row differs from the split rung only in the GEMM.

Tiles: 128 x 128 x 32, 8 warps, 3 stages, grouped launch order (8 m-blocks per group) for L2 reuse of W. Not
autotuned: one configuration, stated, so the row is reproducible (measured on an H200: Triton tf32x3 1.47 ms,
relL2 2.8e-7 at 1024x8192x8192).
"""

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU CI: no Triton; the peer row is simply absent
    triton = None


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _linear_kernel(
        x_ptr,
        w_ptr,
        y_ptr,
        M,
        N,
        K,
        sxm,
        sxk,
        swn,
        swk,
        sym,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        GM: tl.constexpr,
        PREC: tl.constexpr,
    ):
        pid = tl.program_id(0)
        n_m = tl.cdiv(M, BM)
        n_n = tl.cdiv(N, BN)
        per_group = GM * n_n
        first_m = (pid // per_group) * GM
        rows_in_group = min(n_m - first_m, GM)
        pm = first_m + (pid % per_group) % rows_in_group
        pn = (pid % per_group) // rows_in_group
        rm = (pm * BM + tl.arange(0, BM)).to(tl.int64)
        rn = (pn * BN + tl.arange(0, BN)).to(tl.int64)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            a = tl.load(
                x_ptr + rm[:, None] * sxm + kk[None, :] * sxk, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0
            )
            b = tl.load(
                w_ptr + rn[None, :] * swn + kk[:, None] * swk, mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0
            )
            acc += tl.dot(a, b, input_precision=PREC)  # promotion: the k-block's partial joins in fp32
        tl.store(y_ptr + rm[:, None] * sym + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def linear(x: torch.Tensor, w: torch.Tensor, precision: str = "fp32") -> torch.Tensor:
    if not available():
        raise RuntimeError("the Triton peer needs triton and a CUDA device")
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    bm, bn, bk = 128, 128, 32
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _linear_kernel[grid](
        x,
        w,
        y,
        m,
        n,
        k,
        x.stride(0),
        x.stride(1),
        w.stride(0),
        w.stride(1),
        y.stride(0),
        BM=bm,
        BN=bn,
        BK=bk,
        GM=8,
        PREC="tf32x3" if precision == "fp32" else "tf32",
        num_warps=8,
        num_stages=3,
    )
    return y
