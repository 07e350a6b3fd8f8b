// What COMPCOLL_HIERARCHY=auto decides from: each machine's ranks and the
// CPUs they may use (collectives/machine_load.h, transport/machine_cpus.h).
#include <gtest/gtest.h>
#include <sched.h>

#include <string>
#include <vector>

#include "collectives/machine_load.h"
#include "compcoll/error.h"
#include "tests/support/gloo_harness.h"
#include "transport/machine_cpus.h"

namespace compcoll {
namespace {

TEST(MachineLoad, CountsRanksAndTheUnionOfTheirCpusPerMachine) {
  // m1: CPUs {0,1} + {2,3} + {0} = 4 CPUs for 3 ranks; m2: 4 CPUs for 1.
  const auto loads = machine_loads({"m1|3", "m1|c", "m2|F", "m1|1"});
  ASSERT_EQ(loads.size(), 2u);
  EXPECT_EQ(loads[0].machine, "m1");
  EXPECT_EQ(loads[0].ranks, 3);
  EXPECT_EQ(loads[0].cpus, 4);
  EXPECT_FALSE(loads[0].oversubscribed());
  EXPECT_EQ(loads[1].machine, "m2");
  EXPECT_EQ(loads[1].ranks, 1);
  EXPECT_EQ(loads[1].cpus, 4);
  // The last digit holds CPUs 0-3: "10" is CPU 4 alone, a 1 followed by
  // 255 zeros CPU 1020.
  EXPECT_EQ(machine_loads({"m|10", "m|1" + std::string(255, '0')})[0].cpus, 2);
  // Eight ranks pinned to the same two CPUs share them.
  EXPECT_TRUE(machine_loads(std::vector<std::string>(8, "m|3"))[0].oversubscribed());
}

// COMPCOLL_CODEC_THREADS=auto for staged device tensors: a rank's machine
// among all loads, and its CPUs shared among its ranks, 1 to 8.
TEST(MachineLoad, StagedCodecThreadsShareTheMachinesCpusAmongItsRanks) {
  const std::string all16 = "m1|ffff";
  const auto loads = machine_loads({all16, all16, "m2|f", all16});
  EXPECT_EQ(machine_of(loads, all16).ranks, 3);
  EXPECT_EQ(machine_of(loads, all16).cpus, 16);
  EXPECT_EQ(machine_of(loads, "m2|f").ranks, 1);
  EXPECT_EQ(staged_codec_threads(machine_of(loads, all16)), 5);  // 16 CPUs / 3 ranks
  EXPECT_EQ(staged_codec_threads(machine_of(loads, "m2|f")), 4);
  EXPECT_EQ(staged_codec_threads({"m", 1, 128}), kMaxStagedCodecThreads);
  EXPECT_EQ(staged_codec_threads({"m", 8, 2}), 1);  // oversubscribed: one each
  EXPECT_EQ(staged_codec_threads({"m", 1, 0}), 1);
  // An unknown machine is the rank alone.
  const auto unknown = machine_loads({"unknown|ff", "unknown|ff"});
  EXPECT_EQ(machine_of(unknown, "unknown|ff").ranks, 1);
  EXPECT_EQ(staged_codec_threads(machine_of(unknown, "unknown|ff")), 8);
}

TEST(MachineLoad, UnknownMachinesAreNotTakenToBeOne) {
  const auto loads = machine_loads({"unknown|1", "unknown|1"});
  ASSERT_EQ(loads.size(), 2u);
  EXPECT_EQ(loads[0].ranks, 1);
  EXPECT_EQ(loads[1].ranks, 1);
}

TEST(MachineLoad, MalformedReportsNameTheRank) {
  for (const std::string bad : {"no-bar", "m|", "|3", "m|3g"}) {
    try {
      machine_loads({"m|3", bad});
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
  }
}

TEST(MachineLoad, TheBusiestMachineHasTheMostRanksPerCpu) {
  const std::vector<MachineLoad> loads = {{"a", 4, 16}, {"b", 8, 4}, {"c", 2, 0}, {"d", 8, 2}};
  EXPECT_EQ(busiest_machine(loads).machine, "c");  // ranks on no CPU at all: the busiest
  EXPECT_EQ(busiest_machine({loads[0], loads[1], loads[3]}).machine, "d");
  EXPECT_EQ(busiest_machine({loads[0]}).machine, "a");
  EXPECT_THROW(busiest_machine({}), Error);
}

// This process's report: its boot id and exactly the CPUs its affinity
// allows, also when pinned to one.
TEST(MachineCpus, ReportsThisProcessesAffinity) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  const auto all = machine_loads({describe_machine_cpus()});
  ASSERT_EQ(all.size(), 1u);
  EXPECT_NE(all[0].machine, "unknown");
  EXPECT_EQ(all[0].cpus, CPU_COUNT(&before));
  int first = 0;
  while (!CPU_ISSET(first, &before)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const std::string pinned = describe_machine_cpus();
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
  EXPECT_EQ(machine_loads({pinned})[0].cpus, 1) << pinned;
}

// Collective: every rank gets the same loads, one machine here.
TEST(MachineLoad, ExchangedLoadsAreTheSameOnEveryRank) {
  testing::run_gloo_ranks(3, [](Comm& comm) {
    const auto loads = exchange_machine_loads(comm, describe_machine_cpus());
    ASSERT_EQ(loads.size(), 1u);
    EXPECT_EQ(loads[0].ranks, 3);
    EXPECT_GE(loads[0].cpus, 1);
  });
}

}  // namespace
}  // namespace compcoll
