// CompcollBackend: a c10d backend ("compcoll", device cpu) that wraps an inner
// Gloo backend and compresses eligible allreduces with compcoll.
//
//   candidate   an allreduce of one dense, contiguous CPU tensor of float32,
//               float16 or bfloat16 with SUM or AVG. Candidates go to the
//               Communicator, whose policy compresses those of at least
//               COMPCOLL_MIN_ELEMS elements and sends the rest through the
//               exact dense path (so the stats count every gradient call).
//   delegated   everything else (other dtypes and ops, CUDA or sparse
//               tensors, broadcast, allgather, reduce_scatter, alltoall,
//               send/recv, barrier, ...): the same call on the inner backend.
//   worker      one thread per backend runs candidates (and the operations
//               queued behind them) in submission order. Gloo matches
//               messages by the order in which operations are issued, and
//               every rank submits in the same order, so issuing every inner
//               operation in submission order keeps the ranks in lockstep.
//               A delegated operation is issued directly by the caller when
//               the worker is idle and nothing is queued (under the queue
//               lock), else queued; its inner work completes our work.
//   work        candidates and queued operations return a CompcollWork whose
//               future completes on the worker (or on Gloo's thread) with the
//               output tensors, or with the compcoll error; wait() rethrows.
//   keys        error-feedback state keys come from BufferSlots (see
//               buffer_slots.h): buffer identity, robust to DDP's rebuild.
//
// finish() (called at destruction and, from Python, at interpreter exit)
// drains the queue and has the Communicator write COMPCOLL_STATS_FILE.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "integration/pytorch/csrc/buffer_slots.h"
#include "plugin/communicator.h"
#include "plugin/config.h"
#include "plugin/logging.h"

namespace compcoll::torch_integration {

class CompcollBackend final : public c10d::Backend {
 public:
  // Collective over inner: reads the COMPCOLL_* configuration (rank and size
  // are inner's) and builds the Communicator, which agrees on it.
  // timeout: the process group's timeout; every inner wait honours it.
  CompcollBackend(c10::intrusive_ptr<c10d::Backend> inner, std::chrono::milliseconds timeout);
  ~CompcollBackend() override;

  const std::string getBackendName() const override { return "compcoll"; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return inner_->getBackendOptions(); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }
  void setTimeout(std::chrono::milliseconds timeout) override;
  void setGroupUid(const std::string& pg_uid) override;
  void setBoundDeviceId(std::optional<at::Device> device) override;
  void eagerConnectSingleDevice(at::Device device) override;
  c10d::ErrorType getError() override { return inner_->getError(); }
  void abort() override;
  void shutdown() override;

  // compcoll's own surface (Python: compcoll._C).
  const c10::intrusive_ptr<c10d::Backend>& inner() const { return inner_; }
  const Config& config() const { return cfg_; }
  // Drains the queue and writes the stats file; idempotent.
  void finish();
  // The Communicator's stats as JSON (the stats file's content), taken on
  // the worker after everything submitted so far.
  std::string stats_json();
  std::vector<SlotInfo> slots();
  std::vector<BufferSlots::TraceEntry> key_trace();
  size_t state_entries();

  // Builds a backend (collective, see the constructor) and records it for
  // live().
  static c10::intrusive_ptr<CompcollBackend> create(c10::intrusive_ptr<c10d::Backend> inner,
                                                    std::chrono::milliseconds timeout);
  // Every live backend of this process (for the exit hook).
  static std::vector<c10::intrusive_ptr<CompcollBackend>> live();

 private:
  using Task = std::function<void()>;

  template <typename Issue>
  c10::intrusive_ptr<c10d::Work> delegate(c10d::OpType type, const char* title,
                                          std::vector<at::Tensor> outputs, Issue issue);
  // Runs fn on the worker after everything queued before it and waits for
  // it (at most the timeout); rethrows its exception.
  void run_on_worker(const std::function<void()>& fn);
  void drain();
  void worker_loop();
  void stop_worker();
  bool is_candidate(const std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                    DType* dtype, ReduceOp* op) const;

  c10::intrusive_ptr<c10d::Backend> inner_;
  std::chrono::milliseconds timeout_;
  Config cfg_;
  Logger log_;
  std::unique_ptr<Communicator> comm_;  // used on the worker thread only

  std::mutex mu_;  // guards everything below
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  bool finished_ = false;
  BufferSlots slots_;
  std::thread worker_;
};

}  // namespace compcoll::torch_integration
