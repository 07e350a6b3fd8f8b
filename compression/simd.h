// Four-lane float vectors through GCC/Clang vector extensions: portable C++
// that compiles to SSE2 on baseline x86-64 and to NEON on ARM. (Eight-lane
// vectors would be passed through memory without AVX.) Used where the auto-vectoriser gives up: reductions with
// several accumulators, masks, and sign bits.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace compcoll::simd {

typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

constexpr size_t kLanes = 4;

inline f32x4 load(const float* p) {
  f32x4 r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
inline void store(float* p, f32x4 v) { std::memcpy(p, &v, sizeof v); }
inline f32x4 splat(float x) { return f32x4{x, x, x, x}; }
inline f32x4 abs(f32x4 v) { return (f32x4)((i32x4)v & 0x7fffffff); }
// All-ones lanes where the sign bit is set (negative numbers, -0, -NaN).
inline i32x4 sign_mask(f32x4 v) { return (i32x4)v >> 31; }
// mask ? a : b, lane by lane (mask lanes all-ones or zero).
inline f32x4 select(i32x4 mask, f32x4 a, f32x4 b) {
  return (f32x4)((mask & (i32x4)a) | (~mask & (i32x4)b));
}
inline float sum(f32x4 v) {
  float s = 0.0f;
  for (size_t j = 0; j < kLanes; ++j) s += v[j];
  return s;
}
// Whether any lane's sign bit is set (lanes are masks: all-ones or zero).
inline bool any(i32x4 m) {
#if defined(__SSE2__)
  return _mm_movemask_ps(reinterpret_cast<__m128>(m)) != 0;
#else
  int32_t r = 0;
  for (size_t j = 0; j < kLanes; ++j) r |= m[j];
  return r != 0;
#endif
}
// Bit j set when lane j of mask is set (one movmskps on x86).
inline uint8_t bits(i32x4 m) {
#if defined(__SSE2__)
  return static_cast<uint8_t>(_mm_movemask_ps(reinterpret_cast<__m128>(m)));
#else
  uint8_t b = 0;
  for (size_t j = 0; j < kLanes; ++j) b |= static_cast<uint8_t>(m[j] & 1) << j;
  return b;
#endif
}

// The inverse of bits(): lane j all-ones when bit j of b is set.
inline i32x4 expand_bits(uint32_t b) {
  const i32x4 lane_bit = {1, 2, 4, 8};
  const int32_t x = static_cast<int32_t>(b);
  const i32x4 bv = {x, x, x, x};
  return (bv & lane_bit) != 0;
}

}  // namespace compcoll::simd
