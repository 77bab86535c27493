// probes/l2 -- drop a buffer's lines from L2 without writing them back: a write flush that leaves the L2 with no
// dirty lines. Not a problem variant: bench/matmul_sum_max_mean_lse/flush_ab.py builds it with
// harness.build_path and times a kernel after each way of flushing, with and without the inputs rewritten first.
// Requires: sm_80 (discard.global.L2)
//
// Why: a write flush evicts every earlier line but leaves its own buffer dirty, and the next call pays for writing
//   it back; discarding that buffer's lines afterwards (invalidate, no write-back: its contents do not matter)
//   leaves nothing dirty behind. The A/B compares that with the timer's read flush (they tie on the H200).
// Ownership and launch: grid-stride, 1024 CTAs x 256 threads, one 128-byte line per thread per step.
// Bytes: none moved (discard touches L2 tags only). Preconditions (checked): a CUDA tensor whose byte size is a
//   multiple of 128 and whose data is 128-byte aligned. Numerics: the buffer's contents become undefined.
// Measured: see bench/matmul_sum_max_mean_lse/flush_ab.py output (docs/linear_problems.md).
#include "../../kernels/common/kp.cuh"

namespace {

__global__ void discard_lines(char* p, int64_t nlines) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < nlines;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    asm volatile("discard.global.L2 [%0], 128;" ::"l"(p + i * 128) : "memory");
}

}  // namespace

KP_EXPORT void discard_l2(const at::TensorBase& buf) {
  TORCH_CHECK(buf.is_cuda(), "discard_l2: buf must be a CUDA tensor");
  const int64_t bytes = buf.numel() * static_cast<int64_t>(buf.element_size());
  TORCH_CHECK(bytes % 128 == 0 && reinterpret_cast<uintptr_t>(buf.data_ptr()) % 128 == 0,
              "discard_l2: buf must be 128-byte aligned and a multiple of 128 bytes long, got ", kp::num(bytes));
  if (bytes == 0) return;
  const c10::cuda::CUDAGuard g(buf.device());
  discard_lines<<<1024, 256, 0, kp::stream()>>>(static_cast<char*>(buf.data_ptr()), bytes / 128);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
