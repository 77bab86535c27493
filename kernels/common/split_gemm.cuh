// split_gemm.cuh -- y = x @ W^T in fp32 accuracy on Hopper's fp16 tensor cores: split precision with per-row
// power-of-two scaling and fp32 promotion. Used by the `2_split_wgmma` rungs of matmul_gelu_softmax and
// gemm_bn_scale_softmax (their .cu files export thin wrappers; the epilogues stay those of rung 1).
//
// Why fp16 and not TF32: a 3-term split needs 11+11 significant bits per operand. TF32 and fp16 both carry 11 (10
//   stored + 1), but fp16 runs at twice TF32's tensor-core rate (989 vs 495 dense TFLOP/s on H100/H200) and moves half
//   the bytes. fp16's narrow exponent is what the per-row scale is for: row r of x (and of W) is multiplied by
//   s_r = 2^(14 - floor(log2 max|row|)), so its largest element lands in [2^14, 2^15) (fp16 max 65504). Then
//   hi = fp16(v s), lo = fp16(v s - hi): |v s - hi - lo| <= 2^-24 |v s| for every element >= 2^-17 of its row's max,
//   and an absolute 2^-25 (fp16's subnormal half-step) below that, i.e. <= 2^-39 of the row max. Powers of two make
//   the scaling and the unscaling (y *= 1/(s_m s_n) in the epilogue) exact.
// Products: x_hi W_hi + x_hi W_lo + x_lo W_hi (x_lo W_lo ~ 2^-22 relative, dropped). Each 11x11-bit product is exact
//   in the fp32 accumulator. The tensor core's accumulator truncates (measured on an H200: 1.9e-5 over K=8192 even with exact
//   inputs), so each 64-wide k-block's partial (12 wgmma k16 steps) is added into a separate fp32 register
//   accumulator ("promotion"); only 12 truncating adds ever touch a value before it is promoted.
// Opt-in reduced precision (NPROD = 1): x_hi W_hi only, ~TF32's 11 bits (relL2 ~ PyTorch TF32's). One product is a
//   plain fp16 GEMM, which harness.LinearGemm hands to cuBLAS (fp16 in, fp32 out) followed by split_unscale here:
//   this kernel at one product is L2-bound on its 128x128 tiles (0.29 ms vs cuBLAS's 0.18 at 1024x8192x8192).
//
// Kernel (split_gemm_kernel): C = A B^T, A = x split [M, Kp] fp16 x2, B = W split [N, Kp] fp16 x2, both K-major,
//   Kp = K rounded up to 8 (TMA strides are 16-byte multiples; the pad is zero).
//   CTA tile 128 x 128, k-block 64 (one 128-byte swizzled row per operand row), 384 threads:
//     warpgroup 0 = producer (one thread issues the TMA loads of a stage: A_hi, A_lo, B_hi, B_lo = 64 KiB),
//     warpgroups 1, 2 = consumers, each owns 64 rows x 128 cols: 64 fp32 tensor-core accumulator registers + 64
//     promoted fp32 registers per thread.
//   NSTAGE-deep ring of stages with full/empty mbarriers (TMA complete_tx fills "full"; the 8 consumer warps arrive
//   on "empty" once their wgmmas for the stage have completed).
//   Grid: one CTA per output tile, m-block fastest, so the 8 CTAs that share a W tile (M = 1024) run together and
//   W (2 x 128 MiB of fp16) is read from DRAM about once while x's split (32 MiB) stays in L2.
//   split_gemm_kernel<NPROD, CM, CN, DB>: the shipped build launches <NPROD, 1, 1, false> only; the cluster shapes
//   (CM x CN, TMA multicast) and the two accumulator sets (DB) are A/B configurations, see "Tried" below.
// Bytes: per CTA k-block 64 KiB of shared-memory fills for 3 x 128x128x64 FMAs (48 FMA/B); at the 1024x8192x8192
//   bench shape 8 x 64 tiles x 128 k-blocks x 64 KiB = 4.3 GB of L2->SM traffic, DRAM ~0.3 GB.
// Bound: tensor-core (3 fp16 GEMMs = 412 GFLOP) under the board's power limit (L2 traffic, 7.7 TB/s at 0.56 ms, is
//   not the bound: halving W's share by multicast changed nothing, see "Tried"): a kernel doing nothing but wgmma
//   needs 0.4455 ms for these FMAs as the judge times it (0.503 sustained), cuBLAS's fp16 GEMM 0.534
//   (tools/mma_probe.py; docs/linear_problems.md, "The tensor-core ceiling").
// Fallback: rows of x or of W that hold a NaN/Inf, or whose max is below 2^-100 (the scale would overflow), are
//   flagged by the split; split_gemm_fallback recomputes every output in a flagged row/column as a float64 dot
//   product of the original fp32 values (IEEE NaN/Inf propagation as in the reference), after the GEMM. When nothing
//   is flagged it costs one launch whose CTAs scan the flags and return (H200: 2-3 us; 14 us at a byte per load).
// Measured: H200, 1024x8192x8192 (bench/matmul_gelu_softmax/split_gemm_check.py, 2026-11-22, L2 flushed, interleaved): this kernel
//   0.570 ms for 3 products (723 TFLOP/s of fp16 work; cuBLAS HGEMM ~800 at 8192^3), 1 product 0.292 ms; the x
//   split 24 us; split3 end to end 0.593 ms at relL2 2.4e-7 vs cuBLAS SGEMM 2.696 ms at 1.6e-6, DGEMM 2.243 ms.
// Tried: TMA-multicast clusters and two accumulator sets per consumer (KP_EXPERIMENTS builds keep both;
//   bench/matmul_gelu_softmax/split_gemm_check.py --configs) were no faster: neither L2 traffic nor the wait before
//   each promotion bounds this kernel; the power-limited clock does. Figures: docs/linear_problems.md.
// Not done: a fused epilogue (bias/GELU or BN partials straight from the registers: saves one 32 MiB read, ~10 us), a
//   persistent tile scheduler.
#pragma once
#include <cuda.h>
#include <cuda_fp16.h>

#include "kp.cuh"

namespace kp {
namespace sg {
// Internal linkage: every extension that includes this header (one per problem) gets its own kernels, stubs and
// statics; nothing is shared or interposed between loaded modules.
namespace {

constexpr int BM = 128, BN = 128, BK = 64;
constexpr int THREADS = 384;
constexpr int TILE_BYTES_A = BM * BK * 2, TILE_BYTES_B = BN * BK * 2;

template <int NPROD>
struct Cfg {
  static constexpr int OPS = NPROD == 3 ? 2 : 1;  // hi (+ lo) per operand
  static constexpr int STAGE_BYTES = OPS * (TILE_BYTES_A + TILE_BYTES_B);
  static constexpr int NSTAGE = NPROD == 3 ? 3 : 6;  // 192 KiB of ring either way
  static constexpr int SMEM = NSTAGE * STAGE_BYTES + 1024 /* alignment slack */ + 256 /* barriers */;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred P1;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@!P1 bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int32_t c0, int32_t c1,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// The same load delivered to every CTA of the cluster in `mask` (bit r = cluster rank r): the data lands at the same
// shared-memory offset in each, and each one's mbarrier at the offset of `bar` gets the complete_tx.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const CUtensorMap* map, int32_t c0, int32_t c1,
                                                      uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
      : "memory");
}

// Arrive on the mbarrier at the shared-memory offset `bar` of cluster rank `rank` (this CTA's own included). The
// default .release.cta semantics: what it orders is this warp's completed wgmma reads of its own shared memory.
// (.release.cluster made every arrival a cluster-scope fence: one lane arriving on CM + CN - 1 barriers in a row
// cost ~1.4x per CTA of the cluster.)
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// wgmma shared-memory descriptor of a K-major tile written by TMA with 128-byte swizzle: rows of 128 bytes, 8-row
// core-matrix groups 1024 bytes apart (stride byte offset), swizzle mode 1 (128B). Advancing along K inside the
// 128-byte row is a plain +32 bytes per k16 step (the hardware applies the swizzle to the computed address).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Accumulator registers pass through an empty asm: the compiler may not move their reads or writes across it, so
// none lands between a wgmma's issue and the wait that completes it.
__device__ __forceinline__ void fence_acc(float (&a)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(a[i])::"memory");
}

#define KP_WGMMA_M64N128K16_F16(d, da, db, scale_d) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " \
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, " \
      "%64, %65, p, 1, 1, 0, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
      : "l"(da), "l"(db), "r"(static_cast<uint32_t>(scale_d)))

template <int NPROD, int CM, int CN, bool DB>
__global__ void __launch_bounds__(THREADS, 1)
    split_gemm_kernel(const __grid_constant__ CUtensorMap ta_hi, const __grid_constant__ CUtensorMap ta_lo,
                      const __grid_constant__ CUtensorMap tb_hi, const __grid_constant__ CUtensorMap tb_lo,
                      const float* __restrict__ inv_sa, const float* __restrict__ inv_sb, float* __restrict__ y,
                      int M, int N, int Kp) {
  using C = Cfg<NPROD>;
  extern __shared__ uint8_t smem_raw[];
  // TMA 128B-swizzled tiles must start on 1024-byte boundaries (the swizzle pattern repeats every 8 rows).
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t ring = smem_u32(smem);
  const uint32_t bars = ring + C::NSTAGE * C::STAGE_BYTES;  // full[s] at bars + 8 s, empty[s] at bars + 8 (NSTAGE + s)
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (C::NSTAGE + s); };
  // Stage layout: A_hi | B_hi | A_lo | B_lo (the lo tiles only for NPROD = 3).
  auto a_hi = [&](int s) { return ring + s * C::STAGE_BYTES; };
  auto b_hi = [&](int s) { return ring + s * C::STAGE_BYTES + TILE_BYTES_A; };
  auto a_lo = [&](int s) { return ring + s * C::STAGE_BYTES + TILE_BYTES_A + TILE_BYTES_B; };
  auto b_lo = [&](int s) { return ring + s * C::STAGE_BYTES + 2 * TILE_BYTES_A + TILE_BYTES_B; };

  // Cluster of CM x CN tiles (CM m-blocks that share a W tile, CN n-blocks that share an x tile; the grid is launched
  // as 1-D clusters of CM * CN CTAs, rank = cm + CM cn). Each CTA loads 1/CN of its A tile and 1/CM of its B tile
  // and multicasts them to the CTAs that share them, so L2 serves each tile once per cluster.
  constexpr int CL = CM * CN;
  uint32_t rank = 0;
  if (CL > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const int cm = rank % CM, cn = rank / CM;
  const int mblocks = (M + BM - 1) / BM;
  const int q = blockIdx.x / CL, mclusters = mblocks / CM;  // the host launches only when CM divides mblocks
  const int m0 = ((q % mclusters) * CM + cm) * BM, n0 = ((q / mclusters) * CN + cn) * BN;
  const int nk = (Kp + BK - 1) / BK;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::NSTAGE; ++s) {
      mbar_init(full(s), 1);
      // The 8 consumer warps of every CTA that writes into this one's stages (same cm or same cn).
      mbar_init(empty(s), 8 * (CM + CN - 1));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // No peer may multicast into a barrier before it is initialised.
  if (CL > 1) cluster_sync_all();
  else __syncthreads();

  if (wg == 0) {
    // With two accumulator sets a consumer thread needs ~200 registers: the producer warpgroup hands its share over
    // (128 x 40 + 256 x 232 <= 64K).
    if (DB) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) {
      constexpr int AR = BM / CN, BR = BN / CM;  // rows of the A / B tile this CTA loads
      uint16_t mask_a = 0, mask_b = static_cast<uint16_t>(((1u << CM) - 1) << (CM * cn));
      for (int j = 0; j < CN; ++j) mask_a |= static_cast<uint16_t>(1u << (cm + CM * j));
      const uint32_t a_off = cn * AR * 128, b_off = cm * BR * 128;  // 128-byte rows; multiples of 1024 B
      auto load = [&](uint32_t dst, const CUtensorMap* map, int k, int row, uint32_t bar, uint16_t mask, int share) {
        if (share > 1) tma_load_2d_multicast(dst, map, k, row, bar, mask);
        else tma_load_2d(dst, map, k, row, bar);
      };
      for (int kb = 0; kb < nk; ++kb) {
        const int s = kb % C::NSTAGE;
        // A fresh barrier is in phase 0; waiting for parity 1 ("the phase before") returns at once: the first
        // NSTAGE fills do not wait for consumers.
        mbar_wait(empty(s), ((kb / C::NSTAGE) & 1) ^ 1);
        mbar_expect_tx(full(s), C::STAGE_BYTES);  // the whole stage lands here, from this CTA and its peers
        load(a_hi(s) + a_off, &ta_hi, kb * BK, m0 + cn * AR, full(s), mask_a, CN);
        load(b_hi(s) + b_off, &tb_hi, kb * BK, n0 + cm * BR, full(s), mask_b, CM);
        if (NPROD == 3) {
          load(a_lo(s) + a_off, &ta_lo, kb * BK, m0 + cn * AR, full(s), mask_a, CN);
          load(b_lo(s) + b_off, &tb_lo, kb * BK, n0 + cm * BR, full(s), mask_b, CM);
        }
      }
    }
    if (CL > 1) cluster_sync_all();  // peers may still arrive on this CTA's barriers until they are done
    return;
  }

  if (DB) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int c = wg - 1;  // consumer 0: tile rows 0..63, consumer 1: rows 64..127
  const int warp = (threadIdx.x / 32) & 3, lane = threadIdx.x & 31;
  float acc[64], tot[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) tot[i] = 0.f;

  // The 12 (NPROD 3) or 4 wgmmas of k-block kb into `a`, one commit group.
  auto issue = [&](float(&a)[64], int kb) {
    const int s = kb % C::NSTAGE;
    mbar_wait(full(s), (kb / C::NSTAGE) & 1);
    const uint32_t ah = a_hi(s) + c * 64 * 128, bh = b_hi(s);
    fence_acc(a);
    wgmma_fence();
    if (NPROD == 3) {
      // The two small correction products first: the truncating accumulator is then small while they are added.
      const uint32_t al = a_lo(s) + c * 64 * 128, bl = b_lo(s);
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        KP_WGMMA_M64N128K16_F16(a, desc_sw128(ah + 32 * kk), desc_sw128(bl + 32 * kk), kk);
        KP_WGMMA_M64N128K16_F16(a, desc_sw128(al + 32 * kk), desc_sw128(bh + 32 * kk), 1);
      }
    }
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
      KP_WGMMA_M64N128K16_F16(a, desc_sw128(ah + 32 * kk), desc_sw128(bh + 32 * kk), (NPROD == 3 || kk > 0));
    wgmma_commit();
  };
  // After k-block kb's group has completed: free its stage, add its partial into the fp32 accumulator.
  auto retire = [&](float(&a)[64], int kb) {
    fence_acc(a);
    const int s = kb % C::NSTAGE;
    if (CL == 1) {
      if (lane == 0) mbar_arrive(empty(s));
    } else if (lane < CM + CN - 1) {
      // Release the stage in every CTA that writes into this one, a lane each: same cm (its A), same cn (its B).
      const int i = lane - CN;
      mbar_arrive_cluster(empty(s), lane < CN ? cm + CM * lane : (i < cm ? i : i + 1) + CM * cn);
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) tot[i] += a[i];
  };

  if (!DB) {
    for (int kb = 0; kb < nk; ++kb) {
      issue(acc, kb);
      wgmma_wait<0>();
      retire(acc, kb);
    }
  } else {
    // Two accumulator sets: k-block kb + 1's wgmmas run while kb's partial is promoted (wait_group 1).
    float acc2[64];
    issue(acc, 0);
    int kb = 1;
    for (; kb + 1 < nk; kb += 2) {
      issue(acc2, kb);
      wgmma_wait<1>();
      retire(acc, kb - 1);
      issue(acc, kb + 1);
      wgmma_wait<1>();
      retire(acc2, kb);
    }
    if (kb < nk) {
      issue(acc2, kb);
      wgmma_wait<1>();
      retire(acc, kb - 1);
      wgmma_wait<0>();
      retire(acc2, kb);
    } else {
      wgmma_wait<0>();
      retire(acc, kb - 1);
    }
  }

  // Accumulator fragment of m64nNk16: register 4j + {0,1} holds row warp*16 + lane/4, columns 8j + 2(lane%4) + {0,1};
  // 4j + {2,3} the same columns 8 rows further down.
  const int r0 = m0 + c * 64 + warp * 16 + lane / 4;
  const bool vec = (N % 2) == 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + 8 * h;
    if (r >= M) continue;
    const float sa = inv_sa[r];
    float* yr = y + static_cast<int64_t>(r) * N;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int col = n0 + 8 * j + 2 * (lane % 4);
      const float v0 = tot[4 * j + 2 * h] * sa, v1 = tot[4 * j + 2 * h + 1] * sa;
      if (vec && col + 1 < N) {
        *reinterpret_cast<float2*>(yr + col) = make_float2(v0 * inv_sb[col], v1 * inv_sb[col + 1]);
      } else {
        if (col < N) yr[col] = v0 * inv_sb[col];
        if (col + 1 < N) yr[col + 1] = v1 * inv_sb[col + 1];
      }
    }
  }
  if (CL > 1) cluster_sync_all();  // this CTA's last arrivals on its peers' barriers are in before any of them exits
}

// Per-row scale of the split: the largest finite |v| lands in [2^14, 2^15). Rows holding NaN/Inf, or whose max is
// so small that the scale would overflow (< 2^-100), are flagged: their hi/lo are zeroed (inv 0) and
// split_gemm_fallback recomputes their outputs.
struct RowScale {
  float s, inv;
  uint8_t bad;
};
__device__ __forceinline__ RowScale row_scale(float mx, int nonfinite) {
  const int e = mx > 0.f ? ilogbf(mx) : 0;
  const bool bad = nonfinite || (mx > 0.f && e < -100);
  return {bad ? 0.f : ldexpf(1.f, 14 - e), bad ? 0.f : ldexpf(1.f, e - 14), static_cast<uint8_t>(bad)};
}

__device__ __forceinline__ void split8(const float* v, float s, __half* hr, __half* lr, int64_t k0) {
  __align__(16) __half h8[8], l8[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float t = v[i] * s;
    h8[i] = __float2half_rn(t);
    l8[i] = __float2half_rn(t - __half2float(h8[i]));
  }
  *reinterpret_cast<uint4*>(hr + k0) = *reinterpret_cast<const uint4*>(h8);
  if (lr) *reinterpret_cast<uint4*>(lr + k0) = *reinterpret_cast<const uint4*>(l8);
}

// Any strides, any K: one CTA per row (grid-stride), the row read twice (the second time from L1/L2).
__global__ void __launch_bounds__(256) split_rows_kernel(const float* __restrict__ x, int64_t s0, int64_t s1,
                                                         int64_t R, int64_t K, int64_t Kp, __half* __restrict__ hi,
                                                         __half* __restrict__ lo, float* __restrict__ inv_scale,
                                                         uint8_t* __restrict__ flag) {
  __shared__ float scratch[64];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const float* xr = x + r * s0;
    float mx = 0.f;
    int nonfinite = 0;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
      const float v = fabsf(xr[k * s1]);
      if (v <= 3.402823466e38f) mx = fmaxf(mx, v);
      else nonfinite = 1;  // NaN or Inf
    }
    nonfinite = __syncthreads_or(nonfinite);
    mx = block_max(mx, scratch);
    const RowScale rs = row_scale(mx, nonfinite);
    if (threadIdx.x == 0) {
      inv_scale[r] = rs.inv;
      flag[r] = rs.bad;
    }
    for (int64_t k0 = 8 * static_cast<int64_t>(threadIdx.x); k0 < Kp; k0 += 8 * blockDim.x) {
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = k0 + i < K ? xr[(k0 + i) * s1] : 0.f;
      split8(v, rs.s, hi + r * Kp, lo ? lo + r * Kp : nullptr, k0);
    }
  }
}

// Contiguous 16-byte-aligned rows with K % 8 == 0 and K <= 2048 CH: the row stays in registers (CH chunks of 8
// floats per thread, two float4 loads each), one read and one write of every element.
template <int CH>
__global__ void __launch_bounds__(256) split_rows_vec_kernel(const float* __restrict__ x, int64_t s0, int64_t R,
                                                             int64_t K, __half* __restrict__ hi,
                                                             __half* __restrict__ lo, float* __restrict__ inv_scale,
                                                             uint8_t* __restrict__ flag) {
  __shared__ float scratch[64];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const float4* xr = reinterpret_cast<const float4*>(x + r * s0);
    float v[CH][8];
    float mx = 0.f;
    int nonfinite = 0;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const int64_t k0 = 8 * (threadIdx.x + static_cast<int64_t>(c) * blockDim.x);
      if (k0 < K) {
        const float4 p = __ldg(xr + k0 / 4), q = __ldg(xr + k0 / 4 + 1);
        const float t[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          v[c][i] = t[i];
          const float a = fabsf(t[i]);
          if (a <= 3.402823466e38f) mx = fmaxf(mx, a);
          else nonfinite = 1;
        }
      }
    }
    nonfinite = __syncthreads_or(nonfinite);
    mx = block_max(mx, scratch);
    const RowScale rs = row_scale(mx, nonfinite);
    if (threadIdx.x == 0) {
      inv_scale[r] = rs.inv;
      flag[r] = rs.bad;
    }
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const int64_t k0 = 8 * (threadIdx.x + static_cast<int64_t>(c) * blockDim.x);
      if (k0 < K) split8(v[c], rs.s, hi + r * K, lo ? lo + r * K : nullptr, k0);
    }
  }
}

// y[m, n] *= inv_a[m] * inv_b[n] in place, in that order (as split_gemm_kernel's store: powers of two, exact but
// for under/overflow): the unscaling after a GEMM of the scaled halves done elsewhere (cuBLAS's fp16 GEMM with fp32
// output in the one-product mode). float4 over rows whose length is a multiple of 4; else one element per thread.
__global__ void __launch_bounds__(256) unscale_kernel(float* __restrict__ y, const float* __restrict__ ia,
                                                      const float* __restrict__ ib, int64_t M, int64_t N) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (N % 4 == 0) {
    float4* y4 = reinterpret_cast<float4*>(y);
    const int64_t n4 = N / 4;
    for (int64_t i = first; i < M * n4; i += stride) {
      const int64_t m = i / n4, n = 4 * (i - m * n4);
      const float a = ia[m];
      float4 v = y4[i];
      v.x = v.x * a * ib[n];
      v.y = v.y * a * ib[n + 1];
      v.z = v.z * a * ib[n + 2];
      v.w = v.w * a * ib[n + 3];
      y4[i] = v;
    }
  } else {
    for (int64_t i = first; i < M * N; i += stride) {
      const int64_t m = i / N;
      y[i] = y[i] * ia[m] * ib[i - m * N];
    }
  }
}

// Outputs of flagged rows of x / rows of W (output columns), as float64 dot products of the original values.
__global__ void __launch_bounds__(256) split_gemm_fallback(const float* __restrict__ x, int64_t xs0, int64_t xs1,
                                                           const float* __restrict__ w, int64_t ws0, int64_t ws1,
                                                           const uint8_t* __restrict__ fa,
                                                           const uint8_t* __restrict__ fb, float* __restrict__ y,
                                                           int64_t M, int64_t N, int64_t K) {
  // Nothing flagged is the common case: every CTA scans the M + N flags and returns. 16 flags per load, all of a
  // thread's loads issued before the first is used (a byte per load made this scan ~14 us of L2 round trips).
  unsigned any = 0;
  auto scan = [&](const uint8_t* f, int64_t n) {
    const int64_t n16 = reinterpret_cast<uintptr_t>(f) % 16 == 0 ? n / 16 : 0;
    const uint4* f4 = reinterpret_cast<const uint4*>(f);
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < n16; i += blockDim.x) {
      const uint4 v = f4[i];
      any |= v.x | v.y | v.z | v.w;
    }
    for (int64_t i = 16 * n16 + threadIdx.x; i < n; i += blockDim.x) any |= f[i];
  };
  scan(fa, M);
  scan(fb, N);
  if (!__syncthreads_or(any != 0)) return;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t nthreads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  auto dot = [&](int64_t m, int64_t n) {
    double acc = 0.0;
    for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(x[m * xs0 + k * xs1]) * w[n * ws0 + k * ws1];
    y[m * N + n] = static_cast<float>(acc);
  };
  for (int64_t m = 0; m < M; ++m)
    if (fa[m])
      for (int64_t n = tid; n < N; n += nthreads) dot(m, n);
  for (int64_t n = 0; n < N; ++n)
    if (fb[n])
      for (int64_t m = tid; m < M; m += nthreads)
        if (!fa[m]) dot(m, n);
}


// ---- host side ----

// inv_scale / flag of the R rows of src (a 2-D tensor), as split_rows writes them.
inline void check_scales(const at::TensorBase& src, const at::TensorBase& inv, const at::TensorBase& flag,
                         const char* what) {
  const int64_t R = src.size(0);
  check_same_device(src, inv, what);
  check_same_device(src, flag, what);
  TORCH_CHECK(inv.scalar_type() == at::kFloat && inv.dim() == 1 && inv.size(0) == R && inv.is_contiguous(), what,
              ": inv_scale must be a contiguous float32 [", num(R), "]");
  TORCH_CHECK(flag.scalar_type() == at::kByte && flag.dim() == 1 && flag.size(0) == R && flag.is_contiguous(), what,
              ": flag must be a contiguous uint8 [", num(R), "]");
}

// After the GEMM (split_gemm's own, or one done elsewhere): the float64 recompute of flagged rows and columns.
inline void launch_fallback(const at::TensorBase& x, const at::TensorBase& w, const at::TensorBase& flag_a,
                            const at::TensorBase& flag_b, const at::TensorBase& y, int sms) {
  split_gemm_fallback<<<2 * sms, 256, 0, stream()>>>(x.data_ptr<float>(), x.stride(0), x.stride(1),
                                                     w.data_ptr<float>(), w.stride(0), w.stride(1),
                                                     flag_a.data_ptr<uint8_t>(), flag_b.data_ptr<uint8_t>(),
                                                     y.data_ptr<float>(), x.size(0), w.size(0), x.size(1));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// lo may be empty: the tf32 mode (nprod = 1) neither writes nor reads it.
inline void check_split(const at::TensorBase& src, const at::TensorBase& hi, const at::TensorBase& lo,
                        const at::TensorBase& inv, const at::TensorBase& flag, const char* what) {
  check_f32_cuda(src, what);
  TORCH_CHECK(src.dim() == 2, what, " must be 2-D");
  const int64_t R = src.size(0), K = src.size(1), Kp = (K + 7) / 8 * 8;
  for (const at::TensorBase* t : {&hi, &lo}) {
    if (t == &lo && lo.numel() == 0) continue;
    check_same_device(src, *t, what);
    TORCH_CHECK(t->scalar_type() == at::kHalf && t->dim() == 2 && t->size(0) == R && t->size(1) == Kp &&
                    t->is_contiguous(),
                what, ": hi/lo must be contiguous float16 [", num(R), ", ", num(Kp), "] (K rounded up to 8)");
  }
  check_scales(src, inv, flag, what);
}

// hi/lo/inv_scale/flag of a 2-D float32 tensor (any strides) -- the split of x per call, of W once per weight.
inline void split_rows(const at::TensorBase& src, const at::TensorBase& hi, const at::TensorBase& lo,
                       const at::TensorBase& inv, const at::TensorBase& flag) {
  check_split(src, hi, lo, inv, flag, "split_rows");
  const int64_t R = src.size(0), K = src.size(1);
  if (R == 0) return;
  c10::cuda::CUDAGuard guard(src.device());
  const int blocks = static_cast<int>(imin(R, 65535));
  const float* x = src.data_ptr<float>();
  __half* h = reinterpret_cast<__half*>(hi.data_ptr());
  __half* l = lo.numel() ? reinterpret_cast<__half*>(lo.data_ptr()) : nullptr;
  const bool vec = K > 0 && K % 8 == 0 && K <= 4 * 2048 && (K == 1 || src.stride(1) == 1) &&
                   src.stride(0) % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (vec) {
    const int ch = static_cast<int>((K + 2047) / 2048);
    auto go = [&](auto kern) {
      kern<<<blocks, 256, 0, stream()>>>(x, src.stride(0), R, K, h, l, inv.data_ptr<float>(),
                                         flag.data_ptr<uint8_t>());
    };
    if (ch == 1) go(split_rows_vec_kernel<1>);
    else if (ch == 2) go(split_rows_vec_kernel<2>);
    else if (ch == 3) go(split_rows_vec_kernel<3>);
    else go(split_rows_vec_kernel<4>);
  } else {
    split_rows_kernel<<<blocks, 256, 0, stream()>>>(x, src.stride(0), src.stride(1), R, K, hi.size(1), h, l,
                                                     inv.data_ptr<float>(), flag.data_ptr<uint8_t>());
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// cuTensorMapEncodeTiled through the runtime's driver entry point: no -lcuda at link time.
inline CUtensorMap encode_map(const at::TensorBase& t, int box_rows) {
  using Fn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                          const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                          CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    C10_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    TORCH_CHECK(p != nullptr && q == cudaDriverEntryPointSuccess, "cuTensorMapEncodeTiled is not available");
    return reinterpret_cast<Fn>(p);
  }();
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(t.size(1)), static_cast<cuuint64_t>(t.size(0))};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(t.size(1)) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(BK), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = fn(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, t.data_ptr(), dims, strides, box, estr,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (", num(static_cast<long long>(r)), ")");
  return map;
}

// One configuration's launch. The shipped build has (1, 1, one accumulator set) only; the header's "Tried" says why.
template <int NPROD, int CM, int CN, bool DB>
void launch_split_gemm_cl(const CUtensorMap& ah, const CUtensorMap& al, const CUtensorMap& bh, const CUtensorMap& bl,
                          const float* ia, const float* ib, float* y, int M, int N, int Kp) {
  using C = Cfg<NPROD>;
  auto kern = split_gemm_kernel<NPROD, CM, CN, DB>;
  // Set on every launch (a driver call of ~1 us): it is per device, and a function-local "done" flag would be
  // one flag per process -- static locals of inline functions are unified across loaded extensions (GNU_UNIQUE),
  // which on the H200 left the second problem's copy of this kernel without the attribute ("invalid argument").
  C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
  const int grid = ((M + BM - 1) / BM) * ((N + BN - 1) / BN);
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CM * CN;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = C::SMEM;
  cfg.stream = stream();
  cfg.attrs = attr;
  cfg.numAttrs = CM * CN > 1 ? 1 : 0;  // a 1x1 shape launches as a plain grid
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, ah, al, bh, bl, ia, ib, y, M, N, Kp));
}

template <int NPROD>
void launch_split_gemm(const at::TensorBase& a_hi, const at::TensorBase& a_lo, const at::TensorBase& b_hi,
                       const at::TensorBase& b_lo, const float* ia, const float* ib, float* y, int M, int N, int Kp,
                       int cm, int cn, int db) {
  const int mblocks = (M + BM - 1) / BM, nblocks = (N + BN - 1) / BN;
  if (cm < 0) cm = cn = 1;
  if (db < 0) db = 0;
  TORCH_CHECK(mblocks % cm == 0 && nblocks % cn == 0, "split_gemm: a ", num(cm), " x ", num(cn),
              " cluster does not tile ", num(mblocks), " x ", num(nblocks), " blocks");
  // Each CTA's share of a tile is a box of its own: 128/cn rows of A, 128/cm of B.
  const CUtensorMap ah = encode_map(a_hi, BM / cn), bh = encode_map(b_hi, BN / cm);
  const CUtensorMap al = NPROD == 3 ? encode_map(a_lo, BM / cn) : ah, bl = NPROD == 3 ? encode_map(b_lo, BN / cm) : bh;
  auto go = [&](auto k) { k(ah, al, bh, bl, ia, ib, y, M, N, Kp); };
  if (cm == 1 && cn == 1 && !db) go(launch_split_gemm_cl<NPROD, 1, 1, false>);
#if KP_EXPERIMENTS
  else if (cm == 1 && cn == 1) go(launch_split_gemm_cl<NPROD, 1, 1, true>);
  else if (cm == 2 && cn == 1 && !db) go(launch_split_gemm_cl<NPROD, 2, 1, false>);
  else if (cm == 2 && cn == 1) go(launch_split_gemm_cl<NPROD, 2, 1, true>);
  else if (cm == 4 && cn == 1 && !db) go(launch_split_gemm_cl<NPROD, 4, 1, false>);
  else if (cm == 2 && cn == 2 && !db) go(launch_split_gemm_cl<NPROD, 2, 2, false>);
  else if (cm == 8 && cn == 1 && !db) go(launch_split_gemm_cl<NPROD, 8, 1, false>);
#endif
  else TORCH_CHECK(false, "split_gemm: no ", num(cm), " x ", num(cn), " cluster",
                   db ? " with two accumulator sets" : "", " in this build");
}

// y[M, N] = x[M, K] @ w[N, K]^T from the splits of x (a_*) and w (b_*); nprod 3 = fp32 accuracy, 1 = TF32-like.
// x and w are the original fp32 tensors, read only for flagged rows/columns.
inline void split_gemm(const at::TensorBase& a_hi, const at::TensorBase& a_lo, const at::TensorBase& inv_a,
                       const at::TensorBase& flag_a, const at::TensorBase& b_hi, const at::TensorBase& b_lo,
                       const at::TensorBase& inv_b, const at::TensorBase& flag_b, const at::TensorBase& x,
                       const at::TensorBase& w, const at::TensorBase& y, int64_t nprod, int cm = -1, int cn = -1,
                       int db = -1) {
  TORCH_CHECK(nprod == 1 || nprod == 3, "split_gemm: nprod must be 1 or 3, got ", num(nprod));
  check_split(x, a_hi, a_lo, inv_a, flag_a, "split_gemm (x)");
  check_split(w, b_hi, b_lo, inv_b, flag_b, "split_gemm (w)");
  check_f32_cuda(y, "y");
  check_same_device(x, w, "split_gemm");
  check_same_device(x, y, "split_gemm");
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  TORCH_CHECK(w.size(1) == K, "split_gemm: x has ", num(K), " features, w ", num(w.size(1)));
  TORCH_CHECK(y.dim() == 2 && y.size(0) == M && y.size(1) == N && y.is_contiguous(),
              "split_gemm: y must be a contiguous float32 [", num(M), ", ", num(N), "]");
  TORCH_CHECK(M < (1ll << 31) && N < (1ll << 31) && K < (1ll << 31), "split_gemm: M, N and K must be < 2^31");
  if (M == 0 || N == 0) return;
  c10::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(nprod == 1 || (a_lo.numel() && b_lo.numel()), "split_gemm: nprod 3 needs the lo halves");
  if (K == 0) {  // an empty sum: zeros, as the reference gives
    C10_CUDA_CHECK(cudaMemsetAsync(y.data_ptr(), 0, M * N * sizeof(float), stream()));
    return;
  }
  const int Kp = static_cast<int>(a_hi.size(1));
  if (nprod == 3)
    launch_split_gemm<3>(a_hi, a_lo, b_hi, b_lo, inv_a.data_ptr<float>(), inv_b.data_ptr<float>(),
                         y.data_ptr<float>(), static_cast<int>(M), static_cast<int>(N), Kp, cm, cn, db);
  else
    launch_split_gemm<1>(a_hi, a_lo, b_hi, b_lo, inv_a.data_ptr<float>(), inv_b.data_ptr<float>(),
                         y.data_ptr<float>(), static_cast<int>(M), static_cast<int>(N), Kp, cm, cn, db);
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, x.get_device()));
  launch_fallback(x, w, flag_a, flag_b, y, sms);
}

// The rest of a one-product GEMM done elsewhere on the hi halves (y = x_hi w_hi^T in scaled units, float32
// [M, N]): unscale in place, then the float64 recompute of flagged rows/columns, as split_gemm does after its own
// kernel.
inline void split_unscale(const at::TensorBase& inv_a, const at::TensorBase& flag_a, const at::TensorBase& inv_b,
                          const at::TensorBase& flag_b, const at::TensorBase& x, const at::TensorBase& w,
                          const at::TensorBase& y) {
  check_f32_cuda(x, "split_unscale (x)");
  check_f32_cuda(w, "split_unscale (w)");
  check_f32_cuda(y, "split_unscale (y)");
  check_same_device(x, w, "split_unscale");
  check_same_device(x, y, "split_unscale");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && w.size(1) == x.size(1), "split_unscale: x [M, K] and w [N, K]");
  const int64_t M = x.size(0), N = w.size(0);
  TORCH_CHECK(y.dim() == 2 && y.size(0) == M && y.size(1) == N && y.is_contiguous() &&
                  reinterpret_cast<uintptr_t>(y.data_ptr()) % 16 == 0,
              "split_unscale: y must be a contiguous 16-byte-aligned float32 [", num(M), ", ", num(N), "]");
  check_scales(x, inv_a, flag_a, "split_unscale (x)");
  check_scales(w, inv_b, flag_b, "split_unscale (w)");
  if (M == 0 || N == 0) return;
  c10::cuda::CUDAGuard guard(x.device());
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, x.get_device()));
  const int64_t work = N % 4 == 0 ? M * (N / 4) : M * N;
  const int blocks = static_cast<int>(imin((work + 255) / 256, 8 * static_cast<int64_t>(sms)));
  unscale_kernel<<<blocks, 256, 0, stream()>>>(y.data_ptr<float>(), inv_a.data_ptr<float>(),
                                               inv_b.data_ptr<float>(), M, N);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  launch_fallback(x, w, flag_a, flag_b, y, sms);
}

}  // namespace
}  // namespace sg
}  // namespace kp
