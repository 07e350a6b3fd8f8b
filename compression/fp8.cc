#include "compression/fp8.h"

#include <algorithm>
#include <array>
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

// The code of a finite magnitude a (scale already applied), sign not set.
uint8_t magnitude_code(float a) {
  if (!(a < kFp8Max)) return kMaxFiniteCode;  // clamped; the excess stays with the sender
  if (a == 0.0f) return 0;
  int e = 0;
  std::frexp(a, &e);                              // a in [2^(e-1), 2^e)
  const int binade = std::max(e - 1, -6);         // subnormals share the smallest normal's step
  const float step = std::ldexp(1.0f, binade - 3);  // 3 mantissa bits
  auto m = static_cast<unsigned>(std::nearbyint(a / step));  // ties to even
  if (binade == -6 && m < 8) return static_cast<uint8_t>(m);  // subnormal (or 0)
  int exp = binade + 7;
  if (m == 16) {  // rounded up into the next binade
    m = 8;
    ++exp;
  }
  if (exp >= 15) return kMaxFiniteCode;
  return static_cast<uint8_t>((exp << 3) | (m - 8));
}

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

uint8_t float_to_fp8(float value, int scale) {
  const uint8_t sign = std::signbit(value) ? kSignBit : 0;
  if (std::isnan(value)) return sign | kNanCode;
  if (std::isinf(value)) return sign | kInfCode;
  uint8_t code = magnitude_code(std::ldexp(std::fabs(value), -scale));
  // At the largest scales the top codes exceed float's range: a finite value
  // must never arrive as Inf, so step down to the largest code that fits.
  for (int i = 0; i < 16 && code > 0 && !std::isfinite(fp8_to_float(code, scale)); ++i) --code;
  return sign | code;
}

float fp8_to_float(uint8_t code, int scale) { return std::ldexp(table()[code], scale); }

}  // namespace compcoll
