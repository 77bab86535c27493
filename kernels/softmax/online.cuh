// Online-softmax element math shared by the softmax rungs: absorb a group of elements into a running
// (max, sum-of-exp) and produce outputs. float and float4 overloads so vector and scalar paths share one body.
#pragma once
#include <cmath>

namespace kp_softmax {

__device__ __forceinline__ float vmax(float v) { return v; }
__device__ __forceinline__ float vmax(float4 v) {
  // NaN-propagating, so a NaN lane is not hidden behind fmaxf (it still poisons s below, as it must).
  float a = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
  return (v.x != v.x || v.y != v.y || v.z != v.z || v.w != v.w) ? NAN : a;
}
__device__ __forceinline__ float vsumexp(float v, float m) { return expf(v - m); }
__device__ __forceinline__ float vsumexp(float4 v, float m) {
  return (expf(v.x - m) + expf(v.y - m)) + (expf(v.z - m) + expf(v.w - m));
}
__device__ __forceinline__ float vout(float v, float m, float inv) { return expf(v - m) * inv; }
__device__ __forceinline__ float4 vout(float4 v, float m, float inv) {
  return make_float4(expf(v.x - m) * inv, expf(v.y - m) * inv, expf(v.z - m) * inv, expf(v.w - m) * inv);
}

// One group of elements into the running (m, s). m never becomes NaN; a NaN lane makes s NaN.
template <typename V>
__device__ __forceinline__ void absorb(float& m, float& s, V v) {
  const float lm = vmax(v);
  if (lm > m) { s *= expf(m - lm); m = lm; }
  if (m != -INFINITY || lm != lm) s += vsumexp(v, m);
}

}  // namespace kp_softmax
