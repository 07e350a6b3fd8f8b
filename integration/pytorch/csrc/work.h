// The work handle the compcoll backend returns for operations that run on its
// worker thread: a c10d::Work whose completion is also a
// c10::ivalue::Future carrying the output tensors (DDP chains its bucket
// callbacks on that future, so communication overlaps the backward pass).
// A failure completes both with the exception: wait() rethrows it and the
// future's callbacks see it.
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

#include <exception>
#include <vector>

namespace compcoll::torch_integration {

class CompcollWork final : public c10d::Work {
 public:
  CompcollWork(int rank, c10d::OpType type, const char* profiling_title,
               std::vector<at::Tensor> outputs);

  // Completes with the outputs given at construction (or these).
  void complete();
  void complete_with(const c10::IValue& value, std::vector<at::Tensor> outputs);
  void fail(std::exception_ptr e);
  // For a delegated operation: the inner work, consulted by sourceRank().
  void set_inner(c10::intrusive_ptr<c10d::Work> inner);

  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  int sourceRank() const override;

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  c10::intrusive_ptr<c10d::Work> inner_;
};

}  // namespace compcoll::torch_integration
