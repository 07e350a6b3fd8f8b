#include "compression/fp8.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

namespace compcoll {
namespace {

constexpr uint8_t kSignBit = 0x80;
constexpr uint8_t kInfCode = 0x78;  // exponent 15, mantissa 0
constexpr uint8_t kNanCode = 0x7f;
constexpr uint8_t kMaxFiniteCode = 0x77;  // exponent 14, mantissa 7: 240

// Every code's value at scale 0.
std::array<float, 256> make_table() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) {
    const int exp = (c >> 3) & 0xf, mant = c & 7;
    float v;
    if (exp == 15) {
      v = mant == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
    } else if (exp == 0) {
      v = std::ldexp(float(mant), -9);  // subnormal: mant * 2^-9
    } else {
      v = std::ldexp(float(8 + mant), exp - 10);  // (1 + mant/8) * 2^(exp - 7)
    }
    t[size_t(c)] = (c & kSignBit) ? -v : v;
  }
  return t;
}

const std::array<float, 256>& table() {
  static const std::array<float, 256> t = make_table();
  return t;
}

// 2^e as a double, built from its bits (exact for e in double's normal
// range, which covers every scale and binade here).
double pow2(int e) { return std::bit_cast<double>(uint64_t(1023 + e) << 52); }

// The code of a finite magnitude a (scale already applied, exact in double),
// sign not set. This runs once per sent value, so it works on a's bits
// rather than through frexp / ldexp / nearbyint (20 ns a value before).
uint8_t magnitude_code(double a) {
  if (!(a < kFp8Max)) return kMaxFiniteCode;  // clamped; the excess stays with the sender
  if (a < 0x1p-6) {
    // Subnormal codes are multiples of 2^-9 (ties to even, the default
    // rounding mode); 8 is the smallest normal's code, 0x08, as it should be.
    return static_cast<uint8_t>(std::nearbyint(a * 512.0));
  }
  // A normal code keeps 3 of double's 52 mantissa bits. Rounding half to
  // even on the bits: add just under half a step, plus the kept lowest bit.
  // A carry out of the mantissa moves into the exponent, which is the
  // rounding into the next binade. a < 240 rounds to at most 240, so the
  // code's exponent stays at or under 14.
  constexpr int kDrop = 52 - 3;
  uint64_t bits = std::bit_cast<uint64_t>(a);
  bits += ((uint64_t{1} << (kDrop - 1)) - 1) + ((bits >> kDrop) & 1);
  const int exp = static_cast<int>(bits >> 52) - 1023 + 7;  // E4M3's bias is 7
  const int mant = static_cast<int>(bits >> kDrop) & 7;
  return static_cast<uint8_t>((exp << 3) | mant);
}

// Up to this scale every finite code decodes to a finite float (240 * 2^s
// < 2^128); above it the top codes overflow and the encoder steps down.
constexpr int kLargestScaleWithoutOverflow = 120;

}  // namespace

int fp8_scale_for(float max_abs) {
  if (!(max_abs > 0.0f) || !std::isfinite(max_abs)) return kFp8MinScale;
  // 240 * 2^s in double is exact for every s here; start near the answer
  // and step to the smallest s that covers max_abs (at most two steps).
  int s = std::clamp(std::ilogb(max_abs) - 7, kFp8MinScale, kFp8MaxScale);
  for (int i = 0; i < 4 && s < kFp8MaxScale && std::ldexp(double(kFp8Max), s) < max_abs; ++i) ++s;
  for (int i = 0; i < 4 && s > kFp8MinScale && std::ldexp(double(kFp8Max), s - 1) >= max_abs; ++i) --s;
  return s;
}

namespace {

// float_to_fp8 with 2^-scale computed by the caller, inlined into the
// payload loop below.
inline uint8_t encode_one(float value, int scale, double down) {
  const uint8_t sign = std::signbit(value) ? kSignBit : 0;
  if (std::isnan(value)) return sign | kNanCode;
  if (std::isinf(value)) return sign | kInfCode;
  // |value| * 2^-scale is exact in double: no float underflow or overflow
  // to reason about.
  uint8_t code = magnitude_code(double(std::fabs(value)) * down);
  // At the largest scales the top codes exceed float's range: a finite value
  // must never arrive as Inf, so step down to the largest code that fits.
  if (scale > kLargestScaleWithoutOverflow) {
    for (int i = 0; i < 16 && code > 0 && !std::isfinite(fp8_to_float(code, scale)); ++i) --code;
  }
  return sign | code;
}

// The product is exact in double, and so is its conversion to float
// wherever the value is representable (every code times 2^s, s >= -140, is
// a multiple of float's smallest subnormal); above float's range it is Inf.
inline float decode_one(const std::array<float, 256>& t, uint8_t code, double up) {
  return static_cast<float>(double(t[code]) * up);
}

}  // namespace

uint8_t float_to_fp8(float value, int scale) { return encode_one(value, scale, pow2(-scale)); }

float fp8_to_float(uint8_t code, int scale) { return decode_one(table(), code, pow2(scale)); }

void fp8_encode(std::span<float> values, int scale, uint8_t* codes) {
  const double down = pow2(-scale), up = pow2(scale);
  const std::array<float, 256>& t = table();
  for (float& v : values) {
    const uint8_t c = encode_one(v, scale, down);
    *codes++ = c;
    v = decode_one(t, c, up);
  }
}

}  // namespace compcoll
