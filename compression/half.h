// IEEE binary16 and bfloat16 <-> float conversions, round-to-nearest-even,
// with Inf and NaN preserved. Portable C++ (no F16C): values are converted
// only for the k selected entries of a sparse payload, never in bulk.
//
// The CUDA codecs' conversion kernels call these same functions (they are
// host and device code under nvcc): a rank that runs a call on the device
// and one that stages it through host memory must write the same bits, NaN
// payloads included, and CUDA's own intrinsics quieten a NaN differently.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define COMPCOLL_HOST_DEVICE __host__ __device__
#else
#define COMPCOLL_HOST_DEVICE
#endif

namespace compcoll {

COMPCOLL_HOST_DEVICE inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

COMPCOLL_HOST_DEVICE inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

COMPCOLL_HOST_DEVICE inline uint16_t float_to_half(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN; keep NaN quiet and non-zero
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow
  if (abs < 0x38800000u) {  // subnormal half (or zero)
    // Shift the implicit-1 mantissa into place and round to nearest even.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // rounds to 0
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  // Normal: rebias the exponent and round the mantissa from 23 to 10 bits,
  // half to even, with no branch on the dropped bits (a random-looking
  // branch cost several ns a value): add just under half a step plus the
  // kept lowest bit; a carry moves into the exponent, as it should.
  return static_cast<uint16_t>(sign | ((abs - 0x38000000u + 0x0fffu + ((abs >> 13) & 1u)) >> 13));
}

COMPCOLL_HOST_DEVICE inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // Subnormal: normalise.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    return bits_float(sign | ((112 - e) << 23) | ((mant & 0x3ffu) << 13));
  }
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

COMPCOLL_HOST_DEVICE inline uint16_t float_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

COMPCOLL_HOST_DEVICE inline float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

}  // namespace compcoll
