// softmax / 5_regrow -- short rows held in registers: one read, one write, no shared-memory staging, one expf per
// Requires: sm_80 (no Hopper-only feature: built for whatever GPU it runs on)
// element.
//
// What changed: the other rungs give a row at least one 512-thread CTA, which is launch- and barrier-bound when a
//   row is a few KiB (3_cluster moved 683 GB/s at 1024 columns, 2_online 3.2 TB/s, eager's register-resident warp
//   kernel 4.0 TB/s). Here W warps (1..8) own one row and keep it in registers: each lane loads V vectors, the row
//   max is a warp shuffle (+ one smem exchange across the W warps), then each element's e = exp(x - max) is computed
//   once, kept in its register, summed, and scaled by 1/sum on the way out.
// Ownership / launch: 256 threads = 8 warps = 8/W rows per CTA; lane l of warp w of a row owns vectors
//   j*32*W + w*32 + l (j < V): every load and store instruction of a warp touches 32 consecutive vectors.
//   grid = ceil(rows / (8/W)). V in {1,2,4} float4s per lane with W = 1 up to 512 columns; 513..1024 aligned
//   columns: one row per 128-thread CTA (W = 4, V = 2; the A/B below); then W = 1..8 with V = 8 up to 8192, then
//   V = 16, W = 8 up to 16384. A row that is not 16-byte aligned (or cols % 4 != 0) uses the same kernel over
//   floats (4x the V). Longer rows take a block-per-row fallback (2 reads), only for correctness: ModelNew sends
//   them to 4_persistent.
// Bytes: 4*R*N read + 4*R*N written, the floor. Bound: memory (one expf + a multiply per element).
// Preconditions (checked): 2-D float32 CUDA, unit-stride rows, y contiguous.
// Numerics: exact row max first (NaN-aware), then expf(x - max) once per element; the sum is a per-lane sum of V
//   values then a tree. NaN/+inf anywhere, or an all -inf row, gives a NaN row, as PyTorch. relL2 ~5e-8.
// Measured: H200 sweep at ~6.4 GB (GPU time, L2 read-flushed), 2026-11-22: 1024 cols 4,217 GB/s (98% of copy 4,287;
//   torch.compile 4,262), 4096 cols 4,175 (compile 3,435), 16384 cols 4,210 (compile 3,681).
//   A/B at 1572864x1024 (bench/softmax/sweep.py --regrow-ab, one run, ms): copy_ 3.024, compile 3.029; warp per
//   row V8: 256 thr 3.066, 128 thr 3.066, 512 thr 3.083, 256 thr + __ldcs/__stcs 3.072, 128 thr + hints 3.193;
//   more warps per row: V1 W8 256 thr 3.364, V2 W4 256 thr 3.111, V4 W2 256 thr 3.100, V2 W4 128 thr 3.029 (shipped).
#include "../common/kp.cuh"

namespace {

constexpr int THREADS = 256;

template <typename T>
struct Vec;
template <>
struct Vec<float> {
  static constexpr int N = 1;
  __device__ static float max(float v) { return v; }
  __device__ static bool nan(float v) { return v != v; }
  __device__ static float exp_sub(float& v, float m) { v = expf(v - m); return v; }
  __device__ static float scale(float v, float inv) { return v * inv; }
  __device__ static float neg_inf() { return -INFINITY; }
};
template <>
struct Vec<float4> {
  static constexpr int N = 4;
  __device__ static float max(float4 v) { return fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)); }
  __device__ static bool nan(float4 v) { return v.x != v.x || v.y != v.y || v.z != v.z || v.w != v.w; }
  __device__ static float exp_sub(float4& v, float m) {
    v.x = expf(v.x - m); v.y = expf(v.y - m); v.z = expf(v.z - m); v.w = expf(v.w - m);
    return (v.x + v.y) + (v.z + v.w);
  }
  __device__ static float4 scale(float4 v, float inv) { return make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv); }
  __device__ static float4 neg_inf() { return make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY); }
};

// Streaming forms for the A/B (HINT): loads that do not allocate in L1, stores marked evict-first (.cs).
template <typename T>
__device__ __forceinline__ T ld_hint(const T* p) { return __ldcs(p); }
template <typename T>
__device__ __forceinline__ void st_hint(T* p, T v) { __stcs(p, v); }

template <typename T, int V, int W, int TH = THREADS, bool HINT = false>
__global__ void __launch_bounds__(TH) softmax_regrow(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                                                     int64_t nvec, int64_t xs_vec) {
  constexpr int RPB = (TH / 32) / W;  // rows per block
  __shared__ float xch[RPB][W];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int sub = warp / W, w = warp % W;
  const int64_t row = (int64_t)blockIdx.x * RPB + sub;
  const bool live = row < rows;  // no early return: the whole block meets at __syncthreads below
  const T* xr = x + (live ? row : 0) * xs_vec;
  T* yr = y + (live ? row : 0) * nvec;

  T v[V];
  float m = -INFINITY;
  bool has_nan = false;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t i = (int64_t)j * 32 * W + w * 32 + lane;
    v[j] = (live && i < nvec) ? (HINT ? ld_hint(xr + i) : xr[i]) : Vec<T>::neg_inf();
    m = fmaxf(m, Vec<T>::max(v[j]));
    has_nan |= Vec<T>::nan(v[j]);
  }
  m = kp::warp_max(m);
  if (W > 1) {
    if (lane == 0) xch[sub][w] = m;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < W; ++k) m = fmaxf(m, xch[sub][k]);
    __syncthreads();
  }
  // fmaxf drops NaN; expf(NaN - m) below still puts NaN into the sum, so the row comes out NaN either way. An all
  // -inf row has m = -inf and expf(-inf - -inf) = NaN: NaN row, as PyTorch. Padding lanes (-inf) must add 0, not
  // NaN, in that case, so they are skipped explicitly.
  (void)has_nan;
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t i = (int64_t)j * 32 * W + w * 32 + lane;
    if (i < nvec) s += Vec<T>::exp_sub(v[j], m);
  }
  s = kp::warp_sum(s);
  if (W > 1) {
    if (lane == 0) xch[sub][w] = s;
    __syncthreads();
    s = 0.f;
#pragma unroll
    for (int k = 0; k < W; ++k) s += xch[sub][k];
  }
  const float inv = 1.f / s;
  if (!live) return;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t i = (int64_t)j * 32 * W + w * 32 + lane;
    if (i < nvec) {
      if (HINT) st_hint(yr + i, Vec<T>::scale(v[j], inv));
      else yr[i] = Vec<T>::scale(v[j], inv);
    }
  }
}

// Rows longer than the register path: one block per row, exact max pass then a sum pass then the output pass
// (three reads; correctness only, ModelNew routes such rows elsewhere).
__global__ void __launch_bounds__(512) softmax_long(const float* __restrict__ x, float* __restrict__ y, int64_t cols,
                                                    int64_t xs) {
  __shared__ float scratch[64];
  const float* xr = x + (int64_t)blockIdx.x * xs;
  float* yr = y + (int64_t)blockIdx.x * cols;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, xr[i]);
  m = kp::block_max(m, scratch);
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) s += expf(xr[i] - m);
  s = kp::block_sum(s, scratch);
  const float inv = 1.f / s;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = expf(xr[i] - m) * inv;
}

template <typename T, int V, int W, int TH = THREADS, bool HINT = false>
void launch(const at::TensorBase& x, const at::TensorBase& y, int64_t rows, int64_t nvec, int64_t xs_vec) {
  constexpr int RPB = (TH / 32) / W;
  const int64_t blocks = (rows + RPB - 1) / RPB;
  softmax_regrow<T, V, W, TH, HINT><<<(unsigned)blocks, TH, 0, kp::stream()>>>(
      reinterpret_cast<const T*>(x.data_ptr()), reinterpret_cast<T*>(y.data_ptr()), rows, nvec, xs_vec);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Smallest (V, W) whose V*32*W vectors cover the row; false when the row is longer than the register path takes.
template <typename T>
bool dispatch(const at::TensorBase& x, const at::TensorBase& y, int64_t rows, int64_t nvec, int64_t xs_vec) {
  constexpr int S = 4 / Vec<T>::N;  // floats are 4x as many vectors per lane for the same row length
  if (nvec <= 32 * 1 * S) { launch<T, 1 * S, 1>(x, y, rows, nvec, xs_vec); return true; }
  if (nvec <= 32 * 2 * S) { launch<T, 2 * S, 1>(x, y, rows, nvec, xs_vec); return true; }
  if (nvec <= 32 * 4 * S) { launch<T, 4 * S, 1>(x, y, rows, nvec, xs_vec); return true; }
  // 513..1024 aligned columns: a row per 4-warp CTA, 2 float4 per lane ran at copy speed (3.029 ms at 1572864x1024,
  // = torch.compile 3.029, copy_ 3.024), where a warp per row with 8 float4 per lane took 3.066 (A/B below).
  if (S == 1 && nvec <= 32 * 2 * 4) { launch<T, 2, 4, 128>(x, y, rows, nvec, xs_vec); return true; }
  if (nvec <= 32 * 8 * S) { launch<T, 8 * S, 1>(x, y, rows, nvec, xs_vec); return true; }
  if (nvec <= 32 * 8 * S * 2) { launch<T, 8 * S, 2>(x, y, rows, nvec, xs_vec); return true; }
  if (nvec <= 32 * 8 * S * 4) { launch<T, 8 * S, 4>(x, y, rows, nvec, xs_vec); return true; }
  if (nvec <= 32 * 8 * S * 8) { launch<T, 8 * S, 8>(x, y, rows, nvec, xs_vec); return true; }
  if (S == 1 && nvec <= 32 * 16 * 8) { launch<T, 16, 8>(x, y, rows, nvec, xs_vec); return true; }
  return false;
}

}  // namespace

KP_EXPORT void softmax_forward(const at::TensorBase& x, const at::TensorBase& y) {
  kp::check_row_softmax_args(x, y);
  const int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0 || cols == 0) return;
  c10::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(rows <= 2147483647LL, "too many rows for a 1-D grid: ", kp::num(rows));
  const bool vec = (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0) &&
                   (reinterpret_cast<uintptr_t>(y.data_ptr()) % 16 == 0) && x.stride(0) % 4 == 0 && cols % 4 == 0;
  const bool done = vec ? dispatch<float4>(x, y, rows, cols / 4, x.stride(0) / 4)
                        : dispatch<float>(x, y, rows, cols, x.stride(0));
  if (!done) {
    softmax_long<<<(unsigned)rows, 512, 0, kp::stream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), cols,
                                                           x.stride(0));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

#if KP_EXPERIMENTS  // A/B hooks for the bench scripts; not in the shipped build
// A/B hook (bench/softmax/sweep.py --regrow-ab): the one-warp-per-row float4 path (cols 128..1024, aligned) with
// cfg 0 = 256 threads (shipped), 1 = 128 threads, 2 = 128 threads + streaming hints, 3 = 256 threads + hints,
// 4 = 512 threads; 5..8 more warps per row, fewer float4 per lane (V, W, threads): 5 = (1, 8, 256) (Inductor's
// shape: a row per 8-warp CTA, one float4 per thread), 6 = (2, 4, 256), 7 = (4, 2, 256), 8 = (2, 4, 128).
KP_EXPORT void softmax_forward_ab(const at::TensorBase& x, const at::TensorBase& y, int64_t cfg) {
  kp::check_row_softmax_args(x, y);
  const int64_t rows = x.size(0), cols = x.size(1);
  TORCH_CHECK(cols % 4 == 0 && cols > 512 && cols <= 1024 && x.stride(0) % 4 == 0 &&
                  reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(y.data_ptr()) % 16 == 0,
              "softmax_forward_ab: aligned rows of 516..1024 columns only");
  TORCH_CHECK(rows <= 2147483647LL, "too many rows for a 1-D grid: ", kp::num(rows));
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t nvec = cols / 4, xs = x.stride(0) / 4;
  switch (cfg) {
    case 0: launch<float4, 8, 1, 256, false>(x, y, rows, nvec, xs); break;
    case 1: launch<float4, 8, 1, 128, false>(x, y, rows, nvec, xs); break;
    case 2: launch<float4, 8, 1, 128, true>(x, y, rows, nvec, xs); break;
    case 3: launch<float4, 8, 1, 256, true>(x, y, rows, nvec, xs); break;
    case 4: launch<float4, 8, 1, 512, false>(x, y, rows, nvec, xs); break;
    case 5: launch<float4, 1, 8, 256, false>(x, y, rows, nvec, xs); break;
    case 6: launch<float4, 2, 4, 256, false>(x, y, rows, nvec, xs); break;
    case 7: launch<float4, 4, 2, 256, false>(x, y, rows, nvec, xs); break;
    case 8: launch<float4, 2, 4, 128, false>(x, y, rows, nvec, xs); break;
    default: TORCH_CHECK(false, "softmax_forward_ab: cfg 0..8, got ", kp::num(cfg));
  }
}
#endif  // KP_EXPERIMENTS
