// tile_common.cuh -- what the column-tile rungs (4_overlap, 6_phases) share: CTA t owns columns
// [t*TILE_TC, (t+1)*TILE_TC) of W and x with TILE_FT threads, writes its row partials to partial[i * tiles + t]
// and its slice of b.sum() to partial[tiles * B + t]; `finish` (a programmatic dependent launch: sm_90) adds them
// up. Apart from lse_common.cuh because the rungs that run on sm_80 include that one.
#pragma once
#include "lse_common.cuh"

namespace lse {
namespace {

constexpr int TILE_FT = 512, TILE_TC = 64;

// 16 bytes global -> shared, bypassing L1; L2_256: with a 256-byte L2 fill.
template <bool L2_256 = true>
__device__ __forceinline__ void cp_async16(float* dst, const float* src) {
  if constexpr (L2_256)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(kp::smem_u32(dst)), "l"(src) : "memory");
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(kp::smem_u32(dst)), "l"(src) : "memory");
}

// b.sum() is split evenly over the CTAs: this thread's share of CTA blockIdx.x's slice (loads only; the sum is
// finished by b_slice_store, which the rungs call after their W loop so these loads never stall it).
template <int NT = TILE_FT>  // threads per CTA
__device__ __forceinline__ double b_slice_part(const float* __restrict__ b, int64_t nb, int64_t tiles) {
  const int64_t bper = (nb + tiles - 1) / tiles, b0 = (int64_t)blockIdx.x * bper, b1 = kp::imin(nb, b0 + bper);
  double acc = 0.;
  for (int64_t k = b0 + threadIdx.x; k < b1; k += NT) acc += b[k];
  return acc;
}

// The CTA's slice sum into partial[tiles * B + blockIdx.x], where `finish` adds the slices (all threads call it).
__device__ __forceinline__ void b_slice_store(double part, double* bred, double* __restrict__ partial, int64_t tiles,
                                              int64_t B) {
  part = kp::block_sum(part, bred);
  if (threadIdx.x == 0) partial[tiles * B + blockIdx.x] = part;
}

// Lanes g = 0..N-1 of an aligned group of N lanes each hold d[j] = their column share of rows j = 0..N-1 of a
// batch. Transposed reduction: at each level a lane keeps the half of its rows that its lane bit selects and adds
// the partner's copy of that half, so N-1 shuffles (not N log N) leave lane g with the batch's row g summed over
// the N lanes.
template <int H>
__device__ __forceinline__ void reduce_level(double* d, int g) {
  const bool up = g & H;
#pragma unroll
  for (int j = 0; j < H; ++j) {
    const double send = up ? d[j] : d[j + H], keep = up ? d[j + H] : d[j];
    d[j] = keep + __shfl_xor_sync(0xffffffffu, send, H);
  }
}

template <int N>
__device__ __forceinline__ double reduce_rows(double (&d)[N], int g) {
  static_assert(N == 4 || N == 8 || N == 16, "groups of 4, 8 or 16 lanes");
  if constexpr (N >= 16) reduce_level<8>(d, g);
  if constexpr (N >= 8) reduce_level<4>(d, g);
  reduce_level<2>(d, g);
  reduce_level<1>(d, g);
  return d[0];
}

// This thread's 4-column share of one row's dot with the tile of v. DBL: products and sums in float64 (4 float->
// double converts per element pair, 16/clk/SM); else fp32 products summed in fp32, then widened (4_overlap's A/B).
template <bool DBL>
__device__ __forceinline__ double dot4(float4 q, const float4& vf, const double* vd) {
  if constexpr (DBL)
    return ((double)q.x * vd[0] + (double)q.y * vd[1]) + ((double)q.z * vd[2] + (double)q.w * vd[3]);
  else
    return (double)((q.x * vf.x + q.y * vf.y) + (q.z * vf.z + q.w * vf.w));
}

// out[i] = sum_t partial[i * tiles + t] + sum_t bpart[t] (bpart = partial[tiles * B + t], the CTAs' slices of b):
// a warp per row, rows warp0, warp0 + nwarps, ...; every warp adds the b slices in the same order. Loads unrolled
// so a warp's 2 x tiles/32 L2 reads are in flight together.
__device__ __forceinline__ void finish_rows(const double* __restrict__ partial, int64_t tiles, int64_t B,
                                            float* __restrict__ out, double* __restrict__ bsum_out, int64_t warp0,
                                            int64_t nwarps) {
  const int lane = threadIdx.x & 31;
  const double* bpart = partial + tiles * B;
  double bs = 0.;
#pragma unroll 4
  for (int64_t t = lane; t < tiles; t += 32) bs += __ldcg(bpart + t);
  bs = kp::warp_sum(bs);
  if (warp0 == 0 && lane == 0) *bsum_out = bs;
  for (int64_t i = warp0; i < B; i += nwarps) {
    double s = 0.;
#pragma unroll 4
    for (int64_t t = lane; t < tiles; t += 32) s += __ldcg(partial + i * tiles + t);
    s = kp::warp_sum(s);
    if (lane == 0) out[i] = (float)(s + bs);
  }
}

// Launched as a programmatic dependent of the tile kernel: it may start while that kernel drains; the partials are
// read only after that kernel has completed and flushed.
__global__ void __launch_bounds__(256) finish(const double* __restrict__ partial, int64_t tiles, int64_t B,
                                              float* __restrict__ out, double* __restrict__ bsum_out) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  finish_rows(partial, tiles, B, out, bsum_out, (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5), (int64_t)gridDim.x * 8);
}

inline void launch_finish(const double* partial, int64_t tiles, int64_t B, float* out, double* bsum, int dev) {
  const int64_t fgrid = std::max<int64_t>(1, std::min<int64_t>((B + 7) / 8, 2 * sm_count(dev)));
  launch_dependent(finish, (unsigned)fgrid, 256, partial, tiles, B, out, bsum);
}

// Scalar path of the tile rungs (W or x rows not 16-byte aligned, I % 4 != 0): one CTA per tile, plain loops.
__global__ void __launch_bounds__(TILE_FT) tile_scalar(const float* __restrict__ w, int64_t O, int64_t I,
                                                       const float* __restrict__ x, int64_t B, int64_t xs,
                                                       const float* __restrict__ b, int64_t nb,
                                                       double* __restrict__ partial, int64_t tiles,
                                                       double* __restrict__ v) {
  constexpr int CG = TILE_TC / 4, RG = TILE_FT / CG;
  __shared__ double red[RG][TILE_TC];
  __shared__ double vt[TILE_TC];
  __shared__ double bred[TILE_FT / 32];
  const int cg = threadIdx.x % CG, rg = threadIdx.x / CG;
  const int64_t c = (int64_t)blockIdx.x * TILE_TC + 4 * cg;
  const double bacc = b_slice_part(b, nb, tiles);
  b_slice_store(bacc, bred, partial, tiles, B);
  double a[4] = {0., 0., 0., 0.};
  for (int64_t r = rg; r < O; r += RG)
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (c + k < I) a[k] += w[r * I + c + k];
#pragma unroll
  for (int k = 0; k < 4; ++k) red[rg][4 * cg + k] = a[k];
  __syncthreads();
  if (threadIdx.x < TILE_TC) {
    double s = 0.;
    for (int k = 0; k < RG; ++k) s += red[k][threadIdx.x];
    vt[threadIdx.x] = s;
    const int64_t j = (int64_t)blockIdx.x * TILE_TC + threadIdx.x;
    if (j < I) v[j] = s;
  }
  __syncthreads();
  for (int64_t i0 = 0; i0 < B; i0 += RG) {
    const int64_t i = i0 + rg;
    double d = 0.;
    if (i < B)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (c + k < I) d += (double)x[i * xs + c + k] * vt[4 * cg + k];
#pragma unroll
    for (int o = CG / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (cg == 0 && i < B) partial[i * tiles + blockIdx.x] = d;
  }
}

inline void launch_tile_scalar(const Forward& f, double* partial, int64_t tiles) {
  tile_scalar<<<(unsigned)tiles, TILE_FT, 0, kp::stream()>>>(
      f.w.data_ptr<float>(), f.O, f.I, f.x.data_ptr<float>(), f.B, f.x.stride(0),
      f.b.numel() ? f.b.data_ptr<float>() : nullptr, f.b.numel(), partial, tiles, f.v.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace lse
