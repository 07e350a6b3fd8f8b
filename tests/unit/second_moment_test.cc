// Normalized selection (compression/second_moment.h): dgc and sdagc rank the
// residual by |v| / sqrt(s), s the moving average of the squared gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compcoll/error.h"
#include "compression/decode.h"
#include "compression/dgc.h"
#include "compression/sbc.h"
#include "compression/sdagc.h"
#include "compression/sparse_payload.h"

namespace compcoll {
namespace {

constexpr float kBeta = 0.999f;

std::unique_ptr<SparseCodec> make_codec(const std::string& name, float beta, double density,
                                        float momentum = 0.0f) {
  if (name == "dgc") {
    DgcConfig c;
    c.density = density;
    c.momentum = momentum;
    c.second_moment_beta = beta;
    return std::make_unique<DgcCodec>(c);
  }
  SdagcConfig c;
  c.density = density;
  c.momentum = momentum;
  c.second_moment_beta = beta;
  return std::make_unique<SdagcCodec>(c);
}

// Elements [0, n/2) have gradients 100x larger than [n/2, n); each element
// keeps its sign and size from step to step, as a steady gradient does.
std::vector<float> two_scale_gradient(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> size(0.5f, 1.5f);
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    const float sign = (rng() & 1) ? 1.0f : -1.0f;
    g[i] = sign * size(rng) * (i < n / 2 ? 100.0f : 1.0f);
  }
  return g;
}

class NormalizedSelection : public ::testing::TestWithParam<std::string> {};

TEST_P(NormalizedSelection, ReachesTheElementsWithSmallGradientsThatMagnitudeStarves) {
  const size_t n = 20000;
  const auto g = two_scale_gradient(n, 7);
  size_t small_sent[2] = {0, 0};  // magnitude, normalized
  for (int normalized = 0; normalized < 2; ++normalized) {
    const auto codec = make_codec(GetParam(), normalized ? kBeta : 0.0f, 0.01);
    auto st = codec->make_state(n);
    Bytes payload;
    for (int step = 0; step < 50; ++step) {
      codec->encode(g.data(), n, *st, payload);
      for (uint32_t i : decode_sparse(payload, n).idx) small_sent[normalized] += i >= n / 2;
    }
  }
  // By magnitude the small half waits until its residual has grown 100x
  // (never, in 50 steps); normalized, both halves take turns.
  EXPECT_EQ(small_sent[0], 0u);
  EXPECT_GT(small_sent[1], 50u * 200u / 4u);
}

TEST_P(NormalizedSelection, SendsVItselfAndLosesNothing) {
  const size_t n = 5000;
  const auto codec = make_codec(GetParam(), kBeta, 0.02);
  auto st = codec->make_state(n);
  std::vector<double> accumulated(n, 0.0), sent(n, 0.0);
  Bytes payload;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (int step = 0; step < 40; ++step) {
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = normal(rng) * (i % 3 == 0 ? 30.0f : 0.1f);
    std::vector<float> v_before(st->v);
    for (size_t i = 0; i < n; ++i) {
      accumulated[i] += g[i];
      v_before[i] += g[i];
    }
    codec->encode(g.data(), n, *st, payload);
    const SparseEntries e = decode_sparse(payload, n);
    ASSERT_FALSE(e.idx.empty());
    for (size_t j = 0; j < e.idx.size(); ++j) {
      EXPECT_EQ(e.values[j], v_before[e.idx[j]]) << "a sent value is the residual, not its key";
      sent[e.idx[j]] += e.values[j];
    }
  }
  // What was sent plus what is held is what was accumulated.
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(sent[i] + st->v[i], accumulated[i], 1e-3 * (1.0 + std::fabs(accumulated[i])));
  }
  ASSERT_EQ(st->second_moment.size(), n);
}

TEST_P(NormalizedSelection, NonFiniteGradientsAreSentAndNeverEnterTheSecondMoment) {
  const size_t n = 4000;
  const auto codec = make_codec(GetParam(), kBeta, 0.01, 0.9f);
  auto st = codec->make_state(n);
  Bytes payload;
  std::vector<float> g(n, 0.5f);
  g[10] = std::numeric_limits<float>::quiet_NaN();
  g[11] = std::numeric_limits<float>::infinity();
  g[12] = 3e38f;  // finite, but its square overflows
  codec->encode(g.data(), n, *st, payload);
  const SparseEntries e = decode_sparse(payload, n);
  bool nan_sent = false, inf_sent = false;
  for (size_t j = 0; j < e.idx.size(); ++j) {
    nan_sent |= e.idx[j] == 10 && std::isnan(e.values[j]);
    inf_sent |= e.idx[j] == 11 && std::isinf(e.values[j]);
  }
  EXPECT_TRUE(nan_sent);
  EXPECT_TRUE(inf_sent);
  for (float s : st->second_moment) ASSERT_TRUE(std::isfinite(s) && s >= 0.0f);
  EXPECT_EQ(st->second_moment[10], 0.0f);
  EXPECT_EQ(st->second_moment[11], 0.0f);
  // The next steps go on with finite residuals and keys.
  std::fill(g.begin(), g.end(), 0.5f);
  for (int step = 0; step < 5; ++step) codec->encode(g.data(), n, *st, payload);
  for (float v : st->v) ASSERT_TRUE(std::isfinite(v));
  const size_t sent = decode_sparse(payload, n).idx.size();  // k = 40 (sdagc: 0.8k to 1.3k)
  EXPECT_GE(sent, 32u);
  EXPECT_LE(sent, 52u);
}

INSTANTIATE_TEST_SUITE_P(DgcAndSdagc, NormalizedSelection, ::testing::Values("dgc", "sdagc"));

TEST(NormalizedSelection, MagnitudeSelectionKeepsNoSecondMoment) {
  const size_t n = 1000;
  const auto codec = make_codec("dgc", 0.0f, 0.01);
  auto st = codec->make_state(n);
  Bytes payload;
  const std::vector<float> g(n, 1.0f);
  codec->encode(g.data(), n, *st, payload);
  EXPECT_TRUE(st->second_moment.empty());
}

TEST(NormalizedSelection, SbcRanksByNormalizedValueOnlyOverItsExactWarmUp) {
  const size_t n = 20000;
  const auto g = two_scale_gradient(n, 9);
  size_t small[2] = {0, 0};  // magnitude, normalized
  for (int normalized = 0; normalized < 2; ++normalized) {
    SbcConfig c;
    c.density = 0.01;
    c.warmup_steps = 4;
    c.exact_warmup = true;
    c.both_sides = true;
    c.second_moment_beta = normalized ? kBeta : 0.0f;
    SbcCodec codec(c);
    auto st = codec.make_state(n);
    Bytes payload;
    // The warm-up's last step (density 1/64) is still dgc's exact payload.
    for (int step = 0; step < 4; ++step) codec.encode(g.data(), n, *st, payload);
    for (uint32_t i : decode_sparse(payload, n).idx) small[normalized] += i >= n / 2;
    EXPECT_EQ(st->second_moment.size(), normalized ? n : 0u);
    // After the warm-up sbc binarises by value, normalized or not.
    codec.encode(g.data(), n, *st, payload);
    EXPECT_EQ(peek_format(payload), PayloadFormat::kSbc);
  }
  EXPECT_EQ(small[0], 0u);
  EXPECT_GT(small[1], 0u);
}

TEST(NormalizedSelection, RejectsABetaOutsideZeroToOne) {
  for (float beta : {-0.1f, 1.0f, 1.5f}) {
    DgcConfig c;
    c.second_moment_beta = beta;
    EXPECT_THROW(DgcCodec{c}, Error) << beta;
    EXPECT_THROW(SdagcCodec{static_cast<const SparsifyConfig&>(c)}, Error) << beta;
  }
}

}  // namespace
}  // namespace compcoll
