// kp/kernels/shared_poison.cu -- every SM's shared memory filled with one byte value, right before a judged call
// (the judge's --sanitize, its shared-memory pass). Not a problem's kernel: the judge's own, built through the
// compile cache by the judge and loaded from it by the candidate's worker.
// Requires: sm_80
//
// Why: shared memory keeps what the last block on an SM left there (on an H200, a kernel's reads of shared memory it
//   never wrote returned this kernel's value at 135,168 of 135,168 reads), so a kernel that reads shared memory it
//   never wrote reads whatever ran before it. compute-sanitizer's initcheck tracks global memory only. Run once
//   with 0x00 and once with 0xFF (NaN in every floating type) before the same call, a candidate whose output is
//   finite after the one and not after the other computed with shared memory it never wrote.
// Ownership and launch: two blocks per SM of 1024 threads, each with the most dynamic shared memory a block may
//   have, every thread storing 32-bit words strided by the block; volatile stores, so none is dropped as dead.
// Bytes: 2 x SMs x (max shared memory per block) of shared stores, no global traffic; a few microseconds.
// Preconditions (checked): a CUDA device current; byte in [0, 255]. Numerics: none.
// Measured: H200 (132 SMs, 227 KiB per block), every unwritten shared read of the next kernel saw the fill
//   (2026-12-03).
#include "../../kernels/common/kp.cuh"

#include <c10/cuda/CUDAFunctions.h>

namespace {

__global__ void fill_shared(uint32_t word, int words) {
  extern __shared__ uint32_t smem[];
  volatile uint32_t* s = smem;
  for (int i = threadIdx.x; i < words; i += blockDim.x) s[i] = word;
}

}  // namespace

KP_EXPORT void poison_shared(int64_t byte) {
  TORCH_CHECK(byte >= 0 && byte <= 255, "poison_shared: byte must be in [0, 255], got ", byte);
  const int device = c10::cuda::current_device();
  int sms = 0, most = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  C10_CUDA_CHECK(cudaFuncSetAttribute(fill_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
  const uint32_t word = 0x01010101u * static_cast<uint32_t>(byte);
  fill_shared<<<2 * sms, 1024, most, kp::stream()>>>(word, most / 4);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
