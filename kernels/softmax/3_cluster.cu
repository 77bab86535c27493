// softmax / 3_cluster -- one read and one write per element: the row lives on chip, spread over a thread-block
// Requires: sm_90a (thread-block clusters and distributed shared memory)
// cluster, and only the (max, sum) partials cross between CTAs through distributed shared memory.
//
// What changed from 2_online: a row is split over a cluster of CL CTAs (CL = 1..16, the smallest power of two whose
//   slice fits in one CTA's shared memory). Each CTA pulls its slice into shared memory with bulk async copies (TMA,
//   `cp.async.bulk`, 4 chunks each completing on its own mbarrier, so the online (max, sum) of chunk k runs while
//   chunks k+1.. are still in flight), writes its partial into every peer's shared memory (DSMEM), meets the cluster
//   once at a barrier, merges CL partials, and writes exp(x - max) / sum straight from shared memory. Pass 2 never
//   touches HBM: bytes moved = 4*R*N read + 4*R*N written = the floor.
// Ownership / launch: cluster c owns row c; CTA rank r owns columns [r*chunk, (r+1)*chunk), chunk = ceil(N/CL)
//   rounded up to 4 floats; 512 threads stride over the slice in float4s. grid = R*CL CTAs, cluster = (CL,1,1),
//   dynamic smem = chunk*4 bytes (192 KiB at N = 393216, CL = 8).
// Why CL = 8 at 393216: 16 x 96 KiB also fits (non-portable size) but measured occupancy is 7 clusters on 112 SMs
//   vs 15 clusters on 120 SMs for 8 (measured on an H200); 8 keeps more SMs pulling bytes. Rows of <= ~50K floats use CL = 1
//   (the whole row in one CTA); the auto choice can be overridden (softmax_forward_cluster) for sweeps.
// Bound: memory; prediction at 4096x393216: 12.9 GB at the ~4.1-4.2 TB/s copy speed = 3.07-3.14 ms. What limits it:
//   each CTA alternates a load phase and a store phase with a cluster barrier between, so HBM stays busy only
//   because ~15 clusters are out of phase with each other.
// Preconditions (checked): 2-D float32 CUDA; unit-stride rows; y contiguous. Rows longer than 16 CTAs' shared
//   memory (N > ~930K floats) keep what fits on chip and re-read the rest in pass 2 (2_online's trade). TMA needs 16-byte aligned rows (x, y base
//   and row stride); other layouts take a scalar-load path with the same on-chip algorithm.
// Numerics: identical element math to 2_online (online.cuh); cluster partials merged in rank order. relL2 ~1e-7.
// Measured: H200, 4096x393216, 4.12 ms (CL=8; CL=16 4.41, CL=4 5.57), 3,132 GB/s, 75.7% of copy (4,135 GB/s),
//   2026-11-22. The 3.1 ms prediction missed by 30%: per SM the load and store phases do not overlap.
#include <cooperative_groups.h>

#include "../common/kp.cuh"
#include "online.cuh"

namespace cg = cooperative_groups;

namespace {
using namespace kp_softmax;

constexpr int THREADS = 512;
constexpr int NCHUNK = 4;

template <int CL>
__global__ void __launch_bounds__(THREADS, 1)
    softmax_cluster(const float* __restrict__ x, float* __restrict__ y, int64_t cols, int64_t xs, int64_t chunk,
                    int64_t cap, bool tma) {
  extern __shared__ __align__(128) float slice[];
  __shared__ float part[CL][2];  // (max, sum) of every CTA of the cluster, written by the peers
  __shared__ float scratch[64];
  __shared__ __align__(8) uint64_t bars[NCHUNK];

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = (int)cluster.block_rank();
  kp::cluster_arrive_relaxed();  // matched by the wait before the (m, s) exchange
  const int64_t row = blockIdx.x / CL;
  const int64_t c0 = kp::imin(cols, rank * chunk);
  const int64_t n = kp::imin(cols, c0 + chunk) - c0;  // may be 0 for the last ranks of a short row
  const int64_t nc = kp::imin(n, cap);  // the part of the slice kept on chip (all of it unless N > ~930K)
  const float* xr = x + row * xs + c0;
  float* yr = y + row * cols + c0;

  float m = -INFINITY, s = 0.f;
  if (tma) {
    // n and nc are multiples of 4 here (cols, chunk, cap all are). Chunks in float4 units.
    const int64_t n4 = nc >> 2;
    const int64_t per = (n4 + NCHUNK - 1) / NCHUNK;
    if (threadIdx.x == 0) {
      for (int k = 0; k < NCHUNK; ++k)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(kp::smem_u32(&bars[k])));
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 0; k < NCHUNK; ++k) {
        const int64_t b = kp::imin(n4, k * per), e = kp::imin(n4, b + per);
        const uint32_t bytes = (uint32_t)((e - b) * 16);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(kp::smem_u32(&bars[k])),
                     "r"(bytes)
                     : "memory");
        if (bytes)
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                  kp::smem_u32(slice + 4 * b)),
              "l"(xr + 4 * b), "r"(bytes), "r"(kp::smem_u32(&bars[k]))
              : "memory");
      }
    }
    const float4* s4 = reinterpret_cast<const float4*>(slice);
    for (int k = 0; k < NCHUNK; ++k) {
      const int64_t b = kp::imin(n4, k * per), e = kp::imin(n4, b + per);
      kp::mbar_wait(&bars[k], 0);
      for (int64_t i = b + threadIdx.x; i < e; i += THREADS) absorb(m, s, s4[i]);
    }
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int64_t i = n4 + threadIdx.x; i < (n >> 2); i += THREADS) absorb(m, s, x4[i]);  // off-chip remainder
  } else {
    // Any alignment: coalesced scalar loads into the slice, same on-chip algorithm.
    for (int64_t i = threadIdx.x; i < n; i += THREADS) {
      const float v = xr[i];
      if (i < nc) slice[i] = v;
      absorb(m, s, v);
    }
  }
  kp::block_online(m, s, scratch);

  // Publish this CTA's partial into slot [rank] of every CTA in the cluster (itself included), then one barrier:
  // after it every CTA holds all CL partials and no CTA touches another's shared memory again, so exiting is safe.
  kp::cluster_wait();  // every CTA of the cluster has started: its shared memory may be written
  if (threadIdx.x < CL) {
    float* peer = cluster.map_shared_rank(&part[0][0], (int)threadIdx.x);
    peer[2 * rank] = m;
    peer[2 * rank + 1] = s;
  }
  cluster.sync();
  float M = -INFINITY, S = 0.f;
#pragma unroll
  for (int r = 0; r < CL; ++r) kp::online_merge(M, S, part[r][0], part[r][1]);
  const float inv = 1.f / S;

  if (tma) {
    const float4* s4 = reinterpret_cast<const float4*>(slice);
    float4* y4 = reinterpret_cast<float4*>(yr);
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int64_t i = threadIdx.x; i < (n >> 2); i += THREADS) y4[i] = vout(i < (nc >> 2) ? s4[i] : x4[i], M, inv);
  } else {
    for (int64_t i = threadIdx.x; i < n; i += THREADS) yr[i] = vout(i < nc ? slice[i] : xr[i], M, inv);
  }
}

int64_t smem_optin(int dev) {
  int v = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return v;
}

// Static shared memory of the kernel besides the slice (part, scratch, barriers), with slack.
constexpr int64_t STATIC_SMEM = 1024;

template <int CL>
void launch(const at::TensorBase& x, const at::TensorBase& y, int64_t chunk, int64_t cap, bool tma) {
  auto kern = softmax_cluster<CL>;
  const int64_t rows = x.size(0), cols = x.size(1);
  const size_t smem = (size_t)cap * 4;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  if (CL > 8) C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)(rows * CL));
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
  int clusters = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg));
  TORCH_CHECK(clusters > 0, "softmax 3_cluster: a cluster of ", kp::num(CL), " CTAs with ", kp::num((long long)smem),
              " B of shared memory each cannot be scheduled on this GPU");
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, x.data_ptr<float>(), y.data_ptr<float>(), cols, x.stride(0), chunk,
                                    cap, tma));
}

}  // namespace

KP_EXPORT void softmax_forward_cluster(const at::TensorBase& x, const at::TensorBase& y, int64_t cl) {
  kp::check_row_softmax_args(x, y);
  const int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0 || cols == 0) return;
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t limit = smem_optin(x.get_device()) - STATIC_SMEM;
  if (cl <= 0) {  // auto: the smallest cluster whose slice fits
    for (cl = 1; cl < 16 && ((cols + cl - 1) / cl + 3) / 4 * 16 > limit; cl *= 2) {}
  }
  TORCH_CHECK(cl == 1 || cl == 2 || cl == 4 || cl == 8 || cl == 16, "cluster size must be 1, 2, 4, 8 or 16");
  const int64_t chunk = ((cols + cl - 1) / cl + 3) / 4 * 4;
  // Rows too long for CL CTAs keep the first `cap` floats of each slice on chip and re-read the rest in pass 2.
  const int64_t cap = kp::imin(chunk, limit / 16 * 4);
  TORCH_CHECK(rows * cl <= 2147483647LL, "too many rows for the grid: ", kp::num(rows));
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
