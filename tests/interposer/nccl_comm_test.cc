// NcclComm (transport/nccl) over the stand-in NCCL and CUDA driver: every
// collective of the Comm seam across world sizes and payload sizes (0 and
// uneven included), argument errors, the timeout that aborts, and the
// compressed algorithms running through a Communicator over NCCL.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <numeric>
#include <thread>

#include "collectives/lent_comm.h"
#include "compcoll/error.h"
#include "plugin/communicator.h"
#include "tests/interposer/standin.h"

namespace compcoll {
namespace {

using std::chrono::milliseconds;
using testing::run_nccl_ranks;

constexpr milliseconds kTimeout{20000};

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

Bytes payload_of(int rank, size_t n) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(rank * 31 + i * 7);
  return b;
}

TEST(NcclComm, AllgathervDeliversEveryPayloadInRankOrder) {
  for (int R : {1, 2, 3, 4, 7}) {
    // Rank r sends r * 1000 + 3 bytes, except rank 1 (empty).
    auto size_of = [](int r) -> size_t { return r == 1 ? 0 : size_t(r) * 1000 + 3; };
    expect_no_errors(run_nccl_ranks(R, kTimeout, [&](nccl::NcclComm& c) {
      ASSERT_EQ(c.size(), R);
      const Gathered g = c.allgatherv(payload_of(c.rank(), size_of(c.rank())), kUnboundedPart);
      ASSERT_EQ(g.parts(), R);
      for (int r = 0; r < R; ++r) {
        const auto part = g.part(r);
        ASSERT_EQ(part.size(), size_of(r));
        EXPECT_EQ(Bytes(part.begin(), part.end()), payload_of(r, size_of(r))) << "part " << r;
      }
      const Gathered empty = c.allgatherv({}, kUnboundedPart);
      EXPECT_EQ(empty.data.size(), 0u);
      EXPECT_EQ(empty.parts(), R);
    }));
  }
}

TEST(NcclComm, AlltoallvRoutesEachPayloadToItsPeer) {
  for (int R : {1, 2, 3, 5}) {
    expect_no_errors(run_nccl_ranks(R, kTimeout, [&](nccl::NcclComm& c) {
      std::vector<Bytes> send(R);
      for (int p = 0; p < R; ++p) send[p] = payload_of(c.rank() * 10 + p, size_t((c.rank() + 2 * p) % 4) * 333);
      const std::vector<Bytes> got = c.alltoallv(send, kUnboundedPart);
      ASSERT_EQ(got.size(), size_t(R));
      for (int p = 0; p < R; ++p) {
        EXPECT_EQ(got[p], payload_of(p * 10 + c.rank(), size_t((p + 2 * c.rank()) % 4) * 333)) << "from " << p;
      }
    }));
  }
}

TEST(NcclComm, AllreduceBroadcastAndBarrierAreExact) {
  for (int R : {1, 2, 3, 4}) {
    expect_no_errors(run_nccl_ranks(R, kTimeout, [&](nccl::NcclComm& c) {
      std::vector<int32_t> ints(1001);
      for (size_t i = 0; i < ints.size(); ++i) ints[i] = int32_t(i) * (c.rank() + 1);
      c.allreduce(ints.data(), ints.size(), DType::kInt32, ReduceOp::kSum);
      for (size_t i = 0; i < ints.size(); ++i) ASSERT_EQ(ints[i], int32_t(i) * R * (R + 1) / 2);
      std::vector<float> f(17, float(c.rank()));
      c.allreduce(f.data(), f.size(), DType::kFloat32, ReduceOp::kMax);
      EXPECT_EQ(f[16], float(R - 1));
      c.allreduce(nullptr, 0, DType::kFloat32, ReduceOp::kSum);  // empty is legal
      std::vector<uint8_t> b(77, uint8_t(c.rank()));
      c.broadcast(b.data(), b.size(), R - 1);
      EXPECT_EQ(b[76], uint8_t(R - 1));
      c.barrier();
      EXPECT_GT(c.bytes_sent() + (R == 1), 0u);
    }));
  }
}

TEST(NcclComm, ArgumentErrorsLeaveTheCommunicatorUsable) {
  expect_no_errors(run_nccl_ranks(2, kTimeout, [&](nccl::NcclComm& c) {
    auto kind_of = [](auto&& f) {
      try {
        f();
      } catch (const Error& e) {
        return e.kind();
      }
      return ErrorKind::kInternal;
    };
    float x = 1.0f;
    EXPECT_EQ(kind_of([&] { c.alltoallv(std::vector<Bytes>(3), kUnboundedPart); }), ErrorKind::kInvalidArgument);
    EXPECT_EQ(kind_of([&] { c.broadcast(&x, 4, 2); }), ErrorKind::kInvalidArgument);
    EXPECT_EQ(kind_of([&] { c.allreduce(&x, 1, DType::kFloat32, ReduceOp::kAvg); }), ErrorKind::kInvalidArgument);
    c.allreduce(&x, 1, DType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(x, 2.0f);
    EXPECT_FALSE(c.broken());
  }));
}

TEST(NcclComm, APartAboveTheBoundIsRefusedAndAborts) {
  // Rank 1 (hostile: no bound) announces 5000 bytes; rank 0 allows 100 per
  // part. Rank 0 refuses after the size round, naming rank 1, and aborts.
  // What rank 1 sees is the NCCL library's business (real NCCL: its pending
  // collective fails at its timeout; the stand-in releases it when the peer
  // aborts), so only that it returns is checked there.
  for (bool alltoall : {false, true}) {
    const auto errors = run_nccl_ranks(2, milliseconds(2000), [&](nccl::NcclComm& c) {
      const size_t bytes = c.rank() == 1 ? 5000 : 10;
      const size_t bound = c.rank() == 1 ? kUnboundedPart : 100;
      try {
        if (alltoall) {
          c.alltoallv(std::vector<Bytes>(2, payload_of(c.rank(), bytes)), bound);
        } else {
          c.allgatherv(payload_of(c.rank(), bytes), bound);
        }
        if (c.rank() == 0) ADD_FAILURE() << "rank 0 accepted an oversized part";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kTransport) << e.what();
        if (c.rank() == 0) {
          EXPECT_NE(std::string(e.what()).find("rank 1 announced a 5000-byte payload, more than the 100"),
                    std::string::npos)
              << e.what();
          EXPECT_TRUE(c.aborted());
        }
      }
    });
    expect_no_errors(errors);
  }
}

// A peer's abort ends this rank's pending NCCL work early: its stream
// drains, but over buffers that hold no result. That is a failure NCCL
// reports asynchronously, never a call that returns (it returned the
// buffers as they were, and a compressed allreduce summed them).
TEST(NcclComm, APeersAbortFailsTheCallInsteadOfReturningUnfilledBuffers) {
  const auto errors = run_nccl_ranks(2, milliseconds(5000), [&](nccl::NcclComm& c) {
    // Rank 0 refuses rank 1's oversized part and aborts; rank 1 waits for
    // the payloads that never come.
    const size_t bytes = c.rank() == 1 ? 5000 : 10;
    const size_t bound = c.rank() == 1 ? kUnboundedPart : 100;
    try {
      c.allgatherv(payload_of(c.rank(), bytes), bound);
      ADD_FAILURE() << "rank " << c.rank() << " returned although rank 0 aborted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kTransport) << e.what();
      if (c.rank() == 1) {
        EXPECT_NE(std::string(e.what()).find("asynchronous NCCL error"), std::string::npos)
            << e.what();
      }
    }
  });
  expect_no_errors(errors);
}

TEST(NcclComm, AMissingPeerTimesOutAbortsAndBreaksTheCommunicator) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = run_nccl_ranks(2, milliseconds(300), [&](nccl::NcclComm& c) {
    if (c.rank() == 1) return;  // never joins the collective
    try {
      c.allgatherv(payload_of(0, 10), kUnboundedPart);
      ADD_FAILURE() << "allgatherv returned without its peer";
    } catch (const TimeoutError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kTransport);
      EXPECT_EQ(e.limit(), milliseconds(300));
      EXPECT_NE(std::string(e.what()).find("timed out after 300 ms"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 0/2"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(c.aborted());
    try {
      c.barrier();
      ADD_FAILURE() << "a broken communicator accepted another call";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("must be rebuilt"), std::string::npos) << e.what();
    }
  });
  expect_no_errors(errors);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

// The owner's stop (the interposer's ncclCommAbort from another thread)
// ends a call waiting for a missing peer at once, not at the timeout: the
// call aborts the communicator and fails saying why.
TEST(NcclComm, TheOwnersStopEndsAWaitingCallAtOnce) {
  std::atomic<bool> stop{false};
  const auto t0 = std::chrono::steady_clock::now();
  std::thread owner([&] {
    std::this_thread::sleep_for(milliseconds(300));
    stop.store(true);
  });
  const auto errors = run_nccl_ranks(2, milliseconds(20000), [&](nccl::NcclComm& c) {
    if (c.rank() == 1) return;  // never joins the collective
    try {
      c.allgatherv(payload_of(0, 10), kUnboundedPart);
      ADD_FAILURE() << "allgatherv returned without its peer";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the communicator's owner aborts it"), std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(c.aborted());
  }, &stop);
  owner.join();
  expect_no_errors(errors);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// A non-blocking communicator (blocking = 0) may still be initialising
// when the first compressed call wraps it: NcclComm waits for it (within
// its timeout) instead of failing on its first query.
TEST(NcclComm, ANonBlockingCommunicatorStillInitialisingIsWaitedFor) {
  const nccl::NcclApi& api = testing::standin_nccl();
  using GetId = ncclResult_t (*)(ncclUniqueId*);
  using InitConfig = ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
  const auto get_id = reinterpret_cast<GetId>(dlsym(api.handle, "ncclGetUniqueId"));
  const auto init = reinterpret_cast<InitConfig>(dlsym(api.handle, "ncclCommInitRankConfig"));
  ASSERT_NE(get_id, nullptr);
  ASSERT_NE(init, nullptr);
  ncclUniqueId id{};
  ASSERT_EQ(get_id(&id), ncclSuccess);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclComm_t comm = nullptr;
      try {
        const ncclResult_t started = init(&comm, 2, id, r, &config);
        if (started != ncclInProgress) throw std::runtime_error("the stand-in's init did not run in the background");
        nccl::NcclComm nc(api, testing::standin_cuda(), comm, {});
        if (nc.rank() != r || nc.size() != 2) throw std::runtime_error("wrong rank or size");
        const Gathered g = nc.allgatherv(payload_of(r, 100), kUnboundedPart);
        if (g.parts() != 2) throw std::runtime_error("allgatherv gave the wrong number of parts");
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
      if (comm != nullptr) api.CommDestroy(comm);
    });
  }
  for (auto& t : threads) t.join();
  expect_no_errors(errors);
}

TEST(NcclComm, CompressedAlgorithmsRunThroughACommunicatorOverNccl) {
  for (const char* algo : {"dgc", "sdagc", "sbc", "csc", "onebit"}) {
    std::vector<std::vector<float>> results(3);
    expect_no_errors(run_nccl_ranks(3, kTimeout, [&](nccl::NcclComm& c) {
      Config cfg;
      cfg.algo = algo;
      cfg.params.density = 0.01;
      cfg.params.csc_chunk = 1024;
      cfg.params.csc_fraction = 0.1;
      Communicator cc(std::make_unique<LentComm>(c), cfg);  // the Communicator owns its Comm
      std::vector<float> g(50000);
      for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(float(i) * 0.37f + float(c.rank()));
      cc.allreduce(g.data(), g.size(), DType::kFloat32, ReduceOp::kSum, "g");
      EXPECT_EQ(cc.stats().compressed_calls(), 1u) << algo;
      EXPECT_LT(cc.stats().last().wire_bytes, cc.stats().last().dense_bytes) << algo;
      results[c.rank()] = g;
    }));
    EXPECT_EQ(results[0], results[1]) << algo << ": ranks disagree";
    EXPECT_EQ(results[0], results[2]) << algo << ": ranks disagree";
  }
}

}  // namespace
}  // namespace compcoll
