// `auto` where its cost model is not sure (collectives/auto.h): over real
// loopback sockets (ranks as threads), a size whose two predictions are
// within the trial band is timed on both paths, dense first, alternating,
// then served by the path with the lower median. Checked on every call:
// every rank takes the same path and holds the same bytes, the decision
// text names the path taken and only figures that were measured, and
// nothing is lost by switching (what was delivered plus every rank's
// residual equals every gradient summed). And a codec timed during a load
// spike decides only until auto times it again. And auto remembers the
// timings of at most kMaxTimedSizes sizes, forgetting the least recent.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/auto.h"
#include "collectives/dense.h"
#include "collectives/registry.h"
#include "integration/bench/gradients.h"
#include "tests/support/gloo_harness.h"

namespace compcoll {
namespace {

constexpr int kWorld = 3;
constexpr size_t kCount = 100003;
// One call the model is sure of, six timed (three per path), two decided by
// the medians.
constexpr int kCalls = 9;

std::vector<float> gradient_of(int rank, int step) {
  return bench::make_gradient(bench::GradientKind::kStudentT3, kCount,
                              uint64_t(1000 * step + 17 * rank + 1));
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// Every gradient of `calls` steps is in what was delivered or in a residual.
void expect_nothing_lost(int calls, const std::vector<float>& delivered,
                         const std::vector<std::vector<float>>& residual) {
  double worst = 0.0, scale = 0.0;
  std::vector<double> everything(kCount, 0.0);
  for (int step = 0; step < calls; ++step) {
    for (int r = 0; r < kWorld; ++r) {
      const auto g = gradient_of(r, step);
      for (size_t i = 0; i < kCount; ++i) everything[i] += g[i];
    }
  }
  for (size_t i = 0; i < kCount; ++i) {
    double held = delivered[i];
    for (int r = 0; r < kWorld; ++r) held += residual[r][i];
    worst = std::max(worst, std::fabs(held - everything[i]));
    scale = std::max(scale, std::fabs(everything[i]));
  }
  EXPECT_LE(worst, 1e-4 * scale) << "delivered + residuals vs every gradient summed";
}

TEST(Auto, AnUnsureSizeIsTimedOnBothPathsThenTakesTheFasterOneAndLosesNothing) {
  AlgoParams params;
  params.density = 0.01;
  std::mutex mu;
  std::vector<std::vector<std::string>> decisions(kWorld);
  std::vector<std::vector<bool>> went_dense(kWorld);
  std::vector<std::vector<float>> delivered(kWorld, std::vector<float>(kCount, 0.0f));
  std::vector<std::vector<float>> residual(kWorld);

  testing::run_gloo_ranks(kWorld, [&](Comm& comm) {
    auto algo = make_algorithm("auto", params);
    auto* chooser = dynamic_cast<AutoAllreduce*>(algo.get());
    ASSERT_NE(chooser, nullptr);
    // A dense call of a second: compressing is certain, nothing is timed.
    chooser->attach_with_link({1.0, 0.0, 0.0});
    auto state = algo->make_state(kCount, kWorld);
    std::vector<float> sum(kCount, 0.0f);
    for (int step = 0; step < kCalls; ++step) {
      if (step == 1) {
        // Now a link on which dense costs exactly what the compressed path
        // is predicted to cost (its compute, timed at the first call and
        // agreed): inside the band, so auto must measure.
        chooser->attach_with_link({0.0, 0.0, 0.0});
        const double compressed = chooser->predict_compressed(kCount, kWorld);
        ASSERT_GT(compressed, 0.0);
        chooser->attach_with_link({compressed, 0.0, 0.0});
        ASSERT_DOUBLE_EQ(chooser->predict_dense(kCount, kWorld), compressed);
      }
      std::vector<float> buf = gradient_of(comm.rank(), step);
      const CallInfo info = algo->allreduce(comm, buf.data(), kCount, false, *state);
      for (size_t i = 0; i < kCount; ++i) sum[i] += buf[i];
      std::lock_guard<std::mutex> lock(mu);
      decisions[comm.rank()].push_back(algo->last_decision());
      went_dense[comm.rank()].push_back(info.payload_bytes ==
                                        ring_allreduce_bytes(kCount * 4, kWorld));
      if (step == kCalls - 1) {
        delivered[comm.rank()] = sum;
        residual[comm.rank()] = state->v;
      }
    }
  });

  for (int r = 1; r < kWorld; ++r) {
    EXPECT_EQ(decisions[r], decisions[0]) << "rank " << r;
    EXPECT_EQ(went_dense[r], went_dense[0]) << "rank " << r;
    EXPECT_EQ(delivered[r], delivered[0]) << "rank " << r;
  }
  const auto& said = decisions[0];
  const auto& dense = went_dense[0];
  ASSERT_EQ(said.size(), size_t(kCalls));
  EXPECT_TRUE(starts_with(said[0], "dgc (by the cost model; ")) << said[0];
  EXPECT_EQ(said[0].find("measured"), std::string::npos) << said[0];
  EXPECT_FALSE(dense[0]);
  for (int step = 1; step <= 6; ++step) {
    const bool want_dense = step % 2 == 1;  // dense first, then alternating
    EXPECT_EQ(dense[step], want_dense) << "call " << step << ": " << said[step];
    EXPECT_TRUE(starts_with(said[step], std::string(want_dense ? "dense" : "dgc") +
                                            " (timing both paths; "))
        << said[step];
  }
  // Before the first timed call nothing was measured; the second has the
  // dense figure only; the third both.
  EXPECT_EQ(said[1].find("measured"), std::string::npos) << said[1];
  EXPECT_NE(said[2].find("; measured "), std::string::npos) << said[2];
  EXPECT_EQ(said[2].find(" ms dgc)"), std::string::npos) << said[2];
  for (int step = 7; step < kCalls; ++step) {
    EXPECT_TRUE(starts_with(said[step], std::string(dense[step] ? "dense" : "dgc") +
                                            " (by the timings; "))
        << said[step];
    EXPECT_NE(said[step].find(" ms dense, "), std::string::npos) << said[step];
    EXPECT_NE(said[step].find(" ms dgc)"), std::string::npos) << said[step];
    EXPECT_EQ(said[step].find("-"), std::string::npos) << "no placeholder: " << said[step];
    EXPECT_EQ(dense[step], dense[7]) << "the same medians decide both calls";
  }

  expect_nothing_lost(kCalls, delivered[0], residual);
}

// The codec's speed as a load spike at the first call would leave it: 100
// times slower than any link here. The model is sure dense is faster and
// times nothing, until the kRecalibrateFirst-th call times the codec again,
// finds it fast, and compresses from then on; then every kRecalibrateEvery
// calls. Every rank switches at the same call, and nothing is lost.
TEST(Auto, ACodecTimedDuringALoadSpikeIsTimedAgainAndCompressionComesBack) {
  AlgoParams params;
  params.density = 0.01;
  const int calls = int(kRecalibrateFirst) + 2;
  std::mutex mu;
  std::vector<std::vector<std::string>> decisions(kWorld);
  std::vector<std::vector<float>> delivered(kWorld, std::vector<float>(kCount, 0.0f));
  std::vector<std::vector<float>> residual(kWorld);
  std::vector<CodecSpeed> retimed(kWorld);

  testing::run_gloo_ranks(kWorld, [&](Comm& comm) {
    auto algo = make_algorithm("auto", params);
    auto* chooser = dynamic_cast<AutoAllreduce*>(algo.get());
    ASSERT_NE(chooser, nullptr);
    chooser->attach_with_link({1.0, 0.0, 0.0});  // a dense call of a second
    chooser->assume_codec_speed({100.0, 0.0});   // and a compressed one of 100
    auto state = algo->make_state(kCount, kWorld);
    std::vector<float> sum(kCount, 0.0f);
    for (int step = 0; step < calls; ++step) {
      std::vector<float> buf = gradient_of(comm.rank(), step);
      algo->allreduce(comm, buf.data(), kCount, false, *state);
      for (size_t i = 0; i < kCount; ++i) sum[i] += buf[i];
      std::lock_guard<std::mutex> lock(mu);
      decisions[comm.rank()].push_back(algo->last_decision());
    }
    std::lock_guard<std::mutex> lock(mu);
    delivered[comm.rank()] = sum;
    residual[comm.rank()] = state->v;
    retimed[comm.rank()] = chooser->codec_speed();
  });

  for (int r = 1; r < kWorld; ++r) {
    EXPECT_EQ(decisions[r], decisions[0]) << "rank " << r;
    EXPECT_EQ(delivered[r], delivered[0]) << "rank " << r;
    EXPECT_EQ(retimed[r].fixed_s, retimed[0].fixed_s) << "agreed, rank " << r;
    EXPECT_EQ(retimed[r].per_element_s, retimed[0].per_element_s) << "agreed, rank " << r;
  }
  const auto& said = decisions[0];
  for (int step = 0; step < calls; ++step) {
    const bool retimed_by_now = uint64_t(step) + 1 >= kRecalibrateFirst;
    EXPECT_TRUE(starts_with(said[step], std::string(retimed_by_now ? "dgc" : "dense") +
                                            " (by the cost model; "))
        << "call " << step + 1 << ": " << said[step];
  }
  // The real codec: well under a second for this size, with a positive slope.
  EXPECT_LT(retimed[0].fixed_s + retimed[0].per_element_s * double(kCount), 1.0);
  EXPECT_GT(retimed[0].per_element_s, 0.0);
  expect_nothing_lost(calls, delivered[0], residual);
}

// A job whose sizes keep changing must not grow auto's timing table without
// end: sizes 1..kMaxTimedSizes fill it, size 1 is called again (now the most
// recent), and two new sizes then take the places of sizes 2 and 3, the two
// called least recently, on every rank alike. Dense is free on this link, so
// every call is a small dense one.
TEST(Auto, RemembersABoundedNumberOfSizesAndForgetsTheLeastRecentlyCalled) {
  AlgoParams params;
  params.density = 0.01;
  std::mutex mu;
  std::vector<std::vector<bool>> remembered(kWorld);
  testing::run_gloo_ranks(kWorld, [&](Comm& comm) {
    auto algo = make_algorithm("auto", params);
    auto* chooser = dynamic_cast<AutoAllreduce*>(algo.get());
    ASSERT_NE(chooser, nullptr);
    chooser->attach_with_link({0.0, 0.0, 0.0});
    auto call = [&](size_t n) {
      std::vector<float> buf(n, 1.0f);
      auto state = algo->make_state(n, kWorld);
      algo->allreduce(comm, buf.data(), n, false, *state);
      EXPECT_EQ(buf[n - 1], float(kWorld)) << n;
    };
    for (size_t n = 1; n <= kMaxTimedSizes; ++n) call(n);
    EXPECT_EQ(chooser->timed_sizes(), kMaxTimedSizes);
    call(1);
    call(kMaxTimedSizes + 1);
    call(kMaxTimedSizes + 2);
    EXPECT_EQ(chooser->timed_sizes(), kMaxTimedSizes);
    std::vector<bool> r;
    for (size_t n : {size_t{1}, size_t{2}, size_t{3}, size_t{4}, kMaxTimedSizes + 2}) {
      r.push_back(chooser->remembers(n));
    }
    std::lock_guard<std::mutex> lock(mu);
    remembered[comm.rank()] = r;
  });
  EXPECT_EQ(remembered[0], (std::vector<bool>{true, false, false, true, true}));
  for (int r = 1; r < kWorld; ++r) EXPECT_EQ(remembered[r], remembered[0]) << "rank " << r;
}

}  // namespace
}  // namespace compcoll
