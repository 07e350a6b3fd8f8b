// `compcoll-bench project`: the projection beyond this machine from auto's
// cost model, its arguments, --plot, and (root) --validate against a real
// `allreduce --link` run.
#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "collectives/auto.h"
#include "collectives/comm.h"
#include "compcoll/error.h"
#include "integration/bench/bench_rows.h"
#include "tests/support/process_util.h"

namespace compcoll::bench {
namespace {

using compcoll::testing::ChildSet;
using compcoll::testing::exit_code;
using compcoll::testing::read_file;
using compcoll::testing::run_to_exit;
using compcoll::testing::RunResult;
using compcoll::testing::spawn;
using compcoll::testing::TempDir;

const std::string kBench = COMPCOLL_BENCH;

// env: COMPCOLL_* settings for the run ("NAME=VALUE").
std::pair<int, std::string> run_project(const std::vector<std::string>& args, int limit_s = 240,
                                        const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv{"/usr/bin/env"};
  argv.insert(argv.end(), env.begin(), env.end());
  argv.insert(argv.end(), {kBench, "project"});
  argv.insert(argv.end(), args.begin(), args.end());
  const RunResult r = run_to_exit(argv, std::chrono::seconds(limit_s), "compcoll-bench project");
  return {r.code, r.output};
}

std::vector<JsonRow> rows_of(const std::string& text) { return parse_json_rows(text); }

// NaN when the key is missing (the EXPECTs comparing it then fail).
double num(const JsonRow& row, const char* key) {
  return row.count(key) ? row_number(row, key) : NAN;
}

// The one reader of the benchmark's --json (bench_rows.h): what json.h
// writes comes back, progress lines before the list are skipped, and a
// broken list is an error, not a silently short result.
TEST(Project, RowReaderReadsTheBenchmarksJson) {
  const auto rows = parse_json_rows(
      "rank 0: running [dgc]\n[{\"algo\": \"dgc\", \"time_ms\": 12.5, \"ok\": true, \"x\": null},\n"
      " {\"algo\": \"a \\\"b\\\"\\\\c\", \"n\": -3e2}]\n");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(row_text(rows[0], "algo"), "dgc");
  EXPECT_EQ(row_number(rows[0], "time_ms"), 12.5);
  EXPECT_EQ(row_text(rows[0], "ok"), "true");
  EXPECT_TRUE(std::isnan(row_number(rows[0], "x")));
  EXPECT_EQ(row_text(rows[1], "algo"), "a \"b\"\\c");
  EXPECT_EQ(row_number(rows[1], "n"), -300.0);
  EXPECT_TRUE(parse_json_rows("no list here").empty());
  EXPECT_TRUE(parse_json_rows("[]").empty());
  const auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { parse_json_rows("[{\"a\": 1}, {\"b\": 2"); }).find("expected '}'"),
            std::string::npos);
  EXPECT_NE(message([] { parse_json_rows("[{\"a\": \"open"); }).find("unterminated string"),
            std::string::npos);
  EXPECT_NE(message([] { row_number(parse_json_rows("[{\"a\": \"x\"}]")[0], "a"); })
                .find("\"a\" is 'x', not a number"),
            std::string::npos);
  EXPECT_NE(message([] { row_text(parse_json_rows("[{\"a\": 1}]")[0], "b"); }).find("no \"b\""),
            std::string::npos);
}

TEST(Project, EveryVariantAtEveryRankCountAndLink) {
  // Three timings each (their median): one alone can catch a scheduler
  // hiccup of a loaded machine.
  const auto [code, out] = run_project({"--ranks", "4,64", "--link", "1gbit,100gbit", "--count",
                                        "262144", "--json", "--codec-iters", "3"});
  ASSERT_EQ(code, 0) << out;
  const auto rows = rows_of(out);
  // dense, dgc x2, sbc, sdagc x2, csc, onebit = 8 variants, x 2 ranks x 2 links.
  ASSERT_EQ(rows.size(), 32u) << out;
  std::map<std::string, double> t;  // "algo/pattern ranks link" -> time_ms
  std::map<std::string, double> comm;  // the same -> comm_ms (no timing in it)
  for (const auto& r : rows) {
    EXPECT_GT(num(r, "time_ms"), 0.0) << out;
    EXPECT_NEAR(num(r, "time_ms"), num(r, "compute_ms") + num(r, "comm_ms"), 1e-3 * num(r, "time_ms"));
    t[r.at("algo") + "/" + r.at("pattern") + " " + r.at("ranks") + " " + r.at("link")] =
        num(r, "time_ms");
    comm[r.at("algo") + "/" + r.at("pattern") + " " + r.at("ranks") + " " + r.at("link")] =
        num(r, "comm_ms");
    if (r.at("algo") == "dense") {
      // Exactly the model: one ring latency (2 (P-1) x 50 us) + ring bytes
      // at the rate times the TCP goodput; no compute.
      const double p = num(r, "ranks");
      const double rate = r.at("link") == "1gbit" ? 1e9 : 100e9;
      const double bytes = 2.0 * (p - 1) / p * 4.0 * 262144;
      const double expect_ms = 1e3 * (2 * (p - 1) * 50e-6 + bytes * 8 / (rate * 1448.0 / 1514.0));
      EXPECT_NEAR(num(r, "time_ms"), expect_ms, 1e-3 * expect_ms) << out;
      EXPECT_EQ(num(r, "compute_ms"), 0.0);
    }
  }
  // The allgather pattern's traffic grows with P; scatter's does not.
  EXPECT_GT(comm["dgc/allgather 64 1gbit"], comm["dgc/scatter 64 1gbit"]) << out;
  // Compute: one measured call plus what P adds. Allgather decodes P
  // payloads (more at 64 than at 4); scatter and csc do the same work at
  // any P; onebit quantizes less of the tensor twice as P grows.
  std::map<std::string, double> c;  // "algo/pattern ranks" -> compute_ms (1gbit)
  for (const auto& r : rows) {
    if (r.at("link") == "1gbit") {
      c[r.at("algo") + "/" + r.at("pattern") + " " + r.at("ranks")] = num(r, "compute_ms");
    }
  }
  EXPECT_GT(c["dgc/allgather 64"], c["dgc/allgather 4"]) << out;
  EXPECT_EQ(c["dgc/scatter 64"], c["dgc/scatter 4"]) << out;
  EXPECT_EQ(c["csc/ 64"], c["csc/ 4"]) << out;
  EXPECT_LT(c["onebit/ 64"], c["onebit/ 4"]) << out;
  for (const auto& [key, ms] : c) {
    if (key.rfind("dense", 0) != 0) {
      EXPECT_GT(ms, 0.0) << key;
    }
  }
  // A faster link never makes a call slower.
  for (const auto& [key, ms] : t) {
    if (key.find(" 1gbit") == std::string::npos) continue;
    const std::string fast = key.substr(0, key.size() - 5) + "100gbit";
    EXPECT_LE(t.at(fast), ms + 1e-9) << key;
  }
}

TEST(Project, TableNamesTheFastestVariantPerRow) {
  const auto [code, out] = run_project({"--ranks", "4", "--link", "1gbit", "--count", "65536",
                                        "--algo", "dense,dgc", "--codec-iters", "1"});
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("dgc/allgather"), std::string::npos) << out;
  EXPECT_NE(out.find("dgc/scatter"), std::string::npos) << out;
  EXPECT_NE(out.find("fastest"), std::string::npos) << out;
}

// fp32 values and u32 indices at density 0.001: k = 262 entries of 8 bytes.
const std::vector<std::string> kEightByteEntries{
    "COMPCOLL_DENSITY=0.001", "COMPCOLL_VALUE_DTYPE=fp32", "COMPCOLL_INDEX_CODING=u32"};

TEST(Project, RanksPerHostAddsTheHierarchicalVariants) {
  const auto [code, out] = run_project({"--ranks", "8,64", "--link", "1gbit", "--count", "262144",
                                        "--algo", "dense,dgc,csc", "--ranks-per-host", "8",
                                        "--codec-iters", "1", "--json"},
                                       240, kEightByteEntries);
  ASSERT_EQ(code, 0) << out;
  const auto rows = rows_of(out);
  // dense, dgc x2, csc flat; dgc x2, csc under the hierarchy; x 2 rank counts.
  ASSERT_EQ(rows.size(), 14u) << out;
  std::map<std::string, std::map<std::string, std::string>> by;  // "label ranks" -> row
  for (const auto& r : rows) {
    by[r.at("algo") + "/" + r.at("pattern") + (r.at("hierarchy") == "host" ? "+host " : " ") +
       r.at("ranks")] = r;
    if (r.at("algo") == "dense") {
      EXPECT_EQ(r.at("hierarchy"), "off");
    }
  }
  // One host: the hierarchy sends nothing. 8 hosts of 8: the leaders' phase
  // is the flat 8-rank phase on a port each.
  EXPECT_EQ(num(by.at("dgc/allgather+host 8"), "wire_bytes"), 0.0) << out;
  EXPECT_EQ(num(by.at("dgc/allgather+host 64"), "wire_bytes"),
            num(rows_of(run_project({"--ranks", "8", "--link", "1gbit", "--count", "262144",
                                     "--algo", "dgc", "--codec-iters", "1", "--json"},
                                    240, kEightByteEntries)
                            .second)[0],
                "wire_bytes"))
      << out;
  // Flat allgather at 64 ranks: the port carries 8 ranks' messages to the
  // 56 ranks elsewhere.
  const double one_rank = 63.0 * (8 + 28 + 262 * 8.0);
  EXPECT_NEAR(num(by.at("dgc/allgather 64"), "wire_bytes"), one_rank * 8 * 56 / 63, 0.02 * one_rank * 8)
      << out;
  std::string err;
  int rc;
  std::tie(rc, err) = run_project({"--ranks", "4,12", "--ranks-per-host", "8", "--count", "1000"});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("--ranks: 4 is not a multiple of --ranks-per-host 8"), std::string::npos) << err;
}

// --hierarchy off,host,shards: sharded, each of a host's 8 ranks runs the
// leaders' call on an eighth of the tensor, so it sends an eighth of a
// leader's bytes and computes less; the table names every column.
TEST(Project, ShardsAreProjectedBesideTheLeaders) {
  const auto [code, out] = run_project({"--ranks", "64", "--link", "1gbit", "--count", "262144",
                                        "--algo", "dense,dgc", "--ranks-per-host", "8",
                                        "--hierarchy", "off,host,shards", "--json"},
                                       240, kEightByteEntries);
  ASSERT_EQ(code, 0) << out;
  std::map<std::string, std::map<std::string, std::string>> by;  // label -> row
  for (const auto& r : rows_of(out)) by[r.at("algo") + "/" + r.at("pattern") + "+" + r.at("hierarchy")] = r;
  ASSERT_EQ(by.size(), 7u) << out;  // dense; dgc's two patterns flat, +host, +shards
  // (compute_ms compares timings: the default median of 5 codec calls, not
  // one, so that a busy machine's single slow call cannot reverse them.)
  for (const char* pattern : {"allgather", "scatter"}) {
    const auto& host = by.at(std::string("dgc/") + pattern + "+host");
    const auto& shards = by.at(std::string("dgc/") + pattern + "+shards");
    // (JSON prints 6 significant digits.)
    EXPECT_NEAR(num(shards, "wire_bytes"), num(host, "wire_bytes") / 8, 1e-5 * num(host, "wire_bytes"))
        << out;
    EXPECT_LT(num(shards, "compute_ms"), num(host, "compute_ms")) << pattern << ": " << out;
    // The same bytes through the port, more messages per round.
    EXPECT_GT(num(shards, "comm_ms"), num(host, "comm_ms")) << pattern << ": " << out;
  }
  const auto [tcode, table] = run_project({"--ranks", "16", "--link", "1gbit", "--count", "65536",
                                           "--algo", "dgc", "--ranks-per-host", "8",
                                           "--hierarchy", "off,shards", "--codec-iters", "1"});
  ASSERT_EQ(tcode, 0) << table;
  EXPECT_NE(table.find(" dgc/allgather+shards "), std::string::npos) << table;
  EXPECT_EQ(table.find("+host"), std::string::npos) << table;
  auto [rc, err] = run_project({"--ranks", "16", "--count", "1000", "--hierarchy", "off,host"});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("a hierarchy needs hosts of several ranks; give --ranks-per-host N > 1"),
            std::string::npos)
      << err;
  std::tie(rc, err) = run_project(
      {"--ranks", "16", "--count", "1000", "--ranks-per-host", "8", "--hierarchy", "off,auto"});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("--hierarchy: 'auto' is not one of off, host, shards"), std::string::npos) << err;
}

TEST(Project, BadArgumentsAreClearErrors) {
  auto [code, out] = run_project({"--ranks", "1", "--count", "1000"});
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("--ranks: 1 is out of range"), std::string::npos) << out;
  std::tie(code, out) = run_project({"--link", "1g", "--count", "1000"});
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("invalid --link rate '1g'"), std::string::npos) << out;
  std::tie(code, out) = run_project({"--algo", "dgc,nope", "--count", "1000"});
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("nope"), std::string::npos) << out;
  std::tie(code, out) = run_project({"--goodput", "1.5", "--count", "1000"});
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("--goodput must be in (0, 1]"), std::string::npos) << out;
}

TEST(Project, PlotWritesAPng) {
  if (std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 with matplotlib is not installed";
  TempDir dir;
  const std::string png = dir.path() + "/projection.png";
  const auto [code, out] = run_project({"--ranks", "4,16", "--link", "1gbit,10gbit", "--count",
                                        "65536", "--codec-iters", "1", "--plot", png});
  ASSERT_EQ(code, 0) << out;
  const std::string bytes = read_file(png);
  ASSERT_GT(bytes.size(), 1000u) << out;
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
}

// Processes whose command line holds `marker` (the test's own odd --count).
std::vector<pid_t> processes_with(const std::string& marker) {
  std::vector<pid_t> found;
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
      if (pid <= 0) continue;
      std::string cmd = read_file("/proc/" + std::string(e->d_name) + "/cmdline");
      std::replace(cmd.begin(), cmd.end(), '\0', ' ');
      if (cmd.find(kBench) != std::string::npos && cmd.find(marker) != std::string::npos)
        found.push_back(pid);
    }
    closedir(d);
  }
  return found;
}

// Ctrl-C while the calls are being timed on forked workers: the workers die
// with the parent (kill_children_on_signals), nothing keeps running.
TEST(Project, InterruptWhileTimingLeavesNoWorker) {
  TempDir dir;
  const std::string marker = "3999971";  // --count: no other run uses it
  ChildSet children;
  const pid_t pid = children.add(spawn({kBench, "project", "--ranks", "4", "--count", marker,
                                        "--algo", "csc", "--cores", "2", "--codec-iters", "1500"},
                                       dir.path() + "/out"));
  // The parent and two timing workers (W = 2) at once. They fork after the
  // codecs are timed, which takes 90-100 s under ASan on 2 cores: the
  // deadline leaves room for a loaded machine within ctest's 300 s.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (processes_with(marker).size() < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(processes_with(marker).size(), 3u) << read_file(dir.path() + "/out");
  kill(pid, SIGINT);
  const auto status = children.wait(pid, std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(exit_code(*status), -SIGINT);
  // Killed by the handler before the parent died. A killed worker may take a
  // moment to vanish on a loaded machine; a leaked one runs for many seconds
  // (1500 calls, several seconds).
  std::vector<pid_t> left = processes_with(marker);
  for (int i = 0; i < 150 && !left.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    left = processes_with(marker);
  }
  EXPECT_TRUE(left.empty()) << left.size() << " worker(s) outlived the parent";
  for (pid_t p : left) kill(p, SIGKILL);  // a failed run leaves no CPU hog behind
}

// A real run at 2 ranks on a 1gbit link: dense is link-bound, so the
// projection must land near it (the issue's ±30 % target; ±50 % here so a
// loaded machine does not make the test flaky), and the measured and
// projected wire bytes agree exactly for dense.
// Rank 0 of a world of `size` that records the allreduces it is asked for;
// nothing crosses a wire (every rank's contribution is this one's).
class RecordingComm final : public Comm {
 public:
  explicit RecordingComm(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(10); }
  Gathered allgatherv(std::span<const uint8_t> send, size_t) override {
    Gathered g;
    g.offsets.push_back(0);
    for (int r = 0; r < size_; ++r) {
      g.data.insert(g.data.end(), send.begin(), send.end());
      g.offsets.push_back(g.data.size());
    }
    return g;
  }
  std::vector<Bytes> alltoallv(const std::vector<Bytes>& send, size_t) override { return send; }
  void allreduce(void*, size_t count, DType dtype, ReduceOp) override {
    if (dtype == DType::kFloat32) float_counts.push_back(count);
  }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  std::vector<size_t> float_counts;

 private:
  int size_;
};

// alpha_ring, which the projection charges per ring allreduce (csc makes
// two), is probed with a ring that has data in every segment: Gloo cuts the
// buffer into at least 2P segments and skips the empty ones, so a one-float
// probe moved one segment along the ring with one message in flight and
// measured 0.3-0.4 ms at 4 ranks where a ring with data took 4.5 ms
// (docs/scaling.md). measure_link() times that probe first, then a 4 MiB
// allreduce for beta.
TEST(Project, AlphaRingProbeGivesEverySegmentOfTheRingData) {
  for (int p : {2, 4, 16, 64}) {
    RecordingComm comm(p);
    measure_link(comm);
    const auto& c = comm.float_counts;
    ASSERT_FALSE(c.empty()) << p << " ranks";
    const auto beta_probe = std::find(c.begin(), c.end(), c.back());  // the last call is beta's
    ASSERT_NE(beta_probe, c.begin()) << p << " ranks: no alpha_ring probe before beta's";
    for (auto it = c.begin(); it != beta_probe; ++it) {
      EXPECT_GE(*it, size_t(2 * p)) << p << " ranks: a ring segment without data";
      EXPECT_LE(*it, size_t(64) * size_t(p)) << p << " ranks: the probe must stay latency-bound";
    }
  }
}

TEST(Project, ValidateComparesWithARealRun) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for network namespaces (--link)";
  const auto [code, out] =
      run_project({"--validate", "--validate-ranks", "2", "--link", "1gbit", "--count", "1048576",
                   "--algo", "dense", "--iters", "3", "--json"});
  ASSERT_EQ(code, 0) << out;
  const auto rows = rows_of(out);
  ASSERT_EQ(rows.size(), 1u) << out;
  EXPECT_EQ(rows[0].at("algo"), "dense");
  EXPECT_LT(std::fabs(num(rows[0], "error")), 0.5) << out;
  EXPECT_NEAR(num(rows[0], "measured_wire_bytes"), num(rows[0], "projected_wire_bytes"), 1.0) << out;
  EXPECT_GT(num(rows[0], "measured_cpu_ms"), 0.0) << out;  // the run's CPU, for the cpu / cores floor
}

}  // namespace
}  // namespace compcoll::bench
