// Collectives with ranks as separate processes: compcoll-bench's `allreduce`
// (FileStore, Redis) and its `worker` ranks started one by one so a test can
// kill one, leave one out, or give one a different configuration. Every
// surviving rank must fail within timeout + 2 s with a message naming the
// problem, and no process may be left running.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/process_util.h"

namespace compcoll::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const std::string kBench = COMPCOLL_BENCH;
const std::string kAll = "dense,dgc,sbc,sdagc,csc,onebit";

size_t count_of(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

// Runs `compcoll-bench allreduce ... --json`; returns exit code and output.
std::pair<int, std::string> run_bench(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {kBench, "allreduce", "--ranks", "3", "--algo", kAll,
                                   "--count", "200000", "--iters", "2", "--json"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const RunResult r = run_to_exit(argv, milliseconds(120000), "compcoll-bench");
  return {r.code, r.output};
}

// A number field of the JSON row of `algo` in the bench's output (NaN when
// the row or the field is missing).
double row_field(const std::string& out, const std::string& algo, const std::string& field) {
  const size_t row = out.find("\"algo\": \"" + algo + "\"");
  if (row == std::string::npos) return std::nan("");
  const size_t end = out.find('}', row);
  const size_t at = out.find("\"" + field + "\": ", row);
  if (at == std::string::npos || at > end) return std::nan("");
  return std::strtod(out.c_str() + at + field.size() + 4, nullptr);
}

TEST(MultiProcess, EveryAlgorithmOverAFileStoreGivesIdenticalResults) {
  const auto [code, out] = run_bench({});
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(count_of(out, "\"identical\": true"), 6u) << out;
  for (const char* a : {"dense", "dgc", "sbc", "sdagc", "csc", "onebit"}) {
    EXPECT_NE(out.find(std::string("\"algo\": \"") + a + "\""), std::string::npos) << a;
  }
  // The error columns (docs/benchmark.md): dense is exact to float rounding;
  // a compressed call is off (it sends a fraction), and the running sum over
  // the calls is nearer the exact one than a single call, since what one
  // call held back is sent by a later one (error feedback).
  EXPECT_LT(row_field(out, "dense", "rel_error"), 1e-6) << out;
  for (const char* a : {"dgc", "sbc", "sdagc", "csc", "onebit"}) {
    const double call = row_field(out, a, "rel_error");
    const double running = row_field(out, a, "running_rel_error");
    EXPECT_GT(call, 0.01) << a << "\n" << out;
    EXPECT_GT(running, 0.0) << a << "\n" << out;
    EXPECT_LT(running, 0.99 * call) << a << "\n" << out;
  }
}

TEST(MultiProcess, EveryAlgorithmOverARealRedisServer) {
  const std::string redis = find_in_path("redis-server");
  if (redis.empty()) GTEST_SKIP() << "redis-server is not installed (scripts/install-deps.sh installs it)";
  TempDir dir;
  const int port = free_loopback_port();
  ChildSet server;
  const pid_t rs = server.add(spawn({redis, "--port", std::to_string(port), "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no", "--dir", dir.path()},
                                    dir.path() + "/redis.log"));
  const auto until = Clock::now() + milliseconds(10000);
  while (!port_accepts(port) && Clock::now() < until) std::this_thread::sleep_for(milliseconds(20));
  ASSERT_TRUE(port_accepts(port)) << read_file(dir.path() + "/redis.log");
  const auto [code, out] =
      run_bench({"--rendezvous", "redis://127.0.0.1:" + std::to_string(port)});
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(count_of(out, "\"identical\": true"), 6u) << out;
  kill(rs, SIGTERM);
  EXPECT_TRUE(server.wait(rs, milliseconds(5000)).has_value());
}

// Starts ranks [0, started) of a `world`-rank job with compcoll-bench
// worker; env_for(rank) gives extra "NAME=VALUE" settings.
struct Job {
  TempDir dir;
  ChildSet children;
  std::vector<pid_t> pids;
  std::string log(int r) const { return dir.path() + "/rank" + std::to_string(r) + ".log"; }
};

void start_ranks(Job& job, int world, int started, const std::string& algo, int iters,
                 const std::vector<std::string>& env_for_rank1 = {}) {
  for (int r = 0; r < started; ++r) {
    std::vector<std::string> argv = {"/usr/bin/env", "COMPCOLL_TIMEOUT_MS=3000"};
    if (r == 1) argv.insert(argv.end(), env_for_rank1.begin(), env_for_rank1.end());
    const std::vector<std::string> worker = {
        kBench, "worker", "--rank", std::to_string(r), "--ranks", std::to_string(world),
        "--rendezvous", "file://" + job.dir.path() + "/store", "--algo", algo, "--count", "2000000",
        "--iters", std::to_string(iters), "--skip-dense-baseline"};
    argv.insert(argv.end(), worker.begin(), worker.end());
    job.pids.push_back(job.children.add(spawn(argv, job.log(r))));
  }
}

// Waits for each listed rank; returns seconds until it exited (or -1).
double seconds_until_exit(Job& job, int r, Clock::time_point since, int* code) {
  const auto status = job.children.wait(job.pids[r], milliseconds(20000));
  if (!status) return -1.0;
  *code = exit_code(*status);
  return std::chrono::duration<double>(Clock::now() - since).count();
}

TEST(MultiProcessFaults, ARankKilledMidCollectiveFailsEverySurvivorInTime) {
  for (const std::string algo : {"dgc", "csc", "onebit"}) {
    Job job;
    start_ranks(job, 4, 4, algo, 100000);
    // Wait until every rank is inside the compressed collectives.
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(wait_for_text(job.log(r), "running " + algo, milliseconds(20000)))
          << algo << " rank " << r << ": " << read_file(job.log(r));
    }
    std::this_thread::sleep_for(milliseconds(300));
    ASSERT_EQ(kill(job.pids[2], SIGKILL), 0);
    const auto killed_at = Clock::now();
    int code = 0;
    job.children.wait(job.pids[2], milliseconds(5000));
    // Every survivor names a peer; in a ring a survivor may only see its
    // neighbour close (that neighbour failed first), so at least one names
    // the dead rank itself.
    int naming_dead_rank = 0;
    for (int r : {0, 1, 3}) {
      const double s = seconds_until_exit(job, r, killed_at, &code);
      ASSERT_GE(s, 0.0) << algo << " rank " << r << " still running 20 s after the kill";
      EXPECT_LE(s, 3.0 + 2.0) << algo << " rank " << r;
      EXPECT_NE(code, 0) << algo << " rank " << r;
      const std::string log = read_file(job.log(r));
      EXPECT_NE(log.find("compcoll"), std::string::npos) << log;
      const bool names_peer = log.find(" is rank ") != std::string::npos ||
                              log.find(" to rank ") != std::string::npos ||
                              log.find(" from rank ") != std::string::npos;
      EXPECT_TRUE(names_peer) << "rank " << r << " names no peer:\n" << log;
      naming_dead_rank += log.find(" is rank 2") != std::string::npos;
    }
    EXPECT_GE(naming_dead_rank, 1) << algo;
    EXPECT_TRUE(job.children.alive().empty());
    for (pid_t p : job.pids) EXPECT_NE(kill(p, 0), 0) << "pid " << p << " still exists";
  }
}

// Every started rank exits non-zero within timeout + 2 s of `start` with a
// log containing every needle; nothing is left running.
void expect_all_fail_in_time(Job& job, int started, Clock::time_point start,
                             const std::vector<std::string>& needles) {
  for (int r = 0; r < started; ++r) {
    int code = 0;
    const double s = seconds_until_exit(job, r, start, &code);
    ASSERT_GE(s, 0.0) << "rank " << r << " still running";
    EXPECT_LE(s, 3.0 + 2.0) << "rank " << r;
    EXPECT_NE(code, 0) << "rank " << r;
    const std::string log = read_file(job.log(r));
    for (const auto& needle : needles) EXPECT_NE(log.find(needle), std::string::npos) << log;
  }
  EXPECT_TRUE(job.children.alive().empty());
}

TEST(MultiProcessFaults, ARankThatNeverJoinsFailsTheOthersInTime) {
  Job job;
  const auto start = Clock::now();
  start_ranks(job, 4, 3, "dgc", 1);  // rank 3 never starts
  // The bench ranks read the limit from COMPCOLL_TIMEOUT_MS too, and say so.
  expect_all_fail_in_time(job, 3, start,
                          {"rendezvous", "rank(s) 3 never joined",
                           "(COMPCOLL_TIMEOUT_MS=3000 sets this limit; raise it for ranks that "
                           "start slowly)"});
}

TEST(MultiProcessFaults, RanksThatDisagreeOnTheDensityAllRefuseWithTheReason) {
  Job job;
  const auto start = Clock::now();
  start_ranks(job, 3, 3, "dgc", 1, {"COMPCOLL_DENSITY=0.01"});
  expect_all_fail_in_time(job, 3, start,
                          {"disagree", "density: rank 0 has auto, rank 1 has 0.01"});
}

TEST(MultiProcessFaults, BadConfigurationIsRejectedBeforeAnyTraffic) {
  TempDir dir;
  // (COMPCOLL_ALGO is not among them: the benchmark's algorithms are its
  // --algo flag's, and it says the variable changes nothing.)
  for (const std::string bad : {"COMPCOLL_SPARSE_PATTERN=zip", "COMPCOLL_DENSITY=1.5", "COMPCOLL_DENSITY=abc",
                                "COMPCOLL_TIMEOUT_MS=-5"}) {
    ChildSet children;
    const std::string out = dir.path() + "/out.log";
    const pid_t pid = children.add(spawn({"/usr/bin/env", bad, kBench, "allreduce", "--ranks", "2",
                                          "--count", "1000"},
                                         out));
    const auto status = children.wait(pid, milliseconds(10000));
    ASSERT_TRUE(status.has_value());
    EXPECT_NE(exit_code(*status), 0) << bad;
    const std::string text = read_file(out);
    EXPECT_NE(text.find(bad.substr(0, bad.find('='))), std::string::npos) << text;
    EXPECT_EQ(text.find("rank 0"), std::string::npos) << "ranks were started for " << bad;
  }
}

}  // namespace
}  // namespace compcoll::testing

namespace compcoll::testing {
namespace {

// --link builds namespaces and shaped links; Ctrl-C on the benchmark must
// remove them, leave no rank running and no file under its TMPDIR.
bool namespaces_of(pid_t owner) {
  TempDir dir;
  ChildSet c;
  const std::string out = dir.path() + "/ns";
  const pid_t p = c.add(spawn({"/usr/sbin/ip", "netns", "list"}, out));
  c.wait(p, milliseconds(5000));
  return read_file(out).find("compcoll-" + std::to_string(owner) + "-") != std::string::npos;
}

TEST(MultiProcessLink, CtrlCTearsTheShapedNetworkDownAndStopsEveryRank) {
  if (geteuid() != 0) GTEST_SKIP() << "--link needs root";
  TempDir dir, tmp;
  ChildSet children;
  const std::string out = dir.path() + "/bench.out";
  // env execs the benchmark: the pid (which names the namespaces) stays.
  const pid_t bench = children.add(
      spawn({"/usr/bin/env", "TMPDIR=" + tmp.path(), kBench, "allreduce", "--ranks", "3", "--algo",
             "dense", "--count", "20M", "--iters", "50", "--link", "100mbit"},
            out));
  // Wait until the namespaces exist and the ranks are busy, then Ctrl-C.
  const auto until = Clock::now() + milliseconds(20000);
  while (!namespaces_of(bench) && Clock::now() < until) std::this_thread::sleep_for(milliseconds(100));
  if (!namespaces_of(bench)) {
    const std::string text = read_file(out);
    if (text.find("needs root") != std::string::npos || text.find("netns") != std::string::npos) {
      GTEST_SKIP() << "network namespaces are not available here: " << text;
    }
    FAIL() << "no namespaces appeared: " << text;
  }
  std::this_thread::sleep_for(milliseconds(1500));
  ASSERT_EQ(kill(bench, SIGINT), 0);
  const auto status = children.wait(bench, milliseconds(30000));
  ASSERT_TRUE(status.has_value()) << "compcoll-bench ignored Ctrl-C";
  EXPECT_NE(exit_code(*status), 0);
  EXPECT_FALSE(namespaces_of(bench)) << "namespaces left behind after Ctrl-C";
  std::string files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(tmp.path())) {
    files += e.path().string() + "\n";
  }
  EXPECT_EQ(files, "") << "left behind in TMPDIR after Ctrl-C";
  // No worker of this run is left: the benchmark SIGKILLs its ranks on
  // Ctrl-C. (Poll briefly: a killed process takes a moment to go.)
  auto workers_left = [&] {
    TempDir probe;
    ChildSet c;
    const pid_t p = c.add(spawn(
        {"/usr/bin/pgrep", "-f", "compcoll-bench worker .*--ranks 3 .*--count 20971520"},
        probe.path() + "/pgrep"));
    const auto pg = c.wait(p, milliseconds(5000));
    return !pg.has_value() || exit_code(*pg) != 1 ? read_file(probe.path() + "/pgrep") : std::string();
  };
  std::string left = workers_left();
  for (int i = 0; i < 50 && !left.empty(); ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    left = workers_left();
  }
  EXPECT_EQ(left, "") << "ranks still running 5 s after Ctrl-C";
}

}  // namespace
}  // namespace compcoll::testing
