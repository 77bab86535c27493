// softmax / 4_persistent -- 3_cluster made persistent, with the next row's loads overlapping this row's stores.
// Requires: sm_90a (thread-block clusters and distributed shared memory)
//
// What changed from 3_cluster: 3_cluster launches one cluster per row, and each CTA runs load -> reduce -> store
//   back to back, so an SM's HBM traffic stops during the cluster barrier, during the launch of the next cluster
//   and while its stores drain. Here a grid of exactly as many clusters as fit on the GPU walks the rows
//   (cluster c owns rows c, c+G, c+2G, ...). The CTA's slice buffer is a ring of NCHUNK chunks, each with its own
//   mbarrier: as soon as every thread has written chunk k of row i out, thread 0 issues the TMA bulk load of chunk
//   k of row i+G into the same buffer. So the loads of the next row are in flight while this row's remaining chunks
//   are normalised and stored, and the online (max, sum) of row i+G starts on chunk 0 while chunks 1.. still arrive.
// Ownership / launch: cluster of CL CTAs per row (CL = the smallest power of two, 1..16, whose slice fits one
//   CTA's shared memory: 8 at N = 393216, slice 192 KiB); CTA rank r owns columns [r*chunk, (r+1)*chunk) of every
//   row its cluster visits; 512 threads stride over the slice in float4s. grid = G*CL with G =
//   cudaOccupancyMaxActiveClusters (15 clusters of 8 on the H200's 132 SMs at 192 KiB), capped at the row count.
//   Partials (max, sum) cross the cluster through DSMEM into a slot indexed by row parity: a CTA can only be one row
//   ahead of a peer (the per-row cluster barrier), so two slots are enough and nothing is overwritten unread.
// Bytes: 4*R*N read + 4*R*N written = the floor (12.9 GB at 4096x393216); prediction at 95% of copy: 3.25 ms.
// Bound: memory. What limits it: 12 of 132 SMs idle (15 clusters of 8), and the per-row cluster barrier, during which
//   an SM has only the loads of the next row's first chunks in flight; other clusters are out of phase.
// Preconditions (checked): 2-D float32 CUDA; unit-stride rows; y contiguous. TMA needs 16-byte aligned rows (x, y
//   base, row stride, cols % 4); other layouts take a scalar path (thread-private slots, same algorithm, no overlap).
//   Rows longer than 16 CTAs' shared memory (N > ~930K) keep `cap` floats per CTA on chip and re-read the rest.
// Numerics: element math of online.cuh (expf, online (max, sum) per thread, tree merge, partials merged in rank
//   order), as 2_online / 3_cluster. NaN/+inf/all -inf rows give NaN rows, as PyTorch. relL2 ~1e-7.
// Measured: H200, 4096x393216, 3.916 ms, 3,290 GB/s, 77.4% of copy (4,250 GB/s), 1.21x torch.compile, 2026-11-22
//   (GPU time, L2 read-flushed). The persistence and the overlap bought ~1% over 3_cluster (3.951): the limit was
//   not where this header guessed; 6_regcluster says what it was.
#include <cooperative_groups.h>

#include "../common/kp.cuh"
#include "online.cuh"

namespace cg = cooperative_groups;

namespace {
using namespace kp_softmax;

constexpr int THREADS = 512;
constexpr int NCHUNK = 8;  // 24 KiB per chunk at a 192 KiB slice: fine-grained enough that loads restart early

// Chunk k of the on-chip part (n4 float4s) of a slice: [b, e) in float4 units.
__device__ __forceinline__ void chunk_range(int64_t n4, int k, int64_t& b, int64_t& e) {
  const int64_t per = (n4 + NCHUNK - 1) / NCHUNK;
  b = kp::imin(n4, k * per);
  e = kp::imin(n4, b + per);
}

// Thread 0 only: queue the TMA load of chunk k of the row starting at xr into its ring slot.
__device__ __forceinline__ void load_chunk(float* slice, uint64_t* bar, const float* xr, int64_t n4, int k) {
  int64_t b, e;
  chunk_range(n4, k, b, e);
  const uint32_t bytes = (uint32_t)((e - b) * 16);
  // The slot was last read through the generic proxy (ld.shared by all threads, ordered by the __syncthreads
  // before this call); order those reads before the async proxy's writes into it.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(kp::smem_u32(bar)), "r"(bytes) : "memory");
  if (bytes)
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            kp::smem_u32(slice + 4 * b)),
        "l"(xr + 4 * b), "r"(bytes), "r"(kp::smem_u32(bar))
        : "memory");
}

template <int CL>
__global__ void __launch_bounds__(THREADS, 1)
    softmax_persistent(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t cols, int64_t xs,
                       int64_t chunk, int64_t cap, bool tma) {
  extern __shared__ __align__(128) float slice[];
  __shared__ float part[2][CL][2];  // [row parity][rank] (max, sum), written by the peers
  __shared__ float scratch[64];
  __shared__ __align__(8) uint64_t bars[NCHUNK];

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = (int)cluster.block_rank();
  const int64_t G = gridDim.x / CL;
  const int64_t first = blockIdx.x / CL;
  const int64_t c0 = kp::imin(cols, rank * chunk);
  const int64_t n = kp::imin(cols, c0 + chunk) - c0;  // may be 0 for the last ranks of a short row
  const int64_t nc = kp::imin(n, cap);
  const int64_t n4 = nc >> 2;  // TMA path: n, nc are multiples of 4 (cols, chunk, cap all are)

  if (tma) {
    if (threadIdx.x == 0) {
      for (int k = 0; k < NCHUNK; ++k)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(kp::smem_u32(&bars[k])));
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      if (first < rows)
        for (int k = 0; k < NCHUNK; ++k) load_chunk(slice, &bars[k], x + first * xs + c0, n4, k);
    }
    __syncthreads();
  }

  uint32_t it = 0;
  for (int64_t row = first; row < rows; row += G, ++it) {
    if (it == 0) kp::cluster_arrive_relaxed();  // matched by the wait before the first (m, s) exchange
    const float* xr = x + row * xs + c0;
    float* yr = y + row * cols + c0;
    float m = -INFINITY, s = 0.f;
    if (tma) {
      const float4* s4 = reinterpret_cast<const float4*>(slice);
      for (int k = 0; k < NCHUNK; ++k) {
        int64_t b, e;
        chunk_range(n4, k, b, e);
        kp::mbar_wait(&bars[k], it & 1);
        for (int64_t i = b + threadIdx.x; i < e; i += THREADS) absorb(m, s, s4[i]);
      }
      const float4* x4 = reinterpret_cast<const float4*>(xr);
      for (int64_t i = n4 + threadIdx.x; i < (n >> 2); i += THREADS) absorb(m, s, x4[i]);  // off-chip remainder
    } else {
      // Thread-private slots (thread t writes and later reads back slots t, t+T, ...): no block barrier needed.
      for (int64_t i = threadIdx.x; i < n; i += THREADS) {
        const float v = xr[i];
        if (i < nc) slice[i] = v;
        absorb(m, s, v);
      }
    }
    kp::block_online(m, s, scratch);
    if (it == 0) kp::cluster_wait();  // every CTA of the cluster has started: peers' shared memory is writable
    if (threadIdx.x < CL) {
      float* peer = cluster.map_shared_rank(&part[it & 1][0][0], (int)threadIdx.x);
      peer[2 * rank] = m;
      peer[2 * rank + 1] = s;
    }
    cluster.sync();
    float M = -INFINITY, S = 0.f;
#pragma unroll
    for (int r = 0; r < CL; ++r) kp::online_merge(M, S, part[it & 1][r][0], part[it & 1][r][1]);
    const float inv = 1.f / S;

    const int64_t next = row + G;
    if (tma) {
      const float4* s4 = reinterpret_cast<const float4*>(slice);
      float4* y4 = reinterpret_cast<float4*>(yr);
      for (int k = 0; k < NCHUNK; ++k) {
        int64_t b, e;
        chunk_range(n4, k, b, e);
        for (int64_t i = b + threadIdx.x; i < e; i += THREADS) y4[i] = vout(s4[i], M, inv);
        if (next < rows) {
          __syncthreads();  // every thread is done reading slot k
          if (threadIdx.x == 0) load_chunk(slice, &bars[k], x + next * xs + c0, n4, k);
        }
      }
      const float4* x4 = reinterpret_cast<const float4*>(xr);
      for (int64_t i = n4 + threadIdx.x; i < (n >> 2); i += THREADS) y4[i] = vout(x4[i], M, inv);
    } else {
      for (int64_t i = threadIdx.x; i < n; i += THREADS) yr[i] = vout(i < nc ? slice[i] : xr[i], M, inv);
    }
  }
  // The last cluster.sync above was the last access to a peer's shared memory: exiting now is safe.
}

int64_t smem_optin(int dev) {
  int v = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return v;
}

constexpr int64_t STATIC_SMEM = 1024;  // part, scratch, barriers, with slack

template <int CL>
void launch(const at::TensorBase& x, const at::TensorBase& y, int64_t chunk, int64_t cap, bool tma) {
  auto kern = softmax_persistent<CL>;
  const int64_t rows = x.size(0), cols = x.size(1);
  const size_t smem = (size_t)cap * 4;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  if (CL > 8) C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = kp::stream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CL;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cfg.gridDim = dim3(CL);  // the occupancy query looks at the cluster shape, not the grid
  int clusters = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg));
  TORCH_CHECK(clusters > 0, "softmax 4_persistent: a cluster of ", kp::num(CL), " CTAs with ",
              kp::num((long long)smem), " B of shared memory each cannot be scheduled on this GPU");
  const int64_t G = kp::imin(rows, clusters);
  cfg.gridDim = dim3((unsigned)(G * CL));
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, x.data_ptr<float>(), y.data_ptr<float>(), rows, cols, x.stride(0),
                                    chunk, cap, tma));
}

}  // namespace

// cl = 0 picks the cluster size automatically; 1, 2, 4, 8, 16 force it (sweeps and A/B runs).
KP_EXPORT void softmax_forward_cluster(const at::TensorBase& x, const at::TensorBase& y, int64_t cl) {
  kp::check_row_softmax_args(x, y);
  const int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0 || cols == 0) return;
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t limit = smem_optin(x.get_device()) - STATIC_SMEM;
  if (cl <= 0) {
    for (cl = 1; cl < 16 && ((cols + cl - 1) / cl + 3) / 4 * 16 > limit; cl *= 2) {}
  }
  TORCH_CHECK(cl == 1 || cl == 2 || cl == 4 || cl == 8 || cl == 16, "cluster size must be 1, 2, 4, 8 or 16");
  const int64_t chunk = ((cols + cl - 1) / cl + 3) / 4 * 4;
  const int64_t cap = kp::imin(chunk, limit / 16 * 4);
  const bool tma = (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0) &&
                   (reinterpret_cast<uintptr_t>(y.data_ptr()) % 16 == 0) && x.stride(0) % 4 == 0 && cols % 4 == 0;
  switch (cl) {
    case 1: launch<1>(x, y, chunk, cap, tma); break;
    case 2: launch<2>(x, y, chunk, cap, tma); break;
    case 4: launch<4>(x, y, chunk, cap, tma); break;
    case 8: launch<8>(x, y, chunk, cap, tma); break;
    default: launch<16>(x, y, chunk, cap, tma); break;
  }
}

KP_EXPORT void softmax_forward(const at::TensorBase& x, const at::TensorBase& y) {
  softmax_forward_cluster(x, y, 0);
}
