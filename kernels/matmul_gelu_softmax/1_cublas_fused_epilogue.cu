// matmul_gelu_softmax / 1_cublas_fused_epilogue -- the GEMM on cuBLAS (called from ModelNew through
// Requires: sm_80 (no Hopper-only feature: built for whatever GPU it runs on)
// harness.LinearGemm: DGEMM on float64 copies by default, or SGEMM with TF32 off), then bias + exact erf GELU + row
// softmax in one kernel.
//
// What it does: out = softmax(gelu(y + b), dim=1) where y = x @ W^T comes from cuBLAS, rounded to fp32. Eager runs
//   bias (inside addmm), GELU and softmax as separate kernels: y is read 4 times and written twice after the GEMM;
//   here it is read once and written once, in place (row_epilogue.cuh).
// Why the GEMM is cuBLAS DGEMM: the GEMM is 97% of the time. At 1024x8192x8192 the fp32 SGEMM (SIMT, ~51 TFLOP/s)
//   takes 2.66 ms; the float64 DGEMM runs on Hopper's FP64 tensor cores at ~63 TFLOP/s (2.19 ms) and, rounded once,
//   is ~60x more accurate (bench/matmul_sum_max_mean_lse/ab.py). A tensor-core split-precision GEMM is the next rung (2_split_wgmma).
// Ownership / launch: one 256-thread CTA per row; the row's GELU values live in shared memory (32 KiB at 8192 cols).
// Bytes (epilogue): 4*B*N read + 4*B*N written (64 MiB at 1024x8192: ~16 us at copy speed; eager's three
//   epilogue kernels ~45 us). Bound: the GEMM is compute-bound; this epilogue memory/SFU-bound.
// Preconditions (checked): y 2-D float32 CUDA, unit-stride rows, contiguous out (may be y); bias float32 (N) on the
//   same device, or empty for no bias.
// Numerics: GELU = 0.5 z (1 + erff(z / sqrt 2)) (the exact form; cuBLASLt's GELU epilogue is the tanh form, 2.5e-4
//   away); exact row max; one expf per element. relL2 vs float64 ~ PyTorch fp32's own (~5e-7, from the GEMM).
// Measured: H200, 1024x8192x8192, run.py 2026-11-22 (GPU time): DGEMM default 2.281 ms, relL2 7.5e-8; eager 2.748,
//   torch.compile 2.749 in the same run (0.830x eager; PyTorch fp32 relL2 4.7e-7). SGEMM row ([gemm=fp32]) 2.722 ms,
//   relL2 4.7e-7. An earlier warm profile: the old shared-memory epilogue took 42.7 us; the register path replaced it.
#include "epilogue.cuh"

KP_EXPORT void bias_gelu_softmax(const at::TensorBase& y, const at::TensorBase& bias, const at::TensorBase& out) {
  ep::bias_gelu_softmax(y, bias, out);
}
