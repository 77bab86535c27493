// matmul_sum_max_mean_lse / 1_colsum_gemv -- the whole forward as x @ W.sum(0) + b.sum(): a column sum of W, then
// a GEMV, never the 1024x8192x8192 GEMM.
//
// Why that is exact: after torch.sum(dim=1, keepdim=True) the tensor is (B, 1); max, mean and both logsumexps then
//   run over a dimension of size 1 and return their input (logsumexp of one element subtracts the max: exactly
//   0 + x). sum_o (x W^T + b)[i, o] = x[i, :] . (sum_o W[o, :]) + sum_o b[o] by linearity.
// Kernels:
//   colsum_partial: CTA (t, p) owns a 1024-column tile t (256 threads x float4) and a group of RPG rows p of W; it
//     writes the tile's partial column sums to partial[p, :]. grid = (ceil(I/1024), ceil(O/RPG)). This is the one
//     pass over W (256 MiB at 8192x8192) and sets the time.
//   colsum_finish: v[j] = sum_p partial[p, j] (from L2), bsum = sum(b) (CTA 0).
//   gemv: one 256-thread CTA per row of x: out[i] = x[i, :] . v + bsum, v read from L1/L2.
//   ModelNew caches (v, bsum) as a function of (W, b) and re-runs the first two kernels when either changes.
// Bytes: uncached 4*O*I + 4*B*I + small (288 MiB at the bench shape: ~68 us at 4.2 TB/s copy speed, a read-only
//   stream runs closer to HBM peak); cached 4*B*I (32 MiB: ~8 us). Eager runs the full GEMM (137 GFLOP, ~2.8 ms).
// Bound: memory.
// Preconditions (checked): float32 CUDA tensors on one device; W 2-D contiguous; x 2-D with unit-stride rows and
//   x.size(1) == W.size(1); b 1-D of W.size(0) (or empty for no bias). float4 paths need 16-byte aligned rows,
//   other layouts take scalar loads.
// Numerics: every sum in float64 (W's column sums, b's sum, the dot products), one rounding to fp32 at the end:
//   x.v and b.sum() can nearly cancel (a batch-1 case lost 1.3e-6 relative with fp32 sums), and double adds are free
//   in a memory-bound kernel. relL2 vs float64 ~6e-8, far below the reference's own fp32 error.
// Measured: see README (H200 run of 2026-11-22).
#include "../common/kp.cuh"

namespace {

constexpr int TILE = 1024;  // columns per colsum CTA (256 threads x 4)
constexpr int RPG = 64;     // rows of W per colsum CTA

struct D4 {
  double x, y, z, w;
};

__global__ void __launch_bounds__(256) colsum_partial(const float* __restrict__ w, int64_t rows, int64_t cols,
                                                      double* __restrict__ partial, bool vec) {
  const int64_t r0 = (int64_t)blockIdx.y * RPG, r1 = kp::imin(rows, r0 + RPG);
  const int64_t c = (int64_t)blockIdx.x * TILE + 4 * threadIdx.x;
  D4 acc = {0., 0., 0., 0.};
  if (vec) {
    if (c < cols) {
#pragma unroll 8
      for (int64_t r = r0; r < r1; ++r) {
        const float4 v = *reinterpret_cast<const float4*>(w + r * cols + c);
        acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
      }
    }
  } else {
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr = w + r * cols;
      // Scalar path: the same 4 columns per thread, in 4 coalesced sweeps of the tile.
      const int64_t cc = (int64_t)blockIdx.x * TILE + threadIdx.x;
      if (cc < cols) acc.x += wr[cc];
      if (cc + 256 < cols) acc.y += wr[cc + 256];
      if (cc + 512 < cols) acc.z += wr[cc + 512];
      if (cc + 768 < cols) acc.w += wr[cc + 768];
    }
  }
  double* pr = partial + (int64_t)blockIdx.y * cols;
  if (vec) {
    if (c < cols) { pr[c] = acc.x; pr[c + 1] = acc.y; pr[c + 2] = acc.z; pr[c + 3] = acc.w; }
  } else {
    const int64_t cc = (int64_t)blockIdx.x * TILE + threadIdx.x;
    if (cc < cols) pr[cc] = acc.x;
    if (cc + 256 < cols) pr[cc + 256] = acc.y;
    if (cc + 512 < cols) pr[cc + 512] = acc.z;
    if (cc + 768 < cols) pr[cc + 768] = acc.w;
  }
}

__global__ void __launch_bounds__(256) colsum_finish(const double* __restrict__ partial, int64_t groups,
                                                     int64_t cols, const float* __restrict__ b, int64_t nb,
                                                     double* __restrict__ v, double* __restrict__ bsum) {
  const int64_t j = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (j < cols) {
    double s = 0.;
#pragma unroll 8
    for (int64_t p = 0; p < groups; ++p) s += partial[p * cols + j];
    v[j] = s;
  }
  if (blockIdx.x == 0) {
    __shared__ double scratch[64];
    double s = 0.;
    for (int64_t k = threadIdx.x; k < nb; k += 256) s += b[k];
    s = kp::block_sum(s, scratch);
    if (threadIdx.x == 0) *bsum = s;
  }
}

__global__ void __launch_bounds__(256) gemv(const float* __restrict__ x, int64_t cols, int64_t xs,
                                            const double* __restrict__ v, const double* __restrict__ bsum,
                                            float* __restrict__ out, bool vec) {
  __shared__ double scratch[64];
  const float* xr = x + (int64_t)blockIdx.x * xs;
  double s = 0.;
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < cols / 4; i += 256) {
      const float4 a = x4[i];
      s += ((double)a.x * v[4 * i] + (double)a.y * v[4 * i + 1]) +
           ((double)a.z * v[4 * i + 2] + (double)a.w * v[4 * i + 3]);
    }
  } else {
    for (int64_t i = threadIdx.x; i < cols; i += 256) s += (double)xr[i] * v[i];
  }
  s = kp::block_sum(s, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = (float)(s + *bsum);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

// v (I doubles) and bsum (1 double) := W.sum(0), b.sum(). partial: float64 scratch of >= ceil(O/64) * I.
KP_EXPORT void colsum(const at::TensorBase& w, const at::TensorBase& b, const at::TensorBase& partial,
                      const at::TensorBase& v, const at::TensorBase& bsum) {
  kp::check_f32_cuda(w, "weight");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(), "weight must be a contiguous 2-D tensor");
  const int64_t rows = w.size(0), cols = w.size(1);
  if (b.numel()) {
    kp::check_f32_cuda(b, "bias");
    kp::check_same_device(w, b, "colsum");
    TORCH_CHECK(b.is_contiguous(), "bias must be contiguous");
  }
  for (auto* t : {&partial, &v, &bsum}) {
    TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kDouble && t->is_contiguous(),
                "colsum scratch/outputs must be contiguous float64 CUDA tensors");
    kp::check_same_device(w, *t, "colsum");
  }
  TORCH_CHECK(!b.numel() || (b.dim() == 1 && b.size(0) == rows), "bias must have ", kp::num(rows), " elements");
  const int64_t groups = (rows + RPG - 1) / RPG;
  TORCH_CHECK(partial.numel() >= groups * cols, "partial scratch too small");
  TORCH_CHECK(v.numel() == cols && bsum.numel() == 1, "v must have ", kp::num(cols), " elements, bsum 1");
  TORCH_CHECK(groups <= 65535, "weight has too many rows for the grid: ", kp::num(rows));
  c10::cuda::CUDAGuard guard(w.device());
  if (cols > 0 && groups > 0) {
    const bool vec = cols % 4 == 0 && aligned16(w.data_ptr());
    colsum_partial<<<dim3((unsigned)((cols + TILE - 1) / TILE), (unsigned)groups), 256, 0, kp::stream()>>>(
        w.data_ptr<float>(), rows, cols, partial.data_ptr<double>(), vec);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  colsum_finish<<<(unsigned)std::max<int64_t>(1, (cols + 255) / 256), 256, 0, kp::stream()>>>(
      partial.data_ptr<double>(), groups, cols, b.numel() ? b.data_ptr<float>() : nullptr, b.numel(),
      v.data_ptr<double>(), bsum.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// out (B, 1) := x @ v + bsum.
KP_EXPORT void gemv_bias(const at::TensorBase& x, const at::TensorBase& v, const at::TensorBase& bsum,
                         const at::TensorBase& out) {
  kp::check_f32_cuda(x, "x");
  kp::check_f32_cuda(out, "out");
  TORCH_CHECK(v.scalar_type() == at::kDouble && bsum.scalar_type() == at::kDouble, "v and bsum must be float64");
  kp::check_same_device(x, v, "gemv");
  kp::check_same_device(x, bsum, "gemv");
  kp::check_same_device(x, out, "gemv");
  TORCH_CHECK(x.dim() == 2, "x must be 2-D, got ", kp::num(x.dim()), "-D");
  TORCH_CHECK(x.size(1) <= 1 || x.stride(1) == 1, "x rows must be unit-stride");
  TORCH_CHECK(v.is_contiguous() && v.numel() == x.size(1), "x has ", kp::num(x.size(1)), " features, v ",
              kp::num(v.numel()));
  TORCH_CHECK(out.is_contiguous() && out.numel() == x.size(0), "out must hold one value per row");
  const int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0) return;
  TORCH_CHECK(rows <= 2147483647LL, "too many rows: ", kp::num(rows));
  c10::cuda::CUDAGuard guard(x.device());
  const bool vec = cols % 4 == 0 && x.stride(0) % 4 == 0 && aligned16(x.data_ptr());
  gemv<<<(unsigned)rows, 256, 0, kp::stream()>>>(x.data_ptr<float>(), cols, x.stride(0), v.data_ptr<double>(),
                                                 bsum.data_ptr<double>(), out.data_ptr<float>(), vec);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
