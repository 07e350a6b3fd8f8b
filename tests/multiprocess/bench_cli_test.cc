// compcoll-bench's command line, run as a user runs it (the real binary, a
// real environment): a flag that takes a value and is given none is an error
// naming it — for every such flag of every subcommand, read from their
// --help, so flags added later are covered too; errors leave stdout empty;
// one rank and zero elements give rows whose ratio is n/a, not 0; and the
// run's temporary directory is gone after success, failure and Ctrl-C.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/process_util.h"

extern char** environ;

namespace compcoll::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const std::string kBench = COMPCOLL_BENCH;

struct BenchRun {
  int code = -1000;  // exit code, -signal, or -1000 when it did not finish
  std::string out, err;
};

// The process environment without COMPCOLL_* (a developer's settings must
// not change what is tested), plus `extra`.
std::vector<std::string> clean_env(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string(*e).rfind("COMPCOLL_", 0) != 0 && std::string(*e).rfind("TMPDIR=", 0) != 0) {
      env.emplace_back(*e);
    }
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// Starts compcoll-bench with args; stdout and stderr go to separate files
// in dir, or stderr to stderr_fd when given (a terminal).
pid_t start(const std::vector<std::string>& args, const std::vector<std::string>& env,
            const std::string& dir, int stderr_fd = -1) {
  std::vector<std::string> argv{kBench};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> a, e;
  for (auto& s : argv) a.push_back(s.data());
  a.push_back(nullptr);
  std::vector<std::string> env_copy = env;
  for (auto& s : env_copy) e.push_back(s.data());
  e.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, (dir + "/out").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (stderr_fd >= 0) {
    posix_spawn_file_actions_adddup2(&fa, stderr_fd, STDERR_FILENO);
    if (stderr_fd != STDERR_FILENO) posix_spawn_file_actions_addclose(&fa, stderr_fd);
  } else {
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, (dir + "/err").c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, kBench.c_str(), &fa, nullptr, a.data(), e.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

BenchRun finish(ChildSet& children, pid_t pid, const std::string& dir, milliseconds limit) {
  BenchRun r;
  const auto status = children.wait(pid, limit);
  if (status) r.code = exit_code(*status);
  r.out = read_file(dir + "/out");
  r.err = read_file(dir + "/err");
  return r;
}

BenchRun bench(const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {},
          milliseconds limit = milliseconds(60000)) {
  TempDir dir;
  ChildSet children;
  const pid_t pid = children.add(start(args, clean_env(extra_env), dir.path()));
  return finish(children, pid, dir.path(), limit);
}

std::string describe(const std::vector<std::string>& args, const BenchRun& r) {
  std::string cmd = "compcoll-bench";
  for (const auto& a : args) cmd += " " + a;
  return cmd + "\n  exit " + std::to_string(r.code) + "\n  stdout: " + r.out + "\n  stderr: " + r.err;
}

// Subcommands named in the top-level usage ("  codec      [--algo ...").
std::vector<std::string> subcommands() {
  const BenchRun r = bench({"--help"});
  std::vector<std::string> subs;
  const std::regex line(R"(^  ([a-z]+) +\[?--)");
  std::istringstream in(r.out);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_search(l, m, line)) subs.push_back(m[1]);
  }
  return subs;
}

// A subcommand's flags from its --help: "  --name VALUE|N|X ..." take a
// value, "  --name" alone is a switch.
struct Flags {
  std::vector<std::string> with_value, switches;
};
Flags flags_of(const std::string& sub) {
  const BenchRun r = bench({sub, "--help"});
  EXPECT_EQ(r.code, 0) << describe({sub, "--help"}, r);
  Flags f;
  const std::regex valued(R"(^  --([a-z0-9-]+) (VALUE|N|X)\b)"), bare(R"(^  --([a-z0-9-]+)$)");
  std::istringstream in(r.out);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_search(l, m, valued)) f.with_value.push_back(m[1]);
    else if (std::regex_search(l, m, bare)) f.switches.push_back(m[1]);
  }
  return f;
}

TEST(BenchCli, EveryFlagThatTakesAValueRefusesToGoWithout) {
  const std::vector<std::string> subs = subcommands();
  ASSERT_GE(subs.size(), 2u) << "codec and allreduce at least";
  size_t checked = 0;
  for (const std::string& sub : subs) {
    const Flags f = flags_of(sub);
    EXPECT_FALSE(f.with_value.empty()) << sub;
    for (const std::string& flag : f.with_value) {
      // Last on the line, and followed by another flag: both are an error
      // naming the flag, before any work (stdout stays empty).
      for (const auto& args : {std::vector<std::string>{sub, "--" + flag},
                               std::vector<std::string>{sub, "--" + flag, "--json"},
                               std::vector<std::string>{sub, "--" + flag + "="}}) {
        const BenchRun r = bench(args, {}, milliseconds(20000));
        EXPECT_EQ(r.code, 1) << describe(args, r);
        EXPECT_NE(r.err.find("--" + flag + " "), std::string::npos) << describe(args, r);
        EXPECT_TRUE(r.err.find("needs a value") != std::string::npos ||
                    r.err.find("empty value") != std::string::npos)
            << describe(args, r);
        EXPECT_EQ(r.out, "") << describe(args, r);
        ++checked;
      }
    }
    for (const std::string& flag : f.switches) {
      const std::vector<std::string> args{sub, "--" + flag, "yes"};
      const BenchRun r = bench(args, {}, milliseconds(20000));
      EXPECT_EQ(r.code, 1) << describe(args, r);
      EXPECT_NE(r.err.find("--" + flag + " takes no value"), std::string::npos) << describe(args, r);
    }
  }
  EXPECT_GE(checked, 3u * 20);  // codec and allreduce have 25 between them today
}

TEST(BenchCli, ErrorsAreOneLineWithOnePrefixAndNothingOnStdout) {
  const std::vector<std::vector<std::string>> cases = {
      {"codec", "--algo", "xx", "--count", "1K"},
      {"codec", "--algo", "dgc", "--density", "2", "--count", "1K"},
      {"codec", "--algo", "dgc", "--density", "0", "--count", "1K"},  // not auto's marker
      {"codec", "--algo", "onebit", "--block", "3", "--count", "1K"},
      {"codec", "--scale", "median", "--count", "1K"},
      {"codec", "--count", "1K", "--iters", "0"},
      {"codec", "--count", "-3"},
      {"allreduce", "--ranks", "0"},
      {"allreduce", "--ranks", "2000"},
      {"allreduce", "--algo", "nope", "--ranks", "2", "--count", "1K"},
      {"allreduce", "--density", "2", "--ranks", "2", "--count", "1K"},  // once, not per rank
      {"allreduce", "--density", "0", "--ranks", "2", "--count", "1K"},
      {"allreduce", "--link", "fast"},
      {"allreduce", "--rnaks", "2"},
      // Sizes are bytes of float32: one that is not whole floats was cut
      // (6 bytes: 1 element; 2 bytes: none, a row of nothing).
      {"allreduce", "--ranks", "2", "--algo", "dense", "--sizes", "4K,6"},
      {"allreduce", "--ranks", "2", "--algo", "dense", "--sizes", "2"},
      // Checked before any rank starts, not in every rank's log (or, for
      // --deadline 0, as every rank killed at once as if it had hung).
      {"allreduce", "--ranks", "2", "--count", "1K", "--deadline", "0"},
      {"allreduce", "--ranks", "2", "--count", "1K", "--gradient", "foo"},
      {"allreduce", "--ranks", "2", "--count", "1K", "--rendezvous", "http://x"},
      // Counted in an int by the ranks: out of range is refused up front,
      // not a crashed rank or a run of 2^31 calls.
      {"allreduce", "--ranks", "1", "--count", "5", "--iters", "2147483648"},
      {"allreduce", "--ranks", "1", "--count", "5", "--warmup", "4294967295"},
      {"allreduce", "--ranks", "1", "--count", "5", "--warmup", "-1"},
      // One row per name: none, or one twice, is a mistake in the list.
      {"allreduce", "--algo", ",", "--ranks", "2", "--count", "5"},
      {"allreduce", "--algo", "dense,dgc,dense", "--ranks", "2", "--count", "5"},
      {"codec", "--algo", "dgc,dgc", "--count", "1K"},
      // Ranks that cannot fit in any machine's memory: refused before they
      // start (they sat silent, then the OOM killer came).
      {"allreduce", "--ranks", "4", "--count", "5G"},
      {"project", "--algo", "dgc,,dgc", "--ranks", "4", "--link", "1gbit", "--count", "1M"},
  };
  for (const auto& args : cases) {
    const BenchRun r = bench(args, {}, milliseconds(20000));
    EXPECT_EQ(r.code, 1) << describe(args, r);
    EXPECT_EQ(r.out, "") << describe(args, r);
    EXPECT_EQ(r.err.rfind("compcoll-bench " + args[0] + ": ", 0), 0u) << describe(args, r);
    EXPECT_EQ(r.err.find("compcoll: "), std::string::npos) << describe(args, r);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << describe(args, r);
  }
}

TEST(BenchCli, ZeroElementsGiveARatioOfNotApplicable) {
  const std::vector<std::string> json{"codec", "--algo", "dgc,csc,onebit", "--count", "0", "--json"};
  BenchRun r = bench(json);
  ASSERT_EQ(r.code, 0) << describe(json, r);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '{'), 3) << r.out;
  size_t nulls = 0;
  for (size_t p = r.out.find("\"ratio\": null"); p != std::string::npos;
       p = r.out.find("\"ratio\": null", p + 1)) {
    ++nulls;
  }
  EXPECT_EQ(nulls, 3u) << r.out;
  const std::vector<std::string> table{"codec", "--algo", "dgc", "--count", "0"};
  r = bench(table);
  ASSERT_EQ(r.code, 0) << describe(table, r);
  EXPECT_NE(r.out.find(" n/a\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" 0.0\n"), std::string::npos) << r.out;
}

// The dense row sends what Gloo's ring sends: its ratio is 1 at any count,
// also where a ring's share differs by rank (3 ranks, 1 and 5 elements).
TEST(BenchCli, TheDenseRowsRatioIsOneAtEveryCount) {
  for (const char* count : {"1", "5", "1000"}) {
    const std::vector<std::string> args{"allreduce", "--ranks", "3", "--algo", "dense",
                                        "--count", count, "--iters", "2", "--json"};
    const BenchRun r = bench(args);
    ASSERT_EQ(r.code, 0) << describe(args, r);
    EXPECT_NE(r.out.find("\"ratio\": 1,"), std::string::npos) << describe(args, r);
  }
}

// The codec table encodes with the library's settings for the environment
// (the configuration table's defaults, then COMPCOLL_*, then the flags), so
// it shows what an allreduce in the same environment would send.
TEST(BenchCli, CodecTableUsesTheLibrarysSettingsForTheEnvironment) {
  struct Case {
    std::vector<std::string> env, flags;
    const char *density, *values, *indices;
    int threads = 1;  // COMPCOLL_CODEC_THREADS=auto: one for host buffers
  };
  const std::vector<Case> cases{
      // COMPCOLL_DENSITY=auto: 12.75 bytes per thousand elements, 2.125 per entry.
      {{}, {}, "0.006", "fp8", "rice"},
      // The same budget at 8-byte entries: 0.0016 (1.6x DGC's 0.001).
      {{"COMPCOLL_VALUE_DTYPE=fp32", "COMPCOLL_INDEX_CODING=u32"}, {}, "0.00159", "fp32", "u32"},
      {{"COMPCOLL_DENSITY=0.01", "COMPCOLL_CODEC_THREADS=2"}, {}, "0.01", "fp8", "rice", 2},
      // A flag wins over the environment, which it replaces for this run.
      {{"COMPCOLL_DENSITY=0.01"}, {"--density", "0.004", "--values", "bf16"}, "0.004", "bf16",
       "rice"},
      // --density auto is the library's, as COMPCOLL_DENSITY=auto.
      {{}, {"--density", "auto"}, "0.006", "fp8", "rice"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args{"codec", "--algo", "dgc", "--count", "64K", "--iters", "1",
                                  "--json"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    const BenchRun r = bench(args, c.env);
    ASSERT_EQ(r.code, 0) << describe(args, r);
    EXPECT_NE(r.out.find(std::string("\"density\": ") + c.density), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::string("\"values\": \"") + c.values + "\""), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(std::string("\"indices\": \"") + c.indices + "\""), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("\"threads\": " + std::to_string(c.threads) + ","), std::string::npos)
        << r.out;
  }
  // A bad setting in the environment fails as it would in an allreduce.
  const std::vector<std::string> args{"codec", "--algo", "dgc", "--count", "1K"};
  const BenchRun r = bench(args, {"COMPCOLL_VALUE_DTYPE=fp4"});
  EXPECT_EQ(r.code, 1) << describe(args, r);
  EXPECT_NE(r.err.find("COMPCOLL_VALUE_DTYPE"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(BenchCli, OneRankAndZeroElementsRunLikeNcclTestsWithRatioNotApplicable) {
  TempDir tmp;
  for (const auto& args : {std::vector<std::string>{"allreduce", "--ranks", "1", "--algo",
                                                    "dense,dgc", "--count", "4K", "--iters", "1"},
                           std::vector<std::string>{"allreduce", "--ranks", "2", "--algo",
                                                    "dense,dgc", "--count", "0", "--iters", "1"}}) {
    std::vector<std::string> with_json = args;
    with_json.push_back("--json");
    BenchRun r = bench(with_json, {"TMPDIR=" + tmp.path()});
    ASSERT_EQ(r.code, 0) << describe(with_json, r);
    EXPECT_NE(r.out.find("\"algo\": \"dense\""), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"algo\": \"dgc\""), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("\"ratio\": 0"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"ratio\": null"), std::string::npos) << r.out;
    r = bench(args, {"TMPDIR=" + tmp.path()});
    ASSERT_EQ(r.code, 0) << describe(args, r);
    EXPECT_NE(r.out.find(" n/a "), std::string::npos) << r.out;
  }
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path())) << "a run left files in its TMPDIR";
}

// Every value of `key` in the JSON text, in order.
std::vector<double> json_numbers(const std::string& json, const std::string& key) {
  std::vector<double> out;
  const std::string tag = "\"" + key + "\": ";
  for (size_t p = json.find(tag); p != std::string::npos; p = json.find(tag, p + 1)) {
    out.push_back(std::strtod(json.c_str() + p + tag.size(), nullptr));
  }
  return out;
}

// cpu_ms is CPU time summed over the ranks for one call: positive for real
// work, and never more than the machine's cores can give in the call's time.
TEST(BenchCli, CpuTimeIsTheRanksSumAndFitsTheMachine) {
  const std::vector<std::string> args{"allreduce", "--ranks", "2",       "--algo", "dense,dgc",
                                      "--count",   "2M",      "--iters", "3",      "--json"};
  const BenchRun r = bench(args);
  ASSERT_EQ(r.code, 0) << describe(args, r);
  const auto cpu = json_numbers(r.out, "cpu_ms");
  const auto dense_cpu = json_numbers(r.out, "dense_cpu_ms");
  const auto time = json_numbers(r.out, "time_ms");
  ASSERT_EQ(cpu.size(), 2u) << r.out;
  ASSERT_EQ(time.size(), 2u) << r.out;
  ASSERT_EQ(dense_cpu.size(), 2u) << r.out;
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_GT(cpu[i], 0.0) << r.out;
    EXPECT_GT(dense_cpu[i], 0.0) << r.out;
    // Medians of different calls: allow one scheduler tick of slack.
    EXPECT_LE(cpu[i], cores * time[i] + 5.0) << r.out;
  }
  const std::vector<std::string> table(args.begin(), args.end() - 1);
  const BenchRun t = bench(table);
  ASSERT_EQ(t.code, 0) << describe(table, t);
  EXPECT_NE(t.out.find("cpu(ms)"), std::string::npos) << t.out;
}

// The ranks do not create communicators (they run the algorithms directly),
// so the parent reports misspelt names itself; the run goes on.
TEST(BenchCli, MisspeltVariablesAreReportedWithTheNearestName) {
  const std::vector<std::string> args{"allreduce", "--ranks", "1", "--algo", "dense",
                                      "--count",   "1K",      "--iters", "1", "--json"};
  const BenchRun r = bench(args, {"COMPCOLL_DENSTIY=0.1"});
  EXPECT_EQ(r.code, 0) << describe(args, r);
  EXPECT_NE(r.err.find("compcoll-bench allreduce: warning: COMPCOLL_DENSTIY is not a compcoll "
                       "variable and is ignored; did you mean COMPCOLL_DENSITY?"),
            std::string::npos)
      << describe(args, r);
}

// Flags that change nothing, or less than they seem, are said before the
// run (the ranks' own lines are passed on after it); the run
// goes on. Each was silent: --density with csc, --count beside --sizes, a
// count below COMPCOLL_MIN_ELEMS, --hierarchy with every rank on one host.
TEST(BenchCli, FlagsThatChangeNothingAreSaidAndTheRunGoesOn) {
  struct Case {
    std::vector<std::string> args;
    std::string said;
  };
  const std::vector<std::string> base{"allreduce", "--ranks", "2", "--iters", "1", "--json"};
  const std::vector<Case> cases = {
      {{"--algo", "csc", "--count", "20000", "--density", "0.5"},
       "--density sets COMPCOLL_DENSITY (dgc, sdagc, sbc) and changes nothing for csc, so "
       "nothing in this run"},
      {{"--algo", "dense", "--sizes", "4K", "--count", "5"},
       "--sizes is swept, so --count changes nothing"},
      {{"--algo", "dense", "--count", "4K", "--density", "0.5"},
       "--density sets COMPCOLL_DENSITY (dgc, sdagc, sbc), and no row of this run reads it"},
      {{"--algo", "dgc", "--count", "1000"},
       "1000 elements: below COMPCOLL_MIN_ELEMS=16384, so a call of that size goes exact in a "
       "user's job"},
      {{"--algo", "dgc", "--count", "20000", "--hierarchy", "off,host"},
       "--hierarchy: every rank is on one host"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = base;
    args.insert(args.end(), c.args.begin(), c.args.end());
    const BenchRun r = bench(args, {});
    EXPECT_EQ(r.code, 0) << describe(args, r);
    EXPECT_NE(r.err.find("compcoll-bench allreduce: warning: " + c.said), std::string::npos)
        << describe(args, r);
  }
  // The codec table's --density (elements, or csc's chunks) and onebit.
  const std::vector<std::string> codec{"codec", "--algo", "onebit", "--count", "10000",
                                       "--density", "0.01", "--json"};
  const BenchRun c = bench(codec, {});
  EXPECT_EQ(c.code, 0) << describe(codec, c);
  EXPECT_NE(c.err.find("compcoll-bench codec: warning: --density changes nothing for onebit (it "
                       "sends every sign), so nothing in this run"),
            std::string::npos)
      << describe(codec, c);
  // A codec flag no codec of the run reads; the header claims no momentum
  // correction for onebit.
  const std::vector<std::string> onebit{"codec", "--algo", "onebit", "--count", "10000",
                                        "--momentum", "0.9", "--values", "fp16"};
  const BenchRun o = bench(onebit, {});
  EXPECT_EQ(o.code, 0) << describe(onebit, o);
  EXPECT_NE(o.err.find("compcoll-bench codec: warning: --momentum changes nothing for onebit (it "
                       "is read by dgc, sdagc, sbc, csc)"), std::string::npos) << describe(onebit, o);
  EXPECT_NE(o.err.find("--values changes nothing for onebit"), std::string::npos) << o.err;
  EXPECT_EQ(o.out.find("momentum correction"), std::string::npos) << o.out;
  // Nothing to say: a compressible count without those flags.
  const std::vector<std::string> quiet{"allreduce", "--ranks", "2", "--iters", "1", "--json",
                                       "--algo", "dgc", "--count", "20000"};
  const BenchRun r = bench(quiet, {});
  EXPECT_EQ(r.code, 0) << describe(quiet, r);
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << describe(quiet, r);
  // Nor a progress line: stderr is not a terminal here.
  EXPECT_EQ(r.err.find("round"), std::string::npos) << describe(quiet, r);
}

// What the benchmark does not read is said, not silently ignored, and what
// its ranks say reaches the user though the run succeeds (their logs are
// removed with the run's directory). Each was silent: COMPCOLL_ALGO (the
// rows are --algo's), a variable of no row's algorithm, the hierarchy's
// note on one host. An empty COMPCOLL_WARMUP_STEPS counts as unset (the
// steady state), and auto's row is timed after its trials by default.
TEST(BenchCli, WhatTheRunDoesNotReadIsSaidAndTheRanksNotesReachTheUser) {
  const std::vector<std::string> args{"allreduce", "--ranks", "2", "--algo", "dgc,auto",
                                      "--count", "1M", "--iters", "1", "--json"};
  const BenchRun r = bench(args, {"COMPCOLL_ALGO=sbc", "COMPCOLL_CSC_FRACTION=0.1",
                                  "COMPCOLL_WARMUP_STEPS="});
  ASSERT_EQ(r.code, 0) << describe(args, r);
  const auto once = [&](const std::string& text) {
    const size_t at = r.err.find(text);
    EXPECT_NE(at, std::string::npos) << text << "\n" << describe(args, r);
    if (at != std::string::npos) EXPECT_EQ(r.err.find(text, at + 1), std::string::npos) << text;
  };
  once("warning: COMPCOLL_ALGO=sbc changes nothing for compcoll-bench: its rows are the "
       "algorithms of its --algo flag");
  once("warning: COMPCOLL_CSC_FRACTION=0.1 changes nothing for this run's algorithms (dgc, "
       "auto): it tunes csc");
  EXPECT_EQ(r.err.find("auto settles its choice"), std::string::npos) << describe(args, r);
  // Steady-state ratios: dgc past its warm-up, auto past its trials (at 1M
  // floats on loopback it compresses; during its trials every other call
  // was dense, a ratio near 2).
  const std::vector<double> ratio = json_numbers(r.out, "ratio");
  ASSERT_EQ(ratio.size(), 2u) << r.out;
  EXPECT_GT(ratio[0], 100.0) << r.out;
  EXPECT_GT(ratio[1], 100.0) << r.out;
  // A rank's own warning: the hierarchy forced on one host (said by rank 0).
  const BenchRun h = bench({"allreduce", "--ranks", "2", "--algo", "dgc", "--count", "20000",
                            "--iters", "1", "--json"},
                           {"COMPCOLL_HIERARCHY=host"});
  ASSERT_EQ(h.code, 0) << h.err;
  EXPECT_NE(h.err.find("compcoll-bench: warning: host hierarchy on (COMPCOLL_HIERARCHY=host)"),
            std::string::npos) << h.err;
  // A --warmup too short for auto's trials is said.
  std::vector<std::string> short_warmup = args;
  short_warmup.insert(short_warmup.end(), {"--warmup", "2"});
  const BenchRun w = bench(short_warmup, {});
  ASSERT_EQ(w.code, 0) << describe(short_warmup, w);
  EXPECT_NE(w.err.find("warning: --warmup 2: auto settles its choice after 7 calls"),
            std::string::npos) << describe(short_warmup, w);
}

// Ranks of one run started with different flags (two benchmarks sharing a
// rendezvous, a hand-started rank) would make different calls, which Gloo
// answers with an abort or its timeout: they are compared first, and every
// rank names the difference.
TEST(BenchCli, WorkersStartedWithDifferentFlagsNameTheDifference) {
  TempDir store, d0, d1;
  ChildSet children;
  const auto worker = [&](int rank, const std::string& count, const std::string& dir) {
    return children.add(start({"worker", "--rank", std::to_string(rank), "--ranks", "2",
                               "--rendezvous", "file://" + store.path(), "--algo", "dense",
                               "--count", count},
                              clean_env({}), dir));
  };
  const pid_t p0 = worker(0, "1000", d0.path());
  const pid_t p1 = worker(1, "2000", d1.path());
  for (const auto& [pid, dir] : {std::pair{p0, d0.path()}, std::pair{p1, d1.path()}}) {
    const BenchRun r = finish(children, pid, dir, milliseconds(30000));
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("ranks disagree on the benchmark's run"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("start every rank with the same flags:\n  count: rank 0 has 1000, rank 1 "
                         "has 2000"),
              std::string::npos)
        << r.err;
  }
}

// A rank that stops answering mid-run (SIGSTOP): the other's error names
// itself, and the setting behind the limit, whichever call was waiting
// (Gloo's own baseline allreduce, a fence, the exact sum, an algorithm on
// the bare communicator): Gloo's baseline said only "Timed out waiting".
TEST(BenchCli, AStuckRankFailsTheOtherNamingTheTimeoutSetting) {
  TempDir store, d0, d1;
  ChildSet children;
  const auto worker = [&](int rank, const std::string& dir) {
    return children.add(start({"worker", "--rank", std::to_string(rank), "--ranks", "2",
                               "--rendezvous", "file://" + store.path(), "--algo", "dense,dgc",
                               "--count", "200000", "--iters", "1000000", "--warmup", "0"},
                              clean_env({"COMPCOLL_TIMEOUT_MS=2000"}), dir));
  };
  const pid_t p0 = worker(0, d0.path());
  const pid_t p1 = worker(1, d1.path());
  // Stopped once it is measuring (its "running" line), bounded.
  const auto until = Clock::now() + milliseconds(30000);
  while (read_file(d1.path() + "/err").find("running") == std::string::npos &&
         Clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  std::this_thread::sleep_for(milliseconds(300));  // well into the calls
  ASSERT_EQ(kill(p1, SIGSTOP), 0);
  const BenchRun r = finish(children, p0, d0.path(), milliseconds(30000));
  kill(p1, SIGKILL);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("rank 0/2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("COMPCOLL_TIMEOUT_MS=2000 sets this limit"), std::string::npos) << r.err;
}

// On a terminal the run is not a minute of silence: stderr shows the ranks'
// progress on one line, replaced as it goes and erased before the table.
TEST(BenchCli, ATerminalSeesTheRunsProgressAndThenOnlyTheTable) {
  int master = -1, slave = -1;
  ASSERT_EQ(openpty(&master, &slave, nullptr, nullptr, nullptr), 0) << std::strerror(errno);
  fcntl(master, F_SETFD, FD_CLOEXEC);  // the bench holds only the terminal's other end
  TempDir dir;
  const std::vector<std::string> args{"allreduce", "--ranks", "2", "--algo", "dense,dgc",
                                      "--count", "4M", "--iters", "5", "--warmup", "1"};
  ChildSet children;
  const pid_t pid = children.add(start(args, clean_env({}), dir.path(), slave));
  ASSERT_GT(pid, 0);
  close(slave);
  // Read the terminal until the bench closes it (exits), bounded.
  std::string term;
  const auto deadline = Clock::now() + milliseconds(60000);
  while (Clock::now() < deadline) {
    pollfd p{master, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(master, buf, sizeof buf);
    if (n <= 0) break;  // EIO once the last writer is gone
    term.append(buf, static_cast<size_t>(n));
  }
  close(master);
  const auto status = children.wait(pid, milliseconds(10000));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(exit_code(*status), 0) << term;
  EXPECT_NE(term.find("compcoll-bench allreduce: starting the ranks"), std::string::npos) << term;
  // Polled every 20 ms, so not every round need be seen: a round of 4M
  // elements takes longer than that here.
  EXPECT_TRUE(std::regex_search(term, std::regex("compcoll-bench allreduce: 4194304 elements: "
                                                 "round [1-6] of 6 \\(one call of every row and "
                                                 "of Gloo's; the first 1 untimed\\)")))
      << term;
  // Erased at the end: the table starts on a clean line.
  EXPECT_GE(term.size(), 4u);
  EXPECT_EQ(term.substr(term.size() - 4), "\r\033[K") << term;
  const std::string out = read_file(dir.path() + "/out");
  EXPECT_NE(out.find("dgc"), std::string::npos) << out;
  EXPECT_EQ(out.find("round"), std::string::npos) << out;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) out.push_back(e.path());
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

TEST(BenchLeftovers, AFailedRunRemovesItsTemporaryDirectory) {
  // --deadline 1 kills ranks that need far longer: the failure path.
  TempDir tmp;
  const std::vector<std::string> args{"allreduce", "--ranks", "2",        "--algo",
                                      "dense",     "--count", "8M",         "--iters",
                                      "1000",      "--deadline", "1"};
  const BenchRun r = bench(args, {"TMPDIR=" + tmp.path()});
  EXPECT_EQ(r.code, 1) << describe(args, r);
  EXPECT_NE(r.err.find("failed"), std::string::npos) << describe(args, r);
  // The ranks the bench killed are said to be, not "killed by signal 9"
  // as if they had crashed.
  EXPECT_NE(r.err.find("rank 0: killed by compcoll-bench: the run's deadline passed"),
            std::string::npos)
      << describe(args, r);
  EXPECT_EQ(r.err.find("killed by signal"), std::string::npos) << describe(args, r);
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path())) << join(entries(tmp.path()));
}

// Ctrl-C (and SIGTERM, SIGHUP) while the ranks run: the benchmark dies of the
// signal, its ranks with it, and its directory under TMPDIR is gone.
TEST(BenchLeftovers, SignalsWhileRanksRunLeaveNothingBehind) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    TempDir tmp, io;
    ChildSet children;
    // Minutes of work: still running when signalled.
    const std::vector<std::string> args{"allreduce", "--ranks", "2",       "--algo", "dense",
                                        "--count",   "8M",     "--iters", "1000"};
    const pid_t pid = children.add(start(args, clean_env({"TMPDIR=" + tmp.path()}), io.path()));
    ASSERT_GT(pid, 0);
    // Wait until both ranks are started (their logs exist) and have had a
    // moment to write to the rendezvous store: the directory then holds
    // logs and store files, which is what must go. When exactly the signal
    // lands (rendezvous, baseline, timed calls) must not matter.
    bool running = false;
    const auto until = Clock::now() + milliseconds(30000);
    while (!running && Clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(50));
      size_t logs = 0;
      for (const auto& e : entries(tmp.path())) logs += e.find("/rank") != std::string::npos;
      running = logs == 2;
    }
    std::this_thread::sleep_for(milliseconds(500));
    ASSERT_TRUE(running) << "ranks did not start: " << read_file(io.path() + "/err");
    ASSERT_EQ(kill(pid, sig), 0);
    const BenchRun r = finish(children, pid, io.path(), milliseconds(20000));
    EXPECT_EQ(r.code, -sig) << "signal " << sig << ": " << describe(args, r);
    EXPECT_TRUE(std::filesystem::is_empty(tmp.path()))
        << "signal " << sig << " left:\n" << join(entries(tmp.path()));
  }
}

}  // namespace
}  // namespace compcoll::testing
