// softmax_backward / 2_cluster -- a row split over a thread-block cluster, y and dy read once, the next row's slices
// copied into shared memory while this row is reduced, exchanged and stored.
// Requires: sm_90a (thread-block clusters and distributed shared memory)
//
// What changed from 1_tworead: 1_tworead reads y and dy twice (once for s = sum(dy * y), once for dx), 5 tensor
//   passes where 3 are the floor; a row's two slices (2 x 1.5 MiB at 393216 columns) do not fit one SM. Here a
//   cluster of CL CTAs holds a row: each CTA keeps its slice of y and of dy in registers (12 float4s of each per
//   thread, 512 threads: 24576 floats of each), reduces its partial s, hands it to every peer through distributed
//   shared memory, and after one cluster barrier writes dx = y * (dy - s) from registers. The next row's slices
//   are copied by cp.async into shared memory (each thread its own float4s, so no barrier guards them) as soon as
//   this row's values are in registers: one row of loads is in flight during the reduction, the barrier and the
//   stores of the current one.
// Ownership / launch: persistent clusters of CL CTAs, CL the smallest of 1, 2, 4, 8, 16 whose slices fit 24576
//   floats (16 at 393216 columns); CTA rank r owns columns [r*chunk, (r+1)*chunk) of each row its cluster takes;
//   thread t owns float4s t + 512k (k < 12) of its slice. Cluster c takes rows c, c + G, c + 2G, ... with G =
//   cudaOccupancyMaxActiveClusters (1 CTA an SM: 192 KiB of shared memory for the next row's two slices).
//   The partials cross the cluster into a slot indexed by row parity (a CTA is at most one row ahead of a peer).
// Bytes: 4*R*N read of y, 4*R*N of dy, 4*R*N written: the floor (19.3 GB at 4096x393216); copy-speed floor 4.6 ms.
// Bound: memory, provided the per-row reduction and barrier hide under the next row's loads.
// Preconditions (checked): those of every rung (kp::check_backward_args). The cluster path takes rows of a multiple
//   of 4 columns, at most 16 x 24576, whose y and dy start 16-byte aligned (base and row stride); any other rows go
//   to 1_tworead's kernel (rowblock.cuh).
// Numerics: per-thread fp32 partial sums over 4-float groups, a block tree, then the CL partials summed in rank
//   order by every CTA (one s for the whole row); relL2 vs float64 ~1e-7. NaN/Inf propagate as in 1_tworead.
// Measured: H200, 4096x393216, 8.133 ms, 2,376 GB/s of minimum traffic, 55.7% of copy (4,264 GB/s), 2026-11-29;
//   torch.compile 7.657 ms, eager 10.529 ms in the same run: below compile, far from the floor (docs/softmax.md).
#include <cooperative_groups.h>

#include "rowblock.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int TH = 512;           // threads per CTA
constexpr int V = 12;             // float4s per thread per tensor
constexpr int SLICE = TH * V * 4;  // floats of a row per CTA, per tensor
constexpr int MAX_CL = 16;
constexpr size_t SMEM = (size_t)2 * V * TH * sizeof(float4);  // the next row's two slices: 192 KiB

__device__ __forceinline__ void copy16(float4* dst, const float4* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(kp::smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void copies_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void copies_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }

__global__ void __launch_bounds__(TH, 1) softmax_backward_cluster(const float* __restrict__ y,
                                                                 const float* __restrict__ dy,
                                                                 float* __restrict__ dx, int64_t rows, int64_t cols,
                                                                 int64_t ys, int64_t dys, int64_t chunk) {
  extern __shared__ float4 ring[];  // [V][TH] of y, then [V][TH] of dy: the next row's slices
  __shared__ float part[2][MAX_CL];  // per row parity: each rank's partial sum
  __shared__ float scratch[32];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = (int)cluster.block_rank(), CL = (int)cluster.num_blocks();
  const int t = threadIdx.x;
  const int64_t G = gridDim.x / CL, c = blockIdx.x / CL;
  const int64_t c0 = rank * chunk;
  const int n4 = (int)((kp::imin(cols, c0 + chunk) - kp::imin(cols, c0)) / 4);  // this slice's float4s
  float4* ry = ring;
  float4* rg = ring + V * TH;

  auto prefetch = [&](int64_t row) {
    const float4* y4 = reinterpret_cast<const float4*>(y + row * ys + c0);
    const float4* g4 = reinterpret_cast<const float4*>(dy + row * dys + c0);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int j = t + k * TH;
      if (j < n4) {
        copy16(&ry[k * TH + t], y4 + j);
        copy16(&rg[k * TH + t], g4 + j);
      }
    }
    copies_commit();
  };

  cluster.sync();  // every CTA of the cluster has started before any writes a peer's shared memory
  if (c < rows) prefetch(c);
  int it = 0;
  for (int64_t row = c; row < rows; row += G, ++it) {
    copies_wait();  // this thread's own copies of the row have landed
    float4 a[V], g[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const bool in = t + k * TH < n4;
      a[k] = in ? ry[k * TH + t] : make_float4(0.f, 0.f, 0.f, 0.f);
      g[k] = in ? rg[k * TH + t] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < V; ++k) s += a[k].x * g[k].x + a[k].y * g[k].y + a[k].z * g[k].z + a[k].w * g[k].w;
    if (row + G < rows) prefetch(row + G);  // after every value above is in registers: the slots are free
    s = kp::block_sum(s, scratch);
    if (t < CL) *cluster.map_shared_rank(&part[it & 1][rank], t) = s;
    cluster.sync();
    float S = 0.f;
    for (int q = 0; q < CL; ++q) S += part[it & 1][q];
    float4* out = reinterpret_cast<float4*>(dx + row * cols + c0);
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

KP_EXPORT void softmax_backward(const at::TensorBase& y, const at::TensorBase& dy, const at::TensorBase& dx) {
  kp::check_backward_args(y, dy, dx);
  const int64_t rows = y.size(0), cols = y.size(1);
  if (rows == 0 || cols == 0) return;
  c10::cuda::CUDAGuard guard(y.device());
  if (!kp_softmax_backward::cluster_rows(y, dy, (int64_t)MAX_CL * SLICE)) {
    kp_softmax_backward::launch_rowblock(y, dy, dx);  // rows no cluster path takes: 1_tworead's kernel
    return;
  }
  const auto [cl, chunk] = kp_softmax_backward::cluster_split(cols, SLICE, MAX_CL);
  kp_softmax_backward::ClusterLaunch launch(softmax_backward_cluster, cl, TH, SMEM, rows, "softmax_backward 2_cluster");
  C10_CUDA_CHECK(cudaLaunchKernelEx(&launch.cfg, softmax_backward_cluster, y.data_ptr<float>(), dy.data_ptr<float>(),
                                    dx.data_ptr<float>(), rows, cols, y.stride(0), dy.stride(0), chunk));
}
