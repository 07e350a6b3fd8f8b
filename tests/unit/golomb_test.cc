#include <gtest/gtest.h>

#include <random>

#include "compcoll/error.h"
#include "compression/golomb.h"

namespace compcoll {
namespace {

TEST(GolombRice, OptimalParameterFollowsTheSbcFormula) {
  // b* = 1 + floor(log2(log(phi - 1) / log(1 - d))): 9 at d = 0.001.
  EXPECT_EQ(golomb_rice_parameter(0.001), 9);
  EXPECT_EQ(golomb_rice_parameter(0.01), 6);
  EXPECT_EQ(golomb_rice_parameter(0.5), 0);
  EXPECT_EQ(golomb_rice_parameter(1e-9), 29);
}

std::vector<uint32_t> round_trip(const std::vector<uint32_t>& idx, int b, uint64_t n) {
  Bytes bits;
  rice_encode_positions(idx, b, bits);
  return rice_decode_positions(bits, idx.size(), b, n);
}

TEST(GolombRice, RoundTripsZeroGapsAndHugeGaps) {
  const uint64_t n = 4'000'000'000ull;
  std::vector<uint32_t> idx = {0, 1, 2, 3, 10, 11, 3'999'999'998u, 3'999'999'999u};
  // (A small b with gaps of 4e9 would be gigabits of unary; the encoder picks
  // b from the realised density, which keeps unary runs short.)
  for (int b : {20, 26, 31}) EXPECT_EQ(round_trip(idx, b, n), idx) << "b=" << b;
  std::vector<uint32_t> dense(1000);
  for (uint32_t i = 0; i < 1000; ++i) dense[i] = i;  // all gaps 0
  EXPECT_EQ(round_trip(dense, 0, 1000), dense);
  EXPECT_EQ(round_trip(dense, 9, 1000), dense);
  EXPECT_TRUE(round_trip({}, 9, 10).empty());
}

TEST(GolombRice, RoundTripsRandomPositionsAtElevenAndAHalfBitsEach) {
  std::mt19937 rng(5);
  const uint64_t n = 10'000'000;
  std::vector<uint32_t> idx;
  for (uint64_t i = 0; i < n; ++i)
    if (rng() % 1000 == 0) idx.push_back(static_cast<uint32_t>(i));
  const int b = golomb_rice_parameter(0.001);
  Bytes bits;
  const size_t nbits = rice_encode_positions(idx, b, bits);
  EXPECT_EQ(rice_decode_positions(bits, idx.size(), b, n), idx);
  const double per = double(nbits) / idx.size();
  EXPECT_GT(per, 10.5);
  EXPECT_LT(per, 12.5);
}

TEST(GolombRice, RejectsTruncatedStreamsPositionsPastNAndTrailingGarbage) {
  std::vector<uint32_t> idx = {5, 100, 2000, 2001};
  Bytes bits;
  rice_encode_positions(idx, 6, bits);
  for (size_t len = 0; len < bits.size(); ++len) {
    EXPECT_THROW(rice_decode_positions({bits.data(), len}, idx.size(), 6, 5000), Error);
  }
  EXPECT_THROW(rice_decode_positions(bits, idx.size(), 6, 2001), Error);  // 2001 >= n
  EXPECT_THROW(rice_decode_positions(bits, idx.size() + 1, 6, 5000), Error);
  Bytes longer = bits;
  longer.push_back(0);
  EXPECT_THROW(rice_decode_positions(longer, idx.size(), 6, 5000), Error);
  EXPECT_THROW(rice_decode_positions(bits, 1ull << 40, 6, 1ull << 41), Error);  // absurd k
}

}  // namespace
}  // namespace compcoll
