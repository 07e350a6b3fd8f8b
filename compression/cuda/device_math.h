// Element arithmetic of the CUDA codecs, written once for the device and the
// host (CC_HD), so that the CPU tests can check the order of every rounding
// against the CPU codecs without a GPU.
//
// Why the care: the CPU codecs are built without FMA contraction, so
// "m*u + g" rounds twice. nvcc contracts such expressions by default; the
// _rn intrinsics used here are never contracted (and compression/cuda builds
// with --fmad=false as a second guard). Sums that must match the CPU bit for
// bit are accumulated in the CPU's order: its SIMD loops keep four float
// lanes (lane j takes elements j, j+4, ... of a block), add the lanes as
// ((((0+l0)+l1)+l2)+l3), and handle the last n%4 elements in scalar code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CC_HD __host__ __device__ __forceinline__
#else
#define CC_HD inline
#endif

namespace compcoll::cuda {

CC_HD float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
CC_HD float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
CC_HD float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
CC_HD double dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
CC_HD double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

CC_HD uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
CC_HD float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

constexpr float kFloatMax = 3.402823466e+38f;
CC_HD float infinity() { return float_of(0x7f800000u); }
CC_HD float abs_of(float x) { return float_of(bits_of(x) & 0x7fffffffu); }
CC_HD bool sign_of(float x) { return (bits_of(x) >> 31) != 0; }
CC_HD bool finite(float x) { return (bits_of(x) & 0x7f800000u) != 0x7f800000u; }
// The smallest threshold the selection uses (select.h's kMinThreshold).
CC_HD float min_threshold() { return float_of(1u); }

// Momentum correction (compression/accumulate.h): M = 0 none, 1 plain,
// 2 Nesterov. Updates u, returns the increment of v.
template <int M>
CC_HD float momentum_step(float g, float& u, float m) {
  if (M == 0) return g;
  if (M == 1) {
    u = fadd(fmul(m, u), g);
    return u;
  }
  u = fmul(fadd(u, g), m);
  return fadd(u, g);
}

// Selection keys (compression/select.h): K = 0 magnitude, 1 positive side,
// 2 negative side, 3 "is not finite" (sbc's and onebit's exact list).
template <int K>
CC_HD float select_key(float x) {
  if (K == 0) {
    const float a = abs_of(x);
    return a == a ? a : infinity();  // NaN ranks with Inf, highest
  }
  if (K == 1) return x;
  return float_of(bits_of(x) ^ 0x80000000u);  // -x
}

template <int K>
CC_HD bool passes(float x, float t) {
  if (K == 0) return !(abs_of(x) < t);  // NaN passes
  if (K == 1) return x >= t && x <= kFloatMax;
  if (K == 2) {
    const float y = select_key<2>(x);
    return y >= t && y <= kFloatMax;
  }
  return !finite(x);
}

// Four float lanes summed the way simd::sum does: (((0 + l0) + l1) + l2) + l3.
CC_HD float lane_total(const float l[4]) {
  float s = 0.0f;
  for (int j = 0; j < 4; ++j) s = fadd(s, l[j]);
  return s;
}

// onebit's per-block scales (compression/onebit.cc, accumulate_block).
struct OneBitScales {
  float pos;
  float neg;
};

// The scales from the sums over a block's count values (onebit.cc's last
// step): one mean magnitude, or the means of each side.
CC_HD OneBitScales onebit_scales_of(double abs_total, double neg_total, double negatives, size_t count,
                                    bool signed_means) {
  if (!signed_means) {
    const float s = count ? float(abs_total / double(count)) : 0.0f;
    return {s, s};
  }
  const double positives = double(count) - negatives;
  const double pos_total = abs_total - neg_total;
  return {positives > 0 ? float(pos_total / positives) : 0.0f,
          negatives > 0 ? float(neg_total / negatives) : 0.0f};
}

// A block holding non-finite values: one sequential double pass over the
// finite ones (they are zeroed by the caller).
CC_HD OneBitScales onebit_scales_sequential(const float* e, size_t len, bool signed_means) {
  double abs_total = 0.0, neg_total = 0.0, negatives = 0.0;
  size_t finite_count = 0;
  for (size_t j = 0; j < len; ++j) {
    if (!finite(e[j])) continue;
    ++finite_count;
    abs_total = dadd(abs_total, double(abs_of(e[j])));
    if (sign_of(e[j])) {
      neg_total = dadd(neg_total, -double(e[j]));
      negatives = dadd(negatives, 1.0);
    }
  }
  return onebit_scales_of(abs_total, neg_total, negatives, finite_count, signed_means);
}

// The scales of a block of len elements e, all finite, from the lane sums
// over its first len - len%4 elements and the scalar tail.
CC_HD OneBitScales onebit_scales(const float* e, size_t len, const float abs_lane[4],
                                 const float neg_lane[4], const int neg_count_lane[4],
                                 bool signed_means) {
  // The float lanes overflow to Inf for huge finite inputs (2048 x 1e36), as
  // on the CPU: then its sequential double sums, which cannot. (A negative
  // lane, never larger than its magnitude lane, overflows only with it.)
  if (!finite(lane_total(abs_lane))) return onebit_scales_sequential(e, len, signed_means);
  const size_t len4 = len - len % 4;
  const float* tail = e + len4;
  const size_t tail_len = len - len4;
  double abs_total = lane_total(abs_lane);
  double neg_total = lane_total(neg_lane);
  double negatives = 0.0;
  for (int j = 0; j < 4; ++j) negatives = dadd(negatives, double(neg_count_lane[j]));
  for (size_t i = 0; i < tail_len; ++i) {
    const float x = tail[i];
    abs_total = dadd(abs_total, double(abs_of(x)));
    if (sign_of(x)) {
      neg_total = dadd(neg_total, -double(x));
      negatives = dadd(negatives, 1.0);
    }
  }
  return onebit_scales_of(abs_total, neg_total, negatives, len, signed_means);
}

}  // namespace compcoll::cuda
