// lse_common.cuh -- what the lse rungs share: argument checks for the forward (uncached) and the cached
// GEMV, and the cached GEMV itself (out = x @ v + bsum with v = W.sum(0), bsum = b.sum() kept by ModelNew).
// 1_colsum_gemv uses the checks (its own, simpler GEMV kernel stays in its file).
#pragma once
#include "../common/kp.cuh"

namespace lse {
namespace {

// W is streamed once: no L1 allocation, and (L2_256) 256-byte L2 fills (2_inflight's A/B: 87.1 -> 85.3 us).
// 6_phases reads W without them (its row pieces may be narrower than 256 bytes).
template <bool L2_256 = true>
__device__ __forceinline__ float4 load_w(const float* p) {
  float4 q;
  if constexpr (L2_256)
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0, %1, %2, %3}, [%4];"
        : "=f"(q.x), "=f"(q.y), "=f"(q.z), "=f"(q.w) : "l"(p));
  else
    asm("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
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

}  // namespace
}  // namespace lse
