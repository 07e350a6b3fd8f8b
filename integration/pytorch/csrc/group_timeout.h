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
//
// An operation may carry a timeout of its own (c10d's Options::timeout:
// dist.barrier(timeout=...), or AllreduceOptions set by the caller), which
// Gloo applies to that operation alone. compcoll does too: the backend gives
// it to the worker, which makes it the operation's deadline (with any
// ephemeral extension, Worker::add_ephemeral_timeout) and runs the
// operation inside an OperationScope of it, so that the waits its compressed
// algorithm makes through the lane's TorchComm (which call get()) keep it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "compcoll/error.h"

namespace compcoll::torch_integration {

class GroupTimeout {
 public:
  explicit GroupTimeout(std::chrono::milliseconds timeout) : ms_(checked(timeout)) {}

  // The group's timeout; on a thread inside an OperationScope of this
  // group, that operation's.
  std::chrono::milliseconds get() const {
    if (scope_group_ == this) return std::chrono::milliseconds(scope_ms_);
    return group();
  }
  // The group's timeout, whatever operation this thread is running.
  std::chrono::milliseconds group() const {
    return std::chrono::milliseconds(ms_.load(std::memory_order_relaxed));
  }
  // The timeout of an operation whose options say `requested`: its own when
  // positive, else (c10d's kUnsetTimeout, -1, or 0) the group's.
  std::chrono::milliseconds for_operation(std::chrono::milliseconds requested) const {
    return requested.count() > 0 ? requested : group();
  }

  // While alive, get() on this thread answers `timeout` for this group.
  // Scopes nest (a callback on the worker runs an operation inside another).
  class OperationScope {
   public:
    OperationScope(const GroupTimeout& group, std::chrono::milliseconds timeout)
        : prev_group_(scope_group_), prev_ms_(scope_ms_) {
      scope_group_ = &group;
      scope_ms_ = timeout.count();
    }
    ~OperationScope() {
      scope_group_ = prev_group_;
      scope_ms_ = prev_ms_;
    }
    OperationScope(const OperationScope&) = delete;
    OperationScope& operator=(const OperationScope&) = delete;

   private:
    const GroupTimeout* prev_group_;
    int64_t prev_ms_;
  };
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
  inline static thread_local const GroupTimeout* scope_group_ = nullptr;
  inline static thread_local int64_t scope_ms_ = 0;
};

}  // namespace compcoll::torch_integration
