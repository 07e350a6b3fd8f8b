// rescale_codec_state: a loss scale that changes during training (mixed
// precision, torch.amp.GradScaler) multiplies every gradient an algorithm
// sees; with the state rescaled at each change, every call's result is the
// unscaled run's result times the scale of the moment, bit for bit (the
// scales are powers of two, as GradScaler's are, so every product is
// exact). Without the rescale, what the state kept comes back in the old
// unit.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "collectives/registry.h"
#include "collectives/self_comm.h"
#include "compcoll/error.h"
#include "compression/state_scale.h"
#include "integration/bench/gradients.h"

namespace compcoll {
namespace {

struct Case {
  const char* algo;
  float momentum;
  bool handover;
};

std::string name_of(const ::testing::TestParamInfo<Case>& info) {
  std::string n = info.param.algo;
  if (info.param.momentum > 0) n += "_momentum";
  if (info.param.handover) n += "_handover";
  return n;
}

AlgoParams params_of(const Case& c) {
  AlgoParams p;
  p.density = 0.01;
  p.momentum = c.momentum;
  p.momentum_handover = c.handover;
  p.warmup_steps = 10;  // through the warm-up's denser steps too
  return p;
}

// The loss scale at each step: halvings in a row (overflow at the start of
// training), a stretch, a doubling (growth), another halving.
float scale_at(int step) {
  if (step < 6) return std::ldexp(1.0f, 16 - step);
  if (step < 20) return std::ldexp(1.0f, 10);
  if (step < 26) return std::ldexp(1.0f, 11);
  return std::ldexp(1.0f, 10);
}

// Runs the same gradient stream unscaled and scaled; returns the largest
// |scaled result / scale - unscaled result| over all calls, relative to the
// largest unscaled |result|.
double worst_gap(const Case& c, bool rescale) {
  const size_t n = 20000;
  SelfComm comm;
  const auto algo = make_algorithm(c.algo, params_of(c));
  auto plain_state = algo->make_state(n, 1);
  auto scaled_state = algo->make_state(n, 1);
  double worst = 0.0, largest = 0.0;
  for (int step = 0; step < 32; ++step) {
    const float s = scale_at(step);
    if (rescale && step > 0 && s != scale_at(step - 1)) {
      rescale_codec_state(*scaled_state, s / scale_at(step - 1));
    }
    const auto g = bench::make_gradient(bench::GradientKind::kMixedScale, n, 500 + step);
    std::vector<float> plain(g), scaled(g);
    for (float& x : scaled) x *= s;
    algo->allreduce(comm, plain.data(), n, false, *plain_state);
    algo->allreduce(comm, scaled.data(), n, false, *scaled_state);
    for (size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::fabs(double(scaled[i]) / s - double(plain[i])));
      largest = std::max(largest, std::fabs(double(plain[i])));
    }
  }
  return largest > 0 ? worst / largest : worst;
}

class StateScaleTest : public ::testing::TestWithParam<Case> {};

TEST_P(StateScaleTest, RescaledStateGivesTheUnscaledResultsTimesTheScaleExactly) {
  EXPECT_EQ(worst_gap(GetParam(), /*rescale=*/true), 0.0);
}

TEST_P(StateScaleTest, WithoutTheRescaleTheOldUnitComesBack) {
  // The control: the stream above does leave state across its scale
  // changes, so the property is not met by accident.
  EXPECT_GT(worst_gap(GetParam(), /*rescale=*/false), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(EveryAlgorithm, StateScaleTest,
                         ::testing::Values(Case{"dgc", 0.0f, false}, Case{"dgc", 0.9f, false},
                                           Case{"dgc", 0.9f, true}, Case{"sdagc", 0.0f, false},
                                           Case{"sbc", 0.0f, false}, Case{"csc", 0.0f, false},
                                           Case{"onebit", 0.0f, false}),
                         name_of);

TEST(StateScale, FieldsInGradientUnitsScaleAndTheOthersStay) {
  CodecState st(3);
  st.v = {1.0f, -2.0f, 4.0f};
  st.u = {0.5f, 0.0f, -1.0f};
  st.handed = {2.0f, 2.0f, 2.0f};
  st.second_moment = {1.0f, 4.0f, 9.0f};
  st.lambda = 2.5f;
  st.steps = 7;
  st.regions = {0, 2, 3};
  rescale_codec_state(st, 0.5f);
  EXPECT_EQ(st.v, (std::vector<float>{0.5f, -1.0f, 2.0f}));
  EXPECT_EQ(st.u, (std::vector<float>{0.25f, 0.0f, -0.5f}));
  EXPECT_EQ(st.handed, (std::vector<float>{1.0f, 1.0f, 1.0f}));
  EXPECT_EQ(st.second_moment, (std::vector<float>{0.25f, 1.0f, 2.25f}));  // squares: factor^2
  EXPECT_EQ(st.lambda, 2.5f);
  EXPECT_EQ(st.steps, 7u);
  EXPECT_EQ(st.regions, (std::vector<size_t>{0, 2, 3}));
}

TEST(StateScale, RefusesAFactorThatIsNotFiniteAndPositive) {
  CodecState st(2);
  for (float bad : {0.0f, -2.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_THROW(rescale_codec_state(st, bad), Error) << bad;
  }
}

}  // namespace
}  // namespace compcoll
