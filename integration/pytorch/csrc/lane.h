// Lane: one inner c10d backend of the compcoll backend, with the compcoll
// Communicator that compresses over it. The backend has one or two:
//
//   host lane    cpu tensors. The inner Gloo backend is built by the Python
//                creator; the Communicator is made with the backend
//                (collective). Candidates are reduced in place.
//   device lane  cuda tensors, when the creator was given an inner-backend
//                factory (ProcessGroupNCCL). Lazy: the factory runs on the
//                first operation on a cuda tensor, so a group used only with
//                cpu tensors never builds NCCL; the Communicator is made on
//                the worker at the first candidate (collective: every rank
//                submits the same first candidate to compress). Staged: a
//                candidate to compress is copied to host memory at
//                submission and reduced there by the CPU codecs; the payloads
//                travel through staging tensors on the lane's device
//                (TorchComm's staging device); the result is copied back
//                before the work completes. Candidates the policy keeps dense
//                go to the inner backend directly (staging them would only
//                add two copies); they are counted as direct calls.
//
// A test-only lane ("staged_cpu") stages cpu tensors the same way over a
// second, lazily built Gloo backend, so the staging path runs with real
// copies on a machine without a GPU.
//
// Threads: inner() and the setters may be called from any thread; comm(),
// ensure_comm() and worker_stream() only on the backend's worker (or before
// it starts); slots and device are guarded by the worker's queue lock
// (Worker::locked).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "integration/pytorch/csrc/buffer_slots.h"
#include "integration/pytorch/csrc/group_timeout.h"
#include "plugin/communicator.h"
#include "plugin/config.h"

namespace compcoll::torch_integration {

// Optimizer steps this process has taken (compcoll/_momentum.py's step
// pre-hook calls note_optimizer_step): the boundary Lane::handover_order_key
// counts from.
void note_optimizer_step();
uint64_t optimizer_steps();

class Lane {
 public:
  using Factory = std::function<c10::intrusive_ptr<c10d::Backend>()>;

  // A lane over an existing inner backend, reducing tensors in place.
  Lane(std::string name, c10::DeviceType type, c10::intrusive_ptr<c10d::Backend> inner);
  // A staged lane whose inner backend comes from factory on first use.
  Lane(std::string name, c10::DeviceType type, Factory factory);
  ~Lane();

  const std::string& name() const { return name_; }
  c10::DeviceType type() const { return type_; }
  bool staged() const { return staged_; }

  // The inner backend; builds it on the first call (the factory runs
  // without any lock held, so it may take the GIL; concurrent callers wait,
  // without the GIL, up to the group's timeout). A failed build is reported
  // to that caller and retried by the next one: building is not collective.
  c10::intrusive_ptr<c10d::Backend> inner();
  // The inner backend if it has been built, else null. Never builds it.
  c10::intrusive_ptr<c10d::Backend> built_inner() const;

  // Settings the process group passes down: applied now if the inner
  // backend exists, else when it is built.
  void set_timeout(std::chrono::milliseconds timeout);
  void set_group_uid(const std::string& uid);
  void set_bound_device(std::optional<at::Device> device);

  // Worker only. The Communicator, made on the first call over inner()
  // with TorchComm's staging device `staging` (collective). A failed
  // creation is remembered: later calls rethrow it instead of starting a
  // collective the other ranks are not in.
  Communicator& ensure_comm(const Config& cfg, const std::shared_ptr<const GroupTimeout>& timeout,
                            std::optional<c10::Device> staging);
  Communicator* comm() { return comm_.get(); }
  const Communicator* comm() const { return comm_.get(); }
  // Worker only. The momentum the group took from the optimizer
  // (Communicator::adopt_optimizer_momentum): given to the Communicator now,
  // or when ensure_comm makes it.
  void adopt_optimizer_momentum(OptimizerMomentum taken);
  // Worker only. The stream the worker uses for device d (one from the
  // device's pool, so the worker's copies and inner operations never queue
  // behind the user's work on the default stream); nullopt for cpu.
  std::optional<c10::Stream> worker_stream(c10::Device d);

  // A candidate handed to the inner backend directly: counted as a dense
  // call of `bytes` (a ring allreduce's bytes per rank). Any thread.
  void count_direct(uint64_t bytes);
  uint64_t direct_calls() const { return direct_calls_.load(); }
  uint64_t direct_bytes() const { return direct_bytes_.load(); }

  // Guarded by the worker's queue lock.
  BufferSlots slots;
  std::optional<c10::Device> device;  // staged lanes: the device of the first candidate
  // The momentum hand-over's mirror key of a compressed call issued now
  // (Communicator::set_handover_order_key), for a tensor whose slot is not
  // the same live buffer's as before (`fresh`: a reallocated tensor, whose
  // pairing with a slot depends on when each rank freed the previous one):
  // its owner, its shape, and its place among such calls of that owner and
  // shape since the last optimizer step (note_optimizer_step), the same on
  // every rank (collectives are issued in one order, and every rank steps
  // between the same calls). Counted across backward passes, so nested
  // passes (reentrant activation checkpointing) do not restart it. "" for
  // a live buffer met again (its slot key is the same on every rank) and
  // outside a backward pass (pass 0). Guarded as slots are.
  std::string handover_order_key(const at::Tensor& t, uint64_t pass, uint64_t owner, bool fresh);

 private:
  // handover_order_key: the optimizer step counted since, and the calls by
  // (owner, numel, dtype) since it.
  uint64_t order_step_ = 0;
  std::map<std::tuple<uint64_t, int64_t, int>, uint64_t> order_calls_;
  const std::string name_;
  const c10::DeviceType type_;
  const bool staged_;

  mutable std::mutex mu_;  // guards the members up to pending_bound_
  std::condition_variable built_cv_;
  c10::intrusive_ptr<c10d::Backend> inner_;
  Factory factory_;
  bool building_ = false;
  std::optional<std::chrono::milliseconds> pending_timeout_;
  std::optional<std::string> pending_uid_;
  std::optional<std::optional<at::Device>> pending_bound_;

  std::atomic<uint64_t> direct_calls_{0};
  std::atomic<uint64_t> direct_bytes_{0};
  std::unique_ptr<Communicator> comm_;  // worker only
  OptimizerMomentum optimizer_momentum_;  // worker only
  std::string comm_error_;
  std::map<c10::DeviceIndex, c10::Stream> streams_;  // worker only
};

// Runs fn without the GIL when this thread holds it: waits on other threads
// must never hold it (their work may need it).
void without_gil(const std::function<void()>& fn);

// A copy of t in host memory (pinned when t is on a device), made now on the
// caller's current stream of t's device; returns when the copy is complete,
// so everything the caller's stream did to t before is in it.
at::Tensor stage_to_host(const at::Tensor& t);

}  // namespace compcoll::torch_integration
