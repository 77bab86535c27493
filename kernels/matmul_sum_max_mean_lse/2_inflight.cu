// matmul_sum_max_mean_lse / 2_inflight -- 1_colsum_gemv with enough loads in flight in every phase.
// Requires: sm_90a (programmatic dependent launch: griddepcontrol)
//
// Same algebra as 1_colsum_gemv (the forward is x @ W.sum(0) + b.sum(); see that file's header for why it is exact).
// What changed from 1:
//   - colsum_gemv's x phase issued one float4 per thread per round trip (8 KiB in flight per CTA: latency-bound,
//     ~35 us of the 103). Each thread now loads XU rows before using any (XU x 16 B), so the x phase streams too.
//   - finish is launched with programmatic dependent launch: it sums b and waits (griddepcontrol.wait) while the
//     main kernel drains, instead of paying a launch gap after it.
//   - gemv_rows (cached path): GR rows per CTA share each v load (v is float64: one row per CTA read 64 KiB of v
//     from L2 per 32 KiB of x), v read as double2, loads unrolled.
//   Tile and unroll choices are template parameters; `tune_forward` / `tune_gemv` run the alternatives for the A/B
//   in bench/matmul_sum_max_mean_lse/ab.py, the KP_EXPORTs used by ModelNew run the chosen ones (TC/XU/GR/GU below).
// Ownership and launch:
//   colsum_gemv<TC, XU>: CTA t owns columns [t*TC, (t+1)*TC) of W and x; 512 threads = (TC/4 float4 columns) x RG
//     row groups; it sums its columns over all O rows of W, writes v[tile], then dots the same columns of every
//     row of x with v[tile] into partial[t, i]. grid = ceil(I/TC).
//   finish: out[i] = sum_t partial[t, i] + sum(b); 256 threads per CTA, one row each.
//   gemv_rows<GR, GU> (lse_common.cuh): GR rows of x per CTA, 256 threads striding the columns, GU float4 per
//     thread per row in flight; block reduction in shared memory.
// Bytes: uncached 4*O*I + 4*B*I + 8*B*I/TC (partials, L2) = 288 MiB + 1 MiB at the bench shape, the minimum is
//   288 MiB (~68 us at 4.4 TB/s); cached 4*B*I = 32 MiB (~8 us) plus v from L2. Bound: memory.
// Preconditions (checked): float32 CUDA tensors on one device; W 2-D contiguous; x 2-D with unit-stride rows and
//   x.size(1) == W.size(1); b 1-D of W.size(0) (or empty); float64 scratch. float4 paths need 16-byte alignment,
//   other layouts take scalar loads.
// Numerics: as 1_colsum_gemv: every sum in float64, one rounding to fp32 at the end (relL2 ~3e-8).
// Measured: H200, 1024x8192 @ 8192x8192, 2026-11-22, GPU time with the L2 read-flushed (bench/matmul_sum_max_mean_lse/ab.py, two
//   runs agreeing within 2%): uncached 82.4 us (3,667 GB/s of the 288 MiB minimum; 1_colsum_gemv 99.3 us; torch's own
//   W.sum() reading 256 MiB took 70.2 us = 3,823 GB/s), cached GEMV 9.5 us (3,531 GB/s; 1's 15.0 us). Through
//   ModelNew in run.py: cached 0.011 ms (255x eager 2.757 ms), uncached 0.087 ms before the L2::256B/CU16 choice.
//   Issue-4 targets: cached <= 15 us met; uncached <= 70 us NOT met: it needs 4.3 TB/s of reads, above what any
//   read stream measured here (torch.sum 3.8 TB/s).
//   A/B (us): TC64 XU1 97.2, XU4 97.2, XU8 87.1, +L2::256B 85.3, +CU16 82.4; TC32 XU8 90.2, XU16 90.4. GEMV: GR1 GU2
//   13.7, GR1 GU4 13.9, GR2 GU2 9.5, GR4 GU2 9.7, GR2 GU4 10.2, GR4 GU1 12.3.
#include "lse_common.cuh"

namespace {

using lse::Forward;
using lse::launch_gemv;

constexpr int FT = 512;           // colsum_gemv threads
constexpr int TC_MIN = 32;        // smallest tile any configuration uses: the caller sizes `partial` by it
constexpr int TC = 64, XU = 8;    // chosen colsum_gemv tile and x-phase unroll (bench/matmul_sum_max_mean_lse/ab.py)
constexpr int HINT = 1, CU = 16;  // chosen W load (L2::256B fills, no L1) and W-loop unroll
constexpr int GR = 2, GU = 2;     // chosen gemv_rows rows per CTA and float4 per row in flight

// W is streamed once: optionally ask for 256-byte L2 fills and no L1 allocation (HINT = 1).
template <int HINT>
__device__ __forceinline__ float4 load_w(const float* p) {
  if constexpr (HINT == 1) return lse::load_w(p);
  else return *reinterpret_cast<const float4*>(p);
}

template <int TC_, int XU_, int HINT = 0, int CU = 8>
__global__ void __launch_bounds__(FT) colsum_gemv(const float* __restrict__ w, int64_t O, int64_t I,
                                                  const float* __restrict__ x, int64_t B, int64_t xs,
                                                  double* __restrict__ partial, double* __restrict__ v, bool vec) {
  constexpr int TC = TC_, CG = TC / 4, RG = FT / CG;
  __shared__ double red[RG][TC];
  __shared__ double vt[TC];
  const int cg = threadIdx.x % CG, rg = threadIdx.x / CG;
  const int64_t c = (int64_t)blockIdx.x * TC + 4 * cg;  // first of this thread's 4 columns
  double a0 = 0., a1 = 0., a2 = 0., a3 = 0.;
  if (vec) {
    if (c < I) {
#pragma unroll CU
      for (int64_t r = rg; r < O; r += RG) {
        const float4 q = load_w<HINT>(w + r * I + c);
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
  // This tile's share of every dot product: CG consecutive lanes hold one row's TC columns. XU rows are loaded
  // before any is used, so XU x 16 B per thread are in flight (the x phase was latency-bound without it).
  const double v0 = vt[4 * cg], v1 = vt[4 * cg + 1], v2 = vt[4 * cg + 2], v3 = vt[4 * cg + 3];
  if (vec) {
    for (int64_t i0 = 0; i0 < B; i0 += (int64_t)RG * XU_) {
      float4 q[XU_];
#pragma unroll
      for (int u = 0; u < XU_; ++u) {
        const int64_t i = i0 + rg + (int64_t)RG * u;
        q[u] = (i < B && c < I) ? __ldg(reinterpret_cast<const float4*>(x + i * xs + c)) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < XU_; ++u) {
        const int64_t i = i0 + rg + (int64_t)RG * u;
        double d = ((double)q[u].x * v0 + (double)q[u].y * v1) + ((double)q[u].z * v2 + (double)q[u].w * v3);
#pragma unroll
        for (int o = CG / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        if (cg == 0 && i < B) partial[(int64_t)blockIdx.x * B + i] = d;
      }
    }
  } else {
    for (int64_t i0 = 0; i0 < B; i0 += RG) {
      const int64_t i = i0 + rg;
      double d = 0.;
      if (i < B) {
        const float* xr = x + i * xs;
        if (c < I) d += (double)xr[c] * v0;
        if (c + 1 < I) d += (double)xr[c + 1] * v1;
        if (c + 2 < I) d += (double)xr[c + 2] * v2;
        if (c + 3 < I) d += (double)xr[c + 3] * v3;
      }
#pragma unroll
      for (int o = CG / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
      if (cg == 0 && i < B) partial[(int64_t)blockIdx.x * B + i] = d;
    }
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
  // Launched as a programmatic dependent of colsum_gemv: everything above overlapped its tail; the partials
  // are only read after it has completed and flushed.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (i >= B) return;
  double s = 0.;
#pragma unroll 8
  for (int64_t t = 0; t < tiles; ++t) s += partial[t * B + i];
  out[i] = (float)(s + bs);
}

Forward check_forward(const at::TensorBase& w, const at::TensorBase& b, const at::TensorBase& x,
                      const at::TensorBase& partial, const at::TensorBase& v, const at::TensorBase& bsum,
                      const at::TensorBase& out) {
  const Forward f = lse::check_forward(w, b, x, partial, v, bsum, out);
  const int64_t tiles = (f.I + TC_MIN - 1) / TC_MIN;
  TORCH_CHECK(tiles <= 2147483647LL, "too many columns: ", kp::num(f.I));
  lse::check_f64(partial, w, "partial", tiles * f.B);
  return f;
}

template <int TC_, int XU_, int HINT = 0, int CU = 8>
void launch_forward(const Forward& f) {
  c10::cuda::CUDAGuard guard(f.w.device());
  const int64_t tiles = (f.I + TC_ - 1) / TC_;
  if (tiles > 0) {
    colsum_gemv<TC_, XU_, HINT, CU><<<(unsigned)tiles, FT, 0, kp::stream()>>>(
        f.w.data_ptr<float>(), f.O, f.I, f.x.data_ptr<float>(), f.B, f.x.stride(0), f.partial.data_ptr<double>(),
        f.v.data_ptr<double>(), f.vec);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  lse::launch_dependent(finish, (unsigned)std::max<int64_t>(1, (f.B + 255) / 256), 256,
                        (const double*)f.partial.data_ptr<double>(), tiles, f.B,
                        (const float*)(f.b.numel() ? f.b.data_ptr<float>() : nullptr), f.b.numel(),
                        f.out.data_ptr<float>(), f.bsum.data_ptr<double>());
}

}  // namespace

// Uncached forward: out = x @ W.sum(0) + b.sum(), filling v (I doubles) and bsum (1 double) on the way so a caller
// can cache them. partial: float64 scratch of >= ceil(I/32) * B.
KP_EXPORT void colsum_gemv_forward(const at::TensorBase& w, const at::TensorBase& b, const at::TensorBase& x,
                                   const at::TensorBase& partial, const at::TensorBase& v,
                                   const at::TensorBase& bsum, const at::TensorBase& out) {
  launch_forward<TC, XU, HINT, CU>(check_forward(w, b, x, partial, v, bsum, out));
}

// Cached forward: out (B, 1) := x @ v + bsum with v, bsum from an earlier colsum_gemv_forward.
KP_EXPORT void gemv_bias(const at::TensorBase& x, const at::TensorBase& v, const at::TensorBase& bsum,
                         const at::TensorBase& out) {
  launch_gemv<GR, GU>(x, v, bsum, out);
}

#if KP_EXPERIMENTS  // A/B hooks for the bench scripts; not in the shipped build
// A/B hooks (bench/matmul_sum_max_mean_lse/ab.py): the same kernels with other tile/unroll choices.
KP_EXPORT void tune_forward(const at::TensorBase& w, const at::TensorBase& b, const at::TensorBase& x,
                            const at::TensorBase& partial, const at::TensorBase& v, const at::TensorBase& bsum,
                            const at::TensorBase& out, int64_t cfg) {
  const Forward f = check_forward(w, b, x, partial, v, bsum, out);
  switch (cfg) {
    case 0: launch_forward<64, 1>(f); break;
    case 1: launch_forward<64, 4>(f); break;
    case 2: launch_forward<64, 8>(f); break;
    case 3: launch_forward<32, 8>(f); break;
    case 4: launch_forward<32, 16>(f); break;
    case 5: launch_forward<64, 8, 1>(f); break;
    case 6: launch_forward<64, 8, 1, 16>(f); break;
    case 7: launch_forward<32, 8, 1>(f); break;
    default: TORCH_CHECK(false, "tune_forward: cfg 0..7, got ", kp::num(cfg));
  }
}

KP_EXPORT void tune_gemv(const at::TensorBase& x, const at::TensorBase& v, const at::TensorBase& bsum,
                         const at::TensorBase& out, int64_t cfg) {
  switch (cfg) {
    case 0: launch_gemv<1, 2>(x, v, bsum, out); break;
    case 1: launch_gemv<1, 4>(x, v, bsum, out); break;
    case 2: launch_gemv<2, 2>(x, v, bsum, out); break;
    case 3: launch_gemv<4, 2>(x, v, bsum, out); break;
    case 4: launch_gemv<2, 4>(x, v, bsum, out); break;
    case 5: launch_gemv<4, 1>(x, v, bsum, out); break;
    default: TORCH_CHECK(false, "tune_gemv: cfg 0..5, got ", kp::num(cfg));
  }
}
#endif  // KP_EXPERIMENTS
