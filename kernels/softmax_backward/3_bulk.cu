// softmax_backward / 3_bulk -- 2_cluster's row-per-cluster design, with the next row's slices brought in by TMA bulk
// copies chunk by chunk, rows handed out by an atomic ticket, and the clusters' starts staggered.
// Requires: sm_90a (thread-block clusters, distributed shared memory and TMA)
//
// What changed from 2_cluster: 2_cluster moved the floor's bytes at only 56% of copy speed: latency-bound, not
//   traffic-bound. The three things the forward's ladder (softmax/6_regcluster) found to close that gap are taken
//   over here: (1) the next row's slices arrive by bulk copies (one instruction per chunk of 48 KiB, the copy engine
//   keeping it in flight) in place of 24 cp.async of 16 bytes per thread, and each chunk of the ring is refilled as
//   soon as it is in registers, so the SM's loads never wait for the whole slice to be copied out; (2) after its
//   first two rows a cluster takes the next unclaimed row from an atomic ticket that rank 0 draws two rows ahead
//   and hands its peers with the partial sums, so the rows in flight stay neighbours in memory (a static row order
//   lets the clusters drift apart); (3) cluster c starts c x stagger cycles late, so the clusters do not read,
//   reduce and store in lockstep for their first rows.
// Ownership / launch: persistent clusters of CL CTAs, CL the smallest of 1, 2, 4, 8, 16 whose slices fit 24576
//   floats (16 at 393216 columns); CTA rank r owns columns [r*chunk, (r+1)*chunk) of each row its cluster takes;
//   thread t owns float4s t + 512k (k < 12) of its slice of y and of dy, in registers (96 floats a thread).
//   The ring (shared memory, 192 KiB) holds the next row's two slices in 4 chunks, chunk c = registers k in
//   [3c, 3c+3) of every thread, each chunk of both tensors completing one mbarrier. 1 CTA an SM, 512 threads;
//   G = cudaOccupancyMaxActiveClusters clusters. The partials and the ticketed row cross the cluster through
//   distributed shared memory into slots indexed by row parity (a CTA is at most one row ahead of a peer): one
//   cluster barrier per row. The ticket counter (8 bytes from torch's caching allocator) is zeroed on the launch's
//   stream before the launch.
// Bytes: 4*R*N read of y, 4*R*N of dy, 4*R*N written: the floor (19.3 GB at 4096x393216); copy-speed floor 4.5 ms.
// Bound: memory, provided the per-row reduction and cluster barrier hide under the next row's loads.
// Preconditions (checked): those of every rung (kp::check_backward_args). The cluster path takes rows of a multiple
//   of 4 columns, at most 16 x 24576, whose y and dy start 16-byte aligned (base and row stride: the bulk copy's
//   granule); any other rows go to 1_tworead's kernel (rowblock.cuh).
// Numerics: as 2_cluster: per-thread fp32 partial sums over 4-float groups, a block tree, then the CL partials summed
//   in rank order by every CTA (one s for the whole row); relL2 vs float64 ~1e-7. NaN/Inf propagate as PyTorch's.
// Measured: H200, 4096x393216, `python run.py --problem softmax_backward --seed 1` (2026-11-29, GPU time, L2 flushed,
//   interleaved; ceiling 4,271 GB/s = device copy in the same run): 4.674 ms (IQR 0.241), 4,135 GB/s of minimum
//   traffic, 96.8% of copy, 2.25x eager (10.526), 1.65x torch.compile (7.736); 2_cluster 8.138 ms (55.6%) beside it.
//   The spread is 5% of the median where 2_cluster's is 0.3%: the ticketed order differs call to call.
#include <cooperative_groups.h>

#include <c10/cuda/CUDACachingAllocator.h>

#include "rowblock.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int TH = 512;            // threads per CTA
constexpr int V = 12;              // float4s per thread per tensor
constexpr int NCH = 4;             // ring chunks
constexpr int KPC = V / NCH;       // float4s per thread per tensor per chunk
constexpr int SLICE = TH * V * 4;  // floats of a row per CTA, per tensor
constexpr int MAX_CL = 16;
constexpr size_t SMEM = (size_t)2 * SLICE * sizeof(float);  // the next row's two slices: 192 KiB
static_assert(V % NCH == 0, "chunks must split the per-thread registers evenly");

// Thread 0: float4s [b, e) of the slices at yr and gr (clipped to n4) into dy_ and dg, completing on bar; an empty
// range still arrives, so the barrier's phase always completes.
__device__ __forceinline__ void bulk_pair(float4* dst_y, float4* dst_g, uint64_t* bar, const float4* yr,
                                          const float4* gr, int n4, int b, int e) {
  b = min(n4, b);
  e = min(n4, e);
  const uint32_t bytes = (uint32_t)((e - b) * 16);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic reads of the slots before async writes
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(kp::smem_u32(bar)), "r"(2 * bytes)
               : "memory");
  if (e > b) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            kp::smem_u32(dst_y + b)),
        "l"(yr + b), "r"(bytes), "r"(kp::smem_u32(bar))
        : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            kp::smem_u32(dst_g + b)),
        "l"(gr + b), "r"(bytes), "r"(kp::smem_u32(bar))
        : "memory");
  }
}

__global__ void __launch_bounds__(TH, 1)
    softmax_backward_bulk(const float* __restrict__ y, const float* __restrict__ dy, float* __restrict__ dx,
                          int64_t rows, int64_t cols, int64_t ys, int64_t dys, int64_t chunk,
                          unsigned long long* __restrict__ ticket, int64_t stagger) {
  extern __shared__ __align__(128) float4 ring[];  // [SLICE/4] of y, then [SLICE/4] of dy: the next row's slices
  __shared__ float part[2][MAX_CL];                 // per row parity: each rank's partial sum
  __shared__ int64_t next2[2];                      // per row parity: the row two iterations ahead (rank 0's ticket)
  __shared__ float scratch[32];
  __shared__ __align__(8) uint64_t bars[NCH];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = (int)cluster.block_rank(), CL = (int)cluster.num_blocks();
  const int t = threadIdx.x;
  const int64_t G = gridDim.x / CL, first = blockIdx.x / CL;
  const int64_t c0 = kp::imin(cols, rank * chunk);
  const int n4 = (int)((kp::imin(cols, c0 + chunk) - c0) / 4);  // this slice's float4s (<= SLICE / 4)
  float4* ry = ring;
  float4* rg = ring + SLICE / 4;
  const auto src = [&](const float* base, int64_t stride, int64_t row) {
    return reinterpret_cast<const float4*>(base + row * stride + c0);
  };

  if (t == 0) {
    for (int c = 0; c < NCH; ++c) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(kp::smem_u32(&bars[c])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    if (stagger > 0 && first > 0) {  // cluster c starts c x stagger SM cycles late
      const long long t0 = clock64();
      while (clock64() - t0 < first * stagger) {}
    }
    if (first < rows)
      for (int c = 0; c < NCH; ++c)
        bulk_pair(ry, rg, &bars[c], src(y, ys, first), src(dy, dys, first), n4, c * KPC * TH, (c + 1) * KPC * TH);
  }
  __syncthreads();

  int64_t row = first, ahead = first + G;  // this iteration's row and the next one's (static for the first two)
  for (uint32_t it = 0; row < rows; ++it) {
    if (it == 0) kp::cluster_arrive_relaxed();  // matched by the wait before the first exchange
    int64_t drawn = 0;                           // the row of iteration it + 2; its latency hides under this row
    if (rank == 0 && t == 0) drawn = 2 * G + (int64_t)atomicAdd(ticket, 1ull);
    const int64_t nrow = ahead;
    // 1. This row's slices into registers, chunk by chunk; each emptied chunk is refilled with the next row's.
    float4 a[V], g[V];
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
      kp::mbar_wait(&bars[c], it & 1);
#pragma unroll
      for (int kk = 0; kk < KPC; ++kk) {
        const int k = c * KPC + kk, j = t + k * TH;
        const bool in = j < n4;
        a[k] = in ? ry[j] : make_float4(0.f, 0.f, 0.f, 0.f);
        g[k] = in ? rg[j] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      __syncthreads();  // every thread has chunk c in registers: its slots are free
      if (t == 0 && nrow < rows)
        bulk_pair(ry, rg, &bars[c], src(y, ys, nrow), src(dy, dys, nrow), n4, c * KPC * TH, (c + 1) * KPC * TH);
    }
    // 2. The slice's partial of s = sum(y * dy), then the row's s across the cluster.
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < V; ++k) s += a[k].x * g[k].x + a[k].y * g[k].y + a[k].z * g[k].z + a[k].w * g[k].w;
    s = kp::block_sum(s, scratch);
    if (it == 0) kp::cluster_wait();  // every CTA of the cluster has started: peers' shared memory is writable
    if (t < CL) *cluster.map_shared_rank(&part[it & 1][rank], t) = s;
    if (rank == 0 && t == 0)
      for (int q = 0; q < CL; ++q) *cluster.map_shared_rank(&next2[it & 1], q) = drawn;
    cluster.sync();
    const int64_t cur = row;
    row = ahead;
    ahead = next2[it & 1];  // read before the next barrier: the slot is reused at it + 2
    float S = 0.f;
    for (int q = 0; q < CL; ++q) S += part[it & 1][q];
    // 3. Out: dx = y * (dy - s), straight from registers.
    float4* out = reinterpret_cast<float4*>(dx + cur * cols + c0);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int j = t + k * TH;
      if (j < n4)
        out[j] = make_float4(a[k].x * (g[k].x - S), a[k].y * (g[k].y - S), a[k].z * (g[k].z - S),
                             a[k].w * (g[k].w - S));
    }
  }
  cluster.sync();  // no CTA leaves while a peer may still write its shared memory
}

}  // namespace

// stagger: SM cycles between consecutive clusters' starts; < 0 takes the rule below.
void launch_bulk(const at::TensorBase& y, const at::TensorBase& dy, const at::TensorBase& dx, int64_t stagger) {
  const int64_t rows = y.size(0), cols = y.size(1);
  const auto [cl, chunk] = kp_softmax_backward::cluster_split(cols, SLICE, MAX_CL);
  kp_softmax_backward::ClusterLaunch launch(softmax_backward_bulk, cl, TH, SMEM, rows, "softmax_backward 3_bulk");
  // A row moves 12 * cols bytes; at 1/G of ~4.2 TB/s and ~2 GHz that is G * cols / 175 cycles. Half of that period
  // spread over the G clusters' starts, as the forward's stagger (6_regcluster).
  if (stagger < 0) stagger = cols / 350;
  // The ticket counter: 8 bytes from torch's caching allocator, zeroed on this stream, freed right after the launch
  // is enqueued (the allocator hands it out again only to work ordered after it on this stream).
  const cudaStream_t stream = launch.cfg.stream;
  auto* tk = static_cast<unsigned long long*>(
      c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(sizeof(unsigned long long), stream));
  C10_CUDA_CHECK(cudaMemsetAsync(tk, 0, sizeof(*tk), stream));
  const cudaError_t err =
      cudaLaunchKernelEx(&launch.cfg, softmax_backward_bulk, y.data_ptr<float>(), dy.data_ptr<float>(),
                         dx.data_ptr<float>(), rows, cols, y.stride(0), dy.stride(0), chunk, tk, stagger);
  c10::cuda::CUDACachingAllocator::raw_delete(tk);
  C10_CUDA_CHECK(err);
}

KP_EXPORT void softmax_backward(const at::TensorBase& y, const at::TensorBase& dy, const at::TensorBase& dx) {
  kp::check_backward_args(y, dy, dx);
  const int64_t rows = y.size(0), cols = y.size(1);
  if (rows == 0 || cols == 0) return;
  c10::cuda::CUDAGuard guard(y.device());
  if (!kp_softmax_backward::cluster_rows(y, dy, (int64_t)MAX_CL * SLICE)) {
    kp_softmax_backward::launch_rowblock(y, dy, dx);  // rows no cluster path takes: 1_tworead's kernel
    return;
  }
  launch_bulk(y, dy, dx, -1);
}

#if KP_EXPERIMENTS
// A/B hook (bench/softmax/backward_ab.py): the cluster path with a given start stagger (SM cycles between clusters'
// starts; 0 none, < 0 the rule), for rows it takes.
KP_EXPORT void softmax_backward_stagger(const at::TensorBase& y, const at::TensorBase& dy, const at::TensorBase& dx,
                                        int64_t stagger) {
  kp::check_backward_args(y, dy, dx);
  TORCH_CHECK(y.size(0) > 0 && y.size(1) % 4 == 0 && y.size(1) <= (int64_t)MAX_CL * SLICE && y.is_contiguous() &&
                  dy.is_contiguous(),
              "softmax_backward_stagger: contiguous rows of a multiple of 4 columns the cluster path takes");
  c10::cuda::CUDAGuard guard(y.device());
  launch_bulk(y, dy, dx, stagger);
}
#endif
