// probes/bw -- what the H200's memory system gives a kernel: read-only and copy streams, by load style and by the
// Requires: sm_90a (TMA bulk copies, mbarriers and thread-block clusters)
// number of SMs used. Not a problem variant: tools/bw_probe.py builds it with harness.build_path and times each
// export next to torch's own copy, so the ceilings the kernel headers quote are measured, not assumed.
//
// Kernels (persistent unless noted: one CTA per SM forced by a large dynamic shared-memory request, grid = nsm CTAs):
//   read_ld<U>:  each thread keeps U float4 loads (ld.global.nc.L1::no_allocate) in flight, chunk-interleaved over
//                the grid; sums into a double so nothing is dead code.
//   read_tma:    thread 0 streams CHUNK-byte cp.async.bulk loads through an S-stage shared-memory ring; the CTA
//                sums every element out of shared memory.
//   copy_ld<U>:  U float4 loads then U float4 stores per thread per step.
//   copy_tma:    bulk load into the ring, bulk store (cp.async.bulk.global.shared) out of it.
//   copy_ticket<U, STORE>: copy_ld's loop with chunks taken from an atomic ticket (STORE = false: read only).
//   copy_rowsync: short-lived CTAs (ticket order) whose stores wait for a group of peers (softmax rows split
//                over CTAs), see below. Measured 2026-11-22: 3,454-3,557 GB/s with the wait, 3,959-3,994 without.
//   read_cols:   the column-tile pattern of lse's colsum (each CTA reads TC floats of every row of a row-major
//                matrix): what narrow row segments cost in DRAM locality.
// Preconditions: float32, contiguous, 16-byte aligned, n a multiple of 4 (checked). Numerics: not a result.
// Measured: see tools/bw_probe.py output (README "Ceilings").
#include "../../kernels/common/kp.cuh"

namespace {

constexpr int T = 512;

__device__ __forceinline__ float4 ldg_stream(const float4* p) {
  float4 q;
  asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(q.x), "=f"(q.y), "=f"(q.z), "=f"(q.w) : "l"(p));
  return q;
}

template <int U>
__global__ void __launch_bounds__(T, U >= 16 ? 1 : U >= 8 ? 2 : 4) read_ld(const float4* __restrict__ x, int64_t n4, double* out) {
  double acc = 0.;
  const int64_t step = (int64_t)gridDim.x * T * U;
  for (int64_t base = (int64_t)blockIdx.x * T * U; base < n4; base += step) {
    float4 q[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * T + threadIdx.x;
      q[u] = i < n4 ? ldg_stream(x + i) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc += (q[u].x + q[u].y) + (q[u].z + q[u].w);
  }
  if (acc == 12345.678) *out = acc;  // never true for the probe's data; keeps the loads alive
}

template <int U>
__global__ void __launch_bounds__(T, U >= 16 ? 1 : U >= 8 ? 2 : 4) copy_ld(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
  const int64_t step = (int64_t)gridDim.x * T * U;
  for (int64_t base = (int64_t)blockIdx.x * T * U; base < n4; base += step) {
    float4 q[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * T + threadIdx.x;
      if (i < n4) q[u] = ldg_stream(x + i);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * T + threadIdx.x;
      if (i < n4) y[i] = q[u];
    }
  }
}

// S-stage ring of CH-byte chunks; chunk k of the whole buffer goes to CTA k % grid. With STORE the chunk is written
// back out by a bulk store from shared memory (a copy), else summed (a read).
template <bool STORE>
__global__ void __launch_bounds__(128, 1) ring_tma(const float* __restrict__ x, float* __restrict__ y, int64_t n,
                                                   int S, int CH, double* out) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t full[16];
  const int64_t nch = (n * 4 + CH - 1) / CH;
  const int64_t G = gridDim.x;
  auto bytes_of = [&](int64_t k) { return (uint32_t)kp::imin((int64_t)CH, n * 4 - k * CH); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(kp::smem_u32(&full[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int64_t j) {  // j-th chunk of this CTA into slot j % S
    const int64_t k = blockIdx.x + j * G;
    if (k >= nch) return;
    const int s = (int)(j % S);
    const uint32_t b = bytes_of(k);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(kp::smem_u32(&full[s])), "r"(b) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     kp::smem_u32(ring + (size_t)s * CH)), "l"(reinterpret_cast<const char*>(x) + k * CH), "r"(b),
                 "r"(kp::smem_u32(&full[s])) : "memory");
  };
  if (threadIdx.x == 0)
    for (int j = 0; j < S; ++j) issue(j);
  double acc = 0.;
  for (int64_t j = 0;; ++j) {
    const int64_t k = blockIdx.x + j * G;
    if (k >= nch) break;
    const int s = (int)(j % S);
    kp::mbar_wait(&full[s], (uint32_t)((j / S) & 1));
    const uint32_t b = bytes_of(k);
    if (STORE) {
      if (threadIdx.x == 0) {
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(reinterpret_cast<char*>(y) + k * CH),
                     "r"(kp::smem_u32(ring + (size_t)s * CH)), "r"(b) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        // the slot is reused S chunks later: keep at most S-1 stores reading shared memory
        asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(0) : "memory");
        issue(j + S);
      }
    } else {
      const float4* q = reinterpret_cast<const float4*>(ring + (size_t)s * CH);
      for (uint32_t i = threadIdx.x; i < b / 16; i += 128) { const float4 v = q[i]; acc += (v.x + v.y) + (v.z + v.w); }
      __syncthreads();
      if (threadIdx.x == 0) issue(j + S);
    }
  }
  if (STORE && threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  if (acc == 12345.678) *out = acc;
}

// Column tiles: CTA t owns columns [t*TC, (t+1)*TC) of a rows x cols matrix and reads them over all rows.
template <int TC, int U>
__global__ void __launch_bounds__(T, 1) read_cols(const float* __restrict__ w, int64_t rows, int64_t cols, double* out) {
  constexpr int CG = TC / 4, RG = T / CG;
  const int cg = threadIdx.x % CG, rg = threadIdx.x / CG;
  double acc = 0.;
  for (int64_t tile = blockIdx.x; tile * TC < cols; tile += gridDim.x) {
    const int64_t c = tile * TC + 4 * cg;
    for (int64_t r0 = rg; r0 < rows; r0 += (int64_t)RG * U) {
      float4 q[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t r = r0 + (int64_t)u * RG;
        q[u] = r < rows ? ldg_stream(reinterpret_cast<const float4*>(w + r * cols + c)) : make_float4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) acc += (q[u].x + q[u].y) + (q[u].z + q[u].w);
    }
  }
  if (acc == 12345.678) *out = acc;
}

// Column tiles split by rows too: CTA k reads tile k % ntiles over row part k / ntiles (of gridDim / ntiles), so
// the CTAs running at one time cover whole rows: the segment width (4*TC bytes) is the only variable.
template <int TC>
__global__ void __launch_bounds__(T, 1) read_tiles(const float* __restrict__ w, int64_t rows, int64_t cols, double* out) {
  constexpr int CG = TC / 4 < T ? TC / 4 : T, RG = T / CG;
  const int64_t ntiles = cols / TC, parts = gridDim.x / ntiles;
  const int64_t tile = blockIdx.x % ntiles, part = blockIdx.x / ntiles;
  if (part >= parts) return;
  const int64_t r0 = part * rows / parts, r1 = (part + 1) * rows / parts;
  const int cg = threadIdx.x % CG, rg = threadIdx.x / CG;
  double acc = 0.;
  for (int64_t c = tile * TC + 4 * cg; c < (tile + 1) * TC; c += 4 * CG)
    for (int64_t r = r0 + rg; r < r1; r += (int64_t)RG * 8) {
      float4 q[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int64_t rr = r + (int64_t)u * RG;
        q[u] = rr < r1 ? ldg_stream(reinterpret_cast<const float4*>(w + rr * cols + c)) : make_float4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) acc += (q[u].x + q[u].y) + (q[u].z + q[u].w);
    }
  if (acc == 12345.678) *out = acc;
}

// torch's vectorised elementwise shape: 128 threads, each 4 float4 loads then 4 stores, one chunk per CTA.
__global__ void __launch_bounds__(128) copy_torchlike(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
  const int64_t base = (int64_t)blockIdx.x * 512 + threadIdx.x;
  float4 q[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) if (base + 128 * u < n4) q[u] = x[base + 128 * u];
#pragma unroll
  for (int u = 0; u < 4; ++u) if (base + 128 * u < n4) y[base + 128 * u] = q[u];
}

// Row-synchronised chunk copy: the memory behaviour of a softmax whose long rows are split over short-lived CTAs.
// CTA k takes ticket k (atomic, so tickets follow dispatch order), loads chunk k (TT threads x U float4, kept in
// registers), reduces a CTA max (the dependency a real softmax has before it can publish), publishes to its group's
// counter (cpr chunks per group = one "row"), waits until all cpr chunks of the group have published, then stores.
// cpr = 1 is the same kernel without the cross-CTA wait.
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

template <int TT, int U>
__global__ void __launch_bounds__(TT) copy_rowsync(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4,
                                                   int64_t nblk, int cpr, unsigned* __restrict__ cnt) {
  __shared__ unsigned s_t;
  __shared__ float s_m[TT / 32];
  if (threadIdx.x == 0) s_t = atomicAdd(cnt, 1u);  // cnt[0]: ticket; cnt[1 + g]: group g's arrivals
  __syncthreads();
  const int64_t t = s_t;
  const int64_t base = t * (TT * U) + threadIdx.x;
  float4 q[U];
  float m = -INFINITY;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t i = base + (int64_t)u * TT;
    q[u] = i < n4 ? ldg_stream(x + i) : make_float4(0, 0, 0, 0);
    m = fmaxf(m, fmaxf(fmaxf(q[u].x, q[u].y), fmaxf(q[u].z, q[u].w)));
  }
  m = kp::warp_max(m);
  if (threadIdx.x % 32 == 0) s_m[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float mm = s_m[0];
    for (int w = 1; w < TT / 32; ++w) mm = fmaxf(mm, s_m[w]);
    unsigned* c = cnt + 1 + t / cpr;
    const unsigned want = (unsigned)kp::imin(cpr, nblk - t / cpr * cpr);  // the last group may be short
    __threadfence();
    atomicAdd(c, 1u);
    unsigned ns = 32;
    while (ld_acquire(c) < want) { __nanosleep(ns); ns = ns < 256 ? 2 * ns : ns; }
    s_m[0] = mm > 1e30f ? 2.f : 1.f;  // a scale that depends on the wait, as softmax's would
  }
  __syncthreads();
  const float sc = s_m[0];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t i = base + (int64_t)u * TT;
    if (i < n4) y[i] = make_float4(q[u].x * sc, q[u].y * sc, q[u].z * sc, q[u].w * sc);
  }
}

// Persistent copy with dynamic chunk order: each CTA takes its next chunk (T threads x U float4) from an atomic
// ticket, fetched one chunk ahead, instead of the static grid stride of copy_ld. Asks whether the ~91% cap of
// persistent copies comes from CTAs drifting apart under a static assignment (a wider DRAM frontier).
// STORE = false: the same ticketed order as a read-only probe (sums the chunk; y is a double* sink), asking what a
// single persistent kernel reading lse's 288 MiB takes when its CTAs cannot drift apart.
template <int U, bool STORE = true>
__global__ void __launch_bounds__(T, 1) copy_ticket(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4,
                                                    unsigned* __restrict__ cnt) {
  __shared__ unsigned s_t[2];
  double acc = 0.;
  const int64_t nchunk = (n4 + (int64_t)T * U - 1) / ((int64_t)T * U);
  if (threadIdx.x == 0) s_t[0] = atomicAdd(cnt, 1u);
  __syncthreads();
  for (int p = 0;; p ^= 1) {
    const int64_t c = s_t[p];
    if (c >= nchunk) break;
    if (threadIdx.x == 0) s_t[p ^ 1] = atomicAdd(cnt, 1u);
    const int64_t base = c * T * U + threadIdx.x;
    float4 q[U];
#pragma unroll
    for (int u = 0; u < U; ++u) if (base + u * T < n4) q[u] = ldg_stream(x + base + u * T);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * T < n4) {
        if (STORE) y[base + u * T] = q[u];
        else acc += (q[u].x + q[u].y) + (q[u].z + q[u].w);
      }
    __syncthreads();  // s_t[p ^ 1] is written; nobody reads s_t[p] again before it is rewritten
  }
  if (!STORE && acc == 12345.678) *reinterpret_cast<double*>(y) = acc;  // never true; keeps the loads alive
}

constexpr int BIG_SMEM = 120 * 1024;  // > half an SM's shared memory: one CTA per SM

template <typename K>
void set_big(K k, int extra) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, BIG_SMEM + extra));
}

void check(const at::TensorBase& t) {
  kp::check_f32_cuda(t, "probe tensor");
  TORCH_CHECK(t.is_contiguous() && t.numel() % 4 == 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0,
              "probe tensors must be contiguous, 16-byte aligned, numel % 4 == 0");
}

}  // namespace

// u: float4 loads in flight per thread (4, 8, 16; copy also 1).
// grid: CTAs; big: request > half an SM's shared memory so each CTA has an SM to itself (else up to 4 share one).
KP_EXPORT void probe_read(const at::TensorBase& x, const at::TensorBase& out, int64_t grid, int64_t u, bool big) {
  check(x);
  const c10::cuda::CUDAGuard g(x.device());
  const auto* p = reinterpret_cast<const float4*>(x.data_ptr<float>());
  double* o = out.data_ptr<double>();
  const int64_t n4 = x.numel() / 4;
  switch (u) {
    case 4: set_big(read_ld<4>, 0); read_ld<4><<<grid, T, big ? BIG_SMEM : 0, kp::stream()>>>(p, n4, o); break;
    case 8: set_big(read_ld<8>, 0); read_ld<8><<<grid, T, big ? BIG_SMEM : 0, kp::stream()>>>(p, n4, o); break;
    case 16: set_big(read_ld<16>, 0); read_ld<16><<<grid, T, big ? BIG_SMEM : 0, kp::stream()>>>(p, n4, o); break;
    default: TORCH_CHECK(false, "u must be 4, 8 or 16");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

KP_EXPORT void probe_copy(const at::TensorBase& x, const at::TensorBase& y, int64_t grid, int64_t u, bool big) {
  check(x); check(y);
  TORCH_CHECK(x.numel() == y.numel(), "probe_copy: sizes differ");
  const c10::cuda::CUDAGuard g(x.device());
  const auto* p = reinterpret_cast<const float4*>(x.data_ptr<float>());
  auto* q = reinterpret_cast<float4*>(y.data_ptr<float>());
  const int64_t n4 = x.numel() / 4;
  switch (u) {
    case 1: copy_ld<1><<<grid, T, 0, kp::stream()>>>(p, q, n4); break;
    case 4: set_big(copy_ld<4>, 0); copy_ld<4><<<grid, T, big ? BIG_SMEM : 0, kp::stream()>>>(p, q, n4); break;
    case 8: set_big(copy_ld<8>, 0); copy_ld<8><<<grid, T, big ? BIG_SMEM : 0, kp::stream()>>>(p, q, n4); break;
    case 16: set_big(copy_ld<16>, 0); copy_ld<16><<<grid, T, big ? BIG_SMEM : 0, kp::stream()>>>(p, q, n4); break;
    default: TORCH_CHECK(false, "u must be 1, 4, 8 or 16");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// TMA ring: stages x chunk bytes must fit in shared memory (<= 220 KiB).
KP_EXPORT void probe_tma(const at::TensorBase& x, const at::TensorBase& y, const at::TensorBase& out, int64_t nsm,
                         int64_t stages, int64_t chunk, bool store, bool big) {
  check(x);
  TORCH_CHECK(stages >= 1 && stages <= 16 && chunk % 16 == 0 && chunk > 0 && stages * chunk <= 220 * 1024,
              "probe_tma: 1..16 stages of a 16-byte multiple, <= 220 KiB in all");
  if (store) { check(y); TORCH_CHECK(y.numel() == x.numel(), "probe_tma: sizes differ"); }
  const c10::cuda::CUDAGuard g(x.device());
  const int smem = (int)std::max<int64_t>(stages * chunk, big ? BIG_SMEM : 0);
  auto k = store ? ring_tma<true> : ring_tma<false>;
  C10_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  k<<<nsm, 128, smem, kp::stream()>>>(x.data_ptr<float>(), store ? y.data_ptr<float>() : nullptr, x.numel(),
                                      (int)stages, (int)chunk, out.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// x viewed as rows x cols (cols % 4 == 0); tc = 64, 256 or 1024 columns per CTA; U = 8 loads in flight.
KP_EXPORT void probe_cols(const at::TensorBase& x, const at::TensorBase& out, int64_t cols, int64_t tc, int64_t nsm) {
  check(x);
  TORCH_CHECK(cols % 1024 == 0 && x.numel() % cols == 0, "probe_cols: cols must divide numel and be % 1024");
  const c10::cuda::CUDAGuard g(x.device());
  const int64_t rows = x.numel() / cols;
  double* o = out.data_ptr<double>();
  switch (tc) {
    case 64: set_big(read_cols<64, 8>, 0); read_cols<64, 8><<<nsm, T, BIG_SMEM, kp::stream()>>>(x.data_ptr<float>(), rows, cols, o); break;
    case 256: set_big(read_cols<256, 8>, 0); read_cols<256, 8><<<nsm, T, BIG_SMEM, kp::stream()>>>(x.data_ptr<float>(), rows, cols, o); break;
    case 1024: set_big(read_cols<1024, 8>, 0); read_cols<1024, 8><<<nsm, T, BIG_SMEM, kp::stream()>>>(x.data_ptr<float>(), rows, cols, o); break;
    default: TORCH_CHECK(false, "tc must be 64, 256 or 1024");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// tc = 64 .. 2048 columns per tile; grid CTAs (a multiple of cols / tc).
KP_EXPORT void probe_tiles(const at::TensorBase& x, const at::TensorBase& out, int64_t cols, int64_t tc, int64_t grid) {
  check(x);
  TORCH_CHECK(cols % tc == 0 && x.numel() % cols == 0 && grid >= cols / tc, "probe_tiles: bad shape");
  const c10::cuda::CUDAGuard g(x.device());
  const int64_t rows = x.numel() / cols;
  double* o = out.data_ptr<double>();
  const float* p = x.data_ptr<float>();
  switch (tc) {
    case 64: read_tiles<64><<<grid, T, 0, kp::stream()>>>(p, rows, cols, o); break;
    case 128: read_tiles<128><<<grid, T, 0, kp::stream()>>>(p, rows, cols, o); break;
    case 256: read_tiles<256><<<grid, T, 0, kp::stream()>>>(p, rows, cols, o); break;
    case 512: read_tiles<512><<<grid, T, 0, kp::stream()>>>(p, rows, cols, o); break;
    case 1024: read_tiles<1024><<<grid, T, 0, kp::stream()>>>(p, rows, cols, o); break;
    case 2048: read_tiles<2048><<<grid, T, 0, kp::stream()>>>(p, rows, cols, o); break;
    default: TORCH_CHECK(false, "tc must be 64 .. 2048, a power of two");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

KP_EXPORT void probe_copy_torchlike(const at::TensorBase& x, const at::TensorBase& y) {
  check(x); check(y);
  TORCH_CHECK(x.numel() == y.numel(), "probe_copy_torchlike: sizes differ");
  const c10::cuda::CUDAGuard g(x.device());
  const int64_t n4 = x.numel() / 4;
  copy_torchlike<<<(unsigned)((n4 + 511) / 512), 128, 0, kp::stream()>>>(
      reinterpret_cast<const float4*>(x.data_ptr<float>()), reinterpret_cast<float4*>(y.data_ptr<float>()), n4);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Row-synchronised chunk copy (copy_rowsync): threads x u float4 per CTA, cpr chunks per group; cnt: int32 scratch
// of >= 2 + numel / (4 * threads * u * cpr) entries, zeroed here on the stream.
KP_EXPORT void probe_copy_rowsync(const at::TensorBase& x, const at::TensorBase& y, const at::TensorBase& cnt,
                                  int64_t threads, int64_t u, int64_t cpr) {
  check(x); check(y);
  TORCH_CHECK(x.numel() == y.numel(), "probe_copy_rowsync: sizes differ");
  TORCH_CHECK(cnt.is_cuda() && cnt.scalar_type() == at::kInt && cnt.is_contiguous(), "cnt: int32 CUDA contiguous");
  TORCH_CHECK(cpr >= 1, "cpr >= 1");
  const c10::cuda::CUDAGuard g(x.device());
  const int64_t n4 = x.numel() / 4, per = threads * u, nblk = (n4 + per - 1) / per;
  TORCH_CHECK(cnt.numel() >= 2 + nblk / cpr, "cnt too small");
  C10_CUDA_CHECK(cudaMemsetAsync(cnt.data_ptr(), 0, cnt.numel() * 4, kp::stream()));
  const auto* p = reinterpret_cast<const float4*>(x.data_ptr<float>());
  auto* q = reinterpret_cast<float4*>(y.data_ptr<float>());
  auto* c = reinterpret_cast<unsigned*>(cnt.data_ptr());
  const unsigned gr = (unsigned)nblk;
  if (threads == 256 && u == 8) copy_rowsync<256, 8><<<gr, 256, 0, kp::stream()>>>(p, q, n4, nblk, (int)cpr, c);
  else if (threads == 256 && u == 16) copy_rowsync<256, 16><<<gr, 256, 0, kp::stream()>>>(p, q, n4, nblk, (int)cpr, c);
  else if (threads == 512 && u == 8) copy_rowsync<512, 8><<<gr, 512, 0, kp::stream()>>>(p, q, n4, nblk, (int)cpr, c);
  else if (threads == 128 && u == 16) copy_rowsync<128, 16><<<gr, 128, 0, kp::stream()>>>(p, q, n4, nblk, (int)cpr, c);
  else TORCH_CHECK(false, "threads x u: 256x8, 256x16, 512x8 or 128x16");
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// copy_ticket<U, STORE> for u in Us (else an error naming `us`): cnt (int32, >= 1 entry) is zeroed on the stream
// first, grid CTAs, one per SM (big shared-memory request). The copy and the read probe differ only in y and STORE.
template <bool STORE, int... Us>
void launch_ticket(const at::TensorBase& x, float4* y, const at::TensorBase& cnt, int64_t grid, int64_t u,
                   const char* us) {
  TORCH_CHECK(cnt.is_cuda() && cnt.scalar_type() == at::kInt && cnt.numel() >= 1, "cnt: int32 CUDA, >= 1 entry");
  const c10::cuda::CUDAGuard g(x.device());
  C10_CUDA_CHECK(cudaMemsetAsync(cnt.data_ptr(), 0, 4, kp::stream()));
  const int64_t n4 = x.numel() / 4;
  const auto* p = reinterpret_cast<const float4*>(x.data_ptr<float>());
  auto* c = reinterpret_cast<unsigned*>(cnt.data_ptr());
  const bool known = ((u == Us && (set_big(copy_ticket<Us, STORE>, 0),
                                   copy_ticket<Us, STORE><<<grid, T, BIG_SMEM, kp::stream()>>>(p, y, n4, c), true)) ||
                      ...);
  TORCH_CHECK(known, "u must be ", us);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Persistent ticketed copy (copy_ticket).
KP_EXPORT void probe_copy_ticket(const at::TensorBase& x, const at::TensorBase& y, const at::TensorBase& cnt,
                                 int64_t grid, int64_t u) {
  check(x); check(y);
  TORCH_CHECK(x.numel() == y.numel(), "probe_copy_ticket: sizes differ");
  launch_ticket<true, 4, 8>(x, reinterpret_cast<float4*>(y.data_ptr<float>()), cnt, grid, u, "4 or 8");
}

// Persistent ticketed read (copy_ticket<U, false>); out: a float64 sink.
KP_EXPORT void probe_read_ticket(const at::TensorBase& x, const at::TensorBase& out, const at::TensorBase& cnt,
                                 int64_t grid, int64_t u) {
  check(x);
  TORCH_CHECK(out.is_cuda() && out.scalar_type() == at::kDouble, "out: float64 CUDA");
  launch_ticket<false, 8, 16>(x, reinterpret_cast<float4*>(out.data_ptr<double>()), cnt, grid, u, "8 or 16");
}
