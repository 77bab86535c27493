// matmul_sum_max_mean_lse / 4_overlap -- 2_inflight with the x tile read while W streams, not after it.
// Requires: sm_90a (programmatic dependent launch: griddepcontrol)
//
// Same algebra as 1_colsum_gemv (the forward is x @ W.sum(0) + b.sum(); see that file's header for why it is exact).
// What changed from 2_inflight: its x phase started only when the CTA's W loop had ended and took 4 dependent
//   rounds of DRAM latency (1024 rows / (32 row groups x 8 loads in flight)). Here up to XR_MAX rows of the CTA's
//   x tile are copied into shared memory with cp.async (no registers held) when the W loop is half done, so the x
//   bytes share the stream with W; after the column sum only rows beyond XR_MAX come from DRAM, and their loads are
//   issued before the column reduction. Also: the 16 lanes of a row reduce 16 rows at once (transposed shuffle
//   reduction, 15 shuffles instead of 64); b.sum() is sliced over the CTAs (no CTA reads all of b); the partials
//   are row-major (partial[i * tiles + t]) so `finish` reduces a row with one coalesced warp read.
// Ownership and launch:
//   overlap: CTA t owns columns [t*TC, (t+1)*TC) of W and x (TC = 64; grid = max(1, ceil(I/TC))); 512 threads =
//     16 float4 columns x 32 row groups. Phase 1 sums the tile over all O rows of W (CU = 16 float4 per thread in
//     flight) and, at row pf_row = O/2, issues the x tile rows [0, xr) into shared memory (xr = min(B, 768));
//     phase 2 writes v[tile], dots the shared-memory rows with it, then the rows >= xr (16 per thread in flight).
//     One CTA per SM (192 KiB dynamic + 17 KiB static shared memory, 128 registers).
//   finish (programmatic dependent launch): a warp per row adds the row's `tiles` partials and the b slices.
// Bytes: 4*O*I + 4*B*I + 8*B*tiles (partials, L2-resident) = 288 MiB + 1 MiB at the bench shape; minimum 288 MiB.
//   Bound: memory for the W stream; the tail after it (x dots: one float->double convert per element at 16/clk/SM,
//   ~1.6 us of the 3.5 us; the DRAM remainder rows; `finish`) is latency/compute and is what separates this kernel
//   from a plain read.
// Preconditions (checked, lse_common.cuh): float32 CUDA tensors on one device; W 2-D contiguous; x 2-D with
//   unit-stride rows and x.size(1) == W.size(1); b 1-D of W.size(0) (or empty); float64 scratch of
//   >= max(1, ceil(I/64)) * (B + 1). The prefetch needs the float4 path (16-byte aligned W and x rows, I % 4 == 0);
//   other layouts run 2_inflight's scalar loops.
// Numerics: every product and sum in float64, partials added in a fixed order (deterministic), one rounding to
//   fp32 at the end (relL2 2.5e-8 at the bench shape, as 2_inflight).
// Measured: H200, 1024x8192 @ 8192x8192, 2026-11-22, GPU time, L2 read-flushed (bench/matmul_sum_max_mean_lse/ab.py --no-gemm, one
//   run, interleaved): 78.4 us = 3,850 GB/s of the 288 MiB minimum; 2_inflight 82.5 us; a plain read of W then x by
//   the bw probe (two kernels) 69.8 us. Issue-4 target (<= 70 us uncached) NOT met: on this machine the plain read
//   alone takes 69.8 us. Per-phase trace (us, median CTA): W + x prefetch 60.5 (4.85 TB/s), column sum + wait for x
//   3.5 (waiting for the CTA's slowest warp; the x copy itself has landed by then), x dots from shared memory 3.5,
//   DRAM rows 1.5, then `finish`. Through run.py (ModelNew, cache off): 0.079 ms vs 2_inflight 0.084-0.086 without
//   3_rowband in the table, a tie (0.083 / 0.083) with it, because 3_rowband's 9 MiB of dirty L2 lines survived the
//   read flush and were written back during the next row (README, "Order sensitivity"). Since the harness times
//   each row after a call of itself: 0.081 vs 0.082 ms in the full table.
//   A/B in that run (us): fp32 lane sums 76.8 (fewer converts, but per-row error 3e-5 on cancelling rows and an odd
//   case outside the fp32 budget: rejected); cooperative grid barrier + in-kernel row finish instead of `finish`
//   78.9; warps taking 32-row W chunks dynamically 81.9 (the static unrolled loop keeps more loads in flight);
//   prefetch at 0 / 0.25 / 0.75 of W: x at the start slows W by ~5 us, 0.5 and 0.75 tie. A `finish` made resident
//   early (112 registers, launch_dependents) did not help either (81.1 vs 81.5 in an earlier run).
#include <cooperative_groups.h>

#include "tile_common.cuh"

namespace cg = cooperative_groups;

namespace {

using lse::Forward;

constexpr int FT = lse::TILE_FT, TC = lse::TILE_TC, CG = TC / 4, RG = FT / CG;
constexpr int CU = 16;                                  // W loop unroll (float4 loads in flight per thread)
constexpr int XR_MAX = 768;                             // x rows per tile in shared memory: 768 x 256 B = 192 KiB
constexpr int GR = 2, GU = 2;                           // cached GEMV (lse_common.cuh), as 2_inflight
static_assert(FT == 8 * TC && RG == 32, "the column reduction gives each column 8 lanes of 4 row groups");

// Sum rows [r0 + rg, r1) step RG of this thread's 4 columns (r0 a multiple of RG keeps every thread's row phase).
__device__ __forceinline__ void w_rows(const float* __restrict__ w, int64_t I, int64_t c, int64_t r0, int64_t r1,
                                       int rg, double (&a)[4]) {
#pragma unroll CU
  for (int64_t r = r0 + rg; r < r1; r += RG) {
    const float4 q = lse::load_w(w + r * I + c);
    a[0] += q.x; a[1] += q.y; a[2] += q.z; a[3] += q.w;
  }
}

// Dynamic variant: warps take 32-row chunks from a shared-memory counter, so a warp whose loads come back late
// does fewer chunks and the CTA's 16 warps end their W share together (the static split waits for the slowest).
// A warp issues its lanes' x prefetch when it first takes a chunk >= pf_chunk (or after the loop).
__device__ __forceinline__ void w_rows_dyn(const float* __restrict__ w, int64_t O, int64_t I, int64_t c, bool live,
                                           int* next, int64_t pf_chunk, double (&a)[4], float* xsm,
                                           const float* __restrict__ x, int64_t xs, int xr, int rg, int cg) {
  const int lane = threadIdx.x & 31, half = lane >> 4;
  const int64_t nchunks = (O + 2 * CU - 1) / (2 * CU);
  bool pf_done = false;
  auto prefetch = [&]() {
    if (live)
      for (int i = rg; i < xr; i += RG) lse::cp_async16(xsm + i * TC + 4 * cg, x + i * xs + c);
    asm volatile("cp.async.commit_group;" ::: "memory");
    pf_done = true;
  };
  for (;;) {
    int k = 0;
    if (lane == 0) k = atomicAdd(next, 1);
    k = __shfl_sync(0xffffffffu, k, 0);
    if (k >= nchunks) break;
    if (!pf_done && k >= pf_chunk) prefetch();
    float4 q[CU];
#pragma unroll
    for (int u = 0; u < CU; ++u) {
      const int64_t r = (int64_t)k * 2 * CU + 2 * u + half;
      q[u] = (live && r < O) ? lse::load_w(w + r * I + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < CU; ++u) { a[0] += q[u].x; a[1] += q[u].y; a[2] += q[u].z; a[3] += q[u].w; }
  }
  if (!pf_done) prefetch();
}

#define OVERLAP_PARAMS                                                                                        \
  const float *__restrict__ w, int64_t O, int64_t I, const float *__restrict__ x, int64_t B, int64_t xs,         \
      const float *__restrict__ b, int64_t nb, double *__restrict__ partial, int64_t tiles, double *__restrict__ v, \
      int xr, int64_t pf_row, float *__restrict__ out, double *__restrict__ bsum, int64_t *trace
#define OVERLAP_ARGS w, O, I, x, B, xs, b, nb, partial, tiles, v, xr, pf_row, out, bsum, trace

// COOP: the grid is co-resident (cooperative launch); after a grid barrier every CTA finishes rows itself, so
// no second kernel (launch + completion flush) follows.
template <bool COOP, bool DBL, bool DYN>
__device__ __forceinline__ void overlap_body(OVERLAP_PARAMS) {
  extern __shared__ __align__(16) float xsm[];  // [xr][TC]
  __shared__ double red[RG][TC + 1];  // +1: the 8 row-group parts of a column fall in different banks
  __shared__ float4 vt4[CG];
  __shared__ double vtd[TC];
  __shared__ double bred[FT / 32];
  const int cg = threadIdx.x % CG, rg = threadIdx.x / CG;
  const int64_t c = (int64_t)blockIdx.x * TC + 4 * cg;  // first of this thread's 4 columns
  const bool live = c < I;                              // I % 4 == 0 on this path: all 4 columns or none
  lse::stamp(trace, 0);
#if KP_EXPERIMENTS
  const long long clk0 = clock64();  // trace slot 7: SM cycles from stamp 0 to stamp 4 (the clock rate, with 0..4)
#endif
  // This CTA's slice of b.sum(): one float per thread at most for O <= tiles * FT (else a strided loop); summed
  // after the W loop so the loads never stall it.
  const double bacc = lse::b_slice_part(b, nb, tiles);
  double a[4] = {0., 0., 0., 0.};
  if constexpr (DYN) {
    __shared__ int next_chunk;
    if (threadIdx.x == 0) next_chunk = 0;
    __syncthreads();
    w_rows_dyn(w, O, I, c, live, &next_chunk, pf_row / (2 * CU), a, xsm, x, xs, xr, rg, cg);
  } else {
    const int64_t split = pf_row < O ? pf_row : O;
    if (live) w_rows(w, I, c, 0, split, rg, a);
    if (live)
      for (int i = rg; i < xr; i += RG) lse::cp_async16(xsm + i * TC + 4 * cg, x + i * xs + c);
    asm volatile("cp.async.commit_group;" ::: "memory");
    if (live) w_rows(w, I, c, split, O, rg, a);
  }
  lse::stamp(trace, 1);
  // The first batch of x rows beyond the shared-memory ones goes out now, so its DRAM latency overlaps the column
  // reduction and the shared-memory dots.
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  float4 q[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int64_t i = xr + rg + (int64_t)RG * j;
    q[j] = (i < B && live) ? __ldg(reinterpret_cast<const float4*>(x + i * xs + c)) : zero;
  }
  lse::b_slice_store(bacc, bred, partial, tiles, B);
#pragma unroll
  for (int k = 0; k < 4; ++k) red[rg][4 * cg + k] = a[k];
  __syncthreads();
  {  // column j's 32 row-group sums: 8 consecutive lanes add 4 each, then 3 shuffle levels (fixed order)
    const int j = threadIdx.x / 8, p = threadIdx.x % 8;
    double s = (red[4 * p][j] + red[4 * p + 1][j]) + (red[4 * p + 2][j] + red[4 * p + 3][j]);
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (p == 0) {
      reinterpret_cast<float*>(vt4)[j] = (float)s;
      vtd[j] = s;
      const int64_t col = (int64_t)blockIdx.x * TC + j;
      if (col < I) v[col] = s;
    }
  }
  lse::stamp(trace, 6);
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  lse::stamp(trace, 2);
  const float4 vf = vt4[cg];
  double vd[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) vd[k] = vtd[4 * cg + k];
  double d[16];
  const int mt = (xr + RG - 1) / RG;  // row batches of 16 x RG: uniform over the CTA, so every lane shuffles
  for (int m0 = 0; m0 < mt; m0 += 16) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int i = rg + RG * (m0 + j);
      d[j] = (i < xr && live) ? lse::dot4<DBL>(*reinterpret_cast<const float4*>(xsm + i * TC + 4 * cg), vf, vd) : 0.;
    }
    const int i = rg + RG * (m0 + cg);
    const double s = lse::reduce_rows(d, cg);
    if (i < xr) partial[(int64_t)i * tiles + blockIdx.x] = s;
  }
  lse::stamp(trace, 3);
  for (int64_t i0 = xr; i0 < B; i0 += (int64_t)RG * 16) {
    if (i0 > xr) {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int64_t i = i0 + rg + (int64_t)RG * j;
        q[j] = (i < B && live) ? __ldg(reinterpret_cast<const float4*>(x + i * xs + c)) : zero;
      }
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) d[j] = lse::dot4<DBL>(q[j], vf, vd);
    const int64_t i = i0 + rg + (int64_t)RG * cg;
    const double s = lse::reduce_rows(d, cg);
    if (i < B) partial[i * tiles + blockIdx.x] = s;
  }
  lse::stamp(trace, 4);
#if KP_EXPERIMENTS
  if (trace && threadIdx.x == 0) trace[blockIdx.x * 8 + 7] = clock64() - clk0;
#endif
  if constexpr (COOP) {
    __threadfence();
    cg::this_grid().sync();
    lse::finish_rows(partial, tiles, B, out, bsum, (int64_t)blockIdx.x * (FT / 32) + (threadIdx.x >> 5),
                (int64_t)gridDim.x * (FT / 32));
    lse::stamp(trace, 5);
  }
}

template <bool COOP, bool DBL, bool DYN>
__global__ void __launch_bounds__(FT, 1) overlap(OVERLAP_PARAMS) { overlap_body<COOP, DBL, DYN>(OVERLAP_ARGS); }

constexpr double PF = 0.5;                   // chosen prefetch point (bench/matmul_sum_max_mean_lse/ab.py)
constexpr bool COOP_CHOSEN = false, DBL_CHOSEN = true, DYN_CHOSEN = false;

// pf: where the x prefetch is issued, as a fraction of the W rows (0 = before the first W load). COOP is taken only
// where the whole grid fits on the device at once (tiles <= CTAs per SM x SMs); otherwise `finish` follows.
template <bool COOP, bool DBL, bool DYN>
void launch_forward(const Forward& f, double pf = PF, int64_t* trace = nullptr) {
  const c10::cuda::CUDAGuard guard(f.w.device());
  const int dev = f.w.device().index();
  // At least one CTA even for I == 0: the CTAs also sum b, which the output needs whatever I is.
  const int64_t tiles = std::max<int64_t>(1, (f.I + TC - 1) / TC);
  TORCH_CHECK(tiles <= 2147483647LL, "too many columns: ", kp::num(f.I));
  lse::check_f64(f.partial, f.w, "partial", tiles * (f.B + 1));
  const float* w = f.w.data_ptr<float>();
  const float* x = f.x.data_ptr<float>();
  const float* b = f.b.numel() ? f.b.data_ptr<float>() : nullptr;
  double* part = f.partial.data_ptr<double>();
  double* v = f.v.data_ptr<double>();
  double* bsum = f.bsum.data_ptr<double>();
  float* out = f.out.data_ptr<float>();
  int64_t O = f.O, I = f.I, B = f.B, xs = f.x.stride(0), nb = f.b.numel();
  bool coop = false;
  if (f.vec) {
    int xr = (int)std::min<int64_t>(B, XR_MAX);
    int64_t pf_row = (int64_t)(pf * (double)O) / RG * RG;
    const size_t smem = (size_t)xr * TC * 4;
    if constexpr (COOP) {
      int can = 0, occ = 0;
      C10_CUDA_CHECK(cudaDeviceGetAttribute(&can, cudaDevAttrCooperativeLaunch, dev));
      C10_CUDA_CHECK(cudaFuncSetAttribute(overlap<true, DBL, DYN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
      C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, overlap<true, DBL, DYN>, FT, smem));
      coop = can && tiles <= (int64_t)occ * lse::sm_count(dev);
    }
    if (coop) {
      void* args[] = {&w, &O, &I, &x, &B, &xs, &b, &nb, &part, (void*)&tiles, &v, &xr, &pf_row, &out, &bsum, &trace};
      C10_CUDA_CHECK(cudaLaunchCooperativeKernel((const void*)overlap<true, DBL, DYN>, dim3((unsigned)tiles), dim3(FT),
                                                 args, smem, kp::stream()));
    } else {
      C10_CUDA_CHECK(cudaFuncSetAttribute(overlap<false, DBL, DYN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
      overlap<false, DBL, DYN><<<(unsigned)tiles, FT, smem, kp::stream()>>>(w, O, I, x, B, xs, b, nb, part, tiles, v, xr,
                                                                       pf_row, out, bsum, trace);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  } else {
    lse::launch_tile_scalar(f, part, tiles);
  }
  if (coop) return;
  lse::launch_finish(part, tiles, B, out, bsum, dev);
}

}  // namespace

// Uncached forward: out = x @ W.sum(0) + b.sum(), filling v (I doubles) and bsum (1 double) on the way so a caller
// can cache them. partial: float64 scratch of >= max(1, ceil(I/64)) * (B + 1).
KP_EXPORT void colsum_gemv_forward(const at::TensorBase& w, const at::TensorBase& b, const at::TensorBase& x,
                                   const at::TensorBase& partial, const at::TensorBase& v,
                                   const at::TensorBase& bsum, const at::TensorBase& out) {
  launch_forward<COOP_CHOSEN, DBL_CHOSEN, DYN_CHOSEN>(lse::check_forward(w, b, x, partial, v, bsum, out));
}

// Cached forward: out (B, 1) := x @ v + bsum with v, bsum from an earlier colsum_gemv_forward.
KP_EXPORT void gemv_bias(const at::TensorBase& x, const at::TensorBase& v, const at::TensorBase& bsum,
                         const at::TensorBase& out) {
  lse::launch_gemv<GR, GU>(x, v, bsum, out);
}

#if KP_EXPERIMENTS  // A/B hooks for the bench scripts; not in the shipped build
// A/B hook (bench/matmul_sum_max_mean_lse/ab.py): pf = where the x prefetch is issued (fraction of the W rows); cfg: 0 fp32 lane sums,
// 1 float64 + grid barrier, 2 float64, 3 float64 + dynamic W chunks, 4 = 3 + grid barrier, 5 fp32 + dynamic; trace: int64 (tiles x 8) globaltimer stamps per CTA at the phase boundaries, or an empty tensor.
KP_EXPORT void tune_forward(const at::TensorBase& w, const at::TensorBase& b, const at::TensorBase& x,
                            const at::TensorBase& partial, const at::TensorBase& v, const at::TensorBase& bsum,
                            const at::TensorBase& out, double pf, int64_t cfg, const at::TensorBase& trace) {
  const Forward f = lse::check_forward(w, b, x, partial, v, bsum, out);
  TORCH_CHECK(pf >= 0.0 && pf <= 1.0, "tune_forward: pf in [0, 1]");
  int64_t* tr = lse::trace_ptr(trace, 8 * ((f.I + TC - 1) / TC), "8 x tiles");
  switch (cfg) {
    case 0: launch_forward<false, false, false>(f, pf, tr); break;
    case 1: launch_forward<true, true, false>(f, pf, tr); break;
    case 2: launch_forward<false, true, false>(f, pf, tr); break;
    case 3: launch_forward<false, true, true>(f, pf, tr); break;
    case 4: launch_forward<true, true, true>(f, pf, tr); break;
    case 5: launch_forward<false, false, true>(f, pf, tr); break;
    default: TORCH_CHECK(false, "tune_forward: cfg 0..5, got ", kp::num(cfg));
  }
}
#endif  // KP_EXPERIMENTS
