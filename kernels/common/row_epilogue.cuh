// row_epilogue.cuh -- "elementwise op, then softmax over the row" for the GEMM problems, in one read and one
// write of the GEMM output.
//
// Two paths, one CTA (256 threads) per row:
//  - registers (rows of <= 8192 floats, 16-byte aligned, cols % 4 == 0: the benchmark shapes): each thread loads
//    its V float4s (coalesced), applies op, keeps z in registers; exact max, then e = exp(z - max) once, summed,
//    scaled on the way out. No shared-memory traffic for the row.
//  - shared memory (any other row): z parked in dynamic shared memory (all of it up to ~56K floats; longer rows
//    recompute the remainder from y, then an L2 hit), same math.
// y and out may alias (a row is read completely before any of it is written, and in the last pass each element is
// read and written by the same thread), so a caller can normalise the GEMM output in place.
// Numerics: exact max, one expf per element, block tree sums; a NaN/+inf z, or an all -inf row, gives a NaN row, as
// PyTorch's softmax does.
#pragma once
#include "kp.cuh"

namespace kp {

template <int V, class Op>
__global__ void __launch_bounds__(256) row_softmax_epilogue_reg(const float* y, float* out, int64_t cols,
                                                                int64_t ys, Op op) {
  __shared__ float scratch[64];
  const int64_t row = blockIdx.x;
  const float4* y4 = reinterpret_cast<const float4*>(y + row * ys);
  float4* o4 = reinterpret_cast<float4*>(out + row * cols);
  const int n4 = (int)(cols >> 2);
  float4 z[V];
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int i = threadIdx.x + 256 * k;
    if (i < n4) {
      const float4 q = y4[i];
      const int64_t j = 4 * (int64_t)i;
      z[k] = make_float4(op(q.x, j), op(q.y, j + 1), op(q.z, j + 2), op(q.w, j + 3));
      m = fmaxf(m, fmaxf(fmaxf(z[k].x, z[k].y), fmaxf(z[k].z, z[k].w)));
    }
  }
  m = block_max(m, scratch);
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    if (threadIdx.x + 256 * k < n4) {
      z[k].x = expf(z[k].x - m); z[k].y = expf(z[k].y - m);
      z[k].z = expf(z[k].z - m); z[k].w = expf(z[k].w - m);
      s += (z[k].x + z[k].y) + (z[k].z + z[k].w);
    }
  }
  s = block_sum(s, scratch);
  const float inv = 1.f / s;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int i = threadIdx.x + 256 * k;
    if (i < n4) o4[i] = make_float4(z[k].x * inv, z[k].y * inv, z[k].z * inv, z[k].w * inv);
  }
}

template <class Op>
__global__ void __launch_bounds__(256) row_softmax_epilogue(const float* y, float* out, int64_t cols, int64_t ys,
                                                            int64_t cap, Op op) {
  extern __shared__ float z[];
  __shared__ float scratch[64];
  const int64_t row = blockIdx.x;
  const float* yr = y + row * ys;
  float* orow = out + row * cols;

  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float v = op(yr[j], j);
    if (j < cap) z[j] = v;
    m = fmaxf(m, v);
  }
  m = block_max(m, scratch);
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float e = expf((j < cap ? z[j] : op(yr[j], j)) - m);
    if (j < cap) z[j] = e;
    s += e;
  }
  s = block_sum(s, scratch);
  const float inv = 1.f / s;
  // block_sum ended with __syncthreads, and every thread only revisits its own z slots: no further barrier.
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    orow[j] = (j < cap ? z[j] : expf(op(yr[j], j) - m)) * inv;
}

// Launch over a (rows, cols) float32 y with unit-stride rows (row stride ys) into a contiguous out.
template <class Op>
void launch_row_softmax_epilogue(const float* y, float* out, int64_t rows, int64_t cols, int64_t ys, Op op,
                                 int device) {
  if (rows == 0 || cols == 0) return;
  TORCH_CHECK(rows <= 2147483647LL, "too many rows for a 1-D grid: ", num(rows));
  const bool vec = cols % 4 == 0 && ys % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const unsigned grid = (unsigned)rows;
  if (vec && cols <= 256 * 4 * 8) {
    const int v = (int)((cols / 4 + 255) / 256);
    if (v <= 1) row_softmax_epilogue_reg<1, Op><<<grid, 256, 0, stream()>>>(y, out, cols, ys, op);
    else if (v <= 2) row_softmax_epilogue_reg<2, Op><<<grid, 256, 0, stream()>>>(y, out, cols, ys, op);
    else if (v <= 4) row_softmax_epilogue_reg<4, Op><<<grid, 256, 0, stream()>>>(y, out, cols, ys, op);
    else row_softmax_epilogue_reg<8, Op><<<grid, 256, 0, stream()>>>(y, out, cols, ys, op);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  static int optin[64] = {0};  // per device; the attribute never changes
  if (optin[device & 63] == 0)
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin[device & 63], cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int64_t cap = imin(cols, (optin[device & 63] - 1024) / 4);
  auto kern = row_softmax_epilogue<Op>;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(cap * 4)));
  kern<<<grid, 256, (size_t)(cap * 4), stream()>>>(y, out, cols, ys, cap, op);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace kp
