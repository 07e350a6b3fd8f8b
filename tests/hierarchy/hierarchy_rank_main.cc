// compcoll_hierarchy_rank: one rank, as its own process, of the hierarchy
// fault tests (hierarchy_fault_test.cc).
//
//   compcoll_hierarchy_rank --rank R --size P --hosts H0,H1,... --rendezvous file://DIR
//       [--algo A] [--count N] [--calls C] [--timeout-ms T]
//       [--kill-level local|local-throw|leaders --kill-rank V --kill-call K]
//       [--linger-ms L] [--flat 1]
//       [--shards 1] [--slow-ms S] [--chunk-floats C]
//
// Connects over Gloo tcp on 127.0.0.1 (host of rank r: the label Hr), builds
// the host hierarchy (shared memory inside a host, the leaders' communicator
// between hosts) and runs C compressed allreduces of N floats, checking after
// each that every rank holds the same bytes. Rank V kills itself (SIGKILL)
// inside call K: at the start of its local reduce (kill-level local), or at
// its first exchange between hosts (kill-level leaders; V must be a leader).
// kill-level local-throw: its local reduce throws instead (an error, not a
// crash). --linger-ms L: after an error a rank stays alive L ms before it
// exits, as a process that handles the error would, so that its connections
// do not close and tell the others.
//
// --shards 1 builds the sharded hierarchy (COMPCOLL_HIERARCHY=shards): every
// local rank below the smallest host's size leads its slice of the tensor
// over a Gloo subgroup of its own; kill-level leaders then kills rank V at
// its slice's first exchange (V must own a slice).
//
// --slow-ms S: every exchange between hosts waits S ms before it starts (a
// slow link), over a leaders' subgroup of its own. --chunk-floats C: the
// shared-memory group moves a call in rounds of C floats (default 4 Mi).
//
// --flat 1 runs the algorithm on the world communicator instead (no
// hierarchy), for comparison. Prints "call I" before each call and, at the
// end, "done median_ms M bytes_per_call B" (this rank's median time per
// call and the bytes it sent per call, the hash check excluded). Exit codes: 0 done;
// 3 compcoll::Error of kind kTransport; 4 another compcoll::Error; 5 results
// differ; 6 any other exception. On an error it prints "error call I kind K:
// MESSAGE".
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "collectives/hierarchical.h"
#include "collectives/lent_comm.h"
#include "collectives/registry.h"
#include "compcoll/error.h"
#include "transport/gloo_connect.h"
#include "transport/shm_group.h"

using namespace compcoll;

namespace {

struct Args {
  int rank = -1;
  int size = 0;
  std::vector<std::string> hosts;
  std::string rendezvous;
  std::string algo = "dgc";
  size_t count = 100000;
  long long calls = 100;
  long long timeout_ms = 3000;
  std::string kill_level;
  int kill_rank = -1;
  long long kill_call = -1;
  bool flat = false;
  bool shards = false;
  long long slow_ms = 0;
  long long linger_ms = 0;
  size_t chunk_floats = kShmDefaultChunkFloats;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--rank") a.rank = std::stoi(v);
    else if (k == "--size") a.size = std::stoi(v);
    else if (k == "--hosts") {
      std::stringstream ss(v);
      std::string h;
      while (std::getline(ss, h, ',')) a.hosts.push_back("host-" + h);
    } else if (k == "--rendezvous") a.rendezvous = v;
    else if (k == "--algo") a.algo = v;
    else if (k == "--count") a.count = std::stoull(v);
    else if (k == "--calls") a.calls = std::stoll(v);
    else if (k == "--timeout-ms") a.timeout_ms = std::stoll(v);
    else if (k == "--kill-level") a.kill_level = v;
    else if (k == "--kill-rank") a.kill_rank = std::stoi(v);
    else if (k == "--kill-call") a.kill_call = std::stoll(v);
    else if (k == "--flat") a.flat = v == "1";
    else if (k == "--shards") a.shards = v == "1";
    else if (k == "--slow-ms") a.slow_ms = std::stoll(v);
    else if (k == "--linger-ms") a.linger_ms = std::stoll(v);
    else if (k == "--chunk-floats") a.chunk_floats = std::stoull(v);
    else throw std::invalid_argument("unknown flag " + k);
  }
  if (a.rank < 0 || a.size < 1 || int(a.hosts.size()) != a.size || a.rendezvous.empty()) {
    throw std::invalid_argument("need --rank, --size, --hosts (one per rank) and --rendezvous");
  }
  return a;
}

// A slice's or the leaders' subgroup (--shards 1, --slow-ms), able to kill
// this process at its next exchange of any kind when the world's flag is
// armed, and to start each exchange slow_ms late.
class ArmedSubgroup final : public Comm {
 public:
  ArmedSubgroup(std::unique_ptr<Comm> c, const bool& armed, long long slow_ms)
      : c_(std::move(c)), armed_(armed), slow_ms_(slow_ms) {}
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  std::chrono::milliseconds timeout() const override { return c_->timeout(); }
  Gathered allgatherv(std::span<const uint8_t> s, size_t m) override {
    die_if_armed();
    return c_->allgatherv(s, m);
  }
  std::vector<Bytes> alltoallv(const std::vector<Bytes>& s, size_t m) override {
    die_if_armed();
    return c_->alltoallv(s, m);
  }
  void allreduce(void* b, size_t n, DType d, ReduceOp o) override {
    die_if_armed();
    c_->allreduce(b, n, d, o);
  }
  void broadcast(void* b, size_t n, int root) override {
    die_if_armed();
    c_->broadcast(b, n, root);
  }
  void barrier() override { c_->barrier(); }
  uint64_t bytes_sent() const override { return c_->bytes_sent(); }

 private:
  void die_if_armed() const {
    if (armed_) raise(SIGKILL);
    if (slow_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms_));
  }
  std::unique_ptr<Comm> c_;
  const bool& armed_;
  long long slow_ms_;
};

// The world Comm, able to kill this process at its next alltoallv (the
// first exchange of a leader phase when armed before a call). With
// subgroups (--shards 1) it connects them, armed by the same flag.
class ArmedComm final : public Comm {
 public:
  explicit ArmedComm(Comm& c) : c_(c) {}
  bool armed = false;
  bool subgroups = false;
  long long slow_ms = 0;
  bool can_connect_subgroup() const override { return subgroups && c_.can_connect_subgroup(); }
  std::unique_ptr<Comm> connect_subgroup(const std::vector<int>& members,
                                         const std::string& name) override {
    return std::make_unique<ArmedSubgroup>(c_.connect_subgroup(members, name), armed, slow_ms);
  }
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  std::chrono::milliseconds timeout() const override { return c_.timeout(); }
  Gathered allgatherv(std::span<const uint8_t> s, size_t m) override { return c_.allgatherv(s, m); }
  std::vector<Bytes> alltoallv(const std::vector<Bytes>& s, size_t m) override {
    if (armed) raise(SIGKILL);
    return c_.alltoallv(s, m);
  }
  void allreduce(void* b, size_t n, DType d, ReduceOp o) override { c_.allreduce(b, n, d, o); }
  void broadcast(void* b, size_t n, int root) override { c_.broadcast(b, n, root); }
  void barrier() override { c_.barrier(); }
  uint64_t bytes_sent() const override { return c_.bytes_sent(); }

 private:
  Comm& c_;
};

// The host's group, able to kill this process as its local reduce starts.
class ArmedLocal final : public LocalGroup {
 public:
  explicit ArmedLocal(std::unique_ptr<LocalGroup> g) : g_(std::move(g)) {}
  bool armed = false;
  bool throws = false;  // --kill-level local-throw: fails without dying
  int local_rank() const override { return g_->local_rank(); }
  int local_size() const override { return g_->local_size(); }
  Addends reduce_to_leader(float* buf, size_t n, std::chrono::milliseconds t,
                           LastRound last) override {
    if (armed) raise(SIGKILL);
    if (throws) CC_THROW(kInvalidArgument, "test: this rank's local step fails");
    return g_->reduce_to_leader(buf, n, t, last);
  }
  void broadcast_from_leader(float* buf, size_t n, std::chrono::milliseconds t,
                             const std::vector<uint32_t>* support) override {
    g_->broadcast_from_leader(buf, n, t, support);
  }
  void reduce_to_owners(float* buf, size_t n, const std::vector<size_t>& bounds,
                        std::chrono::milliseconds t) override {
    if (armed) raise(SIGKILL);
    g_->reduce_to_owners(buf, n, bounds, t);
  }
  void gather_from_owners(float* buf, size_t n, const std::vector<size_t>& bounds,
                          std::chrono::milliseconds t) override {
    g_->gather_from_owners(buf, n, bounds, t);
  }
  void abort(const std::string& why) noexcept override { g_->abort(why); }
  void note_progress() noexcept override { g_->note_progress(); }

 private:
  std::unique_ptr<LocalGroup> g_;
};

uint64_t fnv(const float* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n * 4; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  long long call = -1;
  try {
    const Args a = parse(argc, argv);
    GlooOptions o;
    o.rank = a.rank;
    o.size = a.size;
    o.rendezvous = a.rendezvous;
    o.hostname = "127.0.0.1";
    o.timeout = std::chrono::milliseconds(a.timeout_ms);
    auto gloo = connect_gloo(o);
    ArmedComm world(*gloo);
    world.subgroups = a.shards || a.slow_ms > 0;
    world.slow_ms = a.slow_ms;
    const HostLayout layout = exchange_host_layout(world, a.hosts[size_t(a.rank)]);
    std::unique_ptr<LocalGroup> shm = connect_local_group(world, layout, a.chunk_floats);
    ArmedLocal* local = nullptr;
    if (shm) {
      auto wrapped = std::make_unique<ArmedLocal>(std::move(shm));
      local = wrapped.get();
      shm = std::move(wrapped);
    }
    Hierarchy h(world, layout, std::move(shm), a.shards);
    if (a.shards && h.slices() < 2) throw std::invalid_argument("--shards 1 built no slices: " + h.sharded_fallback());
    AlgoParams params;
    params.density = 0.01;
    const auto algo = make_algorithm(a.algo, params);
    if (a.flat) {
      algo->attach(world);
    } else {
      h.leader_phase([&](Comm& leaders) { algo->attach(leaders); });
    }
    auto state = a.flat ? algo->make_state(a.count, a.size)
                 : h.is_leader() ? algo->make_state(h.state_elems(a.count), layout.hosts()) : nullptr;
    std::vector<double> ms;
    uint64_t sent = 0;  // bytes this rank put on the wire inside the timed calls
    std::printf("READY leader %d\n", int(h.is_leader()));
    std::fflush(stdout);
    std::vector<float> g(a.count);
    try {
      for (call = 0; call < a.calls; ++call) {
        std::printf("call %lld\n", call);
        std::fflush(stdout);
        for (size_t i = 0; i < g.size(); ++i) g[i] = float((a.rank + 1) * int(i % 89)) * 0.01f - float(call);
        if (a.rank == a.kill_rank && call == a.kill_call) {
          if (a.kill_level == "local" && local) local->armed = true;
          if (a.kill_level == "local-throw" && local) local->throws = true;
          if (a.kill_level == "leaders") world.armed = true;
        }
        world.barrier();
        const uint64_t before = world.bytes_sent();
        const auto t0 = std::chrono::steady_clock::now();
        if (a.flat) {
          algo->allreduce(world, g.data(), g.size(), false, *state);
        } else {
          h.allreduce(*algo, g.data(), g.size(), false, state.get());
        }
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        sent += world.bytes_sent() - before;
        uint64_t mine = fnv(g.data(), g.size());
        const Gathered all = world.allgatherv({reinterpret_cast<const uint8_t*>(&mine), 8}, 8);
        for (int r = 0; r < all.parts(); ++r) {
          if (std::memcmp(all.part(r).data(), &mine, 8) != 0) {
            std::printf("error call %lld: rank %d holds other bytes than rank %d\n", call, r, a.rank);
            return 5;
          }
        }
      }
    } catch (const Error& e) {
      // Here, not below: the connections (gloo) are still open while the
      // rank lingers, as in a process that handles the error.
      std::printf("error call %lld kind %s: %s\n", call, error_kind_name(e.kind()), e.what());
      std::fflush(stdout);
      if (a.linger_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.linger_ms));
      return e.kind() == ErrorKind::kTransport ? 3 : 4;
    }
    std::sort(ms.begin(), ms.end());
    std::printf("done median_ms %.2f bytes_per_call %.0f\n", ms.empty() ? 0.0 : ms[ms.size() / 2],
                ms.empty() ? 0.0 : double(sent) / double(ms.size()));
    return 0;
  } catch (const Error& e) {
    std::printf("error call %lld kind %s: %s\n", call, error_kind_name(e.kind()), e.what());
    return e.kind() == ErrorKind::kTransport ? 3 : 4;
  } catch (const std::exception& e) {
    std::printf("error call %lld kind other: %s\n", call, e.what());
    return 6;
  }
}
