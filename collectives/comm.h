// The Comm seam: the only thing collectives/ knows about communication.
//
// Implementations live in transport/ (Gloo tcp/ibverbs, NCCL) and in the
// PyTorch backend (delegating to an inner process group). Every call is
// collective: all ranks call it in the same order. Every call honours the
// communicator's timeout and throws compcoll::Error(kTransport) when a peer
// fails or the timeout expires; after such an error the Comm is broken and
// every further call throws, saying it must be rebuilt.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "compcoll/types.h"

namespace compcoll {

// Payloads of all ranks, concatenated in rank order.
struct Gathered {
  Bytes data;
  std::vector<size_t> offsets;  // size()+1 entries; part r is [offsets[r], offsets[r+1])

  std::span<const uint8_t> part(int r) const {
    return {data.data() + offsets[r], offsets[r + 1] - offsets[r]};
  }
  int parts() const { return static_cast<int>(offsets.size()) - 1; }
};

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // Every rank contributes a payload of any size (0 included) and receives
  // all payloads in rank order.
  virtual Gathered allgatherv(std::span<const uint8_t> send) = 0;

  // send[j] goes to rank j (send.size() == size()); returns what each rank
  // sent to this one, in rank order. Entry rank() is passed through locally.
  virtual std::vector<Bytes> alltoallv(const std::vector<Bytes>& send) = 0;

  // Exact in-place reduction. op is kSum, kMin, kMax or kProd; kAvg is the
  // collectives' job (sum, then divide) and implementations may reject it.
  virtual void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;

  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  virtual void barrier() = 0;

  // Bytes this rank has put on the wire through this communicator so far
  // (payloads and size headers; a ring allreduce counts what the ring
  // sends). Stats and the benchmark report differences of it.
  virtual uint64_t bytes_sent() const { return 0; }
};

}  // namespace compcoll
