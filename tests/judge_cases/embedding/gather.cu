// gather.cu -- y[i, :] = table[idx[i], :] for int64 indices; one warp per index row, lanes over the columns.
// Indices outside [0, num) are reported through a flag, never read out of bounds.
#include "common/kp.cuh"

__global__ void gather_rows(const int64_t* __restrict__ idx, const float* __restrict__ table, float* __restrict__ y,
                            int64_t n, int64_t num, int64_t dim, int* __restrict__ bad) {
  int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (row >= n) return;
  int64_t k = idx[row];
  if (k < 0 || k >= num) {
    if (lane == 0) atomicExch(bad, 1);
    return;
  }
  for (int64_t j = lane; j < dim; j += 32) y[row * dim + j] = table[k * dim + j];
}

KP_EXPORT void gather_forward(const at::TensorBase& idx, const at::TensorBase& table, const at::TensorBase& y,
                              const at::TensorBase& bad) {
  TORCH_CHECK(idx.is_contiguous() && idx.scalar_type() == at::kLong, "idx: contiguous int64");
  kp::check_f32_cuda(table, "table");
  int64_t n = idx.numel();
  if (n == 0) return;
  int64_t blocks = (n * 32 + 255) / 256;
  gather_rows<<<blocks, 256, 0, kp::stream()>>>(idx.data_ptr<int64_t>(), table.data_ptr<float>(),
                                               y.data_ptr<float>(), n, table.size(0), table.size(1),
                                               bad.data_ptr<int>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
