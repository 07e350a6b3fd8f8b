// The interposer on a real GPU with the real NCCL: the unmodified NCCL
// program (tests/interposer/nccl_allreduce_app.cc built against the real
// libnccl.so.2 and libcuda.so.1) runs one rank per visible GPU, first as a
// pure pass-through, then with dgc. Skips (GTEST_SKIP) without a GPU.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "compression/cuda/cuda_util.h"
#include "tests/interposer/process.h"

namespace compcoll {
namespace {

using testing::json_int;
using testing::read_text;

class GpuInterposer : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::device_available(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
    cudaGetDeviceCount(&devices_);
    char tmpl[] = "/tmp/compcoll-gpu-interposer-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  std::map<std::string, std::string> env() const {
    // The NCCL found at build time, unless COMPCOLL_TEST_REAL_NCCL names the
    // GPU machine's own (a pip-installed NCCL, say).
    const char* nccl = std::getenv("COMPCOLL_TEST_REAL_NCCL");
    std::map<std::string, std::string> e{
        {"PATH", "/usr/bin:/bin"},
        {"LD_PRELOAD", COMPCOLL_TEST_INTERPOSER},
        {"COMPCOLL_NCCL_LIBRARY", nccl && *nccl ? nccl : COMPCOLL_TEST_REAL_NCCL}};
    for (const char* keep : {"LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG"}) {
      if (const char* v = std::getenv(keep)) e[keep] = v;
    }
    return e;
  }
  testing::AppRun run(const std::vector<std::string>& args, const std::map<std::string, std::string>& e) {
    std::vector<std::string> argv{COMPCOLL_TEST_GPU_APP, "--ranks", std::to_string(devices_)};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::run_program(argv, e, std::chrono::seconds(300));
  }
  int devices_ = 0;
  std::string dir_;
};

TEST_F(GpuInterposer, PassesThroughWhenCompcollAlgoIsUnset) {
  const auto r = run({"--exact"}, env());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("result ok"), std::string::npos) << r.output;
}

TEST_F(GpuInterposer, CompressesWithDgcOnTheRealNccl) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  e["COMPCOLL_DEBUG"] = "INFO";
  e["COMPCOLL_STATS_FILE"] = dir_ + "/stats-{rank}.json";
  const auto r = run({"--split"}, e);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("result ok"), std::string::npos) << r.output;
  const std::string stats = read_text(dir_ + "/stats-0.json");
  EXPECT_GE(json_int(stats, "compressed_calls"), 5) << stats;
  // int32, MAX, float64, a small one, one in a group, one captured
  // (tests/interposer/nccl_allreduce_app.cc's forwarded phase).
  EXPECT_EQ(json_int(stats, "forwarded_calls"), 6) << stats;
}

// COMPCOLL_NCCL_COMMS=multi-host on one machine: the host-id exchange runs
// over the real NCCL (device buffers), finds one host, and every call of the
// root and its split child goes to NCCL uncompressed, with the exit WARN.
TEST_F(GpuInterposer, MultiHostOnlyLeavesASingleMachinesCommunicatorsToNccl) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  e["COMPCOLL_NCCL_COMMS"] = "multi-host";
  e["COMPCOLL_STATS_FILE"] = dir_ + "/stats-{rank}.json";
  const auto r = run({"--split"}, e);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("result ok"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("COMPCOLL_NCCL_COMMS=multi-host: no allreduce of this process was "
                          "compressed"), std::string::npos) << r.output;
  const std::string stats = read_text(dir_ + "/stats-0.json");
  EXPECT_EQ(json_int(stats, "compressed_calls"), 0) << stats;
  EXPECT_GE(json_int(stats, "forwarded_calls"), 11) << stats;
}

// The GPU codecs (COMPCOLL_DEVICE_CODECS=on) against the same
// program staged through host memory and the CPU codecs (=off): every result
// digest equal, bit for bit, through the warm-up and after it, fp32 in place
// and out of place (AVG), fp16 and bf16, with and without momentum.
TEST_F(GpuInterposer, DeviceCodecsGiveTheBitsOfStagingThroughHostMemory) {
  const std::vector<std::pair<const char*, std::map<std::string, std::string>>> cases = {
      {"dgc", {}},
      {"dgc", {{"COMPCOLL_WARMUP_STEPS", "2"}, {"COMPCOLL_MOMENTUM", "0.9"}}},
      {"sdagc", {{"COMPCOLL_WARMUP_STEPS", "2"}}},
      {"sbc", {{"COMPCOLL_WARMUP_STEPS", "2"}}},
  };
  for (const auto& [algo, extra] : cases) {
    std::map<std::string, std::vector<std::string>> digests;
    for (const char* codecs : {"off", "on"}) {
      auto e = env();
      e["COMPCOLL_ALGO"] = algo;
      e["COMPCOLL_DEBUG"] = "INFO";
      e["COMPCOLL_DEVICE_CODECS"] = codecs;
      e["COMPCOLL_STATS_FILE"] = dir_ + "/" + algo + "-" + codecs + "-{rank}.json";
      for (const auto& [k, v] : extra) e[k] = v;
      const auto r = run({"--steps", "5", "--fp32-avg", "--count", "300007"}, e);
      ASSERT_EQ(r.exit_code, 0) << algo << " " << codecs << "\n" << r.output;
      ASSERT_NE(r.output.find("result ok"), std::string::npos) << r.output;
      digests[codecs] = testing::lines_after(r.output, "digest ");
      const bool on_device = std::string(codecs) == "on";
      EXPECT_EQ(r.output.find("on the device with the GPU codecs") != std::string::npos, on_device)
          << algo << " " << codecs << "\n" << r.output;
      // Staged calls say why; on the device none is staged.
      EXPECT_EQ(r.output.find("(said once per reason)") == std::string::npos, on_device)
          << algo << " " << codecs << "\n" << r.output;
      const std::string stats = read_text(dir_ + "/" + algo + "-" + codecs + "-0.json");
      EXPECT_EQ(json_int(stats, "compressed_calls"), 8) << stats;  // 5 + AVG + fp16 + bf16
    }
    ASSERT_EQ(digests["off"].size(), 8u) << algo;
    EXPECT_EQ(digests["on"], digests["off"]) << algo;
  }
}

// A program that exits without ncclCommDestroy: the device-resident states
// are copied back and saved at exit (before the CUDA runtime tears itself
// down), and a restarted program resumes with the bits of an uninterrupted
// run.
TEST_F(GpuInterposer, DeviceResidentStatesAreSavedAtExitAndResumeBitForBit) {
  auto e = env();
  e["COMPCOLL_ALGO"] = "dgc";
  e["COMPCOLL_WARMUP_STEPS"] = "2";
  e["COMPCOLL_MOMENTUM"] = "0.9";
  e["COMPCOLL_DEVICE_CODECS"] = "on";
  e["COMPCOLL_DEBUG"] = "INFO";
  e["COMPCOLL_STATE_DIR"] = dir_ + "/whole";
  const auto whole = run({"--steps", "5", "--count", "300007"}, e);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  ASSERT_NE(whole.output.find("on the device with the GPU codecs"), std::string::npos) << whole.output;
  e["COMPCOLL_STATE_DIR"] = dir_ + "/resumed";
  const auto first = run({"--steps", "2", "--count", "300007", "--no-destroy"}, e);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("COMPCOLL_STATE_DIR: saved 3 error-feedback states"), std::string::npos)
      << first.output;
  const auto second = run({"--steps", "3", "--count", "300007", "--first-step", "2"}, e);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("restored the error-feedback state of 3 tensors"), std::string::npos)
      << second.output;
  const auto want = testing::lines_after(whole.output, "digest fp32-sum-");
  const auto got = testing::lines_after(second.output, "digest fp32-sum-");
  ASSERT_EQ(want.size(), 5u) << whole.output;
  EXPECT_EQ(got, std::vector<std::string>(want.end() - 3, want.end())) << second.output;
}

}  // namespace
}  // namespace compcoll
