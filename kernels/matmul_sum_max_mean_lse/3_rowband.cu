// matmul_sum_max_mean_lse / 3_rowband -- W read in whole contiguous rows (row bands), one cooperative kernel.
// Requires: sm_90a (TMA bulk copies and mbarriers)
// Record: an earlier W-row-band design, slower than 4_overlap (docs/linear_problems.md)
// A measured negative result: SLOWER than 2_inflight (92.6-101 us vs 82.3 us in the same run), kept as the record
// of why; ModelNew's default stays 2_inflight. See "Measured" for where the time goes.
//
// What changed from 2_inflight: 2 gave each CTA a 64-column tile of W, i.e. 256-byte pieces of every row 32 KiB
//   apart. tools/bw_probe.py measured that pattern at 4.2 TB/s on the H200 while a plain streaming read of the
//   same 288 MiB ran at 4.7 TB/s (63.9 us): the 70 us target is a read-speed problem, not a compute one. Here
//   CTA p reads rows [p*O/G, (p+1)*O/G) of W whole, front to back (each warp load is 512 contiguous bytes, each
//   CTA streams one contiguous 2 MiB band), and the column sums become a cross-CTA reduction that one grid-wide
//   barrier orders. x is not read after W: each CTA's slice of x is bulk-copied (TMA) into shared memory at kernel
//   start, so its bytes stream in with W's.
// Ownership and launch: a cooperative grid of G = #SMs CTAs x 512 threads (one per SM: 220 KiB of shared memory).
//   Phase 1: work item (band, panel): band = rows [b*O/NB, (b+1)*O/NB) of W, panel = 8192 columns; thread t owns
//     float4 columns t + 512j (j < 4) of the panel and keeps 2 rows x 4 float4 = 8 loads (128 B) in flight, the
//     depth bw_probe found to saturate reads with one CTA per SM; 16 float64 column sums per thread; the band's
//     sums go to partial[b, :]. NB = G (fewer only if the scratch cannot hold NB x I doubles: very wide W).
//   grid.sync()
//   Phase 2: CTA p owns columns [p*width, (p+1)*width) (width = I/G rounded up to 4: 64 at I = 8192): v = sum over
//     bands of partial[:, slice] (from L2, fixed order), written to v (ModelNew caches it). CTA 0 also sums b.
//   Phase 3: one warp per row of x: dot(x[i, slice], v[slice]) from the prefetched shared-memory copy (880 of 1024
//     rows fit at the bench shape; the rest are loaded 8 rows per warp at a time) -> rowpart[p, i].
//   grid.sync()
//   Phase 4: one warp per row: out[i] = sum_p rowpart[p, i] + sum(b), fixed order.
// Bytes: 4*O*I + 4*B*I from DRAM (288 MiB, the floor) + 8*NB*I + 8*G*B through L2 (9.7 MiB); bound: memory.
//   At 4.7 TB/s the floor is 64 us; the two barriers, the post-barrier x rows and the launch are the overhead.
// Preconditions (checked, lse_common.cuh): float32 CUDA tensors on one device; W 2-D contiguous; x 2-D with
//   unit-stride rows, x.size(1) == W.size(1); b 1-D of W.size(0) or empty; float64 scratch of at least
//   G*B + I doubles (more lets NB reach G); cooperative launch support. float4/TMA paths need I % 4 == 0 and
//   16-byte aligned W, x and x rows; other layouts take scalar loads (same phases, no prefetch).
// Numerics: every sum in float64 in a fixed order (deterministic), one rounding to fp32 at the end (relL2 ~3e-8).
// Measured: H200, 1024x8192 @ 8192x8192, 2026-11-22, bench/matmul_sum_max_mean_lse/ab.py (GPU time, L2 read-flushed, one run):
//   2_inflight 82.3 us; 3_rowband bands 101.0, interleaved rows (ILV) 105.5, bands without the x prefetch 92.6.
//   Per-phase globaltimer trace (median over CTAs, us): with prefetch W 72.2 | grid.sync 4.8 | v 1.5 | x dots 12.5 |
//   grid.sync 3.2; without W 59.0 (256 MiB at 4.55 TB/s: the contiguous bands do read faster than 2's tiles) |
//   5.0 | 1.8 | 17.2 | 4.0. So: (a) the 256-byte TMA pieces of x cost W 13 us for 30 MB; (b) each grid.sync costs
//   3-5 us including the wait for the slowest CTA; (c) x read after the barrier is latency-bound. Even with W at the
//   read ceiling (bw_probe: 63.9-78 us for 288 MiB on different H200s of the same day) the barriers and the
//   dependent x phase leave no room under 70 us; this layout is not the way there.
#include <cooperative_groups.h>

#include "lse_common.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int T = 512, NW = T / 32;
constexpr int J = 4;                   // float4 per thread per panel row
constexpr int RU = 2;                  // rows per step: RU * J float4 loads in flight per thread
constexpr int64_t PW = (int64_t)T * J * 4;  // panel width in floats: 8192
constexpr int RB = 8;                  // rows per warp per batch for x rows not in shared memory
constexpr int SMEM_X = 220 * 1024;     // x prefetch budget per CTA
constexpr int GR = 2, GU = 2;          // cached GEMV (2_inflight's measured choice)
constexpr bool ILV_CHOSEN = false;     // band layout (see rowband's ILV)

// W is read once: no L1 allocation (the bw probe's fastest read form).
__device__ __forceinline__ float4 ldg_stream(const float* p) {
  float4 q;
  asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(q.x), "=f"(q.y), "=f"(q.z), "=f"(q.w) : "l"(p));
  return q;
}

// ILV: band b is rows b, b + NB, b + 2 NB, ... (all CTAs read neighbouring rows at the same time, as the bw probe's
// fastest read did) instead of the contiguous rows [b*O/NB, (b+1)*O/NB). trace (A/B only): per-CTA globaltimer
// stamps at the phase boundaries.
template <bool VEC, bool ILV>
__global__ void __launch_bounds__(T, 1)
    rowband(const float* __restrict__ w, int64_t O, int64_t I, const float* __restrict__ x, int64_t B, int64_t xs,
            const float* __restrict__ b, int64_t nb, double* __restrict__ part, int64_t NB, double* __restrict__ v,
            double* __restrict__ bsum, float* __restrict__ out, int64_t width, int npref, int64_t* trace) {
  extern __shared__ __align__(16) float xsm[];
  __shared__ __align__(8) uint64_t bar;
  __shared__ double red[T];
  cg::grid_group grid = cg::this_grid();
  const int t = threadIdx.x, lane = t & 31, wp = t >> 5;
  const int64_t G = gridDim.x, p = blockIdx.x;
  const int64_t k0 = kp::imin(I, p * width), kw = kp::imin(I, k0 + width) - k0;
  double* rowpart = part + NB * I;  // G x B
  lse::stamp(trace, 0);

  // 0. This CTA's slice of x rows [0, npref) into shared memory, in flight alongside phase 1.
  const bool pref = VEC && npref > 0 && kw > 0;
  if (pref && wp == 0) {
    if (lane == 0) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(kp::smem_u32(&bar)));
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(kp::smem_u32(&bar)),
                   "r"((uint32_t)(npref * kw * 4)) : "memory");
    }
    __syncwarp();
    for (int i = lane; i < npref; i += 32)
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       kp::smem_u32(xsm + (int64_t)i * kw)), "l"(x + i * xs + k0), "r"((uint32_t)(kw * 4)),
                   "r"(kp::smem_u32(&bar)) : "memory");
  }

  // 1. Column sums of row bands, one (band, panel) item at a time.
  const int64_t npanel = (I + PW - 1) / PW;
  for (int64_t item = p; item < NB * npanel; item += G) {
    const int64_t band = item / npanel, c0 = (item % npanel) * PW;
    const int64_t rb = ILV ? band : band * O / NB, re = ILV ? O : (band + 1) * O / NB, rs = ILV ? NB : 1;
    double a[4 * J];
#pragma unroll
    for (int e = 0; e < 4 * J; ++e) a[e] = 0.;
    if (VEC) {
#pragma unroll 1
      for (int64_t r = rb; r < re; r += RU * rs) {
        float4 q[RU][J];
#pragma unroll
        for (int u = 0; u < RU; ++u)
#pragma unroll
          for (int j = 0; j < J; ++j) {
            const int64_t c = c0 + 4 * (t + (int64_t)T * j), rr = r + u * rs;
            q[u][j] = (rr < re && c < I) ? ldg_stream(w + rr * I + c) : make_float4(0.f, 0.f, 0.f, 0.f);
          }
#pragma unroll
        for (int u = 0; u < RU; ++u)
#pragma unroll
          for (int j = 0; j < J; ++j) {
            a[4 * j] += q[u][j].x; a[4 * j + 1] += q[u][j].y; a[4 * j + 2] += q[u][j].z; a[4 * j + 3] += q[u][j].w;
          }
      }
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int64_t c = c0 + 4 * (t + (int64_t)T * j);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (c + e < I) part[band * I + c + e] = a[4 * j + e];
      }
    } else {
#pragma unroll 1
      for (int64_t r = rb; r < re; r += rs)
#pragma unroll
        for (int j = 0; j < 4 * J; ++j) {
          const int64_t c = c0 + t + (int64_t)T * j;
          if (c < I) a[j] += w[r * I + c];
        }
#pragma unroll
      for (int j = 0; j < 4 * J; ++j) {
        const int64_t c = c0 + t + (int64_t)T * j;
        if (c < I) part[band * I + c] = a[j];
      }
    }
  }
  lse::stamp(trace, 1);
  grid.sync();
  lse::stamp(trace, 2);

  // 2. v over this CTA's column slice: 64 columns x 8 band groups per step, bands summed in a fixed order.
  for (int64_t kc = 0; kc < kw; kc += 64) {
    const int col = t & 63, g = t >> 6;
    double s = 0.;
    if (kc + col < kw) {
      const double* pc = part + k0 + kc + col;
#pragma unroll 8
      for (int64_t q = g; q < NB; q += T / 64) s += __ldcg(pc + q * I);  // other CTAs' writes: read at L2
    }
    red[t] = s;
    __syncthreads();
    if (t < 64 && kc + t < kw) {
      double z = 0.;
#pragma unroll
      for (int q = 0; q < T / 64; ++q) z += red[q * 64 + t];
      v[k0 + kc + t] = z;
    }
    __syncthreads();
  }
  if (p == 0) {
    double s = 0.;
    for (int64_t k = t; k < nb; k += T) s += b[k];
    s = kp::block_sum(s, red);
    if (t == 0) *bsum = s;
  }
  __syncthreads();  // v[slice] written by this CTA's threads is read below by others of it

  lse::stamp(trace, 3);
  // 3. This slice's share of every row's dot product: a warp takes RB rows at a time (RB loads per lane in flight,
  //    8 independent shuffle reductions), from the shared-memory copy where the row was prefetched.
  if (pref) kp::mbar_wait(&bar, 0);
  for (int64_t i0 = (int64_t)wp * RB; i0 < B; i0 += (int64_t)NW * RB) {
    double d[RB];
#pragma unroll
    for (int u = 0; u < RB; ++u) d[u] = 0.;
    if (VEC) {
      const int64_t n4 = kw / 4;
      for (int64_t c4 = lane; c4 < n4; c4 += 32) {
        float4 q[RB];
#pragma unroll
        for (int u = 0; u < RB; ++u) {
          const int64_t i = i0 + u;
          q[u] = i < npref ? reinterpret_cast<const float4*>(xsm + i * kw)[c4]
                 : i < B   ? __ldg(reinterpret_cast<const float4*>(x + i * xs + k0) + c4)
                           : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        const double2 va = reinterpret_cast<const double2*>(v + k0)[2 * c4],
                      vb = reinterpret_cast<const double2*>(v + k0)[2 * c4 + 1];
#pragma unroll
        for (int u = 0; u < RB; ++u)
          d[u] += ((double)q[u].x * va.x + (double)q[u].y * va.y) + ((double)q[u].z * vb.x + (double)q[u].w * vb.y);
      }
    } else {
      for (int64_t c = lane; c < kw; c += 32) {
        const double vv = v[k0 + c];
#pragma unroll
        for (int u = 0; u < RB; ++u)
          if (i0 + u < B) d[u] += (double)x[(i0 + u) * xs + k0 + c] * vv;
      }
    }
#pragma unroll
    for (int u = 0; u < RB; ++u) {
      const double s = kp::warp_sum(d[u]);
      if (lane == 0 && i0 + u < B) rowpart[p * B + i0 + u] = s;
    }
  }
  lse::stamp(trace, 4);
  grid.sync();
  lse::stamp(trace, 5);

  // 4. Rows: sum the G slice partials in a fixed order, add sum(b).
  const double bs = __ldcg(bsum);
  for (int64_t i = p * NW + wp; i < B; i += G * NW) {
    double s = 0.;
#pragma unroll 8
    for (int64_t q = lane; q < G; q += 32) s += __ldcg(rowpart + q * B + i);
    s = kp::warp_sum(s);
    if (lane == 0) out[i] = (float)(s + bs);
  }
  lse::stamp(trace, 6);
}

template <bool VEC, bool ILV>
void launch_rowband(const lse::Forward& f, int64_t* trace = nullptr, bool prefetch = true) {
  const c10::cuda::CUDAGuard guard(f.w.device());
  const int dev = f.w.device().index();
  int coop = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  TORCH_CHECK(coop, "3_rowband needs cooperative launch support on this device");
  auto kern = rowband<VEC, ILV>;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_X));
  int occ = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, T, SMEM_X));
  TORCH_CHECK(occ >= 1, "3_rowband: no SM can hold one CTA (", kp::num(T), " threads, ", kp::num(SMEM_X),
              " bytes of shared memory)");
  const int64_t G = lse::sm_count(dev);  // one CTA per SM: co-resident, as grid.sync() requires
  const int64_t O = f.O, I = f.I, B = f.B;
  // Bands: as many as the scratch holds next to the G x B row partials, at most G.
  const int64_t room = f.partial.numel() - G * B;
  TORCH_CHECK(room >= I, "partial needs at least ", kp::num(G * B + I), " float64 elements (", kp::num(G),
              " SMs x ", kp::num(B), " rows + ", kp::num(I), " columns), has ", kp::num(f.partial.numel()));
  const int64_t NB = I == 0 ? 1 : std::max<int64_t>(1, std::min<int64_t>(G, room / I));
  const int64_t width = ((I + 4 * G - 1) / (4 * G)) * 4;
  int npref = 0;
  if (VEC && width > 0 && prefetch) npref = (int)std::min<int64_t>(B, SMEM_X / (width * 4));
  const size_t smem = (size_t)npref * width * 4;
  const float* w = f.w.data_ptr<float>();
  const float* x = f.x.data_ptr<float>();
  const float* b = f.b.numel() ? f.b.data_ptr<float>() : nullptr;
  int64_t nb = f.b.numel(), xs = f.x.stride(0);
  double* part = f.partial.data_ptr<double>();
  double* v = f.v.data_ptr<double>();
  double* bsum = f.bsum.data_ptr<double>();
  float* out = f.out.data_ptr<float>();
  void* args[] = {&w, (void*)&O, (void*)&I, &x, (void*)&B, &xs, &b, &nb, &part, (void*)&NB, &v, &bsum, &out,
                  (void*)&width, &npref, &trace};
  C10_CUDA_CHECK(cudaLaunchCooperativeKernel((const void*)kern, dim3((unsigned)G), dim3(T), args, smem, kp::stream()));
}

}  // namespace

// Uncached forward: out = x @ W.sum(0) + b.sum(), filling v (I doubles) and bsum (1 double) on the way so a caller
// can cache them. partial: float64 scratch of >= #SMs * (B + I) for full speed (>= #SMs * B + I to run at all).
KP_EXPORT void colsum_gemv_forward(const at::TensorBase& w, const at::TensorBase& b, const at::TensorBase& x,
                                   const at::TensorBase& partial, const at::TensorBase& v,
                                   const at::TensorBase& bsum, const at::TensorBase& out) {
  const lse::Forward f = lse::check_forward(w, b, x, partial, v, bsum, out);
  TORCH_CHECK(f.B <= 2147483647LL && f.I <= 2147483647LL / 4, "3_rowband: B < 2^31 and I < 2^29 required");
  if (f.vec) launch_rowband<true, ILV_CHOSEN>(f);
  else launch_rowband<false, ILV_CHOSEN>(f);
}

// Cached forward: out (B, 1) := x @ v + bsum with v, bsum from an earlier colsum_gemv_forward.
KP_EXPORT void gemv_bias(const at::TensorBase& x, const at::TensorBase& v, const at::TensorBase& bsum,
                         const at::TensorBase& out) {
  lse::launch_gemv<GR, GU>(x, v, bsum, out);
}

#if KP_EXPERIMENTS  // A/B hooks for the bench scripts; not in the shipped build
// A/B hook (bench/matmul_sum_max_mean_lse/ab.py): cfg 0 = contiguous bands, 1 = interleaved rows, 2 = bands without the x prefetch; trace: int64 (G x 8) globaltimer
// stamps per CTA at the phase boundaries, or an empty tensor.
KP_EXPORT void tune_forward(const at::TensorBase& w, const at::TensorBase& b, const at::TensorBase& x,
                            const at::TensorBase& partial, const at::TensorBase& v, const at::TensorBase& bsum,
                            const at::TensorBase& out, int64_t cfg, const at::TensorBase& trace) {
  const lse::Forward f = lse::check_forward(w, b, x, partial, v, bsum, out);
  TORCH_CHECK(f.vec, "tune_forward: the A/B runs the float4 path only");
  int64_t* tr = lse::trace_ptr(trace, 8 * (int64_t)lse::sm_count(w.device().index()), "8 x #SMs");
  switch (cfg) {
    case 0: launch_rowband<true, false>(f, tr); break;
    case 1: launch_rowband<true, true>(f, tr); break;
    case 2: launch_rowband<true, false>(f, tr, false); break;
    default: TORCH_CHECK(false, "tune_forward: cfg 0..2, got ", kp::num(cfg));
  }
}
#endif  // KP_EXPERIMENTS
