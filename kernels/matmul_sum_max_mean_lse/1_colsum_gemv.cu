// matmul_sum_max_mean_lse / 1_colsum_gemv -- the whole forward as x @ W.sum(0) + b.sum(): W's column sums and a
// Requires: sm_80 (no Hopper-only feature: built for whatever GPU it runs on)
// GEMV, never the 1024x8192x8192 GEMM.
//
// Why that is exact: after torch.sum(dim=1, keepdim=True) the tensor is (B, 1); max, mean and both logsumexps then
//   run over a dimension of size 1 and return their input (logsumexp of one element subtracts the max: exactly
//   0 + x). sum_o (x W^T + b)[i, o] = x[i, :] . (sum_o W[o, :]) + sum_o b[o] by linearity.
// Kernels:
//   colsum_gemv (no cache, or a stale one): CTA t owns a 64-column tile of W: its 512 threads (16 float4 columns x
//     32 row groups) sum the tile's columns over all O rows (2 MiB per CTA at 8192x8192), reduce them in shared
//     memory, write v[tile] (kept by ModelNew's cache), then immediately dot the same 64 columns of every row of x
//     with v[tile] into partial[t, i]. One pass over W and x in one kernel, no grid-wide dependency: grid =
//     ceil(I/64) CTAs (128 at I = 8192 on 132 SMs).
//   finish: out[i] = sum_t partial[t, i] + sum(b) (1 MiB of partials, from L2).
//   gemv_rows (cache valid): one row of x per CTA (GR), v (float64) from L2: out = x @ v + bsum.
// Bytes: uncached 4*O*I + 4*B*I + small (288 MiB at the bench shape: ~68 us at 4.2 TB/s); cached 4*B*I (32 MiB:
//   ~8 us). Eager runs the full GEMM (137 GFLOP, ~2.8 ms). Bound: memory.
// Preconditions (checked): float32 CUDA tensors on one device; W 2-D contiguous; x 2-D with unit-stride rows and
//   x.size(1) == W.size(1); b 1-D of W.size(0) (or empty for no bias); float64 scratch/outputs. float4 paths need
//   16-byte aligned rows, other layouts take scalar loads.
// Numerics: every sum in float64 (W's column sums, b's sum, the dot products), one rounding to fp32 at the end:
//   x.v and b.sum() can nearly cancel (a batch-1 case lost 1.3e-6 relative with fp32 sums), and double adds are free
//   in a memory-bound kernel. relL2 vs float64 ~3e-8, far below the reference's own fp32 error.
// Measured: H200, 1024x8192 @ 8192x8192, 2026-11-22 (GPU time, L2 read-flushed): cached 0.016 ms (172x eager 2.761),
//   uncached 0.103 ms (27x; 288 MiB at 2.9 TB/s). Targets were 15 us and 70 us. The uncached kernel reads W in
//   256-byte row segments per CTA (64-column tiles): the earlier 1024-column colsum pass alone ran at 4.07 TB/s, so
//   the narrow tiles likely cost DRAM locality; a wide-tile pass + cross-CTA tile completion is the next step.
#include "lse_common.cuh"

namespace {

constexpr int TC = 64;            // columns per colsum_gemv CTA
constexpr int CG = TC / 4;        // float4 column groups
constexpr int RG = 32;            // row groups
constexpr int FT = CG * RG;       // 512 threads
constexpr int GR = 1;             // rows of x per gemv_rows CTA (8 measured 35 us, 1 row per CTA ~12 us: more CTAs, more loads in flight)

__global__ void __launch_bounds__(FT) colsum_gemv(const float* __restrict__ w, int64_t O, int64_t I,
                                                  const float* __restrict__ x, int64_t B, int64_t xs,
                                                  double* __restrict__ partial, double* __restrict__ v, bool vec) {
  __shared__ double red[RG][TC];
  __shared__ double vt[TC];
  const int cg = threadIdx.x % CG, rg = threadIdx.x / CG;
  const int64_t c = (int64_t)blockIdx.x * TC + 4 * cg;  // first of this thread's 4 columns
  double a0 = 0., a1 = 0., a2 = 0., a3 = 0.;
  if (vec) {
    if (c < I) {
#pragma unroll 8
      for (int64_t r = rg; r < O; r += RG) {
        const float4 q = *reinterpret_cast<const float4*>(w + r * I + c);
        a0 += q.x; a1 += q.y; a2 += q.z; a3 += q.w;
      }
    }
  } else {
    for (int64_t r = rg; r < O; r += RG) {
      const float* wr = w + r * I;
      if (c < I) a0 += wr[c];
      if (c + 1 < I) a1 += wr[c + 1];
      if (c + 2 < I) a2 += wr[c + 2];
      if (c + 3 < I) a3 += wr[c + 3];
    }
  }
  red[rg][4 * cg] = a0; red[rg][4 * cg + 1] = a1; red[rg][4 * cg + 2] = a2; red[rg][4 * cg + 3] = a3;
  __syncthreads();
  if (threadIdx.x < TC) {
    double s = 0.;
#pragma unroll 8
    for (int k = 0; k < RG; ++k) s += red[k][threadIdx.x];
    vt[threadIdx.x] = s;
    const int64_t j = (int64_t)blockIdx.x * TC + threadIdx.x;
    if (j < I) v[j] = s;
  }
  __syncthreads();
  // This tile's share of every dot product. Lanes cg = 0..15 of a half-warp hold one row's 64 columns.
  const double v0 = vt[4 * cg], v1 = vt[4 * cg + 1], v2 = vt[4 * cg + 2], v3 = vt[4 * cg + 3];
  for (int64_t i0 = 0; i0 < B; i0 += RG) {
    const int64_t i = i0 + rg;
    double d = 0.;
    if (i < B) {
      const float* xr = x + i * xs;
      if (vec) {
        if (c < I) {
          const float4 q = *reinterpret_cast<const float4*>(xr + c);
          d = ((double)q.x * v0 + (double)q.y * v1) + ((double)q.z * v2 + (double)q.w * v3);
        }
      } else {
        if (c < I) d += (double)xr[c] * v0;
        if (c + 1 < I) d += (double)xr[c + 1] * v1;
        if (c + 2 < I) d += (double)xr[c + 2] * v2;
        if (c + 3 < I) d += (double)xr[c + 3] * v3;
      }
    }
#pragma unroll
    for (int o = CG / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (cg == 0 && i < B) partial[(int64_t)blockIdx.x * B + i] = d;
  }
}

__global__ void __launch_bounds__(256) finish(const double* __restrict__ partial, int64_t tiles, int64_t B,
                                              const float* __restrict__ b, int64_t nb, float* __restrict__ out,
                                              double* __restrict__ bsum_out) {
  __shared__ double scratch[64];
  double bs = 0.;
  for (int64_t k = threadIdx.x; k < nb; k += 256) bs += b[k];
  bs = kp::block_sum(bs, scratch);  // every CTA sums b itself (32 KiB): no second dependency
  if (blockIdx.x == 0 && threadIdx.x == 0) *bsum_out = bs;
  const int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (i >= B) return;
  double s = 0.;
#pragma unroll 8
  for (int64_t t = 0; t < tiles; ++t) s += partial[t * B + i];
  out[i] = (float)(s + bs);
}

__global__ void __launch_bounds__(256) gemv_rows(const float* __restrict__ x, int64_t B, int64_t I, int64_t xs,
                                                 const double* __restrict__ v, const double* __restrict__ bsum,
                                                 float* __restrict__ out, bool vec) {
  __shared__ double red[GR][8];
  const int64_t r0 = (int64_t)blockIdx.x * GR;
  double acc[GR];
#pragma unroll
  for (int r = 0; r < GR; ++r) acc[r] = 0.;
  if (vec) {
    const int64_t n4 = I / 4, xs4 = xs / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x) + r0 * xs4;
#pragma unroll 2
    for (int64_t c4 = threadIdx.x; c4 < n4; c4 += 256) {
      const double v0 = v[4 * c4], v1 = v[4 * c4 + 1], v2 = v[4 * c4 + 2], v3 = v[4 * c4 + 3];
#pragma unroll
      for (int r = 0; r < GR; ++r)
        if (r0 + r < B) {
          const float4 q = x4[r * xs4 + c4];
          acc[r] += ((double)q.x * v0 + (double)q.y * v1) + ((double)q.z * v2 + (double)q.w * v3);
        }
    }
  } else {
    for (int64_t c = threadIdx.x; c < I; c += 256) {
      const double vv = v[c];
#pragma unroll
      for (int r = 0; r < GR; ++r)
        if (r0 + r < B) acc[r] += (double)x[(r0 + r) * xs + c] * vv;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < GR; ++r) {
    const double s = kp::warp_sum(acc[r]);
    if (lane == 0) red[r][warp] = s;
  }
  __syncthreads();
  if (threadIdx.x < GR && r0 + threadIdx.x < B) {
    double s = 0.;
#pragma unroll
    for (int k = 0; k < 8; ++k) s += red[threadIdx.x][k];
    out[r0 + threadIdx.x] = (float)(s + *bsum);
  }
}

}  // namespace

// Uncached forward: out = x @ W.sum(0) + b.sum(), filling v (I doubles) and bsum (1 double) on the way so a caller
// can cache them. partial: float64 scratch of >= ceil(I/64) * B.
KP_EXPORT void colsum_gemv_forward(const at::TensorBase& w, const at::TensorBase& b, const at::TensorBase& x,
                                   const at::TensorBase& partial, const at::TensorBase& v,
                                   const at::TensorBase& bsum, const at::TensorBase& out) {
  const lse::Forward f = lse::check_forward(w, b, x, partial, v, bsum, out);
  const int64_t O = f.O, I = f.I, B = f.B, tiles = (I + TC - 1) / TC;
  lse::check_f64(partial, w, "partial", tiles * B);
  TORCH_CHECK(tiles <= 2147483647LL, "too many columns: ", kp::num(I));
  c10::cuda::CUDAGuard guard(w.device());
  if (tiles > 0) {
    colsum_gemv<<<(unsigned)tiles, FT, 0, kp::stream()>>>(w.data_ptr<float>(), O, I, x.data_ptr<float>(), B,
                                                          x.stride(0), partial.data_ptr<double>(),
                                                          v.data_ptr<double>(), f.vec);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  finish<<<(unsigned)std::max<int64_t>(1, (B + 255) / 256), 256, 0, kp::stream()>>>(
      partial.data_ptr<double>(), tiles, B, b.numel() ? b.data_ptr<float>() : nullptr, b.numel(),
      out.data_ptr<float>(), bsum.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Cached forward: out (B, 1) := x @ v + bsum with v, bsum from an earlier colsum_gemv_forward.
KP_EXPORT void gemv_bias(const at::TensorBase& x, const at::TensorBase& v, const at::TensorBase& bsum,
                         const at::TensorBase& out) {
  lse::check_f64(v, x, "v", 0);
  lse::check_x(x, v.numel());
  lse::check_f64(bsum, x, "bsum", 1);
  lse::check_out(out, x);
  const int64_t B = x.size(0), I = x.size(1);
  if (B == 0) return;
  c10::cuda::CUDAGuard guard(x.device());
  const bool vec = I % 4 == 0 && x.stride(0) % 4 == 0 && lse::aligned16(x.data_ptr());
  gemv_rows<<<(unsigned)((B + GR - 1) / GR), 256, 0, kp::stream()>>>(x.data_ptr<float>(), B, I, x.stride(0),
                                                                     v.data_ptr<double>(), bsum.data_ptr<double>(),
                                                                     out.data_ptr<float>(), vec);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
