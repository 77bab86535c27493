// row_sum.cu -- y[r] = sum_c x[r, c] for a contiguous (rows, cols) float32 matrix: a block of 256 threads per row
// (grid-stride over the rows: 264 blocks, about 8 rows each), each thread's strided partial reduced by warp
// shuffles, the warps' partials through shared memory (or, in one mode, global scratch) to warp 0.
// The mode picks a defect that leaves every output right, for the judge's --sanitize cases:
//   0  none;
//   1  each row read in whole rounds of the block's threads, up to 255 elements past its end (into the next row, and
//      past the matrix's end at the last row), the values beyond the row discarded: memcheck's out-of-bounds read;
//   2  no barrier at the end of a row: the next row's partials are written to shared memory while warp 0 may still
//      read this row's (a write-after-read race racecheck sees; in practice warp 0 has read them long before the
//      other warps finish their next 16 loads);
//   3  the warps' partials through a scratch buffer the caller leaves uninitialised, warp 0 reading all 32 slots of
//      a row and using only the 8 written: initcheck's uninitialised global read;
//   4  warp 0 reads all 32 shared slots and masks the 24 never written by multiplying them by 0: right while what
//      an earlier kernel left there is finite, NaN after the judge's shared-memory fill of 0xFF bytes.
// Bytes: the matrix once (mode 1 up to 6% more); memory-bound. Preconditions: contiguous float32 on the GPU; 64-bit
// offsets. Numerics: float32 partials of about 16 terms, then two shuffle trees (PyTorch's own sum is alike).
// Measured: not timed; a judge case, not a kernel of the playground's.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAStream.h>

template <int MODE>
__global__ void row_sum_kernel(const float* __restrict__ x, float* __restrict__ y, float* scratch, int64_t rows,
                               int64_t cols) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* p = x + r * cols;
    float acc = 0.f;
    if (MODE == 1) {
      const int64_t rounds = (cols + blockDim.x - 1) / blockDim.x * blockDim.x;
      for (int64_t c = threadIdx.x; c < rounds; c += blockDim.x) {
        float v = reinterpret_cast<const volatile float*>(p)[c];  // loaded whether or not it is the row's
        acc += c < cols ? v : 0.f;
      }
    } else {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) acc += p[c];
    }
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (MODE == 3) {
      volatile float* row_scratch = scratch + r * 32;
      if (lane == 0) row_scratch[warp] = acc;
      __syncthreads();
      if (warp == 0) {
        float v = row_scratch[lane];  // all 32 slots read, the 8 written kept
        float s = lane < nwarps ? v : 0.f;
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) y[r] = s;
      }
      __syncthreads();
      continue;
    }
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      float s = MODE == 4 ? part[lane] * static_cast<float>(lane < nwarps) : (lane < nwarps ? part[lane] : 0.f);
      for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) y[r] = s;
    }
    if (MODE != 2) __syncthreads();
  }
}

at::Tensor row_sum(at::Tensor x, int64_t mode) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "x: a contiguous 2-D float32 CUDA tensor");
  TORCH_CHECK(mode >= 0 && mode <= 4, "mode: 0 to 4");
  const int64_t rows = x.size(0), cols = x.size(1);
  at::Tensor y = at::empty({rows}, x.options());
  if (rows == 0) return y;
  at::Tensor scratch = mode == 3 ? at::empty({rows, 32}, x.options()) : y;
  const int blocks = (int)std::min<int64_t>(rows, 264);
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto args = [&](auto kernel) {
    kernel<<<blocks, 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), scratch.data_ptr<float>(), rows,
                                       cols);
  };
  if (mode == 0) args(row_sum_kernel<0>);
  if (mode == 1) args(row_sum_kernel<1>);
  if (mode == 2) args(row_sum_kernel<2>);
  if (mode == 3) args(row_sum_kernel<3>);
  if (mode == 4) args(row_sum_kernel<4>);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
