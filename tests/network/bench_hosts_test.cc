// `compcoll-bench allreduce --link RATE --ranks-per-host N`: N ranks per
// network namespace ("host"), and host_tx_bytes, the busiest namespace's
// interface bytes per timed call from the kernel's counters
// (integration/bench/host_counters.h). The runs need root (namespaces) and
// skip themselves otherwise; argument errors and the counter reader do not.
#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <map>
#include <string>
#include <vector>

#include "compcoll/error.h"
#include "integration/bench/bench_rows.h"
#include "integration/bench/host_counters.h"
#include "tests/support/process_util.h"

namespace compcoll::bench {
namespace {

using compcoll::testing::run_to_exit;
using compcoll::testing::RunResult;

const std::string kBench = COMPCOLL_BENCH;

using BenchRun = compcoll::testing::RunResult;

RunResult run_bench(const std::vector<std::string>& args, int limit_s = 180) {
  // The byte counts below are the steady state's: no warm-up calls
  // (the default COMPCOLL_WARMUP_STEPS, in which dgc sends more and
  // onebit runs dense).
  std::vector<std::string> argv{"/usr/bin/env", "COMPCOLL_WARMUP_STEPS=0", kBench, "allreduce"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_to_exit(argv, std::chrono::seconds(limit_s), "compcoll-bench");
}

// The JSON rows of one run (integration/bench/bench_rows.h: strings unquoted).
std::vector<JsonRow> rows_of(const std::string& json) { return parse_json_rows(json); }

double num(const std::map<std::string, std::string>& row, const std::string& key) {
  const auto it = row.find(key);
  EXPECT_NE(it, row.end()) << "no \"" << key << "\" in the row";
  return it == row.end() ? -1.0 : std::strtod(it->second.c_str(), nullptr);
}

std::string skip_reason() {
  if (geteuid() != 0) return "needs root for network namespaces (--link)";
  if (access("/usr/sbin/ip", X_OK) != 0 && access("/sbin/ip", X_OK) != 0)
    return "iproute2 (ip) is not installed";
  return "";
}

// Namespaces of ours still present (the benchmark must remove all it made).
std::vector<std::string> our_namespaces() {
  std::vector<std::string> found;
  if (DIR* d = opendir("/run/netns")) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("compcoll-", 0) == 0) found.push_back(name);
    }
    closedir(d);
  }
  return found;
}

// ---------------------------------------------------------------------------
// No root needed.

TEST(HostCounters, ParsesTxBytesOfTheNamedInterface) {
  const std::string text =
      "Inter-|   Receive                                                |  Transmit\n"
      " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
      "drop fifo colls carrier compressed\n"
      "    lo:  123456     100    0    0    0     0          0         0   654321     101    0 "
      "   0    0     0       0          0\n"
      "  eth0: 9876543210 7000 0 0 0 0 0 0 18446744073709551000 8000 0 0 0 0 0 0\n";
  EXPECT_EQ(parse_tx_bytes(text, "lo"), 654321u);
  EXPECT_EQ(parse_tx_bytes(text, "eth0"), 18446744073709551000ull);
  try {
    parse_tx_bytes(text, "eth1");
    FAIL() << "a missing interface must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'eth1'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_tx_bytes(text, "et"), Error);  // a prefix is not the interface
}

TEST(HostCounters, ReadsTheSameCounterAsSysfs) {
  // Loopback of this namespace; the counter only grows, so sysfs before <=
  // ours <= sysfs after.
  auto sysfs = [] {
    std::ifstream f("/sys/class/net/lo/statistics/tx_bytes");
    unsigned long long v = 0;
    f >> v;
    return v;
  };
  const unsigned long long before = sysfs();
  const uint64_t ours = interface_tx_bytes("lo");
  const unsigned long long after = sysfs();
  EXPECT_LE(before, ours);
  EXPECT_LE(ours, after);
}

TEST(BenchHosts, RanksNotAMultipleOfRanksPerHostIsAClearError) {
  const BenchRun r = run_bench({"--ranks", "5", "--ranks-per-host", "2", "--link", "1gbit",
                                "--count", "1000", "--algo", "dense"});
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--ranks 5 is not a multiple of --ranks-per-host 2"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("\"algo\""), std::string::npos) << "no results after an argument error";
}

TEST(BenchHosts, RanksPerHostNeedsLinkAndIsPositive) {
  BenchRun r = run_bench({"--ranks", "4", "--ranks-per-host", "2", "--count", "1000"});
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--ranks-per-host needs --link"), std::string::npos) << r.output;
  r = run_bench({"--ranks", "4", "--ranks-per-host", "0", "--link", "1gbit", "--count", "1000"});
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--ranks-per-host must be >= 1"), std::string::npos) << r.output;
}

TEST(BenchHosts, WithoutLinkRowsHaveNoHostTxBytes) {
  const BenchRun r = run_bench({"--ranks", "2", "--count", "20000", "--algo", "dense", "--iters",
                                "1", "--json"});
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\"algo\": \"dense\""), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("host_tx_bytes"), std::string::npos) << r.output;
}

// ---------------------------------------------------------------------------
// Namespaces (root).

// 4 ranks on 2 hosts. Gloo's ring visits the ranks in order, so exactly one
// rank per host sends to the other host: the host's interface carries one
// rank's ring bytes, 2 (P-1)/P * 4n, plus headers. dgc's payloads go from
// each of the host's 2 ranks to the 2 ranks of the other host (2 of their 3
// peers), i.e. about 4/3 of one rank's wire_bytes; the same-host payloads
// go over loopback and must not show.
// Sets an environment variable for the benchmarks one test starts.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  const char* name_;
};

TEST(BenchHosts, TwoRanksPerHostSendTheRingBytesOfOneRankPerHost) {
  if (!skip_reason().empty()) GTEST_SKIP() << skip_reason();
  // The flat pattern reasoned about above; the host hierarchy (on by
  // default with 2 ranks per host) is the next test's.
  const ScopedEnv flat("COMPCOLL_HIERARCHY", "off");
  const long long n = 1 << 20;
  const BenchRun r = run_bench({"--ranks", "4", "--ranks-per-host", "2", "--link", "1gbit",
                                "--count", std::to_string(n), "--algo", "dense,dgc", "--iters", "3",
                                "--json"});
  ASSERT_EQ(r.code, 0) << r.output;
  const auto rows = rows_of(r.output);
  ASSERT_EQ(rows.size(), 2u) << r.output;
  const double ring = 2.0 * 3 / 4 * 4.0 * double(n);
  for (const auto& row : rows) {
    EXPECT_EQ(num(row, "ranks_per_host"), 2) << r.output;
    // Ranks of one namespace share the default host identity; the two
    // namespaces differ.
    EXPECT_EQ(num(row, "hosts"), 2) << r.output;
    EXPECT_EQ(row.at("identical"), "true") << r.output;
  }
  const double dense_tx = num(rows[0], "host_tx_bytes");
  EXPECT_GE(dense_tx, 0.98 * ring) << r.output;
  EXPECT_LE(dense_tx, 1.15 * ring) << r.output;
  const double dgc_tx = num(rows[1], "host_tx_bytes");
  const double dgc_expected = 4.0 / 3.0 * num(rows[1], "wire_bytes");
  EXPECT_GE(dgc_tx, 0.9 * dgc_expected) << r.output;
  EXPECT_LE(dgc_tx, 1.8 * dgc_expected) << r.output;
  EXPECT_LT(dgc_tx, 0.05 * dense_tx) << r.output;
  EXPECT_TRUE(our_namespaces().empty()) << "left behind: " << our_namespaces().front();
}

// The host hierarchy (COMPCOLL_HIERARCHY, docs/scaling.md): only each
// host's leader sends dgc's payload to the other host, so the busiest
// interface carries about one payload where the flat run's carries two.
TEST(BenchHosts, TheHostHierarchySendsOnePayloadPerHost) {
  if (!skip_reason().empty()) GTEST_SKIP() << skip_reason();
  const std::vector<std::string> args = {"--ranks", "4", "--ranks-per-host", "2", "--link", "1gbit",
                                         "--count", std::to_string(1 << 20), "--algo", "dgc",
                                         "--iters", "3", "--json"};
  std::map<std::string, std::map<std::string, std::string>> row;
  for (const char* mode : {"host", "off"}) {
    const ScopedEnv env("COMPCOLL_HIERARCHY", mode);
    const BenchRun r = run_bench(args);
    ASSERT_EQ(r.code, 0) << mode << ": " << r.output;
    const auto rows = rows_of(r.output);
    ASSERT_EQ(rows.size(), 1u) << r.output;
    EXPECT_EQ(rows[0].at("identical"), "true") << mode << ": " << r.output;
    row[mode] = rows[0];
  }
  EXPECT_LT(num(row["host"], "host_tx_bytes"), 0.7 * num(row["off"], "host_tx_bytes"));
  // Rank 0 leads its host: one payload out instead of three.
  EXPECT_LT(num(row["host"], "wire_bytes"), 0.5 * num(row["off"], "wire_bytes"));
  EXPECT_TRUE(our_namespaces().empty()) << "left behind: " << our_namespaces().front();
}

// The rows of a run with --hierarchy, keyed "<algo>/<hierarchy>" ("dgc/off",
// "dgc/host"); every one must have given the same bits on every rank.
std::map<std::string, JsonRow> rows_by_algo_and_mode(const BenchRun& r) {
  std::map<std::string, JsonRow> by;
  for (const auto& row : rows_of(r.output)) {
    EXPECT_EQ(row.at("identical"), "true") << r.output;
    by[row.at("algo") + "/" + row.at("hierarchy")] = row;
  }
  return by;
}

// --hierarchy off,host: the flat and the hierarchical dgc in one run, the
// same rotation and the same Gloo baseline; the row behind the hierarchy is
// named by its "hierarchy" field and "dgc+host" in the table.
TEST(BenchHosts, FlatAndHierarchicalRowsInOneRun) {
  if (!skip_reason().empty()) GTEST_SKIP() << skip_reason();
  const BenchRun r = run_bench({"--ranks", "4", "--ranks-per-host", "2", "--link", "1gbit",
                                "--count", std::to_string(1 << 20), "--algo", "dense,dgc",
                                "--iters", "3", "--hierarchy", "off,host", "--json"});
  ASSERT_EQ(r.code, 0) << r.output;
  auto by = rows_by_algo_and_mode(r);
  ASSERT_EQ(by.size(), 3u) << r.output;  // dense once, dgc per mode
  ASSERT_EQ(by.count("dense/off"), 1u) << r.output;
  ASSERT_EQ(by.count("dgc/off"), 1u) << r.output;
  ASSERT_EQ(by.count("dgc/host"), 1u) << r.output;
  const auto& flat = by["dgc/off"];
  const auto& host = by["dgc/host"];
  EXPECT_LT(num(host, "host_tx_bytes"), 0.7 * num(flat, "host_tx_bytes")) << r.output;
  EXPECT_TRUE(our_namespaces().empty()) << "left behind: " << our_namespaces().front();
}

TEST(BenchHosts, HierarchyListAllowsOneModeBesidesOff) {
  const BenchRun r = run_bench({"--ranks", "2", "--count", "1000", "--algo", "dgc",
                                "--hierarchy", "host,auto"});
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--hierarchy: at most one mode other than off"), std::string::npos) << r.output;
  const BenchRun bad = run_bench({"--ranks", "2", "--count", "1000", "--algo", "dgc",
                                  "--hierarchy", "flat"});
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_NE(bad.output.find("--hierarchy: 'flat' is not one of off, host, shards, auto"),
            std::string::npos)
      << bad.output;
}

// --hierarchy off,shards: the sharded rows are named "+shards", give the
// same bits on every rank, and each host's two slice owners send one
// payload of half the tensor each where the flat run's ranks send theirs
// to every other rank.
TEST(BenchHosts, ShardedRowsAreNamedAndSendLessPerHost) {
  if (!skip_reason().empty()) GTEST_SKIP() << skip_reason();
  const BenchRun r = run_bench({"--ranks", "4", "--ranks-per-host", "2", "--link", "1gbit",
                                "--count", std::to_string(1 << 20), "--algo", "dense,dgc,onebit",
                                "--iters", "3", "--hierarchy", "off,shards", "--json"});
  ASSERT_EQ(r.code, 0) << r.output;
  auto by = rows_by_algo_and_mode(r);
  for (const char* algo : {"dgc", "onebit"}) {
    const std::string flat = std::string(algo) + "/off", sharded = std::string(algo) + "/shards";
    ASSERT_EQ(by.count(flat), 1u) << r.output;
    ASSERT_EQ(by.count(sharded), 1u) << r.output;
    EXPECT_LT(num(by[sharded], "host_tx_bytes"), 0.8 * num(by[flat], "host_tx_bytes")) << algo;
  }
  EXPECT_TRUE(our_namespaces().empty()) << "left behind: " << our_namespaces().front();
}

// One rank per host (the default): every rank's bytes are its host's.
// The fences around the metered calls do not disturb the timed ones, and
// the table shows the column.
TEST(BenchHosts, OneRankPerHostAndTheTableShowsHostTx) {
  if (!skip_reason().empty()) GTEST_SKIP() << skip_reason();
  const long long n = 1 << 19;
  const BenchRun r = run_bench({"--ranks", "3", "--link", "1gbit", "--count", std::to_string(n),
                                "--algo", "dense", "--iters", "2"});
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("host_tx(B)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 ranks per host (network namespace), 3 hosts"), std::string::npos)
      << r.output;
  // The last column of the dense row ("... float   sum     dense ..."),
  // whatever the column widths.
  std::string line;
  std::istringstream rows(r.output);
  for (std::string l; std::getline(rows, l);) {
    std::istringstream words(l);
    std::vector<std::string> w{std::istream_iterator<std::string>(words), {}};
    if (w.size() > 4 && w[0] != "#" && w[3] == "sum" && w[4] == "dense") line = l;
  }
  ASSERT_FALSE(line.empty()) << r.output;
  const double tx = std::strtod(line.substr(line.find_last_of(' ') + 1).c_str(), nullptr);
  const double ring = 2.0 * 2 / 3 * 4.0 * double(n);
  EXPECT_GE(tx, 0.98 * ring) << line;
  EXPECT_LE(tx, 1.15 * ring) << line;
}

}  // namespace
}  // namespace compcoll::bench
