// colstats.cu -- per-column mean and biased variance of a contiguous (R, C) float32 tensor, in float64: one thread
// per column (consecutive threads on consecutive columns, coalesced), two passes over its rows.
#include "common/kp.cuh"

__global__ void col_stats(const float* __restrict__ x, double* __restrict__ mean, double* __restrict__ var,
                          int64_t R, int64_t C) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (c >= C) return;
  double s = 0.0;
  for (int64_t r = 0; r < R; ++r) s += x[r * C + c];
  const double m = s / R;
  double q = 0.0;
  for (int64_t r = 0; r < R; ++r) {
    double d = x[r * C + c] - m;
    q += d * d;
  }
  mean[c] = m;
  var[c] = q / R;
}

KP_EXPORT void col_stats_forward(const at::TensorBase& x, const at::TensorBase& mean, const at::TensorBase& var) {
  kp::check_f32_cuda(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(0) > 0, "contiguous 2-D x with rows");
  int64_t C = x.size(1);
  if (C == 0) return;
  col_stats<<<(C + 127) / 128, 128, 0, kp::stream()>>>(x.data_ptr<float>(), mean.data_ptr<double>(),
                                                       var.data_ptr<double>(), x.size(0), C);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
