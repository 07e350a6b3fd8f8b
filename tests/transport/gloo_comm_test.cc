// GlooComm collectives, ranks as threads over real loopback sockets,
// parametrised over world size. Exact results are compared bit for bit.
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gtest/gtest.h>

#include <string>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "compcoll/error.h"
#include "compression/half.h"
#include "tests/support/gloo_harness.h"
#include "transport/gloo_comm.h"

namespace compcoll {
namespace {

using testing::run_gloo_ranks;

uint8_t byte_at(int rank, size_t i, int salt) {
  return static_cast<uint8_t>(rank * 131 + i * 7 + salt * 17 + (i >> 8));
}

// Rank r's allgatherv payload size in round `salt`: rank 0 sends nothing,
// rank 1 over a MiB, the rest small (some zero).
size_t gather_size(int rank, int salt) {
  if (rank == 0) return 0;
  if (rank == 1 && salt == 0) return (1u << 20) + 3;
  return static_cast<size_t>((rank * 37 + salt * 11) % 100);
}

Bytes gather_payload(int rank, int salt) {
  Bytes b(gather_size(rank, salt));
  for (size_t i = 0; i < b.size(); ++i) b[i] = byte_at(rank, i, salt);
  return b;
}

void expect_gathered(const Gathered& g, int world, int salt) {
  ASSERT_EQ(g.parts(), world);
  for (int r = 0; r < world; ++r) {
    const Bytes want = gather_payload(r, salt);
    const auto got = g.part(r);
    ASSERT_EQ(got.size(), want.size()) << "part " << r;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << "part " << r;
  }
}

// What rank `from` sends to rank `to` in alltoallv round `salt`.
Bytes a2a_payload(int from, int to, int salt) {
  size_t n = static_cast<size_t>((from * 7 + to * 13 + salt) % 50);
  if (from == 0 && to == 1 && salt == 0) n = 300 * 1024;
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = byte_at(from * 8 + to, i, salt);
  return b;
}

class GlooCommTest : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }
};

TEST_P(GlooCommTest, AllgathervMixedSizesIncludingZeroAndLarge) {
  run_gloo_ranks(world(), [&](Comm& comm) {
    EXPECT_EQ(comm.size(), world());
    expect_gathered(comm.allgatherv(gather_payload(comm.rank(), 0), kUnboundedPart), world(), 0);
    // Everyone empty.
    const Gathered empty = comm.allgatherv({}, kUnboundedPart);
    ASSERT_EQ(empty.parts(), world());
    EXPECT_TRUE(empty.data.empty());
  });
}

// allgatherv sends a part with its size header in one message when it fits
// the bound the previous call set (about that call's largest part), and in
// a second round when it does not: a sequence whose parts grow past the
// bound, on some ranks only, shrink, vanish and come back.
TEST_P(GlooCommTest, AllgathervPartsAboveTheEagerBoundFollowInASecondRound) {
  run_gloo_ranks(world(), [&](Comm& comm) {
    const int me = comm.rank();
    const size_t steps[] = {100, 100, 5000, 90, 0, 70000, 64, 3, 200000, 200000};
    for (size_t s = 0; s < std::size(steps); ++s) {
      // Odd ranks send twice the step (past the bound where the step
      // grew), even ranks the step itself; rank 0 nothing every third call.
      const size_t size = me == 0 && s % 3 == 0 ? 0 : steps[s] * (me % 2 ? 2 : 1);
      Bytes mine(size);
      for (size_t i = 0; i < size; ++i) mine[i] = byte_at(me, i, int(s));
      const uint64_t before = comm.bytes_sent();
      const Gathered g = comm.allgatherv(mine, kUnboundedPart);
      EXPECT_EQ(comm.bytes_sent() - before, uint64_t(comm.size() - 1) * (8 + size)) << s;
      ASSERT_EQ(g.parts(), comm.size());
      for (int r = 0; r < comm.size(); ++r) {
        const size_t want = r == 0 && s % 3 == 0 ? 0 : steps[s] * (r % 2 ? 2 : 1);
        const auto got = g.part(r);
        ASSERT_EQ(got.size(), want) << "call " << s << " part " << r;
        for (size_t i = 0; i < want; ++i) {
          ASSERT_EQ(got[i], byte_at(r, i, int(s))) << "call " << s << " part " << r << " byte " << i;
        }
      }
    }
  });
}

// allgatherv_overlapping runs its work once, during the call, and a throw
// from it comes out only after the exchange: every rank completes the call
// and the communicator stays usable.
TEST_P(GlooCommTest, AllgathervOverlappingRunsItsWorkOnceAndKeepsTheRanksInStep) {
  run_gloo_ranks(world(), [&](Comm& comm) {
    const int me = comm.rank();
    for (int salt = 0; salt < 4; ++salt) {
      int ran = 0;
      const Gathered g =
          comm.allgatherv_overlapping(gather_payload(me, salt), kUnboundedPart, [&] { ++ran; });
      EXPECT_EQ(ran, 1);
      expect_gathered(g, comm.size(), salt);
    }
    auto failing_on_rank_0 = [&] {
      comm.allgatherv_overlapping(gather_payload(me, 9), kUnboundedPart, [&] {
        if (me == 0) throw std::runtime_error("work failed");
      });
    };
    if (me == 0) {
      EXPECT_THROW(failing_on_rank_0(), std::runtime_error);
    } else {
      EXPECT_NO_THROW(failing_on_rank_0());
    }
    expect_gathered(comm.allgatherv(gather_payload(me, 10), kUnboundedPart), comm.size(), 10);
  });
}

// alltoallv's bound is per pair (the part between the two last call): the
// part from i to j grows past it on some pairs only, shrinks and vanishes.
TEST_P(GlooCommTest, AlltoallvPartsAboveTheEagerBoundFollowInASecondRound) {
  run_gloo_ranks(world(), [&](Comm& comm) {
    const int me = comm.rank();
    const int n = comm.size();
    const size_t steps[] = {100, 100, 5000, 90, 0, 70000, 64, 3, 200000, 200000};
    auto size_of = [&](int from, int to, size_t s) -> size_t {
      if ((from + to + int(s)) % 4 == 0) return 0;
      return steps[s] * size_t(1 + (from * 3 + to) % 3);
    };
    for (size_t s = 0; s < std::size(steps); ++s) {
      std::vector<Bytes> send(static_cast<size_t>(n));
      uint64_t expected_sent = 0;
      for (int j = 0; j < n; ++j) {
        Bytes& b = send[static_cast<size_t>(j)];
        b.resize(size_of(me, j, s));
        for (size_t i = 0; i < b.size(); ++i) b[i] = byte_at(me * 8 + j, i, int(s));
        if (j != me) expected_sent += 8 + b.size();
      }
      const uint64_t before = comm.bytes_sent();
      const std::vector<Bytes> got = comm.alltoallv(send, kUnboundedPart);
      EXPECT_EQ(comm.bytes_sent() - before, expected_sent) << s;
      for (int i = 0; i < n; ++i) {
        const Bytes& g = got[static_cast<size_t>(i)];
        ASSERT_EQ(g.size(), size_of(i, me, s)) << "call " << s << " from " << i;
        for (size_t k = 0; k < g.size(); ++k) {
          ASSERT_EQ(g[k], byte_at(i * 8 + me, k, int(s))) << "call " << s << " from " << i;
        }
      }
    }
  });
}

TEST_P(GlooCommTest, AlltoallvMixedSizesIncludingZero) {
  run_gloo_ranks(world(), [&](Comm& comm) {
    for (int salt = 0; salt < 3; ++salt) {
      std::vector<Bytes> send;
      for (int j = 0; j < comm.size(); ++j) send.push_back(a2a_payload(comm.rank(), j, salt));
      const std::vector<Bytes> got = comm.alltoallv(send, kUnboundedPart);
      ASSERT_EQ(got.size(), static_cast<size_t>(world()));
      for (int i = 0; i < world(); ++i) {
        EXPECT_EQ(got[static_cast<size_t>(i)], a2a_payload(i, comm.rank(), salt))
            << "from rank " << i << " salt " << salt;
      }
    }
  });
}

TEST_P(GlooCommTest, AllreduceFloat32SumIsBitExactWithGloo) {
  run_gloo_ranks(world(), [&](Comm& comm) {
    auto& gc = dynamic_cast<GlooComm&>(comm);
    // Counts: empty, one, not a multiple of the world, several 1 MiB segments.
    for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{300001}}) {
      std::vector<float> in(count);
      uint32_t s = 12345u + static_cast<uint32_t>(comm.rank()) * 7919u;
      for (auto& x : in) {  // wide dynamic range so summation order matters
        s = s * 1664525u + 1013904223u;
        x = std::ldexp(static_cast<float>(s >> 8) / 16777216.0f - 0.5f,
                       static_cast<int>(s % 24) - 12);
      }
      std::vector<float> ours = in, theirs = in;
      comm.allreduce(ours.data(), count, DType::kFloat32, ReduceOp::kSum);
      if (count > 0) {
        gloo::AllreduceOptions opts(gc.gloo_context());
        opts.setOutput(theirs.data(), count);
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        opts.setTag(gc.reserve_tag());
        gloo::allreduce(opts);
      }
      ASSERT_TRUE(count == 0 || std::memcmp(ours.data(), theirs.data(), count * sizeof(float)) == 0)
          << "count " << count;
    }
  });
}

// Inputs that make every dtype/op result exact whatever the reduction order:
// small integers for SUM/MIN/MAX, factors 1, 2, -1 for PROD (integers wrap,
// which is exact too).
double input_value(ReduceOp op, DType dtype, int rank, size_t i) {
  const bool unsigned_type = dtype == DType::kUInt8;
  if (op == ReduceOp::kProd) {
    const int k = static_cast<int>((static_cast<size_t>(rank) * 5 + i * 3) % 3);
    return k == 0 ? 1.0 : k == 1 ? 2.0 : (unsigned_type ? 3.0 : -1.0);
  }
  const int v = static_cast<int>((static_cast<size_t>(rank) * 31 + i * 7) % 11);
  return unsigned_type ? v : v - 5;
}

template <typename T>
void run_dtype_case(Comm& comm, DType dtype, ReduceOp op, size_t count,
                    double (*to_double)(T), T (*from_double)(double)) {
  std::vector<T> buf(count);
  for (size_t i = 0; i < count; ++i) buf[i] = from_double(input_value(op, dtype, comm.rank(), i));
  comm.allreduce(buf.data(), count, dtype, op);
  for (size_t i = 0; i < count; ++i) {
    // Fold in the storage type, as the reduction does (integers wrap).
    T acc = from_double(input_value(op, dtype, 0, i));
    for (int r = 1; r < comm.size(); ++r) {
      const T x = from_double(input_value(op, dtype, r, i));
      const double a = to_double(acc), b = to_double(x);
      switch (op) {
        case ReduceOp::kSum: acc = from_double(a + b); break;
        case ReduceOp::kProd: acc = from_double(a * b); break;
        case ReduceOp::kMin: acc = from_double(std::min(a, b)); break;
        case ReduceOp::kMax: acc = from_double(std::max(a, b)); break;
        default: FAIL();
      }
    }
    ASSERT_EQ(0, std::memcmp(&acc, &buf[i], sizeof(T)))
        << dtype_name(dtype) << " " << reduce_op_name(op) << " index " << i
        << ": want " << to_double(acc) << " got " << to_double(buf[i]);
  }
}

// Integer conversions wrap like the reduction does.
template <typename T>
T wrap_from_double(double d) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<int64_t>(d)));
}
template <typename T>
double plain_to_double(T v) { return static_cast<double>(v); }
template <typename T>
T float_from_double(double d) { return static_cast<T>(d); }
double half_to_double(uint16_t h) { return half_to_float(h); }
uint16_t half_from_double(double d) { return float_to_half(static_cast<float>(d)); }
double bf16_to_double(uint16_t h) { return bf16_to_float(h); }
uint16_t bf16_from_double(double d) { return float_to_bf16(static_cast<float>(d)); }

TEST_P(GlooCommTest, AllreduceEveryDtypeAndOp) {
  run_gloo_ranks(world(), [&](Comm& comm) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd}) {
      for (size_t count : {size_t{1}, size_t{1000} + static_cast<size_t>(comm.size())}) {
        run_dtype_case<float>(comm, DType::kFloat32, op, count, plain_to_double<float>, float_from_double<float>);
        run_dtype_case<double>(comm, DType::kFloat64, op, count, plain_to_double<double>, float_from_double<double>);
        run_dtype_case<uint16_t>(comm, DType::kFloat16, op, count, half_to_double, half_from_double);
        run_dtype_case<uint16_t>(comm, DType::kBFloat16, op, count, bf16_to_double, bf16_from_double);
        run_dtype_case<int32_t>(comm, DType::kInt32, op, count, plain_to_double<int32_t>, wrap_from_double<int32_t>);
        run_dtype_case<int64_t>(comm, DType::kInt64, op, count, plain_to_double<int64_t>, wrap_from_double<int64_t>);
        run_dtype_case<uint8_t>(comm, DType::kUInt8, op, count, plain_to_double<uint8_t>, wrap_from_double<uint8_t>);
        run_dtype_case<int8_t>(comm, DType::kInt8, op, count, plain_to_double<int8_t>, wrap_from_double<int8_t>);
      }
    }
  });
}

TEST_P(GlooCommTest, AllreduceMinMaxPropagateNaNAndAvgIsRejected) {
  run_gloo_ranks(world(), [&](Comm& comm) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      std::vector<float> v = {1.0f, static_cast<float>(comm.rank())};
      if (comm.rank() == comm.size() - 1) v[0] = nan;
      comm.allreduce(v.data(), v.size(), DType::kFloat32, op);
      EXPECT_TRUE(std::isnan(v[0])) << reduce_op_name(op);
      EXPECT_EQ(v[1], op == ReduceOp::kMin ? 0.0f : static_cast<float>(comm.size() - 1));
    }
    float x = 1.0f;
    try {
      comm.allreduce(&x, 1, DType::kFloat32, ReduceOp::kAvg);
      ADD_FAILURE() << "kAvg accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    }
    comm.barrier();  // an argument error leaves the communicator usable
  });
}

TEST_P(GlooCommTest, BroadcastFromEachRoot) {
  run_gloo_ranks(world(), [&](Comm& comm) {
    for (int root = 0; root < comm.size(); ++root) {
      const size_t n = root == comm.size() - 1 ? (1u << 20) + 5 : static_cast<size_t>(root) * 1000 + 17;
      Bytes buf(n, 0xEE);
      if (comm.rank() == root) {
        for (size_t i = 0; i < n; ++i) buf[i] = byte_at(root, i, 9);
      }
      comm.broadcast(buf.data(), n, root);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(buf[i], byte_at(root, i, 9)) << "root " << root << " index " << i;
      }
      comm.broadcast(nullptr, 0, root);  // empty broadcast is legal
    }
  });
}

TEST_P(GlooCommTest, BarrierSeparatesRounds) {
  std::atomic<int> arrived{0};
  run_gloo_ranks(world(), [&](Comm& comm) {
    for (int round = 1; round <= 20; ++round) {
      if ((comm.rank() + round) % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      arrived.fetch_add(1);
      comm.barrier();
      // Nobody may leave round k before everyone has arrived in it.
      ASSERT_GE(arrived.load(), round * comm.size()) << "round " << round;
      comm.barrier();
    }
  });
}

// Ranks run at different speeds through many back-to-back calls of every
// kind; each payload carries its call index, so a message delivered to the
// wrong call would show.
TEST_P(GlooCommTest, BackToBackCallsNeverMix) {
  run_gloo_ranks(world(), [&](Comm& comm) {
    const int me = comm.rank();
    const int n = comm.size();
    for (int it = 0; it < 60; ++it) {
      if (me == it % n) std::this_thread::yield();
      if (me == 0 && it % 7 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const int salt = 1 + it;
      expect_gathered(comm.allgatherv(gather_payload(me, salt), kUnboundedPart), n, salt);

      std::vector<Bytes> send;
      for (int j = 0; j < n; ++j) send.push_back(a2a_payload(me, j, salt));
      const auto got = comm.alltoallv(send, kUnboundedPart);
      for (int i = 0; i < n; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], a2a_payload(i, me, salt));

      std::vector<int64_t> v(17, int64_t{it} * 1000 + me);
      comm.allreduce(v.data(), v.size(), DType::kInt64, ReduceOp::kSum);
      ASSERT_EQ(v[16], int64_t{it} * 1000 * n + int64_t{n} * (n - 1) / 2);

      int64_t b = me == it % n ? it : -1;
      comm.broadcast(&b, sizeof(b), it % n);
      ASSERT_EQ(b, it);
      if (it % 5 == 0) comm.barrier();
    }
  });
}

TEST_P(GlooCommTest, BytesSentCountsPayloadsAndRingTraffic) {
  run_gloo_ranks(world(), [&](Comm& comm) {
    const uint64_t p = static_cast<uint64_t>(comm.size());
    uint64_t before = comm.bytes_sent();
    const Bytes mine = gather_payload(comm.rank(), 3);
    comm.allgatherv(mine, kUnboundedPart);
    EXPECT_EQ(comm.bytes_sent() - before, (p - 1) * (8 + mine.size()));

    for (size_t count : {size_t{1}, size_t{1001}, size_t{700001}}) {
      std::vector<float> v(count, 1.0f);
      before = comm.bytes_sent();
      comm.allreduce(v.data(), count, DType::kFloat32, ReduceOp::kSum);
      const uint64_t delta = comm.bytes_sent() - before;
      EXPECT_LE(delta, 2 * 4 * count);
      // Over all ranks a ring moves exactly 2 (P - 1) N bytes.
      const Gathered all = comm.allgatherv(
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&delta), sizeof(delta)), kUnboundedPart);
      uint64_t sum = 0;
      for (int r = 0; r < comm.size(); ++r) {
        uint64_t d = 0;
        std::memcpy(&d, all.part(r).data(), sizeof(d));
        sum += d;
      }
      EXPECT_EQ(sum, 2 * (p - 1) * 4 * count) << "count " << count;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(World, GlooCommTest, ::testing::Values(1, 2, 3, 4, 7, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

// Per-rank ring traffic for an input whose chunks are uneven, as measured
// against Debian's libgloo (write-syscall bytes from /proc/self/io minus
// Gloo's 48-byte message preambles): 3 ranks, 10 MiB + 4 bytes.
TEST(GlooCommBytes, AllreduceBytesMatchGloosRing) {
  std::vector<uint64_t> sent(3);
  run_gloo_ranks(3, [&](Comm& comm) {
    std::vector<uint8_t> v((10u << 20) + 4, 1);
    comm.allreduce(v.data(), v.size(), DType::kUInt8, ReduceOp::kMax);
    sent[static_cast<size_t>(comm.rank())] = comm.bytes_sent();
  });
  EXPECT_EQ(sent, (std::vector<uint64_t>{13981020, 13981016, 13981020}));
}

TEST(GlooCommArgs, BadArgumentsDoNotBreakTheCommunicator) {
  run_gloo_ranks(2, [](Comm& comm) {
    int x = 0;
    EXPECT_THROW(
        {
          try {
            comm.broadcast(&x, sizeof(x), 2);
          } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
            EXPECT_NE(std::string(e.what()).find("root 2"), std::string::npos) << e.what();
            throw;
          }
        },
        Error);
    EXPECT_THROW(comm.alltoallv(std::vector<Bytes>(3), kUnboundedPart), Error);
    EXPECT_THROW(comm.allreduce(nullptr, 4, DType::kInt32, ReduceOp::kSum), Error);
    comm.barrier();
    x = comm.rank() + 1;
    comm.allreduce(&x, 1, DType::kInt32, ReduceOp::kSum);
    EXPECT_EQ(x, 3);
  });
}

}  // namespace
}  // namespace compcoll

namespace compcoll {
namespace {

// A peer announcing more than the receiver's max_part (a hostile or
// corrupted peer: here rank 2, which calls without a bound) is refused after
// the size round, naming the peer and both sizes; the communicator is then
// broken on every rank, and nobody waits for the timeout. Ranks 0 and 1 both
// refuse; whichever refuses first closes its connections, so the other may
// instead fail on that closed connection (its message then says the peer's
// connection went down) before it gets to its own check.
void expect_oversized_part_refused(bool use_alltoallv) {
  constexpr size_t kBound = 1000;
  constexpr size_t kHostile = size_t{1} << 20;
  std::vector<std::string> errors(3);
  run_gloo_ranks(3, [&](Comm& comm) {
    const int me = comm.rank();
    const size_t bytes = me == 2 ? kHostile : 10;
    const size_t bound = me == 2 ? kUnboundedPart : kBound;
    try {
      if (use_alltoallv) {
        comm.alltoallv(std::vector<Bytes>(3, Bytes(bytes, 7)), bound);
      } else {
        comm.allgatherv(Bytes(bytes, 7), bound);
      }
      ADD_FAILURE() << "rank " << me << " completed a call with an oversized part";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kTransport) << e.what();
      errors[static_cast<size_t>(me)] = e.what();
    }
    try {
      comm.barrier();
      ADD_FAILURE() << "rank " << me << ": the communicator is still usable";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kTransport) << e.what();
    }
  });
  const std::string refusal = "rank 2 announced a 1048576-byte payload, more than the 1000 bytes";
  int refused = 0;
  for (int r : {0, 1}) {
    const std::string& e = errors[static_cast<size_t>(r)];
    const bool named = e.find(refusal) != std::string::npos;
    refused += named;
    EXPECT_TRUE(named || e.find("connection") != std::string::npos) << "rank " << r << ": " << e;
  }
  EXPECT_GE(refused, 1) << "no rank named the oversized announcement: " << errors[0] << " | "
                        << errors[1];
}

TEST(GlooCommLimits, AllgathervRefusesAPartAboveTheBound) { expect_oversized_part_refused(false); }
TEST(GlooCommLimits, AlltoallvRefusesAPartAboveTheBound) { expect_oversized_part_refused(true); }

TEST(GlooCommLimits, OwnPartAboveTheBoundIsACallerBugAndBreaksNothing) {
  run_gloo_ranks(2, [](Comm& comm) {
    try {
      comm.allgatherv(Bytes(11, 1), 10);
      ADD_FAILURE() << "accepted an own part above the bound";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal) << e.what();
    }
    const Gathered g = comm.allgatherv(Bytes(10, 1), 10);  // exactly the bound is fine
    EXPECT_EQ(g.offsets.back(), 20u);
  });
}

}  // namespace
}  // namespace compcoll
