// GlooComm::connect_subgroup: a Gloo context of its own between some ranks
// of a world (the host hierarchy's leaders), over the world's rendezvous
// store. Ranks as threads over real loopback sockets.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "compcoll/error.h"
#include "tests/support/gloo_harness.h"

namespace compcoll {
namespace {

using testing::run_gloo_ranks;

// Members {0, 2, 3} of a 5-rank world talk among themselves while ranks 1
// and 4 make no call at all; what the members send counts in the world's
// bytes_sent, and the world still works afterwards.
TEST(GlooSubgroup, MembersTalkWithoutTheOthersAndTheirBytesCountInTheWorld) {
  const std::vector<int> members = {0, 2, 3};
  run_gloo_ranks(5, [&](Comm& world) {
    ASSERT_TRUE(world.can_connect_subgroup());
    const int r = world.rank();
    const bool member = r == 0 || r == 2 || r == 3;
    if (member) {
      const uint64_t before = world.bytes_sent();
      std::unique_ptr<Comm> sub = world.connect_subgroup(members, "test-a");
      ASSERT_NE(sub, nullptr);
      EXPECT_EQ(sub->size(), 3);
      EXPECT_EQ(sub->rank(), r == 0 ? 0 : r == 2 ? 1 : 2);
      std::vector<float> v(1000, static_cast<float>(r));
      sub->allreduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
      for (float x : v) ASSERT_EQ(x, 5.0f);  // 0 + 2 + 3
      const uint8_t mine = static_cast<uint8_t>(r);
      const Gathered g = sub->allgatherv({&mine, 1}, 1);
      ASSERT_EQ(g.parts(), 3);
      EXPECT_EQ(g.part(2)[0], 3);
      EXPECT_GE(world.bytes_sent() - before, sub->bytes_sent());
      EXPECT_GT(sub->bytes_sent(), 0u);
    }
    std::vector<int> all(1, 1);
    world.allreduce(all.data(), 1, DType::kInt32, ReduceOp::kSum);
    EXPECT_EQ(all[0], 5);
  });
}

TEST(GlooSubgroup, BadMemberListsAreRefusedNamingTheProblem) {
  run_gloo_ranks(3, [](Comm& world) {
    const int r = world.rank();
    auto refused = [&](const std::vector<int>& m, const char* text) {
      try {
        world.connect_subgroup(m, "bad");
        ADD_FAILURE() << "accepted a bad member list";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
      }
    };
    refused({2, 1, 0}, "distinct and ascending");
    refused({0, 0, 1, 2}, "distinct and ascending");
    refused({r, 7}, "outside [0, 3)");
    refused({(r + 1) % 3}, "only a member connects");
  });
}

}  // namespace
}  // namespace compcoll
