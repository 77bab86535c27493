// The row-per-block softmax backward (two reads of y and dy, any row length, stride and offset): 1_tworead's whole
// kernel, and 2_cluster's path for the rows its cluster cannot hold.
#pragma once
#include "../common/kp.cuh"

namespace kp_softmax_backward {

__global__ void __launch_bounds__(512) rowblock(const float* __restrict__ y, const float* __restrict__ dy,
                                                float* __restrict__ dx, int64_t cols, int64_t ys, int64_t dys) {
  __shared__ float scratch[64];
  const int64_t row = blockIdx.x;
  const float* yr = y + row * ys;  // 64-bit: row * stride exceeds 2^31 at the benchmark shape
  const float* gr = dy + row * dys;
  float* xr = dx + row * cols;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) s += yr[i] * gr[i];
  s = kp::block_sum(s, scratch);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) xr[i] = yr[i] * (gr[i] - s);
}

// One block of 512 threads per row on the current stream (rows and columns non-zero, checked by the caller).
inline void launch_rowblock(const at::TensorBase& y, const at::TensorBase& dy, const at::TensorBase& dx) {
  const int64_t rows = y.size(0), cols = y.size(1);
  TORCH_CHECK(rows <= 2147483647LL, "too many rows for a 1-D grid: ", kp::num(rows));
  rowblock<<<(unsigned)rows, 512, 0, kp::stream()>>>(y.data_ptr<float>(), dy.data_ptr<float>(), dx.data_ptr<float>(),
                                                     cols, y.stride(0), dy.stride(0));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace kp_softmax_backward
