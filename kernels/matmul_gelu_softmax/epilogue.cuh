// matmul_gelu_softmax/epilogue.cuh -- the bias + exact GELU + row softmax epilogue shared by every rung of this problem (the rung .cu files
// export thin wrappers; the design notes are in 1_cublas_fused_epilogue.cu's header).
#pragma once
#include "../common/row_epilogue.cuh"

namespace ep {

namespace {
struct BiasGelu {
  const float* b;
  __device__ __forceinline__ float operator()(float v, int64_t j) const {
    const float z = b ? v + b[j] : v;
    return 0.5f * z * (1.f + erff(z * 0.70710678118654752f));
  }
};
}  // namespace

inline void bias_gelu_softmax(const at::TensorBase& y, const at::TensorBase& bias, const at::TensorBase& out) {
  kp::check_f32_cuda(y, "y");
  kp::check_f32_cuda(out, "out");
  kp::check_same_device(y, out, "bias_gelu_softmax");
  TORCH_CHECK(y.dim() == 2, "y must be 2-D, got ", kp::num(y.dim()), "-D");
  TORCH_CHECK(y.size(1) <= 1 || y.stride(1) == 1, "y rows must be unit-stride");
  TORCH_CHECK(out.sizes() == y.sizes() && out.is_contiguous(), "out must be contiguous with y's shape");
  const bool has_bias = bias.numel() > 0;
  if (has_bias) {
    kp::check_f32_cuda(bias, "bias");
    kp::check_same_device(y, bias, "bias_gelu_softmax");
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == y.size(1) && bias.is_contiguous(),
                "bias must be a contiguous 1-D tensor of ", kp::num(y.size(1)), " floats");
  }
  c10::cuda::CUDAGuard guard(y.device());
  kp::launch_row_softmax_epilogue(y.data_ptr<float>(), out.data_ptr<float>(), y.size(0), y.size(1), y.stride(0),
                                  BiasGelu{has_bias ? bias.data_ptr<float>() : nullptr}, y.get_device());
}

}  // namespace ep
