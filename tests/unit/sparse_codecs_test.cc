// Properties every sparsifying codec (dgc, sdagc, sbc) must have, checked
// through the common SparseCodec interface.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "compcoll/error.h"
#include "compression/decode.h"
#include "compression/dgc.h"
#include "compression/sbc.h"
#include "compression/sdagc.h"
#include "compression/sparse_payload.h"
#include "integration/bench/gradients.h"

namespace compcoll {
namespace {

using bench::GradientKind;

std::unique_ptr<SparseCodec> make(const std::string& algo, double density) {
  if (algo == "dgc") {
    DgcConfig c;
    c.density = density;
    return std::make_unique<DgcCodec>(c);
  }
  if (algo == "sdagc") {
    SdagcConfig c;
    c.density = density;
    return std::make_unique<SdagcCodec>(c);
  }
  SbcConfig c;
  c.density = density;
  return std::make_unique<SbcCodec>(c);
}

class SparseCodecTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SparseCodecTest, DecodeReturnsExactlyTheSelectedValues) {
  const size_t n = 200000;
  auto codec = make(GetParam(), 0.001);
  auto st = codec->make_state(n);
  const auto g = bench::make_gradient(GradientKind::kGaussian, n, 1);
  Bytes payload;
  codec->encode(g.data(), n, *st, payload);
  std::vector<float> out(n, 0.0f);
  decode_accumulate(payload, out.data(), n);
  size_t sent = 0;
  if (GetParam() == "sbc") {
    const SbcEntries e = decode_sbc(payload, n);
    double s = 0;
    for (uint32_t i : e.idx) s += g[i];
    EXPECT_NEAR(e.means[0], s / e.idx.size(), 1e-5);
    for (uint32_t i : e.idx) {
      EXPECT_EQ(out[i], e.means[0]);
      EXPECT_EQ(st->v[i], g[i] - e.means[0]);  // binarisation error stays behind
    }
    sent = e.idx.size();
  } else {
    const SparseEntries e = decode_sparse(payload, n);
    for (size_t j = 0; j < e.idx.size(); ++j) {
      EXPECT_EQ(e.values[j], g[e.idx[j]]);  // first step from a zero state: v = g
      EXPECT_EQ(out[e.idx[j]], g[e.idx[j]]);
      EXPECT_EQ(st->v[e.idx[j]], 0.0f);
    }
    sent = e.idx.size();
  }
  size_t nonzero = 0;
  for (float x : out) nonzero += x != 0.0f;
  EXPECT_EQ(nonzero, sent);
  EXPECT_GE(sent, 160u);  // within [0.8k, 1.3k] of k = 200
  EXPECT_LE(sent, 260u);
}

TEST_P(SparseCodecTest, SentPlusResidualEqualsTheAccumulatedInputOver100Steps) {
  const size_t n = 50000;
  auto codec = make(GetParam(), 0.01);
  auto st = codec->make_state(n);
  std::vector<double> input(n, 0.0), sent(n, 0.0);
  std::vector<float> out(n);
  Bytes payload;
  for (int step = 0; step < 100; ++step) {
    const auto g = bench::make_gradient(GradientKind::kMixedScale, n, 100 + step);
    for (size_t i = 0; i < n; ++i) input[i] += g[i];
    codec->encode(g.data(), n, *st, payload);
    std::fill(out.begin(), out.end(), 0.0f);
    decode_accumulate(payload, out.data(), n);
    for (size_t i = 0; i < n; ++i) sent[i] += out[i];
  }
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double err = std::fabs(sent[i] + st->v[i] - input[i]);
    worst = std::max(worst, err / (1.0 + std::fabs(input[i])));
  }
  EXPECT_LT(worst, 1e-4);
}

struct BandCase {
  std::string algo;
  GradientKind kind;
};

class DensityBandTest : public ::testing::TestWithParam<BandCase> {};

TEST_P(DensityBandTest, RealisedDensityStaysWithinPointEightToOnePointThreeOfTarget) {
  const size_t n = 1 << 20;
  const double d = 0.001;
  auto codec = make(GetParam().algo, d);
  auto st = codec->make_state(n);
  Bytes payload;
  const size_t k = target_count(d, n);
  for (int step = 0; step < 30; ++step) {
    const auto g = bench::make_gradient(GetParam().kind, n, 7 + step);
    const EncodeInfo info = codec->encode(g.data(), n, *st, payload);
    EXPECT_GE(info.sent, k * 8 / 10) << "step " << step;
    EXPECT_LE(info.sent, k * 13 / 10) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, DensityBandTest,
    ::testing::Values(BandCase{"dgc", GradientKind::kGaussian}, BandCase{"dgc", GradientKind::kStudentT3},
                      BandCase{"dgc", GradientKind::kMixedScale},
                      BandCase{"sdagc", GradientKind::kGaussian},
                      BandCase{"sdagc", GradientKind::kStudentT3},
                      BandCase{"sdagc", GradientKind::kMixedScale},
                      BandCase{"sbc", GradientKind::kGaussian}),
    [](const auto& info) {
      return info.param.algo + "_" + bench::gradient_kind_name(info.param.kind);
    });

TEST_P(SparseCodecTest, ZeroGradientSendsNothingAndTinyTensorsStillWork) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{1000}}) {
    auto codec = make(GetParam(), 0.001);
    auto st = codec->make_state(n);
    std::vector<float> zero(n, 0.0f), out(n, 0.0f);
    Bytes payload;
    codec->encode(zero.data(), n, *st, payload);
    decode_accumulate(payload, out.data(), n);
    EXPECT_EQ(out, zero);
    std::vector<float> one(n, 0.0f);
    if (n) one[n - 1] = 3.0f;
    codec->encode(one.data(), n, *st, payload);
    decode_accumulate(payload, out.data(), n);
    if (n) {
      EXPECT_EQ(out[n - 1], 3.0f) << "n=" << n;
    }
  }
}

TEST_P(SparseCodecTest, DecoderRejectsEveryTruncationOfARealPayload) {
  const size_t n = 30000;
  auto codec = make(GetParam(), 0.01);
  auto st = codec->make_state(n);
  const auto g = bench::make_gradient(GradientKind::kGaussian, n, 3);
  Bytes payload;
  codec->encode(g.data(), n, *st, payload);
  std::vector<float> out(n, 0.0f);
  for (size_t len = 0; len < payload.size(); ++len) {
    EXPECT_THROW(decode_accumulate({payload.data(), len}, out.data(), n), Error) << len;
  }
  EXPECT_EQ(out, std::vector<float>(n, 0.0f));
}

TEST_P(SparseCodecTest, StateOfTheWrongSizeIsRejected) {
  auto codec = make(GetParam(), 0.01);
  auto st = codec->make_state(10);
  std::vector<float> g(11, 1.0f);
  Bytes payload;
  EXPECT_THROW(codec->encode(g.data(), 11, *st, payload), Error);
}

INSTANTIATE_TEST_SUITE_P(Codecs, SparseCodecTest, ::testing::Values("dgc", "sdagc", "sbc"));

TEST(SparseCodecs, NonFiniteValuesAreSentAndDoNotPoisonTheResidual) {
  for (const std::string algo : {"dgc", "sdagc", "sbc"}) {
    const size_t n = 10000;
    auto codec = make(algo, 0.01);
    auto st = codec->make_state(n);
    auto g = bench::make_gradient(GradientKind::kGaussian, n, 9);
    g[17] = NAN;
    g[4242] = INFINITY;
    Bytes payload;
    codec->encode(g.data(), n, *st, payload);
    std::vector<float> out(n, 0.0f);
    decode_accumulate(payload, out.data(), n);
    EXPECT_TRUE(std::isnan(out[17])) << algo;
    EXPECT_TRUE(std::isinf(out[4242])) << algo;
    for (float v : st->v) ASSERT_TRUE(std::isfinite(v)) << algo;
    // The next clean step behaves normally.
    const auto clean = bench::make_gradient(GradientKind::kGaussian, n, 10);
    const EncodeInfo info = codec->encode(clean.data(), n, *st, payload);
    EXPECT_GE(info.sent, 80u) << algo;
    EXPECT_LE(info.sent, 130u) << algo;
  }
}

// sdagc's threshold is lambda times the standard deviation of v. A NaN or
// Inf in v (or float lane sums that overflow) must not make that sigma 0:
// the threshold would fall to its floor, every nonzero element would become
// a candidate (about 1.24 k sent here, and twice the encode time) and lambda
// would not be adapted. Its moments are taken over the finite values.
TEST(SparseCodecs, SdagcSetsItsThresholdFromTheFiniteValuesWhenOneIsNotFinite) {
  const size_t n = size_t{1} << 20;
  SdagcConfig c;
  c.density = 0.001;
  const SdagcCodec codec(c);
  for (const float bad : {NAN, INFINITY, -INFINITY}) {
    auto clean_state = codec.make_state(n);
    auto bad_state = codec.make_state(n);
    Bytes payload;
    for (uint64_t seed = 1; seed <= 2; ++seed) {
      const auto g = bench::make_gradient(GradientKind::kGaussian, n, seed);
      codec.encode(g.data(), n, *clean_state, payload);
      codec.encode(g.data(), n, *bad_state, payload);
    }
    ASSERT_EQ(clean_state->lambda, bad_state->lambda);
    const float lambda_before = bad_state->lambda;
    auto g = bench::make_gradient(GradientKind::kGaussian, n, 3);
    const EncodeInfo clean = codec.encode(g.data(), n, *clean_state, payload);
    g[123] = bad;
    const EncodeInfo with_bad = codec.encode(g.data(), n, *bad_state, payload);
    // The same selection but for the one non-finite entry, sent as well.
    EXPECT_LE(with_bad.sent, clean.sent + 2) << bad;
    EXPECT_GE(with_bad.sent + 2, clean.sent) << bad;
    EXPECT_NEAR(with_bad.threshold, clean.threshold, 0.01 * clean.threshold) << bad;
    // And lambda adapted as on the clean step.
    EXPECT_NE(bad_state->lambda, lambda_before) << bad;
    EXPECT_NEAR(bad_state->lambda, clean_state->lambda, 0.01 * clean_state->lambda) << bad;
  }
}

}  // namespace
}  // namespace compcoll
