// The communicator's policy and lifecycle, over real loopback sockets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "collectives/lent_comm.h"
#include "collectives/machine_load.h"
#include "compcoll/error.h"
#include "plugin/communicator.h"
#include "tests/support/gloo_harness.h"
#include "transport/gloo_comm.h"
#include "transport/machine_cpus.h"

namespace compcoll {
namespace {

// The harness keeps its GlooComm; the Communicator gets a view of it.
using Borrowed = LentComm;

Config dgc_config() {
  Config c;
  c.algo = "dgc";
  c.params.density = 0.01;
  return c;
}

// COMPCOLL_CODEC_THREADS=auto: 1 for host tensors; where the communicator
// stages device tensors (the NCCL interposer, the cuda lane) the machine's
// CPUs shared among its ranks, learnt collectively at creation; a number
// set by the user stays, though that rank still takes part in the
// exchange (its peers may be on auto).
TEST(Communicator, AutoCodecThreadsGiveStagedDeviceTensorsTheMachinesSpareCpus) {
  const int here = machine_loads({describe_machine_cpus()}).front().cpus;
  for (const int ranks : {1, 2}) {
    testing::run_gloo_ranks(ranks, [&](Comm& comm) {
      Config c = dgc_config();
      c.params.codec_threads = kAutoCodecThreads;
      EXPECT_EQ(Communicator(std::make_unique<Borrowed>(comm), c).config().params.codec_threads, 1);
      c.stages_device_tensors = true;
      EXPECT_EQ(Communicator(std::make_unique<Borrowed>(comm), c).config().params.codec_threads,
                std::clamp(here / ranks, 1, kMaxStagedCodecThreads))
          << ranks << " ranks on " << here << " CPUs";
      if (comm.rank() == 0) c.params.codec_threads = 3;  // the other rank stays on auto
      const int got = Communicator(std::make_unique<Borrowed>(comm), c).config().params.codec_threads;
      EXPECT_EQ(got, comm.rank() == 0 ? 3 : std::clamp(here / ranks, 1, kMaxStagedCodecThreads));
      c.algo = "onebit";  // reads no codec threads: nothing is exchanged
      c.params.codec_threads = kAutoCodecThreads;
      EXPECT_EQ(Communicator(std::make_unique<Borrowed>(comm), c).config().params.codec_threads, 1);
    });
  }
}

TEST(Communicator, CompressesEligibleTensorsAndRoutesTheRestDense) {
  testing::run_gloo_ranks(2, [](Comm& comm) {
    Communicator cc(std::make_unique<Borrowed>(comm), dgc_config());
    std::vector<float> big(100000, 1.0f);
    cc.allreduce(big.data(), big.size(), DType::kFloat32, ReduceOp::kSum, "g");
    EXPECT_EQ(cc.stats().compressed_calls(), 1u);
    EXPECT_LT(cc.stats().last().wire_bytes * 20, cc.stats().last().dense_bytes);

    std::vector<float> small(100, 1.0f);  // below min_elems
    cc.allreduce(small.data(), small.size(), DType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(small[0], 2.0f);
    std::vector<int32_t> ints(50000, 2);  // not floating
    cc.allreduce(ints.data(), ints.size(), DType::kInt32, ReduceOp::kSum);
    EXPECT_EQ(ints[123], 4);
    std::vector<float> mx(50000, float(comm.rank()));  // MAX is never compressed
    cc.allreduce(mx.data(), mx.size(), DType::kFloat32, ReduceOp::kMax);
    EXPECT_EQ(mx[0], 1.0f);
    EXPECT_EQ(cc.stats().calls(), 4u);
    EXPECT_EQ(cc.stats().compressed_calls(), 1u);
    EXPECT_EQ(cc.state_entries(), 1u);
  });
}

TEST(Communicator, AllreduceExactTakesTheDenseRouteWhateverTheAlgorithm) {
  testing::run_gloo_ranks(2, [](Comm& comm) {
    Communicator cc(std::make_unique<Borrowed>(comm), dgc_config());
    std::vector<float> values(100000, float(comm.rank() + 1));  // dgc would compress it
    cc.allreduce_exact(values.data(), values.size(), DType::kFloat32, ReduceOp::kAvg, "a test");
    for (float v : values) ASSERT_EQ(v, 1.5f);  // every entry, exact
    EXPECT_EQ(cc.stats().calls(), 1u);
    EXPECT_EQ(cc.stats().compressed_calls(), 0u);
    EXPECT_EQ(cc.state_entries(), 0u);  // no residual was made for it
  });
}

TEST(Communicator, ExplicitKeysKeepResidualsAcrossBufferMoves) {
  testing::run_gloo_ranks(2, [](Comm& comm) {
    Communicator cc(std::make_unique<Borrowed>(comm), dgc_config());
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g(50000, 0.5f);  // a new buffer every step
      cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kAvg, "layer1");
    }
    EXPECT_EQ(cc.state_entries(), 1u);
  });
}

TEST(Communicator, HalfPrecisionTensorsAreCompressedWithFp32Residuals) {
  testing::run_gloo_ranks(2, [](Comm& comm) {
    Communicator cc(std::make_unique<Borrowed>(comm), dgc_config());
    std::vector<uint16_t> h(40000, 0x3c00);  // 1.0 in fp16
    cc.allreduce(h.data(), h.size(), DType::kFloat16, ReduceOp::kSum, "h");
    EXPECT_EQ(cc.stats().compressed_calls(), 1u);
    EXPECT_EQ(cc.state_bytes(), 40000 * sizeof(float));
  });
}

TEST(Communicator, WritesTheStatsFileOnDestruction) {
  const std::string dir = ::testing::TempDir();
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    Config c = dgc_config();
    c.stats_file = dir + "cc-stats-{rank}.json";
    {
      Communicator cc(std::make_unique<Borrowed>(comm), c);
      std::vector<float> g(100000, 1.0f);
      cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kSum, "g");
    }
    std::ifstream in(dir + "cc-stats-" + std::to_string(comm.rank()) + ".json");
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_NE(text.str().find("\"compressed_calls\": 1"), std::string::npos) << text.str();
    EXPECT_NE(text.str().find("\"algo\": \"dgc\""), std::string::npos) << text.str();
  });
}

// The stats file's directory is made when missing; a path that cannot be
// written (here rank 1's lies inside a regular file) fails every rank when
// the communicator is created, naming the rank, the path and why, instead of
// a warning after the run. Owners that write the file themselves (the
// PyTorch backend, the NCCL interposer) pass it as owner_stats_path.
TEST(Communicator, AStatsFileThatCannotBeWrittenFailsEveryRankAtCreation) {
  const std::string base = ::testing::TempDir() + "cc-stats-unwritable";
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base);
  { std::ofstream(base + "/a-file") << "not a directory"; }
  for (const bool owner_writes : {false, true}) {
    testing::run_gloo_ranks(2, [&](Comm& comm) {
      const std::string bad = base + "/a-file/stats-1.json";
      Config c = dgc_config();
      const std::string mine = comm.rank() == 1 ? bad : base + "/new/dir/stats-0.json";
      (owner_writes ? c.owner_stats_path : c.stats_file) = mine;
      try {
        Communicator cc(std::make_unique<Borrowed>(comm), c);
        ADD_FAILURE() << "rank " << comm.rank() << " accepted an unwritable stats file";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
        const std::string want = "COMPCOLL_STATS_FILE cannot be written: rank 1: " + bad +
                                 ": cannot create its directory " + base + "/a-file";
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      }
    });
  }
  // Rank 0's missing directories were made, ready for its file.
  EXPECT_TRUE(std::filesystem::is_directory(base + "/new/dir"));
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    Config c = dgc_config();
    c.stats_file = base + "/{rank}/deeper/stats.json";
    {
      Communicator cc(std::make_unique<Borrowed>(comm), c);
      std::vector<float> g(100000, 1.0f);
      cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kSum, "g");
    }
    EXPECT_TRUE(std::filesystem::exists(base + "/" + std::to_string(comm.rank()) +
                                        "/deeper/stats.json"));
  });
  std::filesystem::remove_all(base);
}

// A job that ends inside the warm-up (csc and onebit run it dense), or
// sends only tensors too small to compress, asked for compression and got
// none: rank 0 says so once at the end, with the counts and the setting to
// change. An algorithm that compressed anything (dgc's warm-up sends a
// quarter of the elements) says nothing.
TEST(Communicator, SaysOnceAtTheEndWhenNothingWasCompressedAndWhy) {
  const auto run = [](const std::string& algo) {
    ::testing::internal::CaptureStderr();
    testing::run_gloo_ranks(2, [&](Comm& comm) {
      Config c;
      c.algo = algo;
      c.params.warmup_steps = 5;
      Communicator cc(std::make_unique<Borrowed>(comm), c);
      const bool dense_warmup = algo != "dgc";
      std::vector<float> big(100000);
      for (int step = 0; step < 3; ++step) {
        std::fill(big.begin(), big.end(), 1.0f);
        cc.allreduce(big.data(), big.size(), DType::kFloat32, ReduceOp::kSum, "g");
        if (dense_warmup) {
          EXPECT_EQ(big[7], 2.0f);  // exact: the warm-up is dense
        }
      }
      std::vector<float> small(100, 1.0f);  // below min_elems
      cc.allreduce(small.data(), small.size(), DType::kFloat32, ReduceOp::kSum);
      EXPECT_EQ(cc.stats().warmup_dense_calls(), dense_warmup ? 3u : 0u);
      EXPECT_EQ(cc.stats().compressed_calls(), dense_warmup ? 0u : 3u);
      EXPECT_EQ(cc.stats().steady_calls(), 1u);  // the small tensor: no warm-up on a dense route
      cc.finish();
    });
    return ::testing::internal::GetCapturedStderr();
  };
  for (const char* algo : {"csc", "onebit"}) {
    const std::string err = run(algo);
    const std::string want = std::string("compcoll WARN [rank 0] COMPCOLL_ALGO=") + algo +
                             " compressed none of this communicator's 4 allreduce calls: 3 ran "
                             "dense in the warm-up (COMPCOLL_WARMUP_STEPS=5";
    const size_t at = err.find(want);
    EXPECT_NE(at, std::string::npos) << err;
    EXPECT_EQ(err.find("compressed none", at + want.size()), std::string::npos) << err;  // once
    // Only the reason that occurred.
    EXPECT_NE(err.find("1 took the dense route (tensor is smaller than COMPCOLL_MIN_ELEMS=16384)"),
              std::string::npos)
        << err;
  }
  EXPECT_EQ(run("dgc").find("compressed none"), std::string::npos);
}

// A key the caller named, reused for a tensor of another size, drops the
// old state's residual: most likely a slip, so said at WARN (once per key),
// where it was an INFO line nobody saw. Under a front end whose keys are
// its own (the PyTorch backend's rebuilt buckets) it stays INFO.
TEST(Communicator, ANamedKeyReusedForAnotherSizeIsWarnedAboutOnce) {
  const auto run = [](FrontEnd front_end) {
    ::testing::internal::CaptureStderr();
    testing::run_gloo_ranks(2, [&](Comm& comm) {
      Config c;
      c.algo = "dgc";
      c.front_end = front_end;
      Communicator cc(std::make_unique<Borrowed>(comm), c);
      for (const size_t n : {100000, 50000, 100000, 50000}) {
        std::vector<float> g(n, 1.0f);
        cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kSum, "grad");
      }
      cc.finish();
    });
    return ::testing::internal::GetCapturedStderr();
  };
  const std::string err = run(FrontEnd::kStandalone);
  const std::string want = "compcoll WARN [rank 0] error-feedback state of key:grad";
  const size_t at = err.find(want);
  EXPECT_NE(at, std::string::npos) << err;
  EXPECT_NE(err.find("is dropped and a fresh state starts", at), std::string::npos) << err;
  EXPECT_EQ(err.find(want, at + 1), std::string::npos) << "once per key: " << err;
  EXPECT_EQ(run(FrontEnd::kTorchBackend).find("is dropped and a fresh state starts"),
            std::string::npos);
}

// Calls a front end sent exact (the PyTorch backend's allreduces outside a
// backward pass, tensor parallelism's activations) are named with their
// reason in that WARN, not blamed on the size, dtype or op.
TEST(Communicator, NothingCompressedNamesTheFrontEndsReasonForExactCalls) {
  ::testing::internal::CaptureStderr();
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    Config c;
    c.algo = "sdagc";
    Communicator cc(std::make_unique<Borrowed>(comm), c);
    std::vector<float> big(100000, 1.0f);
    for (int step = 0; step < 3; ++step) {
      cc.allreduce_exact(big.data(), big.size(), DType::kFloat32, ReduceOp::kSum, "a test's reason");
    }
    EXPECT_EQ(big[7], 8.0f);  // exact, three times
    std::vector<float> small(100, 1.0f);
    cc.allreduce(small.data(), small.size(), DType::kFloat32, ReduceOp::kSum);
    cc.finish();
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("COMPCOLL_ALGO=sdagc compressed none of this communicator's 4 allreduce "
                     "calls: 3 were sent exact by the front end (a test's reason); 1 took the "
                     "dense route (tensor is smaller than COMPCOLL_MIN_ELEMS=16384)"),
            std::string::npos)
      << err;
}

TEST(Communicator, MismatchedConfigurationFailsEveryRankAtCreation) {
  testing::HarnessOptions opts;
  opts.timeout = std::chrono::seconds(5);
  const auto errors = testing::run_gloo_ranks_collect(3, [](Comm& comm) {
    Config c = dgc_config();
    if (comm.rank() == 2) c.params.momentum = 0.9f;
    Communicator cc(std::make_unique<Borrowed>(comm), c);
  }, opts);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " accepted a mismatched configuration";
    EXPECT_NE(testing::what(errors[r]).find("momentum: rank 0 has 0, rank 2 has 0.8999"),
              std::string::npos)
        << testing::what(errors[r]);
  }
}

// A call whose peer never makes it fails at the limit as a TimeoutError
// that names COMPCOLL_TIMEOUT_MS when that setting is the limit, and says
// nothing of it when the limit came from elsewhere: another value, or a
// front end that never reads the variable (the PyTorch backend sets
// cfg.timeout to the process group's); the communicator is broken after.
TEST(Communicator, ACallThatTimesOutNamesTheSettingOnlyWhenItSetTheLimit) {
  enum class Limit { kFromTheVariable, kAnotherValue, kFromTheFramework };
  for (const Limit limit : {Limit::kFromTheVariable, Limit::kAnotherValue, Limit::kFromTheFramework}) {
    const bool from_config = limit == Limit::kFromTheVariable;
    testing::HarnessOptions opts;
    opts.timeout = std::chrono::milliseconds(400);
    const auto errors = testing::run_gloo_ranks_collect(2, [&](Comm& comm) {
      Config c = dgc_config();
      if (limit != Limit::kAnotherValue) c.timeout = opts.timeout;  // else the 30 s default
      if (limit == Limit::kFromTheFramework) c.front_end = FrontEnd::kTorchBackend;
      Communicator cc(std::make_unique<Borrowed>(comm), c);
      if (comm.rank() == 1) {  // never calls: rank 0 waits for it to the limit
        std::this_thread::sleep_for(std::chrono::milliseconds(900));
        return;
      }
      std::vector<float> x(100000, 1.0f);
      try {
        cc.allreduce(x.data(), x.size(), DType::kFloat32, ReduceOp::kSum);
        ADD_FAILURE() << "allreduce returned without its peer";
      } catch (const TimeoutError& e) {
        EXPECT_EQ(e.limit(), opts.timeout);
        const std::string named = "(COMPCOLL_TIMEOUT_MS=400 sets this limit; ";
        EXPECT_EQ(std::string(e.what()).find(named) != std::string::npos, from_config) << e.what();
        EXPECT_EQ(std::string(e.what()).find("COMPCOLL_TIMEOUT_MS") != std::string::npos,
                  from_config)
            << e.what();
      }
      try {
        cc.allreduce(x.data(), x.size(), DType::kFloat32, ReduceOp::kSum);
        ADD_FAILURE() << "a broken communicator accepted another call";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("must be rebuilt"), std::string::npos) << e.what();
      }
    }, opts);
    EXPECT_FALSE(errors[0]) << testing::what(errors[0]);
  }
}

// Two threads on one communicator: its calls are collective and ordered,
// so the second call made while the first runs is refused at once, naming
// the misuse, and the first completes with the right sum. Rank 1 comes late
// so that rank 0's first call is still waiting when its second thread calls.
TEST(Communicator, ASecondThreadsCallWhileOneRunsIsRefusedAndTheFirstCompletes) {
  testing::run_gloo_ranks(2, [](Comm& comm) {
    Communicator cc(std::make_unique<Borrowed>(comm), dgc_config());
    std::vector<float> x(100000, 1.0f);
    // The communicator is not broken by a refusal: the ranks go on.
    const auto and_then_one_more = [&] {
      std::vector<float> z(10, 2.0f);
      cc.allreduce(z.data(), z.size(), DType::kFloat32, ReduceOp::kSum);
      EXPECT_EQ(z[0], 4.0f);
    };
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
      cc.allreduce(x.data(), x.size(), DType::kFloat32, ReduceOp::kMax);
      EXPECT_EQ(x[0], 1.0f);
      and_then_one_more();
      return;
    }
    std::string refused;
    std::thread second([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      std::vector<float> y(5000, 1.0f);
      try {
        cc.allreduce(y.data(), y.size(), DType::kFloat32, ReduceOp::kSum);
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
        refused = e.what();
      }
      EXPECT_EQ(y[0], 1.0f);  // untouched
    });
    cc.allreduce(x.data(), x.size(), DType::kFloat32, ReduceOp::kMax);  // exact: dense route
    second.join();
    EXPECT_EQ(x[0], 1.0f);
    EXPECT_NE(refused.find("rank 0: an allreduce of 5000 elements entered this communicator while "
                           "another of its calls was running on another thread"),
              std::string::npos)
        << refused;
    and_then_one_more();
  });
}

}  // namespace
}  // namespace compcoll
