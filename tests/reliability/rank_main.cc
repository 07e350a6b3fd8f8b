// compcoll_reliability_rank: one rank, as its own process, of the
// fault-at-scale test (reliability_test.cc).
//
//   compcoll_reliability_rank --rank R --ranks N --rendezvous file://DIR
//       [--seed S] [--calls C] [--max-count M] [--model-count K]
//       [--timeout-ms T]
//
// Connects over Gloo tcp on 127.0.0.1, builds EVERY algorithm of the
// registry (ranks agree on each configuration first), then runs C
// back-to-back allreduces whose algorithm and size come from the shared
// seed (workload.h). After each call it checks:
//   - every rank holds the same bytes (an 8-byte hash, allgathered);
//   - the result is finite (the inputs are);
//   - dense results equal the exact sum bit for bit.
// It prints "call I ALGO COUNT" before each call (the test kills a rank
// when its log reaches a chosen call), then "done CALLS" at the end.
//
// Exit codes: 0 all calls done; 3 compcoll::Error of kind kTransport (a
// peer died or timed out); 4 another compcoll::Error; 5 a check failed;
// 6 any other exception. On an error it prints
//   "error call I kind KIND mono_ns T: MESSAGE"
// where T is CLOCK_MONOTONIC (shared by all processes of the machine) when
// the error reached this rank's main loop.
#include <time.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/agreement.h"
#include "collectives/registry.h"
#include "compcoll/error.h"
#include "tests/reliability/workload.h"
#include "transport/gloo_connect.h"

using namespace compcoll;
using namespace compcoll::reliability;

namespace {

long long mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

struct Args {
  int rank = -1;
  int ranks = 0;
  std::string rendezvous;
  uint64_t seed = 1;
  size_t calls = 1000;
  size_t max_count = 1 << 20;
  size_t model_count = 1 << 16;
  long long timeout_ms = 5000;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "missing value after %s\n", k.c_str());
      std::exit(2);
    }
    const char* v = argv[++i];
    if (k == "--rank") a.rank = std::atoi(v);
    else if (k == "--ranks") a.ranks = std::atoi(v);
    else if (k == "--rendezvous") a.rendezvous = v;
    else if (k == "--seed") a.seed = std::strtoull(v, nullptr, 10);
    else if (k == "--calls") a.calls = std::strtoull(v, nullptr, 10);
    else if (k == "--max-count") a.max_count = std::strtoull(v, nullptr, 10);
    else if (k == "--model-count") a.model_count = std::strtoull(v, nullptr, 10);
    else if (k == "--timeout-ms") a.timeout_ms = std::atoll(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  if (a.rank < 0 || a.ranks < 1 || a.rank >= a.ranks || a.rendezvous.empty()) {
    std::fprintf(stderr, "usage: --rank R --ranks N --rendezvous file://DIR [...]\n");
    std::exit(2);
  }
  return a;
}

[[noreturn]] void check_failed(size_t call, const std::string& what) {
  std::printf("check failed call %zu: %s\n", call, what.c_str());
  std::fflush(stdout);
  std::exit(5);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  size_t call = 0;
  try {
    GlooOptions o;
    o.rank = a.rank;
    o.size = a.ranks;
    o.rendezvous = a.rendezvous;
    o.hostname = "127.0.0.1";
    o.timeout = std::chrono::milliseconds(a.timeout_ms);
    o.prefix = "reliability";
    std::unique_ptr<GlooComm> comm = connect_gloo(o);

    // Every algorithm of the registry, at its default settings.
    AlgoParams params;
    std::vector<std::string> names;
    std::vector<std::unique_ptr<Algorithm>> algos;
    for (const auto& d : algorithm_table()) {
      ensure_agreement(*comm, std::string("algo=") + d.name + ";" + params.canonical());
      algos.push_back(d.make(params));
      algos.back()->attach(*comm);
      names.push_back(d.name);
    }
    std::printf("rank %d: connected, %zu algorithms\n", a.rank, algos.size());
    std::fflush(stdout);

    const std::vector<CallSpec> seq =
        make_sequence(a.seed, a.calls, algos.size(), a.max_count, a.model_count);
    std::vector<std::unique_ptr<CodecState>> model_states(algos.size());
    std::vector<float> buf;
    for (call = 0; call < seq.size(); ++call) {
      const CallSpec& c = seq[call];
      const Algorithm& algo = *algos[c.algo];
      std::printf("call %zu %s %zu\n", call, names[c.algo].c_str(), c.count);
      std::fflush(stdout);
      buf.resize(c.count);
      fill_input(a.seed, call, a.rank, buf.data(), c.count);
      std::unique_ptr<CodecState> fresh;
      CodecState* state;
      if (c.model) {
        auto& s = model_states[c.algo];
        if (!s) s = algo.make_state(c.count, a.ranks);
        state = s.get();
      } else {
        fresh = algo.make_state(c.count, a.ranks);
        state = fresh.get();
      }
      algos[c.algo]->allreduce(*comm, buf.data(), c.count, /*average=*/false, *state);

      for (size_t i = 0; i < c.count; ++i) {
        if (!std::isfinite(buf[i])) check_failed(call, "non-finite output at " + std::to_string(i));
      }
      const uint64_t h = fnv1a(buf.data(), c.count * sizeof(float));
      const Gathered all = comm->allgatherv({reinterpret_cast<const uint8_t*>(&h), sizeof h}, sizeof h);
      for (int r = 0; r < all.parts(); ++r) {
        if (all.part(r).size() != sizeof h || std::memcmp(all.part(r).data(), &h, sizeof h) != 0) {
          check_failed(call, "rank " + std::to_string(r) + " holds other bytes than rank " +
                                 std::to_string(a.rank));
        }
      }
      if (names[c.algo] == "dense" &&
          !bitwise_equal(exact_sum(a.seed, call, a.ranks, c.count), buf.data(), c.count)) {
        check_failed(call, "dense result differs from the exact sum");
      }
    }
    std::printf("done %zu\n", seq.size());
    std::fflush(stdout);
    return 0;
  } catch (const Error& e) {
    std::printf("error call %zu kind %s mono_ns %lld: %s\n", call, error_kind_name(e.kind()), mono_ns(),
                e.what());
    std::fflush(stdout);
    return e.kind() == ErrorKind::kTransport ? 3 : 4;
  } catch (const std::exception& e) {
    std::printf("error call %zu kind exception mono_ns %lld: %s\n", call, mono_ns(), e.what());
    std::fflush(stdout);
    return 6;
  }
}
