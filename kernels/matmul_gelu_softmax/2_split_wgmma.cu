// matmul_gelu_softmax / 2_split_wgmma -- the GEMM on Hopper tensor cores at fp32 accuracy (split precision, fp16 x 3 with
// Requires: sm_90a (wgmma and TMA in kernels/common/split_gemm.cuh)
// per-row power-of-two scaling and fp32 promotion: ../common/split_gemm.cuh), then bias + exact GELU + row softmax (epilogue.cuh, rung 1's kernel, in place over y).
//
// What changed from 1_cublas_fused_epilogue: the GEMM (97% of the time) leaves cuBLAS. cuBLAS has no fp32-accurate
//   tensor-core GEMM on Hopper; its fp32 SGEMM runs on SIMT FMA units (~51 TFLOP/s), its DGEMM on FP64 tensor cores
//   (~63 TFLOP/s, rung 1's default). Three fp16 tensor-core products of the split operands carry 22 significant bits
//   per operand, and promotion every 64 k keeps the truncating tensor-core accumulator out of the error.
// Calls per forward (ModelNew through harness.LinearGemm("split")): split_rows(x) [32 MiB in, 32 MiB out], the split
//   of W (cached per weight version, like matmul_sum_max_mean_lse's column sum), split_gemm (+ its fallback launch
//   that returns at once unless a row/column was flagged), then the epilogue.
// Ownership / launch / bytes / preconditions / numerics of the GEMM: see split_gemm.cuh. Preconditions (checked):
//   x, W 2-D float32 CUDA on one device (any strides); the split buffers float16 [R, K rounded up to 8]
//   contiguous; y contiguous float32 [M, N].
// Opt-in precision="tf32" (nprod = 1): x_hi W_hi only, TF32-like error, judged against PyTorch with TF32 on.
// Measured: H200, 1024x8192x8192, run.py 2026-11-22 (GPU time, L2 flushed): 0.622 ms (221 TFLOP/s useful, 83% of
//   HGEMM/3 = 266 TFLOP/s measured in the same run), relL2 9.8e-8 vs PyTorch fp32's 4.7e-7; eager 2.745, compile
//   2.742 (4.41x), DGEMM rung 2.269, Triton tf32x3 peer 1.893. tf32 mode: 0.336 ms vs eager-TF32 0.390, relL2 6.0e-5
//   vs PyTorch-TF32's 6.1e-5.
#include "epilogue.cuh"
#include "../common/split_gemm.cuh"

KP_EXPORT void split_rows(const at::TensorBase& src, const at::TensorBase& hi, const at::TensorBase& lo,
                          const at::TensorBase& inv_scale, const at::TensorBase& flag) {
  kp::sg::split_rows(src, hi, lo, inv_scale, flag);
}

KP_EXPORT void split_unscale(const at::TensorBase& inv_a, const at::TensorBase& flag_a,
                             const at::TensorBase& inv_b, const at::TensorBase& flag_b, const at::TensorBase& x,
                             const at::TensorBase& w, const at::TensorBase& y) {
  kp::sg::split_unscale(inv_a, flag_a, inv_b, flag_b, x, w, y);
}

KP_EXPORT void split_gemm(const at::TensorBase& a_hi, const at::TensorBase& a_lo, const at::TensorBase& inv_a,
                          const at::TensorBase& flag_a, const at::TensorBase& b_hi, const at::TensorBase& b_lo,
                          const at::TensorBase& inv_b, const at::TensorBase& flag_b, const at::TensorBase& x,
                          const at::TensorBase& w, const at::TensorBase& y, int64_t nprod) {
  kp::sg::split_gemm(a_hi, a_lo, inv_a, flag_a, b_hi, b_lo, inv_b, flag_b, x, w, y, nprod);
}

KP_EXPORT void bias_gelu_softmax(const at::TensorBase& y, const at::TensorBase& bias, const at::TensorBase& out) {
  ep::bias_gelu_softmax(y, bias, out);
}
