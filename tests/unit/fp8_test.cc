// fp8 (E4M3 behind a power-of-two scale per payload): the codes, rounding,
// the scale's choice, and the property the scatter pattern relies on, that
// re-encoding decoded values with a subset's own scale is exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "compression/fp8.h"
#include "compression/sparse_payload.h"

namespace compcoll {
namespace {

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(Fp8, EveryFiniteCodeRoundTripsAtEveryScale) {
  for (int scale : {kFp8MinScale, -60, -9, 0, 7, 100, kFp8MaxScale}) {
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_to_float(uint8_t(c), scale);
      if (std::isnan(v)) continue;
      if (!std::isfinite(v)) {
        // Only Inf's own code, or (at the largest scales) codes that
        // overflow float, which the encoder never emits.
        EXPECT_TRUE((c & 0x7f) == 0x78 || scale > 100) << c << " at 2^" << scale;
        continue;
      }
      EXPECT_EQ(float_to_fp8(v, scale), uint8_t(c)) << c << " at 2^" << scale;
    }
  }
}

// The rounding written as its definition (frexp, a step per binade,
// nearbyint), which the encoder's bit-level version must match everywhere.
uint8_t reference_code(float value, int scale) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  if (std::isnan(value)) return sign | 0x7f;
  if (std::isinf(value)) return sign | 0x78;
  const double a = std::ldexp(double(std::fabs(value)), -scale);
  uint8_t code = 0;
  if (!(a < 240.0)) {
    code = 0x77;
  } else if (a != 0.0) {
    int e = 0;
    std::frexp(a, &e);
    const int binade = std::max(e - 1, -6);
    auto m = static_cast<unsigned>(std::nearbyint(a / std::ldexp(1.0, binade - 3)));
    int exp = binade + 7;
    if (binade == -6 && m < 8) {
      exp = 0;
      m += 8;  // undone below: a subnormal's code is m itself
    } else if (m == 16) {
      m = 8;
      ++exp;
    }
    code = static_cast<uint8_t>((exp << 3) | (m - 8));
  }
  while (code > 0 && !std::isfinite(std::ldexp(fp8_to_float(code, 0), scale))) --code;
  return sign | code;
}

TEST(Fp8, RoundingMatchesItsDefinitionOnAnyFloatAtAnyScale) {
  std::mt19937 rng(21);
  size_t mismatches = 0;
  const auto check = [&](float v, int scale) {
    const uint8_t got = float_to_fp8(v, scale), want = reference_code(v, scale);
    if (got != want && ++mismatches <= 5) {
      ADD_FAILURE() << v << " at 2^" << scale << ": code " << int(got) << ", the definition gives " << int(want);
    }
  };
  for (int i = 0; i < 2000000; ++i) {  // any bit pattern, any scale
    const uint32_t bits = static_cast<uint32_t>(rng());
    float v;
    std::memcpy(&v, &bits, 4);
    check(v, kFp8MinScale + int(rng() % uint32_t(kFp8MaxScale - kFp8MinScale + 1)));
  }
  // Near the codes: every code's value, the midpoints to its neighbours and
  // one float either side of them, at scales across the range.
  for (int scale : {kFp8MinScale, -127, -20, 0, 5, 119, 120, kFp8MaxScale}) {
    for (int c = 0; c < 0x78; ++c) {
      const double lo = fp8_to_float(uint8_t(c), 0), hi = c < 0x77 ? fp8_to_float(uint8_t(c + 1), 0) : 256.0;
      for (double x : {lo, (lo + hi) / 2}) {
        const float f = static_cast<float>(std::ldexp(x, scale));
        for (float y : {f, std::nextafter(f, 0.0f), std::nextafter(f, INFINITY)}) {
          check(y, scale);
          check(-y, scale);
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(Fp8, TheCodesAreE4M3WithInfinity) {
  EXPECT_EQ(fp8_to_float(0x00, 0), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_to_float(0x80, 0)));
  EXPECT_EQ(fp8_to_float(0x01, 0), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_to_float(0x08, 0), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_to_float(0x38, 0), 1.0f);
  EXPECT_EQ(fp8_to_float(0x77, 0), 240.0f);
  EXPECT_EQ(fp8_to_float(0xf7, 3), -1920.0f);
  EXPECT_EQ(fp8_to_float(0x78, 0), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp8_to_float(0xf8, 0), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp8_to_float(0x7f, 0)));
}

TEST(Fp8, RoundsToTheNearestCodeTiesToEven) {
  // Between 1 and 1.125 (mantissa 0 and 1) the tie goes to 1; between 1.125
  // and 1.25 (mantissa 1 and 2) to 1.25.
  EXPECT_EQ(fp8_to_float(float_to_fp8(1.0625f, 0), 0), 1.0f);
  EXPECT_EQ(fp8_to_float(float_to_fp8(1.1875f, 0), 0), 1.25f);
  EXPECT_EQ(fp8_to_float(float_to_fp8(1.07f, 0), 0), 1.125f);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mag(-12.0f, 7.9f);
  for (int i = 0; i < 200000; ++i) {
    const float v = std::exp2(mag(rng)) * (i % 2 ? -1.0f : 1.0f);
    const int scale = int(rng() % 41) - 20;
    const float x = v * std::ldexp(1.0f, scale);
    const float q = fp8_to_float(float_to_fp8(x, scale), scale);
    const int binade = std::max(std::ilogb(v), -6);
    const float half_step = std::ldexp(1.0f, binade - 4 + scale);
    EXPECT_LE(std::fabs(q - x), half_step) << x << " at 2^" << scale;
    EXPECT_TRUE(q == 0.0f || std::signbit(q) == std::signbit(x));
  }
}

TEST(Fp8, FiniteValuesAreClampedNeverSentAsInfinity) {
  EXPECT_EQ(fp8_to_float(float_to_fp8(1000.0f, 0), 0), 240.0f);
  EXPECT_EQ(fp8_to_float(float_to_fp8(-1e30f, 0), 0), -240.0f);
  const float big = std::numeric_limits<float>::max();
  const int s = fp8_scale_for(big);
  EXPECT_EQ(s, kFp8MaxScale);
  const float q = fp8_to_float(float_to_fp8(big, s), s);
  EXPECT_TRUE(std::isfinite(q));
  EXPECT_GT(q, big / 2);
  EXPECT_TRUE(std::isinf(fp8_to_float(float_to_fp8(INFINITY, 0), 0)));
  EXPECT_TRUE(std::isinf(fp8_to_float(float_to_fp8(-INFINITY, 5), 5)));
  EXPECT_TRUE(std::isnan(fp8_to_float(float_to_fp8(NAN, -3), -3)));
}

TEST(Fp8, TheScaleIsTheSmallestThatCoversTheLargestMagnitude) {
  EXPECT_EQ(fp8_scale_for(240.0f), 0);
  EXPECT_EQ(fp8_scale_for(240.01f), 1);
  EXPECT_EQ(fp8_scale_for(120.0f), -1);
  EXPECT_EQ(fp8_scale_for(0.0f), kFp8MinScale);
  EXPECT_EQ(fp8_scale_for(std::numeric_limits<float>::denorm_min()), kFp8MinScale);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> e(-140.0f, 127.9f);
  for (int i = 0; i < 100000; ++i) {
    const float m = std::exp2(e(rng));
    if (!std::isfinite(m) || m == 0.0f) continue;
    const int s = fp8_scale_for(m);
    EXPECT_LE(double(m), std::ldexp(240.0, s)) << m;
    if (s > kFp8MinScale) {
      EXPECT_GT(double(m), std::ldexp(240.0, s - 1)) << m;
    }
  }
}

// The scatter pattern re-encodes slices of a rank's decoded values, each
// with its own scale, and counts on getting the same values back.
TEST(Fp8, ReEncodingAnySliceOfDecodedValuesIsExact) {
  std::mt19937 rng(13);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t k = 1 + rng() % 200;
    const float range = std::exp2(float(int(rng() % 200) - 100));
    std::vector<uint32_t> idx(k);
    std::vector<float> values(k);
    for (size_t i = 0; i < k; ++i) idx[i] = uint32_t(i * 3), values[i] = g(rng) * range;
    Bytes payload;
    encode_sparse(idx, values, 3 * k, {ValueType::kFp8, IndexType::kRiceGap}, payload);
    const size_t lo = rng() % k, hi = lo + 1 + rng() % (k - lo);
    std::vector<uint32_t> sub_idx(idx.begin() + long(lo), idx.begin() + long(hi));
    std::vector<float> sub(values.begin() + long(lo), values.begin() + long(hi));
    const std::vector<float> before = sub;
    encode_sparse(sub_idx, sub, 3 * k, {ValueType::kFp8, IndexType::kRiceGap}, payload);
    for (size_t i = 0; i < sub.size(); ++i) {
      EXPECT_TRUE(same_bits(sub[i], before[i])) << before[i] << " became " << sub[i];
    }
  }
}

TEST(Fp8, APayloadOfMixedMagnitudesKeepsEachWithinItsStep) {
  // The largest sets the scale; one 2^12 times smaller keeps 3 bits of
  // mantissa; one 2^20 times smaller falls under the smallest code.
  std::vector<uint32_t> idx = {1, 2, 3, 4, 5};
  std::vector<float> values = {1.3e-3f, -0.75e-3f, 1.3e-3f / 4096, 1.3e-3f / (1 << 20), NAN};
  const std::vector<float> given = values;
  Bytes payload;
  encode_sparse(idx, values, 6, {ValueType::kFp8, IndexType::kVarintGap}, payload);
  EXPECT_NEAR(values[0], given[0], given[0] / 16);
  EXPECT_NEAR(values[1], given[1], -given[1] / 16);
  EXPECT_NEAR(values[2], given[2], given[2] / 16);
  EXPECT_EQ(values[3], 0.0f);
  EXPECT_TRUE(std::isnan(values[4]));
  const SparseEntries e = decode_sparse(payload, 6);
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(same_bits(e.values[i], values[i])) << i;
  EXPECT_TRUE(std::isnan(e.values[4]));
}

TEST(Fp8, RejectsAScaleOutsideItsRange) {
  std::vector<uint32_t> idx = {0};
  std::vector<float> values = {1.0f};
  Bytes payload;
  encode_sparse(idx, values, 4, {ValueType::kFp8, IndexType::kU32}, payload);
  for (int16_t bad : {int16_t(kFp8MinScale - 1), int16_t(kFp8MaxScale + 1), int16_t(-32768)}) {
    Bytes forged = payload;
    store_le<int16_t>(forged.data() + kPayloadHeaderBytes, bad);
    try {
      decode_sparse(forged, 4);
      FAIL() << "scale 2^" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kMalformedPayload);
      EXPECT_NE(std::string(e.what()).find("fp8 scale"), std::string::npos) << e.what();
    }
  }
}

TEST(RiceIndices, CostAboutLogTwoOfTheSpacingPlusTwoBits) {
  const uint64_t n = 4'000'000;
  for (double density : {0.001, 0.0036}) {
    std::mt19937 rng(21);
    std::vector<uint32_t> idx;
    std::bernoulli_distribution pick(density);
    for (uint32_t i = 0; i < n; ++i) {
      if (pick(rng)) idx.push_back(i);
    }
    std::vector<float> values(idx.size(), 1.0f);
    Bytes rice, varint;
    encode_sparse(idx, values, n, {ValueType::kFp8, IndexType::kRiceGap}, rice);
    encode_sparse(idx, values, n, {ValueType::kFp8, IndexType::kVarintGap}, varint);
    // Both after the header, fp8's scale and one byte per value.
    const size_t before_indices = kPayloadHeaderBytes + 2 + idx.size();
    const size_t rice_bytes = rice.size() - before_indices - 1,
                 varint_bytes = varint.size() - before_indices;
    const double rice_bits = 8.0 * double(rice_bytes) / double(idx.size());
    EXPECT_LT(rice_bits, std::log2(1.0 / density) + 2.5) << density;
    EXPECT_LT(rice_bytes, varint_bytes * 4 / 5) << density;
    EXPECT_LE(rice.size(), sparse_payload_max_bytes(idx.size(), n, {ValueType::kFp8, IndexType::kRiceGap}));
    EXPECT_EQ(decode_sparse(rice, n).idx, idx);
  }
}

}  // namespace
}  // namespace compcoll
