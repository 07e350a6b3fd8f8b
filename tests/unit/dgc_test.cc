// DGC specifics: exact top-k selection, momentum correction and factor
// masking against a scalar reference, local clipping, warm-up, sdagc's lambda.
#include <gtest/gtest.h>

#include <limits>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>

#include "compcoll/error.h"
#include "compression/dgc.h"
#include "compression/sdagc.h"
#include "compression/sparse_payload.h"
#include "integration/bench/gradients.h"

namespace compcoll {
namespace {

using bench::GradientKind;

TEST(Dgc, SelectsTheExactTopKByMagnitudeNeverByPosition) {
  const size_t n = 300000;
  DgcConfig c;
  c.density = 0.001;
  DgcCodec codec(c);
  auto st = codec.make_state(n);
  Bytes payload;
  for (int step = 0; step < 5; ++step) {
    const auto g = bench::make_gradient(GradientKind::kStudentT3, n, 40 + step);
    std::vector<float> v(st->v.begin(), st->v.end());
    for (size_t i = 0; i < n; ++i) v[i] += g[i];
    codec.encode(g.data(), n, *st, payload);
    const SparseEntries e = decode_sparse(payload, n);
    ASSERT_EQ(e.idx.size(), 300u);
    std::vector<float> mags(n);
    for (size_t i = 0; i < n; ++i) mags[i] = std::fabs(v[i]);
    std::nth_element(mags.begin(), mags.begin() + 299, mags.end(), std::greater<float>());
    const float kth = mags[299];
    for (uint32_t i : e.idx) EXPECT_GE(std::fabs(v[i]), kth);
  }
}

// Scalar reference of DGC's momentum correction with factor masking.
struct ReferenceDgc {
  std::vector<double> u, v;
  float m;
  bool nesterov;
  bool masking;
  void step(const std::vector<float>& g) {
    for (size_t i = 0; i < g.size(); ++i) {
      if (nesterov) {
        u[i] = (u[i] + g[i]) * m;
        v[i] += u[i] + g[i];
      } else {
        u[i] = m * u[i] + g[i];
        v[i] += u[i];
      }
    }
  }
  void mask(const std::vector<uint32_t>& sent) {
    for (uint32_t i : sent) {
      v[i] = 0.0;
      if (masking) u[i] = 0.0;
    }
  }
};

// (Nesterov, momentum factor masking).
class DgcMomentumTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(DgcMomentumTest, MatchesTheReferenceStepByStep) {
  const size_t n = 20000;
  DgcConfig c;
  c.density = 0.01;
  c.momentum = 0.9f;
  c.nesterov = std::get<0>(GetParam());
  c.mask_density = std::get<1>(GetParam()) ? 1.0 : 0.0;
  DgcCodec codec(c);
  auto st = codec.make_state(n);
  const bool masking = std::get<1>(GetParam());
  ReferenceDgc ref{std::vector<double>(n), std::vector<double>(n), c.momentum, c.nesterov,
                   masking};
  size_t kept_velocity = 0;  // sent elements whose velocity survived (masking off)
  Bytes payload;
  for (int step = 0; step < 20; ++step) {
    const auto g = bench::make_gradient(GradientKind::kGaussian, n, 70 + step);
    ref.step(g);
    codec.encode(g.data(), n, *st, payload);
    const SparseEntries e = decode_sparse(payload, n);
    for (size_t j = 0; j < e.idx.size(); ++j) {
      EXPECT_NEAR(e.values[j], ref.v[e.idx[j]], 1e-3 * (1 + std::fabs(ref.v[e.idx[j]])));
    }
    ref.mask(e.idx);
    for (uint32_t i : e.idx) {
      if (masking) {
        EXPECT_EQ(st->u[i], 0.0f);  // momentum factor masking
      }
      kept_velocity += st->u[i] != 0.0f;
    }
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::fabs(st->v[i] - ref.v[i]) / (1 + std::fabs(ref.v[i])));
      worst = std::max(worst, std::fabs(st->u[i] - ref.u[i]) / (1 + std::fabs(ref.u[i])));
    }
    ASSERT_LT(worst, 1e-4) << "step " << step;
  }
  // Without masking the sent elements keep their velocity (the comparison
  // with the reference above checks its value).
  if (!masking) {
    EXPECT_GT(kept_velocity, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(PlainAndNesterovMaskedOrNot, DgcMomentumTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

// Sends everything (the payload is the clipped gradient), clipped to
// 8 / sqrt(4) = 4.
DgcConfig sending_everything_clipped_to_4() {
  DgcConfig c;
  c.density = 1.0;
  c.clip = 8.0f;
  c.world_size = 4;
  return c;
}

TEST(Dgc, LocalClippingBoundsTheGradientNormByClipOverRootN) {
  const size_t n = 10000;
  DgcCodec codec(sending_everything_clipped_to_4());
  auto st = codec.make_state(n);
  const auto g = bench::make_gradient(GradientKind::kGaussian, n, 5);  // norm ~100
  Bytes payload;
  codec.encode(g.data(), n, *st, payload);
  const SparseEntries e = decode_sparse(payload, n);
  double norm = 0;
  for (float x : e.values) norm += double(x) * x;
  EXPECT_NEAR(std::sqrt(norm), 8.0 / 2.0, 1e-3);
  // A gradient already inside the bound is untouched.
  std::vector<float> small(n, 0.0f);
  small[3] = 1.0f;
  codec.encode(small.data(), n, *st, payload);
  EXPECT_EQ(decode_sparse(payload, n).values[0], 1.0f);
}

// A NaN or Inf element does not turn clipping off for the rest of the
// tensor: the finite elements are clipped by their own norm.
TEST(Dgc, ANonFiniteElementLeavesTheRestClipped) {
  const size_t n = 10000;
  DgcCodec codec(sending_everything_clipped_to_4());
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity()}) {
    auto st = codec.make_state(n);
    auto g = bench::make_gradient(GradientKind::kGaussian, n, 5);  // norm ~100
    g[7] = bad;
    Bytes payload;
    codec.encode(g.data(), n, *st, payload);
    const SparseEntries e = decode_sparse(payload, n);
    double norm = 0;
    for (float x : e.values) {
      if (std::isfinite(x)) norm += double(x) * x;
    }
    EXPECT_NEAR(std::sqrt(norm), 8.0 / 2.0, 1e-3) << bad;
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(st->v[i])) << i;
  }
}

TEST(Dgc, MomentumMaskingAppliesOnlyAtStepsAtOrBelowTheMaskingDensity) {
  // Warm-up stages 0.25 (steps 0-1), 0.0625 (2-3), ...: with masking at
  // density <= 0.1 the first stage keeps the velocity of what it sent and
  // the later ones zero it.
  const size_t n = 20000;
  for (const char* codec_name : {"dgc", "sdagc"}) {
    SparsifyConfig c;
    c.density = 0.001;
    c.momentum = 0.9f;
    c.warmup_steps = 8;
    c.mask_density = 0.1;
    std::unique_ptr<SparseCodec> codec;
    if (std::string(codec_name) == "dgc") {
      DgcConfig dc;
      static_cast<SparsifyConfig&>(dc) = c;
      codec = std::make_unique<DgcCodec>(dc);
    } else {
      codec = std::make_unique<SdagcCodec>(c);
    }
    auto st = codec->make_state(n);
    Bytes payload;
    for (int step = 0; step < 6; ++step) {
      const auto g = bench::make_gradient(GradientKind::kGaussian, n, 90 + step);
      codec->encode(g.data(), n, *st, payload);
      size_t kept = 0;
      for (uint32_t i : decode_sparse(payload, n).idx) kept += st->u[i] != 0.0f;
      if (step < 2) {
        EXPECT_GT(kept, 0u) << codec_name << " step " << step;
      } else {
        EXPECT_EQ(kept, 0u) << codec_name << " step " << step;
      }
    }
  }
  SparsifyConfig bad;
  bad.mask_density = 1.5;
  EXPECT_THROW(validate_sparsify_config(bad, "dgc"), Error);
}

// COMPCOLL_WARMUP_SHAPE=smooth: the stages' fall, geometric at every step,
// through each stage's density at the middle of its part of the warm-up.
TEST(Dgc, SmoothWarmUpFallsAtEveryStepThroughTheStagesMiddles) {
  const WarmupShape smooth = WarmupShape::kSmooth;
  // d = 0.001, W = 400: S = 4 parts of 100 steps; 0.25^(1/2 + step / 100).
  EXPECT_DOUBLE_EQ(warmup_density(0.001, 400, 0, smooth), 0.25);
  EXPECT_DOUBLE_EQ(warmup_density(0.001, 400, 50, smooth), 0.25);  // capped until the first middle
  EXPECT_DOUBLE_EQ(warmup_density(0.001, 400, 150, smooth), 0.0625);
  EXPECT_DOUBLE_EQ(warmup_density(0.001, 400, 250, smooth), 0.015625);
  EXPECT_DOUBLE_EQ(warmup_density(0.001, 400, 350, smooth), 0.00390625);
  EXPECT_DOUBLE_EQ(warmup_density(0.001, 400, 400, smooth), 0.001);
  double previous = 1.0;
  for (uint64_t s = 0; s < 420; ++s) {
    const double d = warmup_density(0.001, 400, s, smooth);
    EXPECT_LE(d, previous) << s;  // never rises
    EXPECT_GE(d, 0.001) << s;     // never below the target
    if (s > 50 && s < 390) {
      EXPECT_LT(d, previous) << s;  // falls at every step in between
    }
    // Within a factor 2 of the stages' density at every step of the warm-up.
    const double staged = warmup_density(0.001, 400, s, WarmupShape::kStages);
    EXPECT_LE(d, 2.0 * staged * (1 + 1e-12)) << s;
    EXPECT_GE(d, 0.5 * staged * (1 - 1e-12)) << s;
    previous = d;
  }
  EXPECT_DOUBLE_EQ(warmup_density(0.001, 0, 0, smooth), 0.001);
  EXPECT_DOUBLE_EQ(warmup_density(0.5, 8, 0, smooth), 0.5);
  EXPECT_STREQ(warmup_shape_name(smooth), "smooth");
  EXPECT_STREQ(warmup_shape_name(WarmupShape::kStages), "stages");
}

TEST(Dgc, WarmUpRaisesSparsityExponentially) {
  // d = 0.001 over W = 8 steps: stages 0.25, 0.0625, 0.015625, 0.00390625
  // (two steps each), then 0.001.
  const double expected[] = {0.25, 0.25, 0.0625, 0.0625, 0.015625, 0.015625,
                             0.00390625, 0.00390625, 0.001, 0.001};
  const WarmupShape stages = WarmupShape::kStages;
  for (int s = 0; s < 10; ++s) EXPECT_DOUBLE_EQ(warmup_density(0.001, 8, s, stages), expected[s]) << s;
  EXPECT_DOUBLE_EQ(warmup_density(0.001, 0, 0, stages), 0.001);
  EXPECT_DOUBLE_EQ(warmup_density(0.5, 8, 0, stages), 0.5);

  const size_t n = 100000;
  DgcConfig c;
  c.density = 0.001;
  c.warmup_steps = 8;
  DgcCodec codec(c);
  auto st = codec.make_state(n);
  Bytes payload;
  for (int s = 0; s < 10; ++s) {
    const auto g = bench::make_gradient(GradientKind::kGaussian, n, 90 + s);
    const EncodeInfo info = codec.encode(g.data(), n, *st, payload);
    EXPECT_DOUBLE_EQ(info.density, expected[s]);
    const size_t k = target_count(expected[s], n);
    EXPECT_GE(info.sent, k * 8 / 10) << "step " << s;
    EXPECT_LE(info.sent, k) << "step " << s;  // dgc trims any excess to exactly k
  }
}

TEST(Dgc, RejectsInvalidConfiguration) {
  DgcConfig c;
  c.density = 0.0;
  EXPECT_THROW(DgcCodec{c}, Error);
  c.density = 1.5;
  EXPECT_THROW(DgcCodec{c}, Error);
  c.density = 0.01;
  c.momentum = 1.0f;
  EXPECT_THROW(DgcCodec{c}, Error);
  c.momentum = 0.0f;
  c.clip = -1.0f;
  EXPECT_THROW(DgcCodec{c}, Error);
  c.clip = 0.0f;
  c.warmup_steps = -2;
  EXPECT_THROW(DgcCodec{c}, Error);
  try {
    c.warmup_steps = 0;
    c.density = 2.0;
    DgcCodec bad(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("density 2 is outside (0, 1]"), std::string::npos)
        << e.what();
  }
}

TEST(Dgc, ShortValuesKeepTheirRoundingErrorInTheResidual) {
  const size_t n = 50000;
  for (const SparseEncoding enc : {SparseEncoding{ValueType::kFp16, IndexType::kVarintGap},
                                   SparseEncoding{ValueType::kFp8, IndexType::kRiceGap}}) {
    DgcConfig c;
    c.density = 0.01;
    c.encoding = enc;
    DgcCodec codec(c);
    auto st = codec.make_state(n);
    const auto g = bench::make_gradient(GradientKind::kGaussian, n, 12);
    Bytes payload;
    codec.encode(g.data(), n, *st, payload);
    const SparseEntries e = decode_sparse(payload, n);
    ASSERT_GT(e.idx.size(), 400u) << value_type_name(enc.values);  // about 1 %
    size_t rounded = 0;
    for (size_t j = 0; j < e.idx.size(); ++j) {
      EXPECT_EQ(e.values[j] + st->v[e.idx[j]], g[e.idx[j]]) << value_type_name(enc.values);
      rounded += e.values[j] != g[e.idx[j]];
    }
    EXPECT_GT(rounded, 0u) << value_type_name(enc.values);  // the type did round
  }
}

TEST(Sdagc, LambdaStartsAtTheGaussianQuantileAndAdapts) {
  EXPECT_NEAR(gaussian_two_sided_quantile(0.001), 3.2905, 1e-3);
  EXPECT_NEAR(gaussian_two_sided_quantile(0.05), 1.95996, 1e-4);
  SdagcConfig c;
  SdagcCodec codec(c);
  const size_t n = 1 << 20;
  auto st = codec.make_state(n);
  EXPECT_NEAR(st->lambda, 3.2905, 1e-3);
  Bytes payload;
  const auto g = bench::make_gradient(GradientKind::kStudentT3, n, 1);
  codec.encode(g.data(), n, *st, payload);
  // Student t(3): sigma = sqrt(3), and |t| > 11.2 has probability 0.001, so
  // lambda moves to about 11.2 / 1.73 = 6.5 (times the headroom below 1).
  EXPECT_GT(st->lambda, 5.0f);
  EXPECT_LT(st->lambda, 8.0f);
}

}  // namespace
}  // namespace compcoll

namespace compcoll {
namespace {

// COMPCOLL_CODEC_THREADS: the encode's pass split over threads gives the
// bits of one thread (payload, residual, velocity), whatever the number (8:
// more threads than ranges), with
// momentum or without, with a host's addends straddling the ranges, over a
// warm-up, and when more elements pass the threshold than the pass keeps
// (all magnitudes equal: every element is a candidate).
TEST(DgcThreads, AnyNumberOfThreadsGivesTheBitsOfOne) {
  const size_t n = 3 * kDgcElemsPerThread + 1234;  // three ranges and a ragged end
  for (const int mode : {0, 1, 2}) {
    for (const bool addends : {false, true}) {
      for (const bool flat : {false, true}) {
        DgcConfig c;
        c.density = 0.002;
        c.momentum = mode ? 0.9f : 0.0f;
        c.nesterov = mode == 2;
        c.warmup_steps = 2;
        c.encoding = {ValueType::kFp8, IndexType::kRiceGap};
        const std::string what = "mode " + std::to_string(mode) + (addends ? " addends" : "") +
                                 (flat ? " equal magnitudes" : "");
        std::vector<Bytes> one;
        std::unique_ptr<CodecState> one_state;
        for (const int threads : {1, 2, 8}) {
          c.threads = threads;
          DgcCodec codec(c);
          auto st = codec.make_state(n);
          std::vector<Bytes> got;
          for (int step = 0; step < 3; ++step) {
            auto g = bench::make_gradient(GradientKind::kMixedScale, n, 7 + step);
            if (flat) std::fill(g.begin(), g.end(), step % 2 ? -0.5f : 0.25f);
            // A second rank's buffer over [n/3, n/3 + n/2): it starts inside
            // one range and ends inside another.
            const auto other = bench::make_gradient(GradientKind::kGaussian, n / 2, 90 + step);
            Addends add;
            if (addends) add = Addends{{other.data()}, n / 3, n / 2};
            got.emplace_back();
            codec.encode_sum(g.data(), add, n, *st, got.back());
          }
          if (threads == 1) {
            one = got;
            one_state = std::move(st);
            continue;
          }
          for (size_t s = 0; s < got.size(); ++s) {
            ASSERT_EQ(got[s], one[s]) << what << ", " << threads << " threads, step " << s;
          }
          ASSERT_EQ(st->v, one_state->v) << what << ", " << threads << " threads";
          ASSERT_EQ(st->u, one_state->u) << what << ", " << threads << " threads";
        }
      }
    }
  }
}

TEST(DgcThreads, ZeroThreadsIsRefused) {
  DgcConfig c;
  c.threads = 0;
  EXPECT_THROW(DgcCodec{c}, Error);
}

}  // namespace
}  // namespace compcoll
