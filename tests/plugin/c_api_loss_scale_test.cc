// The C API's mixed-precision calls, through libcompcoll.so and its C++
// wrapper (include/compcoll/compcoll.hpp), two ranks as threads over a
// file:// rendezvous, every algorithm:
// - a loss scale of 1024 halved before step 3, with compcoll_rescale_state(0.5)
//   there: each step's result divided by its scale is, bit for bit, that of a
//   run without a scale (the state follows the scale); not told, they differ;
// - compcoll_set_loss_scaled and an overflowed step 2 (rank 1's gradient all
//   infinite, its result not finite): the later steps are those of a run that
//   never made step 2; without the setting they differ;
// - a factor that is not finite and > 0, and a NULL communicator, are refused
//   with a message that names them.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "compcoll/compcoll.hpp"

namespace {

constexpr size_t kCount = 20000;
constexpr int kSteps = 6;

struct Schedule {
  float scale = 0.0f;  // > 0: a loss scaler multiplies every gradient by it
  int halve_at = -1;   // the scale halves before this step
  int overflow_at = -1;
  int skip = -1;       // this step's call is not made at all
  bool tell = true;    // compcoll is told (rescale_state, set_loss_scaled)
};

float value(int rank, int step, size_t i) {
  return std::sin(0.37f * float(i) + 1.3f * float(step) + 2.1f * float(rank)) /
         (1.0f + float(i % 97));
}

std::string make_dir() {
  char tmpl[] = "/tmp/compcoll-c-api-XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d != nullptr ? d : "";
}

// Rank 0's results of every step that is recorded, divided by their scale.
std::vector<std::vector<float>> train(const Schedule& s) {
  const std::string dir = make_dir();
  EXPECT_FALSE(dir.empty());
  std::vector<std::vector<float>> out;
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        compcoll::Comm comm("file://" + dir, rank, 2);
        if (s.scale > 0.0f && s.tell) comm.set_loss_scaled(true);
        float scale = s.scale > 0.0f ? s.scale : 1.0f;
        for (int step = 0; step < kSteps; ++step) {
          if (step == s.skip) continue;
          if (step == s.halve_at) {
            scale *= 0.5f;
            if (s.tell) {
              EXPECT_EQ(comm.rescale_state(0.5), 1u) << "one tensor, one state";
            }
          }
          std::vector<float> g(kCount);
          for (size_t i = 0; i < kCount; ++i) g[i] = value(rank, step, i) * scale;
          if (step == s.overflow_at && rank == 1) std::fill(g.begin(), g.end(), INFINITY);
          comm.allreduce(g.data(), kCount, COMPCOLL_SUM, "w");
          if (step == s.overflow_at) {
            EXPECT_FALSE(std::isfinite(g[0])) << "the overflow reaches every rank's result";
            continue;
          }
          for (float& x : g) x /= scale;  // exact: a power of two
          if (rank == 0) out.push_back(std::move(g));
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << ": " << e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  std::filesystem::remove_all(dir);
  return out;
}

class CApiLossScale : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    setenv("COMPCOLL_ALGO", GetParam(), 1);
    setenv("COMPCOLL_WARMUP_STEPS", "0", 1);
    setenv("COMPCOLL_MIN_ELEMS", "1000", 1);
    setenv("COMPCOLL_CSC_CHUNK", "1000", 1);  // csc: 20 chunks to choose from
  }
};

TEST_P(CApiLossScale, TheStateFollowsTheScaleAndAnOverflowedStepLeavesItAlone) {
  const auto plain = train({});
  ASSERT_EQ(plain.size(), size_t(kSteps));
  EXPECT_EQ(train({1024.0f, 3}), plain);
  EXPECT_NE(train({1024.0f, 3, -1, -1, false}), plain) << "the test cannot fail";

  const auto without_step_2 = train({0.0f, -1, -1, 2});
  ASSERT_EQ(without_step_2.size(), size_t(kSteps - 1));
  EXPECT_EQ(train({1024.0f, -1, 2}), without_step_2);
  EXPECT_NE(train({1024.0f, -1, 2, -1, false}), without_step_2) << "the test cannot fail";
}

INSTANTIATE_TEST_SUITE_P(EveryAlgorithm, CApiLossScale,
                         ::testing::Values("dgc", "sdagc", "sbc", "csc", "onebit"));

TEST(CApiLossScaleArguments, AreCheckedAndNamed) {
  size_t n = 7;
  EXPECT_EQ(compcoll_rescale_state(nullptr, 0.5, &n), COMPCOLL_INVALID_ARGUMENT);
  EXPECT_NE(std::string(compcoll_last_error()).find("comm is NULL"), std::string::npos);
  EXPECT_EQ(compcoll_set_loss_scaled(nullptr, 1), COMPCOLL_INVALID_ARGUMENT);
  const std::string dir = make_dir();
  setenv("COMPCOLL_ALGO", "dgc", 1);
  compcoll::Comm comm("file://" + dir, 0, 1);
  for (double bad : {0.0, -2.0, double(NAN), double(INFINITY)}) {
    EXPECT_EQ(compcoll_rescale_state(comm.get(), bad, &n), COMPCOLL_INVALID_ARGUMENT) << bad;
    EXPECT_NE(std::string(compcoll_last_error()).find("finite factor > 0"), std::string::npos)
        << compcoll_last_error();
  }
  // Finite and > 0, but not a float32 (the state's type): named as such, not
  // as the 0 or inf it would become.
  for (double bad : {1e300, 1e-50}) {
    EXPECT_EQ(compcoll_rescale_state(comm.get(), bad, &n), COMPCOLL_INVALID_ARGUMENT) << bad;
    EXPECT_NE(std::string(compcoll_last_error()).find("is outside the range of float32"),
              std::string::npos)
        << compcoll_last_error();
  }
  EXPECT_EQ(n, 7u) << "untouched by a refused call";
  EXPECT_EQ(comm.rescale_state(2.0), 0u) << "no state before the first compressed call";
  std::filesystem::remove_all(dir);
}

}  // namespace
