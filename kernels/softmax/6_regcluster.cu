// softmax / 6_regcluster -- the row lives in registers across a cluster; shared memory only prefetches the next row
// (also for rows whose length is not a multiple of 4 floats: the aligned window around each slice, WINDOW below).
// A slice may run up to 4096 floats past the registers: that tail stays in shared memory (TAILED below).
// Requires: sm_90a (thread-block clusters, distributed shared memory and TMA)
// Precisions: fp32 bf16 fp16
//
// What changed from 4_persistent: 3_cluster and 4_persistent both stalled at ~4.0 ms (76% of copy) although their
//   traffic is the floor. Per CTA and row they spend two expf per element (online sum, then output) on the SFU
//   (16/clk/SM: 98K expf = 3.1 us per 192 KiB slice) and read the slice from shared memory twice, and in 4_persistent
//   the next row's loads are only queued during the store phase: per row ~11 us of memory time plus ~4 us of
//   compute and barriers that did not overlap it. Here each thread keeps its 24 float4s of the current row in
//   registers (96 floats x 512 threads = the 192 KiB slice), computes e = exp(x - m_cta) once (the CTA-local max),
//   and writes e * exp(m_cta - M) / S after the cluster exchange: one expf per element, no shared-memory pass over
//   the row. Shared memory holds the *next* row: its TMA bulk load is issued as soon as this row has been copied
//   into registers, so one full row of loads is in flight during the whole compute, barrier and store of the
//   current row.
// What changed since (TAILED): a row just past a multiple of 49152 floats (e.g. 196612 = 4 x 49152 + 4) used to
//   take the next cluster size up with part-empty slices: 8 CTAs of 24577 floats, 74% of copy_ on an H200, since
//   a half-full slice keeps half the bytes in flight per SM. Now a slice may be up to 4096 floats longer than the
//   registers hold; the extra float4s (2 per thread) stay in shared memory in one of two tail buffers after the
//   prefetch ring, filled by the same bulk copies a row ahead, so such rows keep the smaller cluster (4 CTAs at
//   196612) with full slices. Rows of 786433..851968 columns, too long for 16 register slices, now fit too.
// Ownership / launch: persistent clusters of CL CTAs, CL = the smallest of 1, 2, 3, 4, 8, 16 whose slices fit 49152
//   floats, or a smaller one whose slices fit 49152 + 4096 (see run(); 8 at N = 393216, 4 at 196612); CTA rank r
//   owns columns [r*chunk, (r+1)*chunk) of each row its cluster takes; thread t owns float4s t + 512k (k < 24)
//   in registers and, TAILED, float4s 12288 + t + 512q (q < 2) of the slice in shared memory.
//   G = cudaOccupancyMaxActiveClusters (1 CTA/SM: 128 regs x 512 threads). Every shipped path has 512 threads (the
//   kernel's TH); 256 with two CTAs an SM is an A/B build (softmax_forward_half_cta; docs/softmax.md).
//   Row order: cluster c takes rows c and c+G, then each further row from an atomic ticket that rank 0
//   draws two rows ahead and hands to its peers with the (m, s) exchange. The first version gave cluster c rows
//   c, c+G, c+2G, ... (static); the clusters then drift apart over ~273 rows each and the rows being read spread
//   over more and more of the 6.4 GB. With tickets a cluster that finishes early takes the next unclaimed row, so
//   the 15 rows in flight stay neighbours. The persistent-copy probe shows the same effect (tools/bw_probe.py,
//   same run: static grid stride 3,887 GB/s on 120 SMs, ticketed 4,011; 3,907 vs 4,086 on 132), and here it took
//   the kernel from 87.5% to 94.8% of copy_. The ticket counter (8 bytes from torch's caching allocator) is zeroed
//   by a cudaMemsetAsync on the same stream before the launch.
//   Start stagger: cluster c issues its first loads c * cols/512 SM cycles after launch (~0.4 us per
//   cluster at 393216 columns, 5.6 us for the last of 15, about half a row period over all of them). Started
//   together, the clusters read, computed and stored in lockstep for the first rows: per-CTA globaltimer stamps
//   (scratch trace, `softmax_forward_ab` with a trace tensor) put row 0 of a cluster at 23 us and rows 1-5 at
//   13.7 us each against 11.6 us in steady state, ~35 us lost by row 5; staggered, rows 1-5 take 11 us and the
//   loss by row 5 is ~16 us. Time vs rows (prefixes of the benchmark tensor) had a 21-27 us intercept against 6-7 us
//   for copy_; most of what is left is the pipeline fill (a row must be in before any of it goes out) and the end,
//   where the 15 clusters finish over 6-9 us.
//   The (m, s) partials cross the cluster through DSMEM into a slot indexed by row parity (a CTA is at most one row
//   ahead of a peer), one cluster barrier per row; the ticketed next row rides in the same kind of slot.
// Bytes: 4*R*N read + 4*R*N written, the floor (12.9 GB at 4096x393216); copy-speed floor 3.07 ms.
// Bound: memory, provided the per-row compute (~1.6 us SFU, ~1 us ALU, 0.75 us to copy the prefetched slice out of
//   shared memory) hides under the ~11 us that the row's traffic takes at the CTA's share of HBM bandwidth.
// Preconditions (checked): 2-D float32, bf16 or fp16 CUDA, y of x's dtype; unit-stride rows; y contiguous. The
//   prefetch is a TMA bulk copy, which needs 16-byte aligned source and size. Aligned rows (x, y base, row stride,
//   cols % 4, for 16-bit % 8) copy their slices (BULK).
//   Rows of any other length, with y's rows in x's phase mod 16 bytes (a contiguous x: every row starts in another
//   phase when cols % 4 != 0), copy the aligned window around each slice, up to 3 floats either side, inside the
//   same 16-byte granules, hence inside the allocation, never past the tensor's last element; the edge float4s are
//   masked in registers and stored lane by lane (WINDOW). Only other layouts (x and y rows in different phases) load
//   straight into registers, with no prefetch (DIRECT; no tail, it is staged by the bulk copies). Rows longer than
//   16 x (49152 + 4096) floats (16 x 49152 for DIRECT) take a block-per-row online kernel (2 reads; ModelNew routes
//   them elsewhere). Shared memory: the ring (the slice, up to 192 KiB) + 4 floats of window, or, TAILED, 224 KiB;
//   16-bit rows with staged output (below) the ring and a staging slice of the same size (2 x 96 KiB at most).
// Numerics: e = expf(x - m_cta), one scale per CTA (expf(m_cta - M) / S), partials merged in rank order with the
//   -inf-safe online merge; NaN or +inf anywhere, or an all -inf row, gives a NaN row, as PyTorch. relL2 ~1.5e-7.
//   16-bit rows: the same fp32 arithmetic on the widened values but for exp (ex2.approx, relative error ~2^-22, far
//   under the output's rounding), the output rounded once to the dtype (nearest even), as PyTorch's own bf16/fp16
//   softmax accumulates in fp32 and rounds once.
// Measured, 16-bit (expf, before the change below): H100 80GB, 4096x393216, `python run.py --problem softmax
//   --precision bf16` (2026-11-26, copy 3,032 GB/s in the same run): 2.405 ms, 2,679 GB/s, 88.4% of copy, 1.80x
//   eager (4.337), 1.49x torch.compile (3.588), relL2 1.8e-3 (eager's 1.8e-3); fp16 2.373 ms, 89.6%. fp32 in the
//   same session after the templating: 4.330 ms, 98.1% of copy (auto's row; H100, `--precision fp32`).
// Measured: H200, 4096x393216, `python run.py --problem softmax` (2026-11-22, GPU time, L2 flushed, interleaved;
//   ceiling 4,260 GB/s = device copy measured in the same run): 3.172 ms, 4,062 GB/s, 95.4% of copy, 1.92x eager
//   (6.083), 1.49x torch.compile (4.721), relL2 1.1e-7. What was tried around this design and not kept, with its
//   numbers: docs/softmax.md, "6_regcluster: what was tried". WINDOW (H200, 2026-11-23, `bench/softmax/sweep.py
//   --mode-ab`, ~6.4 GB per shape, copy_ interleaved): 131073 columns 3,784 GB/s (88.2% of copy_) against 2,742 for
//   the direct loads it replaced, 262147: 3,155 vs 2,288; at 131072 it is 3.5% behind BULK (3,830 vs 3,969).
//   TAILED (H200, 2026-11-23, `--tail-ab`): 196612 columns 3,913 GB/s (92.0% of copy_) in 4-CTA clusters against
//   3,168 in half-full 8-CTA ones; 393220: 3,821 vs 2,726; 786440: 2,993 vs 4_persistent's 2,614.
// What changed since (16-bit rows, the bf16 and fp16 modes): the element type is a template parameter. A thread's
//   unit is a group of 4 elements (a float4, or 8 bytes of bf16/fp16 read as a uint2 and widened to fp32), so the
//   slice, the registers and the ownership are the same in elements: 49152 per CTA, 8-CTA clusters at 393216
//   columns, a 96 KiB ring for a 16-bit row. Slices round to 16-byte granules (8 elements), so the bulk path needs
//   cols % 8 == 0 and the window pads up to 7 elements either side. No TAILED path for 16-bit rows (the tail keeps
//   fp32 e values in the row's slot, which a 16-bit slot cannot hold): such rows take the next cluster size up.
//   Three element types tripled the instantiations (a cold build of 103 s on the H100 host); the shipped build now
//   compiles the ticketed kernels only, the static row order being an A/B baseline (device pass for sm_90a on a
//   2-core host: 61.8 s with both orders, 30.7 s ticketed only).
// What changed since (16-bit exp): a 16-bit row moves half the bytes of an fp32 row for the same work per element,
//   so the per-element instructions weigh twice as much per byte: at 88.4% of copy the 16-bit path was the only
//   one under 90%. It now takes e = 2^(d log2 e) on the SFU's ex2.approx (one FMUL and one MUFU instead of expf's
//   ~8 instructions; exp_of below says why the rounded outputs stay PyTorch's) and converts two elements per
//   cvt: the 8-CTA bf16 path's PTX went from 2,690 to 1,724 instructions, the fp32 paths' PTX is unchanged. The
//   start stagger is now counted in bytes (half fp32's cycles at 16 bits). Two rows ahead in the ring, which 16-bit
//   slices leave room for, did not pay (`bench/softmax/sweep.py --half-ab`) and is an A/B build only.
// Measured, 16-bit exp: H100 80GB, 4096x393216, `python run.py --problem softmax --precision bf16` (2026-11-26,
//   copy 3,033 GB/s in the same run): 2.309 ms, 2,790 GB/s, 92.0% of copy, 1.88x eager (4.334), 1.55x
//   torch.compile (3.587), relL2 2.0e-3 (eager's 2.0e-3). `python -m bench.softmax.sweep --half-ab` (same day and
//   host kind): bf16 92.3% of copy_, fp16 2.294 ms, 92.7%; two rows ahead bf16 91.3%, fp16 92.6%.
// What changed since (staged 16-bit output): on the H200 the same 16-bit code ran at 77.5% of copy: at its bandwidth
//   a 16-bit row's memory time (5.5 us) is shorter than the row's reads, exp and stores in sequence (probes:
//   docs/softmax.md). Where HBM is fast for the SM count (peak > 30 GB/s an SM: the H200, not the H100), the output
//   is now written to a 96 KiB staging slice after the ring and sent by one bulk copy per chunk, so the SM goes on
//   to the next row while they drain (SO below; the slice is reused once the copies have read it). Elsewhere the
//   stores stay in registers: staging cost the H100 2.3 points (90.1% vs 92.4%).
// Measured, staged: H200, 4096x393216, `python run.py --problem softmax --precision bf16` (2026-11-26, copy 4,296
//   GB/s in the same run): 1.894 ms, 3,402 GB/s, 79.2% of copy, 1.69x eager (3.193), 1.69x torch.compile (3.206),
//   relL2 1.8e-3 (eager's 1.8e-3); fp16 1.860 ms, 80.7%, 1.71x eager, 1.67x torch.compile. Stores from registers
//   on the same H200: 1.938 ms, 77.5%. H100 the same day (the rule keeps registers): bf16 92.4% of copy_ (sweep).
#include <atomic>

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <c10/cuda/CUDACachingAllocator.h>

#include "../common/kp.cuh"
#include "online.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int THREADS = 512;
constexpr int V = 24;                                  // float4s per thread
constexpr int64_t SLICE = (int64_t)THREADS * V * 4;   // floats per CTA: 49152 (192 KiB)
constexpr int NCHUNK = 4;                              // prefetch ring: 4 chunks of 6 float4s per thread
constexpr int KPC = V / NCHUNK;                        // k-values (float4s per thread) per chunk
static_assert(V % NCHUNK == 0, "chunks must split the per-thread registers evenly");
// TAILED: a slice may run up to TAIL floats past the registers. Those stay in shared memory, in one of two buffers
// after the ring (by row parity: the next row's tail lands while this row's is still being used), TQ float4s per
// thread. Ring + 2 tails = 224 KiB, inside the 227 KiB a CTA may opt into.
constexpr int TAIL = 4096;
constexpr int TQ = TAIL / 4 / THREADS;
static_assert(TQ * 4 * THREADS == TAIL, "the tail must split evenly over the threads");

// Element types. T is the tensor's (float, bf16 or fp16); arithmetic is fp32 throughout. A thread's unit is a group
// of 4 consecutive elements (16 bytes of fp32, 8 of a 16-bit type), so the register slice, the ring and the
// ownership are the same in elements for every T. ALIGN<T>: elements per 16 bytes, the bulk copy's granule.
template <typename T>
constexpr int ALIGN = 16 / (int)sizeof(T);
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
// Group i of the elements at base (aligned to a group) as floats, and back (round to nearest even). Indexed
// through the vector type, as the float32 path always was: `*(float4*)(p + 4 * i)` made nvcc split each store
// into f32, f32, v2.f32 (PTX of the 8-CTA bulk path).
__device__ __forceinline__ float4 load4(const float* base, int i) { return reinterpret_cast<const float4*>(base)[i]; }
template <typename H>
__device__ __forceinline__ float4 load4(const H* base, int i) {
  const uint2 u = reinterpret_cast<const uint2*>(base)[i];
  const H* h = reinterpret_cast<const H*>(&u);
  return make_float4(to_f(h[0]), to_f(h[1]), to_f(h[2]), to_f(h[3]));
}
__device__ __forceinline__ void store4(float* base, int i, float4 v) { reinterpret_cast<float4*>(base)[i] = v; }
// 16-bit: two elements per conversion (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32), one 8-byte store.
__device__ __forceinline__ uint32_t bits(__nv_bfloat162 v) { return *reinterpret_cast<const uint32_t*>(&v); }
__device__ __forceinline__ uint32_t bits(__half2 v) { return *reinterpret_cast<const uint32_t*>(&v); }
__device__ __forceinline__ void store4(__nv_bfloat16* base, int i, float4 v) {
  reinterpret_cast<uint2*>(base)[i] =
      make_uint2(bits(__floats2bfloat162_rn(v.x, v.y)), bits(__floats2bfloat162_rn(v.z, v.w)));
}
__device__ __forceinline__ void store4(__half* base, int i, float4 v) {
  reinterpret_cast<uint2*>(base)[i] = make_uint2(bits(__floats2half2_rn(v.x, v.y)), bits(__floats2half2_rn(v.z, v.w)));
}

// e = exp(d), d = x - m <= 0 (or -inf, or NaN). fp32 rows: expf (~8 instructions, the fp32 result PyTorch gets).
// 16-bit rows: 2^(d log2 e) on the SFU's ex2.approx (one multiply and one MUFU): its relative error (~2^-22) and
// the product's rounding (|d| log2(e) 2^-24, under 1e-5 wherever exp(d) > 1e-38) sit far below the output's
// rounding (2^-9 bf16, 2^-12 fp16, relative), so the rounded outputs are PyTorch's but for rare ties; the
// instruction count per element roughly halves, which counts at 16 bits, where a row's bytes take half the time
// for the same work per element. Not the .ftz form: subnormal e stay (bf16 keeps fp32's exponent range).
template <typename T>
__device__ __forceinline__ float exp_of(float d) {
  if constexpr (sizeof(T) == 4) {
    return expf(d);
  } else {
    float r;
    asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"(d * 1.4426950408889634f));
    return r;
  }
}

__device__ __forceinline__ int64_t globaltimer() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return (int64_t)ns;
}

// Thread 0: groups [b, e) of the slice at xr (clipped to its n elements, a multiple of ALIGN<T>) into dst (where
// group b lands), completing on bar; an empty range still arrives, so the barrier's phase always completes. For a
// 16-bit T, b and e are even (chunk bounds, n / 4), so the copy stays in whole 16-byte granules.
template <typename T>
__device__ __forceinline__ void bulk_range(T* dst, uint64_t* bar, const T* xr, int n, int b, int e) {
  const int n4 = n >> 2;
  b = min(n4, b);
  e = min(n4, e);
  const uint32_t bytes = (uint32_t)((e - b) * 4 * (int)sizeof(T));
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic reads of dst before async writes
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(kp::smem_u32(bar)), "r"(bytes)
               : "memory");
  if (e > b)
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            kp::smem_u32(dst)),
        "l"(xr + 4 * b), "r"(bytes), "r"(kp::smem_u32(bar))
        : "memory");
}

// Chunk c of the ring: groups [c*KPC*TH, (c+1)*KPC*TH), exactly the registers k in [c*KPC, (c+1)*KPC) of every
// thread (TH: threads a CTA).
template <int TH, typename T>
__device__ __forceinline__ void prefetch(T* buf, uint64_t* bar, const T* xr, int n, int c) {
  bulk_range(buf + 4 * c * KPC * TH, bar, xr, n, c * KPC * TH, (c + 1) * KPC * TH);
}

// The tail (TAILED): float4s [SLICE/4, SLICE/4 + TAIL/4) into tail buffer tb.
template <typename T>
__device__ __forceinline__ void prefetch_tail(T* tb, uint64_t* bar, const T* xr, int n) {
  bulk_range(tb, bar, xr, n, (int)(SLICE / 4), (int)(SLICE / 4) + TAIL / 4);
}

// WINDOW mode: a slice whose start is not 16-byte aligned is read as the aligned window around it. shift = how many
// elements the window starts before the slice; the bulk copy takes `copied` elements (a multiple of A = ALIGN<T>:
// the window, cut at the last aligned 16 bytes that lie inside the tensor, so nothing past its end is read); window
// elements in [copied, shift + n) come from global memory one by one (at most A - 1, in the tensor's last row).
template <typename T>
struct Window {
  const T* w0;
  int shift, copied;
};
template <typename T>
__device__ __forceinline__ Window<T> window_of(const T* xr, int n, const T* xend) {
  constexpr int A = ALIGN<T>;
  const int shift = (int)((reinterpret_cast<uintptr_t>(xr) / sizeof(T)) & (A - 1));
  const T* w0 = xr - shift;
  const int wl = (shift + n + A - 1) & ~(A - 1);
  const int copied = w0 + wl <= xend ? wl : (int)((xend - w0) & ~(int64_t)(A - 1));
  return {w0, shift, copied};
}

__device__ __forceinline__ float& comp(float4& v, int c) { return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w; }

// Row order. Static (TICKET = false): cluster c takes rows c, c+G, c+2G, ... TICKET: rows 0..2G-1 go out statically
// (c and c+G), every later row by an atomic ticket that rank 0 draws two rows ahead and hands to its peers with the
// (m, s) exchange: a cluster that finishes early takes the next unclaimed row, so the clusters stay on neighbouring
// rows instead of drifting apart (the persistent-copy probe: 3,887 -> 4,011 GB/s on 120 SMs).
// TRACE (A/B only): ticket[1 + 16*cta ..] = globaltimer at start, after the stores of
// rows 0..5 and (ring, slot 7 + it % 6) of the last six rows are issued, at the end, and the rows this CTA did.
// MODE: BULK prefetches the next row's slice with TMA bulk copies (16-byte aligned rows: x, y, row stride, cols % 4);
// WINDOW the same for rows of any length, through the aligned window around each slice (x and y rows in the same
// phase mod 16 bytes); DIRECT loads the slice straight into registers, no prefetch (any layout; the A/B baseline).
enum Mode { DIRECT = 0, BULK = 1, WINDOW = 2 };

// What a CTA bulk-copies of the slice at xr: its window in WINDOW mode, the slice itself in BULK.
template <int MODE, typename T>
__device__ __forceinline__ Window<T> slice_window(const T* xr, int n, const T* xend) {
  return MODE == WINDOW ? window_of(xr, n, xend) : Window<T>{xr, 0, n};
}

// Group i of the current slice (window coordinates in WINDOW mode) from its staged copy, group j of b, as floats: -inf
// outside the slice (BULK: from n on; WINDOW: before lo and from hi on); window elements the bulk copy did not take
// (the tensor's last row) from global memory.
template <int MODE, typename T>
__device__ __forceinline__ float4 take(const T* b, int j, int i, int n, const Window<T>& cur, int lo, int hi) {
  const float4 ninf = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
  if (MODE == BULK) return 4 * i < n ? load4(b, j) : ninf;
  float4 r = 4 * i < cur.copied ? load4(b, j) : ninf;
  if (4 * i < lo || 4 * i + 4 > min(hi, cur.copied))  // only edge groups take the slow branch
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int e = 4 * i + q;
      comp(r, q) = e < lo || e >= hi ? -INFINITY : e < cur.copied ? comp(r, q) : to_f(cur.w0[e]);
    }
  return r;
}

// Group i of the output slice at yr: whole groups inside it, lane by lane at a WINDOW edge.
template <int MODE, typename T>
__device__ __forceinline__ void put(T* yr, int i, float4 v, int n, int lo, int hi) {
  if (MODE == WINDOW) {  // y's row is in x's phase (checked by the launcher): the same window, aligned groups
    T* yw = yr - lo;
    const int e0 = 4 * i;
    if (e0 >= lo && e0 + 4 <= hi) {
      store4(yw, i, v);
    } else if (e0 < hi) {
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (e0 + q >= lo && e0 + q < hi) yw[e0 + q] = from_f<T>(q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w);
    }
  } else if (4 * i < n) {
    store4(yr, i, v);
  }
}

template <typename T, int CL, int MODE, int D, bool TICKET, bool TAILED, bool TRACE = false, int PROBE = 0,
          bool SO = false, int TH = THREADS>
__global__ void __launch_bounds__(TH, THREADS / TH)
    softmax_regcluster(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols, int64_t xs,
                       int64_t chunk, unsigned long long* __restrict__ ticket, int64_t stagger) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* buf = reinterpret_cast<T*>(smem_raw);
  __shared__ float part[2][CL][2];
  __shared__ int64_t next2[2];  // the row two iterations ahead, written by rank 0 of the cluster into every peer
  __shared__ float scratch[64];
  __shared__ __align__(8) uint64_t bars[D][NCHUNK];  // ring slot s, chunk c filled
  __shared__ __align__(8) uint64_t tbars[2];  // TAILED: tail buffer p filled
  static_assert(!TAILED || MODE != DIRECT, "the tail is staged by the bulk copies");
  // The tail holds e = exp(x - m) in place of x: fp32 rows only (a 16-bit row's e would not fit its slot).
  static_assert(!TAILED || sizeof(T) == 4, "the tail is for float32 rows");
  static_assert(TH == THREADS || (!TAILED && !TRACE), "half-size CTAs: no tail, no trace");
  static_assert(D == 1 || (D == 2 && !TAILED && MODE != DIRECT), "two rows ahead: the bulk and window paths only");
  // SO: the output is staged in a slice of shared memory after the ring and leaves by bulk copies.
  static_assert(!SO || (MODE == BULK && D == 1 && !TAILED), "staged output: the one-row bulk path only");
  // D rows in the ring: row `it` is read from slot it % D; D = 2 keeps a 16-bit CTA's loads two rows deep.
  float* tbuf = reinterpret_cast<float*>(buf + SLICE);  // TAILED: tail buffers p = 0, 1 at tbuf + p * TAIL

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = (int)cluster.block_rank();
  const int64_t G = gridDim.x / CL;
  const int64_t first = blockIdx.x / CL;
  const int64_t c0 = kp::imin(cols, rank * chunk);
  const int n = (int)(kp::imin(cols, c0 + chunk) - c0);  // <= SLICE: 32-bit indices from here on (registers)
  const int t = threadIdx.x;

  const T* xend = x + (rows - 1) * xs + cols;  // WINDOW: no bulk read goes past the tensor's last element
  // Elements per ring slot (D = 2): the slice and the window's pad, a whole number of 16-byte granules.
  const int slot = (int)chunk + ALIGN<T>;
  T* obuf = buf + chunk;  // SO: the staged output slice (chunk is a whole number of 16-byte granules)
  if (MODE != DIRECT) {
    if (t == 0) {
      for (int s = 0; s < D; ++s)
        for (int c = 0; c < NCHUNK; ++c)
          asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(kp::smem_u32(&bars[s][c])));
      if (TAILED)
        for (int p = 0; p < 2; ++p) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(kp::smem_u32(&tbars[p])));
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      // Cluster c starts c * stagger SM cycles late, so that the clusters do not read, compute and store in
      // lockstep for the first rows (see the header: the convoy at the start cost ~20 us per call).
      if (stagger > 0 && first > 0) {
        const long long t0 = clock64();
        while (clock64() - t0 < first * stagger) {}
      }
      for (int s = 0; s < D; ++s)  // rows first, first + G, ... (the static start of the row order) into slot s
        if (first + s * G < rows) {
          const T* xr0 = x + (first + s * G) * xs + c0;
          const Window<T> w = slice_window<MODE>(xr0, n, xend);
          for (int c = 0; c < NCHUNK; ++c) prefetch<TH>(buf + s * slot, &bars[s][c], w.w0, w.copied, c);
          if constexpr (TAILED) prefetch_tail(tbuf, &tbars[0], w.w0, w.copied);
        }
    }
    __syncthreads();
  }

  if (TRACE && t == 0) ticket[1 + 16 * blockIdx.x] = (unsigned long long)globaltimer();
  float4 r[V];
  uint32_t it = 0;
  // ahead[j]: the row of iteration it + 1 + j; the first D + 1 rows of a cluster are static (first + k G).
  int64_t ahead[D];
#pragma unroll
  for (int j = 0; j < D; ++j) ahead[j] = first + (j + 1) * G;
  for (int64_t row = first; row < rows; ++it) {
    if (it == 0) kp::cluster_arrive_relaxed();  // matched by the wait before the first (m, s) exchange
    int64_t drawn = 0;  // the row of iteration it + D + 1; latency hidden under the row
    if (TICKET && rank == 0 && t == 0) drawn = (D + 1) * G + (int64_t)atomicAdd(ticket, 1ull);
    if (!TICKET)
#pragma unroll
      for (int j = 0; j < D; ++j) ahead[j] = row + (j + 1) * G;
    const int64_t nrow = ahead[D - 1];  // prefetched into this row's slot, chunk by chunk, as it empties
    T* sb = buf + (D == 1 ? 0 : (int)(it % D) * slot);
    const T* xr = x + row * xs + c0;
    T* yr = y + row * cols + c0;
    const Window<T> cur = slice_window<MODE>(xr, n, xend);
    const int lo = cur.shift, hi = cur.shift + n;  // the slice inside its window
    // 1. This row's slice into registers (-inf where the slice ends).
    if (MODE != DIRECT) {
      // Chunk by chunk, so the next row's chunk c is queued as soon as chunk c of this one is in registers: the
      // SM's loads never pause for a whole-slice copy.
#pragma unroll
      for (int c = 0; c < NCHUNK; ++c) {
        kp::mbar_wait(&bars[it % D][c], (it / D) & 1);
#pragma unroll
        for (int kk = 0; kk < KPC; ++kk) {
          const int k = c * KPC + kk, i = t + k * TH;
          r[k] = take<MODE>(sb, i, i, n, cur, lo, hi);  // window element e = slice element e - lo
        }
        __syncthreads();  // every thread has chunk c in registers: its buffer slot is free
        if (t == 0 && nrow < rows) {
          const T* xn = x + nrow * xs + c0;
          const Window<T> w = slice_window<MODE>(xn, n, xend);
          prefetch<TH>(sb, &bars[it % D][c], w.w0, w.copied, c);
          // The next row's tail goes to the other buffer, last read by the row before this one: every thread
          // has passed that row's output (the barrier above).
          if constexpr (TAILED)
            if (c == 0) prefetch_tail(tbuf + ((it + 1) & 1) * TAIL, &tbars[(it + 1) & 1], w.w0, w.copied);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int i = t + (4 * k + c) * TH;
          comp(r[k], c) = i < n ? to_f(xr[i]) : -INFINITY;
        }
    }
    // 2. CTA-local max, then e = exp(x - m) once per element, kept in registers (the tail: in its buffer, each
    // thread rewriting only its own float4s).
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < V; ++k) m = fmaxf(m, fmaxf(fmaxf(r[k].x, r[k].y), fmaxf(r[k].z, r[k].w)));
    float4* tb4 = reinterpret_cast<float4*>(tbuf + (it & 1) * TAIL) + t;  // this thread's tail float4s, q * TH apart
    if constexpr (TAILED) {
      kp::mbar_wait(&tbars[it & 1], (it >> 1) & 1);
#pragma unroll
      for (int q = 0; q < TQ; ++q) {
        const int i = (int)(SLICE / 4) + t + q * TH;
        const float4 v = take<MODE>(reinterpret_cast<const T*>(tb4), q * TH, i, n, cur, lo, hi);
        tb4[q * TH] = v;
        m = fmaxf(m, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
      }
    }
    m = kp::block_max(m, scratch);
    const float ms = m == -INFINITY ? 0.f : m;  // an all -inf slice: e = 0 (and NaN stays NaN)
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if constexpr (PROBE & 1) {  // A/B probe: a multiply where the exp was (the output is not softmax)
        r[k].x = (r[k].x - ms) * 1.4426950408889634f; r[k].y = (r[k].y - ms) * 1.4426950408889634f;
        r[k].z = (r[k].z - ms) * 1.4426950408889634f; r[k].w = (r[k].w - ms) * 1.4426950408889634f;
      } else {
        r[k].x = exp_of<T>(r[k].x - ms); r[k].y = exp_of<T>(r[k].y - ms);
        r[k].z = exp_of<T>(r[k].z - ms); r[k].w = exp_of<T>(r[k].w - ms);
      }
      s += (r[k].x + r[k].y) + (r[k].z + r[k].w);
    }
    if (TAILED)
#pragma unroll
      for (int q = 0; q < TQ; ++q) {
        float4 v = tb4[q * TH];
        v.x = expf(v.x - ms); v.y = expf(v.y - ms); v.z = expf(v.z - ms); v.w = expf(v.w - ms);
        tb4[q * TH] = v;
        s += (v.x + v.y) + (v.z + v.w);
      }
    s = kp::block_sum(s, scratch);
    // 3. Exchange (m, s) across the cluster; one barrier per row.
    if (it == 0) kp::cluster_wait();  // every CTA of the cluster has started: peers' shared memory is writable
    if (t < CL) {
      float* peer = cluster.map_shared_rank(&part[it & 1][0][0], t);
      peer[2 * rank] = m;
      peer[2 * rank + 1] = s;
    }
    if (TICKET && rank == 0 && t == 0)
      for (int q = 0; q < CL; ++q) *cluster.map_shared_rank(&next2[it & 1], q) = drawn;
    cluster.sync();
    if (TICKET) {  // next2 is read before the next barrier: the slot is reused at it + 2
      row = ahead[0];
#pragma unroll
      for (int j = 0; j + 1 < D; ++j) ahead[j] = ahead[j + 1];
      ahead[D - 1] = next2[it & 1];
    } else {
      row += G;
    }
    float M = -INFINITY, S = 0.f;
#pragma unroll
    for (int q = 0; q < CL; ++q) kp::online_merge(M, S, part[it & 1][q][0], part[it & 1][q][1]);
    float f;
    if (!(S == S) || M == -INFINITY) f = NAN;  // NaN / +inf somewhere, or an all -inf row: a NaN row
    else f = m == -INFINITY ? 0.f : expf(m - M) / S;
    // 4. Out.
    if constexpr (SO) {
      // Into the staging slice chunk by chunk, each chunk out by one bulk copy as soon as every thread has written
      // it; the slice was last read by the previous row's copies, waited for (reads only) before the first write.
      if (t == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      __syncthreads();
#pragma unroll
      for (int c = 0; c < NCHUNK; ++c) {
#pragma unroll
        for (int kk = 0; kk < KPC; ++kk) {
          const int k = c * KPC + kk, i = t + k * TH;
          if ((!(PROBE & 2) || f == 1234.5f) && 4 * i < n)
            store4(obuf, i, make_float4(r[k].x * f, r[k].y * f, r[k].z * f, r[k].w * f));
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic writes before the async reads
        __syncthreads();
        if (t == 0) {
          const int n4 = n >> 2, b = min(n4, c * KPC * TH), e = min(n4, (c + 1) * KPC * TH);
          if (e > b && (!(PROBE & 2) || f == 1234.5f))
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(yr + 4 * b),
                         "r"(kp::smem_u32(obuf + 4 * b)), "r"((uint32_t)((e - b) * 4 * (int)sizeof(T)))
                         : "memory");
          asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
      }
    } else if (MODE != DIRECT) {
      if (!(PROBE & 2) || f == 1234.5f)  // A/B probe 2: no stores (the guard is never true for a softmax row)
#pragma unroll
        for (int k = 0; k < V; ++k)
          put<MODE>(yr, t + k * TH, make_float4(r[k].x * f, r[k].y * f, r[k].z * f, r[k].w * f), n, lo, hi);
      if (TAILED)
#pragma unroll
        for (int q = 0; q < TQ; ++q) {
          const float4 v = tb4[q * TH];
          put<MODE>(yr, (int)(SLICE / 4) + t + q * TH, make_float4(v.x * f, v.y * f, v.z * f, v.w * f), n, lo,
                    hi);
        }
      // This thread's generic writes of its tail float4s before the bulk copy that refills the buffer two rows on.
      if (TAILED) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      if (MODE == BULK && TRACE && t == 0)
        ticket[1 + 16 * blockIdx.x + (it < 6 ? 1 + it : 7 + it % 6)] = (unsigned long long)globaltimer();
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int i = t + (4 * k + c) * TH;
          if (i < n) yr[i] = from_f<T>(comp(r[k], c) * f);
        }
    }
  }
  if (SO && t == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // the last rows' copies done
  if (TRACE && t == 0) {
    ticket[1 + 16 * blockIdx.x + 13] = (unsigned long long)globaltimer();
    ticket[1 + 16 * blockIdx.x + 14] = it;
  }
}

// Rows longer than 16 slices and tails: one block per row, online (max, sum) then the output pass (2 reads).
template <typename T>
__global__ void __launch_bounds__(1024) softmax_long(const T* __restrict__ x, T* __restrict__ y, int64_t cols,
                                                     int64_t xs) {
  __shared__ float scratch[64];
  const T* xr = x + (int64_t)blockIdx.x * xs;
  T* yr = y + (int64_t)blockIdx.x * cols;
  float m = -INFINITY, s = 0.f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) kp_softmax::absorb(m, s, to_f(xr[i]));
  kp::block_online(m, s, scratch);
  const float inv = 1.f / s;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = from_f<T>(kp_softmax::vout(to_f(xr[i]), m, inv));
}

// stagger < 0: the rule below. TRACE: trace is an int64 CUDA tensor (checked by the caller) that also holds the ticket.
template <typename T, int CL, int MODE, int D, bool TAILED, bool TRACE = false, int PROBE = 0, bool SO = false,
          int TH = THREADS>
void launch(const at::TensorBase& x, const at::TensorBase& y, int64_t chunk, bool ticket, int64_t stagger,
            const at::TensorBase* trace = nullptr) {
  // a trace needs the ticket (checked by the caller)
  auto kern = softmax_regcluster<T, CL, MODE, D, true, TAILED, TRACE, PROBE, SO, TH>;
#if KP_EXPERIMENTS  // the static row order is an A/B baseline: the shipped build compiles the ticketed kernels only
  if constexpr (!TRACE && !PROBE && TH == THREADS)
    if (!ticket) kern = softmax_regcluster<T, CL, MODE, D, false, TAILED, false, 0, SO>;
#else
  TORCH_CHECK(ticket, "softmax 6_regcluster: the static row order is an A/B hook (KP_EXPERIMENTS)");
#endif
  const int64_t rows = x.size(0), cols = x.size(1);
  const size_t smem = TAILED ? (size_t)(SLICE + 2 * TAIL) * 4
                      : SO             ? (size_t)2 * chunk * sizeof(T)
                      : D == 2         ? (size_t)2 * (chunk + ALIGN<T>) * sizeof(T)
                      : MODE == BULK   ? (size_t)chunk * sizeof(T)
                      : MODE == WINDOW ? (size_t)(chunk + ALIGN<T>) * sizeof(T)
                                       : 0;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  if (CL > 8) C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(TH);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = kp::stream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CL;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cfg.gridDim = dim3(CL);
  int clusters = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg));
  TORCH_CHECK(clusters > 0, "softmax 6_regcluster: a cluster of ", kp::num(CL), " CTAs with ",
              kp::num((long long)smem), " B of shared memory each cannot be scheduled on this GPU");
  const int64_t G = kp::imin(rows, clusters);
  // Start stagger (stagger < 0: this rule). Spread over G clusters it is about half a row period: a cluster's row
  // moves 2 * 4 * cols bytes at 1/G of ~4.2 TB/s, i.e. takes G * cols / 256 cycles at ~2 GHz. Measured at 393216
  // columns (fp32): 400..1600 cycles all gain the same; neutral at one row per cluster (15 rows), -16% time at 60
  // rows. In bytes, so a 16-bit row (half the period) starts half as staggered.
  if (stagger < 0) stagger = cols * (int64_t)sizeof(T) / 2048;
  cfg.gridDim = dim3((unsigned)(G * CL));
  if (TRACE)
    TORCH_CHECK(trace->numel() >= 1 + 16 * G * CL, "trace: needs 1 + 16 x ", kp::num(G * CL), " int64 elements (",
                kp::num(G * CL), " CTAs), got ", kp::num(trace->numel()));
  // The ticket counter: 8 bytes from torch's caching allocator, zeroed on this stream, freed right after the launch
  // is enqueued (the allocator hands it out again only to work ordered after it on this stream). A trace holds it
  // in its first element.
  unsigned long long* tk = nullptr;
  if (TRACE) tk = static_cast<unsigned long long*>(trace->data_ptr());
  else if (ticket)
    tk = static_cast<unsigned long long*>(
        c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(sizeof(*tk), cfg.stream));
  if (tk) C10_CUDA_CHECK(cudaMemsetAsync(tk, 0, sizeof(*tk), cfg.stream));
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kern, static_cast<const T*>(x.data_ptr()),
                                             static_cast<T*>(y.data_ptr()), rows, cols, x.stride(0), chunk, tk,
                                             stagger);
  if (tk && !TRACE) c10::cuda::CUDACachingAllocator::raw_delete(tk);
  C10_CUDA_CHECK(err);
}

template <typename T, int MODE, int D, bool TAILED, bool SO = false>
void launch_cl(int64_t cl, const at::TensorBase& x, const at::TensorBase& y, int64_t chunk, bool ticket,
               int64_t stagger, const at::TensorBase* trace) {
  switch (cl) {
    case 1: launch<T, 1, MODE, D, TAILED, false, 0, SO>(x, y, chunk, ticket, stagger); break;
    case 2: launch<T, 2, MODE, D, TAILED, false, 0, SO>(x, y, chunk, ticket, stagger); break;
    case 3: launch<T, 3, MODE, D, TAILED, false, 0, SO>(x, y, chunk, ticket, stagger); break;
    case 4: launch<T, 4, MODE, D, TAILED, false, 0, SO>(x, y, chunk, ticket, stagger); break;
    case 8:
#if KP_EXPERIMENTS
      if constexpr (MODE == BULK && D == 1 && !TAILED && sizeof(T) == 4)
        if (trace) {
          launch<T, 8, BULK, 1, false, true>(x, y, chunk, ticket, stagger, trace);
          break;
        }
#endif
      launch<T, 8, MODE, D, TAILED, false, 0, SO>(x, y, chunk, ticket, stagger);
      break;
    default: launch<T, 16, MODE, D, TAILED, false, 0, SO>(x, y, chunk, ticket, stagger); break;
  }
}

// The ring's depth: one row ahead. Two rows ahead (2 x 96 KiB) fits for 16-bit rows only and is an A/B build: it
// did not pay (H100, bf16 4096x393216: 91.3% of copy_ against 92.2% at one row; fp16 92.6% against 92.7%).
// depth 0: the rule; 1 or 2 force it.
// 16-bit bulk-path rows: the output staged in a slice of shared memory after the ring and sent out by bulk copies
// (the SM goes on while they drain), or stored straight from registers as fp32 rows are (their ring takes the shared
// memory). store: -1 the rule below, 0 straight, 1 staged. Staging paid where HBM is fast for the SM count and lost
// where it is not (`bench/softmax/sweep.py --half-ab`, bf16 / fp16 at 4096x393216, % of copy_, straight -> staged):
// H200 (peak 4.8 TB/s, 36 GB/s an SM) 77.4 -> 79.1 / 78.4 -> 80.7; H100 (3.35 TB/s, 25 GB/s an SM) 92.4 -> 90.1 /
// 92.7 -> 90.2. The rule: staged above 30 GB/s of peak bandwidth an SM (two devices measured, a threshold between).
bool staged_by_rule() {
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  static std::atomic<int> memo[64];  // 0 unknown, 1 staged, 2 straight (zero-initialised: static storage)
  std::atomic<int>& memo_v = memo[dev & 63];
  int v = memo_v.load(std::memory_order_relaxed);
  if (!v) {
    int khz = 0, bits = 0, sms = 0;
    const bool ok = cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && sms > 0;
    if (!ok) (void)cudaGetLastError();  // an attribute this driver lacks: straight stores, nothing left pending
    const double per_sm = ok ? 2.0 * khz * 1e3 * (bits / 8) / sms : 0.0;  // double data rate, bytes/s
    v = per_sm > 30e9 ? 1 : 2;
    memo_v.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

template <typename T, int MODE>
void launch_ring(int64_t depth, int64_t cl, const at::TensorBase& x, const at::TensorBase& y, int64_t chunk,
                 bool ticket, int64_t stagger, const at::TensorBase* trace, int64_t store = -1) {
#if KP_EXPERIMENTS
  if constexpr (sizeof(T) == 2 && MODE != DIRECT)
    if (depth == 2) return launch_cl<T, MODE, 2, false>(cl, x, y, chunk, ticket, stagger, trace);
#endif
  TORCH_CHECK(depth <= 1, "two rows ahead: an A/B build, for 16-bit rows on the bulk-copy paths");
  if constexpr (sizeof(T) == 2 && MODE == BULK) {
    if (store < 0 ? staged_by_rule() : store == 1)
      return launch_cl<T, MODE, 1, false, true>(cl, x, y, chunk, ticket, stagger, trace);
    return launch_cl<T, MODE, 1, false>(cl, x, y, chunk, ticket, stagger, trace);
  } else {
    TORCH_CHECK(store <= 0, "staged output: 16-bit rows on the bulk-copy path only");
    launch_cl<T, MODE, 1, false>(cl, x, y, chunk, ticket, stagger, trace);
  }
}

// The dispatcher behind the exports. cl = 0 picks the cluster size; 1, 2, 3, 4, 8 or 16 force it (A/B runs). Rows
// too long for 16 slices ignore cl. ticket: the dynamic row order (see the kernel); false is the static order of the
// earlier measurements. mode < 0: BULK where the rows allow it, else WINDOW, else DIRECT. trace: see
// softmax_forward_ab.
template <typename T>
void run_typed(const at::TensorBase& x, const at::TensorBase& y, int64_t cl, bool ticket, int64_t stagger,
               const at::TensorBase* trace, int64_t mode, int64_t depth, int64_t store) {
  constexpr int64_t A = ALIGN<T>;  // elements per 16 bytes
  if (trace)
    TORCH_CHECK(trace->is_cuda() && trace->scalar_type() == at::kLong && trace->is_contiguous(),
                "trace: a contiguous int64 CUDA tensor");
  const int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0 || cols == 0) return;
  c10::cuda::CUDAGuard guard(x.device());
  const uintptr_t xa = reinterpret_cast<uintptr_t>(x.data_ptr()), ya = reinterpret_cast<uintptr_t>(y.data_ptr());
  const bool bulk = xa % 16 == 0 && ya % 16 == 0 && x.stride(0) % A == 0 && cols % A == 0;
  // WINDOW: every row of y starts in the same phase (mod 16 bytes) as its row of x, so one aligned window serves
  // both; its A extra elements must fit the slice's registers (and tail).
  const bool phase = (ya - xa) % 16 == 0 && (x.stride(0) - cols) % A == 0;
  if (mode < 0) mode = bulk ? BULK : phase ? WINDOW : DIRECT;
  TORCH_CHECK(mode != BULK || bulk, "the bulk-copy path needs 16-byte aligned rows");
  TORCH_CHECK(mode != WINDOW || phase, "the window path needs x and y rows in the same phase");
  // Slices in whole 16-byte granules (4 floats, 8 16-bit elements), so every slice of a row has the row's phase.
  auto chunk_of = [&](int64_t c) { return ((cols + c - 1) / c + A - 1) / A * A; };
  const int64_t pad = mode == WINDOW ? A : 0;  // the window's extra elements
  // The smallest cluster whose slices (plus the window's pad) fit cap floats per CTA, or 0. 5..7 CTAs round up
  // to 8 and 9..15 to 16: 6 instead of 8 won 3.6% at 196612 columns but lost 8% at 262144 (how 6-CTA clusters pack
  // into the GPCs), and 5 and 7 spill 24-32 bytes (a spill costs ~3.5% here).
  auto smallest = [&](int64_t cap) -> int64_t {
    for (int64_t c : {1, 2, 3, 4, 8, 16})
      if (chunk_of(c) + pad <= cap) return c;
    return 0;
  };
  if (cl <= 0) {
    // Fuller slices mean less padding computed per byte moved and more clusters: 3 instead of 4 moved 2-10% more
    // (`bench/softmax/sweep.py --cl-ab`: 98308, 131072, 147456 columns). A row just past a multiple of the
    // registers' SLICE (e.g. 196612 = 4 x 49152 + 4) keeps the smaller cluster and a tail in shared memory rather
    // than part-empty slices in the next size up (`--tail-ab`, H200, GB/s: 196612 3,168 -> 3,913, 98308 3,638 ->
    // 3,889, 393220 2,726 -> 3,821). A window takes the tail only where it halves the cluster: 196613 2,480 ->
    // 2,956 (8 -> 4 CTAs), but 98309 3,207 -> 3,052 (3 -> 2).
    cl = smallest(SLICE);
    if (mode != DIRECT && sizeof(T) == 4) {  // the tail holds fp32 e values: float32 rows only
      const int64_t ct = smallest(SLICE + TAIL);
      if (ct && (!cl || (mode == BULK ? ct < cl : cl >= 2 * ct))) cl = ct;
    }
    if (!cl) {  // longer than 16 slices (and tails): one block per row, two reads
      TORCH_CHECK(!trace, "trace: the ticketed 8-CTA TMA path only");
      TORCH_CHECK(rows <= 2147483647LL, "too many rows for a 1-D grid: ", kp::num(rows));
      softmax_long<T><<<(unsigned)rows, 1024, 0, kp::stream()>>>(static_cast<const T*>(x.data_ptr()),
                                                                 static_cast<T*>(y.data_ptr()), cols, x.stride(0));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
  }
  TORCH_CHECK(cl == 1 || cl == 2 || cl == 3 || cl == 4 || cl == 8 || cl == 16,
              "cluster size must be 1, 2, 3, 4, 8 or 16");
  const int64_t chunk = chunk_of(cl);
  const bool tailed = chunk + pad > SLICE;
  TORCH_CHECK(chunk + pad <= SLICE + (mode == DIRECT || sizeof(T) != 4 ? 0 : TAIL), "a cluster of ", kp::num(cl),
              " CTAs is too small for rows of ", kp::num(cols));
  TORCH_CHECK(!trace || (cl == 8 && mode == BULK && ticket && !tailed), "trace: the ticketed 8-CTA TMA path only");
  if constexpr (sizeof(T) == 4) {
    if (mode == BULK && tailed) return launch_cl<T, BULK, 1, true>(cl, x, y, chunk, ticket, stagger, trace);
    if (mode == WINDOW && tailed) return launch_cl<T, WINDOW, 1, true>(cl, x, y, chunk, ticket, stagger, trace);
  }
  if (mode == BULK) launch_ring<T, BULK>(depth, cl, x, y, chunk, ticket, stagger, trace, store);
  else if (mode == WINDOW) launch_ring<T, WINDOW>(depth, cl, x, y, chunk, ticket, stagger, trace, store);
  else launch_ring<T, DIRECT>(depth, cl, x, y, chunk, ticket, stagger, trace, store);
}

// The element type's instance of the above: float32 rows, or (the bf16 and fp16 modes) 16-bit rows, read and
// written in their own dtype and computed in fp32.
void run(const at::TensorBase& x, const at::TensorBase& y, int64_t cl, bool ticket, int64_t stagger,
         const at::TensorBase* trace, int64_t mode = -1, int64_t depth = 0, int64_t store = -1) {
  kp::check_row_softmax_args(x, y, /*sixteen_bit=*/true);
  switch (x.scalar_type()) {
    case at::kBFloat16:
      TORCH_CHECK(!trace, "trace: float32 rows only");
      return run_typed<__nv_bfloat16>(x, y, cl, ticket, stagger, trace, mode, depth, store);
    case at::kHalf:
      TORCH_CHECK(!trace, "trace: float32 rows only");
      return run_typed<__half>(x, y, cl, ticket, stagger, trace, mode, depth, store);
    default: return run_typed<float>(x, y, cl, ticket, stagger, trace, mode, depth, store);
  }
}

}  // namespace

#if KP_EXPERIMENTS  // A/B hooks for the bench scripts; not in the shipped build
// cl = 0 picks the cluster size; 1, 2, 3, 4, 8 or 16 force it; ticket = false is the static row order (A/B runs).
KP_EXPORT void softmax_forward_cluster(const at::TensorBase& x, const at::TensorBase& y, int64_t cl, bool ticket) {
  run(x, y, cl, ticket, -1, nullptr);
}
#endif  // KP_EXPERIMENTS

KP_EXPORT void softmax_forward(const at::TensorBase& x, const at::TensorBase& y) { run(x, y, 0, true, -1, nullptr); }

#if KP_EXPERIMENTS  // A/B: the row load path forced (0 direct, no prefetch; 1 bulk copies; 2 window), cluster by rule
KP_EXPORT void softmax_forward_mode(const at::TensorBase& x, const at::TensorBase& y, int64_t mode) {
  TORCH_CHECK(mode >= 0 && mode <= 2, "mode: 0 direct, 1 bulk, 2 window");
  run(x, y, 0, true, -1, nullptr, mode);
}
#endif  // KP_EXPERIMENTS

#if KP_EXPERIMENTS  // A/B hooks for the bench scripts; not in the shipped build
// A/B: stagger in SM cycles per cluster index (-1: launch's rule); trace: int64[1 + 16 x CTAs] for the per-CTA stamps
// of the kernel's TRACE parameter (the ticketed 8-CTA TMA path only), or an empty tensor.
KP_EXPORT void softmax_forward_ab(const at::TensorBase& x, const at::TensorBase& y, const at::TensorBase& trace,
                                  int64_t stagger) {
  TORCH_CHECK(stagger >= -1 && stagger <= 100000, "stagger: -1 (rule) or 0..100000 cycles");
  run(x, y, 0, true, stagger, trace.numel() > 0 ? &trace : nullptr);
}
#endif  // KP_EXPERIMENTS


#if KP_EXPERIMENTS  // A/B: 16-bit rows' output staged in shared memory and sent by bulk copies (-1 rule, 1) or stored
// straight from registers (0), with the ring's depth (0 rule, 1 or 2 rows ahead; 2 for 16-bit rows only, stores
// straight)
KP_EXPORT void softmax_forward_store(const at::TensorBase& x, const at::TensorBase& y, int64_t store, int64_t depth) {
  TORCH_CHECK(store >= -1 && store <= 1, "store: -1 (rule), 0 straight from registers, 1 staged");
  TORCH_CHECK(depth >= 0 && depth <= 2, "depth: 0 (rule), 1 or 2 rows ahead");
  run(x, y, 0, true, -1, nullptr, -1, depth, store);
}

// A/B: half-size CTAs (256 threads with the same 24 groups each, two CTAs an SM, slices of 24576 elements, so
// clusters twice as large: 16 CTAs at 393216 columns), so that an SM holds two rows in different phases (one
// CTA's loads in flight while the other computes and stores). Bulk path, aligned rows of 8 x 24576 < cols <=
// 16 x 24576 only. store: 0 from registers, 1 staged (16-bit rows); depth 1 or 2 rows ahead (2: 16-bit, stores
// from registers).
template <typename T>
void launch_half_cta(const at::TensorBase& x, const at::TensorBase& y, int64_t chunk, int64_t store, int64_t depth) {
  constexpr int H = THREADS / 2;
  if constexpr (sizeof(T) == 2) {
    if (depth == 2) return launch<T, 16, BULK, 2, false, false, 0, false, H>(x, y, chunk, true, -1);
    if (store == 1) return launch<T, 16, BULK, 1, false, false, 0, true, H>(x, y, chunk, true, -1);
  }
  TORCH_CHECK(depth == 1 && store == 0, "half-size CTAs, float32 rows: one row ahead, stores from registers only");
  launch<T, 16, BULK, 1, false, false, 0, false, H>(x, y, chunk, true, -1);
}

KP_EXPORT void softmax_forward_half_cta(const at::TensorBase& x, const at::TensorBase& y, int64_t store,
                                        int64_t depth) {
  kp::check_row_softmax_args(x, y, /*sixteen_bit=*/true);
  TORCH_CHECK((store == 0 || store == 1) && (depth == 1 || depth == 2), "store: 0 or 1; depth: 1 or 2");
  const int64_t cols = x.size(1), half = SLICE / 2, A = 16 / (int64_t)x.element_size();
  TORCH_CHECK(cols > 8 * half && cols <= 16 * half && cols % A == 0 && x.stride(0) % A == 0 &&
                  reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(y.data_ptr()) % 16 == 0,
              "half-size CTAs: aligned rows of 8 x 24576 < cols <= 16 x 24576 only");
  if (x.size(0) == 0) return;
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t chunk = ((cols + 15) / 16 + A - 1) / A * A;
  switch (x.scalar_type()) {
    case at::kBFloat16: return launch_half_cta<__nv_bfloat16>(x, y, chunk, store, depth);
    case at::kHalf: return launch_half_cta<__half>(x, y, chunk, store, depth);
    default: return launch_half_cta<float>(x, y, chunk, store, depth);
  }
}

// A/B probes of the 16-bit 8-CTA bulk path (what bounds it): 1 a multiply in place of each exp, 2 no stores, 3 both;
// 0-3 with the output stored straight from registers, 4-7 the same staged. The output is not softmax but for 0 and
// 4; for timing only.
KP_EXPORT void softmax_forward_probe(const at::TensorBase& x, const at::TensorBase& y, int64_t probe) {
  kp::check_row_softmax_args(x, y, /*sixteen_bit=*/true);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.size(1) == 8 * SLICE && x.stride(0) == x.size(1) &&
                  reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(y.data_ptr()) % 16 == 0,
              "probe: contiguous aligned bf16 rows of 8 x 49152 columns only");
  c10::cuda::CUDAGuard guard(x.device());
  using B = __nv_bfloat16;
  switch (probe) {
    case 0: return launch<B, 8, BULK, 1, false>(x, y, SLICE, true, -1);
    case 1: return launch<B, 8, BULK, 1, false, false, 1>(x, y, SLICE, true, -1);
    case 2: return launch<B, 8, BULK, 1, false, false, 2>(x, y, SLICE, true, -1);
    case 3: return launch<B, 8, BULK, 1, false, false, 3>(x, y, SLICE, true, -1);
    case 4: return launch<B, 8, BULK, 1, false, false, 0, true>(x, y, SLICE, true, -1);
    case 5: return launch<B, 8, BULK, 1, false, false, 1, true>(x, y, SLICE, true, -1);
    case 6: return launch<B, 8, BULK, 1, false, false, 2, true>(x, y, SLICE, true, -1);
    case 7: return launch<B, 8, BULK, 1, false, false, 3, true>(x, y, SLICE, true, -1);
    default: TORCH_CHECK(false, "probe: 0..7");
  }
}
#endif  // KP_EXPERIMENTS
