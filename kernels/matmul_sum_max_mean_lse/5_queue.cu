// matmul_sum_max_mean_lse / 5_queue -- one work queue of W tiles and x dots, so the dots run while W still streams.
// Requires: sm_80 (no Hopper-only feature: built for whatever GPU it runs on)
// Record: an atomic-ticket work queue meant to remove 4_overlap's tail; slower (docs/linear_problems.md)
//
// Same algebra as 1_colsum_gemv (the forward is x @ W.sum(0) + b.sum(); see that file's header for why it is exact).
// What changed from 4_overlap (the idea; it did not pay, see Measured): there every CTA owned one 64-column tile for all O rows of W, so all 128 CTAs ended
//   their W stream together and only then did their x dots (1024 x 64 float->double converts each at 16/clk/SM),
//   the DRAM remainder rows and the `finish` kernel: a ~13 us tail after the read (4_overlap's trace: W + x 62.5 us,
//   span 75.2). Here the work is a queue of items taken by atomic ticket:
//     item 0             b.sum() -> bsum, then a release flag;
//     W units            (tile t, row band u), tile-major: column sums of TC columns over UR rows of W into a
//                        float64 partial; the tile's last unit to arrive (per-tile counter) adds the U partials in
//                        unit order into v[tile] and releases the tile;
//     dot units          (tile t, DR rows of x), tile-major: the x rows are loaded first, then the unit waits for
//                        tile t (acquire), dots them with v[tile] and adds 1 to its row block's counter; the unit
//                        that brings it to T (the number of tiles) finishes those DR rows: out = sum_t part + bsum.
//   Tiles complete one after another while later tiles still stream, so by the time the W units run out, the dots
//   of all but the last few tiles are done or running; the tail after the last W byte is one tile's reduction, one
//   dot unit and one row block's finish (no second kernel, no grid barrier). A CTA draws its next ticket when it
//   starts an item, so the atomic's latency hides under the item.
// Ownership and launch: persistent grid of min(items, SMs x resident CTAs) CTAs of 512 threads.
//   W unit: thread (cg, rg) = (tid % (TC/4), tid / (TC/4)) sums float4 column cg over rows r0 + rg + k*RG (CU loads
//   in flight); a shared-memory + shuffle reduction gives the unit's TC column sums.
//   dot unit: warp w owns rows i0 + w*DRW .. +DRW of the block; lane l owns float4 columns l, l + 32, ... of the
//   tile (all rows' loads issued before the wait); a transposed shuffle reduction leaves row j's dot in lane j.
// Bytes: 4*O*I + 4*B*I + 4*O (b) read once from DRAM, the minimum (288 MiB at the bench shape); float64 partials
//   through L2: 8*U*I (W units, 2 MiB) + 8*B*T (dots, 256 KiB), each written once and read once.
// Bound: memory (the W stream); what separates it from a plain read is the tail above and the per-unit bubble (a
//   W unit's loads drain before its reduction; the other CTAs keep DRAM busy meanwhile).
// Preconditions (checked, lse_common.cuh + here): float32 CUDA tensors on one device; W 2-D contiguous; x 2-D with
//   unit-stride rows and x.size(1) == W.size(1); b 1-D of W.size(0) (or empty); float64 scratch of at least
//   scratch_doubles() (the counters live at its front and are zeroed by a memset on the stream before the launch).
//   The float4 path needs 16-byte aligned W and x rows and I % 4 == 0; other layouts take guarded scalar loads
//   through the same queue.
// Numerics: every product and sum in float64 in a fixed order (unit partials in unit order, dot partials in tile
//   order): deterministic, one rounding to fp32 at the end.
// Deadlock freedom: every wait (tile ready, bsum ready) is on items with smaller tickets; a ticket is only ever held
//   by a running CTA, and a CTA only waits in a dot unit, whose prefetched next ticket is a dot unit too, so the
//   W units and item 0 never sit behind a wait. No co-residency assumption.
// Measured: H200, 1024x8192 @ 8192x8192, 2026-11-22, GPU time, L2 read-flushed, interleaved with 4_overlap in the
//   same process (python -m bench.matmul_sum_max_mean_lse.queue_ab, two machines): SLOWER than 4_overlap, so not the default; kept
//   as the measured record of the design. Chosen configuration (TC 512, every dot unit after every W unit,
//   256-row W units): 95.9 / 96.0 us = 3,150 GB/s of the 288 MiB minimum vs 4_overlap 79.0 / 79.5 us; a one-kernel
//   plain read of the same 288 MiB 70.2-70.7 us. Others (us): TC 256 99.3, TC 128 115.6, TC 256 with 2 CTAs/SM and
//   8 loads in flight 97.3 (interleaved: 111.9), TC 256 CU 8 103.5; dots interleaved 3 / 6 tiles behind their W
//   units 98.6 / 96.7, with 512-row units 101.0. Why (per-item globaltimer trace): the W units end at 73.5-87 us,
//   not at 4_overlap's ~62: every unit drains its loads before its reduction and counter (a bubble per 256-512 KiB),
//   units of one tile run on rows spread over the whole matrix, and a tile completes only with its slowest unit
//   (unit median 11.5 us, max 26-29); interleaved dot units then wait for their tile (median 14.5 us) and hold their
//   SM off the W stream. Dot units after the W units do not wait but are latency-bound (64 KiB of x in flight per
//   CTA; median 5.25 us per unit): 18 us from the last W unit to the last dot. Not tried: a TMA ring fed across
//   unit boundaries (no drain per unit), dot units with several blocks of x in flight.
#include "lse_common.cuh"

namespace {

using lse::Forward;

constexpr int FT = 512, NWARP = FT / 32;
constexpr int UMAX = 32;          // W units per tile at most: the unit partials take <= 32 * I doubles
constexpr int DR = 64, DRW = DR / NWARP;  // x rows per dot unit, per warp
static_assert(DRW == 4, "the dot reduction below is written for 4 rows per warp");

// Counters at the front of the scratch (int32 unless noted), zeroed before every launch.
struct Plan {
  int64_t O, I, B, xs, nb;
  int64_t T, U, UR, D;     // tiles, W units per tile, rows per W unit, dot units (row blocks) per tile
  int64_t nitems;          // 1 + T*U + T*D
  int64_t lag;             // dot units of tile t follow the W units of tile t + lag
  int64_t dbl_off;         // where the float64 partials start (doubles)
};

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Thread 0 spins on a flag set by another CTA; the barrier then orders the whole CTA's later reads after it.
__device__ __forceinline__ void wait_flag(const int* p) {
  if (threadIdx.x == 0)
    while (ld_acquire(p) == 0) __nanosleep(32);
  __syncthreads();
}

// Columns c..c+3 of a row: one float4 on the aligned path, else guarded scalars (zeros past n).
__device__ __forceinline__ float4 load4(const float* __restrict__ p, int64_t c, int64_t n, bool vec) {
  if (vec) return c < n ? __ldg(reinterpret_cast<const float4*>(p + c)) : make_float4(0.f, 0.f, 0.f, 0.f);
  float4 q;
  q.x = c < n ? p[c] : 0.f;
  q.y = c + 1 < n ? p[c + 1] : 0.f;
  q.z = c + 2 < n ? p[c + 2] : 0.f;
  q.w = c + 3 < n ? p[c + 3] : 0.f;
  return q;
}

template <int TC>
struct Shared;

// Every thread's partial writes are made visible, then thread 0 adds 1 to `counter`; returns the old count to the
// whole CTA (the unit that sees count - 1 is the last to arrive).
template <typename S>
__device__ __forceinline__ int arrive(int* counter, S& sh) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) sh.flag = atomicAdd(counter, 1);
  __syncthreads();
  return sh.flag;
}

template <int TC>
struct Shared {
  static constexpr int CG = TC / 4, RG = FT / CG;
  double red[RG][TC];
  double bred[NWARP];
  unsigned long long item;
  int flag;
};

// Item 0: b.sum() in a fixed order, then release.
template <int TC>
__device__ void bsum_unit(const Plan& p, const float* __restrict__ b, double* __restrict__ bsum, int* bflag,
                          Shared<TC>& sh) {
  double acc = 0.;
  for (int64_t k = threadIdx.x; k < p.nb; k += FT) acc += b[k];
  acc = kp::block_sum(acc, sh.bred);
  if (threadIdx.x == 0) {
    *bsum = acc;
    __threadfence();
    st_release(bflag, 1);
  }
}

template <int TC, int CU>
__device__ void w_unit(const Plan& p, int64_t t, int64_t u, const float* __restrict__ w, bool vec, double* wpart,
                       double* __restrict__ v, int* tilecnt, int* tileready, Shared<TC>& sh) {
  constexpr int CG = TC / 4, RG = FT / CG, TPC = FT / TC;  // threads per column in the reductions
  const int tid = threadIdx.x, cg = tid % CG, rg = tid / CG;
  const int64_t c = t * TC + 4 * cg;
  const int64_t r0 = u * p.UR, r1 = kp::imin(p.O, r0 + p.UR);
  double a[4] = {0., 0., 0., 0.};
  if (c < p.I && vec) {
#pragma unroll CU
    for (int64_t r = r0 + rg; r < r1; r += RG) {
      const float4 q = lse::load_w(w + r * p.I + c);
      a[0] += q.x; a[1] += q.y; a[2] += q.z; a[3] += q.w;
    }
  } else if (c < p.I) {
    for (int64_t r = r0 + rg; r < r1; r += RG) {
      const float4 q = load4(w + r * p.I, c, p.I, false);
      a[0] += q.x; a[1] += q.y; a[2] += q.z; a[3] += q.w;
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) sh.red[rg][4 * cg + k] = a[k];
  __syncthreads();
  // Column j = tid / TPC: TPC threads each add RG/TPC row groups, then a fixed shuffle tree (commutative pairs, so
  // every lane of the group holds the identical sum).
  const int j = tid / TPC, h = tid % TPC;
  double s = 0.;
#pragma unroll
  for (int k = 0; k < RG / TPC; ++k) s += sh.red[h * (RG / TPC) + k][j];
#pragma unroll
  for (int o = TPC / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const int64_t col = t * TC + j;
  if (h == 0 && col < p.I) wpart[u * p.I + col] = s;
  if (arrive(tilecnt + t, sh) != p.U - 1) return;
  // The tile's last unit: v[tile] = the U unit partials added in unit order (TPC threads per column take
  // consecutive unit ranges; the shuffle tree joins them in the same order every call).
  __threadfence();
  const int64_t per = (p.U + TPC - 1) / TPC, ua = kp::imin(p.U, h * per), ub = kp::imin(p.U, ua + per);
  double vs = 0.;
  if (col < p.I) {
#pragma unroll 8
    for (int64_t k = ua; k < ub; ++k) vs += __ldcg(wpart + k * p.I + col);
  }
#pragma unroll
  for (int o = 1; o < TPC; o <<= 1) {
    const double other = __shfl_xor_sync(0xffffffffu, vs, o);
    vs = (h & o) ? other + vs : vs + other;  // lower unit range on the left: same order on both lanes
  }
  if (h == 0 && col < p.I) v[col] = vs;
  __threadfence();
  __syncthreads();
  if (tid == 0) st_release(tileready + t, 1);
}

// 4 values per lane (rows 0..3 of the warp) -> lane l holds row (l & 3) summed over the warp.
__device__ __forceinline__ double reduce_rows4(double (&d)[4], int lane) {
  {
    const bool up = lane & 2;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const double send = up ? d[j] : d[j + 2], keep = up ? d[j + 2] : d[j];
      d[j] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
    }
  }
  {
    const bool up = lane & 1;
    const double send = up ? d[0] : d[1], keep = up ? d[1] : d[0];
    d[0] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
  }
  double s = d[0];
  s += __shfl_xor_sync(0xffffffffu, s, 4);
  s += __shfl_xor_sync(0xffffffffu, s, 8);
  s += __shfl_xor_sync(0xffffffffu, s, 16);
  return s;
}

template <int TC>
__device__ void dot_unit(const Plan& p, int64_t t, int64_t rb, const float* __restrict__ x, bool vec,
                         const double* v, double* rpart, const double* bsum, float* __restrict__ out,
                         const int* tileready, int* rowcnt, const int* bflag, Shared<TC>& sh) {
  constexpr int H = TC / 128;  // float4s per lane per row
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int64_t i0 = rb * DR + wid * DRW;
  float4 q[DRW][H];
#pragma unroll
  for (int r = 0; r < DRW; ++r)
#pragma unroll
    for (int hh = 0; hh < H; ++hh) {
      const int64_t i = i0 + r, c = t * TC + 4 * (lane + 32 * hh);
      q[r][hh] = i < p.B ? load4(x + i * p.xs, c, p.I, vec) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  wait_flag(tileready + t);
  double d[DRW] = {0., 0., 0., 0.};
#pragma unroll
  for (int hh = 0; hh < H; ++hh) {
    const int64_t c = t * TC + 4 * (lane + 32 * hh);
    double vv[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) vv[k] = c + k < p.I ? __ldcg(v + c + k) : 0.;
#pragma unroll
    for (int r = 0; r < DRW; ++r)
      d[r] += ((double)q[r][hh].x * vv[0] + (double)q[r][hh].y * vv[1]) +
              ((double)q[r][hh].z * vv[2] + (double)q[r][hh].w * vv[3]);
  }
  const double s = reduce_rows4(d, lane);
  if (lane < DRW && i0 + lane < p.B) rpart[(i0 + lane) * p.T + t] = s;
  if (arrive(rowcnt + rb, sh) != p.T - 1) return;
  // Every tile's dot for these DR rows has landed: finish them (a warp per row, tiles added in a fixed order).
  __threadfence();
  wait_flag(bflag);
  const double bs = __ldcg(bsum);
  for (int64_t i = rb * DR + wid; i < kp::imin(p.B, (rb + 1) * DR); i += NWARP) {
    double acc = 0.;
    for (int64_t k = lane; k < p.T; k += 32) acc += __ldcg(rpart + i * p.T + k);
    acc = kp::warp_sum(acc);
    if (lane == 0) out[i] = (float)(acc + bs);
  }
}

// Queue position idx (item - 1) -> (tile, unit or row block); true for a W unit. Blocks k = 0, 1, ...: the U W
// units of tile k (k < T), then the D dot units of tile k - lag (0 <= k - lag < T). Region 1: blocks before lag
// (W only); region 2: full blocks; region 3: the dots of the last lag tiles.
__device__ __forceinline__ bool decode(const Plan& p, int64_t idx, int64_t& t, int64_t& k) {
  const int64_t l1 = kp::imin(p.lag, p.T), n1 = l1 * p.U;
  if (idx < n1) { t = idx / p.U; k = idx % p.U; return true; }
  idx -= n1;
  const int64_t nb2 = p.T > p.lag ? p.T - p.lag : 0, n2 = nb2 * (p.U + p.D);
  if (idx < n2) {
    const int64_t blk = idx / (p.U + p.D), pos = idx % (p.U + p.D);
    if (pos < p.U) { t = p.lag + blk; k = pos; return true; }
    t = blk; k = pos - p.U; return false;
  }
  idx -= n2;
  t = nb2 + idx / p.D; k = idx % p.D;
  return false;
}

template <int TC, int CU, int MINB>
__global__ void __launch_bounds__(FT, MINB)
    queue_kernel(const float* __restrict__ w, const float* __restrict__ x, const float* __restrict__ b, Plan p,
                 bool vec, double* __restrict__ scratch, double* __restrict__ v, double* __restrict__ bsum,
                 float* __restrict__ out, int64_t* trace) {
  __shared__ Shared<TC> sh;
  int* ints = reinterpret_cast<int*>(scratch);
  unsigned long long* ticket = reinterpret_cast<unsigned long long*>(scratch);  // ints 0, 1
  int* bflag = ints + 2;
  int* tilecnt = ints + 4;
  int* tileready = tilecnt + p.T;
  int* rowcnt = tileready + p.T;
  double* wpart = scratch + p.dbl_off;
  double* rpart = wpart + p.U * p.I;
  if (threadIdx.x == 0) sh.item = atomicAdd(ticket, 1ull);
  __syncthreads();
  unsigned long long item = sh.item;
  while (item < (unsigned long long)p.nitems) {
    unsigned long long next = 0;
    if (threadIdx.x == 0) next = atomicAdd(ticket, 1ull);  // used only at the end of this item
    lse::stamp_at(trace, 2 * (int64_t)item);  // trace (A/B only): each item's start and end
    if (item == 0) {
      bsum_unit<TC>(p, b, bsum, bflag, sh);
    } else {
      int64_t t, k;
      if (decode(p, (int64_t)item - 1, t, k))
        w_unit<TC, CU>(p, t, k, w, vec, wpart, v, tilecnt, tileready, sh);
      else
        dot_unit<TC>(p, t, k, x, vec, v, rpart, bsum, out, tileready, rowcnt, bflag, sh);
    }
    lse::stamp_at(trace, 2 * (int64_t)item + 1);
    __syncthreads();
    if (threadIdx.x == 0) sh.item = next;
    __syncthreads();
    item = sh.item;
  }
}

template <int TC>
Plan make_plan(const Forward& f, int64_t lag, int64_t ur_min) {
  Plan p;
  p.O = f.O; p.I = f.I; p.B = f.B; p.xs = f.x.stride(0); p.nb = f.b.numel();
  p.T = std::max<int64_t>(1, (f.I + TC - 1) / TC);
  constexpr int RGc = FT / (TC / 4);
  // Units of >= ur_min rows, at most UMAX per tile, and U * I <= I + 2^24 doubles (what ModelNew's scratch holds
  // beyond the other rungs' needs at very wide I); rows per unit a multiple of the row-group count.
  int64_t U = std::max<int64_t>(1, std::min<int64_t>(UMAX, (f.O + ur_min - 1) / ur_min));
  if (f.I > 0) U = std::max<int64_t>(1, std::min<int64_t>(U, 1 + (int64_t(1) << 24) / f.I));
  int64_t UR = (f.O + U - 1) / U;
  UR = std::max<int64_t>(RGc, (UR + RGc - 1) / RGc * RGc);
  p.U = std::max<int64_t>(1, (f.O + UR - 1) / UR);
  p.UR = UR;
  p.D = (f.B + DR - 1) / DR;
  p.nitems = 1 + p.T * p.U + p.T * p.D;
  p.lag = std::min<int64_t>(lag, p.T);
  const int64_t nints = 4 + 2 * p.T + p.D;
  p.dbl_off = (nints + 3) / 4 * 2;  // ints rounded up to 16 bytes, in doubles
  return p;
}

int64_t scratch_need(const Plan& p) {
  return p.dbl_off + p.U * p.I + p.B * p.T;
}

template <int TC, int CU, int MINB>
void launch_forward(const Forward& f, int64_t lag, int64_t ur_min, int64_t* trace = nullptr, int64_t trace_items = 0) {
  const c10::cuda::CUDAGuard guard(f.w.device());
  const int dev = f.w.device().index();
  const Plan p = make_plan<TC>(f, lag, ur_min);
  lse::check_f64(f.partial, f.w, "partial", scratch_need(p));
  TORCH_CHECK(!trace || trace_items >= p.nitems, "trace needs 2 x ", kp::num(p.nitems), " elements");
  auto kernel = queue_kernel<TC, CU, MINB>;
  int occ = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, FT, 0));
  TORCH_CHECK(occ > 0, "5_queue: the kernel does not fit on an SM");
  const int64_t grid = std::min<int64_t>(p.nitems, (int64_t)occ * lse::sm_count(dev));
  double* scratch = f.partial.data_ptr<double>();
  C10_CUDA_CHECK(cudaMemsetAsync(scratch, 0, (size_t)p.dbl_off * sizeof(double), kp::stream()));
  kernel<<<(unsigned)grid, FT, 0, kp::stream()>>>(
      f.w.data_ptr<float>(), f.x.data_ptr<float>(), f.b.numel() ? f.b.data_ptr<float>() : nullptr, p, f.vec,
      scratch, f.v.data_ptr<double>(), f.bsum.data_ptr<double>(), f.out.data_ptr<float>(), trace);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

constexpr int TC_CHOSEN = 512, CU_CHOSEN = 16, MINB_CHOSEN = 1;
constexpr int64_t LAG_CHOSEN = int64_t(1) << 40, UR_CHOSEN = 256;  // lag past the last tile: dots after all W units
constexpr int GR = 2, GU = 2;  // cached GEMV (lse_common.cuh), as 2_inflight

}  // namespace

// Uncached forward: out = x @ W.sum(0) + b.sum(), filling v (I doubles) and bsum (1 double) on the way so a caller
// can cache them. partial: float64 scratch (see the header; ModelNew's allocation covers it).
KP_EXPORT void colsum_gemv_forward(const at::TensorBase& w, const at::TensorBase& b, const at::TensorBase& x,
                                   const at::TensorBase& partial, const at::TensorBase& v,
                                   const at::TensorBase& bsum, const at::TensorBase& out) {
  launch_forward<TC_CHOSEN, CU_CHOSEN, MINB_CHOSEN>(lse::check_forward(w, b, x, partial, v, bsum, out), LAG_CHOSEN,
                                                   UR_CHOSEN);
}

// Cached forward: out (B, 1) := x @ v + bsum with v, bsum from an earlier colsum_gemv_forward.
KP_EXPORT void gemv_bias(const at::TensorBase& x, const at::TensorBase& v, const at::TensorBase& bsum,
                         const at::TensorBase& out) {
  lse::launch_gemv<GR, GU>(x, v, bsum, out);
}

#if KP_EXPERIMENTS  // A/B hooks for the bench scripts; not in the shipped build
// A/B hook (bench/matmul_sum_max_mean_lse/queue_ab.py): cfg picks (TC, CU, CTAs per SM, dot lag, rows per W unit); trace: int64 of >= 2 x items (start/end
// globaltimer of every item), or empty.
KP_EXPORT void tune_forward(const at::TensorBase& w, const at::TensorBase& b, const at::TensorBase& x,
                            const at::TensorBase& partial, const at::TensorBase& v, const at::TensorBase& bsum,
                            const at::TensorBase& out, int64_t cfg, const at::TensorBase& trace) {
  const Forward f = lse::check_forward(w, b, x, partial, v, bsum, out);
  int64_t* tr = lse::trace_ptr(trace, 0, "2 x items (checked at launch)");
  const int64_t ti = trace.numel() / 2;
  constexpr int64_t END = int64_t(1) << 40;  // lag past the last tile: every dot unit after every W unit
  switch (cfg) {
    case 0: launch_forward<512, 16, 1>(f, 3, 256, tr, ti); break;
    case 1: launch_forward<512, 16, 1>(f, 3, 512, tr, ti); break;
    case 2: launch_forward<256, 16, 1>(f, 4, 256, tr, ti); break;
    case 3: launch_forward<512, 16, 1>(f, END, 256, tr, ti); break;
    case 4: launch_forward<256, 8, 2>(f, 4, 256, tr, ti); break;
    case 5: launch_forward<512, 16, 1>(f, 6, 256, tr, ti); break;
    default: TORCH_CHECK(false, "tune_forward: cfg 0..5, got ", kp::num(cfg));
  }
}
#endif  // KP_EXPERIMENTS
