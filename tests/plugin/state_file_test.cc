// Error-feedback checkpoints: the file format refuses every malformed input,
// and a run interrupted and resumed (through save_state/load_state or
// COMPCOLL_STATE_DIR) gives bit for bit the results of one that was not.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "collectives/lent_comm.h"
#include "compcoll/error.h"
#include "plugin/communicator.h"
#include "plugin/state_file.h"
#include "tests/support/gloo_harness.h"

namespace compcoll {
namespace {

StateFile sample_file() {
  static CodecState a(5), b(3);
  a.v = {1, 2, 3, 4, 5};
  a.u = {0.5f, 0, 0, 0, 0};
  a.steps = 7;
  a.lambda = 3.25f;
  b.v = {-1, 0, 1};
  b.regions = {0, 2, 3};
  StateFile f;
  f.config_hash = 42;
  f.description = "algo=dgc;density=0.01";
  f.rank = 1;
  f.world_size = 2;
  f.clock = 99;
  f.optimizer_momentum = {0.875f, true};
  f.entries.push_back({"key:a", 3, &a, nullptr});
  f.entries.push_back({"key:b", 0, &b, nullptr});
  return f;
}

void expect_refused(const Bytes& b, const std::string& what) {
  try {
    parse_state_file(b);
    ADD_FAILURE() << what << ": parsed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << what;
    EXPECT_NE(std::string(e.what()).find("compcoll state file"), std::string::npos) << e.what();
  }
}

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Rewrites the trailing checksum so that only the structure is wrong.
void reseal(Bytes& b) {
  const uint64_t h = fnv1a(b.data(), b.size() - 8);
  std::memcpy(b.data() + b.size() - 8, &h, 8);
}

TEST(StateFile, RoundTripsEveryField) {
  const Bytes bytes = serialize_state_file(sample_file());
  const StateFile g = parse_state_file(bytes);
  EXPECT_EQ(g.config_hash, 42u);
  EXPECT_EQ(g.description, "algo=dgc;density=0.01");
  EXPECT_EQ(g.rank, 1);
  EXPECT_EQ(g.world_size, 2);
  EXPECT_EQ(g.clock, 99u);
  EXPECT_EQ(g.optimizer_momentum, (OptimizerMomentum{0.875f, true}));
  ASSERT_EQ(g.entries.size(), 2u);
  EXPECT_EQ(g.entries[0].key, "key:a");
  EXPECT_EQ(g.entries[0].idle, 3u);
  EXPECT_EQ(g.entries[0].state->v, (std::vector<float>{1, 2, 3, 4, 5}));
  EXPECT_EQ(g.entries[0].state->u.size(), 5u);
  EXPECT_EQ(g.entries[0].state->steps, 7u);
  EXPECT_EQ(g.entries[0].state->lambda, 3.25f);
  EXPECT_EQ(g.entries[1].state->regions, (std::vector<size_t>{0, 2, 3}));
  EXPECT_EQ(serialize_state_file(g), bytes);  // parsed entries write the same file
}

TEST(StateFile, EveryTruncationAndEveryFlippedByteIsAClearError) {
  const Bytes good = serialize_state_file(sample_file());
  for (size_t n = 0; n < good.size(); ++n) {
    expect_refused(Bytes(good.begin(), good.begin() + n), "truncated to " + std::to_string(n));
  }
  for (size_t i = 0; i < good.size(); ++i) {
    Bytes b = good;
    b[i] ^= 0x10;
    expect_refused(b, "byte " + std::to_string(i) + " flipped");
  }
  Bytes longer = good;
  longer.insert(longer.end() - 8, 0);
  reseal(longer);
  expect_refused(longer, "a trailing byte");
}

TEST(StateFile, RoundTripsTheSecondMoment) {
  StateFile f = sample_file();
  CodecState a(2);
  a.second_moment = {0.25f, 4.0f};
  f.entries[0].state = &a;
  const StateFile g = parse_state_file(serialize_state_file(f));
  EXPECT_EQ(g.entries[0].state->second_moment, (std::vector<float>{0.25f, 4.0f}));
  EXPECT_TRUE(g.entries[1].state->second_moment.empty());
}

constexpr size_t kVersionAt = 8;
constexpr size_t kKindAt = 8 + 4 + 8 + 4 + 21 + 4 + 4 + 8 + 4;

// sample_file() as version 4 wrote it: without the entries' second-moment
// lengths (both 0 here): the first entry's ends after its key, idle, steps,
// lambda, four lengths, 5 + 5 floats; the second's ends the file.
Bytes sample_as_version_4() {
  Bytes b = serialize_state_file(sample_file());
  const size_t first_entry = kKindAt + 1 + 4;
  const size_t first_length = first_entry + 9 + 8 + 8 + 4 + 32 + 40;
  b.erase(b.end() - 16, b.end() - 8);  // the last entry's, before the checksum
  b.erase(b.begin() + first_length, b.begin() + first_length + 8);
  const uint32_t v4 = 4;
  std::memcpy(b.data() + kVersionAt, &v4, 4);
  reseal(b);
  return b;
}

TEST(StateFile, AVersion4FileReadsWithoutSecondMoments) {
  const StateFile g = parse_state_file(sample_as_version_4());
  EXPECT_EQ(g.optimizer_momentum, (OptimizerMomentum{0.875f, true}));
  ASSERT_EQ(g.entries.size(), 2u);
  EXPECT_EQ(g.entries[0].state->v, (std::vector<float>{1, 2, 3, 4, 5}));
  EXPECT_EQ(g.entries[1].state->regions, (std::vector<size_t>{0, 2, 3}));
  EXPECT_TRUE(g.entries[0].state->second_moment.empty());
}

// Version 3 files (before Adam's moved momentum) carry the momentum without
// its kind: it was SGD's, handed over.
TEST(StateFile, AVersion3FileReadsAsAHandedOverMomentum) {
  Bytes b = sample_as_version_4();
  ASSERT_EQ(b[kKindAt], 1);
  b.erase(b.begin() + kKindAt);
  const uint32_t v3 = 3;
  std::memcpy(b.data() + kVersionAt, &v3, 4);
  reseal(b);
  const StateFile g = parse_state_file(b);
  EXPECT_EQ(g.optimizer_momentum, (OptimizerMomentum{0.875f, false}));
  EXPECT_EQ(g.entries.size(), 2u);
}

TEST(StateFile, HugeCountsWithAValidChecksumAreRefusedBeforeAllocating) {
  Bytes b = serialize_state_file(sample_file());
  // The first entry's residual length: after magic, version, hash,
  // description, rank, size, clock, optimizer momentum and its kind, count,
  // key, idle, steps, lambda.
  const size_t at = 8 + 4 + 8 + 4 + 21 + 4 + 4 + 8 + 4 + 1 + 4 + 4 + 5 + 8 + 8 + 4;
  uint64_t nv = 0;
  std::memcpy(&nv, b.data() + at, 8);
  ASSERT_EQ(nv, 5u);
  nv = uint64_t(1) << 61;
  std::memcpy(b.data() + at, &nv, 8);
  reseal(b);
  expect_refused(b, "a residual of 2^61 elements");
  Bytes bad_rank = serialize_state_file([] {
    StateFile f = sample_file();
    f.rank = 5;
    return f;
  }());
  expect_refused(bad_rank, "rank 5 of 2");
}

Config algo_config(const std::string& algo) {
  Config c;
  c.algo = algo;
  c.params.density = 0.01;
  c.min_elems = 1000;
  if (algo == "dgc" || algo == "csc") c.params.momentum = 0.9f;
  if (algo == "csc") c.params.csc_chunk = 1000;
  if (algo == "onebit") c.params.onebit_block = 256;
  return c;
}

// A gradient that depends on rank, step and tensor: the same data order in
// every run.
std::vector<float> gradient(int rank, int step, size_t n, int tensor) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = std::sin(0.37f * float(i) + 1.3f * float(step) + float(rank) + 5.0f * float(tensor)) /
           (1.0f + float(i % 97));
  }
  return g;
}

constexpr size_t kCounts[] = {20000, 7777};  // two tensors, one not a multiple of the ranks

// Steps [from, to) of training; returns every step's results, in order.
std::vector<std::vector<float>> steps(Communicator& cc, int from, int to) {
  std::vector<std::vector<float>> out;
  for (int s = from; s < to; ++s) {
    for (int t = 0; t < 2; ++t) {
      std::vector<float> g = gradient(cc.rank(), s, kCounts[t], t);
      cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kAvg, t ? "w1" : "w0");
      out.push_back(std::move(g));
    }
  }
  return out;
}

class Resume : public ::testing::TestWithParam<std::string> {};

TEST_P(Resume, SaveAndLoadStateMatchesAnUninterruptedRunBitForBit) {
  const Config cfg = algo_config(GetParam());
  testing::run_gloo_ranks(3, [&](Comm& comm) {
    std::vector<std::vector<float>> whole, resumed;
    {
      Communicator cc(std::make_unique<LentComm>(comm), cfg);
      whole = steps(cc, 0, 8);
    }
    Bytes saved;
    {
      Communicator cc(std::make_unique<LentComm>(comm), cfg);
      resumed = steps(cc, 0, 5);
      saved = cc.save_state();
    }
    Communicator cc(std::make_unique<LentComm>(comm), cfg);
    ASSERT_TRUE(cc.load_state(saved));
    EXPECT_EQ(cc.state_entries(), 2u);
    for (auto& r : steps(cc, 5, 8)) resumed.push_back(std::move(r));
    ASSERT_EQ(resumed.size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      ASSERT_EQ(std::memcmp(whole[i].data(), resumed[i].data(), whole[i].size() * 4), 0)
          << GetParam() << ": call " << i << " differs on rank " << comm.rank();
    }
    // Without the checkpoint the same steps differ: the test can fail.
    Communicator fresh(std::make_unique<LentComm>(comm), cfg);
    const auto cold = steps(fresh, 5, 8);
    EXPECT_NE(std::memcmp(cold[0].data(), whole[10].data(), cold[0].size() * 4), 0);
  });
}

INSTANTIATE_TEST_SUITE_P(Algorithms, Resume,
                         ::testing::Values("dgc", "sbc", "sdagc", "csc", "onebit"));

// Two runs over the same calls: six steps uninterrupted, and four steps
// checkpointed. DDP's restart tests go on from there.
struct RunAndCheckpoint {
  std::vector<std::vector<float>> whole;  // every call's output of the six steps
  Bytes saved;                            // the checkpoint after four
};
RunAndCheckpoint run_and_checkpoint_at_four(Comm& comm, const Config& cfg) {
  RunAndCheckpoint r;
  {
    Communicator cc(std::make_unique<LentComm>(comm), cfg);
    r.whole = steps(cc, 0, 6);
  }
  Communicator cc(std::make_unique<LentComm>(comm), cfg);
  steps(cc, 0, 4);
  r.saved = cc.save_state();
  return r;
}

// DDP's first iteration after a restart: its initial bucket, both tensors
// in one, under the key its rebuilt bucket ("w0") had, at another size.
void reduce_initial_bucket(Communicator& cc) {
  std::vector<float> b = gradient(cc.rank(), 4, kCounts[0] + kCounts[1], 0);
  cc.allreduce(b.data(), b.size(), DType::kFloat32, ReduceOp::kAvg, "w0");
}

// Steps 4 and 5 of a resumed run, bit for bit those of the whole run.
void expect_resumed_bit_for_bit(Communicator& cc, const RunAndCheckpoint& r) {
  const auto resumed = steps(cc, 4, 6);
  for (size_t i = 0; i < resumed.size(); ++i) {
    ASSERT_EQ(std::memcmp(r.whole[8 + i].data(), resumed[i].data(), resumed[i].size() * 4), 0)
        << "call " << 8 + i << " differs on rank " << cc.rank();
  }
}

// DDP's first iteration after a restart reduces its initial bucket under
// the key its rebuilt bucket had, at another size: the restored state is
// kept aside through that call and the rebuilt bucket resumes bit for bit.
TEST(StateCheckpoint, ARestoredStateMetAtAnotherSizeFirstResumesAtItsOwnSize) {
  const Config cfg = algo_config("dgc");
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    const RunAndCheckpoint r = run_and_checkpoint_at_four(comm, cfg);
    Communicator cc(std::make_unique<LentComm>(comm), cfg);
    ASSERT_TRUE(cc.load_state(r.saved));
    reduce_initial_bucket(cc);
    expect_resumed_bit_for_bit(cc, r);
  });
}

// The same, for a run stopped after DDP's first iteration (its initial
// bucket took the key at another size, its rebuilt bucket never came): its
// checkpoint passes the state it restored on, and the run after it resumes
// bit for bit. (Saving the initial bucket's state lost it.)
TEST(StateCheckpoint, ARunStoppedBeforeTheSizeCameBackPassesTheRestoredStateOn) {
  const Config cfg = algo_config("dgc");
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    RunAndCheckpoint r = run_and_checkpoint_at_four(comm, cfg);
    {
      Communicator cc(std::make_unique<LentComm>(comm), cfg);
      ASSERT_TRUE(cc.load_state(r.saved));
      reduce_initial_bucket(cc);  // and stopped
      r.saved = cc.save_state();
    }
    Communicator cc(std::make_unique<LentComm>(comm), cfg);
    ASSERT_TRUE(cc.load_state(r.saved));
    reduce_initial_bucket(cc);
    expect_resumed_bit_for_bit(cc, r);
  });
}

// Compressed calls of another tensor, n of them (the store's clock counts
// calls that use error-feedback state). One rank: they cost nothing to send.
void compressed_calls_of_another_tensor(Communicator& cc, int n) {
  std::vector<float> other(1000);  // min_elems: compressed
  for (int call = 0; call < n; ++call) {
    other.assign(other.size(), 0.0f);
    cc.allreduce(other.data(), other.size(), DType::kFloat32, ReduceOp::kSum, "other");
  }
}

// load_state returned true, so the caller believes the run resumed: states
// restored for tensors this run never reduces are dropped when unused for
// the store's eviction age, and that is said once at WARN, not only in an
// INFO line about evictions.
TEST(StateCheckpoint, RestoredStatesDroppedUnusedAreSaidAtWarnOnce) {
  ::testing::internal::CaptureStderr();
  testing::run_gloo_ranks(1, [&](Comm& comm) {
    Bytes saved;
    {
      Communicator cc(std::make_unique<LentComm>(comm), algo_config("dgc"));
      steps(cc, 0, 2);
      saved = cc.save_state();
    }
    Communicator cc(std::make_unique<LentComm>(comm), algo_config("dgc"));
    ASSERT_TRUE(cc.load_state(saved));
    compressed_calls_of_another_tensor(cc, 10050);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string line =
      "compcoll WARN [rank 0] checkpointed error-feedback state dropped with no call of its key "
      "and size in 10000 compressed calls: the checkpoint was restored for tensors this run does "
      "not reduce";
  const size_t first = err.find(line);
  EXPECT_NE(first, std::string::npos) << err;
  // Once, for two states dropped at different calls.
  if (first != std::string::npos) {
    EXPECT_EQ(err.find(line, first + 1), std::string::npos) << err;
  }
}

// An evaluation loop of many small allreduces (the dense route) between two
// training steps leaves the error feedback alone; a state evicted by many
// compressed calls of other tensors while it held feedback not sent yet is
// a loss, said at WARN once with the key and how much.
TEST(StateEviction, DenseRouteCallsDoNotAgeStatesAndALossIsSaidAtWarnOnce) {
  ::testing::internal::CaptureStderr();
  testing::run_gloo_ranks(1, [&](Comm& comm) {
    Communicator cc(std::make_unique<LentComm>(comm), algo_config("dgc"));
    steps(cc, 0, 1);
    const size_t held = cc.state_bytes();
    ASSERT_GT(held, 0u);
    std::vector<float> metric(1);  // below min_elems: the dense route
    for (int call = 0; call < 10050; ++call) {
      cc.allreduce(metric.data(), metric.size(), DType::kFloat32, ReduceOp::kSum, "metric");
    }
    EXPECT_EQ(cc.state_bytes(), held);
    compressed_calls_of_another_tensor(cc, 10002);
    EXPECT_LT(cc.state_bytes(), held);  // w0 and w1 went
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  // w0 goes a call before w1 (a step reduces w0 first): one WARN, for w0;
  // w1's loss is said at INFO.
  const std::string line =
      "compcoll WARN [rank 0] dropped 1 error-feedback state unused for 10000 compressed calls "
      "(calls on the dense route do not count); 1 of them held error feedback not sent yet "
      "(residual L1 norm ";
  const size_t first = err.find(line);
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_NE(err.find("; key:w0), which is lost", first), std::string::npos) << err;
  EXPECT_EQ(err.find("compcoll WARN [rank 0] dropped", first + 1), std::string::npos) << err;
}

// A checkpoint cannot keep a state keyed by a buffer's address (a NULL
// key): it says so at WARN, with how many of how many, not at INFO only.
TEST(StateCheckpoint, StatesOfNullKeysLeftOutAreSaidAtWarn) {
  ::testing::internal::CaptureStderr();
  size_t saved_entries = 99;
  testing::run_gloo_ranks(1, [&](Comm& comm) {
    Communicator cc(std::make_unique<LentComm>(comm), algo_config("dgc"));
    std::vector<float> g = gradient(0, 0, 5000, 0), h = gradient(0, 0, 5000, 1);
    cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kSum, nullptr);
    cc.allreduce(h.data(), h.size(), DType::kFloat32, ReduceOp::kSum, "kept");
    cc.save_state(&saved_entries);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(saved_entries, 1u);
  EXPECT_NE(err.find("compcoll WARN [rank 0] checkpoint leaves out 1 of 2 error-feedback states: "
                     "those of calls with a NULL key"),
            std::string::npos)
      << err;
}

// The momentum hand-over subtracts m times a mirror of the optimizer's
// buffer: ranks that pair one tensor with different keys (the PyTorch
// backend's slots follow buffers, and a fresh tensor may meet another slot
// on each rank) would subtract different mirrors, and their results (so
// their replicas) differ. Keyed by call order, the mirror is the same on
// every rank; the results are the same bits. Checked both ways, so the
// test can fail.
std::vector<std::vector<float>> handover_calls_with_keys_paired_per_rank(Comm& comm,
                                                                         bool order_keys) {
  Config cfg = algo_config("dgc");
  cfg.params.momentum_handover = true;
  Communicator cc(std::make_unique<LentComm>(comm), cfg);
  // One tensor, called "a" and "b" by turns, in another pairing on each rank.
  const char* keys[2][4] = {{"a", "b", "a", "b"}, {"a", "a", "b", "b"}};
  std::vector<std::vector<float>> out;
  for (int call = 0; call < 4; ++call) {
    std::vector<float> g = gradient(cc.rank(), call, 5000, 0);
    if (order_keys) cc.set_handover_order_key("pass#0/5000/6");
    cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kSum, keys[cc.rank()][call]);
    out.push_back(std::move(g));
  }
  return out;
}

TEST(HandoverOrderKey, RanksThatPairATensorWithDifferentKeysGetTheSameBits) {
  for (const bool order_keys : {false, true}) {
    std::vector<std::vector<float>> results[2];
    testing::run_gloo_ranks(2, [&](Comm& comm) {
      results[comm.rank()] = handover_calls_with_keys_paired_per_rank(comm, order_keys);
    });
    bool same = true;
    for (size_t call = 0; call < results[0].size(); ++call) {
      same = same && results[0][call] == results[1][call];
    }
    EXPECT_EQ(same, order_keys) << (order_keys ? "keyed by order, the ranks' results differ"
                                               : "keyed by tensor, the ranks agreed anyway: "
                                                 "the test shows nothing");
  }
}

// The order's mirrors are entries of the store: a checkpoint keeps them and
// a resumed run hands over from them, bit for bit.
TEST(HandoverOrderKey, TheMirrorsByOrderAreCheckpointed) {
  std::vector<float> uninterrupted, resumed;
  testing::run_gloo_ranks(1, [&](Comm& comm) {
    Config cfg = algo_config("dgc");
    cfg.params.momentum_handover = true;
    auto call = [&](Communicator& cc, int step) {
      std::vector<float> g = gradient(0, step, 5000, 0);
      cc.set_handover_order_key("pass#0/5000/6");
      cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kSum, "w");
      return g;
    };
    Bytes saved;
    {
      Communicator cc(std::make_unique<LentComm>(comm), cfg);
      call(cc, 0);
      saved = cc.save_state();
      uninterrupted = call(cc, 1);
    }
    Communicator cc(std::make_unique<LentComm>(comm), cfg);
    ASSERT_TRUE(cc.load_state(saved));
    resumed = call(cc, 1);
  });
  EXPECT_EQ(resumed, uninterrupted);
}

// A checkpoint whose mirror lives in the tensor's own state (written
// without order keys, as before they existed) seeds the order's mirror at
// its first call: the resumed run hands over what the uninterrupted one did.
TEST(HandoverOrderKey, AMirrorOfTheTensorsOwnSeedsTheOrdersFirst) {
  std::vector<float> uninterrupted, resumed;
  testing::run_gloo_ranks(1, [&](Comm& comm) {
    Config cfg = algo_config("dgc");
    cfg.params.momentum_handover = true;
    auto call = [&](Communicator& cc, int step, bool order_key) {
      std::vector<float> g = gradient(0, step, 5000, 0);
      if (order_key) cc.set_handover_order_key("owner0/5000/6/#0");
      cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kSum, "w");
      return g;
    };
    Bytes saved;
    {
      Communicator cc(std::make_unique<LentComm>(comm), cfg);
      call(cc, 0, false);
      saved = cc.save_state();
      uninterrupted = call(cc, 1, false);
    }
    Communicator cc(std::make_unique<LentComm>(comm), cfg);
    ASSERT_TRUE(cc.load_state(saved));
    resumed = call(cc, 1, true);
  });
  EXPECT_EQ(resumed, uninterrupted);
}

// A tensor met first as a fresh one (an order key) and then as the same
// live buffer (none: DDP's rebuilt bucket from its second use on) keeps the
// order's mirror: its results are those of calls that all name the order.
TEST(HandoverOrderKey, ATensorMetAgainWithoutAnOrderKeyKeepsItsMirror) {
  std::vector<std::vector<float>> mixed, ordered;
  testing::run_gloo_ranks(1, [&](Comm& comm) {
    Config cfg = algo_config("dgc");
    cfg.params.momentum_handover = true;
    for (const bool always : {false, true}) {
      Communicator cc(std::make_unique<LentComm>(comm), cfg);
      for (int step = 0; step < 3; ++step) {
        std::vector<float> g = gradient(0, step, 5000, 0);
        if (step == 0 || always) cc.set_handover_order_key("owner0/5000/6/#0");
        cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kSum, "w");
        (always ? ordered : mixed).push_back(std::move(g));
      }
    }
  });
  EXPECT_EQ(mixed, ordered);
}

TEST(StateCheckpoint, AnotherConfigurationOrRankIsAFreshStartNotAMismatch) {
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    Bytes saved;
    {
      Communicator cc(std::make_unique<LentComm>(comm), algo_config("dgc"));
      steps(cc, 0, 2);
      saved = cc.save_state();
    }
    Config other = algo_config("dgc");
    other.params.density = 0.02;
    Communicator cc(std::make_unique<LentComm>(comm), other);
    EXPECT_FALSE(cc.load_state(saved));
    EXPECT_EQ(cc.state_entries(), 0u);
    Communicator sbc(std::make_unique<LentComm>(comm), algo_config("sbc"));
    EXPECT_FALSE(sbc.load_state(saved));
    // Rank 0's file offered to rank 1 (and the reverse).
    if (comm.rank() == 0) {
      Communicator same(std::make_unique<LentComm>(comm), algo_config("dgc"));
      StateFile f = parse_state_file(saved);
      f.rank = 1;
      EXPECT_FALSE(same.load_state(serialize_state_file(f)));
      EXPECT_TRUE(same.load_state(saved));
    } else {
      Communicator same(std::make_unique<LentComm>(comm), algo_config("dgc"));
      EXPECT_TRUE(same.load_state(saved));
    }
    EXPECT_THROW(cc.load_state(Bytes{1, 2, 3}), Error);
    // An intact file whose residual holds a NaN (compcoll never keeps one).
    Communicator same(std::make_unique<LentComm>(comm), algo_config("dgc"));
    StateFile nan = parse_state_file(saved);
    nan.entries[0].owned->v[5] = std::nanf("");
    EXPECT_FALSE(same.load_state(serialize_state_file(nan)));
    EXPECT_EQ(same.state_entries(), 0u);
  });
}

TEST(StateCheckpoint, StateDirSavesAtDestructionAndLoadsAtCreation) {
  const std::string dir = ::testing::TempDir() + "compcoll-state-dir-test";
  std::filesystem::remove_all(dir);
  Config cfg = algo_config("dgc");
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    std::vector<std::vector<float>> whole, resumed;
    {
      Communicator cc(std::make_unique<LentComm>(comm), cfg);
      whole = steps(cc, 0, 6);
    }
    Config with_dir = cfg;
    with_dir.state_dir = dir;
    {
      Communicator cc(std::make_unique<LentComm>(comm), with_dir);  // no file yet: fresh
      resumed = steps(cc, 0, 3);
    }  // saved here
    EXPECT_TRUE(std::filesystem::exists(dir + "/compcoll-state-rank" + std::to_string(comm.rank()) +
                                        "-of2.bin"));
    {
      Communicator cc(std::make_unique<LentComm>(comm), with_dir);
      EXPECT_EQ(cc.state_entries(), 2u);
      for (auto& r : steps(cc, 3, 6)) resumed.push_back(std::move(r));
    }
    for (size_t i = 0; i < whole.size(); ++i) {
      ASSERT_EQ(std::memcmp(whole[i].data(), resumed[i].data(), whole[i].size() * 4), 0) << i;
    }
  });
  // A malformed checkpoint on one rank fails every rank, naming the file.
  {
    std::ofstream(dir + "/compcoll-state-rank1-of2.bin", std::ios::trunc) << "garbage";
  }
  Config with_dir = cfg;
  with_dir.state_dir = dir;
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    try {
      Communicator cc(std::make_unique<LentComm>(comm), with_dir);
      ADD_FAILURE() << "rank " << comm.rank() << " accepted a malformed checkpoint";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      const std::string want = comm.rank() == 1 ? "compcoll-state-rank1-of2.bin" : "another rank";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  });
  // A directory where rank 1's file should be: the same, named as such (it
  // escaped as a stream error once, and rank 0 was left waiting).
  std::filesystem::remove(dir + "/compcoll-state-rank1-of2.bin");
  std::filesystem::create_directories(dir + "/compcoll-state-rank1-of2.bin");
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    try {
      Communicator cc(std::make_unique<LentComm>(comm), with_dir);
      ADD_FAILURE() << "rank " << comm.rank() << " accepted a directory as a checkpoint";
    } catch (const Error& e) {
      const std::string want = comm.rank() == 1 ? "compcoll-state-rank1-of2.bin is a directory"
                                                : "another rank";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  });
  std::filesystem::remove_all(dir);
}

// A fresh COMPCOLL_STATE_DIR under the test's temp dir, into which a
// 2-rank dgc run of `calls` steps has saved; cfg is that run's.
std::string saved_state_dir(const std::string& name, Config& cfg, int calls) {
  const std::string dir = ::testing::TempDir() + name;
  std::filesystem::remove_all(dir);
  cfg = algo_config("dgc");
  cfg.state_dir = dir;
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    Communicator cc(std::make_unique<LentComm>(comm), cfg);
    steps(cc, 0, calls);
  });
  return dir;
}

// Files of one run's end have one clock. A rank that failed kept its older
// file while the other saved: restoring both would give each rank a
// residual of another step (replicas drift apart under a momentum
// hand-over), so every rank starts fresh, and says why.
TEST(StateCheckpoint, CheckpointsSavedAtDifferentPointsAreNotRestored) {
  Config cfg;
  const std::string dir = saved_state_dir("compcoll-state-dir-clocks", cfg, 3);
  const std::string rank1 = dir + "/compcoll-state-rank1-of2.bin";
  StateFile f = parse_state_file(read_binary_file(rank1));
  f.clock += 2;  // as if rank 1 had saved two calls later
  ASSERT_TRUE(write_binary_file_atomically(rank1, serialize_state_file(f)));
  const Bytes rank1_saved = read_binary_file(rank1);
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    Communicator cc(std::make_unique<LentComm>(comm), cfg);
    EXPECT_EQ(cc.state_entries(), 0u) << "rank " << comm.rank();
  });
  // Not replaced by this run's saves: moved aside, the user's to judge.
  EXPECT_EQ(read_binary_file(rank1 + ".unused"), rank1_saved);
  EXPECT_TRUE(std::filesystem::exists(dir + "/compcoll-state-rank0-of2.bin.unused"));
  std::filesystem::remove_all(dir);
}

// A checkpoint is restored once: while the run that restored it goes on,
// the file is <file>.restored, so a run that fails before saving (a killed
// peer: a failed communicator does not save) leaves nothing older than the
// script's own newer model checkpoint for the next start to restore.
TEST(StateCheckpoint, ACheckpointIsRestoredOnce) {
  Config cfg;
  const std::string dir = saved_state_dir("compcoll-state-dir-once", cfg, 2);
  const std::string rank0 = dir + "/compcoll-state-rank0-of2.bin";
  const Bytes saved = read_binary_file(rank0);
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    Communicator cc(std::make_unique<LentComm>(comm), cfg);
    EXPECT_EQ(cc.state_entries(), 2u);
    comm.barrier();
    // Absent while the run goes on: however it ends without saving,
    // nothing is left to restore.
    EXPECT_FALSE(std::filesystem::exists(rank0));
    EXPECT_EQ(read_binary_file(rank0 + ".restored"), saved);
    comm.barrier();
    steps(cc, 2, 3);
  });
  // Its own save at the end.
  EXPECT_TRUE(std::filesystem::exists(rank0));
  EXPECT_NE(read_binary_file(rank0), saved);
  // Had it ended without saving (removed here, as a failed run leaves the
  // directory), the next start is fresh, and says why at WARN.
  std::filesystem::remove(rank0);
  std::filesystem::remove(dir + "/compcoll-state-rank1-of2.bin");
  ::testing::internal::CaptureStderr();
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    Communicator cc(std::make_unique<LentComm>(comm), cfg);
    EXPECT_EQ(cc.state_entries(), 0u);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("compcoll WARN [rank 0] COMPCOLL_STATE_DIR: no checkpoint " + rank0 +
                     ": the run that restored " + rank0 + ".restored ended without saving"),
            std::string::npos)
      << err;
  std::filesystem::remove_all(dir);
}

// Every rank restores or none does: one rank's file gone (a wiped local
// disk) sends every rank fresh, and the others' good checkpoints are moved
// to <file>.unused with a WARN, not silently replaced by this run's saves.
TEST(StateCheckpoint, OneRanksMissingCheckpointCostsTheOthersNothing) {
  Config cfg;
  const std::string dir = saved_state_dir("compcoll-state-dir-missing", cfg, 3);
  const std::string rank0 = dir + "/compcoll-state-rank0-of2.bin";
  const Bytes rank0_saved = read_binary_file(rank0);
  std::filesystem::remove(dir + "/compcoll-state-rank1-of2.bin");
  ::testing::internal::CaptureStderr();
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    Communicator cc(std::make_unique<LentComm>(comm), cfg);
    EXPECT_EQ(cc.state_entries(), 0u) << "rank " << comm.rank();
    steps(cc, 0, 1);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(read_binary_file(rank0 + ".unused"), rank0_saved);
  EXPECT_NE(read_binary_file(rank0), rank0_saved);  // this run's own save
  EXPECT_NE(err.find("compcoll WARN [rank 0] COMPCOLL_STATE_DIR: checkpoint " + rank0 +
                     " not used (another rank has no usable checkpoint"),
            std::string::npos)
      << err;
  std::filesystem::remove_all(dir);
}

TEST(StateCheckpoint, AStateDirThatCannotBeWrittenFailsEveryRankAtCreationNotAtExit) {
  const std::string base = ::testing::TempDir() + "compcoll-state-dir-unusable";
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base);
  { std::ofstream(base + "/a-file") << "not a directory"; }
  const auto create = [&](Comm& comm, const std::string& dir) {
    Config cfg = algo_config("dgc");
    cfg.state_dir = dir;
    return Communicator(std::make_unique<LentComm>(comm), cfg);
  };
  testing::run_gloo_ranks(2, [&](Comm& comm) {
    // Rank 1's directory would lie inside a regular file; rank 0's is fine.
    const std::string dir = comm.rank() == 1 ? base + "/a-file/state" : base + "/good";
    try {
      create(comm, dir);
      ADD_FAILURE() << "rank " << comm.rank() << " accepted an unusable COMPCOLL_STATE_DIR";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      const std::string want = comm.rank() == 1
                                   ? "COMPCOLL_STATE_DIR " + dir + ": cannot create the directory"
                                   : "another rank cannot write to its directory";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    // The failed creation released its file: a good directory works at once.
    Communicator cc = create(comm, base + "/good");
    EXPECT_EQ(cc.state_entries(), 0u);
    steps(cc, 0, 1);
  });
  EXPECT_TRUE(std::filesystem::exists(base + "/good/compcoll-state-rank0-of2.bin"));
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace compcoll
