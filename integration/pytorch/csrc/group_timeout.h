// GroupTimeout: a process group's timeout, shared by everything of the
// compcoll backend that waits on the group's behalf: the backend (inner
// waits it makes itself), its worker (every operation's deadline) and the
// TorchComms of its lanes (the compressed algorithms' waits).
//
// Why shared and changeable: torch.distributed.set_timeout(timeout, group)
// calls Backend::setTimeout on a live group, and promises that the new value
// holds "for all future operations". A copy taken at creation would leave
// compcoll's own waits at the old value while Gloo's moved: a group set to
// fail fast would still hang for the creation timeout in a compressed call.
// Each operation reads the value once, when it is submitted (or, on the
// worker, when it starts a wait), so an operation already under way keeps the
// deadline it was given.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "compcoll/error.h"

namespace compcoll::torch_integration {

class GroupTimeout {
 public:
  explicit GroupTimeout(std::chrono::milliseconds timeout) : ms_(checked(timeout)) {}

  std::chrono::milliseconds get() const {
    return std::chrono::milliseconds(ms_.load(std::memory_order_relaxed));
  }
  // Throws kInvalidArgument (and keeps the old value) unless timeout > 0.
  void set(std::chrono::milliseconds timeout) {
    ms_.store(checked(timeout), std::memory_order_relaxed);
  }

 private:
  static int64_t checked(std::chrono::milliseconds timeout) {
    CC_CHECK(timeout.count() > 0, kInvalidArgument,
             "the torch backend needs a positive timeout, not ", timeout.count(), " ms");
    return timeout.count();
  }

  std::atomic<int64_t> ms_;
};

}  // namespace compcoll::torch_integration
