#include "integration/pytorch/csrc/work.h"

#include <ATen/core/jit_type.h>

#include <algorithm>

#include "integration/pytorch/csrc/issue_scope.h"

namespace compcoll::torch_integration {

namespace {

// The devices of the outputs that are not on the cpu (all of one type: an
// operation's tensors share a device).
std::vector<c10::Device> device_outputs(const std::vector<at::Tensor>& outputs) {
  std::vector<c10::Device> devices;
  for (const at::Tensor& t : outputs) {
    if (t.defined() && !t.is_cpu()) devices.push_back(t.device());
  }
  return devices;
}

// Marks the thread as completing `work` (markCompleted or setError runs the
// future's callbacks inline) for the scope's life. Nested: a callback may
// complete another work (it issues one, or the worker runs one queued
// behind, worker.h), and a callback of the inner one may wait for any work
// of the stack, whose outcome is known.
class CompletingScope {
 public:
  explicit CompletingScope(const CompcollWork* work) : work_(work), outer_(top_) { top_ = this; }
  ~CompletingScope() { top_ = outer_; }
  CompletingScope(const CompletingScope&) = delete;
  CompletingScope& operator=(const CompletingScope&) = delete;

  // Whether this thread is completing work, at any depth.
  static bool completing(const CompcollWork* work) {
    for (const CompletingScope* s = top_; s != nullptr; s = s->outer_) {
      if (s->work_ == work) return true;
    }
    return false;
  }

 private:
  const CompcollWork* work_;
  const CompletingScope* outer_;
  static thread_local const CompletingScope* top_;
};

thread_local const CompletingScope* CompletingScope::top_ = nullptr;

}  // namespace

CompcollWork::CompcollWork(int rank, c10d::OpType type, const char* profiling_title,
                           std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type, profiling_title),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), device_outputs(outputs_))),
      context_(current_context()) {}

bool CompcollWork::settle() {
  if (settled_.exchange(true)) return false;
  {
    std::lock_guard<std::mutex> lock(handoff_mu_);  // a wait() for the issue ends
  }
  handoff_cv_.notify_all();
  if (timed_since_) {
    duration_us_ = std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::steady_clock::now() - *timed_since_)
                       .count();
  }
  if (on_settle_) {
    std::function<void()> fn = std::move(on_settle_);
    fn();
  }
  return true;
}

bool CompcollWork::complete() {
  std::vector<at::Tensor> outputs = result();
  return complete_with(c10::IValue(outputs), outputs);
}

bool CompcollWork::complete_with(const c10::IValue& value, std::vector<at::Tensor> outputs) {
  if (!settle()) return false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    outputs_ = std::move(outputs);
  }
  // The future first, then the work, as ProcessGroupGloo's works do: once
  // wait() returns, the future is done and the callbacks it runs inline have
  // run (a caller's wait(); get_future().value() must not find it pending).
  // A callback that waits on this work meanwhile returns at once (wait()).
  try {
    InheritedScope scope(context_);  // for the callbacks markCompleted runs
    CompletingScope completing(this);
    future_->markCompleted(value);
  } catch (...) {
    // A callback threw (or the future refused the value): the work still
    // ends, with that error, or its waiters would wait for ever.
    finish(std::current_exception());
    throw;
  }
  finish();
  return true;
}

bool CompcollWork::fail(std::exception_ptr e) {
  if (!settle()) return false;
  error_ = e;
  try {
    InheritedScope scope(context_);
    CompletingScope completing(this);
    future_->setError(e);
  } catch (...) {
    finish(e);  // as complete_with: the work ends whatever a callback did
    throw;
  }
  finish(e);
  return true;
}

bool CompcollWork::wait(std::chrono::milliseconds timeout) {
  if (CompletingScope::completing(this)) {
    // A callback of this work's own future (or of a work completed inside
    // its completion), run while the future is being completed and before
    // the work is: the outcome is known, and waiting for finish() on this
    // thread would never return.
    if (error_) std::rethrow_exception(error_);
    return true;
  }
  // On the worker (a future callback waiting for a later operation of the
  // group): the worker runs it, and what is queued ahead of it, now.
  if (run_ahead_ && !settled_.load()) run_ahead_(this);
  if (handoff_.load() != Handoff::kNone) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    c10::intrusive_ptr<c10d::Work> in;
    {
      std::unique_lock<std::mutex> lock(handoff_mu_);
      // Until the worker issues it, or it settles (failed before its issue,
      // or by the watchdog, whose deadline bounds this wait), or the
      // caller's own timeout passes (then c10d's wait says so, below).
      const auto ready = [&] { return handoff_.load() != Handoff::kPending || settled_.load(); };
      if (timeout == ::kNoTimeout) {
        handoff_cv_.wait(lock, ready);
      } else if (!handoff_cv_.wait_for(lock, timeout, ready)) {
        lock.unlock();
        return c10d::Work::wait(std::chrono::milliseconds(1));  // times out, as Gloo's would
      }
      if (handoff_.load() == Handoff::kHanded && !inner_waiter_ && !settled_.load()) {
        inner_waiter_ = true;
        in = handed_;
      }
    }
    if (in) {
      try {
        // What is left of the caller's timeout, counted from this wait's
        // start: as Gloo's own work.
        std::chrono::milliseconds left = timeout;
        if (timeout != ::kNoTimeout) {
          left = std::max(std::chrono::milliseconds(1),
                          std::chrono::ceil<std::chrono::milliseconds>(
                              deadline - std::chrono::steady_clock::now()));
        }
        in->wait(left);
        complete();
      } catch (const std::exception&) {
        fail(std::current_exception());
      }
    }
  }
  return c10d::Work::wait(timeout);
}

void CompcollWork::expect_handover() { handoff_ = Handoff::kPending; }

void CompcollWork::complete_on_wait(c10::intrusive_ptr<c10d::Work> inner) {
  {
    std::lock_guard<std::mutex> lock(handoff_mu_);
    handed_ = std::move(inner);
    handoff_ = Handoff::kHanded;
  }
  handoff_cv_.notify_all();
}

void CompcollWork::not_handed() {
  {
    std::lock_guard<std::mutex> lock(handoff_mu_);
    if (handoff_.load() == Handoff::kPending) handoff_ = Handoff::kNotHanded;
  }
  handoff_cv_.notify_all();
}

void CompcollWork::set_inner(c10::intrusive_ptr<c10d::Work> inner) {
  std::lock_guard<std::mutex> lock(mutex_);
  inner_ = std::move(inner);
}

void CompcollWork::hold(std::any x) {
  std::lock_guard<std::mutex> lock(mutex_);
  held_ = std::move(x);
}

std::vector<at::Tensor> CompcollWork::result() {
  std::lock_guard<std::mutex> lock(mutex_);
  return outputs_;
}

int CompcollWork::sourceRank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(inner_, "compcoll: sourceRank() is only known for a completed receive");
  return inner_->sourceRank();
}

std::chrono::milliseconds CompcollWork::getTimeout() const {
  const int64_t ms = timeout_ms_.load();
  TORCH_CHECK(ms > 0, "compcoll: this work has no timeout of its own (it was never submitted)");
  return std::chrono::milliseconds(ms);
}

float CompcollWork::getDuration() const {
  TORCH_CHECK(timed_since_.has_value(),
              "compcoll: this work was not timed; call _enable_collectives_timing() on the group "
              "before issuing it");
  const int64_t us = duration_us_.load();
  TORCH_CHECK(us >= 0, "compcoll: getDuration() of a work that has not completed");
  return static_cast<float>(us) / 1000.0f;
}

}  // namespace compcoll::torch_integration
