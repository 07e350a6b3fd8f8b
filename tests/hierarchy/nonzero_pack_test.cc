// The hierarchy's sparse broadcast format (transport/nonzero_pack.h) on its
// own, and through a shared-memory group: the receivers must end up with
// exactly the leader's bits whether a round goes sparse or dense.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "compcoll/error.h"
#include "transport/nonzero_pack.h"
#include "transport/shm_group.h"

namespace compcoll {
namespace {

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(bits(a[i]), bits(b[i])) << "element " << i;
}

TEST(NonzeroPack, RoundTripsBitsIncludingNegativeZeroNanAndTheTail) {
  // 37 elements: two 16-word blocks and a tail of 5.
  std::vector<float> src(37, 0.0f);
  src[0] = 1.5f;
  src[15] = -0.0f;  // nonzero bits: must survive
  src[16] = std::numeric_limits<float>::quiet_NaN();
  src[33] = -std::numeric_limits<float>::infinity();
  src[36] = 1e-45f;  // a denormal
  std::vector<uint32_t> pairs(2 * 8);
  const size_t count = pack_nonzeros(src.data(), src.size(), pairs.data(), 8);
  ASSERT_EQ(count, 5u);
  EXPECT_EQ(pairs[0], 0u);
  EXPECT_EQ(pairs[2], 15u);
  EXPECT_EQ(pairs[8], 36u);
  std::vector<float> dst(37, 7.0f);  // stale contents must be cleared
  unpack_nonzeros(pairs.data(), count, dst.data(), dst.size());
  expect_same_bits(src, dst);
}

TEST(NonzeroPack, MoreNonzerosThanTheCapIsNotSparse) {
  std::vector<float> src(100, 0.0f);
  for (size_t i = 0; i < 100; i += 10) src[i] = 1.0f;  // 10 nonzeros
  std::vector<uint32_t> pairs(2 * 10);
  EXPECT_EQ(pack_nonzeros(src.data(), src.size(), pairs.data(), 9), kNotSparse);
  EXPECT_EQ(pack_nonzeros(src.data(), src.size(), pairs.data(), 10), 10u);
  EXPECT_EQ(pack_nonzeros(src.data(), 0, pairs.data(), 0), 0u);
}

// The leader's list of where its result can be nonzero, in any order, with
// repeats, zero words and indices of other rounds among them.
TEST(NonzeroPack, AListedSupportPacksTheSameBitsWithoutAScan) {
  std::vector<float> src(37, 0.0f);
  src[0] = 1.5f;
  src[15] = -0.0f;
  src[16] = std::numeric_limits<float>::quiet_NaN();
  src[33] = -std::numeric_limits<float>::infinity();
  src[36] = 1e-45f;
  const std::vector<uint32_t> listed = {36, 0, 15, 5, 16, 33, 33, 40};  // 5 is zero, 40 outside
  std::vector<uint32_t> pairs(2 * 8);
  const size_t count = pack_listed(src.data(), 0, src.size(), listed, pairs.data(), 8);
  ASSERT_EQ(count, 6u);  // 33 twice, 5 skipped (zero), 40 skipped (not in the round)
  EXPECT_EQ(pairs[0], 36u);
  std::vector<float> dst(37, 7.0f);
  unpack_nonzeros(pairs.data(), count, dst.data(), dst.size());
  expect_same_bits(src, dst);

  // The round [16, 37): indices relative to it; 0 and 15 belong to another.
  const size_t in_round = pack_listed(src.data(), 16, 21, listed, pairs.data(), 8);
  ASSERT_EQ(in_round, 4u);
  std::vector<float> tail(21, 7.0f);
  unpack_nonzeros(pairs.data(), in_round, tail.data(), tail.size());
  expect_same_bits(std::vector<float>(src.begin() + 16, src.end()), tail);

  EXPECT_EQ(pack_listed(src.data(), 0, src.size(), listed, pairs.data(), 5), kNotSparse);
}

TEST(NonzeroPack, AnIndexOutsideTheRoundIsRefused) {
  const std::vector<uint32_t> pairs = {3, bits(1.0f), 10, bits(2.0f)};
  std::vector<float> dst(10);
  try {
    unpack_nonzeros(pairs.data(), 2, dst.data(), dst.size());
    FAIL() << "an out-of-range index was written";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("element 10 of a 10-element round"), std::string::npos)
        << e.what();
  }
}

// Two local ranks as threads; rounds of 1000 floats. Per call the leader's
// sum is made sparse (a few nonzeros, -0.0 and NaN among them), borderline
// (exactly 1/8 nonzero: still sparse), just too dense, and fully dense; the
// follower must get the leader's bits every time, whether the leader scans
// its result or is given the list of where it can be nonzero (the
// algorithm's CallInfo::support, with repeats: too long a list goes dense).
class SharedResult : public ::testing::TestWithParam<bool> {};

TEST_P(SharedResult, HasTheLeadersBitsSparseOrDense) {
  const bool listed = GetParam();
  const std::string name =
      "/compcoll-test-" + std::to_string(getpid()) + "-nzpack" + (listed ? "-listed" : "");
  const size_t chunk = 1000, n = 2500;  // rounds of 1000, 1000, 500
  auto make = [&](int l) {
    ShmGroupOptions o;
    o.name = name;
    o.local_rank = l;
    o.world_ranks = {20, 21};
    o.chunk_floats = chunk;
    return l == 0 ? ShmGroup::create(o) : ShmGroup::open(o);
  };
  auto g0 = make(0);
  auto g1 = make(1);
  g0->unlink_name();
  // nonzeros per call: sparse, exactly n/8, n/8 + 1 per round, dense.
  const std::vector<size_t> every = {500, 8, 7, 1};
  std::vector<std::vector<float>> leader_out(every.size()), follower_out(every.size());
  auto body = [&](int l, ShmGroup& g) {
    for (size_t c = 0; c < every.size(); ++c) {
      std::vector<float> buf(n, 0.0f);
      std::mt19937 rng(static_cast<uint32_t>(c * 10 + l));
      std::normal_distribution<float> d;
      // Both ranks contribute at the same positions, so their sum is
      // nonzero exactly there (unless values cancel, which they do not).
      std::vector<uint32_t> support;
      for (size_t i = 0; i < n; i += every[c]) {
        buf[i] = d(rng);
        support.insert(support.end(), 2, static_cast<uint32_t>(i));  // both ranks' entries
      }
      if (c == 0) {
        buf[1] = -0.0f;  // -0 + -0 = -0: a sum whose only nonzero bit is the sign
        if (l == 0) buf[2] = std::numeric_limits<float>::quiet_NaN();
        support.insert(support.end(), {2, 1});
      }
      g.reduce_to_leader(buf.data(), n, std::chrono::milliseconds(5000),
                         LocalGroup::LastRound::kAdd);
      if (l == 0) leader_out[c] = buf;
      g.broadcast_from_leader(buf.data(), n, std::chrono::milliseconds(5000),
                              listed ? &support : nullptr);
      (l == 0 ? leader_out : follower_out)[c] = buf;
    }
  };
  std::thread t([&] { body(1, *g1); });
  body(0, *g0);
  t.join();
  for (size_t c = 0; c < every.size(); ++c) {
    SCOPED_TRACE("one nonzero every " + std::to_string(every[c]));
    expect_same_bits(leader_out[c], follower_out[c]);
  }
  EXPECT_TRUE(std::isnan(follower_out[0][2]));
  EXPECT_TRUE(std::signbit(follower_out[0][1]));
}

INSTANTIATE_TEST_SUITE_P(ScannedOrListed, SharedResult, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Listed" : "Scanned"; });

}  // namespace
}  // namespace compcoll
