// maxarg.cu -- per row of a contiguous (R, C) float32 tensor, the maximum and the first index holding it; one
// 256-thread block per row, (value, index) pairs reduced through shared memory. NaN counts as the maximum, as in
// torch.max. MIN picks the minimum instead (a known-wrong candidate uses it).
#include "common/kp.cuh"

template <bool MIN>
__global__ void __launch_bounds__(256) row_maxarg(const float* __restrict__ x, float* __restrict__ v,
                                                  int64_t* __restrict__ ix, int64_t C) {
  __shared__ float sv[256];
  __shared__ int64_t si[256];
  const float* xr = x + blockIdx.x * C;
  float best = MIN ? INFINITY : -INFINITY;
  int64_t at = -1;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    float a = xr[j];
    bool take = at < 0 || (MIN ? (a < best || a != a) : (a > best || a != a)) && best == best;
    if (take) best = a, at = j;
  }
  sv[threadIdx.x] = best;
  si[threadIdx.x] = at;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      float a = sv[threadIdx.x + s], b = sv[threadIdx.x];
      int64_t ia = si[threadIdx.x + s], ib = si[threadIdx.x];
      bool nan_a = a != a, nan_b = b != b;
      bool take = ia >= 0 && (ib < 0 || (nan_a && !nan_b) ||
                              (!nan_b && !nan_a && (MIN ? a < b : a > b)) || ((a == b || (nan_a && nan_b)) && ia < ib));
      if (take) sv[threadIdx.x] = a, si[threadIdx.x] = ia;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) v[blockIdx.x] = sv[0], ix[blockIdx.x] = si[0];
}

KP_EXPORT void maxarg_forward(const at::TensorBase& x, const at::TensorBase& v, const at::TensorBase& ix, bool min) {
  kp::check_f32_cuda(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) > 0, "contiguous 2-D x with columns");
  if (x.size(0) == 0) return;
  auto f = min ? row_maxarg<true> : row_maxarg<false>;
  f<<<x.size(0), 256, 0, kp::stream()>>>(x.data_ptr<float>(), v.data_ptr<float>(), ix.data_ptr<int64_t>(), x.size(1));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
