// merge_codec_state: one tensor's history split between two error-feedback
// states (a buffer reallocated while the previous one was alive) and merged
// back loses nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "compression/decode.h"
#include "compression/dgc.h"
#include "compression/sbc.h"
#include "compression/sdagc.h"
#include "compression/state_merge.h"
#include "integration/bench/gradients.h"

namespace compcoll {
namespace {

std::unique_ptr<SparseCodec> make(const std::string& algo) {
  if (algo == "dgc") {
    DgcConfig c;
    c.density = 0.01;
    return std::make_unique<DgcCodec>(c);
  }
  if (algo == "sdagc") {
    SdagcConfig c;
    c.density = 0.01;
    return std::make_unique<SdagcCodec>(c);
  }
  SbcConfig c;
  c.density = 0.01;
  return std::make_unique<SbcCodec>(c);
}

class StateMergeTest : public ::testing::TestWithParam<std::string> {};

// Calls alternate between two states (as two alternating buffer slots do),
// then the older is merged into the newer, which goes on alone: everything
// sent plus the surviving residual is everything that was put in.
TEST_P(StateMergeTest, SentPlusTheMergedResidualIsEverythingAccumulated) {
  const size_t n = 20000;
  auto codec = make(GetParam());
  auto a = codec->make_state(n);
  auto b = codec->make_state(n);
  std::vector<double> input(n, 0.0), sent(n, 0.0);
  std::vector<float> out(n);
  Bytes payload;
  auto call = [&](CodecState& st, int step) {
    const auto g = bench::make_gradient(bench::GradientKind::kMixedScale, n, 700 + step);
    for (size_t i = 0; i < n; ++i) input[i] += g[i];
    codec->encode(g.data(), n, st, payload);
    std::fill(out.begin(), out.end(), 0.0f);
    decode_accumulate(payload, out.data(), n);
    for (size_t i = 0; i < n; ++i) sent[i] += out[i];
  };
  for (int step = 0; step < 20; ++step) call(step % 2 ? *b : *a, step);
  const uint64_t steps = a->steps + b->steps;
  ASSERT_TRUE(merge_codec_state(*a, *b));
  EXPECT_EQ(b->steps, steps);  // the warm-up counts every call of the tensor
  for (int step = 20; step < 40; ++step) call(*b, step);
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(sent[i] + b->v[i] - input[i]) / (1.0 + std::fabs(input[i])));
  }
  EXPECT_LT(worst, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Codecs, StateMergeTest, ::testing::Values("dgc", "sdagc", "sbc"));

TEST(StateMerge, ResidualsAddVelocitiesAverageAndNewerEstimatesWin) {
  CodecState older(3), newer(3);
  older.v = {1, 2, 3};
  older.u = {0.5f, 0, 0};
  older.steps = 4;
  older.lambda = 2.0f;
  older.second_moment = {9, 9, 9};
  newer.v = {10, 20, 30};
  newer.steps = 5;
  newer.lambda = 3.0f;
  newer.second_moment = {1, 1, 1};
  ASSERT_TRUE(merge_codec_state(older, newer));
  EXPECT_EQ(newer.v, (std::vector<float>{11, 22, 33}));
  EXPECT_EQ(newer.u, (std::vector<float>{0.5f, 0, 0}));  // newer had none: older's
  EXPECT_EQ(newer.steps, 9u);
  EXPECT_EQ(newer.lambda, 3.0f);
  EXPECT_EQ(newer.second_moment, (std::vector<float>{1, 1, 1}));

  CodecState again(3);
  again.u = {1.5f, 2, -4};
  ASSERT_TRUE(merge_codec_state(again, newer));
  EXPECT_EQ(newer.u, (std::vector<float>{1, 1, -2}));  // both had one: the mean
}

TEST(StateMerge, DifferentSizesAreRefusedAndLeftAlone) {
  CodecState older(3), newer(4);
  older.v = {1, 2, 3};
  EXPECT_FALSE(merge_codec_state(older, newer));
  EXPECT_EQ(newer.v, (std::vector<float>(4, 0.0f)));
}

}  // namespace
}  // namespace compcoll
