// The communicator's policy and lifecycle, over real loopback sockets.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "collectives/lent_comm.h"
#include "compcoll/error.h"
#include "plugin/communicator.h"
#include "tests/support/gloo_harness.h"
#include "transport/gloo_comm.h"

namespace compcoll {
namespace {

// The harness keeps its GlooComm; the Communicator gets a view of it.
using Borrowed = LentComm;

Config dgc_config() {
  Config c;
  c.algo = "dgc";
  c.params.density = 0.01;
  return c;
}

TEST(Communicator, CompressesEligibleTensorsAndRoutesTheRestDense) {
  testing::run_gloo_ranks(2, [](Comm& comm) {
    Communicator cc(std::make_unique<Borrowed>(comm), dgc_config());
    std::vector<float> big(100000, 1.0f);
    cc.allreduce(big.data(), big.size(), DType::kFloat32, ReduceOp::kSum, "g");
    EXPECT_EQ(cc.stats().compressed_calls(), 1u);
    EXPECT_LT(cc.stats().last().wire_bytes * 20, cc.stats().last().dense_bytes);

    std::vector<float> small(100, 1.0f);  // below min_elems
    cc.allreduce(small.data(), small.size(), DType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(small[0], 2.0f);
    std::vector<int32_t> ints(50000, 2);  // not floating
    cc.allreduce(ints.data(), ints.size(), DType::kInt32, ReduceOp::kSum);
    EXPECT_EQ(ints[123], 4);
    std::vector<float> mx(50000, float(comm.rank()));  // MAX is never compressed
    cc.allreduce(mx.data(), mx.size(), DType::kFloat32, ReduceOp::kMax);
    EXPECT_EQ(mx[0], 1.0f);
    EXPECT_EQ(cc.stats().calls(), 4u);
    EXPECT_EQ(cc.stats().compressed_calls(), 1u);
    EXPECT_EQ(cc.state_entries(), 1u);
  });
}

TEST(Communicator, ExplicitKeysKeepResidualsAcrossBufferMoves) {
  testing::run_gloo_ranks(2, [](Comm& comm) {
    Communicator cc(std::make_unique<Borrowed>(comm), dgc_config());
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g(50000, 0.5f);  // a new buffer every step
      cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kAvg, "layer1");
    }
    EXPECT_EQ(cc.state_entries(), 1u);
  });
}

TEST(Communicator, HalfPrecisionTensorsAreCompressedWithFp32Residuals) {
  testing::run_gloo_ranks(2, [](Comm& comm) {
    Communicator cc(std::make_unique<Borrowed>(comm), dgc_config());
    std::vector<uint16_t> h(40000, 0x3c00);  // 1.0 in fp16
    cc.allreduce(h.data(), h.size(), DType::kFloat16, ReduceOp::kSum, "h");
    EXPECT_EQ(cc.stats().compressed_calls(), 1u);
    EXPECT_EQ(cc.state_bytes(), 40000 * sizeof(float));
  });
}

TEST(Communicator, WritesTheStatsFileOnDestruction) {
  const std::string dir = ::testing::TempDir();
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    Config c = dgc_config();
    c.stats_file = dir + "cc-stats-{rank}.json";
    {
      Communicator cc(std::make_unique<Borrowed>(comm), c);
      std::vector<float> g(100000, 1.0f);
      cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kSum, "g");
    }
    std::ifstream in(dir + "cc-stats-" + std::to_string(comm.rank()) + ".json");
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_NE(text.str().find("\"compressed_calls\": 1"), std::string::npos) << text.str();
    EXPECT_NE(text.str().find("\"algo\": \"dgc\""), std::string::npos) << text.str();
  });
}

TEST(Communicator, MismatchedConfigurationFailsEveryRankAtCreation) {
  testing::HarnessOptions opts;
  opts.timeout = std::chrono::seconds(5);
  const auto errors = testing::run_gloo_ranks_collect(3, [](Comm& comm) {
    Config c = dgc_config();
    if (comm.rank() == 2) c.params.momentum = 0.9f;
    Communicator cc(std::make_unique<Borrowed>(comm), c);
  }, opts);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " accepted a mismatched configuration";
    EXPECT_NE(testing::what(errors[r]).find("momentum: rank 0 has 0, rank 2 has 0.8999"),
              std::string::npos)
        << testing::what(errors[r]);
  }
}

}  // namespace
}  // namespace compcoll
