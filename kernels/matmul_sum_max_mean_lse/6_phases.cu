// matmul_sum_max_mean_lse / 6_phases -- 4_overlap's column tile, readable in P column phases; shipped with one
// phase: W streamed without an L2 prefetch hint and x's first 512 rows copied to shared memory from the start.
// Requires: sm_90a (programmatic dependent launch: griddepcontrol)
//
// Same algebra as 1_colsum_gemv (the forward is x @ W.sum(0) + b.sum(); see that file's header for why it is exact).
// What changed from 4_overlap: there every CTA summed its whole 64-column tile over all O rows of W and only then
//   dotted 1024 x 64 elements of x with it, all of it after the last W byte had arrived, on every SM at once. The
//   idea here: read the tile's columns in P phases of 64/P columns; at the start of phase p reduce phase p-1's
//   column sums (phase p's loads already in flight) and dot XU rows of x's phase-(p-1) columns per W block, so only
//   the last phase's 1/P of the dots is left after the read. With the GPU's L2 flushed before each call, two phases
//   (128-byte row pieces) lost to one, and four (64-byte pieces) read W at 70% of the one-phase speed, so the
//   shipped build is P = 1. Against 4_overlap it then differs in what the A/B also measured: W loads carry no
//   L2::256B prefetch, x's first 512 rows (128 KiB) are copied to shared memory from the first W block on (not 768
//   rows from halfway), the other 512 rows are loaded after the shared-memory dots.
// Ownership and launch: CTA t owns columns [64t, 64t + 64) of W and x (grid = max(1, ceil(I/64))), 512 threads,
//   one CTA per SM. In every phase thread (cg, rg) = (tid % CP, tid / CP), CP = 16/P float4 columns, RGP = 512/CP
//   row groups: W rows rg + k*RGP (CU = 16 float4 loads in flight), x rows rg + k*RGP, XU per W block; a row's CP
//   lanes add their 4-column dots by shuffles. With P > 1 the row partials accumulate over the phases in
//   partial[i * tiles + t] (the CTA's own entries, L2: written in one phase, read back after a CTA barrier).
//   finish (programmatic dependent launch, tile_common.cuh): a warp per row adds the tiles' partials and b's slices.
// Bytes: 4*O*I + 4*B*I from DRAM (288 MiB at the bench shape, the minimum) + 8*B*tiles*(2P-1) of partials through
//   L2 (1 MiB at P = 1). Bound: memory (the W stream), then the tail: the column reduction, the dots from shared
//   memory, the x rows shared memory did not hold.
// Preconditions (checked, lse_common.cuh): float32 CUDA tensors on one device; W 2-D contiguous; x 2-D with
//   unit-stride rows and x.size(1) == W.size(1); b 1-D of W.size(0) (or empty); float64 scratch of
//   >= max(1, ceil(I/64)) * (B + 1). The float4 path needs 16-byte aligned W and x rows and I % 4 == 0; other
//   layouts run the shared scalar tile kernel.
// Numerics: every product and sum in float64, in a fixed order (deterministic); one rounding to fp32 at the end.
// Measured: H200, 1024x8192 @ 8192x8192, 2026-11-23, GPU time, L2 flushed (`python -m
//   bench.matmul_sum_max_mean_lse.phases_ab`, interleaved): 77.1 us = 3,917 GB/s, 94.7% of a plain read of the same
//   288 MiB (73.0 us); 4_overlap 83.1. The other configurations: docs/linear_problems.md.
#include "tile_common.cuh"

namespace {

using lse::Forward;

constexpr int FT = lse::TILE_FT, TC = lse::TILE_TC;
constexpr int CU = 16;        // W float4 loads in flight per thread per block
constexpr int XS_MAX_KB = 192;  // most shared memory for the last phase's x columns (the row buffer holds that)

// W is streamed once and read in 256/P-byte pieces, x's copy in 16/P-byte ones: no L2 prefetch beyond the piece
// (lse::load_w<false>, lse::cp_async16<false>; a 256-byte fill would bring in the next phase's columns a whole
// phase early, and they would be evicted unused).

template <int CP>
__device__ __forceinline__ double lanes_sum(double d) {  // over the CP lanes of a row group (xor butterfly)
#pragma unroll
  for (int o = CP / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
  return d;
}

// Column sums of one phase: red[rg][j] holds row group rg's sum of phase column j; column j gets L = RGP / 4
// consecutive lanes, each adding 4 row groups, then log2(L) shuffle levels (a fixed order).
template <int CP>
__device__ __forceinline__ void column_sums(const double (*red)[4 * CP + 1], double* vtd, double* __restrict__ v,
                                            int64_t col0, int64_t I) {
  constexpr int RGP = FT / CP, L = RGP / 4;
  const int j = threadIdx.x / L, pp = threadIdx.x % L;
  double s = (red[4 * pp][j] + red[4 * pp + 1][j]) + (red[4 * pp + 2][j] + red[4 * pp + 3][j]);
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (pp == 0) {
    vtd[j] = s;
    if (col0 + j < I) v[col0 + j] = s;
  }
}

// P: column phases per tile; XU: x rows per W block; DOTS = false leaves x out (an A/B floor, wrong output);
// PFH: the last phase's x copy is issued halfway through that phase's W blocks, not at its start; EARLY: the first
// batch of x rows beyond shared memory is loaded before the tail's column reduction, not after the shared dots;
// XSK: KiB of shared memory for x.
template <int P, int XU, bool DOTS, int XSK, bool PFH, bool EARLY>
__global__ void __launch_bounds__(FT, 1)
    tile_phases(const float* __restrict__ w, int64_t O, int64_t I, const float* __restrict__ x, int64_t B, int64_t xs,
              const float* __restrict__ b, int64_t nb, double* __restrict__ partial, int64_t tiles,
              double* __restrict__ v, int xr, int64_t* trace) {
  constexpr int CP = TC / 4 / P, RGP = FT / CP, TP = 4 * CP;
  static_assert(TC % (4 * P) == 0 && RGP % 4 == 0 && RGP / 4 <= 32, "phase shape");
  extern __shared__ __align__(16) float xsm[];  // [xr][TP]: x's columns of the last phase
  __shared__ double red[RGP][TP + 1];           // +1: a column's row-group sums fall in different banks
  __shared__ double vtd[TP];
  __shared__ double bred[FT / 32];
  const int cg = threadIdx.x % CP, rg = threadIdx.x / CP;
  const int64_t tile0 = (int64_t)blockIdx.x * TC;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  lse::stamp(trace, 0);
  const double bacc = lse::b_slice_part(b, nb, tiles);
  const int64_t nwb = (O + (int64_t)RGP * CU - 1) / ((int64_t)RGP * CU);  // W blocks per phase
  const int64_t nxb = (B + (int64_t)RGP * XU - 1) / ((int64_t)RGP * XU);  // x blocks per phase's columns
  double vd[4] = {0., 0., 0., 0.};
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int64_t c = tile0 + p * TP + 4 * cg;  // this thread's 4 W columns in phase p
    const int64_t cx = c - TP;                  // its x columns of phase p - 1
    const bool live = c < I, xlive = p > 0 && cx < I;
    // The last phase's x columns go to shared memory under this phase's W stream (one commit group per thread).
    auto prefetch = [&]() {
      if (DOTS && live)
        for (int i = rg; i < xr; i += RGP) lse::cp_async16<false>(xsm + i * TP + 4 * cg, x + i * xs + c);
      asm volatile("cp.async.commit_group;" ::: "memory");
    };
    double a[4] = {0., 0., 0., 0.};
    // Phases after the first run at least 2 blocks: block 0 reduces the previous phase's column sums, block 1
    // reads them; the x blocks run from block 1 on, past the W blocks if x has more rows per thread than W.
    const int64_t nk = p == 0 ? nwb : kp::imax(kp::imax(nwb, 2), (DOTS ? nxb : 0) + 1);
    const int64_t pf_k = PFH ? nk / 2 : 0;
    if (p == P - 1 && nk <= pf_k) prefetch();
    for (int64_t k = 0; k < nk; ++k) {
      if (p == P - 1 && k == pf_k) prefetch();
      float4 q[CU];
#pragma unroll
      for (int u = 0; u < CU; ++u) {
        const int64_t r = rg + (int64_t)RGP * (k * CU + u);
        q[u] = (live && r < O) ? lse::load_w<false>(w + r * I + c) : zero;
      }
      const int64_t kx = k - 1;  // the x block of this W block (phases after the first)
      const bool xblk = DOTS && p > 0 && kx >= 0 && kx < nxb;
      float4 xq[XU];
      double pq[XU];
      if (xblk) {
#pragma unroll
        for (int u = 0; u < XU; ++u) {
          const int64_t i = rg + (int64_t)RGP * (kx * XU + u);
          xq[u] = (xlive && i < B) ? __ldg(reinterpret_cast<const float4*>(x + i * xs + cx)) : zero;
          pq[u] = (p > 1 && cg == 0 && i < B) ? __ldcg(partial + i * tiles + blockIdx.x) : 0.;
        }
      }
      if (p > 0 && k == 0) {  // every thread has stored phase p-1's sums (end of its loop): reduce them
        __syncthreads();
        column_sums<CP>(red, vtd, v, tile0 + (p - 1) * TP, I);
      }
      if (p > 0 && k == 1) {
        __syncthreads();
#pragma unroll
        for (int j = 0; j < 4; ++j) vd[j] = vtd[4 * cg + j];
      }
#pragma unroll
      for (int u = 0; u < CU; ++u) { a[0] += q[u].x; a[1] += q[u].y; a[2] += q[u].z; a[3] += q[u].w; }
      if (xblk) {
#pragma unroll
        for (int u = 0; u < XU; ++u) {
          const int64_t i = rg + (int64_t)RGP * (kx * XU + u);
          const double d = lanes_sum<CP>(lse::dot4<true>(xq[u], zero, vd));
          if (cg == 0 && i < B) __stcg(partial + i * tiles + blockIdx.x, pq[u] + d);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) red[rg][4 * cg + j] = a[j];
    if (p == 0) lse::stamp(trace, 1);
  }
  lse::stamp(trace, 2);
  // The tail: the last phase's column sums, then its dots. b_slice_store's block reduction is also the barrier
  // after every thread's last stores (red, and the partials of the last phase's x blocks). The partials of the rows
  // this thread will finish (rows tid, tid + FT of the shared-memory ones) are loaded right after it, so their L2
  // latency hides under the column reduction and the dots.
  const int64_t c = tile0 + (P - 1) * TP + 4 * cg;  // this thread's x columns in the tail
  const bool live = c < I;
  float4 qd[CP];  // a batch of x rows beyond shared memory: CP rows per row group
  auto load_rows = [&](int64_t i0) {
#pragma unroll
    for (int j = 0; j < CP; ++j) {
      const int64_t i = i0 + rg + (int64_t)RGP * j;
      qd[j] = (i < B && live) ? __ldg(reinterpret_cast<const float4*>(x + i * xs + c)) : zero;
    }
  };
  if (EARLY && DOTS) load_rows(xr);
  lse::b_slice_store(bacc, bred, partial, tiles, B);
  constexpr int NPR = 2;
  double pri[NPR];
#pragma unroll
  for (int j = 0; j < NPR; ++j) {
    const int64_t i = threadIdx.x + (int64_t)FT * j;
    pri[j] = (DOTS && P > 1 && i < xr) ? __ldcg(partial + i * tiles + blockIdx.x) : 0.;
  }
  column_sums<CP>(red, vtd, v, tile0 + (P - 1) * TP, I);
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  lse::stamp(trace, 3);
  if (!DOTS) return;
#pragma unroll
  for (int j = 0; j < 4; ++j) vd[j] = vtd[4 * cg + j];
  // Shared-memory rows: batches of CP rows per row group, a transposed reduction leaves row rg + RGP*(m0 + cg) in
  // lane cg; the sums go to red (reused as a row buffer), then each thread adds rows tid, tid + FT, ... to partial.
  double* rowbuf = &red[0][0];
  static_assert(XSK <= XS_MAX_KB && RGP * (TP + 1) >= XSK * 1024 / (TP * 4),
                "the row buffer holds every shared-memory row");
  const int mt = (xr + RGP - 1) / RGP;  // (column_sums' reads of red ended before the barrier above)
  for (int m0 = 0; m0 < mt; m0 += CP) {
    double d[CP];
#pragma unroll
    for (int j = 0; j < CP; ++j) {
      const int i = rg + RGP * (m0 + j);
      d[j] = (i < xr && live) ? lse::dot4<true>(*reinterpret_cast<const float4*>(xsm + i * TP + 4 * cg), zero, vd)
                              : 0.;
    }
    const int i = rg + RGP * (m0 + cg);
    const double s = lse::reduce_rows(d, cg);
    if (i < xr) rowbuf[i] = s;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x, j = 0; i < xr; i += FT, ++j) {
    double prior = 0.;
    if (P > 1) {
#pragma unroll
      for (int jj = 0; jj < NPR; ++jj)
        if (jj == j) prior = pri[jj];
      if (j >= NPR) prior = __ldcg(partial + i * tiles + blockIdx.x);
    }
    __stcg(partial + i * tiles + blockIdx.x, prior + rowbuf[i]);
  }
  lse::stamp(trace, 4);
  // Rows beyond shared memory (B > xr): straight from DRAM, CP rows per row group per batch.
  for (int64_t i0 = xr; i0 < B; i0 += (int64_t)RGP * CP) {
    if (!EARLY || i0 > xr) load_rows(i0);
    double d[CP];
#pragma unroll
    for (int j = 0; j < CP; ++j) d[j] = lse::dot4<true>(qd[j], zero, vd);
    const int64_t i = i0 + rg + (int64_t)RGP * cg;
    const double s = lse::reduce_rows(d, cg);
    if (i < B) __stcg(partial + i * tiles + blockIdx.x, (P > 1 ? __ldcg(partial + i * tiles + blockIdx.x) : 0.) + s);
  }
  lse::stamp(trace, 5);
}

constexpr int P_CHOSEN = 1, XU_CHOSEN = 4;  // XU matters only for P > 1

template <int P, int XU, bool DOTS, int XSK = 128, bool PFH = false, bool EARLY = false>
void launch_forward(const Forward& f, int64_t* trace = nullptr) {
  const c10::cuda::CUDAGuard guard(f.w.device());
  const int dev = f.w.device().index();
  // At least one CTA even for I == 0: the CTAs also sum b, which the output needs whatever I is.
  const int64_t tiles = std::max<int64_t>(1, (f.I + TC - 1) / TC);
  TORCH_CHECK(tiles <= 2147483647LL, "too many columns: ", kp::num(f.I));
  lse::check_f64(f.partial, f.w, "partial", tiles * (f.B + 1));
  double* part = f.partial.data_ptr<double>();
  if (f.vec) {
    constexpr int TP = TC / P;
    const int xr = (int)std::min<int64_t>(f.B, XSK * 1024 / (TP * 4));
    const size_t smem = (size_t)xr * TP * 4;
    C10_CUDA_CHECK(
        cudaFuncSetAttribute(tile_phases<P, XU, DOTS, XSK, PFH, EARLY>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    tile_phases<P, XU, DOTS, XSK, PFH, EARLY><<<(unsigned)tiles, FT, smem, kp::stream()>>>(
        f.w.data_ptr<float>(), f.O, f.I, f.x.data_ptr<float>(), f.B, f.x.stride(0),
        f.b.numel() ? f.b.data_ptr<float>() : nullptr, f.b.numel(), part, tiles, f.v.data_ptr<double>(), xr, trace);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else {
    lse::launch_tile_scalar(f, part, tiles);
  }
  lse::launch_finish(part, tiles, f.B, f.out.data_ptr<float>(), f.bsum.data_ptr<double>(), dev);
}

}  // namespace

// Uncached forward: out = x @ W.sum(0) + b.sum(), filling v (I doubles) and bsum (1 double) on the way so a caller
// can cache them. partial: float64 scratch of >= max(1, ceil(I/64)) * (B + 1).
KP_EXPORT void colsum_gemv_forward(const at::TensorBase& w, const at::TensorBase& b, const at::TensorBase& x,
                                   const at::TensorBase& partial, const at::TensorBase& v,
                                   const at::TensorBase& bsum, const at::TensorBase& out) {
  launch_forward<P_CHOSEN, XU_CHOSEN, true>(lse::check_forward(w, b, x, partial, v, bsum, out));
}

// Cached forward: out (B, 1) := x @ v + bsum with v, bsum from an earlier colsum_gemv_forward (4_overlap's GEMV).
KP_EXPORT void gemv_bias(const at::TensorBase& x, const at::TensorBase& v, const at::TensorBase& bsum,
                         const at::TensorBase& out) {
  lse::launch_gemv<2, 2>(x, v, bsum, out);
}

#if KP_EXPERIMENTS  // A/B hooks for the bench scripts; not in the shipped build
// A/B hook (bench/matmul_sum_max_mean_lse/phases_ab.py): cfg 0..4 = (P, XU) of (1, 4), (2, 2), (2, 4), (4, 2),
// (4, 4) with 128 KiB of x in shared memory, its copy issued at the start of the last phase; cfg + 10: the same
// without any x work (a floor: wrong output); P = 1, XU = 4 with (x KiB, copy at half, early DRAM rows): 5 (192, no,
// no), 6 (192, no, yes), 7 (192, yes, yes), 8 (128, no, yes). trace: int64 (tiles x 8) globaltimer stamps per CTA
// (start, phase 0 read, last read, tail reduction, shared-memory dots, end) or an empty tensor.
KP_EXPORT void tune_forward(const at::TensorBase& w, const at::TensorBase& b, const at::TensorBase& x,
                            const at::TensorBase& partial, const at::TensorBase& v, const at::TensorBase& bsum,
                            const at::TensorBase& out, int64_t cfg, const at::TensorBase& trace) {
  const Forward f = lse::check_forward(w, b, x, partial, v, bsum, out);
  int64_t* tr = lse::trace_ptr(trace, 8 * ((f.I + TC - 1) / TC), "8 x tiles");
  switch (cfg) {
    case 0: launch_forward<1, 4, true>(f, tr); break;
    case 1: launch_forward<2, 2, true>(f, tr); break;
    case 2: launch_forward<2, 4, true>(f, tr); break;
    case 3: launch_forward<4, 2, true>(f, tr); break;
    case 4: launch_forward<4, 4, true>(f, tr); break;
    case 5: launch_forward<1, 4, true, 192>(f, tr); break;
    case 6: launch_forward<1, 4, true, 192, false, true>(f, tr); break;
    case 7: launch_forward<1, 4, true, 192, true, true>(f, tr); break;
    case 8: launch_forward<1, 4, true, 128, false, true>(f, tr); break;
    case 10: launch_forward<1, 4, false>(f, tr); break;
    case 12: launch_forward<2, 4, false>(f, tr); break;
    case 14: launch_forward<4, 4, false>(f, tr); break;
    default: TORCH_CHECK(false, "tune_forward: cfg 0..8, 10, 12, 14; got ", kp::num(cfg));
  }
}
#endif  // KP_EXPERIMENTS
