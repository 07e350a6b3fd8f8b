// The hierarchy's parts on their own: the host layout, the leaders'
// communicator over the world's alltoallv, and the shared-memory group's
// failure handling (bounded waits that name the peer, aborts, mismatches).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "collectives/host_layout.h"
#include "collectives/leader_comm.h"
#include "compcoll/error.h"
#include "compression/half.h"
#include "tests/support/gloo_harness.h"
#include "transport/shm_group.h"
#include "transport/shm_host.h"

namespace compcoll {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(HostLayout, HostsAreNumberedByTheirLowestRankAndLeadersAreThatRank) {
  const HostLayout l = HostLayout::from_ids({"b", "a", "b", "c", "a"});
  ASSERT_EQ(l.hosts(), 3);
  EXPECT_EQ(l.members[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(l.members[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(l.members[2], (std::vector<int>{3}));
  EXPECT_EQ(l.leaders(), (std::vector<int>{0, 1, 3}));
  EXPECT_TRUE(l.is_leader(1));
  EXPECT_FALSE(l.is_leader(4));
  EXPECT_EQ(l.local_rank(4), 1);
  EXPECT_EQ(l.max_local_size(), 2);
  EXPECT_EQ(l.describe(), "3 hosts: {0,2} {1,4} {3}");
  EXPECT_THROW(HostLayout::from_ids({"a", ""}), Error);
}

TEST(HostLayout, TheDetectedIdIsStableAndNamesTheNetworkNamespace) {
  const std::string id = detect_host_id();
  EXPECT_EQ(id, detect_host_id());
  EXPECT_NE(id.find("/net:"), std::string::npos) << id;
  EXPECT_NE(id.find("/shm:"), std::string::npos) << id;
  EXPECT_EQ(host_id("mine"), "mine");
}

// detect_host_id() in a child process, after `setup` (in the child): "" when
// setup fails (no privilege for namespaces here), else the child's id.
std::string host_id_in_child(bool own_shm) {
  int fds[2];
  if (pipe(fds) != 0) return "";
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string id;
    // A mount namespace of its own, private so nothing reaches the parent's.
    if (unshare(CLONE_NEWNS) == 0 && mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
        (!own_shm || mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=1m") == 0)) {
      try {
        id = detect_host_id();
      } catch (...) {
        id = "";
      }
    }
    const ssize_t n = write(fds[1], id.data(), id.size());
    _exit(n == static_cast<ssize_t>(id.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string id;
  char buf[256];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) id.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return id;
}

// Containers that share the host's network namespace (Kubernetes'
// hostNetwork) but mount their own /dev/shm cannot meet in shared memory:
// they are other hosts. A mount namespace that keeps the same /dev/shm
// changes nothing.
TEST(HostLayout, AProcessWithAnotherDevShmIsAnotherHost) {
  const std::string same = host_id_in_child(false);
  const std::string own = host_id_in_child(true);
  if (same.empty() || own.empty()) GTEST_SKIP() << "no privilege for mount namespaces here";
  EXPECT_EQ(same, detect_host_id());
  EXPECT_NE(own, detect_host_id());
  const std::string net = detect_host_id().substr(0, detect_host_id().find("/shm:"));
  EXPECT_EQ(own.rfind(net + "/shm:", 0), 0u) << own;  // same kernel and network namespace
}

// World of 5: hosts {0,1} {2} {3,4}; leaders 0, 2, 3 run collectives over a
// LeaderComm while ranks 1 and 4 follow.
TEST(LeaderComm, CollectivesAmongLeadersWhileTheOthersFollow) {
  testing::run_gloo_ranks(5, [](Comm& world) {
    const std::vector<int> leaders = {0, 2, 3};
    const int r = world.rank();
    if (r == 1 || r == 4) {
      for (int phase = 0; phase < 2; ++phase) LeaderComm::follow(world);
      return;
    }
    LeaderComm lc(world, leaders);
    const int me = lc.rank();
    ASSERT_EQ(lc.size(), 3);
    // Phase 1: reductions of several dtypes, counts not multiples of 3.
    std::vector<int32_t> ints(10);
    for (int i = 0; i < 10; ++i) ints[size_t(i)] = (me + 1) * 100 + i;
    lc.allreduce(ints.data(), ints.size(), DType::kInt32, ReduceOp::kSum);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(ints[size_t(i)], 600 + 3 * i);
    std::vector<double> d = {double(me), me == 1 ? NAN : 1.0, -double(me)};
    lc.allreduce(d.data(), d.size(), DType::kFloat64, ReduceOp::kMax);
    EXPECT_EQ(d[0], 2.0);
    EXPECT_TRUE(std::isnan(d[1]));
    EXPECT_EQ(d[2], 0.0);
    std::vector<uint16_t> h(2, float_to_half(0.5f));
    lc.allreduce(h.data(), h.size(), DType::kFloat16, ReduceOp::kSum);
    EXPECT_EQ(half_to_float(h[1]), 1.5f);
    float none = 0;
    lc.allreduce(&none, 0, DType::kFloat32, ReduceOp::kSum);
    lc.release();
    // Phase 2: allgatherv, alltoallv, broadcast, barrier.
    const Bytes mine(size_t(me), uint8_t(me + 1));
    const Gathered g = lc.allgatherv(mine, 8);
    ASSERT_EQ(g.parts(), 3);
    for (int j = 0; j < 3; ++j) EXPECT_EQ(g.part(j).size(), size_t(j));
    std::vector<Bytes> to(3);
    for (int j = 0; j < 3; ++j) to[size_t(j)] = Bytes{uint8_t(10 * me + j)};
    const std::vector<Bytes> from = lc.alltoallv(to, 1);
    for (int j = 0; j < 3; ++j) EXPECT_EQ(from[size_t(j)], Bytes{uint8_t(10 * j + me)});
    uint64_t v = me == 2 ? 77 : 0;
    lc.broadcast(&v, sizeof v, 2);
    EXPECT_EQ(v, 77u);
    lc.barrier();
    // A leader announcing more than the call's bound is refused.
    lc.release();
  });
}

ShmGroupOptions options(const std::string& name, int local_rank, int size, size_t chunk = 64) {
  ShmGroupOptions o;
  o.name = name;
  o.local_rank = local_rank;
  for (int l = 0; l < size; ++l) o.world_ranks.push_back(10 + l);
  o.chunk_floats = chunk;
  return o;
}

std::string unique_name(const char* what) {
  return "/compcoll-test-" + std::to_string(getpid()) + "-" + what;
}

// Local ranks as threads; body(l, group). Returns each thread's error text.
std::vector<std::string> run_group(int size, const std::string& name,
                                   const std::function<void(int, ShmGroup&)>& body,
                                   size_t chunk = 64) {
  auto leader = ShmGroup::create(options(name, 0, size, chunk));
  std::vector<std::unique_ptr<ShmGroup>> groups;
  groups.push_back(std::move(leader));
  for (int l = 1; l < size; ++l) groups.push_back(ShmGroup::open(options(name, l, size, chunk)));
  groups[0]->unlink_name();
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int l = 0; l < size; ++l) {
    threads.emplace_back([&, l] {
      try {
        body(l, *groups[size_t(l)]);
      } catch (const std::exception& e) {
        errors[size_t(l)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(ShmGroup, ReducesAndBroadcastsOverSeveralRounds) {
  const auto errors = run_group(3, unique_name("rounds"), [](int l, ShmGroup& g) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{64}, size_t{200}}) {
      std::vector<float> buf(n);
      for (size_t i = 0; i < n; ++i) buf[i] = float(l * 1000 + int(i));
      g.reduce_to_leader(buf.data(), n, milliseconds(5000), LocalGroup::LastRound::kAdd);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(buf[i], l == 0 ? float(3000 + 3 * int(i)) : float(l * 1000 + int(i)));
      }
      g.broadcast_from_leader(buf.data(), n, milliseconds(5000), nullptr);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], float(3000 + 3 * int(i)));
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// LastRound::kReturn: the leader adds every round but the last, gets the
// last round's parts as Addends (buf + addends is the sum), and the slots
// stay untouched until it shares the result; then the next call runs as
// usual (the deferred `taken` was published).
TEST(ShmGroup, TheLeaderCanTakeTheLastRoundAsAddends) {
  const auto errors = run_group(3, unique_name("addends"), [](int l, ShmGroup& g) {
    for (size_t n : {size_t{1}, size_t{64}, size_t{200}, size_t{200}}) {
      std::vector<float> buf(n);
      for (size_t i = 0; i < n; ++i) buf[i] = float(l * 1000 + int(i));
      const Addends add =
          g.reduce_to_leader(buf.data(), n, milliseconds(5000), LocalGroup::LastRound::kReturn);
      if (l != 0) {
        ASSERT_TRUE(add.empty());
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], float(l * 1000 + int(i)));
      } else {
        const size_t last = (n - 1) / 64 * 64;  // the last 64-float round
        ASSERT_EQ(add.off, last);
        ASSERT_EQ(add.len, n - last);
        ASSERT_EQ(add.parts.size(), 2u);
        for (size_t i = 0; i < n; ++i) {
          const float own = float(int(i));
          ASSERT_EQ(buf[i], i < last ? float(3000 + 3 * int(i)) : own) << i;
          ASSERT_EQ(add.sum_at(buf.data(), i), float(3000 + 3 * int(i))) << i;
        }
        add_addends(buf.data(), add);
      }
      g.broadcast_from_leader(buf.data(), n, milliseconds(5000), nullptr);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], float(3000 + 3 * int(i)));
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(ShmGroup, TheNameIsGoneOnceEveryRankMappedIt) {
  const std::string name = unique_name("unlinked");
  run_group(2, name, [](int, ShmGroup&) {});
  EXPECT_LT(shm_open(name.c_str(), O_RDWR, 0), 0);
  EXPECT_EQ(errno, ENOENT);
}

TEST(ShmGroup, APeerThatNeverArrivesIsNamedWithinTheTimeout) {
  const auto t0 = Clock::now();
  std::atomic<bool> done{false};
  const auto errors = run_group(3, unique_name("absent"), [&](int l, ShmGroup& g) {
    if (l == 2) {  // stays away until the others gave up
      while (!done.load()) std::this_thread::sleep_for(milliseconds(5));
      return;
    }
    std::vector<float> buf(10, 1.0f);
    try {
      // The waiting follower's own limit is longer: the leader, waiting for
      // rank 12, must time out first and pass its reason on.
      g.reduce_to_leader(buf.data(), buf.size(), milliseconds(300), LocalGroup::LastRound::kAdd);
      g.broadcast_from_leader(buf.data(), buf.size(), milliseconds(l == 0 ? 300 : 5000), nullptr);
    } catch (const TimeoutError& e) {  // the leader's own wait ran out
      EXPECT_EQ(l, 0) << e.what();
      EXPECT_EQ(e.limit(), milliseconds(300));
      done = true;
      throw;
    } catch (...) {
      EXPECT_NE(l, 0) << "the leader's wait did not end in a TimeoutError";
      done = true;
      throw;
    }
  });
  done = true;
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_LT(ms, 300 + 1000);
  // The leader names world rank 12 (local rank 2); the other rank, waiting
  // for the result, fails with the leader's reason.
  for (int l = 0; l < 2; ++l) {
    EXPECT_NE(errors[size_t(l)].find("world rank 12 (local rank 2"), std::string::npos) << errors[size_t(l)];
    EXPECT_NE(errors[size_t(l)].find("did not arrive at the local reduce within the 300 ms timeout"),
              std::string::npos) << errors[size_t(l)];
  }
}

TEST(ShmGroup, AnAbortFailsTheWaitingPeersAtOnceWithItsReason) {
  const auto t0 = Clock::now();
  const auto errors = run_group(2, unique_name("abort"), [](int l, ShmGroup& g) {
    std::vector<float> buf(10, 1.0f);
    if (l == 1) {
      std::this_thread::sleep_for(milliseconds(50));
      g.abort("inter-host step failed: boom");
      return;
    }
    g.reduce_to_leader(buf.data(), buf.size(), milliseconds(20000), LocalGroup::LastRound::kAdd);
  });
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_LT(ms, 2000);
  EXPECT_NE(errors[0].find("local peer world rank 11 (local rank 1"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("boom"), std::string::npos) << errors[0];
}

TEST(ShmGroup, DifferentCountsAreAMismatchNamingThePeer) {
  const auto errors = run_group(2, unique_name("count"), [](int l, ShmGroup& g) {
    std::vector<float> buf(l == 0 ? 10 : 11, 1.0f);
    try {
      g.reduce_to_leader(buf.data(), buf.size(), milliseconds(5000), LocalGroup::LastRound::kAdd);
      g.broadcast_from_leader(buf.data(), buf.size(), milliseconds(5000), nullptr);
    } catch (const Error& e) {
      EXPECT_TRUE(e.kind() == ErrorKind::kMismatch || e.kind() == ErrorKind::kTransport) << e.what();
      throw;
    }
  });
  EXPECT_NE((errors[0] + errors[1]).find("reduces 1"), std::string::npos) << errors[0] << errors[1];
  EXPECT_NE(errors[0], "");
  EXPECT_NE(errors[1], "");
}

TEST(ShmGroup, CreatingAnExistingNameIsRefused) {
  const std::string name = unique_name("twice");
  auto first = ShmGroup::create(options(name, 0, 2));
  try {
    ShmGroup::create(options(name, 0, 2));
    FAIL() << "a second segment of the same name was created";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace compcoll

namespace compcoll {
namespace {

// The local step's speed: 4 Mi floats (16 MiB) summed into the leader and
// shared back between two local ranks. Prints the median of 9 calls; the
// bound, loose enough for a machine shared by many builds, only catches a
// path gone badly wrong (a round per few floats took 5 s here).
TEST(ShmGroup, FourMillionFloatsBetweenTwoRanksTakeMilliseconds) {
  const size_t n = size_t{1} << 22;
  std::vector<double> ms;
  const auto errors = run_group(2, unique_name("speed"), [&](int l, ShmGroup& g) {
    std::vector<float> buf(n, float(l + 1));
    for (int rep = 0; rep < 9; ++rep) {
      const auto t0 = Clock::now();
      g.reduce_to_leader(buf.data(), n, milliseconds(20000), LocalGroup::LastRound::kAdd);
      g.broadcast_from_leader(buf.data(), n, milliseconds(20000), nullptr);
      if (l == 0) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      ASSERT_EQ(buf[0], 3.0f);
      ASSERT_EQ(buf[n - 1], 3.0f);
      std::fill(buf.begin(), buf.end(), float(l + 1));
    }
  }, kShmDefaultChunkFloats);
  for (const auto& e : errors) ASSERT_EQ(e, "");
  std::sort(ms.begin(), ms.end());
  std::printf("[ info ] 4 Mi floats, 2 local ranks, reduce + broadcast: median %.2f ms (min %.2f)\n",
              ms[ms.size() / 2], ms.front());
  EXPECT_LT(ms[ms.size() / 2], 1000.0);
}

}  // namespace
}  // namespace compcoll
