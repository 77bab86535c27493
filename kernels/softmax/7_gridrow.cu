// softmax / 7_gridrow -- 6_regcluster's register-resident row slices on every SM: the slices of a row meet through
// L2 instead of a hardware cluster.
//
// What changed from 6_regcluster: an 8-CTA cluster is scheduled inside one GPC, and the H200's GPCs leave 12 of the
//   132 SMs outside any 8-CTA cluster (cudaOccupancyMaxActiveClusters = 15). The persistent-copy probe moves 4,086
//   GB/s on 132 SMs and 4,011 on 120 (scripts/bw_probe.py, ticketed), so those 12 SMs are worth ~2% of bandwidth.
//   Here there is no cluster: a cooperative launch makes the G = 132 CTAs co-resident, and a row's S slices
//   (S = 9 at 393216 columns) are held by S CTAs of different *classes*. The slice owners publish their (m, s)
//   partial to a per-row record in global memory and count themselves in with one atomic; each waits (one thread
//   polling an L2 counter) until all S have arrived, then merges the S partials in slice order, so every owner of
//   a row computes the same scale bit for bit.
// Ownership / launch: grid = G co-resident CTAs of 512 threads, 1 per SM (128 registers x 512 threads). CTA b is in
//   class j = b % S; class j has n_j = G/S (+1 for j < G % S) CTAs and owns columns [off_j, off_{j+1}) of every
//   row, a slice of ~cols * n_j / G columns (multiple of 4), so every class moves its share at the same per-CTA
//   rate. S is the smallest count whose largest slice fits a CTA's registers (49152 floats: 24 float4 x 512
//   threads): 8 slices would need 17-CTA classes with 50,642-column slices, so 393216 columns take 9 (44,684 and
//   41,705). Thread t owns float4s t + 512k (k < 24) of its slice, as in 6_regcluster.
//   Row order: within a class, rows come in increasing order: CTA i of the class takes rows i and i + n_j, then
//   tickets from the class's atomic counter, drawn two rows ahead (the next row's TMA is issued while the current
//   one is computed). Why this cannot deadlock: a CTA waits only on the row it holds as current; let r be the
//   lowest row not yet published by all classes; every class hands rows out in order, so each class's owner of r
//   holds it as current or next behind a row below r that is complete, and reaches r's publish point. That needs
//   every CTA resident at once: the cooperative launch guarantees it (or fails with an error, never a hang).
// Bytes: 4*R*N read + 4*R*N written, the floor, plus 12 bytes per row and slice of L2 records. Bound: memory.
// Preconditions (checked): 2-D float32 CUDA; unit-stride rows; y contiguous; a slice plan exists (cols <= 32 x
//   49152 here; ModelNew routes longer rows elsewhere). TMA prefetch needs 16-byte aligned rows (x, y base, row
//   stride, cols % 4); other layouts load straight into registers (same math, no prefetch).
// Numerics: as 6_regcluster: e = expf(x - m_cta) once per element, one scale per CTA (expf(m_cta - M) / S) from the
//   partials merged in slice order with the -inf-safe online merge; NaN or +inf anywhere, or an all -inf row, gives
//   a NaN row, as PyTorch.
// Measured: (pending the H200 run).
#include <c10/cuda/CUDACachingAllocator.h>

#include "../common/kp.cuh"

namespace {

constexpr int THREADS = 512;
constexpr int V = 24;                                  // float4s per thread
constexpr int64_t SLICE = (int64_t)THREADS * V * 4;   // floats per CTA: 49152 (192 KiB)
constexpr int NCHUNK = 4;                              // prefetch ring: 4 chunks of 6 float4s per thread
constexpr int KPC = V / NCHUNK;
constexpr int MAX_S = 32;                              // slices per row: one lane of warp 0 each in the merge
static_assert(V % NCHUNK == 0, "chunks must split the per-thread registers evenly");

__device__ __forceinline__ void prefetch(float* buf, uint64_t* bar, const float* xr, int n, int c) {
  const int n4 = n >> 2;
  const int b = min(n4, c * KPC * THREADS), e = min(n4, (c + 1) * KPC * THREADS);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic reads of buf before async writes
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(kp::smem_u32(bar)), "r"((uint32_t)((e - b) * 16))
               : "memory");
  if (e > b)
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     kp::smem_u32(buf + 4 * b)),
                 "l"(xr + 4 * b), "r"((uint32_t)((e - b) * 16)), "r"(kp::smem_u32(bar))
                 : "memory");
}

__device__ __forceinline__ float& comp(float4& v, int c) { return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w; }

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ float4 ld_relaxed(const float4* p) {
  float4 v;
  asm volatile("ld.relaxed.gpu.global.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// ticket (the row counter), arrived[rows] (slices published per row), rec[rows * S] (the partials, and the
// leader's drawn row): the counters are zeroed on the stream before the launch; a record is written before it is
// counted, so rec is never zeroed.
template <bool TMA>
__global__ void __launch_bounds__(THREADS, 1)
    softmax_gridrow(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t cols, int64_t xs,
                    int S, unsigned* __restrict__ ticket, unsigned* __restrict__ arrived, float4* __restrict__ rec) {
  extern __shared__ __align__(128) float buf[];
  __shared__ int next2[2];  // the group's row two iterations ahead (from the leader's record)
  __shared__ float fsh;     // this row's scale, from warp 0's merge
  __shared__ float scratch[64];
  __shared__ __align__(8) uint64_t bars[NCHUNK];

  const int K = (int)gridDim.x / S;         // groups
  const int j = (int)blockIdx.x % S;        // slice; j == 0 is the group's leader
  const int first = (int)blockIdx.x / S;    // group
  const int nrows = (int)rows;  // < 2^31 - 2G (host check): 32-bit row indices keep the registers for the row
  const int c0 = (int)(cols * j / S / 4 * 4);
  const int n = (j + 1 == S ? (int)cols : (int)(cols * (j + 1) / S / 4 * 4)) - c0;  // <= SLICE (host plan)
  const int t = threadIdx.x;

  if (TMA) {
    if (t == 0) {
      for (int c = 0; c < NCHUNK; ++c) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(kp::smem_u32(&bars[c])));
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      if (first < nrows)
        for (int c = 0; c < NCHUNK; ++c) prefetch(buf, &bars[c], x + first * xs + c0, n, c);
    }
    __syncthreads();
  }

  float4 r[V];
  uint32_t it = 0;
  int nrow = first + K;
  for (int row = first; row < nrows; ++it) {
    int drawn = 0;
    if (t == 0 && j == 0) drawn = 2 * K + (int)atomicAdd(ticket, 1u);  // latency hidden under the row
    const float* xr = x + (int64_t)row * xs + c0;
    float* yr = y + (int64_t)row * cols + c0;
    // 1. This row's slice into registers (-inf where the slice ends); the next row's chunk c is queued as soon as
    //    chunk c of this one is out of shared memory.
    if (TMA) {
      const float4* b4 = reinterpret_cast<const float4*>(buf);
#pragma unroll
      for (int c = 0; c < NCHUNK; ++c) {
        kp::mbar_wait(&bars[c], it & 1);
#pragma unroll
        for (int kk = 0; kk < KPC; ++kk) {
          const int k = c * KPC + kk, i = t + k * THREADS;
          r[k] = 4 * i < n ? b4[i] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        }
        __syncthreads();
        if (t == 0 && nrow < nrows) prefetch(buf, &bars[c], x + nrow * xs + c0, n, c);
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int i = t + (4 * k + c) * THREADS;
          comp(r[k], c) = i < n ? xr[i] : -INFINITY;
        }
    }
    // 2. CTA-local max, then e = exp(x - m) once per element, kept in registers.
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < V; ++k) m = fmaxf(m, fmaxf(fmaxf(r[k].x, r[k].y), fmaxf(r[k].z, r[k].w)));
    m = kp::block_max(m, scratch);
    const float ms = m == -INFINITY ? 0.f : m;  // an all -inf slice: e = 0 (and NaN stays NaN)
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      r[k].x = expf(r[k].x - ms); r[k].y = expf(r[k].y - ms);
      r[k].z = expf(r[k].z - ms); r[k].w = expf(r[k].w - ms);
      s += (r[k].x + r[k].y) + (r[k].z + r[k].w);
    }
    s = kp::block_sum(s, scratch);
    // 3. Publish (m, s) (the leader adds the row it drew), wait for the group's other S - 1 slices (thread 0
    //    polls), then warp 0 merges the S records in a fixed order (a lane per record, then a shuffle tree), so
    //    every CTA of the group gets the same scale. The rest of the CTA waits at the barrier while the next
    //    row's bulk loads are in flight.
    if (t < 32) {
      if (t == 0 && S > 1) {
        rec[(int64_t)row * S + j] = make_float4(m, s, __int_as_float(drawn), 0.f);
        __threadfence();  // the record before the count (release)
        atomicAdd(arrived + row, 1u);
        while (ld_acquire(arrived + row) < (unsigned)S) __nanosleep(32);
      }
      __syncwarp();  // lane 0's acquire orders the other lanes' record loads after every peer's release
      float M = m, Ssum = s;
      if (S > 1) {  // M = max of the S maxima, Ssum = sum of s_q * exp(m_q - M): lane q holds record q (S <= 32)
        const float4 p = t < S ? ld_relaxed(rec + (int64_t)row * S + t) : make_float4(-INFINITY, 0.f, 0.f, 0.f);
        M = kp::warp_max(p.x);
        // A slice whose max is -inf adds 0, or NaN if it held a NaN (s = NaN): 0 * s keeps that.
        Ssum = kp::warp_sum(p.y * (p.x == -INFINITY ? 0.f : expf(p.x - M)));
        drawn = __float_as_int(__shfl_sync(0xffffffffu, p.z, 0));
      }
      if (t == 0) {
        next2[it & 1] = drawn;
        float f;
        if (!(Ssum == Ssum) || M == -INFINITY) f = NAN;  // NaN / +inf somewhere, or an all -inf row: a NaN row
        else f = m == -INFINITY ? 0.f : expf(m - M) / Ssum;
        fsh = f;
      }
    }
    __syncthreads();
    const float f = fsh;
    row = nrow;
    nrow = next2[it & 1];  // written by thread 0 of this iteration; rewritten at it + 2, after two more barriers
    // 4. Out.
    if (TMA) {
      float4* y4 = reinterpret_cast<float4*>(yr);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int i = t + k * THREADS;
        if (4 * i < n) y4[i] = make_float4(r[k].x * f, r[k].y * f, r[k].z * f, r[k].w * f);
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int i = t + (4 * k + c) * THREADS;
          if (i < n) yr[i] = comp(r[k], c) * f;
        }
    }
  }
}

// Largest slice of the equal split of cols into s (boundaries rounded down to multiples of 4, as the kernel does).
int64_t max_slice(int64_t cols, int s) {
  int64_t mx = 0;
  for (int j = 0; j < s; ++j) {
    const int64_t a = cols * j / s / 4 * 4, b = j + 1 == s ? cols : cols * (j + 1) / s / 4 * 4;
    mx = std::max(mx, b - a);
  }
  return mx;
}

template <bool TMA>
void launch(const at::TensorBase& x, const at::TensorBase& y, int64_t s_force, int64_t g_force) {
  auto kern = softmax_gridrow<TMA>;
  const int64_t rows = x.size(0), cols = x.size(1);
  const size_t smem = TMA ? (size_t)SLICE * 4 : 0;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int occ = 0, sms = 0, coop = 0;
  const int dev = x.device().index();
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, THREADS, smem));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  TORCH_CHECK(coop && occ > 0, "softmax 7_gridrow needs cooperative launch and one 512-thread CTA per SM");
  const int64_t gmax = (int64_t)occ * sms;
  TORCH_CHECK(g_force <= gmax, "softmax 7_gridrow: at most ", kp::num(gmax), " co-resident CTAs, asked for ",
              kp::num(g_force));
  // The plan: groups of s CTAs (a virtual cluster each), G = s x floor(gmax / s); the s with the largest G whose
  // slices fit a CTA, the fewest slices on a tie (393216 columns: 11 x 12 = 132 CTAs; 8 slices would leave 4 SMs
  // idle). s / g > 0 force them (A/B runs; g is rounded down to a multiple of s).
  int s = 0;
  int64_t G = 0;
  const int smin = (int)std::max<int64_t>(1, (cols + SLICE - 1) / SLICE);
  for (int c = smin; c <= MAX_S; ++c) {
    if (s_force > 0 && c != s_force) continue;
    const int64_t g = (g_force > 0 ? g_force : gmax) / c * c;
    if (g > G && max_slice(cols, c) <= SLICE) { s = c; G = g; }
  }
  TORCH_CHECK(G > 0, "softmax 7_gridrow: no plan of <= ", kp::num(MAX_S), " slices of <= ", kp::num(SLICE),
              " floats fits rows of ", kp::num(cols), " columns", s_force > 0 || g_force > 0 ? " (forced s / g)" : "");
  G = std::min<int64_t>(G, rows * s);  // no group without a row
  const cudaStream_t st = kp::stream();
  // Counters and records: one allocation from torch's caching allocator, counters zeroed on this stream, freed
  // right after the launch is enqueued (the allocator hands it out again only to work ordered after it).
  // s == 1: no exchange, so no per-row counters or records.
  const size_t cnt_bytes = 4 + (s > 1 ? (size_t)rows * 4 : 0),
               bytes = (cnt_bytes + 15) / 16 * 16 + (s > 1 ? (size_t)rows * s * 16 : 0);
  char* scratch = static_cast<char*>(c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, st));
  C10_CUDA_CHECK(cudaMemsetAsync(scratch, 0, cnt_bytes, st));
  auto* ticket = reinterpret_cast<unsigned*>(scratch);
  auto* arrived = reinterpret_cast<unsigned*>(scratch + 4);
  auto* rec = reinterpret_cast<float4*>(scratch + (cnt_bytes + 15) / 16 * 16);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)G);
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;  // co-residency: a CTA waits on peers (see the header)
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kern, x.data_ptr<float>(), y.data_ptr<float>(), rows, cols,
                                             x.stride(0), s, ticket, arrived, rec);
  c10::cuda::CUDACachingAllocator::raw_delete(scratch);
  C10_CUDA_CHECK(err);
}

}  // namespace

// s, g: force the slice count and the grid (A/B runs; 0 = the plan above).
KP_EXPORT void softmax_forward_plan(const at::TensorBase& x, const at::TensorBase& y, int64_t s, int64_t g) {
  kp::check_row_softmax_args(x, y);
  const int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0 || cols == 0) return;
  TORCH_CHECK(rows <= 2147483647LL - 2 * 4096, "softmax 7_gridrow: too many rows for 32-bit row tickets: ",
              kp::num(rows));
  TORCH_CHECK(cols <= (int64_t)MAX_S * SLICE, "softmax 7_gridrow: rows of ", kp::num(cols),
              " columns are longer than ", kp::num(MAX_S), " slices of ", kp::num(SLICE));
  c10::cuda::CUDAGuard guard(x.device());
  const bool tma = (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0) &&
                   (reinterpret_cast<uintptr_t>(y.data_ptr()) % 16 == 0) && x.stride(0) % 4 == 0 && cols % 4 == 0;
  if (tma) launch<true>(x, y, s, g);
  else launch<false>(x, y, s, g);
}

KP_EXPORT void softmax_forward(const at::TensorBase& x, const at::TensorBase& y) { softmax_forward_plan(x, y, 0, 0); }
