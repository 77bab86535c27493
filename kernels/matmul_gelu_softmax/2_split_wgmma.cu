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
// Opt-in precision="tf32" (nprod = 1): x_hi W_hi only, TF32-like error, judged against PyTorch with TF32 on; the one
//   product runs as cuBLAS's fp16 GEMM with fp32 output (harness.LinearGemm), then split_unscale (unscale + the
//   NaN/Inf recompute); gemm="split_wgmma" keeps it on split_gemm.
// Measured: H200, 1024x8192x8192, run.py 2026-11-23 (GPU time, L2 flushed): 0.610 ms (225 TFLOP/s useful, 83.9% of
//   HGEMM/3 measured in the same run), eager 2.746, compile 2.738 (4.50x); split_gemm_kernel 0.557 of it, tensor
//   pipe busy 86% of its cycles (ncu). tf32 mode: 0.242 ms vs eager-TF32 0.387, compile 0.375, this rung with
//   split_gemm for the product 0.322, cuBLAS TF32's GEMM alone 0.328.
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

#if KP_EXPERIMENTS
// A/B hook: the GEMM with a forced configuration: cluster shape (cm m-blocks sharing W's tile x cn n-blocks sharing
// x's, TMA multicast) and db = two accumulator sets per consumer (1) or one (0).
KP_EXPORT void split_gemm_config(const at::TensorBase& a_hi, const at::TensorBase& a_lo, const at::TensorBase& inv_a,
                                 const at::TensorBase& flag_a, const at::TensorBase& b_hi, const at::TensorBase& b_lo,
                                 const at::TensorBase& inv_b, const at::TensorBase& flag_b, const at::TensorBase& x,
                                 const at::TensorBase& w, const at::TensorBase& y, int64_t nprod, int64_t cm,
                                 int64_t cn, int64_t db) {
  kp::sg::split_gemm(a_hi, a_lo, inv_a, flag_a, b_hi, b_lo, inv_b, flag_b, x, w, y, nprod, static_cast<int>(cm),
                     static_cast<int>(cn), static_cast<int>(db));
}
#endif

KP_EXPORT void bias_gelu_softmax(const at::TensorBase& y, const at::TensorBase& bias, const at::TensorBase& out) {
  ep::bias_gelu_softmax(y, bias, out);
}
