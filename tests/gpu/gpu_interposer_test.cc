// The interposer on a real GPU with the real NCCL: the unmodified NCCL
// program (tests/interposer/nccl_allreduce_app.cc built against the real
// libnccl.so.2 and libcuda.so.1) runs one rank per visible GPU, first as a
// pure pass-through, then with dgc. Skips (GTEST_SKIP) without a GPU.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <string>

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
  EXPECT_EQ(json_int(stats, "forwarded_calls"), 5) << stats;
}

}  // namespace
}  // namespace compcoll
