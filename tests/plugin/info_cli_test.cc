// compcoll-info as a user runs it (the real binary, a real environment):
// --help, a bad value printed alone and once, unknown COMPCOLL_* names with
// the nearest known one, ibverbs refused, names instead of numbers in the
// summary, and a table whose columns stay aligned. Also the communicator's
// creation-time WARN about unknown names, through a C program on the public
// API: once per process, however many communicators it creates.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "plugin/config.h"
#include "tests/support/process_util.h"

extern char** environ;

namespace compcoll::testing {
namespace {

const std::string kInfo = COMPCOLL_INFO;
const std::string kTwoComms = COMPCOLL_TWO_COMMS_APP;

struct Output {
  int code = -1000;  // exit code, -signal, or -1000 when it did not finish
  std::string out, err;
};

// Runs argv with the process environment minus every COMPCOLL_* variable (a
// developer's settings must not change what is tested), plus `env`.
Output run(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  TempDir dir;
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string(*e).rfind("COMPCOLL_", 0) != 0) envs.emplace_back(*e);
  }
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<std::string> args = argv;
  std::vector<char*> a, e;
  for (auto& s : args) a.push_back(s.data());
  a.push_back(nullptr);
  for (auto& s : envs) e.push_back(s.data());
  e.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, (dir.path() + "/out").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, (dir.path() + "/err").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  Output o;
  const int rc = posix_spawn(&pid, args[0].c_str(), &fa, nullptr, a.data(), e.data());
  posix_spawn_file_actions_destroy(&fa);
  EXPECT_EQ(rc, 0) << args[0];
  if (rc != 0) return o;
  ChildSet children;
  children.add(pid);
  const auto status = children.wait(pid, std::chrono::milliseconds(60000));
  if (status) o.code = exit_code(*status);
  o.out = read_file(dir.path() + "/out");
  o.err = read_file(dir.path() + "/err");
  return o;
}

Output info(const std::vector<std::string>& env, const std::vector<std::string>& args = {}) {
  std::vector<std::string> argv{kInfo};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, env);
}

size_t occurrences(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(InfoCli, HelpDescribesTheToolAndExitsZero) {
  for (const char* flag : {"--help", "-h"}) {
    const Output o = info({}, {flag});
    EXPECT_EQ(o.code, 0) << o.err;
    EXPECT_EQ(o.out.rfind("usage: compcoll-info", 0), 0u) << o.out;
    EXPECT_NE(o.out.find("--markdown"), std::string::npos) << o.out;
    EXPECT_EQ(o.out.find("COMPCOLL_DENSITY"), std::string::npos) << "printed the table: " << o.out;
    EXPECT_EQ(o.err, "");
  }
  const Output bad = info({}, {"--verbose"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("unknown argument '--verbose'"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.out, "");
}

TEST(InfoCli, ABadValueIsPrintedAloneOnceWithOnePrefix) {
  struct Case {
    std::string env, allowed;
  };
  for (const Case& c : {Case{"COMPCOLL_DENSITY=2", "(0, 1]"}, Case{"COMPCOLL_MOMENTUM=1", "[0, 1)"},
                        Case{"COMPCOLL_MOMENTUM=0.99999999999", "[0, 1)"},
                        Case{"COMPCOLL_TIMEOUT_MS=0", ">= 1"},
                        Case{"COMPCOLL_DEBUG=LOUD", "WARN|INFO|TRACE"}}) {
    const Output o = info({c.env});
    EXPECT_EQ(o.code, 1) << c.env;
    EXPECT_EQ(o.out, "") << c.env << ": the table was printed";
    EXPECT_EQ(lines_of(o.err).size(), 1u) << o.err;
    EXPECT_EQ(o.err.rfind("compcoll-info: " + c.env + ": ", 0), 0u) << o.err;
    EXPECT_EQ(occurrences(o.err, "compcoll"), 1u) << "prefix doubled: " << o.err;
    EXPECT_EQ(occurrences(o.err, c.allowed), 1u) << "allowed values not given exactly once: " << o.err;
  }
}

// Settings each valid alone that a communicator's creation refuses
// together are not "valid": the same error, alone, exit 1.
TEST(InfoCli, SettingsCreationRefusesTogetherMakeTheEnvironmentInvalid) {
  for (const auto& [env, said] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"COMPCOLL_ALGO=auto", "COMPCOLL_MOMENTUM=0.9"},
            "auto does not support momentum correction"},
           {{"COMPCOLL_ALGO=dgc", "COMPCOLL_MOMENTUM_HANDOVER=1"},
            "COMPCOLL_MOMENTUM_HANDOVER=1 needs COMPCOLL_MOMENTUM in (0, 1)"},
           {{"COMPCOLL_ALGO=onebit", "COMPCOLL_MOMENTUM_HANDOVER=1", "COMPCOLL_MOMENTUM=0.9"},
            "COMPCOLL_MOMENTUM_HANDOVER=1 with COMPCOLL_ALGO=onebit"}}) {
    const Output o = info(env);
    EXPECT_EQ(o.code, 1) << said << ": " << o.err;
    EXPECT_EQ(o.out, "") << said;
    EXPECT_NE(o.err.find(said), std::string::npos) << o.err;
  }
}

// An output path no rank can write fails every communicator's creation, so
// the environment is not valid: said alone, exit 1 (it said "valid").
TEST(InfoCli, AnUnwritableOutputPathMakesTheEnvironmentInvalid) {
  for (const auto& [env, said] : std::vector<std::pair<std::string, std::string>>{
           {"COMPCOLL_STATS_FILE=/proc/compcoll-none/{rank}.json",
            "compcoll-info: COMPCOLL_STATS_FILE cannot be written: /proc/compcoll-none/0.json: "},
           {"COMPCOLL_STATE_DIR=/proc/compcoll-none",
            "compcoll-info: COMPCOLL_STATE_DIR /proc/compcoll-none: "}}) {
    const Output o = info({"COMPCOLL_ALGO=dgc", env});
    EXPECT_EQ(o.code, 1) << env << ": " << o.err;
    EXPECT_EQ(o.out, "") << env;
    EXPECT_EQ(o.err.rfind(said, 0), 0u) << o.err;
  }
}

TEST(InfoCli, IbverbsIsReportedAsUnavailable) {
  const Output o = info({"COMPCOLL_TRANSPORT=ibverbs"});
  EXPECT_EQ(o.code, 1);
  EXPECT_EQ(o.out, "");
  EXPECT_NE(o.err.find("COMPCOLL_TRANSPORT=ibverbs: not available in this build"), std::string::npos)
      << o.err;
  EXPECT_EQ(o.err.find("valid"), std::string::npos) << o.err;
}

TEST(InfoCli, UnknownNamesAreWarnedWithTheNearestKnownName) {
  const Output o = info({"COMPCOLL_ALGOO=dgc", "COMPCOLL_DENSTIY=0.01", "COMPCOLL_VENV=/x"});
  EXPECT_EQ(o.code, 0) << o.err;  // a warning: the environment itself is valid
  EXPECT_NE(o.err.find("compcoll-info: warning: COMPCOLL_ALGOO is not a compcoll variable and is "
                       "ignored; did you mean COMPCOLL_ALGO?\n"),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("did you mean COMPCOLL_DENSITY?"), std::string::npos) << o.err;
  EXPECT_EQ(o.err.find("COMPCOLL_VENV"), std::string::npos) << "a script's variable: " << o.err;
  EXPECT_EQ(lines_of(o.err).size(), 2u) << o.err;
  // The misspelt algorithm really was ignored.
  EXPECT_NE(o.out.find("the current environment is valid: algo dense; set here: "),
            std::string::npos)
      << o.out;

  const Output clean = info({"COMPCOLL_ALGO=dgc"});
  EXPECT_EQ(clean.code, 0);
  EXPECT_EQ(clean.err, "");
}

TEST(InfoCli, SummaryNamesTheOnebitScale) {
  Output o = info({});
  EXPECT_NE(o.out.find("onebit_scale=mean"), std::string::npos) << o.out;
  o = info({"COMPCOLL_ALGO=onebit", "COMPCOLL_ONEBIT_SCALE=pair"});
  EXPECT_NE(o.out.find("onebit_scale=pair"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("onebit_scale=1"), std::string::npos) << o.out;
}

// Every variable row's "allowed" text and the doc line under it start in
// the header's "allowed / meaning" column, whatever the widths of defaults
// (libnccl.so.2) and current values (a long path here).
TEST(InfoCli, ColumnsStayAlignedForEveryRow) {
  const std::string long_path = "/opt/some/rather/long/path/to/libnccl.so.2";
  const Output o = info({"COMPCOLL_NCCL_LIBRARY=" + long_path, "COMPCOLL_ALGO=dgc"});
  ASSERT_EQ(o.code, 0) << o.err;
  const std::vector<std::string> lines = lines_of(o.out);
  size_t column = std::string::npos;
  for (const auto& l : lines) {
    if (l.rfind("variable ", 0) == 0) column = l.find("allowed / meaning");
  }
  ASSERT_NE(column, std::string::npos) << o.out;
  size_t rows = 0;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    const std::string& l = lines[i];
    const ConfigVar* var = nullptr;
    for (const ConfigVar& v : config_table()) {
      if (l.rfind(std::string(v.name) + " ", 0) == 0) var = &v;
    }
    if (var == nullptr) continue;
    ++rows;
    EXPECT_EQ(l.find(var->allowed, column), column) << "row: " << l;
    EXPECT_EQ(l.substr(column - 1, 1), " ") << l;
    const std::string& doc = lines[i + 1];
    EXPECT_EQ(doc.find_first_not_of(' '), column) << "doc line: " << doc;
    EXPECT_EQ(doc.substr(column), var->doc);
  }
  EXPECT_EQ(rows, config_table().size()) << o.out;
  EXPECT_NE(o.out.find(long_path), std::string::npos);
}

// The app's world is one rank: a compressing algorithm saves nothing there,
// which every run with one says once per process, whatever its communicators.
constexpr const char* kAloneWarning =
    "world size 1: no allreduce crosses a link, so COMPCOLL_ALGO=dgc saves nothing here";

TEST(CommunicatorWarning, UnknownNamesAreWarnedOncePerProcess) {
  TempDir dir, clean_dir;  // a fresh rendezvous directory per run
  const Output o = run({kTwoComms, dir.path()}, {"COMPCOLL_ALGOO=dgc", "COMPCOLL_MIN_ELEMS=1"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, "ok\n");
  // The typo leaves the algorithm dense, so COMPCOLL_MIN_ELEMS changes
  // nothing either: each said once for the process's two communicators.
  EXPECT_EQ(occurrences(o.err, "compcoll WARN"), 2u) << o.err;
  EXPECT_EQ(occurrences(o.err, "COMPCOLL_ALGOO is not a compcoll variable and is ignored; did you "
                               "mean COMPCOLL_ALGO?"),
            1u)
      << o.err;
  EXPECT_EQ(occurrences(o.err, "COMPCOLL_MIN_ELEMS=1 changes nothing while COMPCOLL_ALGO is dense "
                               "or unset: nothing is compressed"),
            1u)
      << o.err;

  // (COMPCOLL_MIN_ELEMS=1: the app's 4 floats are compressed, so no WARN
  // that nothing was; the one WARN left is the app's world of one rank.)
  const Output clean =
      run({kTwoComms, clean_dir.path()}, {"COMPCOLL_ALGO=dgc", "COMPCOLL_MIN_ELEMS=1"});
  ASSERT_EQ(clean.code, 0) << clean.err;
  EXPECT_EQ(occurrences(clean.err, "WARN"), 1u) << clean.err;
  EXPECT_EQ(occurrences(clean.err, kAloneWarning), 1u) << clean.err;
}

// The stats contract is "at destruction or exit": a C program that returns
// from main with its communicator alive still writes COMPCOLL_STATS_FILE,
// with both calls; a child it forked writes its own communicator's, not
// its parent's.
// A destroy after compcoll's exit hook finished the communicator (a static
// object's destructor, an exit handler registered earlier) succeeds: it was
// refused as "a call running on another thread" once destroy took the call
// slot, which the hook keeps.
TEST(CommunicatorExit, ADestroyAfterTheExitHookSucceeds) {
  TempDir dir;
  const Output o = run({kTwoComms, dir.path(), "late-destroy"},
                       {"COMPCOLL_STATS_FILE=" + dir.path() + "/stats-0.json"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, "late destroy: success\n") << o.err;
  EXPECT_NE(read_file(dir.path() + "/stats-0.json").find("\"calls\": 1,"), std::string::npos);
}

TEST(CommunicatorExit, ACommunicatorAliveAtExitWritesItsStatsFileInItsOwnProcessOnly) {
  TempDir dir;
  const Output o = run({kTwoComms, dir.path(), "kept"},
                       {"COMPCOLL_STATS_FILE=" + dir.path() + "/stats-0.json"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, "child left no stats file\n") << o.err;
  const std::string json = read_file(dir.path() + "/stats-0.json");
  EXPECT_NE(json.find("\"calls\": 2,"), std::string::npos) << json;
  const std::string child = read_file(dir.path() + "/child-stats.json");
  EXPECT_NE(child.find("\"calls\": 1,"), std::string::npos) << "the child's own: " << child;
}

// A misspelt name is said before the rendezvous, not after it: a misspelt
// timeout matters most when the rendezvous is what never finishes.
TEST(CommunicatorWarning, UnknownNamesAreWarnedEvenWhenTheRendezvousTimesOut) {
  TempDir dir;
  const Output o =
      run({kTwoComms, dir.path(), "alone"}, {"COMPCOLL_TIMEOUT=600", "COMPCOLL_TIMEOUT_MS=300"});
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_NE(o.err.find("compcoll WARN [rank 0] COMPCOLL_TIMEOUT is not a compcoll variable and is "
                       "ignored; did you mean COMPCOLL_TIMEOUT_MS?"),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("rendezvous timed out after 300 ms: rank(s) 1 never joined"),
            std::string::npos)
      << o.err;
  // And the error names the variable that set the limit.
  EXPECT_NE(o.err.find("(COMPCOLL_TIMEOUT_MS=300 sets this limit; raise it for ranks that start "
                       "slowly)"),
            std::string::npos)
      << o.err;
}

// COMPCOLL_HIERARCHY=host where every host has one rank (here: one rank in
// all) builds nothing and says so, once for the process's two communicators.
TEST(CommunicatorWarning, AHierarchyOfOneRankHostsIsWarnedOncePerProcess) {
  TempDir dir;
  const Output o = run({kTwoComms, dir.path()},
                       {"COMPCOLL_ALGO=dgc", "COMPCOLL_MIN_ELEMS=1", "COMPCOLL_HIERARCHY=host"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(occurrences(o.err, "compcoll WARN"), 2u) << o.err;
  EXPECT_EQ(occurrences(o.err, "COMPCOLL_HIERARCHY=host changes nothing: every host has one rank"),
            1u)
      << o.err;
  EXPECT_EQ(occurrences(o.err, kAloneWarning), 1u) << o.err;
}

// A variable the algorithm does not read: one WARN per process naming what
// it tunes, however many communicators the process creates; compcoll-info
// says the same on stderr.
TEST(CommunicatorWarning, SettingsTheAlgorithmDoesNotReadAreWarnedOncePerProcess) {
  TempDir dir;
  const std::vector<std::string> env = {"COMPCOLL_ALGO=onebit", "COMPCOLL_DENSITY=0.01",
                                        "COMPCOLL_CSC_CHUNK=1024", "COMPCOLL_MIN_ELEMS=1",
                                        "COMPCOLL_ONEBIT_BLOCK=64", "COMPCOLL_WARMUP_STEPS=0"};
  const Output o = run({kTwoComms, dir.path()}, env);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, "ok\n");
  EXPECT_EQ(occurrences(o.err, "compcoll WARN"), 3u) << o.err;  // and the world of one rank
  EXPECT_EQ(occurrences(o.err, "world size 1: no allreduce crosses a link, so COMPCOLL_ALGO=onebit "
                               "saves nothing here"),
            1u)
      << o.err;
  EXPECT_EQ(occurrences(o.err, "COMPCOLL_DENSITY=0.01 changes nothing for COMPCOLL_ALGO=onebit (it "
                               "tunes dgc, sbc, sdagc)"),
            1u)
      << o.err;
  EXPECT_EQ(occurrences(o.err, "COMPCOLL_CSC_CHUNK=1024 changes nothing for COMPCOLL_ALGO=onebit "
                               "(it tunes csc)"),
            1u)
      << o.err;

  const Output i = info(env);
  EXPECT_EQ(i.code, 0) << i.err;
  EXPECT_EQ(lines_of(i.err),
            (std::vector<std::string>{
                "compcoll-info: warning: COMPCOLL_DENSITY=0.01 changes nothing for "
                "COMPCOLL_ALGO=onebit (it tunes dgc, sbc, sdagc)",
                "compcoll-info: warning: COMPCOLL_CSC_CHUNK=1024 changes nothing for "
                "COMPCOLL_ALGO=onebit (it tunes csc)"}));
}

// Two communicators of one process whose calls were all too small to
// compress: one WARN for the process, naming the reason, not one each.
TEST(CommunicatorWarning, NothingCompressedIsWarnedOncePerProcess) {
  TempDir dir;
  const Output o = run({kTwoComms, dir.path()}, {"COMPCOLL_ALGO=dgc"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(occurrences(o.err, "compcoll WARN"), 2u) << o.err;
  EXPECT_EQ(occurrences(o.err, kAloneWarning), 1u) << o.err;
  EXPECT_EQ(occurrences(o.err, "COMPCOLL_ALGO=dgc compressed none of this communicator's 1 "
                               "allreduce calls: 1 took the dense route (tensor is smaller than "
                               "COMPCOLL_MIN_ELEMS=16384)"),
            1u)
      << o.err;
}

}  // namespace
}  // namespace compcoll::testing
