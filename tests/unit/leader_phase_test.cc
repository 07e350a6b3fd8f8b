// The host hierarchy's leader phase over the world's own calls (LeaderComm,
// collectives/leader_comm.h), on the in-memory Comm: when a leader's phase
// fails, whether on that leader alone or on every leader at once, every
// rank (the other leaders and every follower) fails within moments, naming
// the failed leader's world rank, instead of waiting out the timeout for
// an exchange that never comes.
//
// World of 4: leaders are world ranks 0 and 2 (hosts 0 and 1), followers 1
// and 3. run_phase mirrors Hierarchy::leader_phase's non-direct branch.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/leader_comm.h"
#include "collectives/registry.h"
#include "compcoll/error.h"
#include "tests/support/corrupting_comm.h"
#include "tests/support/thread_comm.h"

namespace compcoll {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kTimeout{20000};
constexpr double kPrompt = 5.0;  // seconds: far below the timeout

struct Outcome {
  bool failed = false;
  std::string error;
  double seconds = 0;
};

enum class Failure {
  kOneLeaderAtStart,     // world rank 2 throws before its first exchange
  kRankZeroAtStart,      // world rank 0 (which tells the followers) does
  kEveryLeaderRejects,   // world rank 2's payload is refused by both leaders
  kOneLeaderAfterwards,  // world rank 2 throws after the phase's last exchange
};

// fn's body on leaders: a dgc allreduce (allgather pattern), with the failure.
void leaders_work(Comm& leaders, int world_rank, Failure f) {
  if (world_rank == 2 && f == Failure::kOneLeaderAtStart) CC_THROW(kInvalidArgument, "test: rank 2 fails");
  if (world_rank == 0 && f == Failure::kRankZeroAtStart) CC_THROW(kInvalidArgument, "test: rank 0 fails");
  AlgoParams p;
  p.density = 0.01;
  p.sparse_pattern = SparsePattern::kAllgather;
  auto algo = make_algorithm("dgc", p);
  constexpr size_t kN = 1 << 14;
  auto state = algo->make_state(kN, leaders.size());
  std::vector<float> g(kN);
  for (size_t i = 0; i < kN; ++i) g[i] = float(i % 97) - 48.0f;
  testing::CorruptingComm corrupting(leaders, testing::CorruptingComm::Target::kAllgather, 0);
  const bool corrupt = world_rank == 2 && f == Failure::kEveryLeaderRejects;
  algo->allreduce(corrupt ? static_cast<Comm&>(corrupting) : leaders, g.data(), kN, false, *state);
  if (world_rank == 2 && f == Failure::kOneLeaderAfterwards) CC_THROW(kInternal, "test: rank 2 fails late");
}

std::vector<Outcome> run_phase(Failure f) {
  std::vector<Outcome> out(4);
  std::mutex mu;
  const auto t0 = Clock::now();
  testing::run_thread_ranks(4, [&](Comm& world) {
    const int r = world.rank();
    Outcome o;
    try {
      if (r % 2 == 1) {
        LeaderComm::follow(world);
      } else {
        LeaderComm leaders(world, {0, 2});
        try {
          leaders_work(leaders, r, f);
        } catch (...) {
          leaders.abandon();
          throw;
        }
        leaders.release();
      }
    } catch (const std::exception& e) {
      o.failed = true;
      o.error = e.what();
    }
    o.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu);
    out[static_cast<size_t>(r)] = o;
  }, kTimeout);
  return out;
}

void expect_all_fail_promptly(const std::vector<Outcome>& out, const std::string& named) {
  for (size_t r = 0; r < out.size(); ++r) {
    SCOPED_TRACE("world rank " + std::to_string(r));
    EXPECT_TRUE(out[r].failed);
    EXPECT_LT(out[r].seconds, kPrompt) << out[r].error;
    EXPECT_EQ(out[r].error.find("did not arrive"), std::string::npos) << out[r].error;
  }
  // The followers, and the leaders that did not fail themselves, name it.
  for (size_t r : {size_t(1), size_t(3)}) {
    EXPECT_NE(out[r].error.find("host leaders failed"), std::string::npos) << out[r].error;
    EXPECT_NE(out[r].error.find("world rank(s) " + named), std::string::npos) << out[r].error;
  }
}

TEST(LeaderPhase, OneLeaderFailingAtTheStartFailsEveryRankPromptly) {
  const auto out = run_phase(Failure::kOneLeaderAtStart);
  expect_all_fail_promptly(out, "2");
  EXPECT_NE(out[2].error.find("test: rank 2 fails"), std::string::npos) << out[2].error;
  EXPECT_NE(out[0].error.find("world rank(s) 2 failed"), std::string::npos) << out[0].error;
}

TEST(LeaderPhase, RankZeroFailingAtTheStartTellsTheFollowersItself) {
  const auto out = run_phase(Failure::kRankZeroAtStart);
  expect_all_fail_promptly(out, "0");
  EXPECT_NE(out[0].error.find("test: rank 0 fails"), std::string::npos) << out[0].error;
  EXPECT_NE(out[2].error.find("world rank(s) 0 failed"), std::string::npos) << out[2].error;
}

TEST(LeaderPhase, APayloadEveryLeaderRejectsFailsEveryRankPromptly) {
  const auto out = run_phase(Failure::kEveryLeaderRejects);
  // Both leaders reject rank 2's payload themselves, in the same exchange:
  // rank 0 tells the followers of its own failure.
  expect_all_fail_promptly(out, "0");
  for (size_t r : {size_t(0), size_t(2)}) {
    EXPECT_NE(out[r].error.find("rejected"), std::string::npos) << out[r].error;
  }
}

TEST(LeaderPhase, ALeaderFailingAfterTheLastExchangeFailsTheOtherLeaders) {
  const auto out = run_phase(Failure::kOneLeaderAfterwards);
  EXPECT_TRUE(out[2].failed);
  EXPECT_TRUE(out[0].failed) << "the release exchange must show world rank 2's failure";
  EXPECT_NE(out[0].error.find("world rank(s) 2 failed"), std::string::npos) << out[0].error;
  for (const Outcome& o : out) EXPECT_LT(o.seconds, kPrompt) << o.error;
  // The followers were released in that exchange (rank 0 told them kDone
  // before it knew); under Hierarchy the local group's abort fails them.
  EXPECT_FALSE(out[1].failed) << out[1].error;
  EXPECT_FALSE(out[3].failed) << out[3].error;
}

TEST(LeaderPhase, APhaseWithoutFailureStillCompletesEverywhere) {
  std::vector<int> done(4, 0);
  std::mutex mu;
  testing::run_thread_ranks(4, [&](Comm& world) {
    if (world.rank() % 2 == 1) {
      LeaderComm::follow(world);
    } else {
      LeaderComm leaders(world, {0, 2});
      float x[3] = {1.0f, 2.0f, float(world.rank())};
      leaders.allreduce(x, 3, DType::kFloat32, ReduceOp::kSum);
      EXPECT_EQ(x[2], 2.0f);
      leaders.barrier();
      leaders.release();
    }
    std::lock_guard<std::mutex> lock(mu);
    done[static_cast<size_t>(world.rank())] = 1;
  }, kTimeout);
  EXPECT_EQ(done, std::vector<int>(4, 1));
}

}  // namespace
}  // namespace compcoll
