// The algorithms of collectives/ on several ranks with no transport at all
// (tests/support/thread_comm.h): DESIGN.md asks that compression/ and
// collectives/ be built and tested without Gloo, NCCL or PyTorch, and these
// run in every build, Gloo or not (the Gloo-backed suites in
// tests/collectives go deeper). For every algorithm at 1 to 4 ranks:
//   - the same bits on every rank, call after call;
//   - nothing lost: after C calls the outputs' sum plus every rank's
//     residual is C times the exact sum (sent + residual = accumulated);
//   - a non-finite value reaches every rank's output where the dense sum
//     has it, nowhere else, and the next call is finite again.
// And the in-memory Comm itself: every collective, and a rank that never
// arrives failing the others within the timeout, naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collectives/registry.h"
#include "integration/bench/gradients.h"
#include "tests/support/thread_comm.h"

namespace compcoll {
namespace {

using testing::run_thread_ranks;
using std::chrono::milliseconds;

constexpr size_t kN = 50000;

std::vector<float> gradient_of(int rank, uint64_t step) {
  return bench::make_gradient(bench::GradientKind::kStudentT3, kN, 1000 * step + 17 * rank + 1);
}

TEST(ThreadComm, EveryCollectiveDeliversInRankOrder) {
  run_thread_ranks(3, [](Comm& comm) {
    const int r = comm.rank();
    const Bytes mine(static_cast<size_t>(r) * 5, static_cast<uint8_t>(r + 1));  // rank 0 sends none
    const Gathered g = comm.allgatherv(mine, kUnboundedPart);
    ASSERT_EQ(g.parts(), 3);
    for (int p = 0; p < 3; ++p) {
      EXPECT_EQ(Bytes(g.part(p).begin(), g.part(p).end()),
                Bytes(static_cast<size_t>(p) * 5, static_cast<uint8_t>(p + 1)));
    }
    std::vector<Bytes> to(3);
    for (int p = 0; p < 3; ++p) to[static_cast<size_t>(p)] = Bytes{uint8_t(10 * r + p)};
    const std::vector<Bytes> from = comm.alltoallv(to, 1);
    for (int p = 0; p < 3; ++p) EXPECT_EQ(from[static_cast<size_t>(p)], Bytes{uint8_t(10 * p + r)});
    int32_t x[2] = {r + 1, -r};
    comm.allreduce(x, 2, DType::kInt32, ReduceOp::kSum);
    EXPECT_EQ(x[0], 6);
    EXPECT_EQ(x[1], -3);
    float m = r == 1 ? NAN : float(r);
    comm.allreduce(&m, 1, DType::kFloat32, ReduceOp::kMax);
    EXPECT_TRUE(std::isnan(m)) << "MAX must not drop a NaN";
    uint64_t b = r == 2 ? 0xfeedull : 0;
    comm.broadcast(&b, 8, 2);
    EXPECT_EQ(b, 0xfeedull);
    comm.barrier();
    EXPECT_THROW(comm.allgatherv(Bytes(9), 8), Error) << "a part above max_part is refused";
  });
}

TEST(ThreadComm, ARankThatNeverArrivesFailsTheOthersNamingIt) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run_thread_ranks(3, [](Comm& comm) {
      if (comm.rank() == 2) return;  // never calls
      comm.barrier();
    }, milliseconds(300));
    FAIL() << "the barrier returned without rank 2";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTransport);
    EXPECT_NE(std::string(e.what()).find("rank(s) 2 did not arrive within 300 ms"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

struct Case {
  std::string algo;
  bool scatter;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.algo + (info.param.scatter ? "_scatter" : "");
}

AlgoParams params_for(const Case& c) {
  AlgoParams p;
  p.density = 0.01;
  p.csc_chunk = 4096;
  p.csc_fraction = 0.1;
  p.onebit_residual_bound = 0.0f;  // unbounded: onebit keeps what it does not send too
  p.sparse_pattern = c.scatter ? SparsePattern::kScatter : SparsePattern::kAllgather;
  return p;
}

class InMemoryAlgorithmTest : public ::testing::TestWithParam<Case> {};

TEST_P(InMemoryAlgorithmTest, SameBitsEverywhereAndNothingLost) {
  const Case c = GetParam();
  for (int world = 1; world <= 4; ++world) {
    run_thread_ranks(world, [&](Comm& comm) {
      const auto algo = make_algorithm(c.algo, params_for(c));
      algo->attach(comm);
      auto state = algo->make_state(kN, comm.size());
      constexpr int kCalls = 6;
      std::vector<double> outputs(kN, 0.0), exact(kN, 0.0);
      for (int r = 0; r < world; ++r) {
        const std::vector<float> g = gradient_of(r, 0);
        for (size_t i = 0; i < kN; ++i) exact[i] += kCalls * double(g[i]);
      }
      for (int call = 0; call < kCalls; ++call) {
        std::vector<float> buf = gradient_of(comm.rank(), 0);
        algo->allreduce(comm, buf.data(), kN, false, *state);
        const Gathered all = comm.allgatherv({reinterpret_cast<const uint8_t*>(buf.data()), kN * 4}, kN * 4);
        for (int r = 0; r < all.parts(); ++r) {
          ASSERT_EQ(std::memcmp(all.part(r).data(), buf.data(), kN * 4), 0)
              << c.algo << " at " << world << " ranks, call " << call << ": rank " << r << " differs";
        }
        for (size_t i = 0; i < kN; ++i) outputs[i] += buf[i];
      }
      if (c.algo == "onebit" || c.algo == "auto" || c.algo == "dense") return;
      // What every rank still holds, summed over the ranks.
      std::vector<float> held = state->v;
      held.resize(kN, 0.0f);
      comm.allreduce(held.data(), kN, DType::kFloat32, ReduceOp::kSum);
      double err = 0.0, norm = 0.0;
      for (size_t i = 0; i < kN; ++i) {
        const double d = outputs[i] + held[i] - exact[i];
        err += d * d;
        norm += exact[i] * exact[i];
      }
      EXPECT_LT(std::sqrt(err / norm), 1e-5)
          << c.algo << " at " << world << " ranks: sent + residual != accumulated input";
    });
  }
}

TEST_P(InMemoryAlgorithmTest, ANonFiniteValueReachesEveryOutputAndTheNextCallIsFinite) {
  const Case c = GetParam();
  run_thread_ranks(3, [&](Comm& comm) {
    const auto algo = make_algorithm(c.algo, params_for(c));
    algo->attach(comm);
    auto state = algo->make_state(kN, comm.size());
    std::vector<float> g = gradient_of(comm.rank(), 0);
    if (comm.rank() == 1) g[7] = NAN;
    algo->allreduce(comm, g.data(), kN, false, *state);
    size_t non_finite = 0;
    for (float x : g) non_finite += !std::isfinite(x);
    EXPECT_TRUE(std::isnan(g[7])) << c.algo;
    EXPECT_EQ(non_finite, 1u) << c.algo;
    std::vector<float> next = gradient_of(comm.rank(), 1);
    algo->allreduce(comm, next.data(), kN, false, *state);
    for (float x : next) ASSERT_TRUE(std::isfinite(x)) << c.algo << ": the NaN stayed in the state";
  });
}

INSTANTIATE_TEST_SUITE_P(EveryAlgorithm, InMemoryAlgorithmTest,
                         ::testing::Values(Case{"dense", false}, Case{"dgc", false},
                                           Case{"dgc", true}, Case{"sdagc", false},
                                           Case{"sdagc", true}, Case{"sbc", false},
                                           Case{"csc", false}, Case{"onebit", false},
                                           Case{"auto", false}),
                         case_name);

}  // namespace
}  // namespace compcoll
