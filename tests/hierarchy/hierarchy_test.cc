// The host hierarchy (COMPCOLL_HIERARCHY) with ranks as threads over real
// loopback sockets and real POSIX shared memory. Several hosts are emulated
// in one process with COMPCOLL_HOST_ID per rank.
//
// The central check: a hierarchical call is exactly "the algorithm run
// between one rank per host on the host sums". Each case runs the
// hierarchy on P ranks, then the same algorithm flat on H ranks whose inputs
// are the host sums (added in local-rank order, as the shared-memory reduce
// adds them), and requires the same bits on every rank, call after call
// (so the leaders' error-feedback state evolves as the flat run's does).
#include <gtest/gtest.h>
#include <sched.h>

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "collectives/dense.h"
#include "collectives/hierarchical.h"
#include "collectives/lent_comm.h"
#include "collectives/machine_load.h"
#include "collectives/registry.h"
#include "compcoll/error.h"
#include "plugin/communicator.h"
#include "plugin/config.h"
#include "tests/support/gloo_harness.h"
#include "transport/machine_cpus.h"
#include "transport/shm_group.h"

namespace compcoll {
namespace {

using Env = std::map<std::string, std::string>;

bool table_has(const std::string& name) {
  for (const ConfigVar& v : config_table()) {
    if (name == v.name) return true;
  }
  return false;
}

Config config_for(const std::string& algo, const Env& extra = {},
                  const std::string& pattern = "allgather") {
  Env env = {{"COMPCOLL_ALGO", algo},          {"COMPCOLL_DENSITY", "0.02"},
             {"COMPCOLL_MIN_ELEMS", "1000"},   {"COMPCOLL_CSC_CHUNK", "256"},
             {"COMPCOLL_CSC_FRACTION", "0.1"}, {"COMPCOLL_ONEBIT_BLOCK", "256"},
             {"COMPCOLL_TIMEOUT_MS", "20000"}, {"COMPCOLL_WARMUP_STEPS", "0"}};  // steady state
  // A fixed sparse pattern where the build has one: auto's choice rests on a
  // measured link and could differ between the two runs compared.
  if (table_has("COMPCOLL_SPARSE_PATTERN")) env["COMPCOLL_SPARSE_PATTERN"] = pattern;
  for (const auto& [k, v] : extra) env[k] = v;
  return load_config([&](const char* name) -> std::optional<std::string> {
    const auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

// A deterministic gradient: different per rank, step and element, with
// magnitudes spread over two orders so that selection has work to do.
std::vector<float> gradient(int rank, int step, size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t x = (uint64_t(rank) + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t(step) + 7) * 0xBF58476D1CE4E5B9ull ^
                 (uint64_t(i) + 1) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 29;
    const float u = float(x >> 40) / float(1ull << 24) * 2.0f - 1.0f;
    g[i] = u * (1.0f + float(i % 97));
  }
  return g;
}

struct Layout {
  std::vector<int> host_of;  // world rank -> host label
  std::string name;
};

// Contiguous hosts of the given sizes: {2,2,1} -> ranks 0,1 | 2,3 | 4.
Layout blocks(std::vector<int> sizes) {
  Layout l;
  for (size_t h = 0; h < sizes.size(); ++h) {
    for (int i = 0; i < sizes[h]; ++i) l.host_of.push_back(int(h));
    l.name += (h ? "_" : "") + std::to_string(sizes[h]);
  }
  return l;
}

// Ranks dealt round-robin over H hosts (hosts are not contiguous).
Layout dealt(int world, int hosts) {
  Layout l;
  for (int r = 0; r < world; ++r) l.host_of.push_back(r % hosts);
  l.name = std::to_string(world) + "dealt" + std::to_string(hosts);
  return l;
}

std::string host_label(int h) { return "test-host-" + std::to_string(h); }

// Hosts in order of their lowest rank, each with its ranks in order.
std::vector<std::vector<int>> hosts_of(const Layout& l) {
  std::map<int, int> index;
  std::vector<std::vector<int>> out;
  for (int r = 0; r < int(l.host_of.size()); ++r) {
    auto [it, fresh] = index.emplace(l.host_of[r], int(out.size()));
    if (fresh) out.emplace_back();
    out[it->second].push_back(r);
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

constexpr int kSteps = 3;

struct Case {
  std::string algo;
  Layout layout;
  std::string pattern = "allgather";  // COMPCOLL_SPARSE_PATTERN of dgc and sdagc
};

std::vector<Case> all_cases() {
  const std::vector<Layout> layouts = {blocks({1}),       blocks({2}),       blocks({1, 1, 1}),
                                       blocks({2, 2}),    blocks({2, 1}),    blocks({3, 2, 2}),
                                       blocks({4, 4}),    blocks({4, 3, 1}), blocks({2, 2, 2, 2}),
                                       dealt(5, 2),       dealt(8, 3)};
  std::vector<Case> out;
  for (const auto& a : algorithm_table()) {
    const std::string name = a.name;
    if (name == "dense" || name == "auto") continue;  // dense is flat; auto: own test
    for (const auto& l : layouts) out.push_back({name, l});
  }
  // The scatter pattern between the leaders, where the build has it.
  if (table_has("COMPCOLL_SPARSE_PATTERN")) {
    for (const char* name : {"dgc", "sdagc"}) {
      for (const auto& l : {blocks({2, 2}), blocks({3, 2, 2}), blocks({2, 2, 2, 2}), dealt(8, 3)}) {
        out.push_back({name, l, "scatter"});
      }
    }
  }
  return out;
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.algo << " (" << c.pattern << ") on hosts " << c.layout.name;
}

class HierarchyTest : public ::testing::TestWithParam<Case> {};

TEST_P(HierarchyTest, EqualsTheAlgorithmBetweenHostsOnHostSumsBitForBit) {
  const Case& c = GetParam();
  const int P = int(c.layout.host_of.size());
  const auto hosts = hosts_of(c.layout);
  const int H = int(hosts.size());
  const size_t n = 5003;  // not a multiple of any rank count here

  std::vector<std::vector<std::vector<float>>> got(P, std::vector<std::vector<float>>(kSteps));
  testing::run_gloo_ranks(P, [&](Comm& comm) {
    const int r = comm.rank();
    Config cfg = config_for(c.algo, {{"COMPCOLL_HIERARCHY", "host"},
                                     {"COMPCOLL_HOST_ID", host_label(c.layout.host_of[r])}},
                            c.pattern);
    Communicator cc(std::make_unique<LentComm>(comm), cfg);
    // Where every host has one rank the hierarchy would change nothing:
    // none is built (the calls are the flat algorithm's, as the reference).
    if (H == P) {
      ASSERT_EQ(cc.hierarchy(), nullptr);
    } else {
      ASSERT_NE(cc.hierarchy(), nullptr);
      EXPECT_EQ(cc.hierarchy()->layout().hosts(), H);
    }
    for (int s = 0; s < kSteps; ++s) {
      std::vector<float> g = gradient(r, s, n);
      cc.allreduce(g.data(), n, DType::kFloat32, ReduceOp::kSum, "t");
      got[r][s] = g;
    }
    // Only leaders keep error feedback.
    EXPECT_EQ(cc.state_entries(), !cc.hierarchy() || cc.hierarchy()->is_leader() ? 1u : 0u);
  });

  std::vector<std::vector<std::vector<float>>> ref(H, std::vector<std::vector<float>>(kSteps));
  testing::run_gloo_ranks(H, [&](Comm& comm) {
    const int h = comm.rank();
    Communicator cc(std::make_unique<LentComm>(comm),
                    config_for(c.algo, {{"COMPCOLL_HIERARCHY", "off"}}, c.pattern));
    for (int s = 0; s < kSteps; ++s) {
      std::vector<float> sum = gradient(hosts[h][0], s, n);
      for (size_t l = 1; l < hosts[h].size(); ++l) {
        const auto g = gradient(hosts[h][l], s, n);
        for (size_t i = 0; i < n; ++i) sum[i] += g[i];
      }
      cc.allreduce(sum.data(), n, DType::kFloat32, ReduceOp::kSum, "t");
      ref[h][s] = sum;
    }
  });
  // csc sums its chunks with the transport's dense allreduce, whose order of
  // addition differs between the leaders' communicator (leader order) and
  // Gloo's ring from 3 ranks on: equal up to rounding there.
  const bool exact = c.algo != "csc" || H <= 2;
  for (int s = 0; s < kSteps; ++s) {
    for (int r = 0; r < P; ++r) {
      ASSERT_TRUE(same_bits(got[r][s], got[0][s])) << c.algo << " " << c.layout.name << " step " << s
                                                   << ": rank " << r << " differs from rank 0";
    }
    if (exact) {
      ASSERT_TRUE(same_bits(got[0][s], ref[0][s])) << c.algo << " " << c.layout.name << " step " << s;
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(got[0][s][i], ref[0][s][i], 1e-5f * (1.0f + std::fabs(ref[0][s][i])))
          << c.algo << " " << c.layout.name << " step " << s << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryAlgorithmAndLayout, HierarchyTest, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.algo + (i.param.pattern == "allgather" ? "" : "_scatter") +
                                  "_" + i.param.layout.name;
                         });

// COMPCOLL_HIERARCHY=shards: the tensor is cut into S slices (S = the
// smallest host's ranks, bounds at multiples of 16 elements), and slice j
// is, bit for bit, the algorithm run flat between H ranks on slice j of the
// host sums, with its own error feedback on local rank j of each host.
std::vector<Case> shard_cases() {
  const std::vector<Layout> layouts = {blocks({2, 2}), blocks({3, 2, 2}), blocks({4, 4}),
                                       blocks({2, 2, 2, 2}), dealt(8, 3), blocks({3, 3})};
  std::vector<Case> out;
  for (const auto& a : algorithm_table()) {
    const std::string name = a.name;
    if (name == "dense" || name == "auto") continue;
    for (const auto& l : layouts) out.push_back({name, l});
  }
  if (table_has("COMPCOLL_SPARSE_PATTERN")) {
    for (const char* name : {"dgc", "sdagc"}) {
      for (const auto& l : {blocks({2, 2}), blocks({3, 2, 2}), blocks({4, 4})}) {
        out.push_back({name, l, "scatter"});
      }
    }
  }
  return out;
}

class ShardedHierarchyTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedHierarchyTest, EachSliceEqualsTheAlgorithmBetweenHostsOnHostSumsBitForBit) {
  const Case& c = GetParam();
  const int P = int(c.layout.host_of.size());
  const auto hosts = hosts_of(c.layout);
  const int H = int(hosts.size());
  size_t S = hosts[0].size();
  for (const auto& h : hosts) S = std::min(S, h.size());
  const size_t n = 9011;  // slices of 2,240 to 4,515 elements, above COMPCOLL_MIN_ELEMS
  std::vector<size_t> bounds = {0};
  for (size_t j = 1; j < S; ++j) bounds.push_back(n / S * j / 16 * 16);
  bounds.push_back(n);

  std::vector<std::vector<std::vector<float>>> got(P, std::vector<std::vector<float>>(kSteps));
  testing::run_gloo_ranks(P, [&](Comm& comm) {
    const int r = comm.rank();
    Config cfg = config_for(c.algo, {{"COMPCOLL_HIERARCHY", "shards"},
                                     {"COMPCOLL_HOST_ID", host_label(c.layout.host_of[r])}},
                            c.pattern);
    Communicator cc(std::make_unique<LentComm>(comm), cfg);
    ASSERT_NE(cc.hierarchy(), nullptr);
    ASSERT_EQ(cc.hierarchy()->slices(), int(S)) << cc.hierarchy()->sharded_fallback();
    EXPECT_EQ(cc.hierarchy()->slice_bounds(n), bounds);
    for (int s = 0; s < kSteps; ++s) {
      std::vector<float> g = gradient(r, s, n);
      cc.allreduce(g.data(), n, DType::kFloat32, ReduceOp::kSum, "t");
      got[r][s] = g;
    }
    // Only slice owners keep error feedback, for their slice.
    const int j = cc.hierarchy()->my_slice();
    EXPECT_EQ(cc.state_entries(), j >= 0 ? 1u : 0u);
    if (j >= 0) {
      EXPECT_EQ(cc.hierarchy()->state_elems(n), bounds[size_t(j) + 1] - bounds[size_t(j)]);
    }
  });

  std::vector<std::vector<float>> ref(kSteps, std::vector<float>(n));
  for (size_t j = 0; j < S; ++j) {
    const size_t lo = bounds[j], len = bounds[j + 1] - lo;
    testing::run_gloo_ranks(H, [&](Comm& comm) {
      const int h = comm.rank();
      Communicator cc(std::make_unique<LentComm>(comm),
                      config_for(c.algo, {{"COMPCOLL_HIERARCHY", "off"}}, c.pattern));
      for (int s = 0; s < kSteps; ++s) {
        std::vector<float> sum(len, 0.0f);
        for (size_t l = 0; l < hosts[h].size(); ++l) {
          const auto g = gradient(hosts[h][l], s, n);
          for (size_t i = 0; i < len; ++i) sum[i] = l == 0 ? g[lo + i] : sum[i] + g[lo + i];
        }
        cc.allreduce(sum.data(), len, DType::kFloat32, ReduceOp::kSum, "t");
        if (h == 0) std::copy(sum.begin(), sum.end(), ref[s].begin() + std::ptrdiff_t(lo));
      }
    });
  }
  const bool exact = c.algo != "csc" || H <= 2;  // as in HierarchyTest
  for (int s = 0; s < kSteps; ++s) {
    for (int r = 0; r < P; ++r) {
      ASSERT_TRUE(same_bits(got[r][s], got[0][s])) << c.algo << " " << c.layout.name << " step " << s
                                                   << ": rank " << r << " differs from rank 0";
    }
    if (exact) {
      ASSERT_TRUE(same_bits(got[0][s], ref[s])) << c.algo << " " << c.layout.name << " step " << s;
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(got[0][s][i], ref[s][i], 1e-5f * (1.0f + std::fabs(ref[s][i])))
          << c.algo << " " << c.layout.name << " step " << s << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryAlgorithmAndLayout, ShardedHierarchyTest,
                         ::testing::ValuesIn(shard_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.algo + (i.param.pattern == "allgather" ? "" : "_scatter") +
                                  "_" + i.param.layout.name;
                         });

// shards needs every host to have two ranks or more; a host of one rank
// leaves one slice, so the one leader per host runs it, and says so.
TEST(ShardedHierarchy, AHostOfOneRankFallsBackToOneLeaderPerHost) {
  const Layout l = blocks({2, 1});
  const size_t n = 5003;
  std::vector<std::vector<float>> got(3), ref(3);
  for (const char* mode : {"shards", "host"}) {
    testing::run_gloo_ranks(3, [&](Comm& comm) {
      const int r = comm.rank();
      Communicator cc(std::make_unique<LentComm>(comm),
                      config_for("dgc", {{"COMPCOLL_HIERARCHY", mode},
                                         {"COMPCOLL_HOST_ID", host_label(l.host_of[r])}}));
      ASSERT_NE(cc.hierarchy(), nullptr);
      EXPECT_EQ(cc.hierarchy()->slices(), 1);
      if (std::string(mode) == "shards") {
        EXPECT_NE(cc.hierarchy()->sharded_fallback().find("single rank"), std::string::npos)
            << cc.hierarchy()->sharded_fallback();
      }
      std::vector<float> g = gradient(r, 0, n);
      cc.allreduce(g.data(), n, DType::kFloat32, ReduceOp::kSum, "g");
      (std::string(mode) == "shards" ? got : ref)[r] = g;
      // shards that run as host would change nothing beyond host: said at WARN.
      const HierarchyChoice choice = choose_hierarchy(
          comm, config_for("dgc", {{"COMPCOLL_HIERARCHY", mode},
                                   {"COMPCOLL_HOST_ID", host_label(l.host_of[r])}}));
      EXPECT_EQ(choice.warn, std::string(mode) == "shards") << choice.why;
    });
  }
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(same_bits(got[r], ref[r])) << r;
}

// COMPCOLL_HIERARCHY=host with every rank on one host: the local reduce is
// the whole allreduce, and the lone leader compresses for no peer. It runs
// (a preview, like a one-rank world), but said at WARN; two hosts are not.
TEST(Hierarchy, EveryRankOnOneHostIsSaidAtWarn) {
  for (const Layout& l : {blocks({3}), blocks({2, 1})}) {
    const int P = int(l.host_of.size());
    testing::run_gloo_ranks(P, [&](Comm& comm) {
      const HierarchyChoice choice = choose_hierarchy(
          comm, config_for("dgc", {{"COMPCOLL_HIERARCHY", "host"},
                                   {"COMPCOLL_HOST_ID", host_label(l.host_of[comm.rank()])}}));
      ASSERT_NE(choice.hierarchy, nullptr) << l.name;
      const bool one_host = l.name == blocks({3}).name;
      EXPECT_EQ(choice.warn, one_host) << l.name << ": " << choice.why;
      EXPECT_EQ(choice.why.find("every rank shares one host") != std::string::npos, one_host)
          << choice.why;
    });
  }
}

// dgc's SUM and AVG of the same gradients behind the hierarchy `mode` on
// layout l: every rank gets the same bits, and AVG is the SUM times 1/P
// (scale_in_place, as the flat route does), the world size, not the number
// of hosts. Under shards each slice's owner scales its own slice.
void expect_average_is_the_sum_over_the_world(const Layout& l, size_t n, const char* mode) {
  const int P = static_cast<int>(l.host_of.size());
  std::vector<std::vector<float>> sum(static_cast<size_t>(P)), avg(static_cast<size_t>(P));
  testing::run_gloo_ranks(P, [&](Comm& comm) {
    const int r = comm.rank();
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      Communicator cc(std::make_unique<LentComm>(comm),
                      config_for("dgc", {{"COMPCOLL_HIERARCHY", mode},
                                         {"COMPCOLL_HOST_ID", host_label(l.host_of[r])}}));
      std::vector<float> g = gradient(r, 0, n);
      cc.allreduce(g.data(), n, DType::kFloat32, op, "g");
      (op == ReduceOp::kAvg ? avg : sum)[static_cast<size_t>(r)] = g;
    }
  });
  for (size_t r = 0; r < sum.size(); ++r) {
    EXPECT_TRUE(same_bits(sum[r], sum[0])) << mode << " rank " << r;
    EXPECT_TRUE(same_bits(avg[r], avg[0])) << mode << " rank " << r;
  }
  const float inv = 1.0f / static_cast<float>(P);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(avg[0][i], sum[0][i] * inv) << mode << " element " << i;
}

TEST(ShardedHierarchy, AverageIsTheSumOverTheWorldSizeEverywhere) {
  expect_average_is_the_sum_over_the_world(blocks({2, 2, 2}), 6007, "shards");
}

// AVG divides the hierarchical SUM by the world size; fp16 travels through
// fp32; every rank gets the same bits.
TEST(Hierarchy, AverageAndHalfPrecisionAreIdenticalEverywhere) {
  const Layout l = blocks({3, 1, 2});
  expect_average_is_the_sum_over_the_world(l, 4099, "host");
  const size_t n = 4099;
  std::vector<std::vector<uint16_t>> half(6);
  testing::run_gloo_ranks(6, [&](Comm& comm) {
    const int r = comm.rank();
    Communicator cc(std::make_unique<LentComm>(comm),
                    config_for("sdagc", {{"COMPCOLL_HIERARCHY", "host"},
                                         {"COMPCOLL_HOST_ID", host_label(l.host_of[r])}}));
    std::vector<uint16_t> h(n, 0x3c00);  // 1.0
    cc.allreduce(h.data(), n, DType::kFloat16, ReduceOp::kSum, "h");
    EXPECT_EQ(cc.stats().compressed_calls(), 1u);
    half[r] = h;
  });
  for (int r = 0; r < 6; ++r) EXPECT_EQ(half[r], half[0]) << r;
}

// The three steps with the exact dense algorithm between the leaders: the
// result is the exact sum (integer-valued floats add exactly in any order),
// for tensors of 0, 1 and several shared-memory rounds (a tiny chunk), on
// every world size 1..8 with 1..4 ranks per host, uneven hosts included.
TEST(Hierarchy, DenseBetweenLeadersGivesTheExactSumForEveryLayout) {
  for (int P = 1; P <= 8; ++P) {
    for (int per_host = 1; per_host <= 4; ++per_host) {
      testing::run_gloo_ranks(P, [&](Comm& comm) {
        const int r = comm.rank();
        const HostLayout layout = exchange_host_layout(comm, host_label(r / per_host));
        ASSERT_EQ(layout.hosts(), (P + per_host - 1) / per_host);
        Hierarchy h(comm, layout, connect_local_group(comm, layout, /*chunk_floats=*/1000));
        DenseAllreduce dense;
        for (size_t n : {size_t{0}, size_t{1}, size_t{3001}}) {
          auto state = dense.make_state(n, layout.hosts());
          std::vector<float> g(n);
          for (size_t i = 0; i < n; ++i) g[i] = float((r + 1) * 1000 + int(i % 251));
          h.allreduce(dense, g.data(), n, false, h.is_leader() ? state.get() : nullptr);
          for (size_t i = 0; i < n; ++i) {
            const float exact = float(1000 * P * (P + 1) / 2 + P * int(i % 251));
            ASSERT_EQ(g[i], exact) << "P " << P << " per host " << per_host << " n " << n << " i " << i;
          }
        }
      });
    }
  }
}

// A view of a Comm whose transport cannot connect subgroups (as NCCL's and
// the PyTorch backend's cannot): the hierarchy's leaders then talk over a
// LeaderComm on the world's own calls.
class NoSubgroups final : public Comm {
 public:
  explicit NoSubgroups(Comm& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  std::chrono::milliseconds timeout() const override { return c_.timeout(); }
  Gathered allgatherv(std::span<const uint8_t> s, size_t m) override { return c_.allgatherv(s, m); }
  std::vector<Bytes> alltoallv(const std::vector<Bytes>& s, size_t m) override {
    return c_.alltoallv(s, m);
  }
  void allreduce(void* b, size_t n, DType d, ReduceOp o) override { c_.allreduce(b, n, d, o); }
  void broadcast(void* b, size_t n, int root) override { c_.broadcast(b, n, root); }
  void barrier() override { c_.barrier(); }
  uint64_t bytes_sent() const override { return c_.bytes_sent(); }

 private:
  Comm& c_;
};

// Over Gloo the leaders connect a subgroup of their own; without that the
// leaders' calls ride on the world's. Both give the same bits, call after
// call, and the direct subgroup's bytes count in the world's bytes_sent.
TEST(Hierarchy, DirectLeadersAndLeadersOnTheWorldGiveTheSameBits) {
  const int P = 5, per_host = 2;
  std::vector<std::vector<float>> direct(P), on_world(P);
  for (const bool use_direct : {true, false}) {
    testing::run_gloo_ranks(P, [&](Comm& gloo) {
      NoSubgroups plain(gloo);
      Comm& comm = use_direct ? gloo : static_cast<Comm&>(plain);
      const int r = comm.rank();
      const HostLayout layout = exchange_host_layout(comm, host_label(r / per_host));
      Hierarchy h(comm, layout, connect_local_group(comm, layout));
      EXPECT_EQ(h.leaders_connected_directly(), use_direct);
      EXPECT_EQ(h.leaders() != nullptr, h.is_leader());
      const auto algo = make_algorithm("dgc", AlgoParams{});
      h.leader_phase([&](Comm& leaders) { algo->attach(leaders); });
      const size_t n = 50000;
      auto state = algo->make_state(n, layout.hosts());
      std::vector<float> out;
      for (int step = 0; step < 3; ++step) {
        std::vector<float> g(n);
        for (size_t i = 0; i < n; ++i) g[i] = std::sin(float(i * (r + 1) + step));
        const uint64_t before = comm.bytes_sent();
        h.allreduce(*algo, g.data(), n, false, h.is_leader() ? state.get() : nullptr);
        if (h.is_leader() && layout.hosts() > 1) {
          EXPECT_GT(comm.bytes_sent(), before);
        }
        out.insert(out.end(), g.begin(), g.end());
      }
      (use_direct ? direct : on_world)[size_t(r)] = out;
    });
  }
  for (int r = 0; r < P; ++r) {
    EXPECT_TRUE(same_bits(direct[size_t(r)], direct[0])) << "rank " << r;
    EXPECT_TRUE(same_bits(on_world[size_t(r)], direct[0])) << "rank " << r;
  }
}

class HierarchyNonFinite : public ::testing::TestWithParam<std::string> {};

// A NaN or Inf of any rank (a follower here) reaches every rank's output
// at its position and nowhere else; the next clean call is finite again.
// Behind one leader per host and sharded (the Inf at 15000 lies in the
// second slice, the others in the first).
TEST_P(HierarchyNonFinite, ReachesTheOutputAndDoesNotPoisonTheNextCall) {
  const std::string algo = GetParam();
  const size_t n = 20000;
  for (const char* mode : {"host", "shards"}) {
    testing::run_gloo_ranks(4, [&](Comm& comm) {
      const int r = comm.rank();
      Communicator cc(std::make_unique<LentComm>(comm),
                      config_for(algo, {{"COMPCOLL_HIERARCHY", mode},
                                        {"COMPCOLL_HOST_ID", host_label(r / 2)}}));
      ASSERT_EQ(cc.hierarchy()->slices(), std::string(mode) == "shards" ? 2 : 1);
      std::vector<float> g = gradient(r, 0, n);
      if (r == 1) {
        g[123] = NAN;
        g[4567] = INFINITY;
      }
      if (r == 3) g[15000] = -INFINITY;
      cc.allreduce(g.data(), n, DType::kFloat32, ReduceOp::kSum, "g");
      EXPECT_TRUE(std::isnan(g[123])) << algo << " " << mode;
      EXPECT_EQ(g[4567], INFINITY) << algo << " " << mode;
      EXPECT_EQ(g[15000], -INFINITY) << algo << " " << mode;
      size_t non_finite = 0;
      for (float x : g) non_finite += !std::isfinite(x);
      EXPECT_EQ(non_finite, 3u) << algo << " " << mode << ": non-finite values spread";
      std::vector<float> clean = gradient(r, 1, n);
      cc.allreduce(clean.data(), n, DType::kFloat32, ReduceOp::kSum, "g");
      for (float x : clean) ASSERT_TRUE(std::isfinite(x)) << algo << " " << mode;
    });
  }
}

INSTANTIATE_TEST_SUITE_P(EveryAlgorithm, HierarchyNonFinite,
                         ::testing::Values("dgc", "sbc", "sdagc", "csc", "onebit", "auto"));

// auto uses the hierarchy only with several hosts and a host of several
// ranks, and only where the ranks outnumber the CPUs they may use (here the
// ranks are threads of this process, so its affinity decides); off never
// builds one, host always; auto as the algorithm runs between leaders.
TEST(Hierarchy, AutoModeUsesTheHierarchyOnlyWhereItHelps) {
  struct Want {
    Layout layout;
    const char* mode;
    bool pinned;  // the ranks run on one CPU
    bool hierarchical;
  };
  const int cpus = machine_loads({describe_machine_cpus()}).front().cpus;
  const std::vector<Want> wants = {
      {blocks({4}), "auto", true, false},     {blocks({1, 1, 1}), "auto", true, false},
      {blocks({2, 1}), "auto", true, true},   {blocks({2, 1}), "auto", false, 3 > cpus},
      {blocks({2, 2}), "off", true, false},   {blocks({4}), "host", false, true}};
  for (const Want& w : wants) {
    const int P = int(w.layout.host_of.size());
    cpu_set_t before;
    ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
    if (w.pinned) {  // the rank threads inherit this thread's affinity
      cpu_set_t one;
      CPU_ZERO(&one);
      int first = 0;
      while (!CPU_ISSET(first, &before)) ++first;
      CPU_SET(first, &one);
      ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    }
    testing::run_gloo_ranks(P, [&](Comm& comm) {
      const int r = comm.rank();
      Communicator cc(std::make_unique<LentComm>(comm),
                      config_for("auto", {{"COMPCOLL_HIERARCHY", w.mode},
                                          {"COMPCOLL_HOST_ID", host_label(w.layout.host_of[r])}}));
      EXPECT_EQ(cc.hierarchy() != nullptr, w.hierarchical)
          << w.layout.name << " " << w.mode << (w.pinned ? " on one CPU" : "") << ", " << cpus
          << " CPUs here";
      std::vector<float> g = gradient(r, 0, 30000);
      cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kSum, "g");
      const Gathered all = comm.allgatherv({reinterpret_cast<const uint8_t*>(g.data()), g.size() * 4},
                                           g.size() * 4);
      for (int q = 0; q < all.parts(); ++q) {
        ASSERT_EQ(std::memcmp(all.part(q).data(), g.data(), g.size() * 4), 0) << q;
      }
    });
    ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
  }
}

// Ranks that disagree on COMPCOLL_HIERARCHY fail at creation (agreement).
TEST(Hierarchy, DisagreeingOnTheModeIsAMismatchOnEveryRank) {
  testing::HarnessOptions o;
  o.timeout = std::chrono::milliseconds(5000);
  const auto errors = testing::run_gloo_ranks_collect(2, [](Comm& comm) {
    Communicator cc(std::make_unique<LentComm>(comm),
                    config_for("dgc", {{"COMPCOLL_HIERARCHY", comm.rank() == 0 ? "host" : "off"}}));
  }, o);
  for (const auto& e : errors) {
    EXPECT_NE(testing::what(e).find("hierarchy: rank 0 has host, rank 1 has off"), std::string::npos)
        << testing::what(e);
  }
}

}  // namespace
}  // namespace compcoll

namespace compcoll {
namespace {

// Code that runs algorithms directly (the benchmark) gets the same result
// through choose_hierarchy + HierarchicalAlgorithm as a Communicator gives.
TEST(Hierarchy, HierarchicalAlgorithmMatchesTheCommunicatorPath) {
  const Layout l = blocks({2, 2, 1});
  const size_t n = 7001;
  std::vector<std::vector<float>> via_comm(5), via_algo(5);
  std::vector<size_t> state_sizes(5);
  testing::run_gloo_ranks(5, [&](Comm& comm) {
    const int r = comm.rank();
    const Config cfg = config_for("sdagc", {{"COMPCOLL_HIERARCHY", "host"},
                                            {"COMPCOLL_HOST_ID", host_label(l.host_of[r])}});
    {
      Communicator cc(std::make_unique<LentComm>(comm), cfg);
      std::vector<float> g;
      for (int s = 0; s < 2; ++s) {
        g = gradient(r, s, n);
        cc.allreduce(g.data(), n, DType::kFloat32, ReduceOp::kAvg, "t");
      }
      via_comm[r] = g;
    }
    HierarchyChoice choice = choose_hierarchy(comm, cfg);
    ASSERT_NE(choice.hierarchy, nullptr);
    EXPECT_NE(choice.why.find("3 hosts: {0,1} {2,3} {4}"), std::string::npos) << choice.why;
    HierarchicalAlgorithm algo(make_algorithm(cfg.algo, cfg.params), *choice.hierarchy);
    algo.attach(comm);
    auto state = algo.make_state(n, comm.size());
    state_sizes[r] = state->size();
    std::vector<float> g;
    for (int s = 0; s < 2; ++s) {
      g = gradient(r, s, n);
      algo.allreduce(comm, g.data(), n, /*average=*/true, *state);
    }
    via_algo[r] = g;
  });
  for (int r = 0; r < 5; ++r) {
    EXPECT_TRUE(same_bits(via_algo[r], via_comm[0])) << r;
    EXPECT_TRUE(same_bits(via_comm[r], via_comm[0])) << r;
    EXPECT_EQ(state_sizes[r], (r == 0 || r == 2 || r == 4) ? n : 0u) << "rank " << r;
  }
}

}  // namespace
}  // namespace compcoll

namespace compcoll {
namespace {

TEST(Hierarchy, BadSettingsAreErrorsNamingTheVariable) {
  try {
    config_for("dgc", {{"COMPCOLL_HIERARCHY", "hosts"}});
    FAIL() << "COMPCOLL_HIERARCHY=hosts was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("COMPCOLL_HIERARCHY=hosts"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("off|host|shards|auto"), std::string::npos) << e.what();
  }
  EXPECT_THROW(config_for("dgc", {{"COMPCOLL_HOST_ID", std::string(257, 'h')}}), Error);
  EXPECT_EQ(config_for("dgc", {{"COMPCOLL_HOST_ID", std::string(256, 'h')}}).host_id.size(), 256u);
  EXPECT_EQ(config_for("dgc").hierarchy, "auto");
}

}  // namespace
}  // namespace compcoll
