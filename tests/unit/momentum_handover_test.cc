// COMPCOLL_MOMENTUM_HANDOVER: an optimizer that keeps its SGD momentum m and
// receives s_t - m * s_(t-1) ends each step with its buffer equal to DGC's
// corrected update s_t; non-finite values reach the output without poisoning
// the mirror; the setting is refused where there is nothing to hand over.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "collectives/momentum_handover.h"
#include "collectives/registry.h"
#include "collectives/self_comm.h"
#include "compcoll/error.h"
#include "integration/bench/gradients.h"

namespace compcoll {
namespace {

AlgoParams corrected(float m, bool handover) {
  AlgoParams p;
  p.density = 0.01;
  p.momentum = m;
  p.momentum_handover = handover;
  p.warmup_steps = 20;  // the ramp changes nothing here; run through it anyway
  return p;
}

class HandoverTest : public ::testing::TestWithParam<const char*> {};

// Two runs on the same gradients: plain DGC momentum correction (what DGC
// steps by: s_t) and the hand-over, whose output feeds torch's SGD momentum
// rule (buf = g on the first step, then buf = m*buf + g). The optimizer's
// buffer must equal s_t at every step; without the hand-over it would be the
// momentum of s, several times larger.
TEST_P(HandoverTest, OptimizerMomentumBufferEqualsTheCorrectedUpdate) {
  const float m = 0.9f;
  const size_t n = 20000;
  SelfComm comm;
  const auto plain = make_algorithm(GetParam(), corrected(m, false));
  const auto handed = make_algorithm(GetParam(), corrected(m, true));
  auto sp = plain->make_state(n, 1);
  auto sh = handed->make_state(n, 1);
  ASSERT_EQ(sh->handed.size(), n);
  std::vector<double> buf(n, 0.0);
  double worst = 0.0, scale = 0.0, s_norm = 0.0, momentum_of_s_gap = 0.0;
  std::vector<double> naive(n, 0.0);  // the optimizer's buffer fed s_t itself
  for (int step = 0; step < 60; ++step) {
    const auto g = bench::make_gradient(bench::GradientKind::kMixedScale, n, 300 + step);
    std::vector<float> s(g), d(g);
    plain->allreduce(comm, s.data(), n, false, *sp);
    handed->allreduce(comm, d.data(), n, false, *sh);
    // delta's float rounding (relative 6e-8 of m*s_(t-1)) decays in buf by m
    // per step: compare against the largest |s| so far, not element-wise.
    double gap = 0.0;
    for (size_t i = 0; i < n; ++i) {
      buf[i] = step == 0 ? d[i] : m * buf[i] + d[i];
      naive[i] = step == 0 ? s[i] : m * naive[i] + s[i];
      scale = std::max(scale, std::fabs(double(s[i])));
      gap = std::max(gap, std::fabs(buf[i] - s[i]));
      s_norm += double(s[i]) * s[i];
      momentum_of_s_gap += (naive[i] - s[i]) * (naive[i] - s[i]);
    }
    worst = std::max(worst, gap / scale);
    // The mirror is the last s_t, bit for bit.
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(sh->handed[i], s[i]) << "step " << step << " at " << i;
  }
  EXPECT_LT(worst, 1e-5);
  // The comparison means something: feeding s_t directly is far off.
  EXPECT_GT(momentum_of_s_gap, 0.5 * s_norm);
}

INSTANTIATE_TEST_SUITE_P(CorrectingAlgorithms, HandoverTest,
                         ::testing::Values("dgc", "sdagc", "sbc", "csc"));

TEST(Handover, NonFiniteValuesReachTheOutputAndDoNotPoisonTheMirror) {
  std::vector<float> handed = {1.0f, 2.0f, 3.0f};
  std::vector<float> buf = {std::numeric_limits<float>::quiet_NaN(), 4.0f,
                            std::numeric_limits<float>::infinity()};
  hand_over_momentum(buf.data(), handed.data(), 3, 0.5f);
  EXPECT_TRUE(std::isnan(buf[0]));
  EXPECT_EQ(buf[1], 4.0f - 0.5f * 2.0f);
  EXPECT_TRUE(std::isinf(buf[2]));
  EXPECT_EQ(handed, (std::vector<float>{0.0f, 4.0f, 0.0f}));
  // The next finite step hands over a finite value.
  buf = {1.0f, 1.0f, 1.0f};
  hand_over_momentum(buf.data(), handed.data(), 3, 0.5f);
  EXPECT_EQ(buf, (std::vector<float>{1.0f, -1.0f, 1.0f}));
}

TEST(Handover, IsRefusedWithoutAMomentumCorrectionToHandOver) {
  auto message = [](const char* algo, float m) {
    try {
      make_algorithm(algo, corrected(m, true));
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (const char* algo : {"onebit", "dense", "auto"}) {
    EXPECT_NE(message(algo, 0.9f).find("COMPCOLL_MOMENTUM_HANDOVER=1 with COMPCOLL_ALGO="),
              std::string::npos)
        << algo;
  }
  EXPECT_NE(message("dgc", 0.0f).find("needs COMPCOLL_MOMENTUM in (0, 1)"), std::string::npos);
  EXPECT_EQ(message("dgc", 0.9f), "no error");
}

TEST(Handover, EntersTheAgreementDescription) {
  EXPECT_NE(corrected(0.9f, true).canonical(), corrected(0.9f, false).canonical());
  AlgoParams unmasked;
  unmasked.momentum_masking_density = 0.0;
  EXPECT_NE(unmasked.canonical(), AlgoParams{}.canonical());
}

}  // namespace
}  // namespace compcoll
