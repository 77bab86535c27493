// relu.cu -- y = max(x, 0) elementwise; one thread per element, grid-stride, 64-bit indices.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAStream.h>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = x[i];
    y[i] = v > 0.f ? v : (v == v ? 0.f : v);  // NaN stays NaN, as torch.relu
  }
}

at::Tensor relu_forward(at::Tensor x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.is_contiguous(), "x: contiguous float32 CUDA");
  at::Tensor y = at::empty_like(x);
  int64_t n = x.numel();
  if (n == 0) return y;
  int blocks = (int)std::min<int64_t>((n + 255) / 256, 65535);
  relu_kernel<<<blocks, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
