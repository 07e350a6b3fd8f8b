// The work handle the compcoll backend returns for operations that run on its
// worker thread: a c10d::Work whose completion is also a
// c10::ivalue::Future carrying the output tensors (DDP chains its bucket
// callbacks on that future, so communication overlaps the backward pass).
// A failure completes both with the exception: wait() rethrows it and the
// future's callbacks see it.
//
// Settled once: the first of complete/fail wins and later ones are ignored.
// The backend's watchdog fails a work whose deadline has passed while the
// worker may still be running it (see worker.h); whatever the worker does
// afterwards must not complete the future a second time.
//
// The future's callbacks run in the issue scope of the operation
// (issue_scope.h): what they issue counts as issued where the operation was.
//
// Outputs on a device (cuda) make the future device-aware: completing it
// records an event on the completing thread's current stream for each
// device, and future.wait() / then() callbacks order themselves after those
// events (as with ProcessGroupNCCL's futures). The backend completes device
// works only after the outputs are written and its stream synchronised, and
// with that stream current, so the events are already complete.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <any>
#include <atomic>
#include <exception>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "integration/pytorch/csrc/issue_scope.h"

namespace compcoll::torch_integration {

class CompcollWork final : public c10d::Work {
 public:
  CompcollWork(int rank, c10d::OpType type, const char* profiling_title,
               std::vector<at::Tensor> outputs);

  // Completes with the outputs given at construction (or these). Each
  // returns false when the work was settled before (nothing is done).
  bool complete();
  bool complete_with(const c10::IValue& value, std::vector<at::Tensor> outputs);
  bool fail(std::exception_ptr e);
  bool settled() const { return settled_.load(); }
  // Called once when the work settles, before the future's callbacks run
  // (the worker forgets its deadline there). Set before the work is shared.
  void on_settle(std::function<void()> fn) { on_settle_ = std::move(fn); }
  // For a delegated operation: the inner work, consulted by sourceRank().
  void set_inner(c10::intrusive_ptr<c10d::Work> inner);
  // Point-to-point works queued behind a busy worker. Gloo's send and
  // receive works have no future and complete when someone waits for them,
  // their clock starting at that wait: a receive may be posted long before
  // its match. Such a work, once the worker has issued it, is handed to its
  // caller (complete_on_wait): wait() waits for the inner work with the
  // caller's timeout and settles this one. Before it is issued, wait()
  // waits for the issue (the worker's watchdog bounds that). A work whose
  // inner one turns out to have a future, or that fails before it is
  // issued, is settled as any other (not_handed).
  void expect_handover();
  void complete_on_wait(c10::intrusive_ptr<c10d::Work> inner);
  void not_handed();
  bool expects_handover() const { return handoff_.load() == Handoff::kPending; }
  bool handed_to_caller() const { return handoff_.load() == Handoff::kHanded; }
  // Keeps x (what issued the operation, with the tensors it captured) as
  // long as this work, so that it goes where the work goes
  // (deferred_release.h), not with the worker's task.
  void hold(std::any x);
  // The group has collective timing on (enableCollectivesTiming): from now
  // to its settling is this work's getDuration(). Before it is shared.
  void time_from_now() { timed_since_ = std::chrono::steady_clock::now(); }
  // The timeout the worker gave it (getTimeout(), as a Gloo work reports
  // its own). Set at submission.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ms_ = timeout.count(); }
  // What wait() calls first, while the work is unsettled: the worker's
  // run_queued_through (worker.h), so that a future callback running on the
  // worker may wait for an operation queued behind it. Set at submission.
  void set_run_ahead(std::function<void(const CompcollWork*)> fn) { run_ahead_ = std::move(fn); }

  // As c10d::Work's; a callback of this work's own future, run while it is
  // being completed, gets the outcome at once (work.cc).
  bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  int sourceRank() const override;
  // Milliseconds from submission to completion, once completed, where the
  // group's timing is on (as ProcessGroupGloo's works).
  float getDuration() const override;
  std::chrono::milliseconds getTimeout() const override;

 private:
  bool settle();

  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  c10::intrusive_ptr<c10d::Work> inner_;
  std::any held_;
  std::atomic<bool> settled_{false};
  std::optional<std::chrono::steady_clock::time_point> timed_since_;
  std::atomic<int64_t> duration_us_{-1};  // set when a timed work settles
  std::atomic<int64_t> timeout_ms_{-1};   // set at submission
  std::function<void()> on_settle_;
  std::function<void(const CompcollWork*)> run_ahead_;
  std::exception_ptr error_;  // fail()'s, set before the future's callbacks run
  enum class Handoff { kNone, kPending, kHanded, kNotHanded };
  std::atomic<Handoff> handoff_{Handoff::kNone};
  std::mutex handoff_mu_;  // guards handed_, inner_waiter_; with handoff_cv_
  std::condition_variable handoff_cv_;
  c10::intrusive_ptr<c10d::Work> handed_;
  bool inner_waiter_ = false;  // a caller is waiting for handed_
  // Taken on the issuing thread at construction (issue_scope.h).
  const IssueContext context_;
};

}  // namespace compcoll::torch_integration
