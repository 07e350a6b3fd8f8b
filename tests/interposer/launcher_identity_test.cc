// Which process of the job the interposer runs in, and the checkpoint names
// of root communicators that follow from it (plugin/nccl_interposer/
// launcher_identity.h). End to end across processes this needs an NCCL that
// spans processes, which the thread-based stand-in does not.
#include <gtest/gtest.h>

#include <set>

#include "plugin/nccl_interposer/launcher_identity.h"
#include "tests/plugin/env_of.h"

namespace compcoll::interposer {
namespace {

using compcoll::env_of;

TEST(LauncherIdentity, TheFirstLauncherThatNamesTheProcessWins) {
  LauncherIdentity me = launcher_identity(env_of({{"RANK", "3"}, {"WORLD_SIZE", "8"},
                                                  {"SLURM_PROCID", "5"}}));
  EXPECT_EQ(me.rank, 3);
  EXPECT_EQ(me.size, 8);
  EXPECT_EQ(me.source, "RANK");
  me = launcher_identity(env_of({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}}));
  EXPECT_EQ(me.rank, 2);
  EXPECT_EQ(me.size, 4);
  me = launcher_identity(env_of({{"SLURM_PROCID", "7"}}));
  EXPECT_EQ(me.rank, 7);
  EXPECT_EQ(me.size, -1);
  // Not numbers: skipped, as if unset.
  me = launcher_identity(env_of({{"RANK", "x"}, {"PMI_RANK", "1"}, {"PMI_SIZE", "-2"}}));
  EXPECT_EQ(me.rank, 1);
  EXPECT_EQ(me.size, -1);
  EXPECT_FALSE(launcher_identity(env_of({})).known());
  EXPECT_FALSE(launcher_identity(env_of({{"RANK", "-1"}})).known());
}

TEST(LauncherIdentity, RootsOtherThanTheWorldAreNamedByTheirProcessUniquely) {
  // Four processes, each with the world and a pair ({0,1}, {2,3}) made by
  // ncclCommInitRank: the pairs' ranks and sizes repeat across processes.
  std::set<std::string> names;
  for (int p = 0; p < 4; ++p) {
    LauncherIdentity me;
    me.rank = p;
    me.size = 4;
    EXPECT_EQ(root_state_tag(me, p, 4, 0), "") << "the world keeps the plain name";
    const std::string pair = root_state_tag(me, p % 2, 2, 1);
    EXPECT_EQ(pair, "p" + std::to_string(p) + "-root1");
    EXPECT_TRUE(names.insert(pair + "-rank" + std::to_string(p % 2)).second) << pair;
  }
  // Unknown launcher: the old names (and their collision, documented).
  EXPECT_EQ(root_state_tag(LauncherIdentity{}, 0, 2, 1), "");
  // Unknown world size: only the launcher's rank decides.
  LauncherIdentity me;
  me.rank = 1;
  EXPECT_EQ(root_state_tag(me, 1, 4, 0), "");
  EXPECT_EQ(root_state_tag(me, 0, 2, 1), "p1-root1");
}

}  // namespace
}  // namespace compcoll::interposer
