// The host hierarchy over the NCCL transport (the stand-in NCCL, ranks as
// threads): hosts are emulated with COMPCOLL_HOST_ID per rank, the local step
// runs over shared memory and the leaders' communicator over NcclComm's
// alltoallv. Every rank must hold the same bits.
#include <gtest/gtest.h>

#include <cmath>

#include "collectives/lent_comm.h"
#include "plugin/communicator.h"
#include "tests/interposer/standin.h"

namespace compcoll {
namespace {

TEST(NcclHierarchy, CompressedAlgorithmsRunThroughTheHierarchyOverNccl) {
  for (const int per_host : {2, 3}) {  // 4 ranks: {0,1} {2,3}, and {0,1,2} {3}
    for (const char* algo : {"dgc", "sdagc", "sbc", "csc", "onebit"}) {
      std::vector<std::vector<float>> results(4);
      const auto errors = testing::run_nccl_ranks(4, std::chrono::milliseconds(20000), [&](nccl::NcclComm& c) {
        Config cfg;
        cfg.algo = algo;
        cfg.params.density = 0.01;
        cfg.params.csc_chunk = 1024;
        cfg.params.csc_fraction = 0.1;
        cfg.hierarchy = "host";
        cfg.host_id = "nccl-host-" + std::to_string(c.rank() / per_host);
        Communicator cc(std::make_unique<LentComm>(c), cfg);
        ASSERT_NE(cc.hierarchy(), nullptr);
        EXPECT_EQ(cc.hierarchy()->layout().hosts(), 2);
        std::vector<float> g(50000);
        for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(float(i) * 0.37f + float(c.rank()));
        for (int step = 0; step < 2; ++step) {
          cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kAvg, "g");
        }
        EXPECT_EQ(cc.stats().compressed_calls(), 2u) << algo;
        for (float x : g) ASSERT_TRUE(std::isfinite(x)) << algo;
        results[size_t(c.rank())] = g;
      });
      for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << algo << " rank " << r;
      for (size_t r = 1; r < results.size(); ++r) {
        EXPECT_EQ(results[0], results[r]) << algo << ", " << per_host << " per host: rank " << r << " differs";
      }
    }
  }
}

}  // namespace
}  // namespace compcoll
