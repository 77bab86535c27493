// The row-per-block softmax backward (two reads of y and dy, any row length, stride and offset): 1_tworead's whole
// kernel, and the cluster rungs' path for the rows their clusters cannot hold; and those rungs' shared host side
// (which rows a cluster takes, the cluster's size, the persistent cluster launch).
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

// Whether a cluster rung's path takes these rows: a multiple of 4 columns, at most max_cols, y's and dy's rows
// 16-byte aligned (base and row stride: a float4's and a bulk copy's granule).
inline bool cluster_rows(const at::TensorBase& y, const at::TensorBase& dy, int64_t max_cols) {
  const auto aligned = [](const at::TensorBase& t) {
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && (t.size(0) <= 1 || t.stride(0) % 4 == 0);
  };
  const int64_t cols = y.size(1);
  return cols % 4 == 0 && cols <= max_cols && aligned(y) && aligned(dy);
}

// The smallest power-of-two cluster (at most max_cl CTAs) whose slices fit `slice` floats, and each rank's columns
// (rounded up to whole float4s): {cl, chunk}.
inline std::pair<int64_t, int64_t> cluster_split(int64_t cols, int64_t slice, int64_t max_cl) {
  int64_t cl = 1;
  while (cl < max_cl && (cols + cl - 1) / cl > slice) cl *= 2;
  return {cl, ((cols + cl - 1) / cl + 3) / 4 * 4};
}

// A persistent launch of `kern` on the current stream: clusters of cl CTAs (threads each, smem bytes of dynamic
// shared memory), as many as the GPU holds at once and at most `rows` (`clusters`); cfg is ready for
// cudaLaunchKernelEx. Not copyable: cfg points at attr.
struct ClusterLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  int64_t clusters = 0;
  template <typename Kernel>
  ClusterLaunch(Kernel kern, int64_t cl, int threads, size_t smem, int64_t rows, const char* who) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (cl > 8) C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = kp::stream();
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)cl;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cfg.gridDim = dim3((unsigned)cl);
    int fit = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&fit, kern, &cfg));
    TORCH_CHECK(fit > 0, who, ": a cluster of ", kp::num(cl), " CTAs with ", kp::num((long long)(smem >> 10)),
                " KiB of shared memory each cannot be scheduled on this GPU");
    clusters = kp::imin(rows, fit);
    cfg.gridDim = dim3((unsigned)(clusters * cl));
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

}  // namespace kp_softmax_backward
