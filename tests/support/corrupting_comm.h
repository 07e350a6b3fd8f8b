// A Comm that forwards to another and corrupts one byte of what this rank
// sends: a faulty or hostile peer, for the tests that every rank then stops
// at once with an error naming it. Header-only, over any Comm (the
// in-memory one, Gloo's).
//
//   CorruptingComm bad(comm, CorruptingComm::Target::kAllgather, 0);        // every part it gathers
//   CorruptingComm bad(comm, CorruptingComm::Target::kFirstPartToPeer1, 8);  // its first part to rank 1
#pragma once

#include <vector>

#include "collectives/comm.h"

namespace compcoll::testing {

class CorruptingComm final : public Comm {
 public:
  enum class Target {
    kAllgather,         // byte `at` of every allgatherv part (seen by every rank alike)
    kFirstPartToPeer1,  // byte `at` of the first alltoallv part to rank 1 long enough for it
  };
  CorruptingComm(Comm& inner, Target target, size_t at) : inner_(inner), target_(target), at_(at) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  Gathered allgatherv(std::span<const uint8_t> send, size_t max_part) override {
    Bytes b(send.begin(), send.end());
    if (target_ == Target::kAllgather && b.size() > at_) b[at_] ^= 0xff;
    return inner_.allgatherv(b, max_part);
  }
  std::vector<Bytes> alltoallv(const std::vector<Bytes>& send, size_t max_part) override {
    std::vector<Bytes> s = send;
    // + 16: a part that holds more than the byte (a payload, not a tag).
    if (target_ == Target::kFirstPartToPeer1 && !done_ && s.size() > 1 && s[1].size() > at_ + 16) {
      s[1][at_] ^= 0xff;
      done_ = true;
    }
    return inner_.alltoallv(s, max_part);
  }
  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    inner_.allreduce(buf, count, dtype, op);
  }
  void broadcast(void* buf, size_t bytes, int root) override { inner_.broadcast(buf, bytes, root); }
  void barrier() override { inner_.barrier(); }

 private:
  Comm& inner_;
  Target target_;
  size_t at_;
  bool done_ = false;
};

}  // namespace compcoll::testing
