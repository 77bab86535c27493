// softmax / 2_online -- online softmax: two passes over the row instead of three, 16-byte accesses, and as much of
// Requires: sm_80 (no Hopper-only feature: built for whatever GPU it runs on)
// the row as fits parked in shared memory so the second pass re-reads less of it from HBM.
//
// What changed from 1_rowblock: pass 1 keeps a running (max, sum-of-exp) per thread and rescales the sum when the
//   max grows (Milakov & Gimelshein 2018), so max and sum need one read instead of two; loads and stores are float4
//   where x's row start and y's row start share the same 16-byte phase (scalar head/tail elements otherwise);
//   pass 1 also parks the first `cache` float4s of the row in dynamic shared memory; pass 2 walks the row
//   backwards, so what pass 1 read last (most likely still in L2) is read first.
// Ownership / launch: block b owns row b; T threads (64..1024, ~16 elements per thread, rounded to warps); thread t
//   owns float4 indices t, t+T, ...; grid = (rows). Dynamic smem = min(row, ~220 KiB): for rows up to ~56K floats the
//   whole row stays on chip, so pass 2 reads nothing from HBM (1R+1W).
// Bytes at 4096x393216: pass 1 reads 6.44 GB, pass 2 reads (1.5 MiB - 220 KiB) of each row minus whatever L2 still
//   holds, writes 6.44 GB: between 2.7x and 2.86x of 4*R*N bytes vs the 2x floor. Prediction at 4.2 TB/s copy
//   speed: <= 4.4 ms (torch.compile, plain 2R+1W: 4.8 ms).
// Bound: memory. 1 block of 1024 threads per SM with the full cache; 4 float4 loads in flight per thread.
// Preconditions (checked): 2-D float32 CUDA, unit-stride rows (any row stride / storage offset), y contiguous.
// Numerics: expf; per-thread online (max, sum) merged in a tree; NaN anywhere in a row, or +inf, gives a NaN row and
//   an all -inf row gives NaN, as PyTorch. relL2 vs float64 ~1e-7.
// Measured: H200, 4096x393216, 4.92 ms, 2,621 GB/s, 63.4% of copy (4,135 GB/s); torch.compile 5.06 ms in the same
//   run, so the prediction (<= 4.4 ms) missed: the L2 reuse of the reversed pass 2 is small. 2026-11-22.
#include "../common/kp.cuh"
#include "online.cuh"

namespace {
using namespace kp_softmax;

constexpr int U = 4;  // independent loads in flight per thread per step

// Process the n_v groups of type V starting at xv (aligned for V) into yv; `cache` of them live in smem.
template <typename V>
__device__ __forceinline__ void pass1(const V* __restrict__ xv, int64_t nv, V* cache, int64_t ncache, float& m,
                                      float& s) {
  const int64_t T = blockDim.x;
  for (int64_t base = threadIdx.x; base < nv; base += U * T) {
    V r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * T;
      if (i < nv) r[u] = xv[i];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * T;
      if (i < nv) {
        if (i < ncache) cache[i] = r[u];
        absorb(m, s, r[u]);
      }
    }
  }
}

template <typename V>
__device__ __forceinline__ void pass2(const V* __restrict__ xv, V* __restrict__ yv, int64_t nv, const V* cache,
                                      int64_t ncache, float m, float inv) {
  const int64_t T = blockDim.x;
  if (threadIdx.x >= nv) return;
  // Same index set as pass1 (so each thread reads back only the smem slots it wrote), walked from the end.
  const int64_t last = threadIdx.x + ((nv - 1 - threadIdx.x) / T) * T;
  for (int64_t top = last; top >= 0; top -= U * T) {
    V r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = top - u * T;
      if (i >= 0) r[u] = i < ncache ? cache[i] : xv[i];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = top - u * T;
      if (i >= 0) yv[i] = vout(r[u], m, inv);
    }
  }
}

__global__ void __launch_bounds__(1024) softmax_online(const float* __restrict__ x, float* __restrict__ y,
                                                      int64_t cols, int64_t xs, int64_t cache_floats) {
  extern __shared__ float4 smem4[];
  __shared__ float scratch[64];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * xs;
  float* yr = y + row * cols;
  float m = -INFINITY, s = 0.f;

  const bool same_phase = ((reinterpret_cast<uintptr_t>(xr) ^ reinterpret_cast<uintptr_t>(yr)) & 15) == 0;
  if (same_phase) {
    const int64_t head = ::min(cols, (int64_t)(((16 - (reinterpret_cast<uintptr_t>(xr) & 15)) & 15) >> 2));
    const int64_t nv = (cols - head) >> 2, tail = head + nv * 4;
    const float4* xv = reinterpret_cast<const float4*>(xr + head);
    float4* yv = reinterpret_cast<float4*>(yr + head);
    const int64_t ncache = ::min(nv, cache_floats >> 2);
    pass1(xv, nv, smem4, ncache, m, s);
    // At most 3 head and 3 tail scalars: owned by the last warp, which has the least vector work on short rows.
    const int64_t e = threadIdx.x - (blockDim.x - 8);
    if (e >= 0 && e < 3 && e < head) absorb(m, s, xr[e]);
    if (e >= 4 && tail + (e - 4) < cols) absorb(m, s, xr[tail + e - 4]);
    kp::block_online(m, s, scratch);
    const float inv = 1.f / s;
    pass2(xv, yv, nv, smem4, ncache, m, inv);
    if (e >= 0 && e < 3 && e < head) yr[e] = vout(xr[e], m, inv);
    if (e >= 4 && tail + (e - 4) < cols) yr[tail + e - 4] = vout(xr[tail + e - 4], m, inv);
  } else {
    float* cache = reinterpret_cast<float*>(smem4);
    const int64_t ncache = ::min(cols, cache_floats);
    pass1(xr, cols, cache, ncache, m, s);
    kp::block_online(m, s, scratch);
    pass2(xr, yr, cols, cache, ncache, m, 1.f / s);
  }
}

}  // namespace

KP_EXPORT void softmax_forward(const at::TensorBase& x, const at::TensorBase& y) {
  kp::check_row_softmax_args(x, y);
  const int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0 || cols == 0) return;
  TORCH_CHECK(rows <= 2147483647LL, "too many rows for a 1-D grid: ", kp::num(rows));
  c10::cuda::CUDAGuard guard(x.device());
  // ~16 elements per thread, whole warps, 64..1024 threads (>= 8 warps' worth of lanes for the scalar tail slots).
  const int threads = (int)std::min<int64_t>(1024, std::max<int64_t>(64, ((cols / 16 + 31) / 32) * 32));
  int dev = x.get_device(), optin = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  // Leave room for the static scratch and a little slack; round the cache to whole float4s.
  const int64_t budget = std::max<int64_t>(0, (int64_t)optin - 1024) & ~int64_t(15);
  const int64_t cache_bytes = std::min<int64_t>(budget, ((cols * 4 + 15) / 16) * 16);
  C10_CUDA_CHECK(cudaFuncSetAttribute(softmax_online, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cache_bytes));
  softmax_online<<<(unsigned)rows, threads, (size_t)cache_bytes, kp::stream()>>>(
      x.data_ptr<float>(), y.data_ptr<float>(), cols, x.stride(0), cache_bytes / 4);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
