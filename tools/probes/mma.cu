// probes/mma -- the fp16 tensor-core rate a kernel can sustain on this GPU when nothing but wgmma runs: the
// ceiling under the split-precision GEMM of matmul_gelu_softmax and gemm_bn_scale_softmax (three fp16 products per
// fp32-accurate one). Not a problem variant: tools/mma_probe.py builds it with harness.build_path and times it next
// to cuBLAS's fp16 GEMM and the split GEMM kernel, with the SM clock and board power sampled while each runs.
// Requires: sm_90a (wgmma)
//
// Why a probe and not the datasheet: the dense fp16 peak (989 TFLOP/s on H100/H200 SXM) assumes 1024 FMA per clock
// per SM at 1.83 GHz. Under a sustained tensor-core load the board's power limit lowers the clock, so the rate a
// GEMM can reach is set by power as much as by the pipe. This kernel does no global-memory traffic in its loop, no
// epilogue and no synchronisation beyond wgmma's own: whatever it reaches, no GEMM on the same machine exceeds.
// Ownership and launch: one CTA per SM (grid = SM count, 193 KiB dynamic shared memory), 2 warpgroups (256 threads),
//   each issuing `iters` k-blocks of 4 wgmma m64nNk16 (N = 128 or 256) on its own fp32 accumulators, operands
//   read from a 4-stage ring of 128-byte-swizzled shared-memory tiles (A 64 x 64 per warpgroup, B N x 64), filled
//   once from `src` (random fp16 values shaped like the split's hi and lo parts: the tensor core's power depends on
//   the bits it multiplies).
//   Modes: pipelined (wait_group 1: the next k-block's wgmmas are queued while the previous ones run; every wgmma
//   accumulates into the same registers, as a GEMM main loop does) and promote (the split GEMM's structure: each
//   k-block's partial restarts from zero, wait_group 0, then it is added into a second register set).
//   Every wgmma's result must be read by a later instruction: a first version restarted the pipelined accumulators
//   at each k-block, which left whole k-blocks dead, and it reported 1.8x the datasheet's peak.
// Bytes: 64 KiB per CTA read once; the loop moves nothing off chip. Bound: the tensor pipe (and the power limit).
// Preconditions (checked): src fp16 CUDA contiguous with >= 96 Ki elements; out fp32 CUDA with >= grid * 256
//   elements; N 128 or 256; iters >= 1. Numerics: not a result (out only keeps the accumulators live).
// Measured: see tools/mma_probe.py output (docs/linear_problems.md, "The tensor-core ceiling").
#include <cuda_fp16.h>

#include "../../kernels/common/split_gemm.cuh"

namespace {

using kp::sg::desc_sw128;
using kp::sg::wgmma_commit;
using kp::sg::wgmma_fence;
using kp::sg::wgmma_wait;

constexpr int THREADS = 256, NSTAGE = 4;
constexpr int A_BYTES = 64 * 64 * 2;                     // one warpgroup's A tile: 64 rows x 128 bytes
constexpr int STAGE = 2 * A_BYTES + 256 * 64 * 2;        // A for both warpgroups + B for N = 256
constexpr int SMEM = NSTAGE * STAGE + 1024;              // + 1024-byte alignment slack (128B swizzle)

#define KP_WGMMA_M64N256K16_F16(d, da, db, scale_d) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " \
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63," \
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79," \
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95," \
      "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111," \
      "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, " \
      "%128, %129, p, 1, 1, 0, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
      : "l"(da), "l"(db), "r"(static_cast<uint32_t>(scale_d)))

template <int N, bool PROMOTE>
__global__ void __launch_bounds__(THREADS, 1) mma_loop(const uint4* __restrict__ src, float* out, int iters) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  for (int i = threadIdx.x; i < NSTAGE * STAGE / 16; i += THREADS)
    reinterpret_cast<uint4*>(smem)[i] = src[i % (96 * 1024 * 2 / 16)];
  __syncthreads();
  const uint32_t base = kp::smem_u32(smem);
  const int wg = threadIdx.x / 128;
  constexpr int NACC = N / 2;  // fp32 accumulator registers per thread of m64nNk16
  float acc[NACC], tot[PROMOTE ? NACC : 1];
#pragma unroll
  for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
#pragma unroll
  for (int i = 0; i < (PROMOTE ? NACC : 1); ++i) tot[i] = 0.f;
  for (int it = 0; it < iters; ++it) {
    const uint32_t st = base + (it % NSTAGE) * STAGE;
    const uint32_t a = st + wg * A_BYTES, b = st + 2 * A_BYTES;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if constexpr (N == 256) {
        KP_WGMMA_M64N256K16_F16(acc, desc_sw128(a + 32 * kk), desc_sw128(b + 32 * kk), !PROMOTE || kk > 0);
      } else {
        KP_WGMMA_M64N128K16_F16(acc, desc_sw128(a + 32 * kk), desc_sw128(b + 32 * kk), !PROMOTE || kk > 0);
      }
    }
    wgmma_commit();
    if constexpr (PROMOTE) {
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < NACC; ++i) tot[i] += acc[i];
    } else {
      wgmma_wait<1>();
    }
  }
  wgmma_wait<0>();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NACC; ++i) s += PROMOTE ? tot[i] : acc[i];
  out[blockIdx.x * THREADS + threadIdx.x] = s;
}

template <int N, bool PROMOTE>
void launch(const uint4* src, float* out, int grid, int iters) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(mma_loop<N, PROMOTE>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  mma_loop<N, PROMOTE><<<grid, THREADS, SMEM, kp::stream()>>>(src, out, iters);
}

}  // namespace

// grid CTAs (one per SM), each of 2 warpgroups doing iters k-blocks of 4 x m64nNk16: 2 * grid * iters * 4 * 64 * N
// * 16 fp16 FMAs in all.
KP_EXPORT void probe_mma(const at::TensorBase& src, const at::TensorBase& out, int64_t grid, int64_t iters, int64_t n,
                         bool promote) {
  TORCH_CHECK(src.is_cuda() && src.scalar_type() == at::kHalf && src.is_contiguous() && src.numel() >= 96 * 1024,
              "src: fp16 CUDA contiguous, >= 96 Ki elements");
  TORCH_CHECK(out.is_cuda() && out.scalar_type() == at::kFloat && out.numel() >= grid * THREADS,
              "out: fp32 CUDA, >= grid * 256 elements");
  TORCH_CHECK(grid >= 1 && iters >= 1 && iters < (1ll << 31), "grid and iters must be positive");
  const c10::cuda::CUDAGuard g(src.device());
  const auto* s = reinterpret_cast<const uint4*>(src.data_ptr());
  float* o = out.data_ptr<float>();
  if (n == 256 && !promote) launch<256, false>(s, o, (int)grid, (int)iters);
  else if (n == 128 && !promote) launch<128, false>(s, o, (int)grid, (int)iters);
  else if (n == 128 && promote) launch<128, true>(s, o, (int)grid, (int)iters);
  else TORCH_CHECK(false, "probe_mma: n 256 (pure) or 128 (pure or promote)");
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
