// Error-feedback keys for the buffers an NCCL communicator is asked to
// allreduce.
//
// NCCL calls carry nothing but device addresses, and an address means
// nothing in the next process: after a restart the same program's gradient
// buckets sit elsewhere, so address keys would restore a checkpoint
// (COMPCOLL_STATE_DIR) into states no call ever asks for again. Instead each
// distinct (address, count, dtype) gets the next ordinal of its communicator
// the first time it is reduced, and its key is "nccl:b<ordinal>/<dtype>". A
// deterministic training loop reduces its buffers in the same order in every
// run, so the n-th buffer finds the n-th buffer's residual; one whose size
// changed is started fresh by the Communicator, with an INFO line. Within a
// process the keys are exactly as distinct as the addresses were.
//
// Bounded: a program that reduces ever-new buffers makes ever-new ordinals,
// and the least recently used mappings beyond kMaxBuffers are forgotten (the
// Communicator evicts their states the same way). Not thread-safe: the
// owner's call lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <tuple>

#include "compcoll/types.h"

namespace compcoll::interposer {

class BufferKeys {
 public:
  static constexpr size_t kMaxBuffers = 4096;

  std::string key(const void* recv, size_t count, DType dtype);
  size_t size() const { return index_.size(); }

 private:
  using Buffer = std::tuple<uintptr_t, size_t, DType>;
  struct Slot {
    uint64_t ordinal;
    std::list<Buffer>::iterator lru;
  };
  std::map<Buffer, Slot> index_;
  std::list<Buffer> lru_;  // most recently used first
  uint64_t next_ordinal_ = 0;
};

}  // namespace compcoll::interposer
