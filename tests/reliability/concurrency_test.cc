// Concurrency: two communicators driven from different threads at the same
// time must not disturb each other.
//
//   TwoGroupsOfRankThreadsAtTheSameTime: two independent groups of 4 ranks
//     (threads, tests/support/gloo_harness.h) on one shared store with
//     different prefixes, each running its own random sequence of every
//     registry algorithm at once.
//   SameRanksTwoCommunicatorsFromTwoThreads: 3 ranks (threads), each holding
//     TWO plugin communicators (compcoll::Communicator, prefixes "a" and
//     "b", algorithms dgc and csc); on every rank one thread drives "a" and
//     another drives "b", at the same time.
//
// Results are checked against the exact sum: inputs are small integers
// (workload.h) and the algorithms are configured to be lossless (density 1,
// csc fraction 1) where they can be; the lossy ones (sbc, sdagc, onebit)
// are checked bit for bit against what their codecs give when recomputed
// here from every rank's input, without communication. These tests also
// run under ThreadSanitizer (scripts/run-sanitizers.sh).
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/onebit_allreduce.h"
#include "collectives/registry.h"
#include "compcoll/error.h"
#include "compression/decode.h"
#include "compression/onebit.h"
#include "plugin/communicator.h"
#include "tests/reliability/workload.h"
#include "tests/support/expected.h"
#include "tests/support/gloo_harness.h"
#include "transport/gloo_connect.h"

namespace compcoll {
namespace {

using namespace compcoll::reliability;
using std::chrono::milliseconds;

constexpr size_t kMaxCount = 20000;

AlgoParams test_params() {
  AlgoParams p;
  p.density = 1.0;       // dgc, sdagc, sbc select everything: dgc is then exact
  p.csc_fraction = 1.0;  // csc sends every chunk: exact
  p.csc_chunk = 256;
  p.onebit_block = 64;
  p.auto_algo = "dgc";   // auto's two choices are then both exact
  return p;
}

// What a lossy algorithm must deliver for call `call`: its codecs applied to
// every rank's input in rank order (fresh error-feedback state), as the
// collective does.
std::vector<float> expected_lossy(const std::string& algo, const AlgoParams& p, uint64_t seed, size_t call,
                                  int world, size_t n) {
  std::vector<std::vector<float>> inputs(world, std::vector<float>(n));
  for (int r = 0; r < world; ++r) fill_input(seed, call, r, inputs[r].data(), n);
  return algo == "onebit" ? compcoll::testing::expected_onebit_sum(p, inputs)
                          : compcoll::testing::expected_sparse_sum(algo, p, inputs);
}

// One rank's part of a group's sequence over `comm`.
void run_sequence(Comm& comm, uint64_t seed, size_t calls) {
  const AlgoParams p = test_params();
  std::vector<std::string> names;
  std::vector<std::unique_ptr<Algorithm>> algos;
  for (const auto& d : algorithm_table()) {
    names.push_back(d.name);
    algos.push_back(d.make(p));
    algos.back()->attach(comm);
  }
  const auto seq = make_sequence(seed, calls, algos.size(), kMaxCount, 4096);
  std::vector<float> buf;
  for (size_t call = 0; call < seq.size(); ++call) {
    const CallSpec& c = seq[call];
    const std::string& name = names[c.algo];
    buf.resize(c.count);
    fill_input(seed, call, comm.rank(), buf.data(), c.count);
    auto state = algos[c.algo]->make_state(c.count, comm.size());
    algos[c.algo]->allreduce(comm, buf.data(), c.count, false, *state);
    const bool lossy = name == "sbc" || name == "sdagc" || name == "onebit";
    const std::vector<float> want = lossy ? expected_lossy(name, p, seed, call, comm.size(), c.count)
                                          : exact_sum(seed, call, comm.size(), c.count);
    ASSERT_TRUE(bitwise_equal(want, buf.data(), c.count))
        << name << " call " << call << " (" << c.count << " elements) on rank " << comm.rank()
        << " differs from the " << (lossy ? "codecs' recomputed result" : "exact sum");
  }
}

TEST(Concurrency, TwoGroupsOfRankThreadsAtTheSameTime) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  constexpr int kWorld = 4;
  constexpr size_t kCalls = 80;
  std::exception_ptr errors[2];
  std::thread groups[2];
  for (int g = 0; g < 2; ++g) {
    groups[g] = std::thread([&, g] {
      try {
        testing::HarnessOptions o;
        o.store = store;
        o.prefix = g == 0 ? "groupA" : "groupB";
        o.timeout = milliseconds(20000);
        testing::run_gloo_ranks(kWorld, [&](Comm& comm) { run_sequence(comm, 1000 + g, kCalls); }, o);
      } catch (...) {
        errors[g] = std::current_exception();
      }
    });
  }
  for (auto& t : groups) t.join();
  for (int g = 0; g < 2; ++g) EXPECT_EQ(testing::what(errors[g]), "") << "group " << g;
}

TEST(Concurrency, SameRanksTwoCommunicatorsFromTwoThreads) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  constexpr int kWorld = 3;
  constexpr size_t kCalls = 120;
  // Per rank, per communicator: the first error (empty when none).
  std::vector<std::string> errors(2 * kWorld);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kWorld; ++rank) {
    ranks.emplace_back([&, rank] {
      std::unique_ptr<Communicator> comms[2];
      try {
        for (int c = 0; c < 2; ++c) {
          GlooOptions o;
          o.rank = rank;
          o.size = kWorld;
          o.store = store;
          o.hostname = "127.0.0.1";
          o.timeout = milliseconds(20000);
          o.prefix = c == 0 ? "a" : "b";
          Config cfg;
          cfg.algo = c == 0 ? "dgc" : "csc";
          cfg.params = test_params();
          cfg.min_elems = 1000;  // smaller calls take the dense route: both paths run
          cfg.timeout = o.timeout;
          comms[c] = std::make_unique<Communicator>(connect_gloo(o), cfg);
        }
      } catch (const std::exception& e) {
        errors[2 * rank] = std::string("connect: ") + e.what();
        return;
      }
      auto drive = [&](int c) {
        try {
          const uint64_t seed = 7000 + c;
          // Algorithm index 0 only: each communicator has one algorithm.
          const auto seq = make_sequence(seed, kCalls, 1, kMaxCount, 4096);
          std::vector<float> buf;
          for (size_t call = 0; call < seq.size(); ++call) {
            const size_t n = seq[call].count;
            buf.resize(n);
            fill_input(seed, call, rank, buf.data(), n);
            // The model tensor keeps its key (and state) across calls.
            const std::string key = seq[call].model ? "model" : "";
            comms[c]->allreduce(buf.data(), n, DType::kFloat32, ReduceOp::kSum,
                                key.empty() ? nullptr : key.c_str());
            // Lossless settings leave a zero residual, so even the model
            // tensor's calls are exactly this call's sum.
            if (!bitwise_equal(exact_sum(seed, call, kWorld, n), buf.data(), n)) {
              errors[2 * rank + c] = "communicator " + std::to_string(c) + " call " + std::to_string(call) +
                                     " (" + std::to_string(n) + " elements) differs from the exact sum";
              return;
            }
          }
        } catch (const std::exception& e) {
          errors[2 * rank + c] = e.what();
        }
      };
      std::thread other(drive, 1);
      drive(0);
      other.join();
    });
  }
  for (auto& t : ranks) t.join();
  for (size_t i = 0; i < errors.size(); ++i) {
    EXPECT_EQ(errors[i], "") << "rank " << i / 2 << " communicator " << i % 2;
  }
}

}  // namespace
}  // namespace compcoll
