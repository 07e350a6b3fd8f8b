// An in-memory Comm: `world` ranks as threads of this process exchanging
// bytes through one shared mailbox, with no transport at all. DESIGN.md:
// compression/ and collectives/ build and are tested without Gloo, NCCL or
// PyTorch; this is what their multi-rank tests run on where Gloo is absent
// (tests/unit/thread_collectives_test.cc), and a fast second transport for
// the algorithms where it is present.
//
//   compcoll::testing::run_thread_ranks(4, [](compcoll::Comm& comm) { ... });
//
// Every call is a generation of one exchange: each rank deposits what it
// sends to every rank, the last to arrive hands every rank what was sent to
// it. A rank that does not arrive within the timeout fails the others'
// call with kTransport naming the ranks that did not come; the world is then
// broken and every later call throws. Parts above a call's max_part are
// refused as every transport refuses them. allreduce gathers and reduces in
// rank order (collectives/reduce_bytes.h), so its result is the same bits on
// every rank. bytes_sent counts what a rank deposits for others.
//
// run_thread_ranks joins every rank and rethrows the first error in time,
// prefixed "rank R of N: ", its kind kept.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "collectives/comm.h"

namespace compcoll::testing {

class ThreadWorld;

class ThreadComm final : public Comm {
 public:
  ThreadComm(std::shared_ptr<ThreadWorld> world, int rank);

  int rank() const override { return rank_; }
  int size() const override;
  std::chrono::milliseconds timeout() const override;

  Gathered allgatherv(std::span<const uint8_t> send, size_t max_part) override;
  std::vector<Bytes> alltoallv(const std::vector<Bytes>& send, size_t max_part) override;
  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void barrier() override;
  uint64_t bytes_sent() const override { return bytes_sent_; }

 private:
  std::vector<Bytes> exchange(std::vector<Bytes> out, size_t max_part, const char* what);

  std::shared_ptr<ThreadWorld> world_;
  int rank_;
  uint64_t bytes_sent_ = 0;
};

using ThreadRankBody = std::function<void(Comm& comm)>;

void run_thread_ranks(int world, const ThreadRankBody& body,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace compcoll::testing
