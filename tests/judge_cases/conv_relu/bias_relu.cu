// bias_relu.cu -- y = max(y + bias[c], 0) in place on a contiguous NCHW tensor (the epilogue of a bias-free
// convolution); one thread per element, grid-stride, 64-bit indices.
#include "common/kp.cuh"

__global__ void bias_relu(float* __restrict__ y, const float* __restrict__ bias, int64_t n, int64_t hw, int64_t c) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = y[i] + bias[(i / hw) % c];
    y[i] = v > 0.f ? v : (v == v ? 0.f : v);
  }
}

KP_EXPORT void bias_relu_(const at::TensorBase& y, const at::TensorBase& bias) {
  kp::check_f32_cuda(y, "y");
  TORCH_CHECK(y.dim() == 4 && y.is_contiguous() && bias.numel() == y.size(1), "contiguous NCHW y, bias of C");
  int64_t n = y.numel();
  if (n == 0) return;
  int blocks = (int)kp::imin((n + 255) / 256, 65535);
  bias_relu<<<blocks, 256, 0, kp::stream()>>>(y.data_ptr<float>(), bias.data_ptr<float>(), n,
                                              y.size(2) * y.size(3), y.size(1));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
