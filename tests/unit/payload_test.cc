// The shared wire format: fp16/bf16 conversions, headers, sparse payloads in
// every encoding, and the decoders' refusal of malformed input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "compcoll/error.h"
#include "compression/half.h"
#include "compression/payload.h"
#include "compression/sparse_payload.h"

namespace compcoll {
namespace {

TEST(EncodingNames, EveryTypeIsFoundByItsNameAndNothingElseIs) {
  for (int t = 0; t <= static_cast<int>(kLastValueType); ++t) {
    const auto v = static_cast<ValueType>(t);
    EXPECT_EQ(value_type_from_name(value_type_name(v)), v) << t;
  }
  for (int t = 0; t <= static_cast<int>(kLastIndexType); ++t) {
    const auto i = static_cast<IndexType>(t);
    EXPECT_EQ(index_type_from_name(index_type_name(i)), i) << t;
  }
  for (const char* bad : {"", "FP16", "fp 16", "unknown", "int8", "golomb"}) {
    EXPECT_FALSE(value_type_from_name(bad).has_value()) << bad;
    EXPECT_FALSE(index_type_from_name(bad).has_value()) << bad;
  }
}

TEST(Half, RoundTripsExactlyRepresentableValues) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f}) {
    EXPECT_EQ(half_to_float(float_to_half(f)), f) << f;
  }
  EXPECT_TRUE(std::isinf(half_to_float(float_to_half(1e6f))));
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(NAN))));
  EXPECT_TRUE(std::isinf(half_to_float(float_to_half(-INFINITY))));
}

TEST(Half, RoundsToNearestEvenWithinHalfAnUlp) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-60000.0f, 60000.0f);
  for (int i = 0; i < 100000; ++i) {
    const float f = d(rng);
    const float h = half_to_float(float_to_half(f));
    const float ulp = std::ldexp(1.0f, std::ilogb(f) - 10);
    EXPECT_LE(std::fabs(h - f), 0.5f * ulp) << f;
  }
}

// binary16 rounding written as its definition (in double: a step per
// binade, nearbyint), which the bit-level conversion must match.
uint16_t reference_half(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(double(f));
  if (a >= 65520.0) return sign | 0x7c00;  // 65504 + half its step rounds to even: Inf
  const int binade = std::max(std::ilogb(a == 0.0 ? 1.0 : a), -14);
  const double r = std::nearbyint(a / std::ldexp(1.0, binade - 10)) * std::ldexp(1.0, binade - 10);
  if (r < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(r * std::ldexp(1.0, 24));
  const int e = std::ilogb(r);
  return sign | static_cast<uint16_t>(((e + 15) << 10) | (static_cast<int>(std::ldexp(r, 10 - e)) - 1024));
}

TEST(Half, RoundingMatchesItsDefinitionInEveryBinade) {
  // Every float exponent and sign, with every pattern of the 13 bits that
  // binary16 drops (ties and their neighbours included) under a few
  // patterns of the bits it keeps; subnormal halves drop more bits, so
  // random mantissas cover them too.
  size_t mismatches = 0;
  const auto check = [&](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) return;
    const uint16_t got = float_to_half(f), want = reference_half(f);
    if (got != want && ++mismatches <= 5) {
      ADD_FAILURE() << f << ": 0x" << std::hex << got << ", the definition gives 0x" << want;
    }
  };
  std::mt19937 rng(17);
  for (uint32_t exp = 0; exp < 255; ++exp) {
    for (uint32_t high : {0u, 1u, 0x155u, 0x2aau, 0x3feu, 0x3ffu, uint32_t(rng() & 0x3ff)}) {
      for (uint32_t low = 0; low < (1u << 13); ++low) {
        const uint32_t bits = (exp << 23) | (high << 13) | low;
        check(bits);
        check(bits | 0x80000000u);
      }
    }
    for (int i = 0; i < 4096; ++i) check((exp << 23) | (static_cast<uint32_t>(rng()) & 0x807fffffu));
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(BFloat16, KeepsEightBitsOfMantissa) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_NEAR(bf16_to_float(float_to_bf16(3.14159f)), 3.14159f, 3.14159f / 128);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

// Version 2's layout, byte by byte (payload.h): a peer built from another
// commit must agree on every offset, so the test spells them out.
TEST(PayloadHeader, IsSixteenLittleEndianBytesWithThirtyTwoBitCounts) {
  ASSERT_EQ(kPayloadHeaderBytes, 16u);
  uint8_t h[kPayloadHeaderBytes];
  write_header({PayloadFormat::kSbc, 7, 2, 0x01020304u, 0x0A0B0C0Du}, h);
  const uint8_t want[kPayloadHeaderBytes] = {0x0C, 0xCC, kPayloadVersion, 2, 7, 2, 0, 0,
                                             0x04, 0x03, 0x02, 0x01, 0x0D, 0x0C, 0x0B, 0x0A};
  EXPECT_EQ(std::memcmp(h, want, sizeof h), 0);
  const PayloadHeader back = read_header(h, PayloadFormat::kSbc, 0x01020304u);
  EXPECT_EQ(back.aux0, 7);
  EXPECT_EQ(back.aux1, 2);
  EXPECT_EQ(back.k, 0x0A0B0C0Du);
  // The largest n fits; one more is refused at the writer, naming the size.
  write_header({PayloadFormat::kOneBit, 0, 0, kMaxPayloadElements, 1}, h);
  EXPECT_EQ(read_header(h, PayloadFormat::kOneBit, kMaxPayloadElements).n, kMaxPayloadElements);
  try {
    write_header({PayloadFormat::kOneBit, 0, 0, kMaxPayloadElements + 1, 1}, h);
    FAIL() << "n = 2^32 written into a 32-bit field";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("4294967296"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_header({PayloadFormat::kSparse, 0, 0, 10, kMaxPayloadElements + 1}, h), Error);
  // A version-1 payload (24-byte header) is refused by its version byte.
  h[2] = 1;
  EXPECT_THROW(read_header(h, PayloadFormat::kOneBit, kMaxPayloadElements), Error);
}

struct SparseCase {
  ValueType vt;
  IndexType it;
};

class SparsePayloadTest : public ::testing::TestWithParam<SparseCase> {};

TEST_P(SparsePayloadTest, RoundTripsIndicesAndTheValuesItReportsSent) {
  const SparseEncoding enc{GetParam().vt, GetParam().it};
  const uint64_t n = 1 << 20;
  std::vector<uint32_t> idx = {0, 1, 2, 1000, 70000, 500000, uint32_t(n - 1)};
  std::vector<float> values = {1.5f, -2.0f, 1e-3f, 123.456f, -7.0f, 0.1f, 3.0f};
  Bytes payload;
  encode_sparse(idx, values, n, enc, payload);
  const SparseEntries e = decode_sparse(payload, n);
  EXPECT_EQ(e.idx, idx);
  EXPECT_EQ(e.values, values);  // values were rewritten to what travels
  std::vector<float> out(n, 1.0f);
  decode_sparse_accumulate(payload, out.data(), n);
  for (size_t i = 0; i < idx.size(); ++i) EXPECT_EQ(out[idx[i]], 1.0f + values[i]);
  EXPECT_EQ(out[3], 1.0f);
}

TEST_P(SparsePayloadTest, EmptySelectionIsALegalPayload) {
  const SparseEncoding enc{GetParam().vt, GetParam().it};
  Bytes payload;
  encode_sparse({}, {}, 10, enc, payload);
  // The header, plus fp8's scale exponent and Rice's parameter byte.
  const size_t extra = (enc.values == ValueType::kFp8 ? 2 : 0) +
                       (enc.indices == IndexType::kRiceGap ? 1 : 0);
  EXPECT_EQ(payload.size(), kPayloadHeaderBytes + extra);
  std::vector<float> out(10, 2.0f);
  decode_sparse_accumulate(payload, out.data(), 10);
  EXPECT_EQ(out, std::vector<float>(10, 2.0f));
}

TEST_P(SparsePayloadTest, RejectsEveryTruncationWithoutTouchingTheOutput) {
  const SparseEncoding enc{GetParam().vt, GetParam().it};
  const uint64_t n = 5000;
  std::vector<uint32_t> idx = {3, 300, 301, 4999};
  std::vector<float> values = {1, 2, 3, 4};
  Bytes payload;
  encode_sparse(idx, values, n, enc, payload);
  std::vector<float> out(n, 0.0f);
  for (size_t len = 0; len < payload.size(); ++len) {
    std::span<const uint8_t> cut(payload.data(), len);
    EXPECT_THROW(decode_sparse_accumulate(cut, out.data(), n), Error) << "length " << len;
  }
  EXPECT_EQ(out, std::vector<float>(n, 0.0f));
}

TEST_P(SparsePayloadTest, RejectsOutOfRangeIndicesAndWrongSizes) {
  const SparseEncoding enc{GetParam().vt, GetParam().it};
  Bytes payload;
  std::vector<uint32_t> idx = {1, 9};
  std::vector<float> values = {1, 2};
  encode_sparse(idx, values, 10, enc, payload);
  std::vector<float> out(10, 0.0f);
  // Decoding against a smaller tensor: the header's n disagrees.
  EXPECT_THROW(decode_sparse_accumulate(payload, out.data(), 9), Error);
  // Forge n = 9 in the header: index 9 is now out of range.
  Bytes forged = payload;
  forged[8] = 9;
  try {
    decode_sparse_accumulate(forged, out.data(), 9);
    FAIL() << "index 9 accepted for a 9-element tensor";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kMalformedPayload);
  }
  // Inflate k: the body no longer holds that many entries.
  Bytes inflated = payload;
  inflated[12] = 200;
  EXPECT_THROW(decode_sparse_accumulate(inflated, out.data(), 10), Error);
  // Bad magic, version, format.
  for (size_t byte : {0, 2, 3}) {
    Bytes bad = payload;
    bad[byte] ^= 0x5a;
    EXPECT_THROW(decode_sparse_accumulate(bad, out.data(), 10), Error) << "byte " << byte;
  }
  EXPECT_EQ(out, std::vector<float>(10, 0.0f));
}

INSTANTIATE_TEST_SUITE_P(Encodings, SparsePayloadTest,
                         ::testing::Values(SparseCase{ValueType::kFp32, IndexType::kU32},
                                           SparseCase{ValueType::kFp16, IndexType::kU32},
                                           SparseCase{ValueType::kBf16, IndexType::kU32},
                                           SparseCase{ValueType::kFp32, IndexType::kVarintGap},
                                           SparseCase{ValueType::kFp16, IndexType::kVarintGap},
                                           SparseCase{ValueType::kBf16, IndexType::kVarintGap},
                                           SparseCase{ValueType::kFp8, IndexType::kU32},
                                           SparseCase{ValueType::kFp8, IndexType::kVarintGap},
                                           SparseCase{ValueType::kFp32, IndexType::kRiceGap},
                                           SparseCase{ValueType::kFp16, IndexType::kRiceGap},
                                           SparseCase{ValueType::kFp8, IndexType::kRiceGap}));

TEST(SparsePayload, RandomCorruptionNeverWritesOutOfBounds) {
  // Flip random bytes of valid payloads: decoding must either succeed with
  // indices in range or throw. (ASan runs make the "in range" part strict.)
  std::mt19937 rng(11);
  const uint64_t n = 777;
  std::vector<uint32_t> idx;
  for (uint32_t i = 0; i < n; i += 13) idx.push_back(i);
  std::vector<float> values(idx.size(), 1.0f);
  for (auto [vt, it] : {std::pair{ValueType::kFp16, IndexType::kU32},
                        std::pair{ValueType::kFp16, IndexType::kVarintGap},
                        std::pair{ValueType::kFp8, IndexType::kRiceGap}}) {
    Bytes payload;
    std::vector<float> vals = values;
    encode_sparse(idx, vals, n, {vt, it}, payload);
    for (int trial = 0; trial < 3000; ++trial) {
      Bytes bad = payload;
      const int flips = 1 + trial % 4;
      for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      std::vector<float> out(n, 0.0f);
      try {
        decode_sparse_accumulate(bad, out.data(), n);
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kMalformedPayload);
      }
    }
  }
}

TEST(SparsePayload, ClampsFiniteValuesBeyondHalfRangeInsteadOfSendingInf) {
  std::vector<uint32_t> idx = {0, 1};
  std::vector<float> values = {1e6f, -1e6f};
  Bytes payload;
  encode_sparse(idx, values, 2, {ValueType::kFp16, IndexType::kU32}, payload);
  EXPECT_EQ(values[0], 65504.0f);
  EXPECT_EQ(values[1], -65504.0f);
}

TEST(SparsePayload, ClampsFiniteValuesThatRoundBeyondBf16RangeInsteadOfSendingInf) {
  // 3.4e38 is finite in fp32 but rounds up past bf16's largest (3.3895e38).
  std::vector<uint32_t> idx = {0, 1, 2, 3};
  std::vector<float> values = {3.4e38f, -3.4e38f, INFINITY, 1.0f};
  Bytes payload;
  encode_sparse(idx, values, 4, {ValueType::kBf16, IndexType::kU32}, payload);
  EXPECT_EQ(values[0], bf16_to_float(0x7f7f));
  EXPECT_EQ(values[1], -bf16_to_float(0x7f7f));
  EXPECT_TRUE(std::isinf(values[2])) << "a true Inf is sent as one";
  EXPECT_EQ(values[3], 1.0f);
  std::vector<float> out(4, 0.0f);
  decode_sparse_accumulate(payload, out.data(), 4);
  EXPECT_TRUE(std::isfinite(out[0]) && std::isfinite(out[1]));
}

}  // namespace
}  // namespace compcoll
