// Faults: ranks that never join, peers that die or hang, transports that
// cannot work here, bad options. Nothing may hang; every failure must be a
// compcoll::Error of the right kind within the timeout plus a small slack.
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "compcoll/error.h"
#include "tests/support/gloo_harness.h"
#include "tests/support/process_util.h"
#include "transport/gloo_connect.h"

namespace compcoll {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using namespace compcoll::testing;

const std::string kPeer = COMPCOLL_TRANSPORT_PEER;
constexpr long long kSlackMs = 2000;

long long ms_since(steady_clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(steady_clock::now() - t).count();
}

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

GlooOptions thread_options(int rank, int size, std::shared_ptr<gloo::rendezvous::Store> store,
                           milliseconds timeout) {
  GlooOptions o;
  o.rank = rank;
  o.size = size;
  o.store = std::move(store);
  o.hostname = "127.0.0.1";
  o.timeout = timeout;
  return o;
}

// Expects `f` to throw compcoll::Error of `kind` whose message has `needle`.
template <typename F>
void expect_error(F&& f, ErrorKind kind, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_TRUE(contains(e.what(), needle)) << "'" << needle << "' not in: " << e.what();
  }
}

TEST(Faults, RankThatNeverJoinsTimesOutRendezvousOnTime) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const milliseconds timeout(2000);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(2);
  std::vector<long long> took(2);
  for (int r = 0; r < 2; ++r) {  // rank 2 of 3 is never started
    threads.emplace_back([&, r] {
      const auto start = steady_clock::now();
      try {
        connect_gloo(thread_options(r, 3, store, timeout));
      } catch (const TimeoutError& e) {  // a timeout by type, not only by its words
        EXPECT_EQ(e.limit(), timeout);
        errors[static_cast<size_t>(r)] = std::string(error_kind_name(e.kind())) + ": " + e.what();
      } catch (const Error& e) {
        ADD_FAILURE() << "not a TimeoutError: " << e.what();
      }
      took[static_cast<size_t>(r)] = ms_since(start);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    const std::string& e = errors[static_cast<size_t>(r)];
    EXPECT_TRUE(contains(e, "transport error")) << e;
    EXPECT_TRUE(contains(e, "rank(s) 2 never joined")) << e;
    EXPECT_TRUE(contains(e, "timed out after 2000 ms")) << e;
    EXPECT_GE(took[static_cast<size_t>(r)], 1900);
    EXPECT_LT(took[static_cast<size_t>(r)], 2000 + kSlackMs);
  }
}

TEST(Faults, RankThatNeverJoinsAcrossProcesses) {
  TempDir dir;
  ChildSet children;
  std::vector<pid_t> pids;
  const auto start = steady_clock::now();
  for (int r : {0, 2}) {  // rank 1 of 3 is never started
    pids.push_back(children.add(spawn(
        {kPeer, "--rank", std::to_string(r), "--size", "3", "--rendezvous",
         "file://" + dir.path() + "/store", "--timeout-ms", "2000", "--mode", "join"},
        dir.path() + "/out" + std::to_string(r))));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    const auto status = children.wait(pids[i], milliseconds(2000 + kSlackMs + 1000));
    ASSERT_TRUE(status.has_value()) << "a rank hung in rendezvous";
    const std::string out = read_file(dir.path() + "/out" + std::to_string(i == 0 ? 0 : 2));
    EXPECT_EQ(exit_code(*status), 2) << out;
    EXPECT_TRUE(contains(out, "rank(s) 1 never joined")) << out;
  }
  EXPECT_LT(ms_since(start), 2000 + kSlackMs + 500);  // includes process start-up
}

// A peer process is SIGKILLed in the middle of a long run of collectives.
// Every survivor must fail with kTransport within timeout + slack, and its
// next call must say the communicator is broken and must be rebuilt.
TEST(Faults, PeerKilledDuringCollectivesFailsEverySurvivor) {
  TempDir dir;
  ChildSet children;
  const int world = 4;
  const int victim = 2;
  const long long timeout_ms = 2000;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pids.push_back(children.add(spawn(
        {kPeer, "--rank", std::to_string(r), "--size", std::to_string(world), "--rendezvous",
         "file://" + dir.path() + "/store", "--timeout-ms", std::to_string(timeout_ms),
         "--mode", "loop"},
        dir.path() + "/out" + std::to_string(r))));
  }
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(wait_for_text(dir.path() + "/out" + std::to_string(r), "READY", milliseconds(20000)))
        << read_file(dir.path() + "/out" + std::to_string(r));
  }
  std::this_thread::sleep_for(milliseconds(300));  // well inside the loop
  const auto killed_at = steady_clock::now();
  ASSERT_EQ(kill(pids[victim], SIGKILL), 0);
  const auto vstatus = children.wait(pids[victim], milliseconds(5000));
  ASSERT_TRUE(vstatus.has_value());
  EXPECT_EQ(exit_code(*vstatus), -SIGKILL);

  for (int r = 0; r < world; ++r) {
    if (r == victim) continue;
    const milliseconds left = milliseconds(timeout_ms + kSlackMs) -
                              std::chrono::duration_cast<milliseconds>(steady_clock::now() - killed_at);
    const auto status = children.wait(pids[static_cast<size_t>(r)], std::max(left, milliseconds(1)));
    const std::string out = read_file(dir.path() + "/out" + std::to_string(r));
    ASSERT_TRUE(status.has_value()) << "rank " << r << " still running " << ms_since(killed_at)
                                    << " ms after the kill:\n" << out;
    EXPECT_EQ(exit_code(*status), 2) << out;
    EXPECT_TRUE(contains(out, "ERROR transport error")) << out;
    // It names a peer rank (the victim, or a survivor that gave up first).
    EXPECT_TRUE(contains(out, " is rank ") || contains(out, " from rank ") ||
                contains(out, " to rank "))
        << out;
    EXPECT_TRUE(contains(out, "AFTER transport error")) << out;
    EXPECT_TRUE(contains(out, "broken")) << out;
    EXPECT_TRUE(contains(out, "rebuilt")) << out;
  }
  EXPECT_LT(ms_since(killed_at), timeout_ms + kSlackMs);
  children.kill_all();
  // No child of this test process is left, running or zombie.
  errno = 0;
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

// Same, in-process: a rank drops out (destroys its communicator) mid-run.
TEST(Faults, RankLeavingMidRunBreaksTheOthers) {
  HarnessOptions o;
  o.timeout = milliseconds(2000);
  const int world = 3;
  std::vector<long long> failed_after(world, -1);
  steady_clock::time_point left_at;
  const auto errors = run_gloo_ranks_collect(world, [&](Comm& comm) {
    std::vector<float> v(10000, 1.0f);
    for (int it = 0; it < 100000; ++it) {
      if (comm.rank() == 1 && it == 50) {
        left_at = steady_clock::now();
        throw std::runtime_error("rank 1 leaves");
      }
      try {
        comm.allreduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
        for (auto& x : v) x = 1.0f;
        comm.allgatherv(std::vector<uint8_t>(100, 1), kUnboundedPart);
      } catch (const Error&) {
        failed_after[static_cast<size_t>(comm.rank())] = ms_since(left_at);
        throw;
      }
    }
  }, o);
  // Rank 1's comm is destroyed as its thread unwinds: the others see it.
  EXPECT_TRUE(contains(what(errors[1]), "rank 1 leaves"));
  for (int r : {0, 2}) {
    const std::string e = what(errors[static_cast<size_t>(r)]);
    EXPECT_TRUE(contains(e, "rank " + std::to_string(r) + " of 3")) << e;
    EXPECT_GE(failed_after[static_cast<size_t>(r)], 0) << e;
    EXPECT_LT(failed_after[static_cast<size_t>(r)], 2000 + kSlackMs) << e;
  }
}

// A peer that is alive but never makes the matching call: the waiting rank
// times out, names the peer, and both are broken afterwards.
TEST(Faults, HungPeerTimesOutAndNamesTheRank) {
  HarnessOptions o;
  o.timeout = milliseconds(1000);
  long long took = -1;
  const auto errors = run_gloo_ranks_collect(2, [&](Comm& comm) {
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(milliseconds(1500));  // misses rank 0's call
      comm.barrier();  // rank 0 has torn down: this fails too
      return;
    }
    const auto start = steady_clock::now();
    try {
      comm.allgatherv(std::vector<uint8_t>(10, 0), kUnboundedPart);
    } catch (const TimeoutError& e) {
      took = ms_since(start);
      EXPECT_EQ(e.limit(), milliseconds(1000));
      expect_error([&] { comm.barrier(); }, ErrorKind::kTransport, "must be rebuilt");
      throw;
    }
  }, o);
  const std::string e0 = what(errors[0]);
  EXPECT_TRUE(contains(e0, "from rank 1")) << e0;
  EXPECT_TRUE(contains(e0, "1000 ms timeout")) << e0;
  EXPECT_GE(took, 950);
  EXPECT_LT(took, 1000 + kSlackMs);
  EXPECT_TRUE(errors[1] != nullptr) << "rank 1 did not notice rank 0 had gone";
}

TEST(Faults, IbverbsIsRefusedAtOnceWithTheReason) {
  // A store on which rank 1 never appears: any rendezvous attempt would block.
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  GlooOptions o = thread_options(0, 2, store, milliseconds(5000));
  o.transport = "ibverbs";
  const auto start = steady_clock::now();
  try {
    connect_gloo(o);
    ADD_FAILURE() << "ibverbs accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << msg;
    EXPECT_TRUE(contains(msg, "COMPCOLL_TRANSPORT=ibverbs")) << msg;
    EXPECT_TRUE(contains(msg, "no unbound-buffer support")) << msg;
    EXPECT_TRUE(contains(msg, "RDMA")) << msg;
    std::printf("ibverbs refusal: %s\n", msg.c_str());
  }
  EXPECT_LT(ms_since(start), 1000);
  EXPECT_TRUE(store->get("compcoll/join/0").empty()) << "rendezvous traffic happened";
}

TEST(Faults, BadOptionsAreRejectedBeforeAnyTraffic) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  auto opts = [&] { return thread_options(0, 2, store, milliseconds(1000)); };
  GlooOptions o = opts();
  o.transport = "udp";
  expect_error([&] { connect_gloo(o); }, ErrorKind::kInvalidArgument, "allowed values are tcp, ibverbs");
  o = opts();
  o.size = 0;
  expect_error([&] { connect_gloo(o); }, ErrorKind::kInvalidArgument, "world size must be >= 1");
  for (int bad_rank : {-1, 2}) {
    o = opts();
    o.rank = bad_rank;
    expect_error([&] { connect_gloo(o); }, ErrorKind::kInvalidArgument, "outside [0, 2)");
  }
  o = opts();
  o.timeout = milliseconds(0);
  expect_error([&] { connect_gloo(o); }, ErrorKind::kInvalidArgument, "timeout must be positive");
  o = opts();
  o.rendezvous = "file:///tmp";
  expect_error([&] { connect_gloo(o); }, ErrorKind::kInvalidArgument, "got both");
  o = opts();
  o.store = nullptr;
  expect_error([&] { connect_gloo(o); }, ErrorKind::kInvalidArgument, "got neither");
  o = opts();
  o.iface = "lo";
  expect_error([&] { connect_gloo(o); }, ErrorKind::kInvalidArgument, "not both");
  o = opts();
  o.hostname.clear();
  o.iface = "nosuchif0";
  expect_error([&] { connect_gloo(o); }, ErrorKind::kInvalidArgument, "nosuchif0");
  EXPECT_TRUE(store->get("compcoll/join/0").empty()) << "rendezvous traffic happened";
}

TEST(Faults, WorldSizeMismatchIsDetected) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::string e0, e1;
  std::thread t1([&] {
    try {
      connect_gloo(thread_options(1, 3, store, milliseconds(1000)));
    } catch (const Error& e) {
      e1 = e.what();
    }
  });
  try {
    connect_gloo(thread_options(0, 2, store, milliseconds(1000)));
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kMismatch) << e.what();
    e0 = e.what();
  }
  t1.join();
  EXPECT_TRUE(contains(e0, "world size mismatch")) << e0;
  EXPECT_TRUE(contains(e0, "rank 1 with size 3")) << e0;
  EXPECT_FALSE(e1.empty());
}

TEST(Connect, InterfaceSelectionWorksOnLoopback) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::thread> threads;
  std::vector<int> sums(2, 0);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        GlooOptions o = thread_options(r, 2, store, milliseconds(10000));
        o.hostname.clear();
        o.iface = "lo";
        auto comm = connect_gloo(o);
        int x = r + 1;
        comm->allreduce(&x, 1, DType::kInt32, ReduceOp::kSum);
        sums[static_cast<size_t>(r)] = x;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(sums, (std::vector<int>{3, 3}));
}

}  // namespace
}  // namespace compcoll

namespace compcoll {
namespace {

// Resident memory high-water mark of this process (VmHWM), in bytes.
size_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// The threat model's measurement: a hostile peer process announces a 1 GiB
// part to this process, which allows 64 KiB per part. Before the per-part
// bound this rank allocated and zero-filled the announced gibibyte; now the
// call fails right after the size round, naming the peer, and this
// process's peak RSS barely moves. The peer fails too (connections closed).
TEST(Faults, PeerAnnouncingAGibibyteIsRefusedWithoutCommittingIt) {
  TempDir dir;
  ChildSet children;
  const pid_t peer = children.add(spawn(
      {kPeer, "--rank", "1", "--size", "2", "--rendezvous", "file://" + dir.path() + "/store",
       "--timeout-ms", "10000", "--mode", "announce-gib"},
      dir.path() + "/out1"));
  GlooOptions o;
  o.rank = 0;
  o.size = 2;
  o.rendezvous = "file://" + dir.path() + "/store";
  o.hostname = "127.0.0.1";
  o.timeout = milliseconds(10000);
  auto comm = connect_gloo(o);
  const size_t before = peak_rss_bytes();
  const auto start = steady_clock::now();
  expect_error([&] { comm->allgatherv(Bytes(10, 1), 64 * 1024); }, ErrorKind::kTransport,
               "rank 1 announced a 1073741824-byte payload, more than the 65536 bytes");
  const size_t growth = peak_rss_bytes() - before;
  EXPECT_LT(ms_since(start), 5000);
  EXPECT_LT(growth, size_t{16} << 20) << "peak RSS grew by " << growth << " bytes";
  std::printf("refusing a 1 GiB announcement: peak RSS +%.2f MiB, %lld ms\n",
              double(growth) / (1 << 20), ms_since(start));
  // The peer copies its own gibibyte into its result buffer before sending
  // (GlooComm keeps every part, its own included): about a second here,
  // much longer under ThreadSanitizer, hence the generous wait.
  const auto status = children.wait(peer, milliseconds(60000));
  ASSERT_TRUE(status.has_value()) << "the hostile peer hung";
  EXPECT_EQ(exit_code(*status), 2) << read_file(dir.path() + "/out1");
}

}  // namespace
}  // namespace compcoll
