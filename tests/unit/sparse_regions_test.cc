// The scatter pattern's pure pieces: region boundaries, their rebalancing,
// the owners' budget, and the two patterns' cost model and choice (auto.h).
#include <gtest/gtest.h>

#include <vector>

#include "collectives/auto.h"
#include "collectives/sparse_scatter.h"
#include "compcoll/error.h"
#include "compression/payload.h"

namespace compcoll {
namespace {

TEST(Regions, EqualRegionsCoverTheIndexSpaceInOrder) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{1000}, size_t{1048579}}) {
    for (int p : {1, 2, 3, 4, 7, 8}) {
      const auto r = equal_regions(n, p);
      ASSERT_TRUE(valid_regions(r, n, p)) << n << " " << p;
      for (int j = 0; j < p; ++j) {
        const size_t len = r[j + 1] - r[j];
        EXPECT_LE(len, (n + p - 1) / p);
        EXPECT_GE(len, n / p);
      }
    }
  }
}

TEST(Regions, ValidRegionsRejectsWrongShapes) {
  EXPECT_FALSE(valid_regions(std::vector<size_t>{}, 10, 2));
  EXPECT_FALSE(valid_regions(std::vector<size_t>{0, 5}, 10, 2));          // too few
  EXPECT_FALSE(valid_regions(std::vector<size_t>{1, 5, 10}, 10, 2));      // not from 0
  EXPECT_FALSE(valid_regions(std::vector<size_t>{0, 5, 9}, 10, 2));       // not to n
  EXPECT_FALSE(valid_regions(std::vector<size_t>{0, 7, 5, 10}, 10, 3));   // decreasing
  EXPECT_TRUE(valid_regions(std::vector<size_t>{0, 5, 5, 10}, 10, 3));    // an empty region is fine
}

using Selections = std::vector<std::vector<uint32_t>>;

TEST(Regions, NoDemandLeavesTheRegionsAsTheyAre) {
  const std::vector<size_t> r{0, 10, 20, 30, 40};
  EXPECT_EQ(rebalanced_regions(r, std::vector<uint64_t>{0, 0, 0, 0}, Selections(4)), r);
}

TEST(Regions, EvenDemandOnEqualRegionsKeepsThem) {
  const auto r = equal_regions(4000, 4);
  const auto next = rebalanced_regions(r, std::vector<uint64_t>{100, 100, 100, 100}, Selections(4));
  for (size_t j = 0; j < r.size(); ++j) EXPECT_NEAR(double(next[j]), double(r[j]), 1.0) << j;
}

TEST(Regions, ConcentratedDemandIsSharedByEveryOwner) {
  // All demand in region 1 of 4: the next regions split it, and every
  // region stays within 8n/P (the 1/8 uniform share of the mass).
  const size_t n = 409600;
  auto r = equal_regions(n, 4);
  r = rebalanced_regions(r, std::vector<uint64_t>{0, 1000, 0, 0}, Selections(4));
  ASSERT_TRUE(valid_regions(r, n, 4));
  // Region 1 was [102400, 204800); three of the four boundaries now lie in it.
  int inside = 0;
  for (int j = 1; j < 4; ++j) inside += r[j] > 102400 && r[j] < 204800;
  EXPECT_EQ(inside, 3);
  for (int j = 0; j < 4; ++j) EXPECT_LE(r[j + 1] - r[j], 8 * n / 4);
}

TEST(Regions, RebalancingConvergesOnAHotRun) {
  // Demand spread evenly over a hot run [151552, 155648) (the collectives
  // stream test's layer), owners selecting every 8th hot index they hold:
  // after a few calls each owner holds a similar share of the run.
  const size_t n = 409600, lo = 151552, hi = 155648;
  const int p = 4;
  auto r = equal_regions(n, p);
  for (int call = 0; call < 12; ++call) {
    std::vector<uint64_t> demand(p);
    Selections sel(p);
    for (int j = 0; j < p; ++j) {
      const size_t a = std::max(r[j], lo), b = std::min(r[j + 1], hi);
      demand[j] = b > a ? b - a : 0;  // one unit per hot index in the region
      for (size_t i = a; i < b; i += 8) sel[j].push_back(uint32_t(i - r[j]));
    }
    r = rebalanced_regions(r, demand, sel);
    ASSERT_TRUE(valid_regions(r, n, p));
  }
  for (int j = 0; j < p; ++j) {
    const size_t a = std::max(r[j], lo), b = std::min(r[j + 1], hi);
    const double share = b > a ? double(b - a) / double(hi - lo) : 0.0;
    EXPECT_GT(share, 0.15) << "owner " << j;
    EXPECT_LT(share, 0.35) << "owner " << j;
  }
}

TEST(Regions, HugeDemandsDoNotOverflow) {
  const size_t n = size_t{1} << 32;
  const auto r = rebalanced_regions(equal_regions(n, 3),
                                    std::vector<uint64_t>{~uint64_t{0} / 4, 1, ~uint64_t{0} / 4},
                                    Selections{{0, 5, 1u << 30}, {}, {7}});
  EXPECT_TRUE(valid_regions(r, n, 3));
}

TEST(Budget, OwnersKeepTwiceTheirShareOfK) {
  EXPECT_EQ(scatter_owner_budget(4000, 32), 250u);
  EXPECT_EQ(scatter_owner_budget(1, 8), 1u);
  EXPECT_EQ(scatter_owner_budget(0, 8), 0u);
  EXPECT_EQ(scatter_owner_budget(10, 1), 20u);
}

TEST(CostModel, ScatterTrafficIsIndependentOfTheRankCount) {
  const size_t n = 4000000;  // k = 4000
  const double e = 8.0;
  double last = 0;
  // Per payload: an 8-byte size announcement, the header and sbc's mean.
  const double h = 8 + double(kPayloadHeaderBytes) + 4;
  for (int p : {4, 16, 64, 256, 1024}) {
    const double gather = sparse_pattern_cost(SparsePattern::kAllgather, n, p, 0.001, e).wire_bytes;
    const double scatter = sparse_pattern_cost(SparsePattern::kScatter, n, p, 0.001, e).wire_bytes;
    EXPECT_NEAR(gather, (p - 1) * (h + 4000 * e), 1.0);
    // 3k(P-1)/P entries plus 2(P-1) headers, P-1 demand counts and P-1
    // regions tags.
    const double b = double(scatter_owner_budget(4000, p));
    EXPECT_NEAR(scatter,
                (p - 1.0) / p * 4000 * e + (p - 1) * (b * e + 8) + 2 * (p - 1) * h + (p - 1) * 8,
                1.0);
    EXPECT_LT(scatter, 3 * 4000 * e + 2 * (p - 1) * h + 2 * (p - 1) * 8 + (p - 1) * e);
    last = scatter;
  }
  // The done-when figure of issue 11: 32 ranks within 6 k e + 4096.
  EXPECT_LE(sparse_pattern_cost(SparsePattern::kScatter, n, 32, 0.001, e).wire_bytes, 6 * 4000 * e + 4096);
  EXPECT_GT(last, 0);
  EXPECT_EQ(sparse_pattern_cost(SparsePattern::kScatter, n, 4, 0.001, e).rounds, 2);
  EXPECT_EQ(sparse_pattern_cost(SparsePattern::kAllgather, n, 4, 0.001, e).rounds, 1);
  EXPECT_THROW(sparse_pattern_cost(SparsePattern::kAuto, n, 4, 0.001, e), Error);
}

TEST(CostModel, AutoPicksByRanksKAndTheLink) {
  const LinkModel gbit{100e-6, 50e-6, 8.0 / 1e9};
  const LinkModel slow_rounds{10e-3, 5e-3, 8.0 / 100e9};  // high latency, fast bytes
  // Two ranks: scatter moves as much in more rounds.
  EXPECT_EQ(choose_sparse_pattern(gbit, 4000000, 2, 0.001, 8), SparsePattern::kAllgather);
  // Many ranks on 1 Gbit/s: scatter.
  EXPECT_EQ(choose_sparse_pattern(gbit, 4000000, 32, 0.001, 8), SparsePattern::kScatter);
  // A small k on a latency-bound link: allgather's one round wins.
  EXPECT_EQ(choose_sparse_pattern(slow_rounds, 100000, 8, 0.001, 8), SparsePattern::kAllgather);
}

}  // namespace
}  // namespace compcoll
