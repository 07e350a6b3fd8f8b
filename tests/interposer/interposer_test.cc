// The interposer end to end, without a GPU: an unmodified NCCL program
// (nccl_allreduce_app.cc, linked against the stand-in libnccl.so.2 and
// libcuda.so.1) runs with LD_PRELOAD=libcompcoll_nccl.so and
// COMPCOLL_NCCL_LIBRARY pointing at the stand-in. The stand-in logs every
// call it receives, with its arguments, so a test can tell forwarded calls
// (present, pointers and all) from compressed ones (absent: their payloads
// travel as the interposer's own allgathers over staging buffers).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <regex>

#include "tests/interposer/standin.h"

namespace compcoll {
namespace {

using testing::AppRun;
using testing::json_int;
using testing::lines_after;
using testing::read_text;

class Interposer : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/compcoll-interposer-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::system(("rm -rf '" + dir_ + "'").c_str());
  }

  std::map<std::string, std::string> env(bool preload = true) const {
    std::map<std::string, std::string> e{{"PATH", "/usr/bin:/bin"},
                                         {"FAKE_NCCL_LOG", log_path()},
                                         {"COMPCOLL_NCCL_LIBRARY", testing::standin_nccl_path()},
                                         {"COMPCOLL_CUDA_LIBRARY", testing::standin_cuda_path()},
                                         // steady state in a few steps (the default warm-up
                                         // runs onebit dense: no compressed calls to count)
                                         {"COMPCOLL_WARMUP_STEPS", "0"}};
    if (preload) e["LD_PRELOAD"] = asan_runtime() + testing::interposer_path();
    return e;
  }
  // Under AddressSanitizer (scripts/run-sanitizers.sh) the ASan runtime must
  // be the first library of the process; the app links it, but preloaded
  // libraries load before the app's own dependencies, so the runtime this
  // test process uses is preloaded ahead of the interposer. Empty otherwise.
  static std::string asan_runtime() {
#if defined(__SANITIZE_ADDRESS__)
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
      const size_t at = line.find('/');
      if (at != std::string::npos && line.find("/libasan.so", at) != std::string::npos) {
        return line.substr(at) + ":";
      }
    }
#endif
    return "";
  }
  AppRun run(const std::vector<std::string>& args, const std::map<std::string, std::string>& e) {
    std::vector<std::string> argv{testing::app_path()};
    argv.insert(argv.end(), args.begin(), args.end());
    AppRun r = testing::run_program(argv, e, std::chrono::seconds(120));
    last_output_ = r.output;
    return r;
  }
  std::string log_path() const { return dir_ + "/nccl.log"; }
  // Arguments of every ncclAllReduce the stand-in received ("count=... stream=...").
  std::vector<std::string> received_allreduces() const {
    std::vector<std::string> out;
    static const std::regex re("^ncclAllReduce comm=[0-9]+:[0-9]+ (.*)$");
    for (const auto& line : lines_after(read_text(log_path()), "")) {
      std::smatch m;
      if (std::regex_match(line, m, re)) out.push_back(m[1]);
    }
    return out;
  }
  static bool contains(const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  }

  // TheStateFollowsALossScaleAndAnOverflowedStepLeavesItAlone, for one algorithm.
  void expect_loss_scale_followed(const std::string& algo);

  std::string dir_;
  std::string last_output_;
};

#define EXPECT_RAN_OK(r) \
  EXPECT_EQ((r).exit_code, 0) << (r).output; \
  EXPECT_NE((r).output.find("result ok"), std::string::npos) << (r).output

TEST_F(Interposer, TheProgramRunsOnTheStandInWithoutPreload) {
  const AppRun r = run({"--ranks", "2", "--exact"}, env(/*preload=*/false));
  EXPECT_RAN_OK(r);
}

TEST_F(Interposer, WithoutCompcollAlgoEveryCallIsForwardedUnchanged) {
  auto e = env();
  e["COMPCOLL_STATS_FILE"] = dir_ + "/stats-{rank}.json";
  const AppRun r = run({"--ranks", "2", "--exact"}, e);
  EXPECT_RAN_OK(r);
  const auto received = received_allreduces();
  auto issued = lines_after(r.output, "compressible ");
  for (const auto& f : lines_after(r.output, "forwarded ")) issued.push_back(f);
  EXPECT_EQ(issued.size(), 2u * 11u);  // 11 allreduces per rank
  EXPECT_EQ(received.size(), issued.size()) << "the interposer added or dropped calls";
  for (const auto& call : issued) EXPECT_TRUE(contains(received, call)) << "not forwarded: " << call;
  EXPECT_EQ(access((dir_ + "/stats-0.json").c_str(), F_OK), -1) << "a pass-through wrote stats";
  // Not a silent no-op: the settings given without COMPCOLL_ALGO are named,
  // once for the process (its ranks are threads), the one it reads is not.
  const auto said = lines_after(r.output, "compcoll WARN");
  ASSERT_EQ(said.size(), 1u) << r.output;
  for (const char* name : {"COMPCOLL_ALGO is unset", "COMPCOLL_STATS_FILE=", "COMPCOLL_WARMUP_STEPS=0",
                           "change nothing", "set COMPCOLL_ALGO to one of dgc"}) {
    EXPECT_NE(said[0].find(name), std::string::npos) << name << "\n" << r.output;
  }
  EXPECT_EQ(said[0].find("COMPCOLL_NCCL_LIBRARY"), std::string::npos) << r.output;
}

// Off means off: a bad value of a setting that would change nothing is
// named with the others that change nothing, and never fails the program's
// NCCL (the library paths, which the pass-through reads, still count).
TEST_F(Interposer, WithoutCompcollAlgoABadValueOfAnotherSettingPassesThrough) {
  for (const char* algo : {"", "dense"}) {
    auto e = env();
    if (*algo) e["COMPCOLL_ALGO"] = algo;
    e["COMPCOLL_DENSITY"] = "bogus";
    const AppRun r = run({"--ranks", "2", "--exact"}, e);
    EXPECT_RAN_OK(r);
    EXPECT_EQ(received_allreduces().size(), 2u * 11u) << r.output;
    const auto said = lines_after(r.output, "compcoll WARN");
    ASSERT_EQ(said.size(), 1u) << r.output;
    EXPECT_NE(said[0].find("COMPCOLL_DENSITY=bogus"), std::string::npos) << r.output;
    EXPECT_NE(said[0].find("change nothing"), std::string::npos) << r.output;
    std::filesystem::remove(log_path());
  }
}

// Sharded training sums its gradients with reduce-scatters, which compcoll
// does not compress: said once at WARN, not a silent no-op; the calls reach
// NCCL untouched and exact.
TEST_F(Interposer, AReduceScatterOfGradientsIsSaidToGoUncompressedOnce) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  const AppRun r = run({"--ranks", "2", "--reduce-scatter"}, e);
  EXPECT_RAN_OK(r);
  EXPECT_EQ(lines_after(read_text(log_path()), "ncclReduceScatter ").size(), 2u)
      << "one reduce-scatter per rank reaches NCCL";
  // (The app's forwarded allreduces are said too, each for its own reason.)
  size_t said = 0;
  for (const auto& line : lines_after(r.output, "compcoll WARN")) {
    if (line.find("ncclReduceScatter") == std::string::npos) continue;
    ++said;
    EXPECT_NE(line.find("ncclReduceScatter of 10000 x float sum per rank goes to NCCL uncompressed"),
              std::string::npos) << line;
  }
  EXPECT_EQ(said, 1u) << r.output;
  // Without COMPCOLL_ALGO: nothing to say.
  std::filesystem::remove(log_path());
  const AppRun off = run({"--ranks", "2", "--reduce-scatter"}, env());
  EXPECT_RAN_OK(off);
  EXPECT_EQ(off.output.find("ncclReduceScatter"), std::string::npos) << off.output;
}

TEST_F(Interposer, PreloadedWithoutAnySettingSaysNothing) {
  auto e = env();
  e.erase("COMPCOLL_WARMUP_STEPS");
  e.erase("COMPCOLL_CUDA_LIBRARY");  // read only when compressing
  const AppRun r = run({"--ranks", "2", "--exact"}, e);
  EXPECT_RAN_OK(r);
  EXPECT_EQ(r.output.find("compcoll WARN"), std::string::npos) << r.output;
}

TEST_F(Interposer, CompressesEligibleCallsAndForwardsTheRestUntouched) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  e["COMPCOLL_DENSITY"] = "0.01";
  e["COMPCOLL_DEBUG"] = "INFO";
  e["COMPCOLL_STATS_FILE"] = dir_ + "/stats-{rank}.json";
  const AppRun r = run({"--ranks", "2"}, e);
  EXPECT_RAN_OK(r);
  const auto received = received_allreduces();
  const auto forwarded = lines_after(r.output, "forwarded ");
  const auto compressible = lines_after(r.output, "compressible ");
  ASSERT_EQ(forwarded.size(), 2u * 6u);     // int32, MAX, float64, small, in a group, captured
  ASSERT_EQ(compressible.size(), 2u * 5u);  // fp32 x3, fp16 SUM, bf16 AVG
  for (const auto& call : forwarded) EXPECT_TRUE(contains(received, call)) << "not forwarded: " << call;
  for (const auto& call : compressible) EXPECT_FALSE(contains(received, call)) << "not compressed: " << call;
  // Staged tensors get the machine's spare CPUs for dgc's encode.
  EXPECT_NE(r.output.find("COMPCOLL_CODEC_THREADS=auto: "), std::string::npos) << r.output;
  for (const char* reason : {"int32 sum: dtype is not float32", "op is not SUM or AVG", "smaller than COMPCOLL_MIN_ELEMS",
                             "inside ncclGroupStart/ncclGroupEnd", "captured into a CUDA graph"}) {
    EXPECT_NE(r.output.find(reason), std::string::npos) << "no log line says: " << reason << "\n" << r.output;
  }
  // The gradient-like sums among them (float64, in a group, captured) are
  // said at WARN, once each, by rank 0; int32, MAX and the small one are not.
  const std::string said = "forwarded to NCCL uncompressed";
  std::vector<std::string> warned;
  for (const auto& line : lines_after(r.output, "")) {
    if (line.find(said) != std::string::npos) warned.push_back(line);
  }
  ASSERT_EQ(warned.size(), 3u) << r.output;
  for (const char* reason : {"x double sum forwarded", "inside ncclGroupStart/ncclGroupEnd",
                             "captured into a CUDA graph"}) {
    int n = 0;
    for (const auto& line : warned) n += line.find(reason) != std::string::npos;
    EXPECT_EQ(n, 1) << reason << "\n" << r.output;
  }
  for (const auto& line : warned) {
    EXPECT_NE(line.find("compcoll WARN [rank 0]"), std::string::npos) << line;
  }
  for (int rank : {0, 1}) {
    const std::string stats = read_text(dir_ + "/stats-" + std::to_string(rank) + ".json");
    EXPECT_EQ(json_int(stats, "compressed_calls"), 5) << stats;
    EXPECT_EQ(json_int(stats, "forwarded_calls"), 6) << stats;
    EXPECT_EQ(json_int(stats, "calls"), 11) << stats;
    EXPECT_EQ(json_int(stats, "steady_calls"), 11) << stats;  // COMPCOLL_WARMUP_STEPS=0 here
    EXPECT_EQ(json_int(stats, "warmup_dense_calls"), 0) << stats;
    EXPECT_NE(stats.find("\"algo\": \"dgc\""), std::string::npos) << stats;
    EXPECT_GT(json_int(stats, "dense_bytes"), json_int(stats, "wire_bytes")) << stats;
    // What the last compressed call sent, as in the plugin's stats file.
    EXPECT_NE(stats.find("\"last_density\": 0."), std::string::npos) << stats;
  }
}

// COMPCOLL_NCCL_COMMS=multi-host on one node (the app's ranks are threads of
// one process, so every communicator, the split child too, lies within one
// host): every call reaches NCCL as the program made it, each communicator
// says why at INFO, and the process of rank 0 warns at exit that nothing was
// compressed, not a silent no-op. (The exchange itself, on several hosts
// and with a rank outside it: host_span_test.cc.)
TEST_F(Interposer, MultiHostOnlyLeavesCommunicatorsWithinOneHostToNccl) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  e["COMPCOLL_NCCL_COMMS"] = "multi-host";
  e["COMPCOLL_DEBUG"] = "INFO";
  e["COMPCOLL_STATS_FILE"] = dir_ + "/stats-{rank}.json";
  const AppRun r = run({"--ranks", "2", "--split"}, e);
  EXPECT_RAN_OK(r);
  const auto received = received_allreduces();
  auto issued = lines_after(r.output, "compressible ");
  for (const auto& f : lines_after(r.output, "forwarded ")) issued.push_back(f);
  ASSERT_FALSE(lines_after(r.output, "compressible ").empty()) << r.output;
  for (const auto& call : issued) EXPECT_TRUE(contains(received, call)) << "not forwarded: " << call;
  const std::string why = "share one host (1 host: {0,1}): a tensor-parallel group within a node";
  int decided = 0;
  for (const auto& line : lines_after(r.output, "compcoll INFO")) {
    decided += line.find(why) != std::string::npos &&
               line.find("its allreduces go to NCCL uncompressed") != std::string::npos;
  }
  EXPECT_EQ(decided, 2 * 2) << r.output;  // the root and its child, on each rank
  const auto warned = lines_after(r.output, "compcoll WARN");
  ASSERT_EQ(warned.size(), 1u) << r.output;
  EXPECT_NE(warned[0].find("COMPCOLL_NCCL_COMMS=multi-host: no allreduce of this process was "
                           "compressed"), std::string::npos) << r.output;
  for (int rank : {0, 1}) {
    const std::string stats = read_text(dir_ + "/stats-" + std::to_string(rank) + ".json");
    EXPECT_EQ(json_int(stats, "compressed_calls"), 0) << stats;
    EXPECT_GT(json_int(stats, "forwarded_calls"), 0) << stats;
  }
  // The default compresses the same program's eligible calls.
  e.erase("COMPCOLL_NCCL_COMMS");
  const AppRun all = run({"--ranks", "2", "--split"}, e);
  EXPECT_RAN_OK(all);
  EXPECT_EQ(all.output.find("COMPCOLL_NCCL_COMMS"), std::string::npos) << all.output;
  EXPECT_GT(json_int(read_text(dir_ + "/stats-0.json"), "compressed_calls"), 0);
}

// Where the GPU codecs cannot take a call (here, with COMPCOLL_DEVICE_CODECS=on:
// no CUDA device, or the stand-in's "device" buffers are host memory, or a
// build without nvcc), the call is staged through host memory and the log
// says why, once per reason; off (the default) says so itself. The GPU run
// of tests/gpu checks the other side: the device route with the host path's
// bits.
TEST_F(Interposer, SaysWhyCompressedCallsAreStagedThroughHostMemory) {
  for (const char* setting : {"on", ""}) {
    auto e = env();
    e["COMPCOLL_ALGO"] = "dgc";
    e["COMPCOLL_DEBUG"] = "INFO";
    if (*setting) e["COMPCOLL_DEVICE_CODECS"] = setting;
    const bool off = !*setting;
    const AppRun r = run({"--ranks", "2", "--fp32-avg"}, e);
    EXPECT_RAN_OK(r);
    std::vector<std::string> per_call;
    for (const auto& line : lines_after(r.output, "")) {
      if (line.find("staged through host memory: ") == std::string::npos) continue;
      if (line.find("said once per reason") != std::string::npos) per_call.push_back(line);
      EXPECT_EQ(line.find("staged through host memory: COMPCOLL_DEVICE_CODECS=off") != std::string::npos, off)
          << line;
    }
    // Asked for, the route either exists (a GPU machine running these
    // tests: the stand-in's buffers are host memory, said per call at INFO)
    // or the setting changes nothing, which is said once per process at WARN.
    const bool route = r.output.find("on the device with the GPU codecs") != std::string::npos;
    size_t warned = 0;
    for (const auto& line : lines_after(r.output, "")) {
      warned += line.find("WARN") != std::string::npos &&
                line.find("COMPCOLL_DEVICE_CODECS=on changes nothing here: ") != std::string::npos;
    }
    EXPECT_EQ(warned, off || route ? 0u : 1u) << r.output;
    // Six compressed calls per rank, each reason said once per communicator:
    // one line per rank when the route is missing, at most one per dtype
    // when the route refuses the buffers.
    EXPECT_GE(per_call.size(), 2u) << r.output;
    EXPECT_LE(per_call.size(), 2u * 3u) << r.output;
    EXPECT_NE(r.output.find("compressing eligible allreduces with dgc"), std::string::npos) << r.output;
  }
}

TEST_F(Interposer, EveryAlgorithmRunsOnThreeRanks) {
  for (const char* algo : {"sdagc", "sbc", "csc", "onebit"}) {
    auto e = env();
    e["COMPCOLL_ALGO"] = algo;
    e["COMPCOLL_CSC_CHUNK"] = "1024";
    e["COMPCOLL_STATS_FILE"] = dir_ + "/" + algo + "-{rank}.json";
    const AppRun r = run({"--ranks", "3", "--steps", "2"}, e);
    EXPECT_RAN_OK(r) << algo;
    for (int rank : {0, 1, 2}) {
      const std::string stats = read_text(dir_ + "/" + algo + "-" + std::to_string(rank) + ".json");
      EXPECT_EQ(json_int(stats, "compressed_calls"), 4) << algo << " " << stats;
    }
  }
}

// A program that makes its communicators non-blocking and polls them until
// they are ready: the interposer registers each while it is still
// initialising and must not query it before it is (NCCL refuses and prints
// a warning for every such query; the stand-in says MISUSE).
TEST_F(Interposer, ANonBlockingCommunicatorIsNotQueriedBeforeItIsReady) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  e["COMPCOLL_STATS_FILE"] = dir_ + "/nb-{rank}.json";
  const AppRun r = run({"--ranks", "2", "--steps", "2", "--nonblocking"}, e);
  EXPECT_RAN_OK(r);
  EXPECT_EQ(r.output.find("MISUSE"), std::string::npos) << r.output;
  EXPECT_EQ(json_int(read_text(dir_ + "/nb-0.json"), "compressed_calls"), 4);
}

TEST_F(Interposer, SettingsTheNcclCommunicatorGivesAreNamedOnceAndTheRestAreRead) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  e["COMPCOLL_TIMEOUT_MS"] = "20000";   // read: the limit of compcoll's own waits
  e["COMPCOLL_WORLD_SIZE"] = "2";       // NCCL's communicator says who is who
  e["COMPCOLL_TORCH_SCOPE"] = "all";    // the PyTorch backend's alone
  const AppRun r = run({"--ranks", "2", "--steps", "2"}, e);
  EXPECT_RAN_OK(r);
  const auto said = lines_after(r.output, "compcoll WARN");
  std::string all;
  for (const auto& line : said) all += line + "\n";
  const std::string ours = " changes nothing for the NCCL interposer's communicators: ";
  for (const std::string& m :
       {"COMPCOLL_WORLD_SIZE=2" + ours + "the NCCL communicator gives the rank, the world size",
        "COMPCOLL_TORCH_SCOPE=all" + ours + "it is the PyTorch backend's: the others have no notion of a backward pass"}) {
    size_t n = 0;
    for (size_t p = all.find(m); p != std::string::npos; p = all.find(m, p + 1)) ++n;
    EXPECT_EQ(n, 1u) << m << "\n" << r.output;  // once per process (its ranks are threads)
  }
  EXPECT_EQ(all.find("COMPCOLL_TIMEOUT_MS"), std::string::npos) << r.output;
}

TEST_F(Interposer, SplitCommunicatorsKeepSeparateState) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  e["COMPCOLL_DENSITY"] = "0.01";
  e["COMPCOLL_STATS_FILE"] = dir_ + "/stats-{rank}.json";
  const AppRun busy = run({"--ranks", "2", "--split"}, e);
  EXPECT_RAN_OK(busy);
  const std::string stats = read_text(dir_ + "/stats-0.json");
  const AppRun idle = run({"--ranks", "2", "--split", "--child-idle"}, e);
  EXPECT_RAN_OK(idle);
  // The parent's results do not depend on what the child did with the same buffer.
  const auto parent_busy = lines_after(busy.output, "digest split-parent-");
  EXPECT_EQ(parent_busy.size(), 3u);
  EXPECT_EQ(parent_busy, lines_after(idle.output, "digest split-parent-"));
  // Two communicators in rank 0's file: the root (id 0) and its child.
  EXPECT_NE(stats.find("\"parent\": -1"), std::string::npos) << stats;
  const std::regex child("\\{\"id\": ([0-9]+), \"parent\": ([0-9]+), \"rank\": 0, \"size\": 2, \"calls\": 3, "
                         "\"compressed_calls\": 3, .*\"state_entries\": 1,");
  EXPECT_TRUE(std::regex_search(stats, child)) << stats;
}

TEST_F(Interposer, StatsAreWrittenAtExitWhenCommunicatorsAreNeverDestroyed) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "onebit";
  e["COMPCOLL_STATS_FILE"] = dir_ + "/exit-{rank}.json";
  const AppRun r = run({"--ranks", "2", "--split", "--no-destroy"}, e);
  EXPECT_RAN_OK(r);
  for (int rank : {0, 1}) {
    const std::string stats = read_text(dir_ + "/exit-" + std::to_string(rank) + ".json");
    EXPECT_EQ(json_int(stats, "compressed_calls"), 5 + 3 + 3) << stats;  // then 3 on the parent, 3 on the child
    EXPECT_NE(stats.find("\"destroyed\": false"), std::string::npos) << stats;
  }
}

// Every rank writing one stats file keeps only the last to finish: said once
// at WARN, as the other front ends say it (it was silent here), not refused.
TEST_F(Interposer, AStatsFileWithoutRankInItsNameIsSaidOnce) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  e["COMPCOLL_STATS_FILE"] = dir_ + "/shared.json";
  const AppRun r = run({"--ranks", "2"}, e);
  EXPECT_RAN_OK(r);
  const auto said = lines_after(r.output, "compcoll WARN");
  size_t shared = 0;
  for (const auto& line : said) {
    if (line.find("COMPCOLL_STATS_FILE=" + dir_ + "/shared.json has no {rank}: every process") !=
        std::string::npos) {
      ++shared;
    }
  }
  EXPECT_EQ(shared, 1u) << r.output;
  e["COMPCOLL_STATS_FILE"] = dir_ + "/own-{rank}.json";
  const AppRun own = run({"--ranks", "2"}, e);
  EXPECT_RAN_OK(own);
  EXPECT_EQ(own.output.find("has no {rank}"), std::string::npos) << own.output;
}

// COMPCOLL_STATE_DIR for a program that never calls ncclCommDestroy: the
// checkpoint is written at exit, and a restarted program whose buffers lie at
// other addresses finds its states again (keys are the buffers' order of
// first use, not their addresses), so the resumed fp32 steps have the bits of
// an uninterrupted run. Without the checkpoint the same steps differ.
TEST_F(Interposer, StateDirResumesBitForBitAfterAnExitWithoutDestroy) {
  const auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
    return n;
  };
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  e["COMPCOLL_WARMUP_STEPS"] = "2";
  e["COMPCOLL_DEBUG"] = "INFO";
  e["COMPCOLL_STATE_DIR"] = dir_ + "/whole";
  const AppRun whole = run({"--ranks", "2", "--steps", "5"}, e);
  EXPECT_RAN_OK(whole);
  e["COMPCOLL_STATE_DIR"] = dir_ + "/resumed";
  const AppRun first = run({"--ranks", "2", "--steps", "2", "--no-destroy"}, e);
  EXPECT_RAN_OK(first);
  // fp32, fp16 and bf16 buffers: three states per rank, saved at exit.
  EXPECT_EQ(count(first.output, "COMPCOLL_STATE_DIR: saved 3 error-feedback states"), 2u)
      << first.output;
  const AppRun second = run({"--ranks", "2", "--steps", "3", "--first-step", "2"}, e);
  EXPECT_RAN_OK(second);
  EXPECT_EQ(count(second.output, "restored the error-feedback state of 3 tensors"), 2u)
      << second.output;
  // The restored states were the ones used: still three, not six.
  EXPECT_EQ(count(second.output, "COMPCOLL_STATE_DIR: saved 3 error-feedback states"), 2u)
      << second.output;
  const auto tail = [](const std::vector<std::string>& digests) {
    return std::vector<std::string>(digests.end() - 3, digests.end());
  };
  const auto want = lines_after(whole.output, "digest fp32-sum-");
  const auto got = lines_after(second.output, "digest fp32-sum-");
  ASSERT_EQ(want.size(), 5u) << whole.output;
  ASSERT_EQ(got.size(), 3u) << second.output;
  EXPECT_EQ(got, tail(want));
  e.erase("COMPCOLL_STATE_DIR");
  const AppRun fresh = run({"--ranks", "2", "--steps", "3", "--first-step", "2"}, e);
  EXPECT_RAN_OK(fresh);
  EXPECT_NE(lines_after(fresh.output, "digest fp32-sum-"), tail(want)) << "the test cannot fail";
}

// Mixed precision under the interposer, as the compcoll Python package's
// torch.amp.GradScaler wrappers drive it (compcoll_nccl_note_loss_scaled,
// compcoll_nccl_loss_scale_changed). A loss scale halved at step 3 and told
// to the interposer: every step's result divided by its scale is, bit for
// bit, that of a run without a scale (the residual follows the scale). An
// overflowed step (rank 1's gradient all infinite): the later steps are those
// of a run that never made that call (the state was left as it was). Either
// untold, the results differ: the test can fail.
void Interposer::expect_loss_scale_followed(const std::string& algo) {
  auto e = env();
  e["COMPCOLL_ALGO"] = algo;
  e["COMPCOLL_DEBUG"] = "INFO";
  const auto with = [&](const std::vector<std::string>& extra) {
    // 100,000 elements, 7 of csc's chunks: at 20,000 (two chunks, one sent a step) csc's
    // results did not depend on its residual within six steps, told or not.
    std::vector<std::string> args{"--ranks", "2", "--steps", "6", "--count", "100000"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args, e);
  };
  const auto fp32_digests = [](const AppRun& r) { return lines_after(r.output, "digest fp32-sum-"); };

  const AppRun plain = with({});
  EXPECT_RAN_OK(plain);
  ASSERT_EQ(fp32_digests(plain).size(), 6u) << plain.output;
  const AppRun told = with({"--loss-scale", "1024", "--halve-at", "3"});
  EXPECT_RAN_OK(told);
  EXPECT_NE(told.output.find("note-loss-scaled found=1"), std::string::npos) << told.output;
  EXPECT_NE(told.output.find("loss-scale-changed found=1 rescaled=2"), std::string::npos)
      << "two communicators with an fp32 state each (the fp16 and bf16 calls come later)\n" << told.output;
  EXPECT_NE(told.output.find("the loss scale (torch.amp.GradScaler) changed by a factor of 0.5"),
            std::string::npos) << told.output;
  EXPECT_EQ(fp32_digests(told), fp32_digests(plain)) << told.output;
  const AppRun untold = with({"--loss-scale", "1024", "--halve-at", "3", "--no-tell"});
  EXPECT_RAN_OK(untold);
  EXPECT_NE(fp32_digests(untold), fp32_digests(plain)) << "the test cannot fail";

  const AppRun skipped = with({"--skip-step", "2"});
  EXPECT_RAN_OK(skipped);
  ASSERT_EQ(fp32_digests(skipped).size(), 5u) << skipped.output;
  const AppRun overflowed = with({"--loss-scale", "1024", "--overflow-at", "2"});
  EXPECT_RAN_OK(overflowed);
  EXPECT_NE(overflowed.output.find("a loss scaler (torch.amp.GradScaler) is in charge"),
            std::string::npos) << overflowed.output;
  EXPECT_EQ(fp32_digests(overflowed), fp32_digests(skipped)) << overflowed.output;
  const AppRun kept = with({"--loss-scale", "1024", "--overflow-at", "2", "--no-tell"});
  EXPECT_RAN_OK(kept);
  EXPECT_NE(fp32_digests(kept), fp32_digests(skipped)) << "the test cannot fail";
}

TEST_F(Interposer, TheStateFollowsALossScaleAndAnOverflowedStepLeavesItAlone) {
  for (const char* algo : {"dgc", "sdagc", "sbc", "csc", "onebit"}) {
    SCOPED_TRACE(algo);
    expect_loss_scale_followed(algo);
  }
}


// A split child as large as its parent has the same rank and size: it gets
// a file of its own, named by its place among its parent's splits, and both
// are restored at the next start.
TEST_F(Interposer, StateDirGivesASplitChildItsOwnFile) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  e["COMPCOLL_DEBUG"] = "INFO";
  e["COMPCOLL_STATE_DIR"] = dir_ + "/state";
  for (int run_no = 0; run_no < 2; ++run_no) {
    const AppRun r = run({"--ranks", "2", "--split"}, e);
    EXPECT_RAN_OK(r);
    EXPECT_EQ(r.output.find("another communicator of this process uses"), std::string::npos)
        << r.output;
    size_t restored = 0;
    for (size_t p = r.output.find("restored the error-feedback state of"); p != std::string::npos;
         p = r.output.find("restored the error-feedback state of", p + 1)) {
      ++restored;
    }
    EXPECT_EQ(restored, run_no == 0 ? 0u : 4u) << r.output;  // parent and child, two ranks
  }
  for (const char* name : {"compcoll-state-rank0-of2.bin", "compcoll-state-rank1-of2.bin",
                           "compcoll-state-split0-origin0-rank0-of2.bin",
                           "compcoll-state-split0-origin1-rank1-of2.bin"}) {
    EXPECT_TRUE(std::filesystem::exists(dir_ + "/state/" + name)) << name;
  }
}

TEST_F(Interposer, AStalledPeerTimesOutAbortsOnceAndReportsTheError) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  e["COMPCOLL_TIMEOUT_MS"] = "2000";
  const AppRun r = run({"--ranks", "2", "--stall-rank", "1"}, e);
  EXPECT_RAN_OK(r);
  EXPECT_LT(r.seconds, 30.0);
  const auto errors = lines_after(r.output, "stall-error rank 0 ");
  ASSERT_EQ(errors.size(), 1u) << r.output;
  EXPECT_EQ(errors[0].rfind("result 6 async 6 ", 0), 0u) << errors[0];  // ncclRemoteError
  EXPECT_NE(errors[0].find("timed out after 2000 ms"), std::string::npos) << errors[0];
  const std::string log = read_text(log_path());
  EXPECT_EQ(log.find("MISUSE"), std::string::npos) << "a handle reached NCCL after its abort:\n" << log;
  EXPECT_EQ(lines_after(log, "ncclCommAbort ").size(), 2u) << log;  // ours for rank 0, the app's for rank 1
}

// A forwarded collective hangs (its peer never joins) and the program
// aborts the communicator, as PyTorch's watchdog does. The abort must come
// before compcoll frees its device memory: a free waits for the device's
// work, which only the abort ends (the stand-in driver's cuMemFree waits as
// the real one does, for at most 60 s).
TEST_F(Interposer, AnAbortBehindAHungForwardedCallReturnsPromptly) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  e["COMPCOLL_TIMEOUT_MS"] = "30000";
  const AppRun r = run({"--ranks", "2", "--stall-rank", "1", "--stall-forwarded"}, e);
  EXPECT_RAN_OK(r);
  EXPECT_LT(r.seconds, 20.0) << r.output;
  const auto said = lines_after(r.output, "stall-error rank 0 ");
  ASSERT_EQ(said.size(), 1u) << r.output;
  EXPECT_EQ(said[0].rfind("result 0 async 0 ", 0), 0u) << said[0];  // forwarded: enqueued
  const std::string log = read_text(log_path());
  EXPECT_EQ(log.find("MISUSE"), std::string::npos) << "a handle reached NCCL after its abort:\n" << log;
  EXPECT_EQ(lines_after(log, "ncclCommAbort ").size(), 2u) << log;  // each rank's, once
}

TEST_F(Interposer, ABadSettingFailsCommunicatorCreation) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "bogus";
  const AppRun r = run({"--ranks", "2", "--expect-init-failure"}, e);
  EXPECT_RAN_OK(r);
  EXPECT_NE(r.output.find("init-failed rank 0 result 4 ncclCommInitRank: compcoll: COMPCOLL_ALGO=bogus"),
            std::string::npos) << r.output;
}

// COMPCOLL_STATS_FILE and COMPCOLL_STATE_DIR are checked when the
// communicator is created, not found unwritable in a warning at exit.
TEST_F(Interposer, AnOutputPathThatCannotBeWrittenFailsCommunicatorCreation) {
  { std::ofstream(dir_ + "/a-file") << "not a directory"; }
  const std::string blocked = dir_ + "/a-file";
  const auto expect_init_failure = [&](const char* var, const std::string& value,
                                       const std::function<std::string(int)>& said) {
    auto e = env();
    e["COMPCOLL_ALGO"] = "dgc";
    e[var] = value;
    const AppRun r = run({"--ranks", "2", "--expect-init-failure"}, e);
    EXPECT_RAN_OK(r);
    for (int rank : {0, 1}) {
      EXPECT_NE(r.output.find("init-failed rank " + std::to_string(rank) +
                              " result 4 ncclCommInitRank: compcoll: " + said(rank)),
                std::string::npos) << r.output;
    }
  };
  expect_init_failure("COMPCOLL_STATS_FILE", blocked + "/stats-{rank}.json", [&](int rank) {
    const std::string rs = std::to_string(rank);
    return "COMPCOLL_STATS_FILE cannot be written: rank " + rs + ": " + blocked + "/stats-" + rs +
           ".json: cannot create its directory " + blocked;
  });
  expect_init_failure("COMPCOLL_STATE_DIR", blocked + "/state", [&](int) {
    return "COMPCOLL_STATE_DIR " + blocked + "/state: cannot create the directory";
  });
}

TEST_F(Interposer, RefusesToLoadItselfAsTheRealNccl) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  e["COMPCOLL_NCCL_LIBRARY"] = testing::interposer_path();
  const AppRun r = run({"--ranks", "2", "--expect-init-failure"}, e);
  EXPECT_RAN_OK(r);
  EXPECT_NE(r.output.find("resolves to the compcoll interposer itself"), std::string::npos) << r.output;
}

TEST_F(Interposer, RefusesAnotherNcclThanTheOneTheApplicationUses) {
  // A copy of the stand-in at another path is another loaded object: the
  // application's ncclBroadcast would get communicators made by the copy.
  char tmpl[] = "/tmp/compcoll-other-nccl-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string copy = std::string(tmpl) + "/libnccl.so.2";
  std::filesystem::copy_file(testing::standin_nccl_path(), copy);
  auto e = env();
  e["COMPCOLL_NCCL_LIBRARY"] = copy;  // no COMPCOLL_ALGO: pass-through mode checks too
  const AppRun r = run({"--ranks", "2", "--expect-init-failure"}, e);
  std::filesystem::remove_all(tmpl);
  EXPECT_RAN_OK(r);
  EXPECT_NE(r.output.find("is not the NCCL this process already uses"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(copy), std::string::npos) << r.output;
}

}  // namespace
}  // namespace compcoll
