// A rank killed mid-call at each level of the hierarchy, with ranks as real
// processes (compcoll_hierarchy_rank) on three emulated hosts {0,1} {2,3}
// {4,5}: every survivor must fail with a transport error within the timeout
// plus a little, never hang, and a local peer of a dead rank names it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/process_util.h"

namespace compcoll {
namespace {

using namespace compcoll::testing;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr const char* kRank = COMPCOLL_HIERARCHY_RANK;
constexpr long long kTimeoutMs = 3000;
// Process scheduling on a loaded 2-core machine, on top of the timeout.
constexpr long long kSlackMs = 2000;

struct Outcome {
  std::vector<std::string> logs;
  std::vector<int> codes;     // exit codes; 999 = still running at the limit
  double worst_ms = 0;        // latest survivor exit after the victim died
};

Outcome run_with_victim(const std::string& level, int victim, const std::string& algo,
                        bool shards = false) {
  TempDir dir;
  ChildSet children;
  const int world = 6;
  const long long kill_call = 8;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pids.push_back(children.add(spawn(
        {kRank, "--rank", std::to_string(r), "--size", std::to_string(world), "--hosts",
         "0,0,1,1,2,2", "--rendezvous", "file://" + dir.path() + "/store", "--algo", algo,
         "--count", "200000", "--calls", "100000", "--timeout-ms", std::to_string(kTimeoutMs),
         "--kill-level", level, "--kill-rank", std::to_string(victim), "--kill-call",
         std::to_string(kill_call), "--shards", shards ? "1" : "0"},
        dir.path() + "/out" + std::to_string(r))));
  }
  Outcome out;
  out.codes.assign(world, 999);
  const auto vstatus = children.wait(pids[size_t(victim)], milliseconds(120000));
  const auto died_at = Clock::now();
  EXPECT_TRUE(vstatus.has_value()) << "the victim never reached call " << kill_call << ": "
                                   << read_file(dir.path() + "/out" + std::to_string(victim));
  if (vstatus) {
    out.codes[size_t(victim)] = exit_code(*vstatus);
    EXPECT_EQ(out.codes[size_t(victim)], -SIGKILL) << read_file(dir.path() + "/out" + std::to_string(victim));
  }
  for (int r = 0; r < world; ++r) {
    if (r == victim) continue;
    const auto left = milliseconds(kTimeoutMs + kSlackMs) -
                      std::chrono::duration_cast<milliseconds>(Clock::now() - died_at);
    const auto status = children.wait(pids[size_t(r)], std::max(left, milliseconds(1)));
    if (status) out.codes[size_t(r)] = exit_code(*status);
    out.worst_ms = std::max(out.worst_ms,
                            std::chrono::duration<double, std::milli>(Clock::now() - died_at).count());
  }
  children.kill_all();
  for (int r = 0; r < world; ++r) out.logs.push_back(read_file(dir.path() + "/out" + std::to_string(r)));
  return out;
}

void expect_survivors_failed(const Outcome& o, int victim) {
  std::printf("[ info ] survivors exited within %.0f ms of the victim's death\n", o.worst_ms);
  for (size_t r = 0; r < o.codes.size(); ++r) {
    if (int(r) == victim) continue;
    const size_t e = o.logs[r].find("error ");
    if (e != std::string::npos) std::printf("[ info ] rank %zu: %s", r, o.logs[r].substr(e).c_str());
    EXPECT_EQ(o.codes[r], 3) << "rank " << r << " (999 = still running " << kTimeoutMs + kSlackMs
                             << " ms after the kill):\n" << o.logs[r];
    EXPECT_NE(o.logs[r].find("error call 8 kind transport"), std::string::npos) << o.logs[r];
  }
  EXPECT_LT(o.worst_ms, double(kTimeoutMs + kSlackMs));
}

// Over the world's calls (LeaderComm), a leader (rank 2, host 1) whose local
// step fails without dying (an error, not a crash) never entered the leader
// phase: the other hosts' ranks waited in its first exchange for the whole
// timeout. Now it ends the phase at once (LeaderComm::abandon) and its own
// follower follows it to the end: every rank fails within moments of it,
// far inside a 20 s timeout.
TEST(HierarchyFaults, ALeaderWhoseLocalStepFailsWithoutDyingFailsEveryRankAtOnce) {
  TempDir dir;
  ChildSet children;
  const int world = 6;
  // Every rank stays alive 15 s after its error (connections open), so that
  // only the hierarchy's own messages can end the others' waits.
  for (int r = 0; r < world; ++r) {
    children.add(spawn(
        {kRank, "--rank", std::to_string(r), "--size", std::to_string(world), "--hosts",
         "0,0,1,1,2,2", "--rendezvous", "file://" + dir.path() + "/store", "--algo", "dgc",
         "--count", "200000", "--calls", "100000", "--timeout-ms", "20000", "--kill-level",
         "local-throw", "--kill-rank", "2", "--kill-call", "3", "--linger-ms", "15000"},
        dir.path() + "/out" + std::to_string(r)));
  }
  const auto log_of = [&](int r) { return read_file(dir.path() + "/out" + std::to_string(r)); };
  const auto wait_for_error = [&](int r, milliseconds limit) {
    const auto until = Clock::now() + limit;
    while (log_of(r).find("error call") == std::string::npos && Clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    return log_of(r).find("error call") != std::string::npos;
  };
  ASSERT_TRUE(wait_for_error(2, milliseconds(120000))) << log_of(2);
  const auto failed_at = Clock::now();
  EXPECT_NE(log_of(2).find("error call 3 kind invalid argument: compcoll: test: this rank's local "
                           "step fails"),
            std::string::npos)
      << log_of(2);
  for (int r = 0; r < world; ++r) {
    if (r == 2) continue;
    EXPECT_TRUE(wait_for_error(r, milliseconds(5000)))
        << "rank " << r << " has no error 5 s after rank 2 failed (timeout 20 s):\n" << log_of(r);
    EXPECT_NE(log_of(r).find("error call 3 kind transport"), std::string::npos) << log_of(r);
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - failed_at).count();
  std::printf("[ info ] every rank failed within %.0f ms of rank 2\n", ms);
  // The other hosts' ranks name it (the leaders' exchange, or rank 0's token).
  for (int r : {0, 1, 4, 5}) {
    EXPECT_NE(log_of(r).find("world rank(s) 2"), std::string::npos) << "rank " << r << ":\n"
                                                                     << log_of(r);
  }
  children.kill_all();
}

// A follower (rank 3, host 1) dies as its local reduce starts: its leader
// (rank 2) names it as dead; everyone else fails through the world.
TEST(HierarchyFaults, AFollowerKilledInTheLocalReduceFailsEverySurvivorInTime) {
  const Outcome o = run_with_victim("local", 3, "dgc");
  expect_survivors_failed(o, 3);
  EXPECT_NE(o.logs[2].find("local peer world rank 3 (local rank 1"), std::string::npos) << o.logs[2];
  EXPECT_NE(o.logs[2].find("died"), std::string::npos) << o.logs[2];
}

// A leader (rank 2, host 1) dies in its first exchange between hosts: its
// follower, following over the world, and the other hosts all fail in time.
TEST(HierarchyFaults, ALeaderKilledBetweenHostsFailsEverySurvivorInTime) {
  const Outcome o = run_with_victim("leaders", 2, "dgc");
  expect_survivors_failed(o, 2);
}

TEST(HierarchyFaults, ALeaderKilledInOnebitsExchangeFailsEverySurvivorInTime) {
  const Outcome o = run_with_victim("leaders", 4, "onebit");
  expect_survivors_failed(o, 4);
}

// Sharded (COMPCOLL_HIERARCHY=shards), every rank owns a slice: rank 3
// (host 1, slice 1) dies as its local reduce starts, and its host's other
// owner names it as dead; or it dies in its slice's first exchange between
// hosts, which fails slice 1's other ranks and, through their hosts' shared
// memory, slice 0's.
TEST(HierarchyFaults, ASliceOwnerKilledInTheLocalReduceFailsEverySurvivorInTime) {
  const Outcome o = run_with_victim("local", 3, "dgc", true);
  expect_survivors_failed(o, 3);
  EXPECT_NE(o.logs[2].find("local peer world rank 3 (local rank 1"), std::string::npos) << o.logs[2];
  EXPECT_NE(o.logs[2].find("died"), std::string::npos) << o.logs[2];
}

TEST(HierarchyFaults, ASliceOwnerKilledBetweenHostsFailsEverySurvivorInTime) {
  const Outcome o = run_with_victim("leaders", 3, "dgc", true);
  expect_survivors_failed(o, 3);
  // Slice 1's group between hosts numbers its ranks by host: its errors say
  // which world rank each one is (they named "rank 1" alone, a live rank's
  // number in the world).
  for (const int r : {1, 5}) {
    EXPECT_NE(o.logs[size_t(r)].find("the ranks named above are of the leaders' group between "
                                     "hosts, where rank 0 is world rank 1, rank 1 is world rank 3, "
                                     "rank 2 is world rank 5"),
              std::string::npos)
        << o.logs[size_t(r)];
  }
}

TEST(HierarchyFaults, ASliceOwnerKilledInOnebitsExchangeFailsEverySurvivorInTime) {
  const Outcome o = run_with_victim("leaders", 0, "onebit", true);
  expect_survivors_failed(o, 0);
}

// A slow link: each of onebit's two exchanges between hosts starts 700 ms
// late, so a leader phase takes about 1.4 s against a 1 s timeout while no
// exchange waits for more than the timeout. The leaders succeed, and their
// followers, waiting for the shared result, must too: they count their
// timeout from the leader's last exchange, not from the call's start (they
// failed "did not share the result within the 1000 ms timeout" while their
// leaders went on), in every round of a call the shared memory moves in
// several (4 here), and from every slice owner in turn. Both hierarchies:
// one leader per host, and sharded, where host 0's third rank owns no slice
// and waits for both owners' slow phases.
TEST(HierarchyFaults, FollowersWaitForASlowLeaderPhaseThatKeepsExchanging) {
  for (const bool shards : {false, true}) {
    TempDir dir;
    ChildSet children;
    const int world = 5;
    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r) {
      pids.push_back(children.add(spawn(
          {kRank, "--rank", std::to_string(r), "--size", std::to_string(world), "--hosts",
           "0,0,0,1,1", "--rendezvous", "file://" + dir.path() + "/store", "--algo", "onebit",
           "--count", "100000", "--chunk-floats", "25000", "--calls", "2", "--timeout-ms",
           "1000", "--slow-ms", "700", "--shards", shards ? "1" : "0"},
          dir.path() + "/out" + std::to_string(r))));
    }
    for (int r = 0; r < world; ++r) {
      const auto status = children.wait(pids[size_t(r)], milliseconds(60000));
      const std::string log = read_file(dir.path() + "/out" + std::to_string(r));
      ASSERT_TRUE(status.has_value()) << "shards " << shards << " rank " << r << " still running:\n" << log;
      EXPECT_EQ(exit_code(*status), 0) << "shards " << shards << " rank " << r << ":\n" << log;
      EXPECT_NE(log.find("done median_ms"), std::string::npos) << log;
    }
    children.kill_all();
  }
}

}  // namespace
}  // namespace compcoll
