// The Communicator's device route (collectives/device_route.h), with a
// stand-in route whose "device memory" is host memory, since no GPU runs
// here: it keeps a tensor's state in a DeviceResidency of its own and runs
// the CPU codec on it, so that what is checked is the Communicator's part
// (the real route, the GPU codecs, is checked against the host path bit for
// bit on a GPU: tests/gpu/gpu_interposer_test.cc):
//   - a tensor's state moves to the route and back with nothing lost: calls
//     that alternate between the routes give the bits of host-only calls;
//   - a checkpoint taken while the state is on the device carries it;
//   - warm-up accounting reads the resident step count;
//   - under a loss scaler calls go to the host, which undoes an overflow;
//   - every call the route cannot take is refused with its reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/lent_comm.h"
#include "collectives/registry.h"
#include "collectives/sparse_allgather.h"
#include "plugin/communicator.h"
#include "tests/support/gloo_harness.h"

namespace compcoll {
namespace {

// The stand-in's residency: a CodecState of its own.
class HostResidency final : public DeviceResidency {
 public:
  explicit HostResidency(CodecState& from) : held(from.v.size()) {
    held.v = std::move(from.v);
    held.u = std::move(from.u);
    held.steps = from.steps;
    held.lambda = from.lambda;
  }
  size_t size() const override { return held.v.size(); }
  size_t memory_bytes() const override { return held.memory_bytes(); }
  uint64_t steps() const override { return held.steps; }
  void to_host(CodecState& host) override {
    host.v = held.v;
    host.u = held.u;
    host.steps = held.steps;
    host.lambda = held.lambda;
  }
  CodecState held;
};

class StandInRoute final : public DeviceRoute {
 public:
  StandInRoute(const std::string& algo, const AlgoParams& p)
      : name_(algo), codec_(make_sparse_codec(algo, p)) {}
  void set_stream(void* stream) override { stream_ = stream; }
  std::string refuses(const void*, const void*, size_t, DType dtype) const override {
    return dtype == DType::kFloat32 ? "" : "the stand-in takes float32 only";
  }
  CallInfo allreduce(Comm& comm, const void* send, void* recv, size_t n, DType, bool average,
                     CodecState& state) override {
    if (state.device == nullptr) {
      state.device = std::make_unique<HostResidency>(state);
      EXPECT_TRUE(state.v.empty());  // released, as the GPU route releases it
    }
    ++calls;
    auto* out = static_cast<float*>(recv);
    if (send != recv) std::memcpy(out, send, n * sizeof(float));
    return sparse_allgather(comm, name_.c_str(), *codec_, out, n, average,
                            static_cast<HostResidency&>(*state.device).held);
  }
  int calls = 0;

 private:
  std::string name_;
  std::unique_ptr<SparseCodec> codec_;
  void* stream_ = nullptr;
};

Config config(const std::string& algo) {
  Config c;
  c.algo = algo;
  c.min_elems = 1000;
  c.params.density = 0.01;
  c.params.momentum = algo == "sbc" ? 0.0f : 0.9f;
  c.params.warmup_steps = 3;
  c.params.sparse_pattern = SparsePattern::kAllgather;
  return c;
}

constexpr size_t kCount = 20011;

std::vector<float> gradient(int rank, int step) {
  std::vector<float> g(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    g[i] = std::sin(0.37f * float(i) + 0.9f * float(step) + 2.3f * float(rank)) / (1.0f + float(i % 53));
  }
  return g;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Step s of a run: on the device route where on_device(s), else the host
// path; out-of-place on the device for odd steps. AVG.
std::vector<float> step(Communicator& cc, StandInRoute& route, int s, bool device) {
  std::vector<float> g = gradient(cc.rank(), s);
  if (!device) {
    cc.allreduce(g.data(), kCount, DType::kFloat32, ReduceOp::kAvg, "w");
    return g;
  }
  std::vector<float> out(kCount, -1.0f);
  void* recv = s % 2 ? static_cast<void*>(out.data()) : static_cast<void*>(g.data());
  EXPECT_EQ(cc.device_route_refusal(route, g.data(), recv, kCount, DType::kFloat32, ReduceOp::kAvg), "");
  cc.allreduce_device(route, g.data(), recv, kCount, DType::kFloat32, ReduceOp::kAvg, "w");
  return s % 2 ? out : g;
}

class DeviceRouteTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DeviceRouteTest, StateMovesBetweenTheRoutesWithNothingLost) {
  const std::string algo = GetParam();
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    StandInRoute unused(algo, config(algo).params);
    Communicator host(std::make_unique<LentComm>(comm), config(algo));
    std::vector<std::vector<float>> want;
    for (int s = 0; s < 8; ++s) want.push_back(step(host, unused, s, false));

    Communicator mixed(std::make_unique<LentComm>(comm), config(algo));
    StandInRoute route(algo, config(algo).params);
    const bool on_device[8] = {true, true, false, true, true, false, false, true};
    for (int s = 0; s < 8; ++s) {
      EXPECT_TRUE(same_bits(step(mixed, route, s, on_device[s]), want[s])) << algo << " step " << s;
      EXPECT_EQ(mixed.state_entries(), 1u);
    }
    EXPECT_EQ(route.calls, 5);
    // The same accounting as the host-only run: the warm-up's calls (3) are
    // known from the resident step count, and every call was compressed.
    const StatsCounters a = host.stats().counters(), b = mixed.stats().counters();
    EXPECT_EQ(b.calls, a.calls);
    EXPECT_EQ(b.compressed_calls, a.compressed_calls);
    EXPECT_EQ(b.steady_calls, a.steady_calls);
    EXPECT_EQ(b.steady_calls, 5u);
    EXPECT_EQ(b.wire_bytes, a.wire_bytes);
    // A resident state reports its bytes.
    EXPECT_GE(mixed.state_bytes(), kCount * sizeof(float));
  });
}

TEST_P(DeviceRouteTest, ACheckpointTakenWhileTheStateIsOnTheDeviceResumesBitForBit) {
  const std::string algo = GetParam();
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    StandInRoute unused(algo, config(algo).params);
    Communicator host(std::make_unique<LentComm>(comm), config(algo));
    std::vector<std::vector<float>> want;
    for (int s = 0; s < 7; ++s) want.push_back(step(host, unused, s, false));

    Bytes saved;
    {
      Communicator first(std::make_unique<LentComm>(comm), config(algo));
      StandInRoute route(algo, config(algo).params);
      for (int s = 0; s < 4; ++s) EXPECT_TRUE(same_bits(step(first, route, s, true), want[s]));
      saved = first.save_state();
      // Saving brought the state home; the next call takes it back.
      EXPECT_TRUE(same_bits(step(first, route, 4, true), want[4]));
    }
    Communicator resumed(std::make_unique<LentComm>(comm), config(algo));
    ASSERT_TRUE(resumed.load_state(saved));
    StandInRoute route(algo, config(algo).params);
    for (int s = 4; s < 7; ++s) {
      EXPECT_TRUE(same_bits(step(resumed, route, s, true), want[s])) << algo << " step " << s;
    }
  });
}

// A loss scaler takes charge after calls on the device: the route refuses
// from then on (it cannot undo), the host route takes the resident state
// home, and an overflowed step leaves it as it was, so the run continues
// with the bits of a run that never made that step.
TEST_P(DeviceRouteTest, UnderALossScalerCallsRunOnTheHostAndAnOverflowIsUndone) {
  const std::string algo = GetParam();
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    StandInRoute unused(algo, config(algo).params);
    Communicator plain(std::make_unique<LentComm>(comm), config(algo));
    std::vector<std::vector<float>> want;
    for (int s = 0; s < 6; ++s) want.push_back(step(plain, unused, s, s < 2));

    Communicator scaled(std::make_unique<LentComm>(comm), config(algo));
    StandInRoute route(algo, config(algo).params);
    for (int s = 0; s < 2; ++s) EXPECT_TRUE(same_bits(step(scaled, route, s, true), want[s]));
    scaled.set_discard_nonfinite(true);
    std::vector<float> g = gradient(scaled.rank(), 99);
    const std::string why =
        scaled.device_route_refusal(route, g.data(), g.data(), kCount, DType::kFloat32, ReduceOp::kAvg);
    EXPECT_NE(why.find("loss scaler"), std::string::npos) << why;
    // The overflowed step: one rank's gradient holds an inf.
    if (scaled.rank() == 1) g[17] = INFINITY;
    scaled.allreduce(g.data(), kCount, DType::kFloat32, ReduceOp::kAvg, "w");
    EXPECT_TRUE(std::isinf(g[17]) || std::isnan(g[17]));
    EXPECT_EQ(scaled.discarded_calls(), 1u);
    for (int s = 2; s < 6; ++s) {
      EXPECT_TRUE(same_bits(step(scaled, route, s, false), want[s])) << algo << " step " << s;
    }
    EXPECT_EQ(route.calls, 2);
    // Without the scaler the same overflow stays in the residual: the check
    // above can fail.
    Communicator untold(std::make_unique<LentComm>(comm), config(algo));
    for (int s = 0; s < 2; ++s) step(untold, route, s, true);
    std::vector<float> h = gradient(untold.rank(), 99);
    if (untold.rank() == 1) h[17] = INFINITY;
    untold.allreduce(h.data(), kCount, DType::kFloat32, ReduceOp::kAvg, "w");
    bool differs = false;
    for (int s = 2; s < 6; ++s) differs |= !same_bits(step(untold, route, s, false), want[s]);
    EXPECT_TRUE(differs) << algo;
  });
}

INSTANTIATE_TEST_SUITE_P(Algorithms, DeviceRouteTest, ::testing::Values("dgc", "sdagc", "sbc"));

TEST(DeviceRoute, EveryCallItCannotTakeIsRefusedWithItsReason) {
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    std::vector<float> g(kCount, 1.0f);
    const auto refusal = [&](const Config& c, size_t count, DType dtype, ReduceOp op) {
      Communicator cc(std::make_unique<LentComm>(comm), c);
      StandInRoute route(c.algo == "onebit" ? "dgc" : c.algo, c.params);
      return cc.device_route_refusal(route, g.data(), g.data(), count, dtype, op);
    };
    const auto expect_says = [](const std::string& why, const char* text) {
      EXPECT_NE(why.find(text), std::string::npos) << "'" << why << "' does not say '" << text << "'";
    };
    expect_says(refusal(config("dgc"), 100, DType::kFloat32, ReduceOp::kSum), "COMPCOLL_MIN_ELEMS");
    expect_says(refusal(config("dgc"), kCount, DType::kFloat32, ReduceOp::kMax), "SUM");
    expect_says(refusal(config("dgc"), kCount, DType::kFloat16, ReduceOp::kSum), "float32 only");
    expect_says(refusal(config("onebit"), kCount, DType::kFloat32, ReduceOp::kSum), "no GPU route");
    Config scatter = config("dgc");
    scatter.params.sparse_pattern = SparsePattern::kScatter;
    expect_says(refusal(scatter, kCount, DType::kFloat32, ReduceOp::kSum), "scatter pattern");
    Config handover = config("dgc");
    handover.params.momentum_handover = true;
    expect_says(refusal(handover, kCount, DType::kFloat32, ReduceOp::kSum), "COMPCOLL_MOMENTUM_HANDOVER");
    {
      Communicator scaled(std::make_unique<LentComm>(comm), config("dgc"));
      scaled.set_discard_nonfinite(true);
      StandInRoute route("dgc", config("dgc").params);
      expect_says(scaled.device_route_refusal(route, g.data(), g.data(), kCount, DType::kFloat32,
                                              ReduceOp::kSum),
                  "loss scaler");
    }
    EXPECT_EQ(refusal(config("dgc"), kCount, DType::kFloat32, ReduceOp::kSum), "");

    // A refused call never runs on the route: it is the caller's error.
    Communicator cc(std::make_unique<LentComm>(comm), config("dgc"));
    StandInRoute route("dgc", config("dgc").params);
    try {
      cc.allreduce_device(route, g.data(), g.data(), 100, DType::kFloat32, ReduceOp::kSum, "small");
      ADD_FAILURE() << "a refused call ran";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal);
      EXPECT_NE(std::string(e.what()).find("COMPCOLL_MIN_ELEMS"), std::string::npos) << e.what();
    }
    EXPECT_EQ(route.calls, 0);
  });
}

}  // namespace
}  // namespace compcoll
