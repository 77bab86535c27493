// lse_common.cuh -- what the lse rungs share: argument checks for the forward (uncached) and the cached
// GEMV, and the cached GEMV itself (out = x @ v + bsum with v = W.sum(0), bsum = b.sum() kept by ModelNew).
// 1_colsum_gemv uses the checks (its own, simpler GEMV kernel stays in its file).
#pragma once
#include "../common/kp.cuh"

namespace lse {
namespace {

// W is streamed once: 256-byte L2 fills, no L1 allocation (2_inflight's A/B: 87.1 -> 85.3 us).
__device__ __forceinline__ float4 load_w(const float* p) {
  float4 q;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0, %1, %2, %3}, [%4];"
      : "=f"(q.x), "=f"(q.y), "=f"(q.z), "=f"(q.w) : "l"(p));
  return q;
}

// A/B traces: thread 0 stores the globaltimer (ns) into trace[i] (no-op without a trace). Compiled in only with
// KP_EXPERIMENTS (the bench scripts' build); the shipped build carries no trace code.
__device__ __forceinline__ void stamp_at(int64_t* trace, int64_t i) {
#if KP_EXPERIMENTS
  if (trace && threadIdx.x == 0) {
    uint64_t ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    trace[i] = (int64_t)ns;
  }
#else
  (void)trace;
  (void)i;
#endif
}
// Per-CTA phase traces: phase boundary k of this CTA into trace[blockIdx.x * 8 + k].
__device__ __forceinline__ void stamp(int64_t* trace, int k) { stamp_at(trace, (int64_t)blockIdx.x * 8 + k); }

inline int sm_count(int dev) {
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

// Launch `kernel` as a programmatic dependent of the previous kernel on the stream: it may start while that kernel
// drains and must call griddepcontrol.wait before reading what that kernel wrote (the rungs' `finish`).
template <typename... P, typename... A>
void launch_dependent(void (*kernel)(P...), unsigned grid, unsigned block, A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.stream = kp::stream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

// The A/B hooks' optional trace argument: an empty tensor (no trace, nullptr) or a contiguous int64 CUDA tensor of
// at least `need` elements.
inline int64_t* trace_ptr(const at::TensorBase& trace, int64_t need, const char* what) {
  if (!trace.numel()) return nullptr;
  TORCH_CHECK(trace.is_cuda() && trace.scalar_type() == at::kLong && trace.is_contiguous(), "trace: int64 CUDA");
  TORCH_CHECK(trace.numel() >= need, "trace needs ", what, " (", kp::num(need), ") elements");
  return trace.data_ptr<int64_t>();
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline void check_f64(const at::TensorBase& t, const at::TensorBase& like, const char* name, int64_t numel) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kDouble && t.is_contiguous(), name,
              " must be a contiguous float64 CUDA tensor");
  kp::check_same_device(t, like, name);
  TORCH_CHECK(t.numel() >= numel, name, " needs ", kp::num(numel), " elements, has ", kp::num(t.numel()));
}

inline void check_x(const at::TensorBase& x, int64_t features) {
  kp::check_f32_cuda(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be 2-D, got ", kp::num(x.dim()), "-D");
  TORCH_CHECK(x.size(1) <= 1 || x.stride(1) == 1, "x rows must be unit-stride");
  TORCH_CHECK(x.size(1) == features, "x has ", kp::num(x.size(1)), " features, the weight ", kp::num(features));
  TORCH_CHECK(x.size(0) <= 2147483647LL, "too many rows: ", kp::num(x.size(0)));
}

inline void check_out(const at::TensorBase& out, const at::TensorBase& x) {
  kp::check_f32_cuda(out, "out");
  kp::check_same_device(out, x, "out");
  TORCH_CHECK(out.is_contiguous() && out.numel() == x.size(0), "out must hold one value per row of x");
}

struct Forward {
  const at::TensorBase &w, &b, &x, &partial, &v, &bsum, &out;
  int64_t O, I, B;
  bool vec;  // float4 paths: 16-byte aligned W and x rows
};

// Everything but the size of `partial`, which each rung checks against its own need.
inline Forward check_forward(const at::TensorBase& w, const at::TensorBase& b, const at::TensorBase& x,
                             const at::TensorBase& partial, const at::TensorBase& v, const at::TensorBase& bsum,
                             const at::TensorBase& out) {
  kp::check_f32_cuda(w, "weight");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(), "weight must be a contiguous 2-D tensor");
  const int64_t O = w.size(0), I = w.size(1);
  check_x(x, I);
  kp::check_same_device(w, x, "x");
  check_out(out, x);
  if (b.numel()) {
    kp::check_f32_cuda(b, "bias");
    kp::check_same_device(w, b, "bias");
    TORCH_CHECK(b.dim() == 1 && b.size(0) == O && b.is_contiguous(), "bias must be contiguous with ", kp::num(O),
                " elements");
  }
  check_f64(partial, w, "partial", 0);
  check_f64(v, w, "v", I);
  check_f64(bsum, w, "bsum", 1);
  const bool vec = I % 4 == 0 && x.stride(0) % 4 == 0 && aligned16(w.data_ptr()) && aligned16(x.data_ptr());
  return {w, b, x, partial, v, bsum, out, O, I, x.size(0), vec};
}

// Cached path: GR rows of x per CTA, 256 threads striding the columns, GU float4 per row in flight, v (float64) from
// L2; block reduction in shared memory. Measured choice (2_inflight's A/B): GR = 2, GU = 2.
template <int GR_, int GU_>
__global__ void __launch_bounds__(256) gemv_rows(const float* __restrict__ x, int64_t B, int64_t I, int64_t xs,
                                                 const double* __restrict__ v, const double* __restrict__ bsum,
                                                 float* __restrict__ out, bool vec) {
  __shared__ double red[GR_][8];
  const int64_t r0 = (int64_t)blockIdx.x * GR_;
  double acc[GR_];
#pragma unroll
  for (int r = 0; r < GR_; ++r) acc[r] = 0.;
  if (vec) {
    const int64_t n4 = I / 4, xs4 = xs / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x) + r0 * xs4;
    const double2* v2 = reinterpret_cast<const double2*>(v);
    for (int64_t c0 = threadIdx.x; c0 < n4; c0 += 256 * GU_) {
      float4 q[GU_][GR_];
#pragma unroll
      for (int g = 0; g < GU_; ++g)
#pragma unroll
        for (int r = 0; r < GR_; ++r) {
          const int64_t c4 = c0 + 256 * g;
          q[g][r] = (c4 < n4 && r0 + r < B) ? __ldg(x4 + r * xs4 + c4) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
      for (int g = 0; g < GU_; ++g) {
        const int64_t c4 = c0 + 256 * g;
        if (c4 < n4) {
          const double2 va = v2[2 * c4], vb = v2[2 * c4 + 1];
#pragma unroll
          for (int r = 0; r < GR_; ++r)
            acc[r] += ((double)q[g][r].x * va.x + (double)q[g][r].y * va.y) +
                      ((double)q[g][r].z * vb.x + (double)q[g][r].w * vb.y);
        }
      }
    }
  } else {
    for (int64_t c = threadIdx.x; c < I; c += 256) {
      const double vv = v[c];
#pragma unroll
      for (int r = 0; r < GR_; ++r)
        if (r0 + r < B) acc[r] += (double)x[(r0 + r) * xs + c] * vv;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < GR_; ++r) {
    const double s = kp::warp_sum(acc[r]);
    if (lane == 0) red[r][warp] = s;
  }
  __syncthreads();
  if (threadIdx.x < GR_ && r0 + threadIdx.x < B) {
    double s = 0.;
#pragma unroll
    for (int k = 0; k < 8; ++k) s += red[threadIdx.x][k];
    out[r0 + threadIdx.x] = (float)(s + *bsum);
  }
}

template <int GR_, int GU_>
void launch_gemv(const at::TensorBase& x, const at::TensorBase& v, const at::TensorBase& bsum,
                 const at::TensorBase& out) {
  check_f64(v, x, "v", 0);
  check_x(x, v.numel());
  check_f64(bsum, x, "bsum", 1);
  check_out(out, x);
  const int64_t B = x.size(0), I = x.size(1);
  if (B == 0) return;
  c10::cuda::CUDAGuard guard(x.device());
  const bool vec = I % 4 == 0 && x.stride(0) % 4 == 0 && aligned16(x.data_ptr()) && aligned16(v.data_ptr());
  gemv_rows<GR_, GU_><<<(unsigned)((B + GR_ - 1) / GR_), 256, 0, kp::stream()>>>(
      x.data_ptr<float>(), B, I, x.stride(0), v.data_ptr<double>(), bsum.data_ptr<double>(), out.data_ptr<float>(),
      vec);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}


// ---- What the column-tile rungs (4_overlap, 6_pipelined) share: CTA t owns columns [t*TILE_TC, (t+1)*TILE_TC) of
// W and x with TILE_FT threads, writes its row partials to partial[i * tiles + t] and its slice of b.sum() to
// partial[tiles * B + t]; `finish` adds them up.
constexpr int TILE_FT = 512, TILE_TC = 64;

__device__ __forceinline__ void cp_async16(float* dst, const float* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(kp::smem_u32(dst)), "l"(src) : "memory");
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
