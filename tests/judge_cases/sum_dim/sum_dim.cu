// sum_dim.cu -- y[b, 0, j] = sum_i x[b, i, j] for a contiguous (B, N, M) float32 tensor; one thread per (b, j),
// consecutive threads on consecutive j (coalesced), a float64 accumulator (the serial sum then stays well inside
// PyTorch's own error). SKIP drops the last element of each sum (a known-wrong candidate uses it).
#include "common/kp.cuh"

template <int SKIP>
__global__ void sum_mid(const float* __restrict__ x, float* __restrict__ y, int64_t B, int64_t N, int64_t M) {
  int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (t >= B * M) return;
  int64_t b = t / M, j = t % M;
  const float* p = x + b * N * M + j;
  double s = 0.0;
  for (int64_t i = 0; i < N - SKIP; ++i) s += p[i * M];
  y[t] = (float)s;
}

KP_EXPORT void sum_mid_forward(const at::TensorBase& x, const at::TensorBase& y, bool skip_last) {
  kp::check_f32_cuda(x, "x");
  TORCH_CHECK(x.dim() == 3 && x.is_contiguous(), "x must be a contiguous 3-D tensor");
  int64_t B = x.size(0), N = x.size(1), M = x.size(2);
  if (B * M == 0) return;
  int64_t blocks = (B * M + 255) / 256;
  auto f = skip_last ? sum_mid<1> : sum_mid<0>;
  f<<<blocks, 256, 0, kp::stream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), B, N, M);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
