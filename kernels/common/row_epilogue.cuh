// row_epilogue.cuh -- "elementwise op, then softmax over the row" for the GEMM problems, in one read and one
// write of the GEMM output.
//
// One CTA per row; the row's transformed values z = op(y[j], j) are computed once and parked in shared memory
// (all of them while the row fits, ~56K floats; longer rows recompute the remainder from y, which is then an L2
// hit). The max is exact (a pass over z), then e = exp(z - max) is computed once, stored back, summed, and scaled.
// y and out may alias (the kernel reads a whole row before it writes any of it, and each element is read and
// written by the same thread in the last pass), so a caller can normalise the GEMM output in place.
// Numerics: exact max, one expf per element, block tree sums; a NaN/+inf z, or an all -inf row, gives a NaN row, as
// PyTorch's softmax does.
#pragma once
#include "kp.cuh"

namespace kp {

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
  int optin = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int64_t cap = imin(cols, (optin - 1024) / 4);
  auto kern = row_softmax_epilogue<Op>;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(cap * 4)));
  kern<<<(unsigned)rows, 256, (size_t)(cap * 4), stream()>>>(y, out, cols, ys, cap, op);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace kp
