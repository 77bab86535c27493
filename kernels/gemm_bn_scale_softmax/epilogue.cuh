// gemm_bn_scale_softmax/epilogue.cuh -- the BatchNorm (train/eval) + scale + row softmax epilogue shared by every rung of this problem (the rung .cu files
// export thin wrappers; the design notes are in 1_cublas_fused_epilogue.cu's header).
#pragma once
#include "../common/row_epilogue.cuh"

namespace ep {

namespace {

constexpr int COLS = 32, RG = 8;  // columns per CTA, row groups (warps) per CTA

__global__ void __launch_bounds__(COLS * RG)
    bn_coef_kernel(const float* __restrict__ y, int64_t rows, int64_t cols, int64_t ys, bool training,
                   float* __restrict__ rmean, float* __restrict__ rvar, const int64_t* __restrict__ nbt,
                   double momentum, bool cumulative, const float* __restrict__ gamma, const float* __restrict__ beta,
                   const float* __restrict__ scale, int64_t scale_n, double eps, const float* __restrict__ lin_bias,
                   float* __restrict__ mean_out,
                   float* __restrict__ a_out, float* __restrict__ c_out) {
  __shared__ float red[RG][COLS];
  const int lane = threadIdx.x % COLS, g = threadIdx.x / COLS;
  const int64_t j = (int64_t)blockIdx.x * COLS + lane;
  const bool live = j < cols;
  float mean, var;
  if (training) {
    float s = 0.f;
    if (live)
#pragma unroll 8
      for (int64_t i = g; i < rows; i += RG) s += y[i * ys + j];
    red[g][lane] = s;
    __syncthreads();
    s = 0.f;
#pragma unroll
    for (int k = 0; k < RG; ++k) s += red[k][lane];
    mean = s / (float)rows;
    __syncthreads();
    float q = 0.f;
    if (live)
#pragma unroll 8
      for (int64_t i = g; i < rows; i += RG) {
        const float d = y[i * ys + j] - mean;
        q += d * d;
      }
    red[g][lane] = q;
    __syncthreads();
    q = 0.f;
#pragma unroll
    for (int k = 0; k < RG; ++k) q += red[k][lane];
    var = q / (float)rows;  // biased: what normalisation uses
  }
  if (g != 0 || !live) return;
  const float lb = lin_bias ? lin_bias[j] : 0.f;
  if (training) {
    // nn.BatchNorm1d: num_batches_tracked was incremented before this kernel; momentum None means the cumulative
    // average with factor 1 / num_batches_tracked.
    const float f = cumulative ? (float)(1.0 / (double)(*nbt)) : (float)momentum;
    const float unbiased = rows > 1 ? var * ((float)rows / (float)(rows - 1)) : NAN;
    rmean[j] = (1.f - f) * rmean[j] + f * (mean + lb);  // the batch mean of y + b
    rvar[j] = (1.f - f) * rvar[j] + f * unbiased;
  } else {
    mean = rmean[j] - lb;  // centre y (without b) so that y - mean = (y + b) - running_mean
    var = rvar[j];
  }
  const float sc = scale[scale_n == 1 ? 0 : j];
  const float rstd = 1.f / sqrtf(var + (float)eps);
  mean_out[j] = mean;
  a_out[j] = sc * (gamma ? gamma[j] : 1.f) * rstd;
  c_out[j] = sc * (beta ? beta[j] : 0.f);
}

struct Affine {
  const float *mean, *a, *c;
  __device__ __forceinline__ float operator()(float v, int64_t j) const { return (v - mean[j]) * a[j] + c[j]; }
};

void check_vec(const at::TensorBase& t, const at::TensorBase& y, const char* name) {
  kp::check_f32_cuda(t, name);
  kp::check_same_device(t, y, name);
  TORCH_CHECK(t.dim() == 1 && t.size(0) == y.size(1) && t.is_contiguous(), name, " must be a contiguous 1-D tensor of ",
              kp::num(y.size(1)), " floats");
}

void check_y(const at::TensorBase& y) {
  kp::check_f32_cuda(y, "y");
  TORCH_CHECK(y.dim() == 2, "y must be 2-D, got ", kp::num(y.dim()), "-D");
  TORCH_CHECK(y.size(1) <= 1 || y.stride(1) == 1, "y rows must be unit-stride");
}

}  // namespace

// gamma/beta may be empty (affine=False), lin_bias empty (Linear without bias). scale has 1 or N elements. mean/a/c are outputs of N floats.
inline void bn_coefficients(const at::TensorBase& y, bool training, const at::TensorBase& running_mean,
                               const at::TensorBase& running_var, const at::TensorBase& num_batches_tracked,
                               double momentum, bool cumulative, const at::TensorBase& gamma,
                               const at::TensorBase& beta, const at::TensorBase& scale, double eps,
                               const at::TensorBase& lin_bias, const at::TensorBase& mean, const at::TensorBase& a, const at::TensorBase& c) {
  check_y(y);
  const int64_t rows = y.size(0), cols = y.size(1);
  check_vec(running_mean, y, "running_mean");
  check_vec(running_var, y, "running_var");
  check_vec(mean, y, "mean");
  check_vec(a, y, "a");
  check_vec(c, y, "c");
  if (gamma.numel()) check_vec(gamma, y, "weight");
  if (beta.numel()) check_vec(beta, y, "bias");
  if (lin_bias.numel()) check_vec(lin_bias, y, "linear bias");
  kp::check_f32_cuda(scale, "scale");
  kp::check_same_device(scale, y, "scale");
  TORCH_CHECK(scale.is_contiguous() && (scale.numel() == 1 || scale.numel() == cols),
              "scale must have 1 or ", kp::num(cols), " elements, got ", kp::num(scale.numel()));
  TORCH_CHECK(num_batches_tracked.is_cuda() && num_batches_tracked.scalar_type() == at::kLong &&
                  num_batches_tracked.numel() == 1,
              "num_batches_tracked must be a one-element int64 CUDA tensor");
  kp::check_same_device(num_batches_tracked, y, "num_batches_tracked");
  TORCH_CHECK(!training || rows >= 2, "training-mode batch norm needs more than 1 row per channel, got ",
              kp::num(rows));
  if (cols == 0) return;
  c10::cuda::CUDAGuard guard(y.device());
  bn_coef_kernel<<<(unsigned)((cols + COLS - 1) / COLS), COLS * RG, 0, kp::stream()>>>(
      y.data_ptr<float>(), rows, cols, y.stride(0), training, running_mean.data_ptr<float>(),
      running_var.data_ptr<float>(), num_batches_tracked.data_ptr<int64_t>(), momentum, cumulative,
      gamma.numel() ? gamma.data_ptr<float>() : nullptr, beta.numel() ? beta.data_ptr<float>() : nullptr,
      scale.data_ptr<float>(), scale.numel(), eps, lin_bias.numel() ? lin_bias.data_ptr<float>() : nullptr,
      mean.data_ptr<float>(), a.data_ptr<float>(), c.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// out = softmax((y - mean) * a + c) per row; out may be y itself.
inline void bn_scale_softmax(const at::TensorBase& y, const at::TensorBase& mean, const at::TensorBase& a,
                                const at::TensorBase& c, const at::TensorBase& out) {
  check_y(y);
  check_vec(mean, y, "mean");
  check_vec(a, y, "a");
  check_vec(c, y, "c");
  kp::check_f32_cuda(out, "out");
  kp::check_same_device(out, y, "out");
  TORCH_CHECK(out.sizes() == y.sizes() && out.is_contiguous(), "out must be contiguous with y's shape");
  c10::cuda::CUDAGuard guard(y.device());
  kp::launch_row_softmax_epilogue(y.data_ptr<float>(), out.data_ptr<float>(), y.size(0), y.size(1), y.stride(0),
                                  Affine{mean.data_ptr<float>(), a.data_ptr<float>(), c.data_ptr<float>()},
                                  y.get_device());
}

}  // namespace ep
