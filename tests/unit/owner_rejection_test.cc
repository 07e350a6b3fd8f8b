// A part that only its owner sees, refused by it (collectives/
// owner_rejection.h): the scatter pattern's parts to a region's owner and
// onebit's shard parts. Every rank must stop with an error that names the
// sender, within moments, not wait out the timeout in the gather that
// follows (and then blame the owner for not arriving); a sparse rank's
// selection goes back into its residual.
//
// Three ranks on the in-memory Comm; rank 0 flips the magic byte of the
// first part it sends rank 1.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "collectives/registry.h"
#include "compcoll/error.h"
#include "tests/support/corrupting_comm.h"
#include "tests/support/thread_comm.h"

namespace compcoll {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kTimeout{20000};
constexpr double kPrompt = 5.0;  // seconds: far below the timeout
constexpr size_t kN = 1 << 16;

struct Case {
  const char* algo;
  size_t magic_at;  // where a part's payload magic is: after the scatter's 8-byte tag
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.algo; }

class OwnerRejection : public ::testing::TestWithParam<Case> {};

TEST_P(OwnerRejection, EveryRankStopsPromptlyNamingTheSender) {
  const Case c = GetParam();
  AlgoParams p;
  p.density = 0.01;
  p.sparse_pattern = SparsePattern::kScatter;
  // Rounded values: an owner's rounding must not enter its residual as well
  // as the whole selection going back.
  p.values = ValueType::kFp16;
  // onebit's residual bound drops by design what exceeds it: off here, so
  // that "nothing lost" is checkable for it too.
  p.onebit_residual_bound = 0.0f;
  std::vector<std::string> errors(3);
  std::vector<double> seconds(3);
  std::vector<double> lost(3, 0.0);  // |residual - input| / |input| after the failed call
  std::mutex mu;
  const auto t0 = Clock::now();
  testing::run_thread_ranks(3, [&](Comm& comm) {
    auto algo = make_algorithm(c.algo, p);
    auto state = algo->make_state(kN, comm.size());
    std::vector<float> g(kN);
    for (size_t i = 0; i < kN; ++i) {
      g[i] = float((i * 2654435761u + 97u * comm.rank()) % 1000) - 500.0f;
    }
    const std::vector<float> input = g;
    testing::CorruptingComm corrupting(comm, testing::CorruptingComm::Target::kFirstPartToPeer1,
                                       c.magic_at);
    Comm& via = comm.rank() == 0 ? static_cast<Comm&>(corrupting) : comm;
    std::string error;
    try {
      algo->allreduce(via, g.data(), kN, false, *state);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kMalformedPayload);
      error = e.what();
    }
    double diff = 0, norm = 0;
    if (!state->v.empty()) {
      for (size_t i = 0; i < kN; ++i) {
        diff += std::pow(double(state->v[i]) - input[i], 2);
        norm += std::pow(double(input[i]), 2);
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    errors[size_t(comm.rank())] = error;
    seconds[size_t(comm.rank())] = std::chrono::duration<double>(Clock::now() - t0).count();
    lost[size_t(comm.rank())] = norm > 0 ? std::sqrt(diff / norm) : 0.0;
  }, kTimeout);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + errors[size_t(r)]);
    EXPECT_FALSE(errors[size_t(r)].empty());
    EXPECT_LT(seconds[size_t(r)], kPrompt);
    EXPECT_EQ(errors[size_t(r)].find("did not arrive"), std::string::npos);
    // Nothing lost: what was selected (onebit: sent) went back into the
    // residual (the velocity is the input at the first call, and nothing
    // was delivered).
    EXPECT_LT(lost[size_t(r)], 1e-5);
  }
  EXPECT_NE(errors[1].find("from rank 0 rejected"), std::string::npos);
  for (int r : {0, 2}) {
    EXPECT_NE(errors[size_t(r)].find("rank 1 refused the part rank 0 sent it"), std::string::npos)
        << errors[size_t(r)];
  }
}

INSTANTIATE_TEST_SUITE_P(ShardOwners, OwnerRejection,
                         ::testing::Values(Case{"dgc", 8}, Case{"sdagc", 8}, Case{"onebit", 0}),
                         [](const auto& info) { return std::string(info.param.algo); });

}  // namespace
}  // namespace compcoll
